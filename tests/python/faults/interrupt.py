"""Ctrl-C during a blocking collective: rank 0 waits in all_reduce for a rank that is asleep and
receives SIGINT; KeyboardInterrupt must arrive within about 100 ms."""

import os
import signal
import threading
import time

import numpy as np
from mpi4py import MPI

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


g = fourd.init(timeout=60)
me = g.world_rank
a = np.ones(1000, np.float32)
if me == 0:
    sent = {}

    def fire():
        sent["t"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(0.5, fire).start()
    try:
        fourd.all_reduce(a, "world")
        say("rank 0: NOT-INTERRUPTED")
    except KeyboardInterrupt:
        say(f"rank 0: INTERRUPTED after {1000 * (time.monotonic() - sent['t']):.1f} ms")
    try:
        fourd.all_reduce(a, "world")
    except fourd.AbortedError as e:
        say(f"rank 0: POISONED {str(e)[:80]}")
else:
    time.sleep(1.5)
MPI.COMM_WORLD.Barrier()
