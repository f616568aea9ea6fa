#!/usr/bin/env python3
"""A small elastic data-parallel training loop for torchrun, used by `make demo` and the e2e tests.

Why it is shaped like this:
- torchrun restarts every worker process when the world changes (a node joins or leaves), so training state must
  survive a process restart. With the chart's checkpoint.memory (in-memory checkpoints, docs/checkpoints.md) it saves
  every step with elastic_training.checkpoint and loads the newest complete step, which the sidecars keep in the
  pods' memory and replicate to another node: a lost node's state survives too. Without it each rank keeps a local
  checkpoint (the pod's emptyDir or a shared volume); after a restart the ranks agree on the newest one (all_reduce
  MAX of the step) and its owner broadcasts the model. A new pod has no checkpoint and simply receives the state:
  no shared storage is needed either way.
- Every step prints one line with the world size, so `kubectl logs` shows scaling as it happens.
"""
import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist


def log(msg):
    print(f"{datetime.datetime.now(datetime.timezone.utc).strftime('%H:%M:%S.%f')[:-3]} {msg}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60, help="total training steps")
    p.add_argument("--step-seconds", type=float, default=0.5, help="simulated compute per step")
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", "/tmp/elastic-train"))
    p.add_argument("--dim", type=int, default=1024)
    args = p.parse_args()

    # SIGTERM keeps its default action (the process ends at once). torchrun sends it to restart the workers when the
    # world changes, and a worker blocked in a collective with a lost peer never returns to Python to run a Python
    # handler: torchrun would wait 30 s before its SIGKILL (docs/failures.md). Checkpoints are written to a temporary
    # file and renamed, so an ending mid-write loses nothing.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    host = os.environ.get("ET_MEMBER_HOST") or os.uname().nodename

    torch.manual_seed(0)
    weights = torch.zeros(args.dim)
    step = 0
    if os.environ.get("ET_CHECKPOINT_DIR"):  # the chart's checkpoint.memory
        import elastic_training.checkpoint as checkpoint

        progress = torch.zeros(1, dtype=torch.long)
        state = {"weights": weights, "progress": progress}  # restored in place, saved as they are
        step = checkpoint.load(state) or 0

        def save(step):
            progress.fill_(step)
            checkpoint.save(state, step)

        source = "memory"
    else:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        # Keyed by pod and local rank, not by group rank: torchrun may renumber nodes at each re-rendezvous.
        ckpt = os.path.join(args.checkpoint_dir, f"state-{host}-{os.environ.get('LOCAL_RANK', '0')}.pt")
        if os.path.exists(ckpt):
            saved = torch.load(ckpt)
            weights, step = saved["weights"], saved["step"]

        # Agree on the newest state: the highest step wins, the lowest rank holding it broadcasts.
        t = torch.tensor([step], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        newest = int(t.item())
        owner = torch.tensor([rank if step == newest else world], dtype=torch.long)
        dist.all_reduce(owner, op=dist.ReduceOp.MIN)
        dist.broadcast(weights, src=int(owner.item()))
        step = newest

        def save(step):
            torch.save({"weights": weights, "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)

        source = "local"
    log(f"joined rank={rank} world_size={world} restart={restart} host={host} resume_step={step} checkpoints={source} torch={torch.__version__}")
    # Each step's progress to the pod's sidecar, which restarts a hung round within a minute (docs/hangs.md). The
    # package is on PYTHONPATH in PyTorch pods of the elastic-training backend; elsewhere there is nothing to tell.
    try:
        from elastic_training import progress as report_progress
    except ImportError:
        def report_progress(step, total=None):
            pass

    while step < args.steps:
        grad = torch.full((args.dim,), float(rank + 1))
        dist.all_reduce(grad)  # the data-parallel gradient sum
        weights -= 0.001 * grad / world
        step += 1
        time.sleep(args.step_seconds)
        save(step)
        report_progress(step, args.steps)
        log(f"step={step} world_size={world} rank={rank} loss={float(weights.abs().mean()):.6f}")

    if source == "memory":
        checkpoint.wait()
    dist.barrier()
    log(f"done steps={step} world_size={world} rank={rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
