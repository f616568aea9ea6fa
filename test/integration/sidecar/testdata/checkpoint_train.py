# A training loop with in-memory checkpoints (elastic_training.checkpoint): a replicated model (DDP), a sharded
# tensor (a DTensor sharded by rows over every rank), and where torch's FSDP2 runs on CPU (2.14; 2.6's needs CUDA)
# an FSDP2 model with its optimizer (momentum: optimizer state) through DCP's Stateful and get/set_state_dict, all
# updated deterministically per step, so the state at step k is the same at every world size. Each save and each
# restore prints a digest of the whole state (sharded parts gathered): a restore at a new world size must print the
# digest its step was saved with.
import hashlib, os, time
import torch, torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
import elastic_training.checkpoint as ckpt

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sharded = distribute_tensor(torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8), mesh, [Shard(0)])
state = {"model": model.state_dict(), "sharded": {"w": sharded}, "progress": {"step": torch.zeros(1, dtype=torch.int64)}}
# BENCH_STATE_MIB: a replicated tensor of that size besides (the bench's state size), updated every step.
ballast = None
if int(os.environ.get("BENCH_STATE_MIB", "0")) > 0:
    ballast = torch.zeros(int(os.environ["BENCH_STATE_MIB"]) << 18)
    state["ballast"] = {"w": ballast}


class FSDPState(Stateful):
    """The DCP tutorial's AppState: the model's and the optimizer's state dicts, sharded as FSDP2 holds them."""

    def __init__(self, model, optim):
        self.model, self.optim = model, optim

    def state_dict(self):
        m, o = get_state_dict(self.model, self.optim)
        return {"model": m, "optim": o}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


fsdp = None
try:
    from torch.distributed.fsdp import fully_shard

    fsdp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
    for layer in fsdp:
        fully_shard(layer)
    fully_shard(fsdp)
    fsdp_opt = torch.optim.SGD(fsdp.parameters(), lr=0.01, momentum=0.9)
    fsdp(torch.zeros(1, 16)).sum().backward()  # fails here where FSDP2 needs CUDA
    fsdp.zero_grad()
    state["fsdp"] = FSDPState(fsdp, fsdp_opt)
except (ImportError, RuntimeError, AssertionError, ValueError, AttributeError) as e:
    fsdp = None
    print(f"no FSDP2 on CPU in torch {torch.__version__}: {type(e).__name__}", flush=True)


def digest():
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode()); h.update(v.detach().numpy().tobytes())
    h.update(sharded.full_tensor().numpy().tobytes())
    if fsdp is not None:
        full = get_model_state_dict(fsdp, options=StateDictOptions(full_state_dict=True))
        for k, v in sorted(full.items()):
            h.update(k.encode()); h.update(v.detach().numpy().tobytes())
        for group in fsdp_opt.state.values():
            buf = group.get("momentum_buffer")
            if buf is not None:
                h.update(buf.full_tensor().numpy().tobytes())
    return h.hexdigest()[:16]


# CKPT_WAY=dcp (the bench's torch's way, BenchmarkCheckpointNodeLoss): dcp.save every CKPT_EVERY steps to CKPT_DISK,
# a directory all pods share (the job volume's stand-in), and dcp.load of the newest one whole at the start.
way, disk, every = os.environ.get("CKPT_WAY", "memory"), os.environ.get("CKPT_DISK", ""), int(os.environ.get("CKPT_EVERY", "1"))
if way == "dcp":
    import torch.distributed.checkpoint as dcp

    def load(state):
        try:
            with open(os.path.join(disk, "latest")) as f:
                n = int(f.read())
        except FileNotFoundError:
            return None
        dcp.load(state, checkpoint_id=os.path.join(disk, f"step-{n}"))
        return n

    def save(state, n):
        if n % every:
            return False
        dcp.save(state, checkpoint_id=os.path.join(disk, f"step-{n}"))
        dist.barrier()  # every rank's piece is written: the step is whole
        if rank == 0:
            with open(os.path.join(disk, "latest.tmp"), "w") as f:
                f.write(str(n))
            os.replace(os.path.join(disk, "latest.tmp"), os.path.join(disk, "latest"))
        return True
else:
    load = ckpt.load

    def save(state, n):
        ckpt.save(state, n)
        return True

t0 = time.monotonic()
step = load(state)
print(f"RESTORED step={step} world={world} rank={rank} digest={digest() if step is not None else '-'} seconds={time.monotonic() - t0:.2f}", flush=True)
step = step or 0
assert int(state["progress"]["step"].item()) == step
while step < int(os.environ.get("TRAIN_STEPS", "1000")):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 16, generator=g)
    model(x).sum().backward()
    opt.step(); opt.zero_grad()
    if fsdp is not None:
        fsdp(x).sum().backward()
        fsdp_opt.step(); fsdp_opt.zero_grad()
    with torch.no_grad():
        sharded.add_(1.0)
        if ballast is not None:
            ballast.add_(1.0)
    step += 1
    state["progress"]["step"].fill_(step)
    if save(state, step):
        print(f"SAVED step={step} world={world} rank={rank} digest={digest()}", flush=True)
    print(f"STEP step={step} world={world} rank={rank} t={time.time():.3f}", flush=True)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.3")))
if way != "dcp":
    ckpt.wait()
dist.destroy_process_group()
