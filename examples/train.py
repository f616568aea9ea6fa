"""A small elastic training script for examples/script-run.yaml (petctl style: no image build).

    helm install mnist charts/elastic-training -f examples/script-run.yaml --set-file script=examples/train.py

torchrun (configured by the webhook through PET_* variables) starts it on every pod; it trains a tiny model on
random data with gloo/NCCL, checkpoints to --checkpoint-dir after every epoch, and resumes from the checkpoint
after a re-rendezvous (scale up/down, a lost pod).
"""
import argparse
import os

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", default="")
    p.add_argument("--checkpoint-dir", default="/data/checkpoints")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    ckpt = os.path.join(args.checkpoint_dir, "model.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        model.module.load_state_dict(state["model"])
        start = state["epoch"] + 1
    for epoch in range(start, args.epochs):
        x, y = torch.randn(64, 32, device=device), torch.randn(64, 1, device=device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} rank {rank}/{world} loss {loss.item():.4f} on {os.environ.get('ET_MEMBER_HOST', '?')}", flush=True)
        if rank == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
