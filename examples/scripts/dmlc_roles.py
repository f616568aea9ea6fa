#!/usr/bin/env python3
"""The bootstrap of an MXNet/ps-lite parameter-server job, without MXNet: it proves the DMLC_* contract.

Every server and worker connects to the scheduler at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT and registers its role
(and DMLC_WORKER_ID); the scheduler answers all of them once DMLC_NUM_SERVER servers and DMLC_NUM_WORKER
workers with distinct ids 0..n-1 have registered, as ps-lite's scheduler does before training starts. Workers
then exit 0 (the Job completes); the scheduler and servers keep running, as parameter servers do.
Each process first prints the DMLC_* values it got on one line, for `kubectl logs` and the e2e test.
"""
import json
import os
import socket
import sys
import threading
import time

ENV = ["DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_WORKER_ID"]


def log(msg):
    print(msg, flush=True)


def scheduler(port, num_server, num_worker):
    lock, conns, regs = threading.Lock(), [], {}
    done = threading.Event()

    def answer(c):
        c.sendall((json.dumps({"ok": True, "servers": num_server, "workers": num_worker}) + "\n").encode())

    def handle(c):
        reg = json.loads(c.makefile().readline())
        with lock:
            regs[(reg["role"], reg["host"])] = reg
            conns.append(c)
            servers = [r for r in regs.values() if r["role"] == "server"]
            workers = [r for r in regs.values() if r["role"] == "worker"]
            ids = sorted(int(r["id"]) for r in workers)
            log(f"scheduler: registered role={reg['role']} id={reg.get('id', '')} host={reg['host']} "
                f"({len(servers)}/{num_server} servers, {len(workers)}/{num_worker} workers)")
            if done.is_set():
                answer(c)
            elif len(servers) == num_server and len(workers) == num_worker:
                if ids != list(range(num_worker)):
                    log(f"scheduler: error: worker ids {ids}, want 0..{num_worker - 1}")
                    return
                log(f"scheduler: all registered servers={num_server} workers={num_worker} worker_ids={ids}")
                done.set()
                for x in conns:
                    answer(x)

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    log(f"scheduler: listening on {port}")
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def member(role, uri, port):
    reg = {"role": role, "id": os.environ.get("DMLC_WORKER_ID", ""), "host": socket.getfqdn()}
    deadline = time.time() + 300
    while True:
        try:  # the scheduler's DNS name and port appear a moment after this pod starts
            c = socket.create_connection((uri, port), timeout=5)
            break
        except OSError as e:
            if time.time() > deadline:
                sys.exit(f"{role}: scheduler {uri}:{port} unreachable: {e}")
            time.sleep(0.5)
    c.settimeout(None)
    c.sendall((json.dumps(reg) + "\n").encode())
    ans = json.loads(c.makefile().readline())
    log(f"{role}: scheduler says ok servers={ans['servers']} workers={ans['workers']}")
    if role == "server":
        threading.Event().wait()  # serve forever


def main():
    log("dmlc " + " ".join(f"{k}={os.environ.get(k, '')}" for k in ENV) + f" host={socket.getfqdn()}")
    role, port = os.environ["DMLC_ROLE"], int(os.environ["DMLC_PS_ROOT_PORT"])
    if role == "scheduler":
        scheduler(port, int(os.environ["DMLC_NUM_SERVER"]), int(os.environ["DMLC_NUM_WORKER"]))
    else:
        member(role, os.environ["DMLC_PS_ROOT_URI"], port)


if __name__ == "__main__":
    main()
