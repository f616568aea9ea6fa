# The save stall of a training loop, per step: elastic_training.checkpoint.save (DCP async_save into a memory-backed
# directory) against torch's documented ways into a directory on disk, the job's volume's stand-in: dcp.save
# (blocking) and dcp.async_save, and rank 0's torch.save of the whole state. Same state, same process group, same run.
# Prints one BENCH line per way.
import os, statistics, sys, time, tempfile, shutil
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
import elastic_training.checkpoint as ckpt

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
size = int(os.environ["BENCH_STATE_BYTES"])  # the job's state, replicated: every rank holds it (DDP)
steps = int(os.environ.get("BENCH_STEPS", "5"))
state = {"model": {"w%d" % i: torch.randn(size // 4 // 8) for i in range(8)}}
memdir, diskdir = os.environ["BENCH_MEM_DIR"], os.environ["BENCH_DISK_DIR"]
group = dist.new_group(backend="gloo")


def step_compute():
    with torch.no_grad():
        for t in state["model"].values():
            t.add_(1.0)  # the step changes the state in place, as an optimizer does
    time.sleep(float(os.environ.get("BENCH_STEP_SECONDS", "1")))  # the step's compute: the background write overlaps it


def measure(name, save, finish=lambda: None):
    stalls = []
    for s in range(steps):
        step_compute()
        dist.barrier()
        t0 = time.monotonic()
        save(s)
        stalls.append(time.monotonic() - t0)
    finish()
    dist.barrier()
    if rank == 0:
        print(f"BENCH way={name} bytes={size} torch={torch.__version__} world={world} stall_ms_median={statistics.median(stalls) * 1000:.1f} stall_ms_max={max(stalls) * 1000:.1f}", flush=True)


measure("elastic_training.checkpoint", lambda s: ckpt.save(state, s + 1, dir=memdir), ckpt.wait)
measure("dcp.save", lambda s: dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(diskdir, f"dcp-{s}")), process_group=group))
futures = []
def async_save(s):
    if futures:
        futures.pop().result()
    futures.append(dcp.async_save(state, storage_writer=dcp.FileSystemWriter(os.path.join(diskdir, f"async-{s}")), process_group=group))
measure("dcp.async_save", async_save, lambda: futures and futures.pop().result())
def torch_save(s):
    if rank == 0:
        torch.save(state, os.path.join(diskdir, f"torch-{s}.pt"))
    dist.barrier()
measure("torch.save", torch_save)
dist.destroy_process_group()
