"""A rank gives up on a late peer, reuses its buffer, and the late peer arrives after all: the
timed-out operation must never write the buffer afterwards.

Run on 2 ranks: rank 1 sleeps LATE seconds before each call, rank 0 calls with a 0.5 s
deadline, catches fourd.TimeoutError, fills its buffer with a marker and waits until rank 1's
call has ended; then it checks the marker is intact. One fresh grid per case (a timeout poisons
the axis). Prints one "CASE <name> rank <r>: ..." line per rank and case.

    python faults/reuse_after_timeout.py [LATE]
"""

import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

import fourd

LATE = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
world = MPI.COMM_WORLD
me = world.Get_rank()


def say(msg):
    os.write(1, (msg + "\n").encode())


def case(name, make, call):
    g = fourd.init(timeout=30)
    buf = make()
    if me == 1:
        time.sleep(LATE)
        try:
            call(buf, g, 3.0)
            outcome = "completed"
        except fourd.Error as e:
            outcome = type(e).__name__
        say(f"CASE {name} rank 1: late call {outcome}")
    else:
        try:
            call(buf, g, 0.5)
            say(f"CASE {name} rank 0: NO-TIMEOUT")
        except fourd.TimeoutError:
            buf.fill_(-7) if isinstance(buf, torch.Tensor) else buf.fill(-7)
            # Long enough for rank 1's late call and the library to deliver whatever is left.
            time.sleep(LATE + 4.0)
            intact = bool((buf == -7).all())
            say(f"CASE {name} rank 0: timeout reused-buffer-intact={intact}")
    world.Barrier()
    fourd.finalize(timeout=5)


n = 1 << 16
case(
    "flat-all_reduce-torch",
    lambda: torch.ones(n),
    lambda b, g, t: fourd.all_reduce(b, algorithm="flat", timeout=t),
)
case(
    "ring-all_reduce-numpy",
    lambda: np.ones(n, np.float32),
    lambda b, g, t: fourd.all_reduce(b, algorithm="ring", timeout=t),
)
case(
    "ring-all_gather-numpy",
    lambda: np.ones(2 * n, np.float32),
    lambda b, g, t: fourd.all_gather(b, b[me * n : (me + 1) * n], algorithm="ring", timeout=t),
)
case(
    "flat-all_gather-torch",
    lambda: torch.ones(2 * n),
    lambda b, g, t: fourd.all_gather(b, b[me * n : (me + 1) * n], algorithm="flat", timeout=t),
)
case(
    "flat-broadcast-torch",
    lambda: torch.full((n,), float(me)),
    lambda b, g, t: fourd.broadcast(b, 1, timeout=t),
)
say(f"rank {me}: DONE")
