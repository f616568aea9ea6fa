"""In-memory checkpoints of a training job, replicated across its nodes by the sidecars (docs/checkpoints.md).

    import elastic_training.checkpoint as ckpt

    step = ckpt.load(state)          # None: nothing to restore; else the step restored, into state
    for step in range(step or 0, steps):
        train_one_step()
        ckpt.save(state, step + 1)   # returns once the state is copied out of the loop's way

`state` is what torch.distributed.checkpoint (DCP) takes: a dict of state dicts and Stateful objects (a DDP or
FSDP2 model's state_dict, an optimizer's through torch.distributed.checkpoint.state_dict, a data loader's
position). Every rank calls both, as with DCP. A save is DCP's async_save into the pod's memory-backed checkpoint
directory ($ET_CHECKPOINT_DIR) on a gloo group of its own, so the training loop waits only for the copy; the sidecar
then replicates each rank's piece to another pod, on another node where there is one. A load restores the newest step
whose every rank's piece still exists somewhere in the job, at any world size (DCP reshards), reading from this pod
or, through its sidecar ($ET_CHECKPOINT_URL), from the peers that hold the rest.

With $ET_CHECKPOINT_PERSIST_DIR (a directory on the job's shared volume) and $ET_CHECKPOINT_PERSIST_EVERY=N, every
N-th step's save is also copied there in the background, each rank its own files, so that a loss of every pod (a
reinstall, a cluster's outage) still has a checkpoint: a load takes the newer of memory's newest and the volume's.

Without a sidecar ($ET_CHECKPOINT_URL unset) it keeps the newest complete save in the directory and loads from
there: a one-node job, or a test. Standard library and torch only; importing this module imports neither.
"""

import functools
import http.client
import io
import json
import os
import secrets
import shutil
import socket
import sys
import threading
import urllib.error
import urllib.request

__all__ = ["save", "load", "wait", "CheckpointError"]

ENV_DIR = "ET_CHECKPOINT_DIR"
ENV_URL = "ET_CHECKPOINT_URL"
ENV_PERSIST_DIR = "ET_CHECKPOINT_PERSIST_DIR"
ENV_PERSIST_EVERY = "ET_CHECKPOINT_PERSIST_EVERY"

# A remote file is read in ranges of this many bytes: DCP reads each item (a tensor's bytes) with a seek and a read.
_RANGE = 16 << 20
# Room kept free beyond the state's own bytes (DCP's headers, pickled objects).
_SLACK = 1.1

_lock = threading.Lock()
_pending = None  # the save in flight: an Event set once its manifest is written (or it failed)
_error = None  # what the last background save raised, for the next call to raise
_group = None
_persisting = None  # the thread copying a save to the volume
_persisted = None  # rank 0: the step last copied to the volume (or being copied)


class CheckpointError(RuntimeError):
    """A save or a load that cannot be done: the message says why, with the figures."""


_UNIX = "unix:"
_openers = {}


def _open(path, data=None, method=None, headers=None, timeout=30):
    """The response of this pod's sidecar to a request of path (/checkpoint/...), as urllib.request.urlopen's.
    $ET_CHECKPOINT_URL is http://127.0.0.1:<port> on pod networking, and unix:<path> of a socket in the pod's own
    volume on host networking, whose loopback is every host-network pod's. Never through a proxy: the trainer's
    HTTP_PROXY is not for its own pod."""
    url = os.environ.get(ENV_URL, "")
    opener = _openers.get(url)
    if opener is None:
        handlers = [urllib.request.ProxyHandler({})]
        if url.startswith(_UNIX):
            handlers.append(_UnixHandler(url[len(_UNIX):]))
        opener = _openers[url] = urllib.request.build_opener(*handlers)
    base = "http://localhost" if url.startswith(_UNIX) else url.rstrip("/")
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    return opener.open(req, timeout=timeout)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP to a Unix socket at path (the host part of the URL is only the Host header)."""

    def __init__(self, path, host, **kw):
        super().__init__(host, **kw)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:
                s.settimeout(self.timeout)
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class _UnixHandler(urllib.request.HTTPHandler):
    """urllib's HTTP handler, to the sidecar's Unix socket (in place of the default one: a subclass of it)."""

    def __init__(self, path):
        super().__init__()
        self._path = path

    def http_open(self, req):
        return self.do_open(functools.partial(_UnixConnection, self._path), req)


def _log(msg):
    print("elastic_training.checkpoint: " + msg, file=sys.stderr, flush=True)


def _dir(override):
    d = override or os.environ.get(ENV_DIR)
    if not d:
        raise CheckpointError("no checkpoint directory: $%s is unset (the webhook sets it in a job's pods) and no dir= given" % ENV_DIR)
    os.makedirs(d, exist_ok=True)
    return d


def _world():
    """(rank, world size, the checkpoints' own gloo group or None without torch.distributed)."""
    global _group
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1, None
    if _group is None:
        # Its own group: the background save's collectives must not meet the training loop's on one communicator.
        _group = dist.new_group(backend="gloo")
    return dist.get_rank(), dist.get_world_size(), _group


def _agree(group, value, *oks):
    """Rank 0's value, and for each of oks whether every rank's is true: one broadcast and one all-reduce on group."""
    import torch
    import torch.distributed as dist

    if group is None:
        return (value,) + tuple(bool(ok) for ok in oks)
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    flags = torch.tensor([1 if ok else 0 for ok in oks] or [1], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)
    return (box[0],) + tuple(bool(f) for f in flags.tolist()[: len(oks)])


def _state_bytes(state):
    """The bytes of the tensors in state (this rank's shards of sharded ones)."""
    import torch

    seen, total, todo = set(), 0, [state]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            local = x.to_local() if hasattr(x, "to_local") else x
            total += local.numel() * local.element_size()
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
        elif hasattr(x, "state_dict") and callable(x.state_dict):
            todo.append(x.state_dict())
    return total


def wait():
    """Wait for the save in flight, if any, and its copy to the volume; raise what the save raised. Call it before the
    training program exits: the last save's write and copy would be cut short."""
    _wait_save()
    _wait_persist()


def _wait_save():
    global _pending, _error
    with _lock:
        done = _pending
    if done is not None:
        done.wait()
    with _lock:
        _pending = None
        err, _error = _error, None
    if err is not None:
        raise CheckpointError("the previous save failed: %s" % err) from err


def _saves(root):
    """The save directories in root: [(step, name)], newest first."""
    out = []
    for name in os.listdir(root):
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == "step" and len(parts[1]) == 12 and parts[1].isdigit():
            try:
                out.append((int(parts[1]), os.path.getmtime(os.path.join(root, name)), name))
            except FileNotFoundError:  # removed meanwhile (the sidecar, rank 0's pruning)
                continue
    out.sort(reverse=True)
    return [(step, name) for step, _, name in out]


def _complete_here(root, name):
    """The save's step if every rank's manifest is in root (one node holds the whole job), else None."""
    d = os.path.join(root, name)
    manifests = [f for f in os.listdir(d) if (f.startswith("rank-") or f.startswith("copy-")) and f.endswith(".json")]
    if not manifests:
        return None
    with open(os.path.join(d, manifests[0])) as f:
        m = json.load(f)
    ranks = {int(f.split("-")[1].split(".")[0]) for f in manifests}
    return m["step"] if ranks == set(range(m["world"])) else None


def _newest(root):
    """(save name, step) of the newest complete save, or None."""
    url = os.environ.get(ENV_URL)
    if url:
        try:
            with _open("/checkpoint/newest", timeout=30) as resp:
                m = json.load(resp)
            return m["save"], m["step"]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise CheckpointError("asking the sidecar for the newest checkpoint: %s" % e) from e
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError("asking the sidecar for the newest checkpoint at %s: %s" % (url, e)) from e
    return _newest_in(root)


def _prune_local(root):
    """Without a sidecar: every save older than the newest complete one goes."""
    newest = _newest(root)
    if newest is None:
        return
    for step, name in _saves(root):
        if step < newest[1]:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _finished(fut, done, root, name, step, rank, world, persist):
    """After a rank's save: its manifest (written last: the sidecar takes the piece only with it), then the sidecar
    told; when persist (a directory), the rank's files go on to it in another thread."""
    global _error
    try:
        fut.result()
        d = os.path.join(root, name)
        prefix = "__%d_" % rank
        files = sorted(f for f in os.listdir(d) if f.startswith(prefix) or (rank == 0 and f == ".metadata"))
        m = {"save": name, "step": step, "rank": rank, "world": world,
             "files": [{"name": f, "size": os.path.getsize(os.path.join(d, f))} for f in files]}
        tmp = os.path.join(d, ".rank-%d.json" % rank)
        with open(tmp, "w") as f:
            json.dump(m, f)
        os.rename(tmp, os.path.join(d, "rank-%d.json" % rank))
        url = os.environ.get(ENV_URL)
        if url:
            try:
                _open("/checkpoint/saved", data=b"", method="POST", timeout=2).close()
            except OSError as e:  # the sidecar looks every second anyway
                _log("telling the sidecar of step %d: %s" % (step, e))
        if persist:
            # Linked now, while no newer save of the job can be complete (this rank has not saved one): the sidecar
            # may drop the save from the directory before the copy is done, and the links keep its bytes.
            try:
                _start_persist(root, name, step, rank, files + ["rank-%d.json" % rank], persist)
            except OSError as e:
                _log("copying step %d to the volume %s failed (the in-memory checkpoints go on): %s" % (step, persist, e))
    except Exception as e:  # noqa: BLE001 - raised by the next save or wait
        _log("saving step %d failed: %s" % (step, e))
        with _lock:
            _error = e
    finally:
        done.set()


def _progress(step):
    """A save is progress (docs/hangs.md): a program that saves every step but never calls elastic_training.progress
    has its hangs found too, at the pace of its saves."""
    from ._progress import progress

    progress(step)


def _tell_refused(step, rank, need, free):
    """This rank's save does not fit: its sidecar records it as a Warning Event on the Job (CheckpointDoesNotFit)."""
    url = os.environ.get(ENV_URL)
    if not url:
        return
    body = json.dumps({"kind": "save", "step": step, "rank": rank, "need": need, "free": free}).encode()
    try:
        _open("/checkpoint/refused", data=body, method="POST", headers={"Content-Type": "application/json"},
              timeout=2).close()
    except OSError as e:
        _log("telling the sidecar that step %d does not fit: %s" % (step, e))


def _persist_conf():
    """(the volume's checkpoint directory, every how many steps) or (None, 0)."""
    d = os.environ.get(ENV_PERSIST_DIR)
    try:
        every = int(os.environ.get(ENV_PERSIST_EVERY) or "0")
    except ValueError:
        raise CheckpointError("$%s must be a number of steps, got %r" % (ENV_PERSIST_EVERY, os.environ.get(ENV_PERSIST_EVERY)))
    return (d, every) if d and every > 0 else (None, 0)


def _persist_idle():
    return _persisting is None or not _persisting.is_alive()


def _wait_persist():
    if _persisting is not None:
        _persisting.join()


def _stage_name(name):
    return ".persist-%d-%s" % (os.getpid(), name)


def _clear_stages(root):
    """Remove the links of copies whose process is gone (a restarted worker's): they hold the pod's memory."""
    for entry in os.listdir(root):
        if not entry.startswith(".persist-"):
            continue
        try:
            pid = int(entry.split("-")[1])
        except (ValueError, IndexError):
            continue
        if pid == os.getpid():
            if not _persist_idle():
                continue
        else:
            try:
                os.kill(pid, 0)
                continue  # another rank's of this pod, copying
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(os.path.join(root, entry), ignore_errors=True)


def _start_persist(root, name, step, rank, files, pdir):
    global _persisting
    stage = os.path.join(root, _stage_name(name))
    os.makedirs(stage, exist_ok=True)
    for f in files:
        os.link(os.path.join(root, name, f), os.path.join(stage, f))
    _persisting = threading.Thread(target=_persist, args=(stage, pdir, name, step, rank, files), name="elastic-training-persist", daemon=True)
    _persisting.start()


def _persist(stage, pdir, name, step, rank, files):
    """Copy a rank's piece of a save to the volume, the manifest last (renamed into place), so a save on the volume is
    complete when every rank's manifest is there; then, on rank 0, remove the older ones."""
    dst = os.path.join(pdir, name)
    try:
        os.makedirs(dst, exist_ok=True)
        manifest = files[-1]
        for f in files[:-1] + [manifest]:
            out = os.path.join(dst, ("." + f + ".tmp") if f == manifest else f)
            with open(os.path.join(stage, f), "rb") as src, open(out, "wb") as w:
                shutil.copyfileobj(src, w, 16 << 20)
                w.flush()
                os.fsync(w.fileno())
        os.rename(os.path.join(dst, "." + manifest + ".tmp"), os.path.join(dst, manifest))
        _log("step %d is on the volume (%s, rank %d)" % (step, dst, rank))
    except Exception as e:  # noqa: BLE001 - the save in memory stands; the volume keeps its older copy
        _log("copying step %d to the volume %s failed (the in-memory checkpoints go on; the volume keeps an older step): %s" % (step, dst, e))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _prune_volume(pdir, writing):
    """Rank 0, when every rank's copy to the volume is done: all but the newest complete save and the one about to
    be written go (an incomplete one is a copy that failed). Never raises: the volume is the fallback."""
    try:
        if not os.path.isdir(pdir):
            return
        newest = _newest_in(pdir)
        for _, name in _saves(pdir):
            if name != writing and (newest is None or name != newest[0]):
                shutil.rmtree(os.path.join(pdir, name), ignore_errors=True)
    except OSError as e:
        _log("removing older saves from the volume %s: %s" % (pdir, e))


def _newest_in(root):
    """(save name, step) of the newest save in root whose every rank's manifest is there, or None."""
    if not os.path.isdir(root):
        return None
    for _, name in _saves(root):
        try:
            step = _complete_here(root, name)
        except (OSError, ValueError, KeyError) as e:
            _log("%s/%s is not a usable save: %s" % (root, name, e))
            continue
        if step is not None:
            return name, step
    return None


def save(state, step, dir=None):
    """Save state as step: returns once the state is copied; the write and the replication go on in the background.

    Collective: every rank calls it with the same step. Raises CheckpointError, on every rank, when the state does
    not fit in the checkpoint directory (the figures in the message), or when the previous save failed."""
    global _pending, _persisted
    import torch.distributed.checkpoint as dcp

    if not isinstance(step, int) or step < 0:
        raise CheckpointError("step must be a non-negative int, got %r" % (step,))
    _wait_save()  # not the copy to the volume: the loop never waits for that
    root = _dir(dir)
    rank, world, group = _world()
    if not os.environ.get(ENV_URL):
        # Once every rank has waited for its last save (so every manifest of it is written): older saves go.
        _agree(group, None, True)
        _prune_local(root)
    pdir, every = _persist_conf()
    _clear_stages(root)
    need = int(_state_bytes(state) * _SLACK)
    free = shutil.disk_usage(root).free
    # To the volume: every N-th step, or the first save after one skipped while a copy was still going.
    due = bool(pdir) and (step % every == 0 or (_persisted is not None and step - _persisted >= every))
    (sid, due), ok, idle = _agree(group, (secrets.token_hex(4), due), need <= free, _persist_idle())
    if not ok:
        msg = "step %d does not fit: this rank needs about %d bytes, %d are free in %s; some rank lacks room (raise checkpoint.memory, or save less)" % (step, need, free, root)
        _log(msg)
        if need > free:
            _tell_refused(step, rank, need, free)
        raise CheckpointError(msg)
    name = "step-%012d-%s" % (step, sid)
    persist = pdir if due and idle else None
    if persist and rank == 0:
        _persisted = step
        _prune_volume(pdir, name)
    path = os.path.join(root, name)
    # The sidecar runs as another user (65532): it writes its copies of other ranks' pieces into this directory and
    # removes it once a newer save is complete, so the directory is everyone's (DCP would make it with the umask).
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)
    writer = _writer_class()(path, sync_files=False)
    if group is None:
        from concurrent.futures import Future

        fut = Future()
        try:
            dcp.save(state, storage_writer=writer)
            fut.set_result(None)
        except Exception as e:  # noqa: BLE001 - raised below through _finished
            fut.set_exception(e)
        _finished(fut, threading.Event(), root, name, step, rank, world, persist)
        _wait_save()
        _progress(step)
        return
    fut = dcp.async_save(state, storage_writer=writer, process_group=group)
    done = threading.Event()
    with _lock:
        _pending = done
    fut.add_done_callback(lambda f: _finished(f, done, root, name, step, rank, world, persist))
    _progress(step)


def load(state, dir=None):
    """Restore the newest complete step into state and return it; None when the job has none (state untouched).

    Collective: every rank calls it. Rank 0 picks the step, the newer of memory's and the volume's; every rank reads
    what its part needs, from this pod or through the sidecar from the peers that hold it, or from the volume, at any
    world size."""
    import torch.distributed.checkpoint as dcp

    wait()
    _wait_persist()
    root = _dir(dir)
    rank, _, group = _world()
    pdir, _ = _persist_conf()
    # Every rank's last save finished (its manifest written) before rank 0 looks for the newest.
    _agree(group, None, True)
    err, choice = None, None
    if rank == 0:
        try:
            memory = _newest(root)
            volume = _newest_in(pdir) if pdir else None
            if volume is not None and (memory is None or volume[1] > memory[1]):
                choice = ("volume",) + volume
                _log("restoring step %d from the volume (%s); memory's newest: %s" % (volume[1], pdir, "step %d" % memory[1] if memory else "none"))
            elif memory is not None:
                choice = ("memory",) + memory
        except CheckpointError as e:
            err = e
    choice, ok = _agree(group, choice, err is None)
    if not ok:
        raise err or CheckpointError("rank 0 could not find the newest checkpoint (its log says why)")
    if choice is None:
        return None
    source, name, step = choice
    if source == "volume":
        if not pdir:
            raise CheckpointError("rank 0 restores step %d from the volume, and $%s is unset here" % (step, ENV_PERSIST_DIR))
        _Reader, _ = _reader_classes()
        reader = _Reader(os.path.join(pdir, name))
    else:
        reader = _reader(root, name)
    dcp.load(state, storage_reader=reader, process_group=group)
    return step


_staged = None  # (layout, the CPU copy the last save staged into): the next save of the same layout copies into it


def _layout(obj):
    """What a staged copy of obj must match to be copied into again: the nesting and keys, and each tensor's kind,
    dtype, device, shape and strides (a DTensor's placements, mesh and local shard too; a ShardedTensor's shards), so
    that a state whose optimizer filled in, or whose shards moved, is staged anew, never broadcast into the old."""
    import torch

    if isinstance(obj, dict):
        return ("dict", tuple((k, _layout(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(_layout(v) for v in obj))
    if isinstance(obj, torch.Tensor):
        t = type(obj).__name__
        local = getattr(obj, "_local_tensor", None)
        if local is not None:  # DTensor
            return (t, str(obj.dtype), tuple(obj.shape), str(obj.placements), str(obj.device_mesh),
                    tuple(local.shape), tuple(local.stride()), str(local.device))
        return (t, str(obj.dtype), tuple(obj.shape), tuple(obj.stride()), str(obj.device))
    if type(obj).__name__ == "ShardedTensor":
        return ("ShardedTensor", tuple(obj.size()),
                tuple((tuple(s.tensor.shape), tuple(s.metadata.shard_offsets)) for s in obj.local_shards()))
    return (type(obj).__name__,)


def _writer_class():
    """DCP's FileSystemWriter whose staging always copies the state. torch 2.6's stages a CPU tensor as itself
    (`_offload_state_dict_to_cpu`: `t.to("cpu")` is `t`), so its background write would read tensors that the loop
    changes meanwhile: a torn save. 2.14's copies, as this does on both (its own code: `_create_cpu_state_dict`,
    `_copy_state_dict`).

    The copy goes into the previous save's staged copy when the state's layout is the same (save waits for that
    save's write first): fresh memory for every save costs the kernel's page faults and zeroing, most of the stall
    (2 GiB: 0.45 s fresh, 0.09 s into the same memory, torch 2.14 on this project's machine). The staged copy stays
    in the trainer's memory between saves, as DCP's own `cache_staged_state_dict` keeps it."""
    global _SnapshotWriter
    if "_SnapshotWriter" in globals():
        return _SnapshotWriter
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
    from torch.distributed.checkpoint import FileSystemWriter

    class _SnapshotWriter(FileSystemWriter):
        def stage(self, state_dict):
            global _staged
            layout = _layout(state_dict)
            if _staged is None or _staged[0] != layout:
                _staged = None  # the old copy's memory goes before the new is made
                _staged = (layout, _create_cpu_state_dict(state_dict))
            # The returned dict: the staged tensors, and the state's values of this save (ints, strings).
            return _copy_state_dict(state_dict, _staged[1], type_check=self.type_check)

    _SnapshotWriter.__qualname__ = "_SnapshotWriter"
    return _SnapshotWriter


def _reader(root, name):
    """DCP's FileSystemReader of root/name, whose files not in this pod are read through the sidecar."""
    _Reader, _PeerFileSystem = _reader_classes()
    reader = _Reader(os.path.join(root, name))
    if os.environ.get(ENV_URL):
        reader.fs = _PeerFileSystem("/checkpoint/files/" + name + "/")
    return reader


def _reader_classes():
    """The reader's classes, made once torch is imported, at module level: DCP pickles the reader's plans, and
    pickle finds a class by its module and name."""
    global _Reader, _PeerFileSystem
    if "_Reader" in globals():
        return _Reader, _PeerFileSystem
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import FileSystem

    class _PeerFileSystem(FileSystem):
        def __init__(self, base):
            super().__init__()
            self.base = base

        def create_stream(self, path, mode):
            if "r" not in mode or os.path.exists(str(path)):
                return super().create_stream(path, mode)
            return _remote(self.base + os.path.basename(str(path)))

    class _Reader(FileSystemReader):
        def _slice_file(self, file, sinfo):
            return _Slice(file, sinfo.offset, sinfo.length)

    for c in (_PeerFileSystem, _Reader):
        c.__qualname__ = c.__name__
    return _Reader, _PeerFileSystem


def _remote(path):
    """A buffered, seekable reader of a file the sidecar serves at path (a context manager, as DCP's create_stream
    is)."""
    return io.BufferedReader(_RangeReader(path), buffer_size=_RANGE)


class _RangeReader(io.RawIOBase):
    """A raw, seekable reader of the sidecar's path: each readinto is one ranged GET."""

    def __init__(self, path):
        super().__init__()
        self.path, self.pos, self.size = path, 0, None

    def readable(self):
        return True

    def seekable(self):
        return True

    def _length(self):
        if self.size is None:
            with _open(self.path, method="HEAD", timeout=60) as resp:
                self.size = int(resp.headers["Content-Length"])
        return self.size

    def seek(self, offset, whence=0):
        if whence == 0:
            self.pos = offset
        elif whence == 1:
            self.pos += offset
        else:
            self.pos = self._length() + offset
        return self.pos

    def tell(self):
        return self.pos

    def readinto(self, b):
        n = len(b)
        if n == 0:
            return 0
        try:
            resp = _open(self.path, headers={"Range": "bytes=%d-%d" % (self.pos, self.pos + n - 1)}, timeout=60)
        except urllib.error.HTTPError as e:
            if e.code == 416:  # at or past the end
                return 0
            raise CheckpointError("reading %s: %s" % (self.path, e)) from e
        except OSError as e:
            raise CheckpointError("reading %s: %s" % (self.path, e)) from e
        with resp:
            view, got = memoryview(b), 0
            while got < n:
                k = resp.readinto(view[got:])
                if not k:
                    break
                got += k
        self.pos += got
        return got


class _Slice:
    """DCP's view of one item of a file, whose reads end at the item's end (DCP's own reads a BYTE_IO item to the
    end of the file: through the sidecar that would fetch the rest of the file)."""

    def __init__(self, f, offset, length):
        self.f, self.offset, self.length = f, offset, length
        f.seek(offset)

    def _left(self):
        return self.offset + self.length - self.f.tell()

    def read(self, size=-1):
        left = max(0, self._left())
        return self.f.read(left if size is None or size < 0 else min(size, left))

    def readinto(self, b):
        left = max(0, self._left())
        view = memoryview(b)[:left]
        return self.f.readinto(view)

    def seek(self, offset, whence=0):
        if whence == 0:
            return self.f.seek(self.offset + offset) - self.offset
        if whence == 2:
            return self.f.seek(self.offset + self.length + offset) - self.offset
        return self.f.seek(offset, 1) - self.offset

    def tell(self):
        return self.f.tell() - self.offset

    def readable(self):
        return True

    def seekable(self):
        return True

    def readline(self, size=-1):
        left = max(0, self._left())
        return self.f.readline(left if size is None or size < 0 else min(size, left))
