"""An MPI rank that trains in lockstep with the others and says its progress (the MPI side of docs/hangs.md).

Each step is an allreduce (the collective every rank waits in for the slowest), then elastic_training.progress(step).
argv: the file every rank appends "<rank> <pid>" to, and the steps of a run that is not the first (the first runs
until it is stopped: a rank frozen in it hangs the others).
"""

import os
import sys
import time

from mpi4py import MPI

import elastic_training

pids, later_steps = sys.argv[1], int(sys.argv[2])
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
with open(pids, "a+") as f:
    f.seek(0)
    seen = len(f.readlines())  # the first run's ranks see at most the other's line; a later run's, the first run's two
    f.write("%d %d\n" % (rank, os.getpid()))
later = comm.allreduce(seen, op=MPI.MAX) >= 2
step = 0
while not later or step < later_steps:
    comm.allreduce(step)
    step += 1
    elastic_training.progress(step)
    if step % 10 == 0:
        print("rank %d: step %d" % (rank, step), flush=True)
    time.sleep(0.1)
print("rank %d: %d steps" % (rank, step), flush=True)
