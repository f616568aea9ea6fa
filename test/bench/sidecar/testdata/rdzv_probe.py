# One torch elastic agent's rendezvous, timed without Python/torch start-up:
# import everything, wait for the go file, then time next_rendezvous() with
# the real torch handler (and so the real python-etcd requests).
import os
import sys
import time

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

backend, endpoint, run_id, nodes, go_file = sys.argv[1:6]
params = RendezvousParameters(backend=backend, endpoint=endpoint, run_id=run_id,
                              min_nodes=int(nodes), max_nodes=int(nodes))
print("READY", flush=True)
while not os.path.exists(go_file):
    time.sleep(0.001)
t0 = time.monotonic()
handler = get_rendezvous_handler(params)
info = handler.next_rendezvous()
elapsed = time.monotonic() - t0
# torch >= 2.4 returns a RendezvousInfo; older releases a (store, rank, world_size) tuple.
if isinstance(info, tuple):
    store, rank, world = info
else:
    rank, world = info.rank, info.world_size
print(f"RDZV {elapsed:.4f} rank={rank} world={world}", flush=True)
# Stay until every agent is done, as a real agent would (leaving early can
# make a peer's rendezvous see a departure).
while not os.path.exists(go_file + ".done"):
    time.sleep(0.01)
