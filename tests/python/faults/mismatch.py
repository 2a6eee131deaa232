"""Ranks call all_reduce with different counts (or dtypes). With FOURD_DEBUG=1 every rank raises
MismatchError showing both fingerprints; without it the call still ends by its deadline."""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


kind = sys.argv[1]  # "count" or "dtype"
g = fourd.init(timeout=3)
me = g.world_rank
if kind == "count":
    a = np.ones(100 + (7 if me == 0 else 0), np.float32)
else:
    a = np.ones(100, np.float32 if me == 0 else np.float64)
t0 = time.monotonic()
try:
    fourd.all_reduce(a, "world")
    say(f"rank {me}: COMPLETED elapsed={time.monotonic() - t0:.2f}")
except fourd.MismatchError as e:
    say(f"rank {me}: MISMATCH elapsed={time.monotonic() - t0:.2f} msg={e!s}".replace("\n", " | "))
except fourd.Error as e:
    say(f"rank {me}: {type(e).__name__} elapsed={time.monotonic() - t0:.2f} msg={str(e)[:200]}")
MPI.COMM_WORLD.Barrier()
