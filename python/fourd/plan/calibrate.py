"""Measure a machine profile with fourd's own collectives.

Run under mpiexec with at least two (virtual) nodes' worth of ranks::

    mpiexec -n 8 python -m mpi4py -m fourd.plan --calibrate --ranks-per-node 4 --out my.json

The grid is x = ranks per node (node-local groups) by y = nodes (one rank per node, every
rank of a node active at once, as in training). First the node's cache tier: a copy sweep on
rank 0 alone (working sets 4-256 MiB) gives cache_bytes (the last-level cache the node's ranks
share) and cache_bw_gain (cache-resident over streaming bandwidth). Then fits, by least squares
over message sizes, the ring model (Chan et al., CCPE 2007) on each level:

    ring all-gather on p ranks:  t(n) = (p - 1) alpha + (p - 1)/p n s(n) / B

where s(n) is the model's memory time scale for the node's working set (every rank's n + n/p
bytes; 1 across nodes, where the wire is the bottleneck), so B is the streaming bandwidth and
sizes on both sides of the cache edge (1 KiB to 32 MiB) fit one line:

- x groups give intra_alpha (and the cache gain); intra_bw is then refitted on fourd's ring
  all-reduce on x (1-64 MiB, relative least squares of the model's bandwidth term, fit_rate):
  on few ranks an all-gather step copies slower per byte than the all-reduce's steps;
- y groups give inter_alpha and each rank's network share b; the profile stores nic_bw = b and
  nics_per_node = ranks per node, so that nodeInjectionBw / R = b;
- flat_efficiency = the model's flat time with efficiency 1 / the measured flat time
  (float32 all-reduce on x at 8 and 32 MiB, geometric mean), flat_efficiency_16 likewise in
  bfloat16;
- shm_bw from shm all-reduces on x at the same sizes (the copy term of the model, least
  squares through the origin after the barriers and the reduction are taken off);
- shm_reduce_bw_16 and reduce_bw_16 from bfloat16 shm and ring all-reduces on x (fit_rate),
  when the measure takes a dtype (torch present); otherwise the kernels' figures below;
- reduce_bw (float32), reduce_bw_16 (bfloat16, pairwise kernel), shm_reduce_bw_16 (bfloat16,
  shm's k-input kernel) from fourd's own reduction kernels and memcpy_bw from a numpy copy, every
  rank at once (fourd.calibration.measure_kernels; on a GPU, torch kernels), converted to
  streaming figures; compute_flops from a matmul, memory_bytes from the device (or the host
  memory divided among the node's ranks).

The fit is pure (fit_profile takes a `measure` function), so it is tested without MPI.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from .model import native_module
from .profiles import Profile, save_profile

# all-gather output bytes; both sides of a CPU node's cache edge
INTRA_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23, 1 << 25, 1 << 26)
INTER_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23)
SHM_SIZES = (1 << 20, 1 << 22, 1 << 24)  # all-reduce bytes
RING_SIZES = (1 << 20, 1 << 22, 1 << 24, 1 << 26)  # all-reduce bytes: intra_bw's final fit
FLAT_SIZES = (1 << 23, 1 << 25)


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


def fit_level(measure, axis: str, p: int, sizes, algorithm: str = "ring",
              relative: bool = True):
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


def fit_profile(measure, *, ranks_per_node: int, nodes: int, base: Profile | None = None,
                name: str = "calibrated", local=None, cache=None) -> Profile:
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
    if prof.cache_bytes > 0 and prof.cache_bw_gain > 1:
        intra = fit_level_cached(measure, "x", ranks_per_node, INTRA_SIZES,
                                 _resident(prof, "all_gather", ranks_per_node, ranks_per_node))
    else:
        intra = fit_level(measure, "x", ranks_per_node, INTRA_SIZES)
        intra = intra and (intra[0], intra[1], None, intra[2])
    if intra is not None:
        prof = prof.replace(intra_alpha=intra[0], intra_bw=intra[1])
        notes["intra_alpha"] = notes["intra_bw"] = f"fit: {intra[3]} all-gather inside a node"
        if intra[2] is not None:
            # The local rates were stated as streaming figures with a lone rank's gain:
            # restate them with the gain of every rank copying at once.
            old = prof.native()
            prof = prof.replace(cache_bw_gain=intra[2])
            new = prof.native()
            c = native_module()
            from ..calibration import kernel_working_sets  # noqa: PLC0415

            for k in ("memcpy_bw", "reduce_bw"):
                touched = kernel_working_sets(ranks_per_node)[k]
                v = getattr(prof, k)
                if local and k in local and v > 0:
                    node = ranks_per_node * touched
                    prof = prof.replace(**{k: v / c.memory_time_scale(old, node)
                                           * c.memory_time_scale(new, node)})
            notes["cache_bw_gain"] = (f"fit: {intra[3]} all-gather inside a node, sizes "
                                      "across the cache edge")

    if intra is not None:
        # The all-gather gives the latency and the cache gain; the bandwidth is then refitted
        # on the ring all-reduce that ring, rhd and hierarchical mostly run. Per byte, the two
        # differ on few ranks: on 2 ranks (a core each) a lone all-gather step copies slower
        # than the all-reduce's steps, whose copies overlap with the other rank's reduction
        # (the all-gather's fit gave a third of the all-reduce's bandwidth on the 2-core VM,
        # half at 4 ranks).
        bw = fit_rate(measure, prof, "intra_bw", "ring", "float32", RING_SIZES, ranks_per_node)
        if bw is not None:
            prof = prof.replace(intra_bw=bw)
            notes["intra_bw"] = (f"fit: {intra[3]} all-gather inside a node (latency, cache "
                                 "gain), then ring all-reduce 1-64 MiB (bandwidth)")

    inter = fit_level(measure, "y", nodes, INTER_SIZES, relative=False)
    if inter is not None:
        prof = prof.replace(inter_alpha=inter[0], nic_bw=inter[1], nics_per_node=ranks_per_node)
        notes["inter_alpha"] = notes["nic_bw"] = (f"fit: {inter[2]} all-gather across nodes, "
                                                  "all ranks on")
    if ranks_per_node >= 2:
        c = native_module()
        shape = c.GroupShape(ranks_per_node, 1, ranks_per_node, True)
        # on the all-reduce, like intra_bw: the library's all-gather relative to a model
        # whose bandwidth is the all-reduce's would come out far below 1 on 2 ranks
        ratios = []
        for n in FLAT_SIZES:
            ideal = c.predict("all_reduce", "flat", n, "float32", shape,
                              prof.replace(flat_efficiency=1.0).native())
            ratios.append(ideal / measure("all_reduce", "x", "flat", n))
        eff = float(np.exp(np.mean(np.log(ratios))))
        prof = prof.replace(flat_efficiency=float(min(4.0, max(0.05, eff))))
        notes["flat_efficiency"] = ("model flat time / measured flat all-reduce, geometric "
                                    "mean over 8 and 32 MiB (both sides of the cache edge)")
        # 16-bit floats: the library reduces them with a user-defined operator
        ratios = []
        try:
            for n in FLAT_SIZES:
                ideal = c.predict("all_reduce", "flat", n, "bfloat16", shape,
                                  prof.replace(flat_efficiency=1.0,
                                               flat_efficiency_16=0.0).native())
                ratios.append(ideal / measure("all_reduce", "x", "flat", n, "bfloat16"))
        except (TypeError, ValueError, ImportError):  # a measure without dtypes; no torch
            ratios = []
        if ratios:
            eff = float(np.exp(np.mean(np.log(ratios))))
            prof = prof.replace(flat_efficiency_16=float(min(4.0, max(0.05, eff))))
            notes["flat_efficiency_16"] = ("model flat time / measured flat bfloat16 "
                                           "all-reduce, geometric mean over 8 and 32 MiB")
        shm = fit_shm(measure, prof, ranks_per_node)
        if shm is not None:
            prof = prof.replace(shm_bw=shm)
            notes["shm_bw"] = "fit: shm all-reduce inside a node (1-16 MiB)"
        # 16-bit reduction rates from the bfloat16 all-reduces themselves, once the copy terms
        # are fitted: a kernel timed alone does not see what the collective adds around it
        # (shm's k-input kernel reads the window that every rank writes at once, with the
        # rounds' barriers in between: measured 25-45% slower than the lone kernel on 2 ranks)
        for field, algorithm, sizes in (("shm_reduce_bw_16", "shm", SHM_SIZES),
                                        ("reduce_bw_16", "ring", RING_SIZES)):
            if algorithm == "shm" and shm is None:
                continue
            rate = fit_rate(measure, prof, field, algorithm, "bfloat16", sizes, ranks_per_node)
            if rate is not None:
                prof = prof.replace(**{field: rate})
                notes[field] = f"fit: {algorithm} bfloat16 all-reduce inside a node"
    return prof.replace(notes=notes)


def fit_rate(measure, prof: Profile, field: str, algorithm: str, dtype: str, sizes, k: int):
    """The value of rate `field` (a bandwidth, B/s) that best fits `algorithm`'s all-reduce
    timings on x (groups of k ranks on one node) at `sizes`. The model's time is
    fixed(n) + u(n) / field, so 1 / field is the least-squares slope through the origin of
    t - fixed against u, residuals weighted by 1/t (relative errors, as the validation counts
    them); the rate's terms are credited at least a quarter of each time. None when the
    measurement cannot run here (the measure raises ValueError, or has no `dtype` argument,
    or torch is missing for bfloat16)."""
    c = native_module()
    shape = c.GroupShape(k, 1, k, True)
    fixed_prof = prof.replace(**{field: 1e30}).native()
    unit_prof = prof.replace(**{field: 1.0}).native()
    num = den = 0.0
    for n in sizes:
        try:
            t = (measure("all_reduce", "x", algorithm, n) if dtype == "float32"
                 else measure("all_reduce", "x", algorithm, n, dtype))
        except (TypeError, ValueError, ImportError):
            return None
        fixed = c.predict("all_reduce", algorithm, n, dtype, shape, fixed_prof)
        u = c.predict("all_reduce", algorithm, n, dtype, shape, unit_prof) - fixed
        w = 1.0 / max(t, 1e-12) ** 2
        num += w * u * u
        den += w * u * max(t - fixed, 0.25 * t)
    return float(num / den) if den > 0 else None


def fit_shm(measure, prof: Profile, k: int):
    """shm_bw from shm all-reduce timings on x (SHM_SIZES): the model's time is
    fixed(n) + copy(n) / shm_bw, so shm_bw = sum copy^2 / sum copy (t - fixed) (least squares
    through the origin). None when shm cannot run here (the measure raises ValueError)."""
    from .model import native_module

    c = native_module()
    shape = c.GroupShape(k, 1, k, True)
    fixed_prof = prof.replace(shm_bw=1e30).native()
    unit_prof = prof.replace(shm_bw=1.0).native()
    num = den = 0.0
    for n in SHM_SIZES:
        try:
            t = measure("all_reduce", "x", "shm", n)
        except ValueError:
            return None
        fixed = c.predict("all_reduce", "shm", n, "float32", shape, fixed_prof)
        copy = c.predict("all_reduce", "shm", n, "float32", shape, unit_prof) - fixed
        num += copy * copy
        den += copy * max(t - fixed, 0.25 * t)
    return float(num / den) if den > 0 else None


# ---- measurements on the running machine ----------------------------------------------------


def measure_local(ranks_per_node: int, cache=None) -> dict:
    """reduce_bw, memcpy_bw, compute_flops and memory_bytes of this rank's device (on a CPU
    also reduce_bw_16 and shm_reduce_bw_16), every rank at once; `cache` is the node's
    (cache_bytes, cache_bw_gain), to state the CPU rates as streaming figures."""
    try:
        import torch  # noqa: PLC0415

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is optional
        torch, cuda = None, False
    if cuda:
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
        return {"reduce_bw": 4 * n / t_add, "memcpy_bw": 4 * n / t_copy,
                "compute_flops": 2 * m**3 / t_mm,
                "memory_bytes": float(torch.cuda.get_device_properties(dev).total_memory)}
    from mpi4py import MPI  # noqa: PLC0415

    from ..calibration import core_share, measure_kernels  # noqa: PLC0415

    def best_of(f, reps=5):
        f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    shared = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    share = core_share(shared.Get_size())
    shared.Free()
    out = measure_kernels(*(cache or (0.0, 1.0)), k=ranks_per_node, ranks=ranks_per_node,
                          share=share)
    m = 512
    x = np.random.default_rng(0).standard_normal((m, m)).astype(np.float32)
    t_mm = best_of(lambda: x @ x)
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        host = 8e9
    out.update(compute_flops=2 * m**3 / t_mm, memory_bytes=float(host / ranks_per_node))
    return out


def _on_gpu() -> bool:
    try:
        import torch  # noqa: PLC0415

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is optional
        return False


def _grid_measure(grid, comm, iters: int = 10):
    """measure(collective, axis, algorithm, nbytes): the median over iterations of the slowest
    rank's time, all groups of the axis running at once."""
    import fourd  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    def measure(collective: str, axis: str, algorithm: str, nbytes: int,
                dtype: str = "float32") -> float:
        p = grid.size(axis)
        if dtype == "bfloat16":
            import torch  # noqa: PLC0415

            elems = max(p, (nbytes // 2) // p * p)
            big = torch.ones(elems, dtype=torch.bfloat16)
            small = torch.ones(elems // p, dtype=torch.bfloat16)
        else:
            elems = max(p, (nbytes // 4) // p * p)
            big = np.ones(elems, dtype=np.float32)
            small = np.ones(elems // p, dtype=np.float32)

        def once():
            if collective == "all_gather":
                fourd.all_gather(big, small, axis, algorithm=algorithm)
            elif collective == "reduce_scatter":
                fourd.reduce_scatter(small, big, axis, algorithm=algorithm)
            else:
                fourd.all_reduce(big, axis, algorithm=algorithm)

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


def calibrate(ranks_per_node: int | None = None, out: str | None = None,
              name: str = "calibrated", base: Profile | None = None) -> Profile:
    """Measure this machine's profile (collective: every rank calls it). Saves JSON to `out`
    on rank 0 (default ./fourd-profile.json) and returns the Profile on every rank."""
    import fourd  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    world = comm.Get_size()
    if world < 2:
        raise ValueError("calibrate: needs at least 2 ranks (found 1); run it under "
                         "mpiexec -n P with P >= 2, e.g. mpiexec -n 8 python -m mpi4py -m "
                         "fourd.plan --calibrate --ranks-per-node 4")
    if ranks_per_node is None:
        env = os.environ.get("FOURD_RANKS_PER_NODE", "").strip()
        if env:
            ranks_per_node = int(env)
        else:
            ranks_per_node = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    if ranks_per_node < 1 or world % ranks_per_node:
        raise ValueError(f"ranks_per_node: expected a divisor of the {world} ranks; found "
                         f"{ranks_per_node}")
    nodes = world // ranks_per_node
    grid = fourd.init(x=ranks_per_node, y=nodes, z=1, data=1, order="x-y-z-data",
                      ranks_per_node=ranks_per_node)
    measure = _grid_measure(grid, comm)
    cache = None
    if not _on_gpu():
        from ..calibration import _quiet_barrier, measure_cache  # noqa: PLC0415

        cache = measure_cache() if comm.Get_rank() == 0 else None
        _quiet_barrier(comm)
        cache = comm.bcast(cache, root=0)
    local = measure_local(ranks_per_node, cache)
    # every rank reports; keep the slowest rank's figures
    local = {k: comm.allreduce(v, op=MPI.MIN) for k, v in local.items()}
    prof = fit_profile(measure, ranks_per_node=ranks_per_node, nodes=nodes, base=base,
                       name=name, local=local, cache=cache)
    if comm.Get_rank() == 0:
        save_profile(prof, out or "fourd-profile.json")
    return prof
