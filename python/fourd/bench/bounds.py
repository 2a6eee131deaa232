"""Bandwidth conventions and physical bounds (pure functions; the two measurements at start,
memcpy_bandwidth and pingpong_latency, are the only ones that time anything).

busbw follows nccl-tests exactly: algbw = S / t with S the full array (the all-reduce buffer, the
gathered output of all-gather, the scattered input of reduce-scatter) and GB = 1e9 bytes;
busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for
broadcast.

The bound of a row is the time below which no algorithm can go on this machine, from two
measured or given bandwidths (bandwidth terms only; latency is not part of it):

  * Bi, the memory-copy bandwidth of one rank while every rank copies at once (measured at start
    with numpy), for traffic inside a node;
  * Be, the link rate of one node (--link-rate or FOURD_CLUSTER_RATE_BPS), for traffic between
    nodes.

For a group of N nodes with k ranks each and S bytes, the share of S that every node (every
rank) must move is the collective's bus factor for N (for k), from its entry in collectives.py:
c (N-1)/N with c = 2 for all-reduce and 1 for all-gather and reduce-scatter, and 1 for broadcast.

  T_net   = c (N-1)/N * S / Be     (every node must move that much through its link)
  T_intra = c (k-1)/k * S / Bi     (every rank must move that much inside its node)
  T_min   = max(T_net, T_intra)    (stages pipelined; the sum when they are not)

Broadcast: T_net = S / Be when N > 1 and T_intra = S / Bi when k > 1.

The plot adds a latency floor at small sizes (report.latency_floor_s): ceil(log2 p) one-way
latencies of a small message, measured at start between rank 0 and a rank of its host.
"""

from __future__ import annotations

import time

import numpy as np

from .collectives import TABLE

GB = 1e9


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus factor of `collective` for a group of n ranks (0 for a single rank)."""
    return TABLE[collective].bus_factor(n)


def bandwidths(collective: str, nbytes: int, n: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for S = nbytes moved in `seconds` by a group of n ranks."""
    if not seconds > 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / GB
    return algbw, algbw * bus_factor(collective, n)


def bound(
    collective: str,
    nbytes: int,
    nodes: int,
    k: int,
    intra_bps: float | None,
    link_bps: float | None,
) -> dict | None:
    """The physical bound of one row: {"t_min_s", "t_sum_s", "t_net_s", "t_intra_s"}, None when
    neither term applies or can be computed (a one-rank group, or only an unknown link). The
    share of S that every node (every rank) must move is the bus factor of N nodes (k ranks)."""
    share = TABLE[collective].bus_factor
    t_net = t_intra = None
    if nodes > 1 and link_bps:
        t_net = share(nodes) * nbytes / link_bps
    if k > 1 and intra_bps:
        t_intra = share(k) * nbytes / intra_bps
    terms = [t for t in (t_net, t_intra) if t is not None]
    if not terms:
        return None
    return {"t_min_s": max(terms), "t_sum_s": sum(terms), "t_net_s": t_net, "t_intra_s": t_intra}


def memcpy_bandwidth(nbytes: int = 16 << 20, reps: int = 5) -> float:
    """Copy bandwidth of this process in bytes/s (bytes copied per second, best of `reps` numpy
    copies of `nbytes`). Call it on every rank at once to include the contention of a node."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best


def pingpong_latency(comm, a: int, b: int, reps: int = 50, warmup: int = 10) -> float | None:
    """One-way latency of an 8-byte message between ranks a and b of `comm` (an mpi4py
    communicator): half the fastest of `reps` round trips, the floor a message can reach.
    Known on rank a; None on every other rank (ranks other than a and b do not take part)."""
    me = comm.Get_rank()
    if me not in (a, b) or a == b:
        return None
    buf = np.zeros(1, np.float64)
    best = float("inf")
    for i in range(warmup + reps):
        if me == a:
            t0 = time.perf_counter()
            comm.Send(buf, dest=b, tag=77)
            comm.Recv(buf, source=b, tag=77)
            if i >= warmup:
                best = min(best, time.perf_counter() - t0)
        else:
            comm.Recv(buf, source=a, tag=77)
            comm.Send(buf, dest=a, tag=77)
    return best / 2 if me == a else None
