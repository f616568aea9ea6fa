"""A fixed scenario of torch's own TCPStore client against a store at HOST PORT.

Usage: python3 scenario.py HOST PORT

Every step's result (its value, or its exception's type and first line) goes into
one JSON object, printed last as "RESULT {...}". The conformance test runs this
against torch's server and against ours and compares the two objects. Results do
not depend on timing: a wait that another client ends would end the same way if
that client came first.
"""
import datetime
import json
import sys
import threading
import time

import torch
import torch.distributed as dist

HOST, PORT = sys.argv[1], int(sys.argv[2])
td = datetime.timedelta
results = {}


def connect(timeout=30):
    return dist.TCPStore(HOST, PORT, is_master=False, use_libuv=False,
                         wait_for_workers=False, timeout=td(seconds=timeout))


def norm(v):
    if isinstance(v, bytes):
        return {"bytes": v.decode("latin-1")}
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    return v


def error(e):
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    msg = msg.replace(f"{HOST}:{PORT}", "<addr>").replace(str(PORT), "<port>")
    return {"error": type(e).__name__, "msg": msg}


def rec(name, fn):
    try:
        results[name] = norm(fn())
    except Exception as e:  # noqa: BLE001 - the exception is the result
        results[name] = error(e)


def later(delay, fn):
    """Runs fn on its own connection after delay seconds, on a thread."""
    def run():
        c = connect()
        time.sleep(delay)
        fn(c)
    th = threading.Thread(target=run)
    th.start()
    return th


def has(obj, method):
    return hasattr(obj, method)


s = connect()
rec("has_extended_api", lambda: s.has_extended_api())

# set / get
rec("set k1", lambda: s.set("k1", "v1"))
rec("get k1", lambda: s.get("k1"))
rec("set k1 again", lambda: s.set("k1", "v2"))
rec("get k1 again", lambda: s.get("k1"))
rec("set binary", lambda: s.set("bin", bytes(range(256))))
rec("get binary", lambda: s.get("bin"))
rec("set empty", lambda: s.set("empty", b""))
rec("get empty", lambda: s.get("empty"))
rec("set 100 KiB", lambda: s.set("big", b"Z" * (100 << 10)))
rec("get 100 KiB", lambda: len(s.get("big")))
rec("set unicode key", lambda: s.set("ключ/ü", "ß"))
rec("get unicode key", lambda: s.get("ключ/ü"))

# add
rec("add missing 5", lambda: s.add("cnt", 5))
rec("add -2", lambda: s.add("cnt", -2))
rec("add 0", lambda: s.add("cnt", 0))
rec("get counter", lambda: s.get("cnt"))
rec("set ' +12abc'", lambda: s.set("loose", " +12abc"))
rec("add to ' +12abc'", lambda: s.add("loose", 1))
rec("add large", lambda: s.add("large", 1 << 62))
rec("add large again", lambda: s.add("large", (1 << 62) - 1))
rec("set txt abc", lambda: s.set("txt", "abc"))
bad = connect()
rec("add to non-numeric (server closes)", lambda: bad.add("txt", 1))
rec("get txt after the failed add", lambda: s.get("txt"))
del bad

# compare_set, every branch
rec("compare_set absent, expected ''", lambda: s.compare_set("cs", "", "new"))
rec("compare_set absent, expected 'exp'", lambda: s.compare_set("cs2", "exp", "new"))
rec("check cs2 after a failed compare_set", lambda: s.check(["cs2"]))
rec("compare_set match", lambda: s.compare_set("cs", "new", "newer"))
rec("compare_set mismatch", lambda: s.compare_set("cs", "zzz", "other"))
rec("compare_set present, expected ''", lambda: s.compare_set("cs", "", "other"))
rec("get cs", lambda: s.get("cs"))

# check
rec("check present", lambda: s.check(["k1"]))
rec("check present and missing", lambda: s.check(["k1", "missing"]))
rec("check none", lambda: s.check([]))

# wait
rec("wait present", lambda: s.wait(["k1", "cnt"]))
rec("wait none", lambda: s.wait([]))
for name, key, wake in [
    ("set", "w-set", lambda c: c.set("w-set", "1")),
    ("add", "w-add", lambda c: c.add("w-add", 3)),
    ("append", "w-append", lambda c: c.append("w-append", "x")),
    ("multi_set", "w-multi", lambda c: c.multi_set(["other", "w-multi"], ["a", "b"])),
]:
    th = later(0.3, wake)
    rec(f"wait woken by another client's {name}", lambda: s.wait([key], td(seconds=30)))
    th.join()
th = later(0.3, lambda c: (c.set("w2a", "1"), time.sleep(0.2), c.set("w2b", "2")))
rec("wait for two keys set one after the other", lambda: s.wait(["w2a", "w2b"], td(seconds=30)))
th.join()
# Torch's classic server does not wake waiters when compare_set creates a key (its
# libuv server and ours do): the conformance test expects a timeout from it.
th = later(0.5, lambda c: c.compare_set("w-cs", "", "v"))
rec("wait woken by compare_set creating the key", lambda: s.wait(["w-cs"], td(seconds=3)))
th.join()
rec("wait timeout", lambda: s.wait(["never"], td(milliseconds=500)))
rec("still served after a wait timeout", lambda: s.get("k1"))
s.set_timeout(td(milliseconds=500))
rec("get missing (store timeout)", lambda: s.get("missing"))
rec("multi_get with a missing key (store timeout)", lambda: s.multi_get(["k1", "missing2"]))
s.set_timeout(td(seconds=30))

# 64 clients waiting for one key
waiters = [connect() for _ in range(64)]
woken = []
lock = threading.Lock()


def wait_go(c):
    c.wait(["go"], td(seconds=60))
    with lock:
        woken.append(1)


ths = [threading.Thread(target=wait_go, args=(c,)) for c in waiters]
for t in ths:
    t.start()
time.sleep(0.5)
s.set("go", "1")
for t in ths:
    t.join()
results["64 waiters woken by one set"] = len(woken)
del waiters

# num_keys, delete_key
rec("num_keys", lambda: s.num_keys())
rec("delete_key present", lambda: s.delete_key("k1"))
rec("delete_key absent", lambda: s.delete_key("k1"))
rec("check deleted", lambda: s.check(["k1"]))
rec("wait for a deleted key times out", lambda: s.wait(["k1"], td(milliseconds=300)))
rec("num_keys after delete", lambda: s.num_keys())

# append
rec("append creates", lambda: s.append("ap", "a"))
rec("append concatenates", lambda: s.append("ap", b"\x00bc"))
rec("get appended", lambda: s.get("ap"))

# multi_set / multi_get
rec("multi_set", lambda: s.multi_set(["m1", "m2", "m3"], ["x", b"", b"\xff" * 3000]))
rec("multi_get", lambda: s.multi_get(["m3", "m1", "m2", "m1"]))
rec("multi_set none", lambda: s.multi_set([], []))
rec("multi_get none", lambda: s.multi_get([]))

# torch 2.14: list_keys, queues (refused by the client without a libuv build), barrier
if has(s, "list_keys"):
    rec("list_keys", lambda: sorted(s.list_keys()))
if has(s, "queue_push"):
    rec("queue_push", lambda: s.queue_push("q", "a"))
    rec("queue_len", lambda: s.queue_len("q"))
    rec("queue_pop", lambda: s.queue_pop("q", False))
if has(s, "barrier"):
    th = later(0.3, lambda c: c.barrier("bar", 2, td(seconds=30)))
    rec("barrier of two", lambda: s.barrier("bar", 2, td(seconds=30)))
    th.join()
    rec("barrier counter", lambda: s.get("bar"))
    rec("barrier again returns at once", lambda: s.barrier("bar", 2, td(seconds=30)))
    rec("barrier timeout", lambda: s.barrier("bt", 2, td(milliseconds=500)))
    rec("barrier counter after a timeout", lambda: s.get("bt"))
if has(s, "clone"):
    rec("clone get", lambda: s.clone().get("cs"))

# PrefixStore
p = dist.PrefixStore("pfx", s)
rec("prefix set", lambda: p.set("a", "1"))
rec("prefix get", lambda: p.get("a"))
rec("prefix get through the store", lambda: s.get("pfx/a"))
rec("prefix add", lambda: p.add("n", 2))
rec("prefix compare_set", lambda: p.compare_set("c", "", "x"))
rec("prefix append", lambda: p.append("ap", "y"))
rec("prefix check", lambda: p.check(["a", "n", "c", "ap"]))
rec("prefix check missing", lambda: p.check(["a", "nope"]))
rec("prefix multi_set", lambda: p.multi_set(["ms1", "ms2"], ["1", "2"]))
rec("prefix multi_get", lambda: p.multi_get(["ms2", "a", "ms1"]))
th = later(0.3, lambda c: dist.PrefixStore("pfx", c).set("pw", "1"))
rec("prefix wait woken", lambda: p.wait(["pw"], td(seconds=30)))
th.join()
rec("prefix num_keys", lambda: p.num_keys())
rec("prefix delete_key", lambda: p.delete_key("a"))
pp = dist.PrefixStore("inner", p)
rec("nested prefix set", lambda: pp.set("z", "9"))
rec("nested prefix get through the store", lambda: s.get("pfx/inner/z"))
if has(p, "list_keys"):
    rec("prefix list_keys", lambda: sorted(p.list_keys()))
if has(p, "barrier"):
    rec("prefix barrier of one", lambda: p.barrier("pb", 1, td(seconds=30)))

# 64 clients adding at once, each on its own connection
N, ADDS = 64, 20
clients = [connect() for _ in range(N)]
returned = []


def adder(c):
    got = [c.add("ctr", 1) for _ in range(ADDS)]
    with lock:
        returned.extend(got)


ths = [threading.Thread(target=adder, args=(c,)) for c in clients]
for t in ths:
    t.start()
for t in ths:
    t.join()
results["64 clients adding: every value once"] = sorted(returned) == list(range(1, N * ADDS + 1))
rec("64 clients adding: final value", lambda: s.get("ctr"))
del clients

rec("final num_keys", lambda: s.num_keys())
if has(s, "list_keys"):
    rec("final list_keys", lambda: sorted(s.list_keys()))

print("torch", torch.__version__, file=sys.stderr)
print("RESULT " + json.dumps(results, sort_keys=True, ensure_ascii=True), flush=True)
