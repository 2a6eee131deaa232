"""Tuning's exploration figures against the same algorithms timed in a loop right after.

    mpiexec -n 4 python -m mpi4py bench/explore_vs_loop.py     # from an empty cache, each launch
    mpiexec -n 4 python -m mpi4py bench/explore_vs_loop.py --axis data --sizes 1K,4K,16K \
        --algorithms flat,ring,rhd,hierarchical

4 ranks (x=2 inside virtual nodes of 2 ranks, data=2 across, as the README's benchmark), an
out-of-place all_gather, by default on x from 16 KiB to 1 MiB (--axis, --sizes, --algorithms).
For each size: `auto`'s first calls, until its tuning has settled (the exploration, and the
re-check of a switch, inside those calls), then its figures per candidate (Grid.explain's
tuning: each candidate's better pass median of the slowest rank's per-call time); then `auto`
and each algorithm in a loop of 300 calls, 3 rounds in turn (the order rotating from round to
round), timed as the bench times a cell (the slowest rank's per-call time; mean and median over
the calls, the median round). `auto / best`: auto's loop mean over the fastest algorithm's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import fourd

WORLD = MPI.COMM_WORLD
SIZES = "16K,64K,256K,1M"
ALGORITHMS = "shm,rhd,ring"
SETTLED = ("settled", "single", "off")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--axis", default="x", choices=("x", "data", "world"))
    ap.add_argument("--sizes", default=SIZES, help=f"output bytes, comma-separated ({SIZES})")
    ap.add_argument("--algorithms", default=ALGORITHMS, help=f"timed beside auto ({ALGORITHMS})")
    args = ap.parse_args()
    sizes = [parse_size(x) for x in args.sizes.split(",")]
    algos = ("auto", *args.algorithms.split(","))
    axis = args.axis
    if WORLD.Get_size() != 4:
        if WORLD.Get_rank() == 0:
            print("explore_vs_loop.py: run it on 4 ranks", file=sys.stderr)
        return 2
    r = WORLD.Get_rank()
    g = fourd.init(x=2, data=2, ranks_per_node=2)
    ratios = []
    k = 4 if axis == "world" else 2  # the group's ranks
    for size in sizes:
        block = size // 4 // k  # float32 elements of one rank's block
        inp = np.arange(block, dtype=np.float32) + r
        out = np.zeros(k * block, np.float32)
        WORLD.Barrier()
        for _ in range(4000):  # as the bench waits for auto's tuning (runner.py)
            fourd.all_gather(out, inp, axis=axis)
            if g.tuning("all_gather", size, axis, "float32", False)["state"] in SETTLED:
                break
        tu = g.explain("all_gather", size, axis, dtype="float32", in_place=False)["tuning"]
        explored = dict(zip(tu["candidates"], [m * 1e6 for m in tu["measured_s"]]))
        loop = {alg: [] for alg in algos}
        for rnd in range(3):
            for alg in algos[rnd:] + algos[:rnd]:  # the order rotates from round to round
                for _ in range(10):
                    fourd.all_gather(out, inp, axis=axis, algorithm=alg)
                WORLD.Barrier()
                ts = np.empty(300)
                for i in range(ts.size):
                    t0 = time.perf_counter()
                    fourd.all_gather(out, inp, axis=axis, algorithm=alg)
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
            for alg in algos:
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
