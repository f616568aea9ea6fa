"""elastic_training.progress: a rank says it finished a step (docs/hangs.md).

One UDP datagram to the pod's sidecar on loopback ($ET_PROGRESS_ADDR, which the webhook sets), never a wait: the
sidecar reports the pod's ranks to the serving sidecar, which restarts a round whose ranks stopped advancing (a hung
rank blocks every other in its next collective) and shows the job's step, rate and ETA. Outside a job (no
$ET_PROGRESS_ADDR) it does nothing. Standard library only.
"""

import os
import socket

_sock = None
_addr = None
_rank = None


def _setup():
    global _sock, _addr, _rank
    spec = os.environ.get("ET_PROGRESS_ADDR", "")
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit():
        _addr = False
        return
    _addr = (host.strip("[]") or "127.0.0.1", int(port))
    _rank = int(os.environ.get("RANK", "0"))
    _sock = socket.socket(socket.AF_INET6 if ":" in _addr[0] else socket.AF_INET, socket.SOCK_DGRAM)
    _sock.setblocking(False)


def progress(step, total=None):
    """Say that this rank finished step `step` (an int that grows; a smaller one is a new start) of `total` steps
    (None: unknown). Call it every step: it costs one datagram (microseconds) and never blocks or raises."""
    if _addr is None:
        _setup()
    if not _addr:
        return
    try:
        _sock.sendto(b"et1 %d %d %d" % (_rank, int(step), int(total or 0)), _addr)
    except (OSError, ValueError):
        pass  # a full socket buffer or a sidecar not yet up: the next step says it again
