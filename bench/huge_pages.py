"""A large all_reduce on buffers backed by transparent huge pages and on buffers that are not.

    mpiexec -n 2 python -m mpi4py bench/huge_pages.py --json bench/results/huge_pages_np2.json

numpy advises the kernel to back arrays of 4 MiB or more with huge pages (2 MiB); torch's CPU
allocator does not unless THP_MEM_ALLOC_ENABLE=1. Where the kernel's mode is "madvise" (this
machine's), the same collective on the same number of bytes then runs on different pages. This
script times fourd's algorithms on both kinds of buffer, in place and out of place, every round
every cell in turn (the order rotates from round to round); a cell is the median over its calls
of the slowest rank's time, and the table shows each cell's median round. It is why tuning's
explorations run on buffers paged as the call's are (docs/algorithms.md, "Tuning in use").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import fourd

WORLD = MPI.COMM_WORLD


def thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()


def arrays(count: int, huge: bool) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 arrays of `count` elements, every page written, advised for huge pages or
    not (numpy's switch for the arrays it allocates from now on)."""
    np._core.multiarray._set_madvise_hugepage(huge)
    try:
        a, b = np.empty(count, np.float32), np.empty(count, np.float32)
        a.fill(0)
        b.fill(0)
    finally:
        np._core.multiarray._set_madvise_hugepage(True)
    return a, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="64M", help="bytes of the all_reduce")
    ap.add_argument("--algorithms", default="shm,rhd,ring")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=6, help="timed calls per cell and round")
    ap.add_argument("--json", help="write the cells here (rank 0)")
    args = ap.parse_args(argv)

    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(args.size[:-1]) * units[args.size[-1]] if args.size[-1] in units else int(args.size)
    count = size // 4
    fourd.init(x=WORLD.Get_size())
    r = WORLD.Get_rank()
    bufs = {huge: arrays(count, huge) for huge in (True, False)}
    cells = [
        (alg, huge, in_place)
        for alg in args.algorithms.split(",")
        for huge in (True, False)
        for in_place in (False, True)
    ]

    def call_of(alg, huge, in_place):
        a, b = bufs[huge]
        if in_place:
            return lambda: fourd.all_reduce(a, "world", algorithm=alg)
        return lambda: fourd.all_reduce(a, "world", output=b, algorithm=alg)

    # Every algorithm's result is checked once (exact: integer-valued float32).
    want = np.arange(count, dtype=np.float32) % 1024 * WORLD.Get_size() + sum(
        range(WORLD.Get_size())
    )
    for cell in cells:
        a, b = bufs[cell[1]]
        a[:] = np.arange(count, dtype=np.float32) % 1024 + r
        call_of(*cell)()
        if not np.array_equal(a if cell[2] else b, want):
            raise SystemExit(f"huge_pages.py: {cell} gave a wrong result")
    for a, _b in bufs.values():
        a.fill(0)  # zeros stay zeros in place, call after call

    times = {cell: [] for cell in cells}
    for rnd in range(args.rounds):
        for j in range(len(cells)):
            cell = cells[(j + rnd) % len(cells)]
            call = call_of(*cell)
            for _ in range(3):
                call()
            WORLD.Barrier()
            ts = np.empty(args.calls)
            for i in range(args.calls):
                t0 = time.perf_counter()
                call()
                ts[i] = time.perf_counter() - t0
            slowest = np.empty_like(ts)
            WORLD.Allreduce(ts, slowest, op=MPI.MAX)
            times[cell].append(float(np.median(slowest)) * 1e3)

    if r == 0:
        med = {cell: statistics.median(v) for cell, v in times.items()}
        print(
            f"## all_reduce of {size} bytes (float32) on {WORLD.Get_size()} ranks, transparent "
            f"huge pages: {thp_mode()}; median round of {args.rounds}, {args.calls} calls each"
        )
        head = f"{'algorithm':10s} {'placement':13s} {'huge (ms)':>10s} {'small (ms)':>11s}"
        print(f"  {head}  small/huge")
        for alg in args.algorithms.split(","):
            for in_place in (False, True):
                h, s = med[(alg, True, in_place)], med[(alg, False, in_place)]
                where = "in place" if in_place else "out of place"
                print(f"  {alg:10s} {where:13s} {h:10.2f} {s:11.2f}  {s / h:10.2f}")
        if args.json:
            rows = [
                {
                    "algorithm": alg,
                    "huge_pages": huge,
                    "in_place": in_place,
                    "time_ms": med[(alg, huge, in_place)],
                    "round_times_ms": times[(alg, huge, in_place)],
                }
                for alg, huge, in_place in cells
            ]
            cmd = f"mpiexec -n {WORLD.Get_size()} python -m mpi4py bench/huge_pages.py " + " ".join(
                argv if argv is not None else sys.argv[1:]
            )
            mpi = MPI.Get_library_version().splitlines()[0]
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "command": cmd,
                        "size_bytes": size,
                        "thp": thp_mode(),
                        "mpi": mpi,
                        "rows": rows,
                    },
                    f,
                    indent=1,
                )
    fourd.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
