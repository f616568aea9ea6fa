"""Two agents of the elastic-training backend (elastic_training.rendezvous, as torchrun's handler drives it) against a real serving sidecar, where
agent B loses the connection it asked on after a round took it: what the cluster showed when the rendezvous pod was
replaced (B's first ask reached the next store before B's pod registered there, the round formed with it when it did,
then B's pod's sidecar closed the connection and B asked again). B asks again over a new connection for the same
request, deleting its rank first; it must get round 1, where A waits for it.

usage: ask_again.py HOST:PORT RUN_ID HOST_A HOST_B
It prints "asked" once B's first ask is in (the test then registers B), and "A round=N rank=R world=W" and the same for
B once both have their rounds.
"""

import sys
import threading
import time
from datetime import timedelta

from elastic_training import rendezvous
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import api

addr, run_id, host_a, host_b = sys.argv[1:]
host, _, port = addr.rpartition(":")
errors = (api.RendezvousClosedError, api.RendezvousTimeoutError, dist.DistStoreError, dist.DistNetworkError)
settings = {"min": 2, "max": 2, "last_call": 0}


def client():
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30), use_libuv=False)


class LostAfterTheRound:
    """B's first connection: its wait ends as the sidecar's proxy ends it, once a round took B (its rank key is
    written), with the error torch's client raises on a closed connection."""

    def __init__(self, store):
        self.store, self.side = store, client()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def wait(self, keys, timeout):
        print("asked", flush=True)
        deadline = time.monotonic() + 60
        while not self.side.check(keys):
            if time.monotonic() > deadline:
                raise SystemExit("no round took B in 60 s")
            time.sleep(0.05)
        raise dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed.")


connections = 0


def connect_b(deadline):
    global connections
    connections += 1
    return LostAfterTheRound(client()) if connections == 1 else client()


a = rendezvous.Rendezvous(lambda deadline: client(), run_id, host_a, settings, 20, errors)
b = rendezvous.Rendezvous(connect_b, run_id, host_b, settings, 20, errors)
got = {}
thread = threading.Thread(target=lambda: got.setdefault("A", a.next()))
thread.start()
got["B"] = b.next()
thread.join()
for name in "AB":
    n, rank, world = got[name]
    print(f"{name} round={n} rank={rank} world={world}", flush=True)
