"""Fits: the figures of a machine profile from measured times. Pure functions (no MPI, no
grid); the model's own formulas come from ``fourd._C.predict`` and
``fourd._C.memory_time_scale`` (cost_model.cpp), so a fit never restates them.

The profile behind ``auto`` (measure.measure, at init) solves one figure per collective:

- :func:`solve_bw`: the model's all-reduce time is A + B / bandwidth on one node, so two
  predictions give the bandwidth for which it predicts the time measured (the bandwidth terms
  credited at least a quarter of the time); :func:`flat_efficiency` is the model's flat time
  with efficiency 1 over the measured one, clamped to [0.05, 4];
- :func:`fit_cache`: the cache tier (cache_bytes, cache_bw_gain) of a copy sweep;
  :func:`streaming` restates a rate measured with some bytes in the cache as the model's
  streaming figure;
- :func:`correction_points`: measured / predicted per algorithm and size (the profile's
  ``corrections``), and :func:`still_measured`, which algorithms are worth timing at the next
  size.

The planner's profile (``fourd.calibrate()``, :func:`fit_profile`) fits by least squares over
message sizes on the calibration grid (x: ranks of a node, y: one rank per node), the ring
model (Chan et al., CCPE 2007) on each level:

    ring all-gather on p ranks:  t(n) = (p - 1) alpha + (p - 1)/p n s(n) / B

where s(n) is the model's memory time scale for the node's working set (every rank's n + n/p
bytes; 1 across nodes, where the wire is the bottleneck), so B is the streaming bandwidth and
sizes on both sides of the cache edge (1 KiB to 32 MiB) fit one line:

- x groups give intra_alpha (and the cache gain); intra_bw is then refitted on fourd's ring
  all-reduce on x (1-64 MiB, relative least squares of the model's bandwidth term,
  :func:`fit_rate`): on few ranks an all-gather step copies slower per byte than the
  all-reduce's steps;
- y groups give inter_alpha and each rank's network share b; the profile stores nic_bw = b and
  nics_per_node = ranks per node, so that nodeInjectionBw / R = b;
- flat_efficiency = the model's flat time with efficiency 1 / the measured flat time
  (float32 all-reduce on x at 8 and 32 MiB, geometric mean), flat_efficiency_16 likewise in
  bfloat16;
- shm_bw from shm all-reduces on x (the copy term of the model, least squares through the
  origin after the barriers and the reduction are taken off, :func:`fit_shm`);
- shm_reduce_bw_16 and reduce_bw_16 from bfloat16 shm and ring all-reduces on x (fit_rate),
  when the measure takes a dtype; otherwise the local kernels' figures stay.

fit_profile takes a ``measure(collective, axis, algorithm, nbytes[, dtype])`` function, so it
is tested against times the C++ model generates, without MPI.
"""

from __future__ import annotations

import os

import numpy as np

from .. import _C
from .fields import Profile, to_native

# The local kernels' buffers (measure.measure_kernels): the float32 kernel and the copy run on
# KERNEL_BYTES (past the caches), the 16-bit kernels on KERNEL16_BYTES (in the cache).
KERNEL_BYTES = 32 << 20
KERNEL16_BYTES = 1 << 20
# Between virtual nodes (one machine's memory) the points across nodes stop at this size,
# which keeps the init of such layouts short; between real nodes every size is measured.
_VIRTUAL_SPANNING_MAX = 4 << 20
# Predicted this much slower than the best at the next size: not measured there. Above the
# calibration's own spread (the same calls timed up to 1.5x apart from one calibration to the
# next): at 1.25 noise pruned. The default sweep's calibration (4 ranks, x axis of 2 ranks)
# timed ring, rhd and shm reduce_scatter at 4 MiB 1.6-2.1x slower than flat, the benchmark
# then 0.8-1.1x flat; pruned, their 4 MiB factors held at 16 MiB, where `auto` ran flat at
# 1.65x ring's time.
_PRUNE = 2.0

# The planner's fit (fit_profile): all-gather output bytes, both sides of a CPU node's cache
# edge; all-reduce bytes for shm, for the ring's final intra_bw fit, and for flat.
INTRA_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23, 1 << 25, 1 << 26)
INTER_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23)
SHM_SIZES = (1 << 20, 1 << 22, 1 << 24)
RING_SIZES = (1 << 20, 1 << 22, 1 << 24, 1 << 26)
FLAT_SIZES = (1 << 23, 1 << 25)


# ---- the profile behind auto ------------------------------------------------------------------


def fit_cache(working_sets, bandwidths) -> tuple:
    """(cache_bytes, cache_bw_gain) from copy bandwidths measured at growing working sets
    (bytes touched: source + destination). The cache-resident bandwidth is the fastest seen,
    the streaming one the largest working set's; the cache size is half the working set at
    which the time per byte is halfway between them (the model keeps cache_bytes / W resident,
    so that is where it predicts the halfway time), interpolated on a log scale. (0, 1), no
    cache tier, when the bandwidth falls by less than 20%."""
    ws = [float(w) for w in working_sets]
    bw = [float(b) for b in bandwidths]
    fast, slow = max(bw), bw[-1]
    if len(ws) < 2 or fast < 1.2 * slow:
        return 0.0, 1.0
    mid = 0.5 * (1.0 / fast + 1.0 / slow)  # seconds per byte, halfway
    start = bw.index(fast)
    for i in range(start + 1, len(ws)):
        if 1.0 / bw[i] >= mid:
            lo, hi = 1.0 / bw[i - 1], 1.0 / bw[i]
            frac = 0.0 if hi <= lo else min(1.0, max(0.0, (mid - lo) / (hi - lo)))
            w_mid = ws[i - 1] * (ws[i] / ws[i - 1]) ** frac
            return w_mid / 2.0, fast / slow
    return 0.0, 1.0  # pragma: no cover - the last point is `slow`, so the loop returns


def streaming(rate: float, node_bytes: float, cache_bytes: float, gain: float) -> float:
    """A rate measured with `node_bytes` touched on the node, as the model's streaming figure
    (what it would be once the data no longer fit in the cache)."""
    prof = _C.MachineProfile(cache_bytes=cache_bytes, cache_bw_gain=gain)
    return rate * _C.memory_time_scale(prof, node_bytes)


def kernel_working_sets(k: int) -> dict:
    """Bytes one rank touches in each kernel of measure.measure_kernels (inputs plus output),
    by the profile field the kernel measures."""
    kk = max(2, k)
    piece = KERNEL16_BYTES // kk
    return {
        "memcpy_bw": 2 * KERNEL_BYTES,
        "reduce_bw": 3 * KERNEL_BYTES,
        "reduce_bw_16": 3 * KERNEL16_BYTES,
        "shm_reduce_bw_16": (kk + 1) * piece,
    }


def core_share(ranks_on_host: int) -> float:
    """The share of a core each rank gets when all `ranks_on_host` ranks compute at once."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return min(1.0, cores / max(1, ranks_on_host))


def solve_bw(
    d: dict, field: str, seconds: float, algorithm: str, nbytes: int, dtype: str, shape, base
) -> float:
    """The value of bandwidth `field` of profile `d` for which the model predicts `seconds` for
    an all-reduce: the model's time is A + B / field on one node, so two predictions give it.
    The bandwidth terms are credited at least a quarter of the time."""

    def t(x):
        return _C.predict(
            "all_reduce", algorithm, nbytes, dtype, shape, to_native({**d, field: x}, base)
        )

    fixed = t(1e30)
    per = t(1.0) - fixed
    return float(per / max(seconds - fixed, 0.25 * seconds))


def flat_efficiency(ideal: float, measured: float) -> float:
    """The library's efficiency: the model's time with efficiency 1 over the measured time,
    clamped to [0.05, 4]."""
    return _clamp_efficiency(ideal / measured)


def _clamp_efficiency(eff: float) -> float:
    return float(min(4.0, max(0.05, eff)))


def correction_points(
    collective: str,
    dtype: str,
    shape,
    prof,
    nbytes: int,
    rows: list,
    margin: float,
    next_nbytes: int | None = None,
) -> tuple:
    """(points, timed) from `rows` of (algorithm, in_place, measured seconds) at `nbytes`.
    points: the profile's ``corrections`` entries, measured / predicted by `prof` (cost_model.hpp,
    Correction), fourd's own algorithms multiplied by `margin` (the library's "flat" is not),
    clamped to [0.1, 10]; an algorithm the model cannot price gets none. timed: with
    `next_nbytes`, the rows as :func:`still_measured` takes them (the model at this size and
    at the next), else empty."""
    points, timed = [], []
    for alg, in_place, measured in rows:
        model = _C.predict(collective, alg, nbytes, dtype, shape, prof, in_place)
        if next_nbytes is not None:
            timed.append(
                (
                    alg,
                    measured,
                    model,
                    _C.predict(collective, alg, next_nbytes, dtype, shape, prof, in_place),
                )
            )
        if not (model > 0 and np.isfinite(model)):
            continue
        factor = measured / model * (1.0 if alg == "flat" else margin)
        points.append(
            {
                "collective": collective,
                "algorithm": alg,
                "group_size": int(shape.size),
                "nodes": int(shape.nodes),
                "half16": dtype == "bfloat16",
                "in_place": in_place,
                "nbytes": float(nbytes),
                "factor": min(10.0, max(0.1, factor)),
                "measured_s": measured,
            }
        )
    return points, timed


def still_measured(active: list, timed: list, prune: float = _PRUNE) -> list:
    """The algorithms of `active` worth measuring at the next size. `timed` holds (algorithm,
    measured seconds, model seconds at this size, model seconds at the next size) per timed
    placement. An algorithm's time at the next size is predicted with the factor measured here
    (its best placement); those predicted more than `prune` times the best prediction are
    dropped. An algorithm the model cannot price at both sizes is always kept. The prediction,
    not the time just measured, decides: the algorithms' ranks change as buffers leave the
    caches (4 ranks of the 2-core VM, bfloat16 in place: shm read 1.26x rhd's time at 4 MiB,
    and ran 0.75x and 0.67x rhd's time at 16 and 64 MiB)."""
    ahead, keep = {}, set()
    for alg, measured, model, later in timed:
        guess = measured / model * later if model > 0 and np.isfinite(model) else np.nan
        if np.isfinite(guess) and guess > 0:
            ahead[alg] = min(ahead.get(alg, np.inf), guess)
        else:
            keep.add(alg)
    if not ahead:
        return list(active)
    best = min(ahead.values())
    return [a for a in active if a in keep or ahead.get(a, np.inf) <= prune * best]


def spanning_sizes(sizes: tuple, virtual: bool) -> tuple:
    """The sizes measured across nodes: all of `sizes` between real nodes, up to
    _VIRTUAL_SPANNING_MAX between virtual ones."""
    return tuple(x for x in sizes if not virtual or x <= _VIRTUAL_SPANNING_MAX)


# ---- the planner's profile (fourd.calibrate) --------------------------------------------------


def _fit_line(xs, ys, relative: bool = True):
    """Least-squares t = a + b n, with a and b clamped to small positive values. `relative`:
    residuals weighted by 1/t, so that sizes spanning five orders of magnitude count alike (as
    the validation's relative errors do); else plain (the large sizes set the slope, which
    suits a shaped network link whose token bucket lets small messages burst at line rate)."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    w = 1.0 / np.maximum(y, 1e-12) if relative else None
    b, a = np.polyfit(x, y, 1, w=w)
    return max(a, 1e-9), max(b, 1e-15)


def _measure_level(measure, axis: str, sizes, algorithm: str):
    try:
        return [measure("all_gather", axis, algorithm, n) for n in sizes], algorithm
    except ValueError:
        # The algorithm is not built into this fourd (rejected on every rank before any
        # communication): fit the library's own all-gather, a ring for large sizes.
        if algorithm == "flat":
            raise
        return [measure("all_gather", axis, "flat", n) for n in sizes], "flat"


def fit_level(measure, axis: str, p: int, sizes, algorithm: str = "ring", relative: bool = True):
    """(alpha, bandwidth, algorithm measured) of one level from ring all-gather timings on
    groups of p ranks; None when p < 2. `relative`: see _fit_line."""
    if p < 2:
        return None
    times, algorithm = _measure_level(measure, axis, sizes, algorithm)
    a, b = _fit_line(sizes, times, relative)
    return a / (p - 1), (p - 1) / p / b, algorithm


def fit_level_cached(measure, axis: str, p: int, sizes, resident, algorithm: str = "ring"):
    """(alpha, streaming bandwidth, cache_bw_gain, algorithm measured) of a level whose
    transfers are memory copies, from ring all-gather timings on groups of p ranks:

        t(n) = (p - 1) alpha + (p - 1)/p n (f(n) / Bc + (1 - f(n)) / Bs)

    with f = resident(n) the model's resident fraction of the node's working set, fitted by
    least squares in relative terms; the gain is Bc / Bs. This measures the gain with every
    rank of the node copying at once (a lone rank's copy sweep sees more memory bandwidth per
    rank). None when p < 2; the gain is None (and the fit a plain line) when the sizes do not
    pin it: no size on each side of the cache edge, or a fit without Bs <= Bc."""
    if p < 2:
        return None
    times, algorithm = _measure_level(measure, axis, sizes, algorithm)
    y = np.asarray(times, dtype=float)
    f = np.asarray([resident(n) for n in sizes], dtype=float)
    x = (p - 1) / p * np.asarray(sizes, dtype=float)
    cols = np.stack([np.full_like(x, p - 1.0), x * f, x * (1 - f)], axis=1)
    w = 1.0 / np.maximum(y, 1e-12)
    coef = np.linalg.lstsq(cols * w[:, None], y * w, rcond=None)[0]
    if f.max() > 0.99 and f.min() < 0.5 and coef[1] > 0 and coef[2] >= coef[1]:
        return max(float(coef[0]), 1e-9), 1.0 / coef[2], float(coef[2] / coef[1]), algorithm
    a, b = _fit_line(sizes, times)
    return a / (p - 1), (p - 1) / p / b, None, algorithm


def _resident(prof: Profile, collective: str, p: int, ranks_per_node: int):
    """resident(nbytes): the model's resident fraction of the node's working set (all ranks)."""

    def resident(n: int) -> float:
        per_rank = 2.0 * n if collective == "all_reduce" else n + n / p
        if prof.cache_bytes <= 0 or prof.cache_bw_gain <= 1:
            return 1.0
        return min(1.0, prof.cache_bytes / (ranks_per_node * per_rank))

    return resident


def fit_profile(
    measure,
    *,
    ranks_per_node: int,
    nodes: int,
    base: Profile | None = None,
    name: str = "calibrated",
    local=None,
    cache=None,
) -> Profile:
    """A profile from timings. `measure(collective, axis, algorithm, nbytes)` returns seconds
    on the calibration grid (x: ranks_per_node ranks of a node; y: one rank per node);
    `local` is a dict of locally measured reduce_bw, memcpy_bw, compute_flops, memory_bytes
    (and the 16-bit rates); `cache` is (cache_bytes, cache_bw_gain) or None (kept from `base`).
    Figures that cannot be measured (no second node) are kept from `base`."""
    prof = (base or Profile()).replace(name=name, ranks_per_node=ranks_per_node, notes={})
    notes = {}
    if cache is not None:
        prof = prof.replace(cache_bytes=float(cache[0]), cache_bw_gain=float(cache[1]))
        notes["cache_bytes"] = notes["cache_bw_gain"] = "copy sweep 4-256 MiB on one rank"
    if local:
        prof = prof.replace(**{k: float(v) for k, v in local.items()})
        for k in local:
            notes[k] = "measured locally"
    prof = _fit_intra(measure, prof, notes, ranks_per_node, local)
    inter = fit_level(measure, "y", nodes, INTER_SIZES, relative=False)
    if inter is not None:
        prof = prof.replace(inter_alpha=inter[0], nic_bw=inter[1], nics_per_node=ranks_per_node)
        notes["inter_alpha"] = notes["nic_bw"] = (
            f"fit: {inter[2]} all-gather across nodes, all ranks on"
        )
    if ranks_per_node >= 2:
        prof = _fit_flat(measure, prof, notes, ranks_per_node)
        prof = _fit_shm_and_16bit(measure, prof, notes, ranks_per_node)
    return prof.replace(notes=notes)


def _fit_intra(measure, prof: Profile, notes: dict, k: int, local) -> Profile:
    """intra_alpha, intra_bw (and the cache gain, when the sizes straddle the cache edge) from
    the all-gathers on x; then intra_bw refitted on the ring all-reduce."""
    if prof.cache_bytes > 0 and prof.cache_bw_gain > 1:
        intra = fit_level_cached(measure, "x", k, INTRA_SIZES, _resident(prof, "all_gather", k, k))
    else:
        intra = fit_level(measure, "x", k, INTRA_SIZES)
        intra = intra and (intra[0], intra[1], None, intra[2])
    if intra is None:
        return prof
    prof = prof.replace(intra_alpha=intra[0], intra_bw=intra[1])
    notes["intra_alpha"] = notes["intra_bw"] = f"fit: {intra[3]} all-gather inside a node"
    if intra[2] is not None:
        prof = _restate_local_rates(prof, intra[2], k, local)
        notes["cache_bw_gain"] = (
            f"fit: {intra[3]} all-gather inside a node, sizes across the cache edge"
        )
    # The all-gather gives the latency and the cache gain; the bandwidth is then refitted on
    # the ring all-reduce that ring, rhd and hierarchical mostly run. Per byte, the two differ
    # on few ranks: on 2 ranks (a core each) a lone all-gather step copies slower than the
    # all-reduce's steps, whose copies overlap with the other rank's reduction (the
    # all-gather's fit gave a third of the all-reduce's bandwidth on the 2-core VM, half at 4
    # ranks).
    bw = fit_rate(measure, prof, "intra_bw", "ring", "float32", RING_SIZES, k)
    if bw is not None:
        prof = prof.replace(intra_bw=bw)
        notes["intra_bw"] = (
            f"fit: {intra[3]} all-gather inside a node (latency, cache "
            "gain), then ring all-reduce 1-64 MiB (bandwidth)"
        )
    return prof


def _restate_local_rates(prof: Profile, gain: float, k: int, local) -> Profile:
    """The profile with cache_bw_gain = `gain` and the locally measured memcpy_bw and reduce_bw
    restated under it: they were stated as streaming figures with a lone rank's gain, and are
    restated with the gain of every rank copying at once."""
    old = prof.native()
    prof = prof.replace(cache_bw_gain=gain)
    new = prof.native()
    for key in ("memcpy_bw", "reduce_bw"):
        touched = kernel_working_sets(k)[key]
        v = getattr(prof, key)
        if local and key in local and v > 0:
            node = k * touched
            prof = prof.replace(
                **{key: v / _C.memory_time_scale(old, node) * _C.memory_time_scale(new, node)}
            )
    return prof


def _fit_flat(measure, prof: Profile, notes: dict, k: int) -> Profile:
    """flat_efficiency (and flat_efficiency_16 when the measure takes a dtype) from the
    library's all-reduces on x, against the all-reduce's bandwidth like intra_bw: the
    library's all-gather relative to a model whose bandwidth is the all-reduce's would come
    out far below 1 on 2 ranks."""
    shape = _C.GroupShape(k, 1, k, True)
    ratios = []
    for n in FLAT_SIZES:
        ideal = _C.predict(
            "all_reduce", "flat", n, "float32", shape, prof.replace(flat_efficiency=1.0).native()
        )
        ratios.append(ideal / measure("all_reduce", "x", "flat", n))
    eff = float(np.exp(np.mean(np.log(ratios))))
    prof = prof.replace(flat_efficiency=_clamp_efficiency(eff))
    notes["flat_efficiency"] = (
        "model flat time / measured flat all-reduce, geometric "
        "mean over 8 and 32 MiB (both sides of the cache edge)"
    )
    # 16-bit floats: the library reduces them with a user-defined operator
    ratios = []
    try:
        for n in FLAT_SIZES:
            ideal = _C.predict(
                "all_reduce",
                "flat",
                n,
                "bfloat16",
                shape,
                prof.replace(flat_efficiency=1.0, flat_efficiency_16=0.0).native(),
            )
            ratios.append(ideal / measure("all_reduce", "x", "flat", n, "bfloat16"))
    except (TypeError, ValueError, ImportError):  # a measure without dtypes
        ratios = []
    if ratios:
        eff = float(np.exp(np.mean(np.log(ratios))))
        prof = prof.replace(flat_efficiency_16=_clamp_efficiency(eff))
        notes["flat_efficiency_16"] = (
            "model flat time / measured flat bfloat16 all-reduce, geometric mean over 8 and 32 MiB"
        )
    return prof


def _fit_shm_and_16bit(measure, prof: Profile, notes: dict, k: int) -> Profile:
    """shm_bw, then the 16-bit reduction rates from the bfloat16 all-reduces themselves, once
    the copy terms are fitted: a kernel timed alone does not see what the collective adds
    around it (shm's k-input kernel reads the window that every rank writes at once, with the
    rounds' barriers in between: measured 25-45% slower than the lone kernel on 2 ranks)."""
    shm = fit_shm(measure, prof, k)
    if shm is not None:
        prof = prof.replace(shm_bw=shm)
        notes["shm_bw"] = "fit: shm all-reduce inside a node (1-16 MiB)"
    for field, algorithm, sizes in (
        ("shm_reduce_bw_16", "shm", SHM_SIZES),
        ("reduce_bw_16", "ring", RING_SIZES),
    ):
        if algorithm == "shm" and shm is None:
            continue
        rate = fit_rate(measure, prof, field, algorithm, "bfloat16", sizes, k)
        if rate is not None:
            prof = prof.replace(**{field: rate})
            notes[field] = f"fit: {algorithm} bfloat16 all-reduce inside a node"
    return prof


def fit_rate(measure, prof: Profile, field: str, algorithm: str, dtype: str, sizes, k: int):
    """The value of rate `field` (a bandwidth, B/s) that best fits `algorithm`'s all-reduce
    timings on x (groups of k ranks on one node) at `sizes`. The model's time is
    fixed(n) + u(n) / field, so 1 / field is the least-squares slope through the origin of
    t - fixed against u, residuals weighted by 1/t (relative errors, as the validation counts
    them); the rate's terms are credited at least a quarter of each time. None when the
    measurement cannot run here (the measure raises ValueError, or has no `dtype` argument,
    or cannot make buffers of that dtype)."""
    shape = _C.GroupShape(k, 1, k, True)
    fixed_prof = prof.replace(**{field: 1e30}).native()
    unit_prof = prof.replace(**{field: 1.0}).native()
    num = den = 0.0
    for n in sizes:
        try:
            t = (
                measure("all_reduce", "x", algorithm, n)
                if dtype == "float32"
                else measure("all_reduce", "x", algorithm, n, dtype)
            )
        except (TypeError, ValueError, ImportError):
            return None
        fixed = _C.predict("all_reduce", algorithm, n, dtype, shape, fixed_prof)
        u = _C.predict("all_reduce", algorithm, n, dtype, shape, unit_prof) - fixed
        w = 1.0 / max(t, 1e-12) ** 2
        num += w * u * u
        den += w * u * max(t - fixed, 0.25 * t)
    return float(num / den) if den > 0 else None


def fit_shm(measure, prof: Profile, k: int):
    """shm_bw from shm all-reduce timings on x (SHM_SIZES): the model's time is
    fixed(n) + copy(n) / shm_bw, so shm_bw = sum copy^2 / sum copy (t - fixed) (least squares
    through the origin). None when shm cannot run here (the measure raises ValueError)."""
    shape = _C.GroupShape(k, 1, k, True)
    fixed_prof = prof.replace(shm_bw=1e30).native()
    unit_prof = prof.replace(shm_bw=1.0).native()
    num = den = 0.0
    for n in SHM_SIZES:
        try:
            t = measure("all_reduce", "x", "shm", n)
        except ValueError:
            return None
        fixed = _C.predict("all_reduce", "shm", n, "float32", shape, fixed_prof)
        copy = _C.predict("all_reduce", "shm", n, "float32", shape, unit_prof) - fixed
        num += copy * copy
        den += copy * max(t - fixed, 0.25 * t)
    return float(num / den) if den > 0 else None
