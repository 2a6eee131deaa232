"""One rank (the last) skips a collective; every other rank must raise fourd.TimeoutError
within the deadline plus 2 s, naming the operation, axis, group ranks, sequence number and
elapsed time; later calls on the poisoned communicator raise AbortedError at once."""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


DEADLINE = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
ALGO = sys.argv[2] if len(sys.argv) > 2 else "flat"
size = MPI.COMM_WORLD.Get_size()
# Two virtual nodes, so point-to-point algorithms (ring) also see an inter-node level.
g = fourd.init(timeout=DEADLINE, ranks_per_node=max(1, size // 2))
me = g.world_rank
skipper = g.world_size - 1
a = np.ones(1 << 16, np.float32)
if me != skipper:
    t0 = time.monotonic()
    try:
        fourd.all_reduce(a, "world", algorithm=ALGO)
        say(f"rank {me}: NO-ERROR")
    except fourd.TimeoutError as e:
        dt = time.monotonic() - t0
        msg = str(e)
        ok = (
            all(s in msg for s in ("all_reduce", "axis 'world'", "seq 1", "timed out after"))
            and dt < DEADLINE + 2
        )
        say(
            f"rank {me}: TIMEOUT-OK={ok} elapsed={dt:.2f} "
            f"isinstance_builtin={isinstance(e, TimeoutError)} msg={msg}"
        )
    t1 = time.monotonic()
    try:
        fourd.all_reduce(a, "world")
        say(f"rank {me}: SECOND-CALL-RAN")
    except fourd.AbortedError as e:
        say(f"rank {me}: ABORTED-OK={time.monotonic() - t1 < 0.5} msg={str(e)[:100]}")
else:
    time.sleep(DEADLINE + 0.5)
MPI.COMM_WORLD.Barrier()
