"""Rank 1 is killed with SIGKILL during a large all_reduce: the job must end within a bounded
time with a message, leaving no process behind."""

import os
import signal
import threading

import numpy as np

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


g = fourd.init(timeout=20)
me = g.world_rank
a = np.ones(8 << 20, np.float32)  # 32 MiB
say(f"rank {me}: pid {os.getpid()}")
if me == 1:
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
for _ in range(1000):
    fourd.all_reduce(a, "world")
