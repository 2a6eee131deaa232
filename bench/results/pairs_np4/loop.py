"""A loop of small all_gathers on one axis of a 4-rank grid (x=2, data=2), fourd's algorithms
against MPI's blocking call (mpi4py) on the same groups: 100 untimed calls, then 3000 timed
ones, each timed on every rank, in three repetitions (the median is printed). Three figures:
world-max, the mean over iterations of the per-iteration maximum over all ranks (the bench's
default timing); group-max, the same within each group, the slowest group's; batch, each rank's
mean, the slowest rank's.

    mpiexec -n 4 python -m mpi4py bench/results/pairs_np4/loop.py AXIS BYTES
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import fourd

world = MPI.COMM_WORLD
grid = fourd.init(x=2, data=2)
axis, nbytes = sys.argv[1], int(sys.argv[2])
ranks = grid.ranks(axis)
comm = world.Split(min(ranks), ranks.index(world.rank))
src = np.ones(nbytes // 4, np.float32)
out = np.zeros(src.size * comm.size, np.float32)
group_of = np.array(world.allgather(min(ranks)))
calls = {"mpi": lambda: comm.Allgather(src, out)}
for algo in ("flat", "ring", "rhd", "shm"):
    if algo == "shm" and axis != "x":  # the data groups span virtual nodes
        continue
    calls[algo] = lambda a=algo: fourd.all_gather(out, src, axis, algorithm=a)
N = 3000
figures = {k: [] for k in calls}
for _ in range(3):
    for name, call in calls.items():
        for _ in range(100):
            call()
        world.Barrier()
        ts = np.empty(N)
        for i in range(N):
            t0 = time.perf_counter()
            call()
            ts[i] = time.perf_counter() - t0
        every = np.empty((world.size, N))
        world.Allgather(ts, every)
        wmax = every.max(axis=0).mean()
        gmax = max(every[group_of == g].max(axis=0).mean() for g in set(group_of))
        batch = every.mean(axis=1).max()
        figures[name].append((wmax * 1e6, gmax * 1e6, batch * 1e6))
if world.rank == 0:
    for name, v in figures.items():
        m = np.median(np.array(v), axis=0)
        print(
            f"{axis:4} {nbytes:6} B {name:5} world-max {m[0]:6.1f}  group-max {m[1]:6.1f}  "
            f"batch {m[2]:6.1f}  us"
        )
