# A training loop with in-memory checkpoints (elastic_training.checkpoint): a replicated model (DDP) and a
# sharded one (a DTensor sharded by rows over every rank, as FSDP2 shards a parameter: torch 2.6's FSDP2 needs
# CUDA), both updated deterministically per step, so the state at step k is the same at every world size. Each
# save and each restore prints a digest of the whole state (the sharded part gathered): a restore at a new world
# size must print the digest its step was saved with.
import hashlib, os, time
import torch, torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh
import elastic_training.checkpoint as ckpt

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sharded = distribute_tensor(torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8), mesh, [Shard(0)])
state = {"model": model.state_dict(), "sharded": {"w": sharded}, "progress": {"step": torch.zeros(1, dtype=torch.int64)}}


def digest():
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode()); h.update(v.detach().numpy().tobytes())
    h.update(sharded.full_tensor().numpy().tobytes())
    return h.hexdigest()[:16]


t0 = time.monotonic()
step = ckpt.load(state)
print(f"RESTORED step={step} world={world} rank={rank} digest={digest() if step is not None else '-'} seconds={time.monotonic() - t0:.2f}", flush=True)
step = step or 0
assert int(state["progress"]["step"].item()) == step
while step < int(os.environ.get("TRAIN_STEPS", "1000")):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 16, generator=g)
    model(x).sum().backward()
    opt.step(); opt.zero_grad()
    with torch.no_grad():
        sharded.add_(1.0)
    step += 1
    state["progress"]["step"].fill_(step)
    ckpt.save(state, step)
    print(f"SAVED step={step} world={world} rank={rank} digest={digest()}", flush=True)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.3")))
ckpt.wait()
dist.destroy_process_group()
