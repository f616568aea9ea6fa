"""Take this pod's torchrun agent out of the rendezvous before the pod stops.

The webhook runs this as the training container's preStop hook; the sidecar installs it into the shared files
directory. On the elastic-training backend (docs/elastic-training-backend.md) it is one SET of this member's leave key,
which tells the serving sidecar to make the others re-form at once; that backend does not close the rendezvous on
SIGTERM, so nothing is killed. torch's own backends (etcd-v2, c10d, the legacy etcd) need much more: that half is
leave_torch.py (internal/torchbackends/torchleave), installed next to this script and imported for them alone.

Best effort by design: whatever goes wrong is logged and the script exits 0, so the pod stops as it would have
without it. It does not import torch.
"""

import json
import os
import socket
import struct
import sys

AGENT_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
TORCH_BACKENDS = ("etcd-v2", "etcd", "c10d")
OWN_BACKEND = "elastic-training"
C10D_MAGIC = 0x3C85F7CE  # the TCPStore's VALIDATE (docs/tcpstore-protocol.md)

LOG_PID = [1]  # whose stdout `kubectl logs` shows: the agent's once found (PID 1 is pause in a shared namespace)


def log(level, msg, **kv):
    fields = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) and (' ' in v or not v) else v}" for k, v in kv.items())
    line = f"level={level} component=leave-rendezvous msg={json.dumps(msg)} {fields}".rstrip() + "\n"
    # A preStop hook's output goes nowhere; the container's main process' stdout is what `kubectl logs` shows.
    target = os.environ.get("ET_LEAVE_LOG", f"/proc/{LOG_PID[0]}/fd/1")
    if target != "-":
        try:
            with open(target, "a") as f:
                f.write(line)
            return
        except OSError:
            pass
    sys.stderr.write(line)


def agent_pids():
    """The torchrun agents running in this container (its own PID namespace)."""
    if os.environ.get("ET_LEAVE_AGENT_PID"):
        return {int(p) for p in os.environ["ET_LEAVE_AGENT_PID"].split(",")}
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # torchrun ... or python -m torch.distributed.run ...: the marker is the program or the module.
        words = [os.path.basename(a.decode(errors="replace")) for a in argv[:3]]
        if any(w in AGENT_MARKERS for w in words):
            pids.add(int(entry))
    return pids


def torch_half():
    """leave_torch.py, installed next to this script."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import leave_torch

    leave_torch.log = log
    return leave_torch


def main():
    pids = agent_pids()
    if pids:
        LOG_PID[0] = min(pids)
    try:
        leave_rendezvous(pids)
    finally:
        if pids and os.environ.get("PET_RDZV_BACKEND") in TORCH_BACKENDS:
            torch_half().stop_if_closing(pids)


def leave_own(endpoint, run_id, host):
    """The elastic-training backend: SET elastic-training/<run>/leave/<host> (torch's client puts the "/" in front)."""
    h, _, port = endpoint.rpartition(":")
    key = f"/elastic-training/{run_id}/leave/{host}".encode()
    field = lambda b: struct.pack("<Q", len(b)) + b
    with socket.create_connection((h, int(port)), timeout=3) as sock:
        sock.sendall(struct.pack("<BI", 0, C10D_MAGIC) + b"\x01" + field(key) + field(b"1"))
        # SET has no reply; a PING-free way to know it was read: the store answers CHECK in order.
        sock.sendall(b"\x05" + struct.pack("<Q", 1) + field(key))
        if sock.recv(1) != b"\x00":
            raise RuntimeError("the store did not take the leave key")
    log("INFO", "left the rendezvous before stopping", run_id=run_id, host=host)


def leave_rendezvous(pids):
    backend = os.environ.get("PET_RDZV_BACKEND", "")
    if backend not in TORCH_BACKENDS + (OWN_BACKEND,):
        log("INFO", "nothing to do for this rendezvous backend", backend=backend or "unset")
        return
    run_id = os.environ.get("PET_RDZV_ID", "")
    endpoint = os.environ.get("PET_RDZV_ENDPOINT", "")
    if not run_id or not endpoint:
        log("WARN", "PET_RDZV_ID or PET_RDZV_ENDPOINT unset; not leaving")
        return
    min_nodes = int(os.environ.get("PET_NNODES", "1").split(":")[0] or 1)
    addrs = {a for a in (os.environ.get("PET_LOCAL_ADDR"), socket.getfqdn()) if a}
    if not pids:
        log("INFO", "no torchrun agent runs in this container; nothing to leave")
        return
    if backend == OWN_BACKEND:
        leave_own(endpoint, run_id, os.environ.get("PET_LOCAL_ADDR") or socket.getfqdn())
        return
    torch_half().leave_rendezvous(backend, run_id, endpoint, pids, min_nodes, addrs)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - best effort: never hold up the pod's shutdown
        log("WARN", "could not leave the rendezvous; the others will drop this node when its heartbeat expires",
            error=f"{type(e).__name__}: {e}")
