# Writes torch's own pickle of a dynamic-rendezvous state (what the etcd-v2 and c10d backends store, before
# base64) to stdout, with timezone-aware times as torch 2.x writes them (datetime.now(timezone.utc)): the round and participants that torchstate_test.go expects. Run by `go test -update`
# inside the trainer root filesystems, with torch's real classes.
from datetime import datetime, timezone
import pickle
import sys

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

state = _RendezvousState()
state.round = 3
state.complete = True
state.deadline = datetime(2026, 11, 24, 17, 0, 30, tzinfo=timezone.utc)
nodes = [_NodeDesc(f"job-worker-{i}.job.default.svc", 40 + i, 0) for i in range(4)]
state.participants = {nodes[2]: 0, nodes[0]: 1, nodes[1]: 2}
state.wait_list = {nodes[3]}
state.last_heartbeats = {n: datetime(2026, 11, 24, 17, 0, i, 250000, tzinfo=timezone.utc) for i, n in enumerate(nodes)}
sys.stdout.buffer.write(pickle.dumps(state))
