"""What users' training programs do that a warm start could change (TestWarmStart): import a module beside the
script, read and set the multiprocessing start method, a data loader with worker processes, os.fork, print
without flushing; and how torchrun's agent treats its workers: SIGKILL -> a restart counted, SIGTERM when it stops
them, the exit code of a failed one."""

import os
import signal
import sys
import time

WARM = "torch" in sys.modules  # before this script imported anything: the worker began with torch imported

import helper  # noqa: E402
import multiprocessing as mp  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def square(x):
    return x * x


def age():
    """Seconds since this process began: its start time in /proc against the uptime, both from boot."""
    start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return float(open("/proc/uptime").read().split()[0]) - start


def main():
    ready = age()  # the worker's start: interpreter, imports
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    def stopped(signum, frame):
        print(f"SIGTERM rank={rank} restart={restart}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stopped)
    method = mp.get_start_method(allow_none=True)
    mp.set_start_method("spawn")  # first, as programs do: it is refused once a default-context object was made
    dist.init_process_group("gloo")
    from torch.utils.data import DataLoader, TensorDataset

    loaded = sum(float(b[0].sum()) for b in DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=2))
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    forked = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with mp.Pool(2) as p:
        pooled = p.map(square, [1, 2, 3])
    t = torch.ones(1)
    dist.all_reduce(t)
    # Not flushed: only unbuffered output (torchrun's python -u) reaches the log before the SIGKILL below. One
    # write, so that the two workers' lines do not run into each other (print writes the newline apart).
    sys.stdout.write(f"WORKER rank={rank} restart={restart} warm={WARM} ready={ready:.2f} helper={helper.VALUE} "
                     f"method={method} loader={loaded} fork={forked} pool={pooled} world={int(t.item())} "
                     f"cuda={torch.cuda.is_initialized()} badfork={torch.cuda._is_in_bad_fork()}\n")
    if restart == 0 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the agent restarts both workers, counting one restart
    if restart == 1 and rank == 0:
        sys.exit(3)  # no restart left: the agent stops rank 1 (SIGTERM) and fails with this exit code
    time.sleep(120)


if __name__ == "__main__":
    main()
