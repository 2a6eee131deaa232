"""A loop of small all_gathers and reduce_scatters on one node, fourd's flat and shm against
MPI's blocking call and its persistent request (mpi4py), each 20000 calls after 200 untimed,
five repetitions (the median per call is printed, in microseconds, the slowest rank's).

    FOURD_CALIBRATE=0 mpiexec -n 2 python -m mpi4py bench/results/ab_shm_one_chunk/loop.py BYTES
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import fourd

world = MPI.COMM_WORLD
p = world.size
fourd.init(x=p)
n = int(sys.argv[1]) // 4  # float32 elements per rank
src = np.ones(n, np.float32)
gathered = np.zeros(p * n, np.float32)
whole = np.ones(p * n, np.float32)
mine = np.zeros(n, np.float32)
ag = world.Allgather_init(src, gathered)
rs = world.Reduce_scatter_block_init(whole, mine)
calls = {
    "ag_mpi": lambda: world.Allgather(src, gathered),
    "ag_persistent": lambda: (ag.Start(), ag.Wait()),
    "ag_flat": lambda: fourd.all_gather(gathered, src, "x", algorithm="flat"),
    "ag_shm": lambda: fourd.all_gather(gathered, src, "x", algorithm="shm"),
    "rs_mpi": lambda: world.Reduce_scatter_block(whole, mine),
    "rs_persistent": lambda: (rs.Start(), rs.Wait()),
    "rs_flat": lambda: fourd.reduce_scatter(mine, whole, "x", algorithm="flat"),
    "rs_shm": lambda: fourd.reduce_scatter(mine, whole, "x", algorithm="shm"),
}
N = 20000
per_call = {k: [] for k in calls}
for _ in range(5):
    for name, call in calls.items():
        for _ in range(200):
            call()
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(N):
            call()
        per_call[name].append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX) / N * 1e6)
if world.rank == 0:
    print(
        f"{p} ranks, {4 * n} B a rank:",
        " ".join(f"{k}={np.median(v):.2f}" for k, v in per_call.items()),
    )
ag.Free()
rs.Free()
