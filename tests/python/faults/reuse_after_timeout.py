"""A rank gives up on a late peer, reuses its buffer, and the late peer arrives after all: the
timed-out operation must never write the buffer afterwards.

Run on 2 ranks: rank 1 sleeps LATE seconds before each call, rank 0 calls with a 0.5 s
deadline, catches fourd.TimeoutError, fills its buffer with a marker and waits until rank 1's
late call has ended (rank 1 says so in an MPI message outside fourd) and SETTLE seconds more
for the library to deliver whatever is left; then it checks the marker is intact. One fresh
grid per case (a timeout poisons the axis). Prints one "CASE <name> rank <r>: ..." line per
rank and case.

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
SETTLE = 1.0
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
            call(buf, g, 1.5)
            outcome = "completed"
        except fourd.Error as e:
            outcome = type(e).__name__
        world.send(outcome, dest=0, tag=7)
        say(f"CASE {name} rank 1: late call {outcome}")
    else:
        ended = world.irecv(source=1, tag=7)
        try:
            call(buf, g, 0.5)
            say(f"CASE {name} rank 0: NO-TIMEOUT")
        except fourd.TimeoutError:
            buf.fill_(-7) if isinstance(buf, torch.Tensor) else buf.fill(-7)
            deadline = time.monotonic() + 60
            while not ended.test()[0]:
                if time.monotonic() > deadline:
                    say(f"CASE {name} rank 0: rank 1's late call did not end")
                    world.Abort(1)
                time.sleep(0.01)
            time.sleep(SETTLE)
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
