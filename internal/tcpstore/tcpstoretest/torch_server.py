"""torch's own TCPStore server (the classic one: Debian's torch has no libuv) on 127.0.0.1:PORT.

Usage: python3 torch_server.py PORT (tcpstoretest.StartTorch passes it to python3 -c).
Prints READY once it listens, then serves until killed.
"""
import datetime
import sys
import time

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, use_libuv=False,
                      wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
print("READY", flush=True)
while True:
    time.sleep(3600)
