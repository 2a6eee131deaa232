"""Interpreter exit (or finalize) with asynchronous operations in flight: they are waited for
with the deadline, communicators freed, progress threads stopped; no crash at exit."""

import os
import sys

import numpy as np

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


def threads():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


mode = sys.argv[1]
before = threads()
g = fourd.init(x=2, ranks_per_node=2)
bufs = [np.full(1 << 18, g.world_rank + 1, np.float64) for _ in range(16)]
works = [fourd.all_reduce(b, "x" if i % 2 else "world", async_op=True) for i, b in enumerate(bufs)]
if mode == "finalize":
    want = sum(r + 1 for r in g.ranks("world"))
    ok = fourd.finalize()
    say(
        f"rank {g.world_rank}: finalize={ok} done={all(w.is_completed() for w in works)} "
        f"threads_before={before} threads_after={threads()} "
        f"correct={bool(bufs[0][0] == want)}"
    )
    try:
        fourd.all_reduce(bufs[0], "x")
    except fourd.NotInitializedError as e:
        say(f"rank {g.world_rank}: AFTER-FINALIZE {e}")
else:
    say(f"rank {g.world_rank}: exiting with operations in flight")
