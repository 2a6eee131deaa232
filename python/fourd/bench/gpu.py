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

_TORCH_NAMES = {
    "float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64",
}
_BUSBW = {  # nccl-tests: busbw = algbw * factor(p)
    "all_reduce": lambda p: 2.0 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
}


def unavailable_reason() -> str | None:
    """Why this rank cannot run CUDA rows, or None."""
    import fourd

    if not fourd.HAVE_CUDA:
        return ("this fourd build has no GPU part (rebuild with FOURD_CUDA=ON pip install "
                "'.[gpu]')")
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        count, why = fourd._C.cuda_device_count()
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (f"no CUDA device: torch.cuda is unavailable (torch {torch.__version__}, {build}); "
                f"fourd sees {count} device(s){': ' + why if why else ''}")
    return None


def run(cfg, world, prog: str) -> int:
    reasons = [r for r in world.allgather(unavailable_reason()) if r]
    if reasons:
        if world.Get_rank() == 0:
            print(f"{prog}: error: --device cuda: {reasons[0]}", file=sys.stderr, flush=True)
        return 2
    import torch

    import fourd

    rank = world.Get_rank()
    try:
        grid = fourd.init(**cfg.grid, order=cfg.order, ranks_per_node=cfg.ranks_per_node)
    except fourd.Error as e:
        if rank == 0:
            print(f"{prog}: error: could not build the grid: {e}", file=sys.stderr, flush=True)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    iters = cfg.iters or 20
    rows = []
    if rank == 0 and not cfg.quiet:
        print(f"# {prog} --device cuda: {world.Get_size()} ranks, {torch.cuda.get_device_name(dev)}"
              f", algorithm auto, {iters} iterations, CUDA-event timing")
        print(f"# {'collective':<15}{'axis':>8}{'dtype':>10}{'op':>6}{'bytes':>14}"
              f"{'time_us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
    for coll in cfg.collectives:
        for axis in cfg.axes:
            p = axis.group_size
            for dtype in cfg.dtypes:
                tdt = getattr(torch, _TORCH_NAMES[dtype])
                esize = torch.empty(0, dtype=tdt).element_size()
                ops = [None] if coll in ("all_gather", "broadcast") else cfg.ops
                for op in ops:
                    if op == "avg" and not tdt.is_floating_point:
                        continue
                    for size in cfg.sizes:
                        count = max(1, size // esize)
                        count -= count % p if coll in ("all_gather", "reduce_scatter") else 0
                        if count == 0:
                            continue
                        t = _time(grid, torch, coll, axis.name, op, tdt, count, p, dev, iters,
                                  cfg.warmup, cfg.timeout)
                        t = max(world.allgather(t))
                        nbytes = count * esize
                        algbw = nbytes / t / 1e9
                        row = {"device": "cuda", "collective": coll, "axis": axis.name,
                               "dtype": dtype, "op": op or "-", "bytes": nbytes,
                               "time_us": t * 1e6, "algbw_GBps": algbw,
                               "busbw_GBps": algbw * _BUSBW[coll](p)}
                        rows.append(row)
                        if rank == 0 and not cfg.quiet:
                            print(f"  {coll:<15}{axis.name:>8}{dtype:>10}{row['op']:>6}"
                                  f"{nbytes:>14}{row['time_us']:>12.1f}{algbw:>12.3f}"
                                  f"{row['busbw_GBps']:>12.3f}", flush=True)
    if rank == 0 and cfg.json:
        with open(cfg.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    grid.finalize()
    return 0


def _time(grid, torch, coll, axis, op, tdt, count, p, dev, iters, warmup, timeout) -> float:
    """Median seconds of one call, from CUDA events around each call on the current stream."""
    if coll == "all_gather":
        inp = torch.ones(count // p, dtype=tdt, device=dev)
        out = torch.empty(count, dtype=tdt, device=dev)
        call = lambda: grid.all_gather(out, inp, axis, timeout=timeout)  # noqa: E731
    elif coll == "reduce_scatter":
        inp = torch.ones(count, dtype=tdt, device=dev)
        out = torch.empty(count // p, dtype=tdt, device=dev)
        call = lambda: grid.reduce_scatter(out, inp, axis, op=op, timeout=timeout)  # noqa: E731
    elif coll == "broadcast":
        buf = torch.ones(count, dtype=tdt, device=dev)
        call = lambda: grid.broadcast(buf, 0, axis, timeout=timeout)  # noqa: E731
    else:
        buf = torch.ones(count, dtype=tdt, device=dev)
        call = lambda: grid.all_reduce(buf, axis, op=op, timeout=timeout)  # noqa: E731
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
