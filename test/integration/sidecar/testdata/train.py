import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={int(t.item())} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')} master_addr={os.environ.get('MASTER_ADDR')}", flush=True)
steps = int(os.environ.get("TRAIN_STEPS", "0"))
for i in range(steps):
    t = torch.ones(1); dist.all_reduce(t)
    print(f"STEP {i} world={dist.get_world_size()} sum={int(t.item())}", flush=True)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.5")))
dist.destroy_process_group()
