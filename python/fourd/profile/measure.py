"""Measurements of the machine, through fourd's public API only (Grid methods, Buffer), mpi4py
for the ping-pongs and barriers, and ``fourd._C.reduce_kernel_seconds`` for fourd's own
reduction kernels.

The profile behind ``auto`` (:func:`measure`, collective over the grid's communicator):

- intra-node ping-pong between rank 0 and another rank of its node: ``intra_alpha`` (half the
  round trip of 8 bytes) and ``intra_bw`` (4 MiB one way, latency removed);
- the same across nodes (real or virtual) when there are several: ``inter_alpha``, ``nic_bw``
  (one flow; ``nics_per_node`` = 1);
- rank 0 alone: the node's cache tier from a copy sweep over working sets of 4 to 256 MiB
  (:func:`measure_cache`: ``cache_bytes``, ``cache_bw_gain``), then its local kernels
  (:func:`measure_kernels`): ``memcpy_bw`` and ``reduce_bw`` (fourd's float32 sum kernel,
  bytes of one input per second, as the model's gamma counts them) on 32 MiB, stated as
  streaming figures; ``reduce_bw_16`` and ``shm_reduce_bw_16`` (fourd's bfloat16 pairwise and
  k-input kernels) on 1 MiB in the cache, times the core share when ranks outnumber cores;
- then real collectives (4 MiB all-reduces, every group of the axis at once), each solved for
  one figure with the model's own formula (fit.solve_bw), so that ``auto`` compares the
  algorithms as they really run here, ranks outnumbering cores included: ``intra_bw`` from
  fourd's ring and ``shm_bw`` from fourd's shared-memory all-reduce on the widest axis that
  sits on one node, then ``shm_reduce_bw_16`` and ``reduce_bw_16`` from the same two in
  bfloat16 (replacing the lone kernels' figures), then ``flat_efficiency`` from the library's
  float32 all-reduce on the whole grid, and ``flat_efficiency_16`` from its bfloat16 one (a
  user-defined operator). bfloat16 buffers are numpy uint16 arrays seen through
  ``fourd.Buffer.of(array, "bfloat16")``, so no torch is needed (importing it would take
  longer than the whole calibration);
- last, measured corrections of the model (:func:`measure_corrections`): every algorithm that
  can run on that one-node axis, timed at 8 KiB - 16 MiB: all_reduce in both dtypes and both
  placements, all_gather in both placements and reduce_scatter, in float32; then, where the
  grid has an axis of rails (one rank on each of several nodes), every algorithm on it at
  256 KiB - 16 MiB (the inter-node level of ``hierarchical`` chooses between ring and rhd
  from these), and on the widest axis whose groups have ranks on several nodes and several on
  a node, at 1 - 16 MiB, both in float32 out of place and only up to 4 MiB between virtual
  nodes; each axis's points in the grid's profile before the next axis is timed (so that
  hierarchical's levels run as they will); stored as measured / predicted (``corrections``,
  applied by cost_model.cpp).

fourd's own algorithms are priced 5% slower than measured, so `auto` leaves the library only
for a clear gain.

Ranks not taking part in a step wait in a sleeping barrier (:func:`quiet_barrier`), so they
do not steal the cores the measuring ranks need (ranks may outnumber cores). Ping-pongs and
kernels take the minimum over a few repetitions (the figure least disturbed by other load);
collectives the median repetition of the slowest rank.

For the planner's profile (``fourd.calibrate()``, fit.fit_profile): :func:`collective_timer`
times one collective of any size on the calibration grid (every group of the axis at once;
the median over 10 iterations per rank, then the slowest rank's), and :func:`measure_node`
the node's cache tier and every rank's local rates (the same kernels, all ranks at once; on
a GPU, torch kernels), compute_flops from a matmul and memory_bytes from the device (or the
host memory divided among the node's ranks).
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import numpy as np
from mpi4py import MPI

from .. import _C
from .._tensor import Buffer
from .fields import to_native
from .fit import (
    KERNEL16_BYTES,
    KERNEL_BYTES,
    core_share,
    correction_points,
    fit_cache,
    flat_efficiency,
    kernel_working_sets,
    solve_bw,
    spanning_sizes,
    still_measured,
    streaming,
)

_PINGPONG_BYTES = 4 << 20
_CACHE_SWEEP = tuple((4 << 20) << i for i in range(7))  # working sets 4 MiB .. 256 MiB
_COLLECTIVE_BYTES = 4 << 20
_CHUNKS = 4  # hierarchical pipelining depth written into a measured profile
# Measured corrections of the model (measure_corrections): sizes on the one-node axis, and
# interleaved rounds per size (fewer for the largest, which dominate the time).
_CORRECTION_SIZES = (8 << 10, 64 << 10, 512 << 10, 4 << 20, 16 << 20)
# What the corrections cover: (collective, dtypes, placements). all_gather moves bytes whatever
# their type, and a 16-bit reduce-scatter's own reduction rate is in the model already: both in
# float32 only (their points stand for the 16-bit calls too, cost_model.cpp). fourd's
# reduce_scatter has no in-place form.
_CORRECTION_PLAN = (
    ("all_reduce", ("float32", "bfloat16"), (False, True)),
    ("all_gather", ("float32",), (False, True)),
    ("reduce_scatter", ("float32",), (False,)),
)
# Across nodes (larger messages hold the last factor there, cost_model.cpp), float32 and out of
# place only (the network decides there, not the placement: in-place calls use these points;
# the calibration's in-place and out-of-place timings of one algorithm on the emulated 2 x 2
# cluster differed by up to 1.45x, noise that misled auto between them): on
# the rails (one rank per node; the inter-node level of "hierarchical" runs on them, and its
# ring or rhd is chosen from these points) from 256 KiB, and on the widest axis with both
# levels from 1 MiB (its calls are the slowest to time); both up to 16 MiB between real nodes
# (virtual nodes share one machine's memory: 4 MiB there, fit.spanning_sizes, where 16 MiB
# would only lengthen the init of every such layout). With 4 MiB as the largest point, the
# emulated 4 x 2 cluster timed flat, ring and hierarchical reduce_scatter alike there
# (21.5-22.4 ms), the held factors made flat the cheapest at 16 and 64 MiB, and it ran
# 1.7-1.8x slower than ring: MPICH's pattern of concurrent transfers loses more to the
# congested links as messages grow, which one alpha-beta figure per link cannot show.
_RAIL_SIZES = (256 << 10, 1 << 20, 4 << 20, 16 << 20)
_MIXED_SIZES = (1 << 20, 4 << 20, 16 << 20)
_SPANNING_PLAN = (
    ("all_reduce", ("float32",), (False,)),
    ("all_gather", ("float32",), (False,)),
    ("reduce_scatter", ("float32",), (False,)),
)
_SPANNING_ROUNDS_LARGE = 5  # one call a round: the network's spread needs more rounds
_CORRECTION_ROUNDS = 5
_CORRECTION_LARGE = 4 << 20  # from this size: fewer rounds, more untimed calls before each
_CORRECTION_ROUNDS_LARGE = 3
_CORRECTION_WARM_LARGE = 3
_BATCH_S = 2e-3  # a timed batch of calls lasts at least this long (barrier skew amortised)
# fourd's own algorithms are priced this much slower than measured, so that `auto` leaves the
# MPI library only for a gain beyond the noise (times that grow faster than linearly once
# buffers leave the caches are the model's cache tier to price, not the margin's).
_MARGIN = 1.05
_BF16_ONE = 0x3F80  # 1.0 in bfloat16 (the upper half of float32's 0x3F800000)
# numpy's view of each dtype timed, and the value 1 in it (bfloat16 as uint16 bits)
_TYPES = {"float32": (np.float32, 1.0), "bfloat16": (np.uint16, _BF16_ONE)}


# ---- point to point, the caches and the local kernels ---------------------------------------


def quiet_barrier(comm) -> None:
    """A barrier that sleeps while it waits, leaving the cores to the ranks still measuring."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def _pingpong(comm, a: int, b: int, nbytes: int, reps: int, batches: int) -> float | None:
    """One-way time of `nbytes` between ranks a and b (min over batches); None elsewhere."""
    me = comm.Get_rank()
    if me not in (a, b):
        return None
    peer = b if me == a else a
    buf = np.zeros(max(1, nbytes), np.uint8)
    best = float("inf")
    for _ in range(batches + 1):  # the first batch warms up
        t0 = time.perf_counter()
        for _ in range(reps):
            if me == a:
                comm.Send(buf, dest=peer, tag=77)
                comm.Recv(buf, source=peer, tag=77)
            else:
                comm.Recv(buf, source=peer, tag=77)
                comm.Send(buf, dest=peer, tag=77)
        best = min(best, (time.perf_counter() - t0) / reps / 2)
    return best


def _link(comm, a: int, b: int):
    """(alpha, bandwidth) between ranks a and b, known on rank 0 (None elsewhere)."""
    alpha = _pingpong(comm, a, b, 8, 50, 4)
    big = _pingpong(comm, a, b, _PINGPONG_BYTES, 2, 3)
    quiet_barrier(comm)
    if comm.Get_rank() != 0:
        return None
    return alpha, _PINGPONG_BYTES / max(big - alpha, 1e-9)


def measure_cache() -> tuple:
    """(cache_bytes, cache_bw_gain) of this node from a numpy copy sweep over working sets of
    4 MiB to 256 MiB (about a quarter of a second). Run it on one rank while the node's other
    ranks wait quietly: the cache is theirs to share when they all work."""
    big = _CACHE_SWEEP[-1] // 2
    src = np.ones(big // 4, np.float32)
    dst = np.ones(big // 4, np.float32)
    bws = []
    for w in _CACHE_SWEEP:
        a, b = dst[: w // 8], src[: w // 8]
        np.copyto(a, b)
        best = float("inf")
        for _ in range(2 if w > (64 << 20) else 3):
            t0 = time.perf_counter()
            np.copyto(a, b)
            best = min(best, time.perf_counter() - t0)
        bws.append(w / 2 / best)
    return fit_cache(_CACHE_SWEEP, bws)


def measure_kernels(
    cache_bytes: float, gain: float, k: int, ranks: int = 1, share: float = 1.0
) -> dict:
    """Rates of this rank's local kernels, with `ranks` ranks of the node measuring at once:
    memcpy_bw (numpy copy, 32 MiB) and reduce_bw (fourd's float32 sum kernel, 32 MiB) as
    streaming figures; reduce_bw_16 (its bfloat16 pairwise kernel) and shm_reduce_bw_16 (its
    k-input bfloat16 kernel, k >= 2) on 1 MiB, in the cache, times `share` (fit.core_share).
    Bytes of one input per second, as the model's gamma counts them."""
    n = KERNEL_BYTES
    ws = {key: ranks * v for key, v in kernel_working_sets(k).items()}
    a = np.ones(n // 4, np.float32)
    b = np.ones(n // 4, np.float32)
    np.copyto(a, b)
    t_copy = min(_timed(lambda: np.copyto(a, b)) for _ in range(3))
    out = {"memcpy_bw": streaming(n / t_copy, ws["memcpy_bw"], cache_bytes, gain)}
    t = _C.reduce_kernel_seconds("float32", n, 2, 3)
    out["reduce_bw"] = streaming(n / t, ws["reduce_bw"], cache_bytes, gain)
    # 16-bit kernels: bound by their instructions, measured in the cache (1 MiB) and times
    # `share`: the best of short runs is a run that had a core to itself, while in a
    # collective every rank of the node reduces at once
    m = KERNEL16_BYTES
    out["reduce_bw_16"] = share * m / _C.reduce_kernel_seconds("bfloat16", m, 2, 5)
    kk = max(2, k)
    piece = m // kk
    t = _C.reduce_kernel_seconds("bfloat16", piece, kk, 5, True)
    out["shm_reduce_bw_16"] = share * (kk - 1) * piece / t
    return out


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _best_of(f, reps: int = 5) -> float:
    """The shortest of `reps` timed runs of f, after one untimed run."""
    f()
    return min(_timed(f) for _ in range(reps))


# ---- collectives --------------------------------------------------------------------------------


def _as_buffer(a: np.ndarray, dtype: str):
    """`a` as fourd sees it: bfloat16 travels as numpy uint16 bits in a fourd.Buffer."""
    return Buffer.of(a, "bfloat16") if dtype == "bfloat16" else a


def _raw_all_reduce(grid, axis, algorithm: str, src: np.ndarray, dst: np.ndarray, dtype: str):
    """A callable running one blocking sum all_reduce of `src` into `dst` (the same array: in
    place) through the public API."""
    s, d = _as_buffer(src, dtype), _as_buffer(dst, dtype)
    out = None if src is dst else d

    def call():
        grid.all_reduce(s, axis, "sum", output=out, algorithm=algorithm)

    return call


def _raw_call(
    grid,
    axis,
    collective: str,
    algorithm: str,
    arena_in: np.ndarray,
    arena_out: np.ndarray,
    count: int,
    np_dtype,
    dtype: str,
    in_place: bool,
):
    """A callable running one blocking collective of `count` elements (the nccl-tests S: the
    gathered output of all_gather, the input of reduce_scatter) on buffers carved from the two
    arenas, as fourd.bench places them in place and out of place."""
    src = arena_in[: count * np.dtype(np_dtype).itemsize].view(np_dtype)
    out = arena_out[: count * np.dtype(np_dtype).itemsize].view(np_dtype)
    if collective == "all_reduce":
        return _raw_all_reduce(grid, axis, algorithm, src, src if in_place else out, dtype)
    blk = count // grid.size(axis)
    if collective == "all_gather":
        g = grid.rank(axis)
        inp = _as_buffer(out[g * blk : (g + 1) * blk] if in_place else src[:blk], dtype)
        o = _as_buffer(out, dtype)

        def call():
            grid.all_gather(o, inp, axis, algorithm=algorithm)

        return call
    i, o = _as_buffer(src, dtype), _as_buffer(out[:blk], dtype)

    def call():
        grid.reduce_scatter(o, i, axis, "sum", algorithm=algorithm)

    return call


def _time_collective(grid, axis, algorithm: str, reps: int = 5, dtype: str = "float32") -> float:
    """Slowest rank's time of one all_reduce of _COLLECTIVE_BYTES (median over reps)."""
    comm = grid.mpi_comm
    if dtype == "bfloat16":
        buf = np.full(_COLLECTIVE_BYTES // 2, _BF16_ONE, np.uint16)
        once = _raw_all_reduce(grid, axis, algorithm, buf, buf, "bfloat16")
    else:
        buf = np.ones(_COLLECTIVE_BYTES // 4, np.float32)

        def once():
            grid.all_reduce(buf, axis, algorithm=algorithm)

    once()  # warm-up (windows, sub-communicators)
    times = np.empty(reps)
    for i in range(reps):
        quiet_barrier(comm)
        t0 = time.perf_counter()
        once()
        times[i] = time.perf_counter() - t0
    slowest = np.empty(reps)
    comm.Allreduce(times, slowest, op=MPI.MAX)
    # The median repetition of the slowest rank: a minimum favoured whichever algorithm varies
    # most (the library's, with ranks sharing cores), and `auto` then picked it where it ran
    # 1.6-3.4x slower than shm.
    return float(np.median(slowest))


def _median_rounds(
    comm, calls: list, large: bool, rounds_large: int = _CORRECTION_ROUNDS_LARGE
) -> np.ndarray:
    """The slowest rank's time of each callable, the median over rotated rounds (the same
    figures on every rank). Collective over `comm`."""
    if large:  # one call is a batch; warm-up happens before each timing
        batch = [1] * len(calls)
        rounds, warm = rounds_large, _CORRECTION_WARM_LARGE
    else:  # how many calls make _BATCH_S (the slowest rank's estimate, agreed)
        est = np.empty(len(calls))
        for i, call in enumerate(calls):
            call()
            t0 = time.perf_counter()
            call()
            est[i] = time.perf_counter() - t0
        comm.Allreduce(MPI.IN_PLACE, est, op=MPI.MAX)
        batch = [max(1, min(64, int(np.ceil(_BATCH_S / max(e, 1e-7))))) for e in est]
        rounds, warm = _CORRECTION_ROUNDS, 1
    times = np.empty((rounds, len(calls)))
    for r in range(rounds):
        for j in range(len(calls)):
            i = (j + r) % len(calls)
            call, m = calls[i], batch[i]
            # Untimed calls first: the first calls after another algorithm ran up to 2x slower
            # (16 MiB on 2 ranks: rhd settles over 4-12 calls, ring and shm over 1-3), and a
            # run of calls of one algorithm, as in training or in fourd.bench, does not pay it.
            for _ in range(warm):
                call()
            comm.Barrier()  # every rank works here; a sleeping one would start cold
            t0 = time.perf_counter()
            for _ in range(m):
                call()
            times[r, i] = (time.perf_counter() - t0) / m
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    med = np.median(times, axis=0)
    q1, q3 = np.percentile(times, [25, 75], axis=0)
    _SPREADS.extend(float(x) for x in (q3 - q1) / np.maximum(med, 1e-12))
    return med


# The relative spread (interquartile range over median) of the rounds of every call timed by
# the current measurement: a busy machine spreads them (fit.busy reads their median).
_SPREADS: list = []


def measure_corrections(
    grid,
    axis,
    margin: float = 1.0,
    plan=_CORRECTION_PLAN,
    sizes=_CORRECTION_SIZES,
    rounds_large: int = _CORRECTION_ROUNDS_LARGE,
) -> list:
    """Measured / predicted times of every algorithm that can run on `axis`, at `sizes`, for
    what `plan` lists (by default _CORRECTION_PLAN: all_reduce in float32 and bfloat16, out of
    place and in place; all_gather out of place and in place and reduce_scatter out of place,
    in float32): the profile's ``corrections`` (cost_model.hpp, Correction). Collective over
    the grid's ranks.

    The model prices the algorithms from a few fitted figures; on a node whose cores the ranks
    share, the choice between shm, ring and rhd turns on 10-30% effects it does not capture,
    and at a few KiB on latencies it prices from one ping-pong. These points pin each
    algorithm's prediction to its measured time at the sizes measured (interpolated in
    between; cost_model.hpp says what happens beyond). Each round times every (algorithm,
    placement) once, in an order rotated from round to round so that drifting load falls on
    all alike: untimed calls first, a barrier, then a batch of calls lasting at least _BATCH_S
    (its length agreed by all ranks); the slowest rank's time; the median round. From
    _CORRECTION_LARGE on, only the algorithms fit.still_measured keeps are timed at the
    next size (the others' last factor holds at the larger sizes). fourd's own algorithms are
    multiplied by `margin` (the library's are not)."""
    shape = _shape(grid, axis)
    # Predicted as `auto` will predict: with the points of the other axes measured so far (the
    # levels of hierarchical use them), without any of this axis's own shape.
    current = grid.profile
    others = [
        c
        for c in current.corrections
        if (c["group_size"], c["nodes"]) != (int(shape.size), int(shape.nodes))
    ]
    run = _CorrectionRun(
        grid,
        axis,
        shape,
        to_native({"corrections": others}, current),
        margin,
        rounds_large,
        sizes[-1],
    )
    out = []
    for collective, dtypes, placements in plan:
        ex = grid.explain(collective, sizes[-1], axis)
        algs = [c["algorithm"] for c in ex["candidates"] if c["candidate"]]
        for dtype in dtypes:
            out += run.sweep(collective, dtype, placements, algs, sizes)
    return out


class _CorrectionRun:
    """What every sweep of one measure_corrections call shares: the axis, its shape, the
    profile predictions are made with, and two arenas the buffers of every size are carved
    from. The arenas are made (and written) once, at the largest size, before the smallest is
    timed: arrays made just before their size was timed read ring and rhd at 16 MiB up to
    1.6x slower than their steady speed."""

    def __init__(self, grid, axis, shape, prof, margin: float, rounds_large: int, largest: int):
        self.grid, self.axis, self.shape, self.prof = grid, axis, shape, prof
        self.margin, self.rounds_large = margin, rounds_large
        self.arena_in = np.zeros(largest, np.uint8)
        self.arena_out = np.zeros(largest, np.uint8)
        self.arena_in.fill(1)
        self.arena_out.fill(1)

    def sweep(self, collective: str, dtype: str, placements, algs: list, sizes) -> list:
        """The points of `collective` in `dtype` over `sizes`, every algorithm of `algs` still
        worth measuring in every placement."""
        grid, axis = self.grid, self.axis
        np_dtype, one = _TYPES[dtype]
        item = np.dtype(np_dtype).itemsize
        p = grid.size(axis)
        active = list(algs)
        out = []
        for i, size in enumerate(sizes):
            count = size // item
            if collective != "all_reduce":
                count -= count % p  # a block per rank (nccl-tests rounding)
            if count == 0:
                continue
            nbytes = count * item
            self.arena_in[:nbytes].view(np_dtype).fill(one)
            calls = [
                (
                    alg,
                    in_place,
                    _raw_call(
                        grid,
                        axis,
                        collective,
                        alg,
                        self.arena_in,
                        self.arena_out,
                        count,
                        np_dtype,
                        dtype,
                        in_place,
                    ),
                )
                for alg in active
                for in_place in placements
            ]
            large = nbytes >= _CORRECTION_LARGE
            med = _median_rounds(grid.mpi_comm, [c[2] for c in calls], large, self.rounds_large)
            nxt = sizes[i + 1] if i + 1 < len(sizes) else None
            prune = large and nxt is not None  # below, latency and caches decide
            rows = [(alg, in_place, float(med[j])) for j, (alg, in_place, _) in enumerate(calls)]
            points, timed = correction_points(
                collective,
                dtype,
                self.shape,
                self.prof,
                nbytes,
                rows,
                self.margin,
                nxt if prune else None,
            )
            out += points
            if prune:
                active = still_measured(active, timed)
        return out


# ---- the axes measured --------------------------------------------------------------------------


def _shape(grid, axis):
    t = grid.topology(axis)
    k = t["k"] if t["uniform"] else 0
    return _C.GroupShape(t["size"], t["num_nodes"], k if k else 1, bool(t["uniform"]))


def _widest_axis(grid, fits):
    """The widest axis (name tuple) with >= 2 ranks per group for which `fits(nodes of a group's
    ranks)` holds for every group, or None. Decided from every rank's placement, so that all
    ranks pick the same axis (groups of one axis may sit differently on uneven nodes)."""
    n = grid.world_size
    nodes = [grid.node_of(r) for r in range(n)]
    ranks = _C.ProcessGrid(sizes=[grid.shape[a] for a in _C.AXES], order=grid.order)
    best, best_size = None, 1
    for mask in range(1, _C.WORLD_MASK + 1):
        size = ranks.group_size(mask)
        if size <= best_size:
            continue
        if all(fits([nodes[m] for m in ranks.group_ranks(r, mask)]) for r in range(n)):
            best = tuple(a for i, a in enumerate(_C.AXES) if mask >> i & 1)
            best_size = size
    return best


def _one_node_axis(grid):
    """The widest axis whose groups each sit on one node."""
    return _widest_axis(grid, lambda g: len(set(g)) == 1)


def _rail_axis(grid):
    """The widest axis whose groups each hold one rank on each of >= 2 nodes (the rails of
    "hierarchical")."""
    return _widest_axis(grid, lambda g: len(set(g)) == len(g))


def _mixed_axis(grid):
    """The widest axis whose groups each span >= 2 nodes with more than one rank on some (where
    "hierarchical" runs its two levels)."""
    return _widest_axis(grid, lambda g: 1 < len(set(g)) < len(g))


# ---- the profile behind auto --------------------------------------------------------------------


def measure(grid) -> dict:
    """Measures a profile (collective over the grid's ranks); the same dict on every rank, and
    the grid's profile once it returns. Adds ``calibration_seconds`` (not a profile field)."""
    comm = grid.mpi_comm.Dup()
    try:
        t0 = time.perf_counter()
        load0 = os.getloadavg()[0]
        _SPREADS.clear()
        d = _links_and_kernels(grid, comm)
        axis = _one_node_axis(grid)
        d = _solved_collectives(grid, comm, d, axis)
        d = _all_corrections(grid, comm, d, axis)
        d["calibration_seconds"] = time.perf_counter() - t0
        # Rank 0's figures, the same on every rank.
        d["calibration_spread"], d["calibration_load"] = comm.bcast(
            (float(np.median(_SPREADS)) if _SPREADS else 0.0, (load0, os.getloadavg()[0])),
            root=0,
        )
        return d
    finally:
        comm.Free()


def _links_and_kernels(grid, comm) -> dict:
    """The profile dict with the ping-pongs', the cache sweep's and the kernels' figures (rank
    0's, on every rank), given to the grid."""
    n = comm.Get_size()
    me = comm.Get_rank()
    nodes = [grid.node_of(r) for r in range(n)]
    per_node = max(nodes.count(k) for k in set(nodes))
    d = grid.profile.to_dict()
    d.update(
        name=f"calibrated:{socket.gethostname()}",
        ranks_per_node=per_node,
        nics_per_node=1,
        hierarchical_chunks=_CHUNKS,
        shm_bw=0.0,
        flat_efficiency=1.0,
        flat_efficiency_16=0.0,
        corrections=[],
    )
    intra_peer = next((r for r in range(1, n) if nodes[r] == nodes[0]), None)
    inter_peer = next((r for r in range(1, n) if nodes[r] != nodes[0]), None)
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    on_host = shared.Get_size()  # ranks sharing this machine's cores (virtual nodes too)
    shared.Free()
    intra = _link(comm, 0, intra_peer) if intra_peer is not None else None
    inter = _link(comm, 0, inter_peer) if inter_peer is not None else None
    if me == 0:
        cache = measure_cache()
        local = measure_kernels(*cache, k=per_node, share=core_share(on_host))
    quiet_barrier(comm)
    if me == 0:
        d["cache_bytes"], d["cache_bw_gain"] = cache
        if intra:  # two ranks, a 4 MiB buffer each: converted to the streaming figure
            d["intra_alpha"] = intra[0]
            d["intra_bw"] = streaming(intra[1], 2 * _PINGPONG_BYTES, *cache)
        if inter:
            d["inter_alpha"], d["nic_bw"] = inter
        elif intra:  # one node: keep the model's inter level consistent with what was seen
            d["inter_alpha"] = max(d["inter_alpha"], intra[0])
            d["nic_bw"] = min(d["nic_bw"], intra[1])
        d.update(local)
    d = comm.bcast(d, root=0)
    grid.set_profile(to_native(d, grid.profile))
    return d


def _solved_collectives(grid, comm, d: dict, axis) -> dict:
    """Then real collectives, fitted to the model's own formulas, so that `auto` compares the
    algorithms as they run here (ranks may outnumber cores: a ping-pong between two ranks
    alone would flatter the ring): the one-node axis's bandwidths and 16-bit rates, then the
    library's efficiencies on the whole grid. Given to the grid."""
    nbytes = _COLLECTIVE_BYTES
    if axis is not None:
        shape = _shape(grid, axis)
        base = grid.profile
        # ring all-reduce: the model's 2(k-1) alpha + (k-1)/k n gamma + 2(k-1)/k n / intra_bw
        # (scaled by the cache tier) solved for intra_bw
        t = _time_collective(grid, axis, "ring")
        d["intra_bw"] = solve_bw(d, "intra_bw", t, "ring", nbytes, "float32", shape, base) / _MARGIN
        grid.set_profile(to_native(d, base))
        # shm all-reduce: (2 - 1/k) n / shm_bw + (k-1)/k n gamma (+ barriers), likewise
        t = _time_collective(grid, axis, "shm")
        d["shm_bw"] = solve_bw(d, "shm_bw", t, "shm", nbytes, "float32", shape, base) / _MARGIN
        # 16-bit reduction rates from the same two collectives in bfloat16, solved after the
        # copy terms: the kernels timed alone miss what the collectives add around them (shm's
        # k-input kernel reads the window every rank writes at once, between barriers: 25-45%
        # slower than the lone kernel on 2 ranks of the 2-core VM)
        for field, algorithm in (("shm_reduce_bw_16", "shm"), ("reduce_bw_16", "ring")):
            t = _time_collective(grid, axis, algorithm, dtype="bfloat16")
            d[field] = solve_bw(d, field, t, algorithm, nbytes, "bfloat16", shape, base) / _MARGIN
        grid.set_profile(to_native(d, grid.profile))
    if comm.Get_size() > 1:
        world = _shape(grid, "world")
        measured = _time_collective(grid, "world", "flat")
        ideal = _C.predict(
            "all_reduce",
            "flat",
            nbytes,
            "float32",
            world,
            to_native({"flat_efficiency": 1.0}, grid.profile),
        )
        d["flat_efficiency"] = flat_efficiency(ideal, measured)
        # 16-bit floats go through the library with a user-defined operator: their own
        # efficiency
        measured = _time_collective(grid, "world", "flat", dtype="bfloat16")
        ideal = _C.predict(
            "all_reduce",
            "flat",
            nbytes,
            "bfloat16",
            world,
            to_native({"flat_efficiency": 1.0, "flat_efficiency_16": 0.0}, grid.profile),
        )
        d["flat_efficiency_16"] = flat_efficiency(ideal, measured)
    d = comm.bcast(d, root=0)
    grid.set_profile(to_native(d, grid.profile))
    return d


def _all_corrections(grid, comm, d: dict, axis) -> dict:
    """Last, with every fitted figure in place, measured corrections of the model: first on
    the node's groups (`axis`), where the algorithms' real differences are smallest and matter
    most; then across nodes, on the rails, where the network decides between ring and rhd
    (the inter-node level of hierarchical too), and on the widest axis with both levels, where
    it decides whether hierarchical's extra intra-node traffic pays (on the emulated 4 x 2
    cluster, 8 ranks on 2 cores, the model priced hierarchical all_gather at 0.45x ring at
    16 MiB; it ran 1.1-1.3x slower).

    Each axis's points go into the grid's profile before the next axis is timed: the levels of
    "hierarchical" choose their algorithms from it (shm, ring or rhd on the node; ring or rhd
    on the rails), and must time as they will run after calibration. Timed with the
    uncorrected levels, hierarchical read 1.5-2x slower on the emulated 2 x 2 cluster than the
    benchmark then measured it, and `auto` passed it over."""
    virtual = grid.virtual_topology
    steps = (
        (axis, _CORRECTION_PLAN, _CORRECTION_SIZES, _CORRECTION_ROUNDS_LARGE),
        (
            _rail_axis(grid),
            _SPANNING_PLAN,
            spanning_sizes(_RAIL_SIZES, virtual),
            _SPANNING_ROUNDS_LARGE,
        ),
        (
            _mixed_axis(grid),
            _SPANNING_PLAN,
            spanning_sizes(_MIXED_SIZES, virtual),
            _SPANNING_ROUNDS_LARGE,
        ),
    )
    for ax, plan, sizes, rounds_large in steps:
        if ax is not None:
            d["corrections"] += measure_corrections(grid, ax, _MARGIN, plan, sizes, rounds_large)
            grid.set_profile(to_native(d, grid.profile))
    return comm.bcast(d, root=0)


# ---- the planner's profile (fourd.calibrate) -----------------------------------------------------


def collective_timer(grid, comm, iters: int = 10):
    """measure(collective, axis, algorithm, nbytes, dtype="float32"): the median over
    iterations of the slowest rank's time, all groups of the axis running at once (what
    fit.fit_profile takes). bfloat16 buffers are numpy uint16 arrays of 1.0 through
    fourd.Buffer."""

    def buffers(p: int, nbytes: int, dtype: str):
        if dtype == "bfloat16":
            elems = max(p, (nbytes // 2) // p * p)
            return (
                Buffer.of(np.full(elems, _BF16_ONE, np.uint16), "bfloat16"),
                Buffer.of(np.full(elems // p, _BF16_ONE, np.uint16), "bfloat16"),
            )
        elems = max(p, (nbytes // 4) // p * p)
        return np.ones(elems, dtype=np.float32), np.ones(elems // p, dtype=np.float32)

    def measure(
        collective: str, axis: str, algorithm: str, nbytes: int, dtype: str = "float32"
    ) -> float:
        big, small = buffers(grid.size(axis), nbytes, dtype)

        def once():
            if collective == "all_gather":
                grid.all_gather(big, small, axis, algorithm=algorithm)
            elif collective == "reduce_scatter":
                grid.reduce_scatter(small, big, axis, algorithm=algorithm)
            else:
                grid.all_reduce(big, axis, algorithm=algorithm)

        once()
        once()
        samples = []
        for _ in range(iters):
            comm.Barrier()
            t0 = time.perf_counter()
            once()
            samples.append(time.perf_counter() - t0)
        slowest = comm.allreduce(statistics.median(samples), op=MPI.MAX)
        return float(slowest)

    return measure


def on_gpu() -> bool:
    """Whether torch is importable and sees a CUDA device (the planner then times torch's
    kernels instead of fourd's CPU ones)."""
    try:
        import torch  # noqa: PLC0415 - optional, and slow to import

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is optional
        return False


def measure_node(comm, ranks_per_node: int) -> tuple:
    """(cache, local) for the planner's fit: on a CPU the node's cache tier from rank 0's copy
    sweep while the others wait quietly (None on a GPU), then every rank's local rates
    (:func:`measure_local`), the slowest rank's figure of each. Collective over `comm`."""
    cache = None
    if not on_gpu():
        cache = measure_cache() if comm.Get_rank() == 0 else None
        quiet_barrier(comm)
        cache = comm.bcast(cache, root=0)
    local = measure_local(ranks_per_node, cache, comm)
    # every rank reports; keep the slowest rank's figures
    local = {k: comm.allreduce(v, op=MPI.MIN) for k, v in local.items()}
    return cache, local


def measure_local(ranks_per_node: int, cache=None, comm=None) -> dict:
    """reduce_bw, memcpy_bw, compute_flops and memory_bytes of this rank's device (on a CPU
    also reduce_bw_16 and shm_reduce_bw_16), every rank at once; `cache` is the node's
    (cache_bytes, cache_bw_gain), to state the CPU rates as streaming figures. `comm` (default
    MPI.COMM_WORLD) tells how many ranks share this host's cores."""
    if on_gpu():
        return _measure_gpu_local()
    comm = MPI.COMM_WORLD if comm is None else comm
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    share = core_share(shared.Get_size())
    shared.Free()
    out = measure_kernels(
        *(cache or (0.0, 1.0)), k=ranks_per_node, ranks=ranks_per_node, share=share
    )
    m = 512
    x = np.random.default_rng(0).standard_normal((m, m)).astype(np.float32)
    t_mm = _best_of(lambda: x @ x)
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        host = 8e9
    out.update(compute_flops=2 * m**3 / t_mm, memory_bytes=float(host / ranks_per_node))
    return out


def _measure_gpu_local() -> dict:
    """The local rates of this rank's GPU from torch kernels (64 Mi elements, an 8192^2
    bfloat16 matmul) and its memory."""
    import torch  # noqa: PLC0415 - only on a GPU

    dev = torch.device("cuda", torch.cuda.current_device())
    n = 1 << 26
    a = torch.ones(n, dtype=torch.float32, device=dev)
    b = torch.ones_like(a)

    def timed(f, reps=10):
        f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    t_add = timed(lambda: a.add_(b))
    t_copy = timed(lambda: a.copy_(b))
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    t_mm = timed(lambda: x @ x, reps=5)
    return {
        "reduce_bw": 4 * n / t_add,
        "memcpy_bw": 4 * n / t_copy,
        "compute_flops": 2 * m**3 / t_mm,
        "memory_bytes": float(torch.cuda.get_device_properties(dev).total_memory),
    }
