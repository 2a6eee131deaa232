"""Self-check for the emulated cluster (run_cluster.sh): are the nodes really separate, and how
fast is a plain MPI Allreduce across them?

Run it under the harness, through ``python -m mpi4py`` so that a failing rank aborts the job
instead of leaving the others waiting::

    bench/cluster/run_cluster.sh -- python -m mpi4py bench/cluster/mpi_selfcheck.py --mib 16

It checks that

* ranks in one shared-memory domain (``MPI.COMM_TYPE_SHARED``: what MPICH considers a node)
  report one host name, and different domains report different host names;
* the number of domains is the number of emulated nodes (``--expect-nodes``, or
  ``FOURD_CLUSTER_NODES`` set by the harness);
* ``MPI_Allreduce`` (sum) of integer-valued float32 data gives the exact result,

then times that Allreduce (the time of one iteration is the maximum over ranks) and compares it
with the node-level network bound of an all-reduce, ``2 (N-1)/N * n / Be``: every node must send
and receive that many bytes through its link of ``Be`` bytes/s, whatever the algorithm (N nodes,
n bytes). ``Be`` comes from ``FOURD_CLUSTER_RATE_BPS``. The last line is machine-readable:
``SELFCHECK OK key=value ...``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys

import numpy as np
from mpi4py import MPI


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=float, default=16.0, help="Allreduce size in MiB (default 16)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default 1)")
    p.add_argument(
        "--expect-nodes",
        type=int,
        default=int(os.environ.get("FOURD_CLUSTER_NODES", "0")),
        help="number of nodes the ranks must span (default: $FOURD_CLUSTER_NODES, 0 = any)",
    )
    args = p.parse_args(argv)
    if args.mib <= 0 or args.iters < 1 or args.warmup < 0:
        p.error("--mib must be > 0, --iters >= 1, --warmup >= 0")
    return args


def fail(comm: MPI.Comm, message: str) -> None:
    """Report on stderr and take the whole job down: the other ranks may be inside a collective."""
    print(f"SELFCHECK FAILED: {message}", file=sys.stderr, flush=True)
    comm.Abort(1)


def check_nodes(comm: MPI.Intracomm, expect_nodes: int) -> tuple[int, list[str]]:
    """Return (number of nodes, host name of each node); abort if the placement is wrong."""
    rank = comm.Get_rank()
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    # Number the shared-memory domains by their lowest world rank: node 0 holds rank 0, etc.
    node_id_key = shared.allreduce(rank, op=MPI.MIN)
    info = (rank, node_id_key, socket.gethostname(), MPI.Get_processor_name())
    shared.Free()
    rows = comm.gather(info, root=0)
    verdict = None
    nodes: list[str] = []
    if rank == 0:
        keys = sorted({r[1] for r in rows})
        by_node = {k: sorted({r[3] for r in rows if r[1] == k}) for k in keys}
        for r, key, host, proc in rows:
            print(f"rank {r} host {host} processor {proc} node {keys.index(key)}", flush=True)
            if host != proc:
                verdict = f"rank {r}: gethostname() {host!r} != Get_processor_name() {proc!r}"
        nodes = [by_node[k][0] for k in keys]
        if verdict is None and any(len(v) != 1 for v in by_node.values()):
            verdict = f"ranks of one shared-memory domain report several host names: {by_node}"
        if verdict is None and len(set(nodes)) != len(nodes):
            verdict = f"different shared-memory domains report the same host name: {nodes}"
        if verdict is None and expect_nodes and len(nodes) != expect_nodes:
            verdict = (
                f"expected the ranks to span {expect_nodes} nodes, found {len(nodes)}: {nodes}"
            )
    verdict = comm.bcast(verdict, root=0)
    if verdict is not None:
        if rank == 0:
            fail(comm, verdict)
        comm.Barrier()  # rank 0 is aborting the job; never reached
    return comm.bcast(len(nodes), root=0), comm.bcast(nodes, root=0)


def time_allreduce(comm: MPI.Intracomm, nbytes: int, iters: int, warmup: int) -> list[float]:
    """Seconds per iteration (maximum over ranks) of Allreduce(SUM) on float32."""
    p, rank = comm.Get_size(), comm.Get_rank()
    count = nbytes // 4
    # Small integers in float32: every partial sum is exact, so any correct algorithm and any
    # reduction order gives exactly p(p+1)/2.
    send = np.full(count, rank + 1, dtype=np.float32)
    recv = np.empty_like(send)
    expected = np.float32(p * (p + 1) // 2)
    times = []
    for it in range(warmup + iters):
        recv.fill(-1)
        comm.Barrier()
        t0 = MPI.Wtime()
        comm.Allreduce(send, recv, op=MPI.SUM)
        dt = MPI.Wtime() - t0
        if it >= warmup:
            times.append(dt)
        wrong = int(np.count_nonzero(recv != expected))
        if comm.allreduce(wrong, op=MPI.SUM):
            if rank == 0:
                fail(comm, f"Allreduce gave a wrong result (expected {expected} everywhere)")
            comm.Barrier()
    mine = np.array(times)
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    return slowest.tolist()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    nnodes, hosts = check_nodes(comm, args.expect_nodes)

    nbytes = int(args.mib * 2**20) // 4 * 4
    times = time_allreduce(comm, nbytes, args.iters, args.warmup)
    if rank != 0:
        return 0
    med, best = statistics.median(times), min(times)
    algbw = nbytes / med / 1e9
    busbw = algbw * 2 * (p - 1) / p  # nccl-tests' all-reduce factor
    line = (
        f"allreduce {args.mib:g} MiB float32, {p} ranks on {nnodes} nodes:"
        f" median {med * 1e3:.1f} ms, min {best * 1e3:.1f} ms (over {args.iters});"
        f" algbw {algbw:.3f} GB/s, busbw {busbw:.3f} GB/s"
    )
    summary = f"SELFCHECK OK nodes={nnodes} ranks={p} hosts={','.join(hosts)} bytes={nbytes}"
    summary += f" median_ms={med * 1e3:.2f} min_ms={best * 1e3:.2f}"
    rate_bps = float(os.environ.get("FOURD_CLUSTER_RATE_BPS", "0"))
    if rate_bps > 0 and nnodes > 1:
        be = rate_bps / 8  # bytes/s through one node's link, each direction
        bound = 2 * (nnodes - 1) / nnodes * nbytes / be
        line += (
            f"; node-level bound 2(N-1)/N*n/Be at {os.environ.get('FOURD_CLUSTER_RATE', '?')}:"
            f" {bound * 1e3:.1f} ms = {bound / med * 100:.0f}% of the median"
        )
        summary += f" bound_ms={bound * 1e3:.2f} efficiency={bound / med:.3f}"
    print(line, flush=True)
    print(summary, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
