"""`python -m fourd.bench --device cuda`: fourd's collectives on torch CUDA tensors.

Every rank uses cuda:(local rank % device count) (fourd.init selects it). Each row is one
(collective, axis, dtype, op, size) with algorithm auto: after the warm-up iterations, the
timed iterations are bracketed by CUDA events recorded on the current stream, so the time is
GPU time between enqueue points (median over the iterations, maximum over the ranks). busbw
uses the nccl-tests factors. Without a usable GPU (no torch, no CUDA device, or a fourd build
without its GPU part) every rank reports why and the command exits with status 2.
"""

from __future__ import annotations

import json
import statistics
import sys

from fourd._tensor import ITEMSIZE

from .collectives import TABLE


def unavailable_reason() -> str | None:
    """Why this rank cannot run CUDA rows, or None."""
    import fourd

    if not fourd.HAVE_CUDA:
        return "this fourd build has no GPU part (rebuild with FOURD_CUDA=ON pip install '.[gpu]')"
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        info = fourd.build_info()
        count, why = info["cuda_devices"], info["cuda_unavailable"]
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"no CUDA device: torch.cuda is unavailable (torch {torch.__version__}, {build}); "
            f"fourd sees {count} device(s){': ' + why if why else ''}"
        )
    return None


def run(cfg, world, prog: str) -> int:
    reasons = [r for r in world.allgather(unavailable_reason()) if r]
    if reasons:
        if world.Get_rank() == 0:
            print(f"{prog}: error: --device cuda: {reasons[0]}", file=sys.stderr, flush=True)
        return 2
    import torch

    grid = _grid(cfg, world, prog)
    if grid is None:
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    iters = cfg.iters or 20
    show = world.Get_rank() == 0 and not cfg.quiet
    if show:
        print(
            f"# {prog} --device cuda: {world.Get_size()} ranks, {torch.cuda.get_device_name(dev)}"
            f", algorithm auto, {iters} iterations, CUDA-event timing"
        )
        print(
            f"# {'collective':<15}{'axis':>8}{'dtype':>10}{'op':>6}{'bytes':>14}"
            f"{'time_us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}"
        )
    rows = _sweep(cfg, world, grid, torch, dev, iters, show)
    if world.Get_rank() == 0 and cfg.json:
        with open(cfg.json, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    grid.finalize()
    return 0


def _sweep(cfg, world, grid, torch, dev, iters: int, show: bool) -> list:
    """Every row, printed as it comes (show); collective over the world."""
    rows = []
    for coll in (TABLE[c] for c in cfg.collectives):
        for axis in cfg.axes:
            for dtype, op, count in _cells(cfg, coll, axis.group_size, torch):
                t = _time(
                    grid,
                    torch,
                    coll,
                    axis.name,
                    op,
                    getattr(torch, dtype),
                    count,
                    axis.group_size,
                    dev,
                    iters,
                    cfg.warmup,
                    cfg.timeout,
                )
                rows.append(_row(coll, axis, dtype, op, count, max(world.allgather(t))))
                if show:
                    _print_row(rows[-1])
    return rows


def _grid(cfg, world, prog: str):
    """fourd.init on every rank; None (rank 0 says why) when it fails."""
    import fourd

    try:
        return fourd.init(**cfg.grid, order=cfg.order, ranks_per_node=cfg.ranks_per_node)
    except fourd.Error as e:
        if world.Get_rank() == 0:
            print(f"{prog}: error: could not build the grid: {e}", file=sys.stderr, flush=True)
        return None


def _cells(cfg, coll, p: int, torch):
    """(dtype, op or None, count) of every row of one (collective, axis), in the table's
    order; count rounded as the collective's S is (collectives.py), at least one element."""
    for dtype in cfg.dtypes:
        floating = getattr(torch, dtype).is_floating_point
        for op in cfg.ops if coll.reduces else [None]:
            if op == "avg" and not floating:
                continue
            for size in cfg.sizes:
                count = max(1, size // ITEMSIZE[dtype])
                count -= count % p if coll.blocked else 0
                if count > 0:
                    yield dtype, op, count


def _row(coll, axis, dtype: str, op, count: int, t: float) -> dict:
    """A --json line: t is the slowest rank's median seconds."""
    nbytes = count * ITEMSIZE[dtype]
    algbw = nbytes / t / 1e9
    return {
        "device": "cuda",
        "collective": coll.name,
        "axis": axis.name,
        "dtype": dtype,
        "op": op or "-",
        "bytes": nbytes,
        "time_us": t * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * coll.bus(axis.group_size),
    }


def _print_row(row: dict) -> None:
    print(
        f"  {row['collective']:<15}{row['axis']:>8}{row['dtype']:>10}{row['op']:>6}"
        f"{row['bytes']:>14}{row['time_us']:>12.1f}{row['algbw_GBps']:>12.3f}"
        f"{row['busbw_GBps']:>12.3f}",
        flush=True,
    )


def _time(grid, torch, coll, axis, op, tdt, count, p, dev, iters, warmup, timeout) -> float:
    """Median seconds of one call, from CUDA events around each call on the current stream.
    One buffer where the collective's in-place form reads and writes all of it (all_reduce,
    broadcast), separate input and output otherwise."""
    nsend, nrecv = coll.counts(count, p)
    if coll.whole_buffer_in_place:
        inp = out = torch.ones(nrecv, dtype=tdt, device=dev)
    else:
        inp = torch.ones(nsend, dtype=tdt, device=dev)
        out = torch.empty(nrecv, dtype=tdt, device=dev)
    call = coll.fourd(grid, axis, op, "auto", timeout, inp, out, coll.whole_buffer_in_place)
    for _ in range(max(1, warmup)):
        call()
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)
