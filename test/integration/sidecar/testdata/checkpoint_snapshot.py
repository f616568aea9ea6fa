# A save is a snapshot: the loop changes the state in place right after save() returns, while the background write
# runs; the step loaded back is the state as it was at save(). torch 2.6's async_save alone would write the changed
# tensors (it stages a CPU tensor as itself). A later save of the same layout stages into the same memory, with that
# save's values (tensors and plain values); one of another layout (a tensor of another shape, a key more) is staged
# anew.
import os, tempfile
import torch, torch.distributed as dist
import elastic_training.checkpoint as ckpt

dist.init_process_group("gloo")
d = os.environ["ET_CHECKPOINT_DIR"]
w = torch.zeros(64 << 20 // 4)  # 64 MiB: the write takes long enough for the change below to land during it
state = {"w": w, "n": 1}
ckpt.save(state, 1)
for _ in range(20):
    w.add_(1.0)  # the next steps, while the save is written
ckpt.wait()
fresh = {"w": torch.full_like(w, -1.0), "n": 0}
assert ckpt.load(fresh) == 1
print(f"SNAPSHOT min={fresh['w'].min().item()} max={fresh['w'].max().item()} n={fresh['n']}", flush=True)
staged = ckpt._staged[1]["w"].data_ptr()

state["n"] = 2
ckpt.save(state, 2)  # the same layout: into the same staged memory
w.add_(1.0)
ckpt.wait()
fresh = {"w": torch.full_like(w, -1.0), "n": 0}
assert ckpt.load(fresh) == 2
print(f"REUSED {ckpt._staged[1]['w'].data_ptr() == staged} min={fresh['w'].min().item()} max={fresh['w'].max().item()} n={fresh['n']}", flush=True)

state = {"w": torch.full((1 << 20,), 7.0), "m": torch.full((3,), 5.0), "n": 3}  # another layout
ckpt.save(state, 3)
ckpt.wait()
fresh = {"w": torch.zeros(1 << 20), "m": torch.zeros(3), "n": 0}
assert ckpt.load(fresh) == 3
print(f"RESTAGED w={fresh['w'].min().item()}..{fresh['w'].max().item()} m={fresh['m'].tolist()} n={fresh['n']}", flush=True)
dist.destroy_process_group()
