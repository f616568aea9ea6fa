# A save is a snapshot: the loop changes the state in place right after save() returns, while the background write
# runs; the step loaded back is the state as it was at save(). torch 2.6's async_save alone would write the changed
# tensors (it stages a CPU tensor as itself).
import os, tempfile
import torch, torch.distributed as dist
import elastic_training.checkpoint as ckpt

dist.init_process_group("gloo")
d = os.environ["ET_CHECKPOINT_DIR"]
w = torch.zeros(64 << 20 // 4)  # 64 MiB: the write takes long enough for the change below to land during it
state = {"w": w}
ckpt.save(state, 1)
for _ in range(20):
    w.add_(1.0)  # the next steps, while the save is written
ckpt.wait()
fresh = {"w": torch.full_like(w, -1.0)}
assert ckpt.load(fresh) == 1
print(f"SNAPSHOT min={fresh['w'].min().item()} max={fresh['w'].max().item()}", flush=True)
dist.destroy_process_group()
