"""elastic_training.progress: a rank says it finished a step (docs/hangs.md).

One UDP datagram to the pod's sidecar on loopback ($ET_PROGRESS_ADDR, which the webhook sets; on host networking,
whose loopback is the node's, unix:<path> of a datagram socket in the pod's own volume), never a wait: the
sidecar reports the pod's ranks to the serving sidecar, which restarts a round whose ranks stopped advancing (a hung
rank blocks every other in its next collective) and shows the job's step, rate and ETA. Outside a job (no
$ET_PROGRESS_ADDR) it does nothing. Standard library only.

From the first call on, a thread of its own says the last step again every second: the heartbeat of the rank's
process. A rank blocked in a collective (which releases Python's lock) goes on beating; one frozen whole (stopped,
or stuck in a call that holds the lock) does not, and that is the rank a hung round's Event names.
"""

import os
import socket
import threading
import time

_sock = None
_addr = None
_rank = None
_last = None  # the last datagram, said again by the heartbeat
_beating = None  # the pid whose heartbeat thread runs (a forked child has none)

HEARTBEAT_SECONDS = 1.0
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def _heartbeat():
    while True:
        time.sleep(HEARTBEAT_SECONDS)
        try:
            _sock.sendto(_last, _addr)
        except (OSError, ValueError, TypeError):
            pass


def _setup():
    global _sock, _addr, _rank
    spec = os.environ.get("ET_PROGRESS_ADDR", "")
    if spec.startswith("unix:") and len(spec) > len("unix:"):
        _addr, family = spec[len("unix:"):], socket.AF_UNIX
    else:
        host, sep, port = spec.rpartition(":")
        if not sep or not port.isdigit():
            _addr = False
            return
        _addr = (host.strip("[]") or "127.0.0.1", int(port))
        family = socket.AF_INET6 if ":" in _addr[0] else socket.AF_INET
    # torchrun's RANK, else the MPI rank of Open MPI, MPICH/Intel MPI's Hydra or PMIx (an MPI job's ranks, which its
    # launcher's supervise judges).
    _rank = int(next((os.environ[k] for k in _RANK_VARS if os.environ.get(k, "").isdigit()), "0"))
    _sock = socket.socket(family, socket.SOCK_DGRAM)
    _sock.setblocking(False)


def progress(step, total=None):
    """Say that this rank finished step `step` (an int that grows; a smaller one is a new start) of `total` steps
    (None: unknown). Call it every step: it costs one datagram (microseconds) and never blocks or raises."""
    if _addr is None:
        _setup()
    if not _addr:
        return
    global _last, _beating
    pid = os.getpid()
    # The pid tells the sidecar a restarted worker from its predecessor's heartbeat at the same step.
    _last = b"et1 %d %d %d %d" % (_rank, int(step), int(total or 0), pid)
    try:
        _sock.sendto(_last, _addr)
    except (OSError, ValueError):
        pass  # a full socket buffer or a sidecar not yet up: the next step says it again
    if _beating != pid:
        _beating = pid
        threading.Thread(target=_heartbeat, name="elastic-training-heartbeat", daemon=True).start()
