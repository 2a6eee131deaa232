"""Out-of-place all_gather on a group of 2 ranks: what it costs the peer to read bytes that the
sender has just written.

    mpiexec -n 2 python -m mpi4py bench/fresh_send.py --json bench/results/fresh_send_np2.json
    mpiexec -n 4 python -m mpi4py bench/fresh_send.py --json bench/results/fresh_send_np4.json

An out-of-place all_gather copies the caller's block into its place in the output. MPI's
MPI_Allgather then sends that copy; fourd's ring and rhd send the caller's input instead, and
copy it into the output while the messages are in flight. The same exchange is also timed by
hand with mpi4py (MPI_Isend/MPI_Irecv and MPI_Waitall), once sending the input and once sending
the copy just made, so that the difference is seen without either library's collective code.

The group is the data axis: both ranks with 2 ranks (data=2), and with 4 ranks (x=2 within
virtual nodes of 2 ranks, data=2 across them) the two data groups {0, 2} and {1, 3}, which run
at once. Every round times every implementation in turn (the order rotates from round to round)
on the same buffers; a cell is the mean over its calls of the slowest rank's time, and the table
shows each implementation's median round. In place, nothing is copied: MPI's and fourd's
in-place calls are timed too.
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


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)


def implementations(comm, peer, inp, out, mine, theirs) -> list:
    """(name, call) of every implementation timed, on these buffers."""

    def mpi_allgather():
        comm.Allgather(inp, out)

    def by_hand_input():
        mine[:] = inp
        reqs = [comm.Irecv(theirs, peer, 7), comm.Isend(inp, peer, 7)]
        MPI.Request.Waitall(reqs)

    def by_hand_copy():
        mine[:] = inp
        reqs = [comm.Irecv(theirs, peer, 7), comm.Isend(mine, peer, 7)]
        MPI.Request.Waitall(reqs)

    def fourd_alg(alg):
        return lambda: fourd.all_gather(out, inp, axis="data", algorithm=alg)

    def mpi_in_place():
        comm.Allgather(MPI.IN_PLACE, out)

    def fourd_in_place():
        fourd.all_gather(out, mine, axis="data", algorithm="rhd")

    return [
        ("MPI_Allgather", mpi_allgather),
        ("by hand, sending the input", by_hand_input),
        ("by hand, sending the copy", by_hand_copy),
        ("fourd rhd", fourd_alg("rhd")),
        ("fourd ring", fourd_alg("ring")),
        ("MPI_Allgather in place", mpi_in_place),
        ("fourd rhd in place", fourd_in_place),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64K,256K,1M,4M,16M", help="output bytes, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--target-ms", type=float, default=40.0, help="timed calls per cell: about this long"
    )
    ap.add_argument("--json", help="write the cells here (rank 0)")
    args = ap.parse_args(argv)

    n = WORLD.Get_size()
    if n not in (2, 4):
        if WORLD.Get_rank() == 0:
            print("fresh_send.py: run it on 2 or 4 ranks", file=sys.stderr)
        return 2
    if n == 2:
        grid = fourd.init(data=2)
    else:
        grid = fourd.init(x=2, data=2, ranks_per_node=2)
    r = WORLD.Get_rank()
    # The data axis's group as an mpi4py communicator, in the grid's order: rank r has data
    # coordinate r // 2 with 4 ranks (x varies fastest), r with 2.
    comm = WORLD.Split(r % 2 if n == 4 else 0, r)
    me, peer = comm.Get_rank(), 1 - comm.Get_rank()
    if grid.rank("data") != me:
        raise SystemExit("fresh_send.py: the data group's order differs from the grid's")

    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        half = size // 8  # float32 elements of one rank's block
        inp = np.arange(half, dtype=np.float32) + r * half
        out = np.zeros(2 * half, np.float32)
        mine, theirs = out[me * half : (me + 1) * half], out[peer * half : (peer + 1) * half]
        want = np.concatenate(
            [np.arange(half, dtype=np.float32) + j * half for j in comm.allgather(r)]
        )

        impls = implementations(comm, peer, inp, out, mine, theirs)
        # Every implementation's result is checked once (exact: integer-valued float32).
        for name, call in impls:
            out[:] = -1
            mine[:] = inp
            call()
            if not np.array_equal(out, want):
                raise SystemExit(f"fresh_send.py: {name} gave a wrong result at {size} bytes")
        est = max(1e-5, size / 2e9)
        iters = int(max(20, min(2000, args.target_ms / 1e3 / est)))
        iters = WORLD.allreduce(iters, op=MPI.MIN)
        times = {name: [] for name, _ in impls}
        for rnd in range(args.rounds):
            for j in range(len(impls)):
                name, call = impls[(j + rnd) % len(impls)]
                mine[:] = inp
                for _ in range(5):
                    call()
                WORLD.Barrier()
                ts = np.empty(iters)
                for i in range(iters):
                    t0 = time.perf_counter()
                    call()
                    ts[i] = time.perf_counter() - t0
                allts = np.empty((n, iters))
                WORLD.Allgather(ts, allts)
                times[name].append(float(allts.max(axis=0).mean() * 1e6))
        med = {name: statistics.median(v) for name, v in times.items()}
        rows.append({"size_bytes": size, "iters": iters, "time_us": med, "round_times_us": times})
        if r == 0:
            base = med["MPI_Allgather"]
            print(
                f"## {size} bytes of output, {iters} calls a cell, median of {args.rounds} rounds"
            )
            for name, t in med.items():
                ref = med["MPI_Allgather in place"] if "in place" in name else base
                print(f"  {name:30s} {t:10.1f} us   MPI/this {ref / t:5.2f}")
            sys.stdout.flush()
    if r == 0 and args.json:
        with open(args.json, "w") as f:
            cmd = f"mpiexec -n {n} python -m mpi4py bench/fresh_send.py " + " ".join(
                argv if argv is not None else sys.argv[1:]
            )
            mpi = MPI.Get_library_version().splitlines()[0]
            json.dump({"command": cmd, "ranks": n, "mpi": mpi, "rows": rows}, f, indent=1)
    fourd.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
