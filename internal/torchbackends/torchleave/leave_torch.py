"""The half of the preStop hook (leave-rendezvous.py, internal/prestop) that only torch's own rendezvous backends
need: it takes this pod's torchrun agent out of the etcd-v2, c10d or legacy etcd rendezvous before the pod stops.
leave-rendezvous.py imports it for those backends alone; the elastic-training backend's pods never load it.

torchrun's agent does not leave the rendezvous when it gets SIGTERM (torch keeps the round open for a restart), so
after a scale-down the survivors wait until its heartbeat is judged dead: 15 s in torch 1.13, keep_alive_interval x
keep_alive_max_attempt in newer releases; the legacy etcd backend waits for its 10 s keep-alive key to expire.
Removing the node from the round (or deleting its keep-alive key) first lets the survivors re-form as soon as their
collectives fail.

torch 2.3 to 2.7 close the whole rendezvous when an agent gets SIGTERM (LocalElasticAgent._shutdown calls the
handler's shutdown(), pytorch#117066; undone in 2.8 by pytorch#152525): every survivor of a scale-down would exit with
RendezvousClosedError. On those versions stop_if_closing stops the agent and its workers with SIGKILL once it has
left, so the SIGTERM that follows the hook finds nothing to close. The webhook shares the pod's PID namespace so that
the agent is not PID 1, which SIGKILL from inside its own namespace cannot reach.

It writes the state back only with a compare-and-swap on the index it read, so a concurrent change by an agent is
never overwritten; a stale read is retried. It does not import torch (two seconds of a preStop budget on a small
node): the pickled state is read and written with stand-ins for torch's classes that keep every attribute they do
not know about.
"""

import base64
import io
import json
import os
import pickle
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import types
import urllib.error
import urllib.parse
import urllib.request

KEY_PREFIX = "/torch/elastic/rendezvous"  # torch's etcd_rendezvous_backend.create_backend
DEADLINE_S = 10.0
# torch releases whose agent closes the rendezvous on SIGTERM: [first, end).
CLOSES_ON_SIGTERM = ((2, 3), (2, 8))

# leave-rendezvous.py's log (to the agent's stdout, which `kubectl logs` shows); set before any call.
log = None


class Standin:
    """Stands for a torch class in the pickled state; compares and hashes by its attributes."""

    def _key(self):
        return tuple(sorted((k, v) for k, v in self.__dict__.items()))

    def __eq__(self, other):
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        return hash((type(self).__qualname__, self._key()))


def install_standin(module, name):
    """Returns a stand-in class that pickle finds again under torch's module and name."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        mod_name = ".".join(parts[:i])
        if mod_name not in sys.modules:
            sys.modules[mod_name] = types.ModuleType(mod_name)
    mod = sys.modules[module]
    cls = getattr(mod, name, None)
    if cls is None:
        cls = type(name, (Standin,), {"__module__": module, "__qualname__": name})
        setattr(mod, name, cls)
    return cls


class StateUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "torch" or module.startswith("torch."):
            return install_standin(module, name)
        if module in ("datetime", "builtins", "collections", "copyreg"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name} in the rendezvous state")


def pickle_protocol(data):
    # PROTO opcode (0x80) then the protocol number; write back with the one torch used.
    return data[1] if len(data) > 1 and data[0] == 0x80 else pickle.DEFAULT_PROTOCOL


def parse_conf(s):
    conf = {}
    for item in filter(None, (p.strip() for p in s.split(","))):
        k, _, v = item.partition("=")
        conf[k.strip()] = v.strip()
    return conf


class Store:
    """The etcd v2 keys API, as python-etcd speaks it to the rendezvous sidecar."""

    def __init__(self, endpoint, conf):
        scheme = conf.get("protocol", "http").lower()
        self.base = f"{scheme}://{endpoint}/v2/keys"
        self.ctx = None
        if scheme == "https":
            self.ctx = ssl.create_default_context(cafile=conf.get("ca_cert") or None)
            if conf.get("ssl_cert"):
                self.ctx.load_cert_chain(conf["ssl_cert"], conf.get("ssl_cert_key") or None)

    def _do(self, method, key, form=None):
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(self.base + key, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=3, context=self.ctx) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e) if e.headers.get_content_type() == "application/json" else {}

    def read(self, key):
        """The key's node, or None when it does not exist."""
        status, body = self._do("GET", key)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"GET {key}: HTTP {status} {body}")
        return body["node"]

    def delete(self, key):
        return self._do("DELETE", key)

    def cas(self, key, value, prev_index, ttl):
        form = {"value": value, "prevIndex": str(prev_index)}
        if ttl:
            form["ttl"] = str(ttl)
        return self._do("PUT", key, form)


class StateOverV2:
    """The dynamic rendezvous state as etcd-v2 keeps it: base64 in a v2 key, swapped on its modifiedIndex."""

    def __init__(self, store, run_id):
        self.store, self.key = store, f"{KEY_PREFIX}/{run_id}"

    def read(self):
        """(the base64 state, a token for swap), or (None, None) when there is none."""
        node = self.store.read(self.key)
        return (None, None) if node is None else (node["value"], node)

    def swap(self, token, value):
        """Writes value if the state is still the one token was read with; False when it changed."""
        status, body = self.store.cas(self.key, value, token["modifiedIndex"], token.get("ttl"))
        if status == 412:  # an agent changed the state since we read it
            return False
        if status not in (200, 201):
            raise RuntimeError(f"compare-and-swap {self.key}: HTTP {status} {body}")
        return True


class StateOverC10d:
    """The dynamic rendezvous state in torch's c10d TCPStore, which the sidecar serves (docs/tcpstore-protocol.md):
    base64 under "torch.rendezvous.<id>", read and swapped with COMPARE_SET as torch's C10dRendezvousBackend does."""

    MAGIC = 0x3C85F7CE
    NULL = b"Y2FuaW1hZGFt"  # torch's _NULL_SENTINEL: what COMPARE_SET answers for a missing state

    def __init__(self, endpoint, run_id):
        host, _, port = endpoint.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=3)
        self.sock.sendall(struct.pack("<BI", 0, self.MAGIC))  # VALIDATE
        # torch's client puts "/" in front of every key.
        self.key = f"/torch.rendezvous.{run_id}".encode()

    def _compare_set(self, expected, desired):
        field = lambda b: struct.pack("<Q", len(b)) + b
        self.sock.sendall(b"\x02" + field(self.key) + field(expected) + field(desired))
        n = struct.unpack("<Q", self._read(8))[0]
        return self._read(n)

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise RuntimeError("the c10d store closed the connection")
            buf += chunk
        return buf

    def read(self):
        value = self._compare_set(self.NULL, self.NULL)
        return (None, None) if value == self.NULL else (value.decode(), value)

    def swap(self, token, value):
        return self._compare_set(token, value.encode()) == value.encode()


def group_rank(pids, run_id):
    """The agent's rank in the legacy rendezvous, as its workers got it (GROUP_RANK)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid not in pids:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if env.get(b"TORCHELASTIC_RUN_ID", b"").decode() == run_id and b"GROUP_RANK" in env:
            return int(env[b"GROUP_RANK"])
    return None


def leave_legacy(store, run_id, conf, pids):
    """Deletes this agent's keep-alive key, which the others take as the end of the round (etcd_rendezvous.py)."""
    prefix = conf.get("etcd_prefix", "/torchelastic/p2p")
    prefix += "" if prefix.endswith("/") else "/"
    active = f"{prefix}run_{run_id}/rdzv/active_version"
    node = store.read(active)
    if node is None:
        log("INFO", "no rendezvous state; nothing to leave", run_id=run_id)
        return
    state = json.loads(node["value"])
    if state.get("status") != "final":
        log("INFO", "the rendezvous is not final; nothing to leave", run_id=run_id, status=state.get("status"))
        return
    rank = group_rank(pids, run_id)
    keys = [k for k in state.get("keep_alives", []) if rank is not None and k.endswith(f"/rank_{rank}")]
    if not keys:
        log("INFO", "this agent is not in the rendezvous", run_id=run_id, version=state.get("version"), rank=rank)
        return
    status, body = store.delete(keys[0])
    if status == 404:  # expired, or a preStop already ran
        log("INFO", "this agent is not in the rendezvous", run_id=run_id, version=state.get("version"), rank=rank)
        return
    if status != 200:
        raise RuntimeError(f"DELETE {keys[0]}: HTTP {status} {body}")
    log("INFO", "left the rendezvous before stopping", run_id=run_id, version=state.get("version"), rank=rank,
        key=keys[0])


def node_addr(node):
    # torch >= 2.2 names it addr, older releases fqdn.
    return node.__dict__.get("addr", node.__dict__.get("fqdn"))


def remove_nodes(state, ours, min_nodes):
    """Removes our nodes the way torch's _remove_from_participants does; returns what was removed."""
    d = state.__dict__
    removed = set()
    participants = d.get("participants", {})
    for node in ours:
        if node in participants:
            del participants[node]
            removed.add(node)
        d.get("last_heartbeats", {}).pop(node, None)
        for name in ("wait_list", "redundancy_list"):
            s = d.get(name)
            if s is not None and node in s:
                s.discard(node)
                removed.add(node)
    # torch's _remove_participant_epilogue.
    if d.get("complete"):
        if not participants:
            d["complete"] = False
            d["round"] = d.get("round", 0) + 1
    elif len(participants) < min_nodes:
        d["deadline"] = None
    return removed


def children(pids):
    """Every descendant of pids, from /proc's parent links."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = set(), set(pids)
    while todo:
        todo = {p for p, pp in parent.items() if pp in todo and p not in found}
        found |= todo
    return found


def torch_version(pid):
    """The torch version of the agent's interpreter, read without importing torch; None if unknown."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    pythons = [sys.executable]
    try:
        # The agent's own interpreter, when it is one (never run another program with these arguments).
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python"):
            pythons.insert(0, f"/proc/{pid}/exe")
    except OSError:
        pass
    for python in pythons:
        try:
            out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return None


def parse_version(v):
    parts = []
    for p in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit()) if p else ""
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else None


def stop_if_closing(pids):
    """SIGKILLs the agents and their workers where torch would close the rendezvous on the coming SIGTERM."""
    for pid in sorted(pids):
        version = torch_version(pid)
        v = parse_version(version or "")
        if v is None:
            log("INFO", "torch version unknown; leaving the agent to its SIGTERM", pid=pid)
            continue
        if not CLOSES_ON_SIGTERM[0] <= v < CLOSES_ON_SIGTERM[1]:
            continue
        if pid == 1:
            log("WARN", "torch closes the rendezvous on SIGTERM and the agent is PID 1, which SIGKILL cannot reach: "
                "the other workers will stop; set spec.shareProcessNamespace", torch=version)
            continue
        workers = children({pid})
        # Logged first: the line goes to the agent's stdout, which is gone once it is killed.
        log("INFO", "stopping the agent with SIGKILL: this torch closes the rendezvous on SIGTERM", torch=version,
            pid=pid, workers=len(workers))
        for p in [pid] + sorted(workers):  # the agent first, so that it never sees its workers fail
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def leave_rendezvous(backend, run_id, endpoint, pids, min_nodes, addrs):
    """Takes the agents pids out of run_id's rendezvous of backend (etcd-v2, c10d or etcd) at endpoint."""
    conf = parse_conf(os.environ.get("PET_RDZV_CONF", ""))
    if backend == "etcd":
        # The legacy backend names its TLS files differently (etcd_rendezvous.py's cacert, cert, key).
        conf.update({"ca_cert": conf.get("cacert", ""), "ssl_cert": conf.get("cert", ""), "ssl_cert_key": conf.get("key", "")})
        leave_legacy(Store(endpoint, conf), run_id, conf, pids)
        return
    states = StateOverC10d(endpoint, run_id) if backend == "c10d" else StateOverV2(Store(endpoint, conf), run_id)
    deadline = time.monotonic() + DEADLINE_S
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        current, token = states.read()
        if current is None:
            log("INFO", "no rendezvous state; nothing to leave", run_id=run_id)
            return
        raw = base64.b64decode(current)
        state = StateUnpickler(io.BytesIO(raw)).load()
        participants = state.__dict__.get("participants", {})
        waiting = set(state.__dict__.get("wait_list", set())) | set(state.__dict__.get("redundancy_list", set()))
        ours = [n for n in list(participants) + list(waiting)
                if node_addr(n) in addrs and n.__dict__.get("pid") in pids]
        if not ours:
            log("INFO", "this agent is not in the rendezvous", run_id=run_id, round=state.__dict__.get("round"))
            return
        removed = remove_nodes(state, ours, min_nodes)
        value = base64.b64encode(pickle.dumps(state, protocol=pickle_protocol(raw))).decode()
        if states.swap(token, value):
            log("INFO", "left the rendezvous before stopping", run_id=run_id, round=state.__dict__.get("round"),
                removed=len(removed), remaining=len(state.__dict__.get("participants", {})), attempts=attempt)
            return
        time.sleep(0.05)  # an agent changed the state since we read it; read again
    log("WARN", "gave up leaving the rendezvous: the state kept changing", run_id=run_id, attempts=attempt)
