"""The warm start (docs/warm-start.md): torchrun's workers begin with torch imported, once per pod.

With the warm start (the webhook sets $ET_WARM_START=1 beside torchrun's PET_RUN_PATH=1 and
PET_START_METHOD=forkserver) torchrun runs the training script in a process of Python's fork server instead of a
fresh `python -u <script>`, and the elastic-training backend names this module the fork server's preload (in the
agent, before its first workers start). The fork server is a fresh interpreter, not the agent: it imports this
module, and torch with it, and nothing else of the agent's; each worker of every round is forked from it.

A script run that way would differ from `python -u <script>` in three ways users meet; this module's
run_script_path, which replaces torch's in the fork server (a worker looks torch's up by name when it starts), puts
each back as a fresh interpreter has it:
- sys.path[0] is the script's directory (symbolic links resolved), not the agent's: `import helper` of a file beside
  the script works;
- no multiprocessing start method is set yet (multiprocessing.set_start_method("spawn") of the program works);
- stdout and stderr are unbuffered, as with -u;
- a script that returns or exits 0 ends its process then, as its own interpreter would (torch's worker would wait
  for the agent to read every worker's result, which an agent stopping its workers does not: 30 s, then SIGKILL).
And one check that fails loudly: a worker forked from a process that had initialised CUDA could not use it (torch's
"Cannot re-initialize CUDA in forked subprocess", at the first CUDA call); the fork server must never have. Standard
library and torch only.
"""

import atexit
import io
import multiprocessing
import os
import runpy
import sys
import threading

import torch
import torch.distributed.run as _run


def run_script_path(training_script, *training_script_args):
    """torch.distributed.run.run_script_path as a fresh `python -u <training_script>` would run it."""
    if torch.cuda._is_in_bad_fork():
        raise RuntimeError(
            "elastic-training warm start: this worker was forked from a fork server that had initialised CUDA, so it "
            "cannot use CUDA; turn the warm start off (the job chart's warmStart: false, or the pod annotation "
            "elastic-training.io/warm-start: \"false\") and report it (docs/warm-start.md)")
    multiprocessing.set_start_method(None, force=True)  # a fresh interpreter has none set
    sys.path[0] = os.path.dirname(os.path.realpath(training_script))
    _unbuffered()
    sys.argv = [training_script, *training_script_args]
    try:
        runpy.run_path(training_script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise  # torch's worker ends with that code at once, as the script's own process would
    _end()


def _end():
    """End the worker as the script's own process ends when the script returns or exits 0.

    torch's worker of a function would instead hand its result to the agent and then wait for the agent to have read
    every worker's, which an agent that is stopping its workers never does: a program that exits 0 on SIGTERM (or
    finishes its step first) would wait there until the agent's SIGKILL, 30 s later. The result is written first
    (torch's queue is a SimpleQueue: the bytes are in the pipe when put returns), so an agent that is not stopping
    reads it as before."""
    queue = None
    f = sys._getframe(1)
    while f is not None and queue is None:
        if f.f_code.co_name == "_wrap" and f.f_globals.get("__name__") == "torch.distributed.elastic.multiprocessing.api":
            queue = f.f_locals.get("ret_val_")
        f = f.f_back
    if queue is None:
        return  # a torch whose worker differs: its own way
    queue.put(None)  # run_script_path's result
    threading._shutdown()  # what a process's end waits for: its non-daemon threads, then its atexit functions
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


def _unbuffered():
    """stdout and stderr as `python -u` makes them: text written through to the file descriptor at once."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        if old is None or getattr(old, "write_through", False):
            continue  # none, or unbuffered already
        try:
            fd = old.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        old.flush()
        new = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                               write_through=True)
        setattr(sys, name, new)
        setattr(sys, "__" + name + "__", new)


# Only the fork server imports this module (the agent must not: it pickles torch's own function by name for each
# worker, which pickle refuses once the name is another's).
_run.run_script_path = run_script_path
