"""torch's own TCPStore server, the baseline of the c10d benchmarks: the classic server (Debian's torch has no
libuv) on 127.0.0.1:PORT, as an agent with is_host=true hosts it, kept alive.

Usage: python3 torch_store.py PORT. Prints READY once it listens, then serves until killed.
"""
import datetime
import sys
import time

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, use_libuv=False,
                      wait_for_workers=False, timeout=datetime.timedelta(seconds=300))
print("READY", flush=True)
while True:
    time.sleep(3600)
