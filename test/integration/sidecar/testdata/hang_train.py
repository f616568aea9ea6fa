# A synchronous training loop that says its progress every step (elastic_training.progress): an all_reduce per step
# (gloo), then the step's time, then the call. Each worker prints its pid, rank, world and torch's restart count as
# it starts, so that a test can freeze one (SIGSTOP) and see the round re-formed and training again.
# SYNC_EVERY=0 drops the all_reduce (ranks that advance apart, as an asynchronous loop's); SLOW_RANK and SLOW_SLEEP
# make one rank's steps longer (a straggler).
import os, time
import torch, torch.distributed as dist
import elastic_training

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"WORKER pid={os.getpid()} rank={rank} world={world} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
steps, sleep = int(os.environ.get("TRAIN_STEPS", "100000")), float(os.environ.get("STEP_SLEEP", "0.2"))
sync = int(os.environ.get("SYNC_EVERY", "1"))
if rank == int(os.environ.get("SLOW_RANK", "-1")):
    sleep += float(os.environ.get("SLOW_SLEEP", "0"))
t = torch.ones(1)
for step in range(1, steps + 1):
    if sync and step % sync == 0:
        dist.all_reduce(t)
    time.sleep(sleep)
    elastic_training.progress(step, steps)
    if step % 10 == 0:
        print(f"STEP {step} rank={rank} world={world}", flush=True)
