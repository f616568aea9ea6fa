"""The elastic-training torchrun rendezvous backend (docs/elastic-training-backend.md).

torchrun (torch >= 2.5) loads it through the ``torchrun.handlers`` entry point: the rendezvous sidecar installs this
package and its dist-info into the files directory it shares with the trainer, and the webhook puts that directory on
PYTHONPATH. The job's serving sidecar decides the rounds (internal/rdzv) from the job's membership and the agents'
readiness. An agent writes one key of its own and waits for one key of its own; nothing here rewrites what another
agent wrote, so a round of N agents costs O(N) store operations, not torch's O(N^2) compare-and-sets of one shared
pickle. Standard library and torch only.

The keys (internal/rdzv/c10drounds; torch's client puts a "/" in front of each):
    elastic-training/<run>/ready/<host>     this agent asks for the next round: {"min", "max", "last_call", "ask"}, ask the
                                            id of this request, the same each time the agent asks again for it after it lost the
                                            store's connection
    elastic-training/<run>/rank/<host>      the sidecar: "<round> <rank> <world size> <ask>" once a round takes this agent for
                                            request ask, or "closed"; the agent deletes it before it asks, so it waits for one key
                                            of its own with no round number
    elastic-training/<run>/round/<N>/store  round N's store (a PrefixStore)
    elastic-training/<run>/state            the sidecar: "round=<N> waiting=<K>", and " hung=1" while it restarts a round
                                            whose ranks stopped advancing (docs/hangs.md)
    elastic-training/<run>/closed           set_closed
    elastic-training/<run>/done/<host>      shutdown: this agent's run ended; it leaves its round without making the others
                                            re-form (the sidecar takes a node that vanishes without it as lost)
"""

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta

BACKEND = "elastic-training"
PREFIX = "elastic-training"

log = logging.getLogger(__name__)


class Keys:
    """The run's keys, as the agent names them."""

    def __init__(self, run_id):
        self.base = f"{PREFIX}/{run_id}"
        self.state = f"{self.base}/state"
        self.closed = f"{self.base}/closed"

    def ready(self, host):
        return f"{self.base}/ready/{host}"

    def done(self, host):
        return f"{self.base}/done/{host}"

    def rank(self, host):
        return f"{self.base}/rank/{host}"

    def store(self, n):
        return f"{self.base}/round/{n}/store"


def parse_state(raw):
    """The sidecar's state: "round=N waiting=K [hung=1]"."""
    out = {"round": 0, "waiting": 0, "hung": 0}
    for field in raw.decode().split():
        k, _, v = field.partition("=")
        if k in out:
            out[k] = int(v)
    return out


def _children(pid):
    """pid's live children: (pid, command line, environment at their start), from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[1]) != pid or fields[0] == b"Z":
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{d}/environ", "rb") as f:
                environ = f.read()
            out.append((int(d), cmdline, environ))
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile
    return out


def _workers():
    """The agent's workers: its children that carry torchelastic's environment (not a multiprocessing helper), or
    with the warm start (elastic_training._warm) the children of its fork server, which are forked, not started with
    that environment."""
    pids = []
    for pid, cmdline, environ in _children(os.getpid()):
        if b"TORCHELASTIC_RESTART_COUNT=" in environ:
            pids.append(pid)
        elif b"multiprocessing.forkserver" in cmdline:
            pids.extend(p for p, _, _ in _children(pid))
    return pids


def _monitor_interval():
    """torchrun's monitor interval as the webhook sets it (PET_MONITOR_INTERVAL); 1 s when it is not there."""
    try:
        return max(0.0, float(os.environ.get("PET_MONITOR_INTERVAL", "1")))
    except ValueError:
        return 1.0


# How long an agent's workers stay frozen before it stops them when their round hung: every agent of the round ticks
# within a monitor interval (the same for every pod of a job), twice here, and a second more.
FREEZE_WAIT = 2 * _monitor_interval() + 1.0


def signal_workers(sig):
    """Send sig to this agent's workers."""
    for pid in _workers():
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_workers(why, grace=3.0):
    """Stop this agent's workers now, before it restarts them: torch's agent sends SIGTERM and waits 30 s for a
    worker that does not act on it (a frozen one: SIGSTOP, or stuck where the signal waits) before SIGKILL. Here:
    SIGCONT and SIGTERM, then SIGKILL after grace. The agent asks num_nodes_waiting() only while its workers are
    healthy, and restarts them at once after it (torch counts no restart): it never sees them fail."""
    pids = _workers()
    if not pids:
        return
    log.warning("elastic-training rendezvous: %s; stopping workers %s", why, " ".join(map(str, pids)))
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and set(pids) & set(_workers()):
        time.sleep(0.05)
    for pid in set(pids) & set(_workers()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Rendezvous:
    """The protocol against a c10d store client of the sidecar; torch's classes are the caller's (create)."""

    def __init__(self, connect, run_id, host, settings, join_timeout, errors):
        self.connect = connect  # deadline (time.monotonic()) -> a store client, or raises once it has passed
        self.store = None  # connected by next(); None again once the connection to the store broke
        self.run_id, self.host = run_id, host
        self.settings = settings  # {"min", "max", "last_call"}: the run takes the first agent's
        self.join_timeout = join_timeout
        self.keys = Keys(run_id)
        self.stopped_hung = 0  # the last hung round whose workers this agent stopped
        self.freezing, self.frozen_at = 0, 0.0  # the last hung round whose workers this agent froze, and when
        # torch's: the run is closed, no round in time, a wait that timed out, the connection to the store broke.
        self.closed_error, self.timeout_error, self.wait_error, self.lost_error = errors

    def state(self):
        if not self.store.check([self.keys.state]):
            return {"round": 0, "waiting": 0}
        return parse_state(self.store.get(self.keys.state))

    def connected(self):
        if self.store is None:
            self.store = self.connect(time.monotonic() + self.join_timeout)
        return self.store

    def is_closed(self):
        return self.connected().check([self.keys.closed])

    def set_closed(self):
        self.connected().set(self.keys.closed, b"1")

    def num_nodes_waiting(self):
        """The agent asks it every monitor interval while its workers run. When the store is gone (the pod that served
        it was lost or replaced: this pod's sidecar closes the connection once its registration ends) it says a node
        waits, so that the agent stops its workers and asks next() for a round, which waits for the next store. An
        agent that exited instead would fail a pod of restartPolicy Never, which its Job replaces only after a back-off
        that doubles with every failed pod of the Job (10 s, then 20, 40, 80: a job of 3 waited 80 s), and restart one
        of OnFailure, which imports torch again."""
        if self.store is None:
            return 1
        try:
            st = self.state()
            if st["hung"] and st["waiting"] and st["round"] != self.stopped_hung:
                # Two steps: first freeze this agent's workers (SIGSTOP: their connections stay open, so no worker
                # of another agent fails on them, which its agent would count as a restart, and with none left end
                # the job), and give every agent of the round a tick to do the same; then stop them. An agent that
                # stopped its workers at once made the others' fail before their agents' next tick.
                if self.freezing != st["round"]:
                    self.freezing, self.frozen_at = st["round"], time.monotonic()
                    signal_workers(signal.SIGSTOP)
                    return 0
                if time.monotonic() - self.frozen_at < FREEZE_WAIT:
                    return 0
                self.stopped_hung = st["round"]
                stop_workers(f"round {st['round']} hung: no rank advanced for the hang timeout")
            elif self.freezing and self.freezing != self.stopped_hung:
                self.stopped_hung = self.freezing  # frozen, then the round changed: they must not stay frozen
                stop_workers(f"round {self.freezing} hung, then changed")
                return max(st["waiting"], 1)
            return st["waiting"]
        except self.lost_error as e:
            log.warning("elastic-training rendezvous: lost the store (%s); stopping the workers for the next round",
                        first_line(e))
            self.store = None
            if self.freezing and self.freezing != self.stopped_hung:
                self.stopped_hung = self.freezing
                stop_workers("the store is lost while the workers are frozen")
            return 1

    def next(self):
        """Ask for the next round and wait for this agent's rank in it: (round, rank, world size). A store that goes
        away meanwhile is waited for again, within the join timeout, and asked again for the same request: the ask
        made on the lost connection may have reached the next store (its pod's sidecar connects it there before its
        registration ends) and a round there may have taken this agent for it, whose other agents then wait for this
        one in their rendezvous (torch's _assign_worker_ranks, until the store's timeout). The sidecar answers the same
        request with the same round."""
        deadline = time.monotonic() + self.join_timeout
        request = os.urandom(8).hex()
        while True:
            if self.store is None:
                self.store = self.connect(deadline)
            try:
                return self.ask(deadline, request)
            except self.lost_error as e:
                self.store = None
                if time.monotonic() + 1 >= deadline:
                    raise self.timeout_error(f"no round of run {self.run_id} took {self.host} in "
                                             f"{self.join_timeout:.0f} s; the store went away ({first_line(e)})")
                log.warning("elastic-training rendezvous: lost the store (%s); asking the next one", first_line(e))
                time.sleep(1)  # a store that closes each connection at once is not asked in a busy loop

    def ask(self, deadline, request):
        if self.is_closed():
            raise self.closed_error()
        key = self.keys.rank(self.host)
        while True:
            # The last round's rank goes first: the one this agent then waits for is the next round's. (One
            # connection: the sidecar sees the delete before the ready.)
            self.store.delete_key(key)
            self.store.set(self.keys.ready(self.host), json.dumps({**self.settings, "ask": request}).encode())
            # One wait: the sidecar writes this key when a round takes this agent and when the run is closed. (A wait
            # that times out makes torch's client log a warning: polling would fill the trainer's log.)
            try:
                self.store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 1)))
            except self.wait_error:
                raise self.timeout_error(f"no round of run {self.run_id} took {self.host} in {self.join_timeout:.0f} s")
            value = self.store.get(key).decode()
            if value == "closed":
                raise self.closed_error()
            fields = value.split()
            # A sidecar of before the request id writes three fields.
            if len(fields) == 4 and fields[3] != request:
                log.warning("elastic-training rendezvous: a rank for another request of this agent (%s); asking again",
                            value)
                if time.monotonic() >= deadline:
                    raise self.timeout_error(f"no round of run {self.run_id} took {self.host} in {self.join_timeout:.0f} s")
                continue
            n, rank, world = (int(x) for x in fields[:3])
            log.info("elastic-training rendezvous: run %s round %d: rank %d of %d", self.run_id, n, rank, world)
            return n, rank, world

    def shutdown(self):
        """This agent's run ended (torchrun calls it once its workers succeeded or failed for good, or on a signal): it
        asks for no round, and leaves its round without making the others re-form, as a node that finished does in
        torch; the run stays open for them. (A scale-down's preStop said "leave" before the signal: that is a loss.)"""
        if self.store is None:  # a store that went away holds nothing of this agent
            return False
        try:
            self.store.set(self.keys.done(self.host), b"1")
            self.store.delete_key(self.keys.ready(self.host))
        except Exception:  # the store may be gone with the job
            return False
        return True


def handler():
    """The entry point: torchrun calls it with no arguments and registers what it returns as the creator."""
    return create


def first_line(e):
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def connect(dist, host, port, read_timeout, deadline):
    """The sidecar's store, waited for until deadline (the join timeout's end). The trainer starts with its pod's
    sidecar, before the pod is a member of the job (docs/contract.md): the sidecar's proxy holds this connection until
    then (a minute at most: then it closes it), and at a job's install, or after the serving pod was lost, the store
    itself may still be starting. read_timeout is torch's c10d backend's setting of the same name: the store client's
    timeout for connecting and for every request."""
    while True:
        try:
            return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=read_timeout), use_libuv=False)
        except RuntimeError as e:  # torch's DistStoreError and DistNetworkError are RuntimeErrors
            if time.monotonic() + read_timeout > deadline:
                raise
            log.warning("elastic-training rendezvous: the store at %s:%d did not answer (%s); trying again",
                        host, port, first_line(e))
            time.sleep(1)  # an error that comes at once (none should: torch's client retries until its timeout)


# What the webhook sets for the warm start besides ET_WARM_START (mutate.WarmStartEnv).
WARM_START_ENV = ("PET_RUN_PATH", "PET_START_METHOD")
ENV_FROM_PROBE = "ET_ENV_FROM_"  # constants.EnvFromProbePrefix


def env_from_choices():
    """The torchrun settings that the container's envFrom chooses, which the warm start's env overrides (env wins over
    envFrom): the webhook cannot read a ConfigMap or a Secret, so it sets ET_ENV_FROM_<name> to "$(<name>)", which
    the kubelet expands to envFrom's value and leaves as it is where envFrom sets none (mutate.EnvFromProbes)."""
    chosen = {}
    for key, value in os.environ.items():
        if key.startswith(ENV_FROM_PROBE):
            name = key[len(ENV_FROM_PROBE):]
            if value != f"$({name})":
                chosen[name] = value
    return chosen


def start_cold(chosen):
    """Runs this agent again as it would have run without the warm start: the webhook would not have set it, had it
    seen what envFrom chooses. Nothing of the job has begun yet (torchrun creates its rendezvous first); the process
    stays the same (its pid, its container)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_FROM_PROBE) and k not in WARM_START_ENV}
    env.update(chosen)
    env["ET_WARM_START"] = "0"
    log.warning("elastic-training: the warm start is off in this pod: the container's envFrom sets %s; torchrun starts "
                "again with them (docs/warm-start.md)", ", ".join(f"{k}={v}" for k, v in sorted(chosen.items())))
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    argv = getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv  # orig_argv keeps `-m torch.distributed.run`
    os.execve(sys.executable, argv, env)


def start_fork_server():
    from multiprocessing import forkserver

    try:
        forkserver.ensure_running()
    except Exception as e:  # the first worker's start tries again, and says why if it fails too
        log.warning("elastic-training rendezvous: could not start the warm start's fork server ahead: %s", first_line(e))


def create(params):
    """torch's creator: RendezvousParameters in, a RendezvousHandler out."""
    import torch.distributed as dist

    if os.environ.get("ET_WARM_START") == "1":
        chosen = env_from_choices()
        if chosen:
            start_cold(chosen)  # does not return
        # The warm start (elastic_training._warm, docs/warm-start.md): torchrun's agent creates its rendezvous
        # before it starts any worker, so the fork server it starts them from is not running yet.
        import multiprocessing

        multiprocessing.set_forkserver_preload(["elastic_training._warm"])
        # Started now, beside this agent's wait for its first round: the fork server's import of torch (1 to 2 s)
        # would otherwise come after the round, at the first worker's start, which a new pod's whole job waits for.
        # The first worker's start waits for it (multiprocessing's lock), or starts it itself if this failed.
        threading.Thread(target=start_fork_server, name="elastic-training-forkserver", daemon=True).start()
    from torch.distributed.elastic.rendezvous import api

    host, _, port = params.endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--rdzv-endpoint {params.endpoint!r}: want host:port of the rendezvous sidecar's c10d store")
    join_timeout = float(params.get("join_timeout", 600))
    read_timeout = float(params.get("read_timeout", 60))
    local_addr = params.local_addr or socket.getfqdn()
    # The workers reach their rank 0's store at MASTER_ADDR: the pod's IP where the webhook gives it (ET_POD_IP), not
    # its DNS name, which for a while resolves to two pods when a lost pod's replacement starts beside the old one
    # still Terminating on a node cut off (a worker that picks the old address waits minutes for TCP to give up).
    master_addr = os.environ.get("ET_POD_IP") or local_addr
    settings = {
        "min": params.min_nodes,
        "max": params.max_nodes,
        "last_call": float(params.get("last_call_timeout", 30)),
    }
    rdzv = Rendezvous(
        lambda deadline: connect(dist, host, int(port), read_timeout, deadline),
        params.run_id,
        local_addr,
        settings,
        join_timeout,
        (api.RendezvousClosedError, api.RendezvousTimeoutError, dist.DistStoreError, dist.DistNetworkError),
    )

    class Handler(api.RendezvousHandler):
        round = 0  # the last round this agent took part in (0: none yet)

        def get_backend(self):
            return BACKEND

        @property
        def use_agent_store(self):
            # The workers' rank 0 hosts their own store at MASTER_ADDR:MASTER_PORT, as torch's c10d handler does
            # with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (which the webhook sets).
            return False

        def next_rendezvous(self):
            n, rank, world = rdzv.next()
            self.round = n
            round_store = dist.PrefixStore(rdzv.keys.store(n), rdzv.store)
            info = api.RendezvousStoreInfo.build(rank, round_store, local_addr=master_addr)
            return api.RendezvousInfo(round_store, rank, world, info)

        def is_closed(self):
            return rdzv.is_closed()

        def set_closed(self):
            rdzv.set_closed()

        def num_nodes_waiting(self):
            return rdzv.num_nodes_waiting()

        def get_run_id(self):
            return rdzv.run_id

        def shutdown(self):
            return rdzv.shutdown()

    return Handler()
