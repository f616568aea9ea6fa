"""A small elastic training script for the examples for real clusters (examples/*.yaml), given with --set-file:

    helm install mnist charts/elastic-training -f examples/script-run.yaml --set-file script=examples/train.py

torchrun (configured by the webhook through PET_* variables) starts it on every pod; it trains a tiny model on
random data with NCCL (gloo without a GPU), checkpoints to --checkpoint-dir after every epoch, and resumes after a
re-rendezvous (scale up/down, a lost pod). The checkpoint of rank 0 is the one that counts: it is loaded before
DistributedDataParallel broadcasts rank 0's weights, and rank 0's epoch is broadcast, so every rank resumes at the
same step even when only rank 0's pod has the file (no shared volume). --step-seconds paces a demo so that
scaling can be watched.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=100)
    p.add_argument("--step-seconds", type=float, default=0.0, help="the least time a step takes (a demo's pace)")
    p.add_argument("--data", default="")
    p.add_argument("--checkpoint-dir", default="/data/checkpoints")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    net = torch.nn.Linear(32, 1).to(device)

    ckpt = os.path.join(args.checkpoint_dir, "model.pt")
    start = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0 and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        net.load_state_dict(state["model"])
        start[0] = state["epoch"] + 1
    dist.broadcast(start, src=0)
    model = torch.nn.parallel.DistributedDataParallel(net)  # broadcasts rank 0's weights
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    try:
        from elastic_training import progress  # on PYTHONPATH in the job's PyTorch pods
    except ImportError:
        def progress(step, total=None):
            pass
    step = int(start.item()) * args.steps_per_epoch
    for epoch in range(int(start.item()), args.epochs):
        for _ in range(args.steps_per_epoch):
            began = time.monotonic()
            x, y = torch.randn(64, 32, device=device), torch.randn(64, 1, device=device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
            step += 1
            progress(step, args.epochs * args.steps_per_epoch)  # a hung round is restarted (docs/hangs.md)
        print(f"epoch {epoch} rank {rank}/{world} loss {loss.item():.4f} on {os.environ.get('ET_MEMBER_HOST', '?')}", flush=True)
        if rank == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
