"""Bandwidth conventions and physical bounds (pure functions; the two measurements at start,
memcpy_bandwidth and pingpong_latency, are the only ones that time anything).

busbw follows nccl-tests exactly: algbw = S / t with S the full array (the all-reduce buffer, the
gathered output of all-gather, the scattered input of reduce-scatter) and GB = 1e9 bytes;
busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for
broadcast.

The bound of a row is the time below which no algorithm can go on this machine, from two
measured or given bandwidths (bandwidth terms only; latency is not part of it):

  * Bi, the memory-copy bandwidth of one rank while every rank copies at once (measured at start
    with numpy: arrays far larger than the caches, copied back to back for a quarter second),
    for traffic inside a node;
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

import os
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


COPY_BYTES = 256 << 20  # each of the two arrays of the Bi measurement ...
COPY_MIN_BYTES = 64 << 20  # ... never below this, where memory is short
COPY_SECONDS = 0.25  # copies back to back for this long, every rank at once


def copy_bytes(ranks_on_host: int) -> int:
    """The array size of the Bi measurement: COPY_BYTES, less where the host's ranks would take
    over a quarter of its available memory with their two arrays each (never below
    COPY_MIN_BYTES). Far larger than a last-level cache, so what is timed is DRAM."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return COPY_BYTES
    fit = avail // 4 // (2 * max(1, ranks_on_host))
    return max(COPY_MIN_BYTES, min(COPY_BYTES, fit >> 20 << 20))


def memcpy_bandwidth(nbytes: int = COPY_BYTES, seconds: float = COPY_SECONDS, comm=None) -> float:
    """Sustained copy bandwidth of this process in bytes/s: numpy copies of `nbytes` back to
    back for `seconds` (at least two), bytes copied / time. With `comm` every rank of it starts
    after a barrier, so each rank's figure is what it gets while all of them copy: the memory
    bandwidth they share, and the cores when ranks outnumber them (a single short copy, as a
    best-of-a-few would time, mostly runs alone on a core and from the caches)."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages
    if comm is not None:
        comm.Barrier()
    t0 = time.perf_counter()
    copies = 0
    while True:
        np.copyto(dst, src)
        copies += 1
        elapsed = time.perf_counter() - t0
        if copies >= 2 and elapsed >= seconds:
            return copies * src.nbytes / elapsed


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
