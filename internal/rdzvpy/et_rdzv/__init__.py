"""elastic-training's torchrun rendezvous backend (draft, docs/own-rendezvous.md).

torchrun loads it through the ``torchrun.handlers`` entry point (the sidecar installs this package and its
dist-info into the shared files directory; the webhook puts that on PYTHONPATH). The serving sidecar decides the
rounds (internal/rdzv) from the job's membership and the agents' readiness; an agent writes one key and waits on
its own, so no agent rewrites anything another wrote. Standard library and torch only.
"""

import json
import os
import socket
import time
from datetime import timedelta

BACKEND = "elastic-training"
PREFIX = "/et/rdzv"


def keys(run_id):
    """The run's keys in the sidecar's c10d store (the Go side's names are the same)."""
    base = f"{PREFIX}/{run_id}"
    return {
        "ready": lambda host: f"{base}/ready/{host}",
        "assigned": lambda n, host: f"{base}/round/{n}/{host}",
        "state": f"{base}/state",
        "closed": f"{base}/closed",
        "store": lambda n: f"{base}/round/{n}/store/",
    }


def parse_state(raw):
    """The sidecar's state key: "round=N waiting=K"."""
    out = {"round": 0, "waiting": 0}
    for field in raw.decode().split():
        k, _, v = field.partition("=")
        if k in out:
            out[k] = int(v)
    return out


class Handler:
    """torch's RendezvousHandler against the sidecar's rounds; store is a c10d Store client of the sidecar."""

    def __init__(self, store, run_id, host, join_timeout, api):
        self._store, self._run, self._host = store, run_id, host
        self._join_timeout = join_timeout
        self._api = api  # torch.distributed.elastic.rendezvous.api, or a stand-in in tests
        self._k = keys(run_id)
        self._round = 0

    def get_backend(self):
        return BACKEND

    @property
    def use_agent_store(self):
        # Not yet: sharing means rank 0's agent hosts a TCPStore server for its workers, as torch's own handler
        # does (_create_tcp_store_server); without it the workers' rank 0 hosts the store at MASTER_PORT, which
        # RendezvousStoreInfo.build picks free. An open question of the design (docs/own-rendezvous.md).
        return False

    def get_run_id(self):
        return self._run

    def is_closed(self):
        return self._store.check([self._k["closed"]])

    def set_closed(self):
        self._store.set(self._k["closed"], b"1")

    def num_nodes_waiting(self):
        if not self._store.check([self._k["state"]]):
            return 0
        return parse_state(self._store.get(self._k["state"]))["waiting"]

    def next_rendezvous(self):
        if self.is_closed():
            raise self._api.RendezvousClosedError()
        ready = {"host": self._host, "pid": os.getpid(), "after": self._round}
        self._store.set(self._k["ready"](self._host), json.dumps(ready).encode())
        deadline = time.monotonic() + self._join_timeout.total_seconds()
        while True:
            state = parse_state(self._store.get(self._k["state"])) if self._store.check([self._k["state"]]) else {"round": 0}
            n = max(state["round"], self._round) + 1
            key = self._k["assigned"](n, self._host)
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._api.RendezvousTimeoutError()
            try:
                self._store.wait([key], timedelta(seconds=min(left, 5.0)))
            except Exception:  # the wait's own timeout: the round may have moved on; look again
                if self.is_closed():
                    raise self._api.RendezvousClosedError()
                continue
            rank, world = (int(x) for x in self._store.get(key).decode().split())
            self._round = n
            return rank, world, n

    def shutdown(self):
        try:
            self._store.delete_key(self._k["ready"](self._host))
        except Exception:
            return False
        return True


def handler():
    """The entry point: torchrun calls it with no arguments and registers what it returns as the creator."""
    return create


def create(params):
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.elastic.rendezvous import api

    host, _, port = params.endpoint.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60), use_libuv=False)
    join = timedelta(seconds=float(params.get("join_timeout", 600)))
    local_addr = params.local_addr or socket.getfqdn()
    inner = Handler(store, params.run_id, local_addr, join, api)

    class ETRendezvousHandler(api.RendezvousHandler):
        def get_backend(self):
            return inner.get_backend()

        @property
        def use_agent_store(self):
            return inner.use_agent_store

        def next_rendezvous(self):
            rank, world, n = inner.next_rendezvous()
            round_store = PrefixStore(keys(params.run_id)["store"](n), store)
            info = api.RendezvousStoreInfo.build(rank, round_store, local_addr=local_addr)
            return api.RendezvousInfo(round_store, rank, world, info)

        def is_closed(self):
            return inner.is_closed()

        def set_closed(self):
            inner.set_closed()

        def num_nodes_waiting(self):
            return inner.num_nodes_waiting()

        def get_run_id(self):
            return inner.get_run_id()

        def shutdown(self):
            return inner.shutdown()

    return ETRendezvousHandler()
