"""Measure a machine profile with fourd's own collectives.

Run under mpiexec with at least two (virtual) nodes' worth of ranks::

    mpiexec -n 8 python -m mpi4py -m fourd.plan --calibrate --ranks-per-node 4 --out my.json

The grid is x = ranks per node (node-local groups) by y = nodes (one rank per node, every
rank of a node active at once, as in training). Fits, by least squares over message sizes,
the ring model (Chan et al., CCPE 2007) on each level:

    ring all-gather on p ranks:  t(n) = (p - 1) alpha + (p - 1)/p n / B

- x groups give intra_alpha and intra_bw;
- y groups give inter_alpha and each rank's network share b; the profile stores nic_bw = b and
  nics_per_node = ranks per node, so that nodeInjectionBw / R = b;
- flat_efficiency = the model's flat time with efficiency 1 / the measured flat time (large
  all-gather on x);
- reduce_bw and memcpy_bw from local numpy (or torch on a GPU) kernels, compute_flops from a
  matmul, memory_bytes from the device (or the host memory divided among the node's ranks).

The fit is pure (fit_profile takes a `measure` function), so it is tested without MPI.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from .profiles import Profile, save_profile

INTRA_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23)  # all-gather output bytes
INTER_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23)
FLAT_SIZE = 1 << 23


def _fit_line(xs, ys):
    """Least-squares t = a + b n, with a and b clamped to small positive values."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    b, a = np.polyfit(x, y, 1)
    return max(a, 1e-9), max(b, 1e-15)


def fit_level(measure, axis: str, p: int, sizes, algorithm: str = "ring"):
    """(alpha, bandwidth, algorithm measured) of one level from ring all-gather timings on
    groups of p ranks; None when p < 2."""
    if p < 2:
        return None
    try:
        times = [measure("all_gather", axis, algorithm, n) for n in sizes]
    except ValueError:
        # The algorithm is not built into this fourd (rejected on every rank before any
        # communication): fit the library's own all-gather, a ring for large sizes.
        if algorithm == "flat":
            raise
        algorithm = "flat"
        times = [measure("all_gather", axis, algorithm, n) for n in sizes]
    a, b = _fit_line(sizes, times)
    return a / (p - 1), (p - 1) / p / b, algorithm


def fit_profile(measure, *, ranks_per_node: int, nodes: int, base: Profile | None = None,
                name: str = "calibrated", local=None) -> Profile:
    """A profile from timings. `measure(collective, axis, algorithm, nbytes)` returns seconds
    on the calibration grid (x: ranks_per_node ranks of a node; y: one rank per node);
    `local` is a dict of locally measured reduce_bw, memcpy_bw, compute_flops, memory_bytes.
    Figures that cannot be measured (no second node) are kept from `base`."""
    prof = (base or Profile()).replace(name=name, ranks_per_node=ranks_per_node, notes={})
    notes = {}
    intra = fit_level(measure, "x", ranks_per_node, INTRA_SIZES)
    if intra is not None:
        prof = prof.replace(intra_alpha=intra[0], intra_bw=intra[1])
        notes["intra_alpha"] = notes["intra_bw"] = f"fit: {intra[2]} all-gather inside a node"
    inter = fit_level(measure, "y", nodes, INTER_SIZES)
    if inter is not None:
        prof = prof.replace(inter_alpha=inter[0], nic_bw=inter[1], nics_per_node=ranks_per_node)
        notes["inter_alpha"] = notes["nic_bw"] = (f"fit: {inter[2]} all-gather across nodes, "
                                                  "all ranks on")
    if ranks_per_node >= 2:
        from .model import native_module

        c = native_module()
        shape = c.GroupShape(ranks_per_node, 1, ranks_per_node, True)
        ideal = c.predict("all_gather", "flat", FLAT_SIZE, "float32", shape,
                          prof.replace(flat_efficiency=1.0).native())
        measured = measure("all_gather", "x", "flat", FLAT_SIZE)
        prof = prof.replace(flat_efficiency=float(min(4.0, max(0.05, ideal / measured))))
        notes["flat_efficiency"] = "model flat time / measured flat all-gather (8 MiB)"
    if local:
        prof = prof.replace(**{k: float(v) for k, v in local.items()})
        for k in local:
            notes[k] = "measured locally"
    return prof.replace(notes=notes)


# ---- measurements on the running machine ----------------------------------------------------


def measure_local(ranks_per_node: int) -> dict:
    """reduce_bw, memcpy_bw, compute_flops and memory_bytes of this rank's device."""
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
    n = 1 << 24
    a = np.ones(n, dtype=np.float32)
    b = np.ones(n, dtype=np.float32)

    def best_of(f, reps=5):
        f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    t_add = best_of(lambda: np.add(a, b, out=a))
    t_copy = best_of(lambda: np.copyto(a, b))
    m = 512
    x = np.random.default_rng(0).standard_normal((m, m)).astype(np.float32)
    t_mm = best_of(lambda: x @ x)
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        host = 8e9
    return {"reduce_bw": 4 * n / t_add, "memcpy_bw": 4 * n / t_copy,
            "compute_flops": 2 * m**3 / t_mm, "memory_bytes": float(host / ranks_per_node)}


def _grid_measure(grid, comm, iters: int = 10):
    """measure(collective, axis, algorithm, nbytes): the median over iterations of the slowest
    rank's time, all groups of the axis running at once."""
    import fourd  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    def measure(collective: str, axis: str, algorithm: str, nbytes: int) -> float:
        p = grid.size(axis)
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
    local = measure_local(ranks_per_node)
    # every rank reports; keep the slowest rank's figures
    local = {k: comm.allreduce(v, op=MPI.MIN) for k, v in local.items()}
    prof = fit_profile(measure, ranks_per_node=ranks_per_node, nodes=nodes, base=base,
                       name=name, local=local)
    if comm.Get_rank() == 0:
        save_profile(prof, out or "fourd-profile.json")
    return prof
