# Many torch elastic agents in one process, for the rendezvous at scale (scale_test.go).
#
# Each participant is torch's own DynamicRendezvousHandler (the c10d or etcd-v2 backend, is_host=false on c10d), or
# the job's own (elastic-training: internal/trainerpy, found through its entry point on PYTHONPATH), driven as
# torchrun's agent drives it: next_rendezvous(), then every monitor interval num_nodes_waiting(), and a new
# next_rendezvous() when a node waits (a scale-up) or when its workers fail (a scale-down: the restart file). Only the
# workers are left out. Each participant has its own address (local_addr) and so its own node in torch's state;
# heartbeats are torch's own timer threads.
#
# argv: backend endpoint run_id nnodes(min:max) count first_index ctrl_dir monitor_interval rdzv_conf(k=v,...)
#
# Control files in ctrl_dir, written by the benchmark: "go" (start), "restart-K" (K-th restart of every
# participant's workers), "stop". Output, one line each: READY once imported; "EV <addr> <round> <rank> <world>
# <unix time>" each time a participant completes a round; "ERR <addr> <error>" when next_rendezvous fails. Every
# second the process writes ops-<pid>: its state reads, writes, writes that lost the compare-and-set, and the most
# participants that any of its handlers saw in torch's state (how far a round that does not form got).
import os
import sys
import threading
import time

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

backend, endpoint, run_id, nnodes, count, first, ctrl, monitor, conf = sys.argv[1:10]
min_nodes, max_nodes = (int(x) for x in nnodes.split(":"))
count, first, monitor = int(count), int(first), float(monitor)
kwargs = dict(kv.split("=", 1) for kv in conf.split(",") if kv)
if backend == "c10d":
    kwargs["is_host"] = "false"

ops = {"get": 0, "set": 0, "lost": 0}
ops_lock = threading.Lock()
holders = []  # each participant's torch state holder
print_lock = threading.Lock()


def emit(line):
    with print_lock:
        print(line, flush=True)


def counted(be):
    """Counts the backend's state reads and compare-and-set writes (every store operation of the algorithm)."""
    get_state, set_state = be.get_state, be.set_state

    def get():
        with ops_lock:
            ops["get"] += 1
        return get_state()

    def put(state, token=None):
        r = set_state(state, token)
        with ops_lock:
            ops["set"] += 1
            if r is not None and not r[2]:
                ops["lost"] += 1
        return r

    be.get_state, be.set_state = get, put


def exists(name):
    return os.path.exists(os.path.join(ctrl, name))


def participant(index):
    addr = f"node-{index}"
    params = RendezvousParameters(backend=backend, endpoint=endpoint, run_id=run_id, min_nodes=min_nodes,
                                  max_nodes=max_nodes, local_addr=addr, **kwargs)
    handler = get_rendezvous_handler(params)
    own = backend == "elastic-training"  # no shared state to count or read: one key per node
    if not own:
        counted(handler._state_holder._backend)
        holders.append(handler._state_holder)
    restarts = 0
    try:
        while not exists("stop"):
            info = handler.next_rendezvous()
            rank, world = (info[1], info[2]) if isinstance(info, tuple) else (info.rank, info.world_size)
            round_ = handler.round if own else handler._state_holder.state.round
            emit(f"EV {addr} {round_} {rank} {world} {time.time():.4f}")
            # The agent's monitor loop: its workers run until a node waits or they fail.
            while not exists("stop"):
                time.sleep(monitor)
                if exists(f"restart-{restarts + 1}"):
                    restarts += 1
                    break
                if handler.num_nodes_waiting() > 0:
                    break
    except Exception as e:  # noqa: BLE001 - reported to the benchmark, which fails on it
        emit(f"ERR {addr} {type(e).__name__}: {e}")
    finally:
        if not own:
            handler._stop_heartbeats()


def write_ops():
    path = os.path.join(ctrl, f"ops-{os.getpid()}")
    while True:
        seen = max((len(h.state.participants) for h in list(holders)), default=0)
        with ops_lock:
            line = f"{ops['get']} {ops['set']} {ops['lost']} {seen}\n"
        with open(path + ".tmp", "w") as f:
            f.write(line)
        os.replace(path + ".tmp", path)
        time.sleep(1)


emit("READY")
while not exists("go"):
    time.sleep(0.005)
threading.Thread(target=write_ops, daemon=True).start()
threads = [threading.Thread(target=participant, args=(first + i,), daemon=True) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
