"""Tuning's exploration figures against the same algorithms timed in a loop right after.

    mpiexec -n 4 python -m mpi4py bench/explore_vs_loop.py     # from an empty cache, each launch

4 ranks (x=2 inside virtual nodes of 2 ranks, data=2 across, as the README's benchmark), an
out-of-place all_gather on x from 16 KiB to 1 MiB. For each size: `auto`'s first calls, until its
tuning has settled (the exploration, and the re-check of a switch, inside those calls), then its
figures per candidate (Grid.explain's tuning: each candidate's better pass median of the slowest
rank's per-call time); then `auto` and each algorithm in a loop of 300 calls, 3 rounds in turn
(the order rotating from round to round), timed as the bench times a cell (the slowest rank's
per-call time; mean and median over the calls, the median round). `auto / best`: auto's loop
mean over the fastest algorithm's.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import fourd

WORLD = MPI.COMM_WORLD
SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20)
LOOP = ("auto", "shm", "rhd", "ring")
SETTLED = ("settled", "single", "off")


def main() -> int:
    if WORLD.Get_size() != 4:
        if WORLD.Get_rank() == 0:
            print("explore_vs_loop.py: run it on 4 ranks", file=sys.stderr)
        return 2
    r = WORLD.Get_rank()
    g = fourd.init(x=2, data=2, ranks_per_node=2)
    ratios = []
    for size in SIZES:
        half = size // 8  # float32 elements of one rank's block (groups of 2)
        inp = np.arange(half, dtype=np.float32) + r
        out = np.zeros(2 * half, np.float32)
        WORLD.Barrier()
        for _ in range(4000):  # as the bench waits for auto's tuning (runner.py)
            fourd.all_gather(out, inp, axis="x")
            if g.tuning("all_gather", size, "x", "float32", False)["state"] in SETTLED:
                break
        tu = g.explain("all_gather", size, "x", dtype="float32", in_place=False)["tuning"]
        explored = dict(zip(tu["candidates"], [m * 1e6 for m in tu["measured_s"]]))
        loop = {alg: [] for alg in LOOP}
        for rnd in range(3):
            for alg in LOOP[rnd:] + LOOP[:rnd]:  # the order rotates from round to round
                for _ in range(10):
                    fourd.all_gather(out, inp, axis="x", algorithm=alg)
                WORLD.Barrier()
                ts = np.empty(300)
                for i in range(ts.size):
                    t0 = time.perf_counter()
                    fourd.all_gather(out, inp, axis="x", algorithm=alg)
                    ts[i] = time.perf_counter() - t0
                slowest = np.empty_like(ts)
                WORLD.Allreduce(ts, slowest, op=MPI.MAX)
                loop[alg].append((float(slowest.mean()) * 1e6, float(np.median(slowest)) * 1e6))
        if r == 0:
            mean = {a: statistics.median(x[0] for x in v) for a, v in loop.items()}
            med = {a: statistics.median(x[1] for x in v) for a, v in loop.items()}
            best = min(v for a, v in mean.items() if a != "auto")
            ratios.append(mean["auto"] / best)
            print(
                f"## {size >> 10} KiB: auto settled on {tu['settled']}, auto / best "
                f"{mean['auto'] / best:.2f}"
            )
            head = f"{'algorithm':10s} {'explored (us)':>14s} {'loop mean':>10s}"
            print(f"  {head} {'loop median':>12s}")
            for alg in LOOP:
                e = f"{explored[alg]:.1f}" if alg in explored else "-"
                print(f"  {alg:10s} {e:>14s} {mean[alg]:10.1f} {med[alg]:12.1f}")
            sys.stdout.flush()
    if r == 0:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"# auto / best, geometric mean over the sizes: {geo:.3f}")
    fourd.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
