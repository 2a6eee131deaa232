"""What a run of ``python -m fourd.bench`` says about itself: the printed header (versions,
grid, sizes, axes, timing, bound, baselines, placement) and the JSON document's sections other
than the rows and the summary. Rank 0 only; nothing here communicates."""

from __future__ import annotations

import os
import platform
import sys

from mpi4py import MPI

import fourd

from . import bounds, report
from .progress import duration
from .report import fmt_size, plural
from .runner import MAX_ITERS, MIN_ITERS
from .session import PROG, load_average
from .stop import signal_name


def versions() -> dict:
    import numpy

    out = {"python": platform.python_version(), "numpy": numpy.__version__}
    try:
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
    except Exception:  # noqa: BLE001, S110 - the version is optional
        pass
    t = sys.modules.get("torch")
    out["torch"] = getattr(t, "__version__", None) if t else None
    return out


def _env_subset() -> dict:
    keep = ("FOURD_", "OMP_NUM_THREADS", "UCX_", "MPIR_CVAR_", "FI_", "MASTER_ADDR", "GLOO_")
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(keep)}


def _mpi_library() -> tuple[list, str]:
    """(every line of the MPI library's version, its first line with spaces collapsed)."""
    lines = (MPI.Get_library_version() or "").strip().splitlines()
    return lines, " ".join(lines[0].split()) if lines else "?"


def print_header(s, runner) -> None:
    """The lines above the tables (a Session `s`, the Runner that will sweep)."""
    pr, cfg = s.printer, s.cfg
    _print_run(s, runner)
    pr.line(
        "# axes: "
        + "; ".join(
            f"{a.name} = groups of {a.group_size} ({s.axis_info[a.mask]['description']})"
            for a in cfg.axes
        )
    )
    if cfg.timing == "batch":
        pr.line(
            "# timing (--timing batch): time = the slowest rank's time for the whole batch of "
            "iterations run back to back, divided by the iterations (as nccl-tests), after a "
            "barrier; every group of an axis runs at once"
        )
    else:
        pr.line(
            "# timing: time = mean over iterations of the per-iteration maximum across all "
            "ranks, after a barrier; every group of an axis runs at once (the JSON also has "
            "min, median, p99 and the nccl-tests average across ranks)"
        )
    be_text = (
        f"Be = {s.link_bps / 1e9:.3f} GB/s per node ({cfg.link_rate_source})"
        if s.link_bps
        else "Be = unknown (no --link-rate, no FOURD_CLUSTER_RATE_BPS)"
    )
    pr.line(
        f"# bound: Bi = {s.intra_bps / 1e9:.2f} GB/s per rank (numpy copies of "
        f"{s.copy_bytes >> 20} MiB for {bounds.COPY_SECONDS:g} s on every rank at once; median, "
        f"range {min(s.bw_all) / 1e9:.2f}-{max(s.bw_all) / 1e9:.2f}); "
        f"{be_text}; c = 2 for all_reduce, 1 otherwise; eff = bound / time"
    )
    btxt = [_baseline_text(b) for b in s.baselines]
    pr.line(
        f"# baselines: {'; '.join(btxt) if btxt else 'none'}; vs = t_baseline / t_fourd "
        f"(> 1: fourd faster)"
    )
    pr.line("#")
    _print_placement(pr, s.placement)
    for n in s.notes:
        pr.note(n)


def _baseline_text(b) -> str:
    """What a baseline of the header's list is."""
    if b.library == "mpi":
        return "mpi = the MPI library's collective via mpi4py on the same ranks"
    if b.library == "torch":
        return f"torch = torch.distributed {b.version} gloo on the same ranks"
    comms = b.communicators().values()
    where = ", ".join(
        c["torch_group"] + ("" if c["torch_group"] == c["grid_axis"] else " (a group of its own)")
        for c in comms
    )
    if any(c["torch_group"] != c["direct"] for c in comms):
        where += f" (fourd's own cells: {', '.join(c['direct'] for c in comms)})"
    return (
        f"torch-fourd = torch.distributed {b.version} on backend fourd (fourd.distributed) on "
        f"the same ranks, its groups on fourd's communicators {where}; its vs fourd = "
        "t_torch-fourd / t_auto"
    )


def _print_run(s, runner) -> None:
    """Versions, grid, sizes and iterations."""
    pr, cfg, grid, g = s.printer, s.cfg, s.grid, s.cfg.grid
    info, vers = fourd.build_info(), versions()
    if cfg.iters is None:
        iters_text = (
            f"adaptive {MIN_ITERS}-{MAX_ITERS} (about {runner.target_s * 1e3:.0f} ms of "
            f"timed work per row)"
        )
    else:
        iters_text = str(cfg.iters)
    sizes = cfg.sizes
    step = (
        f"+{fmt_size(cfg.raw['stepbytes'])}"
        if cfg.raw.get("stepbytes")
        else f"x{cfg.raw.get('stepfactor') or 4:g}"
    )
    pr.line(
        f"# {PROG}: fourd {info['version']} (CUDA {'yes' if info['cuda'] else 'no'}) | MPI: "
        f"{_mpi_library()[1]} | Python {vers['python']}, numpy {vers['numpy']}, mpi4py "
        f"{vers.get('mpi4py', '?')}" + (f", torch {vers['torch']}" if vers.get("torch") else "")
    )
    nhosts = len(set(s.hosts))
    pr.line(
        f"# ranks: {s.nranks} on {nhosts} host{'s' if nhosts > 1 else ''}; grid x={g['x']} "
        f"y={g['y']} z={g['z']} data={g['data']}, order {cfg.order}; {grid.num_nodes} "
        f"node{'s' if grid.num_nodes > 1 else ''}"
        + (f" (virtual: --ranks-per-node {cfg.ranks_per_node})" if grid.virtual_topology else "")
        + f" [{cfg.grid_source}]"
    )
    pr.line(
        f"# sizes: {fmt_size(sizes[0])} .. {fmt_size(sizes[-1])} "
        f"({len(sizes)} size{'s' if len(sizes) > 1 else ''}, {step}); "
        f"iterations: {iters_text}; warm-up {cfg.warmup}; check {cfg.check}; "
        + (f"rounds {cfg.rounds} (rotated order; median round); " if cfg.rounds > 1 else "")
        + f"types "
        f"{','.join(cfg.dtypes)}; ops {','.join(cfg.ops)}"
    )
    _print_estimate(s, runner)


def _print_estimate(s, runner) -> None:
    """How long the sweep should take, said to be an estimate (runner._estimate)."""
    torch = any(b.library == "torch" for b in s.baselines)
    per = (
        f"{s.cfg.iters} timed calls"
        if s.cfg.iters is not None
        else f"about {runner.target_s * 1e3:.0f} ms of timed calls"
    )
    s.printer.line(
        f"# estimate: the sweep should take about {duration(runner.estimate_s)} "
        f"({plural(runner.cells, 'cell')} x {plural(s.cfg.rounds, 'round')}, {per} each, the "
        "untimed calls priced by fourd's cost model"
        + (", torch's by gloo's small all_reduce timed at start" if torch else "")
        + "); an estimate: a busy machine takes longer"
    )


def _print_placement(pr, placement: list) -> None:
    """World rank, host, node, local rank and grid coordinates (the first and last 32 of a
    large job)."""
    pr.line(
        f"# {'rank':>5}  {'host':<24}{'node':>5}{'local':>6}{'x':>4}{'y':>4}{'z':>4}{'data':>6}"
    )
    shown = placement if len(placement) <= 64 else placement[:32] + placement[-32:]
    for i, row in enumerate(shown):
        if len(placement) > 64 and i == 32:
            pr.line(f"#   ... {len(placement) - 64} more ranks ...")
        pr.line(
            f"# {row['rank']:>5}  {row['host'][:23]:<24}{row['node']:>5}{row['local_rank']:>6}"
            f"{row['x']:>4}{row['y']:>4}{row['z']:>4}{row['data']:>6}"
        )


def document(s, runner, summary: dict, duration: float, ok: bool, state: str = "complete") -> dict:
    """The --json document (report.TOP_FIELDS; docs/benchmark.md describes every field), of
    the rows measured so far; `state`: "running" (rewritten after each row), "complete" or
    "interrupted" (report.PROGRESS_STATES)."""
    cfg, grid, g = s.cfg, s.grid, s.cfg.grid
    info = fourd.build_info()
    mpi_lines, mpi_first = _mpi_library()
    return {
        "schema": report.SCHEMA,
        "schema_version": report.SCHEMA_VERSION,
        "start_time": s.start_time,
        "duration_s": round(duration, 3),
        "command": [PROG, *s.argv],
        "args": {
            **{k: v for k, v in cfg.raw.items()},
            "sizes": cfg.sizes,
            "dtypes": cfg.dtypes,
            "ops": cfg.ops,
            "collectives": cfg.collectives,
            "axes": [a.name for a in cfg.axes],
            "algorithms": cfg.algorithms,
            "baselines": cfg.baselines,
        },
        "environment": {
            **versions(),
            "platform": platform.platform(),
            "hosts": sorted(set(s.hosts)),
            "cpu_count": os.cpu_count(),
            "load_average": {"start": s.load_start, "now": load_average()},
            "env": _env_subset(),
        },
        "fourd": dict(info),
        "mpi": {
            "library": mpi_first,
            "library_version": "\n".join(mpi_lines),
            "standard": "{}.{}".format(*MPI.Get_version()),
            "world_size": s.nranks,
            "thread_level": info.get("mpi_thread_level"),
        },
        "grid": {
            **g,
            "order": cfg.order,
            "ranks_per_node": cfg.ranks_per_node,
            "num_nodes": grid.num_nodes,
            "virtual_topology": bool(grid.virtual_topology),
            "source": cfg.grid_source,
            "world_size": s.nranks,
        },
        "placement": s.placement,
        "topology": s.topo_doc,
        "timing": _timing_doc(cfg, runner),
        "bandwidth": _bandwidth_doc(s, cfg),
        "baselines": s.base_doc,
        "rows": runner.rows,
        "skipped": runner.skipped,
        "summary": summary,
        "ok": ok,
        "progress": {
            "state": state,
            "signal": signal_name(runner.stopped) if runner.stopped else None,
            "cells_done": s.progress.done,
            "cells_planned": runner.cells,
            "estimate_s": runner.estimate_s,
        },
    }


def _bandwidth_doc(s, cfg) -> dict:
    """The bound's measured and given bandwidths, and how each was found."""
    return {
        "intra_Bps": s.intra_bps,
        "intra_per_rank_Bps": s.bw_all,
        "intra_method": (
            f"numpy copies of {s.copy_bytes >> 20} MiB back to back for "
            f"{bounds.COPY_SECONDS:g} s, every rank at once after a barrier; bytes copied / "
            "time; median over ranks"
        ),
        "intra_copy_bytes": s.copy_bytes,
        "link_Bps": s.link_bps,
        "link_source": cfg.link_rate_source,
        "latency_s": s.latency_s,
        "latency_method": f"half the fastest of 50 round trips of 8 bytes between world "
        f"ranks {s.latency_pair[0]} and {s.latency_pair[-1]} (MPI Send/Recv); the plot's "
        "latency floor is ceil(log2 p) of it",
        "formula": "T_min = max(c(N-1)/N S/Be, c(k-1)/k S/Bi); c = 2 all_reduce, 1 "
        "all_gather/reduce_scatter; broadcast S/Be, S/Bi",
    }


def _timing_doc(cfg, runner) -> dict:
    return {
        "mode": cfg.timing,
        "time_us": (
            "the slowest rank's batch time / iterations (nccl-tests)"
            if cfg.timing == "batch"
            else "mean over timed iterations of the per-iteration maximum across ranks"
        ),
        "time_us_rank_avg": "nccl-tests: mean over iterations and ranks",
        "percentiles": "time_us_min/median/p99/max over the per-iteration maxima",
        "barrier": "a world Allreduce (agreeing on the iteration count) before each "
        "timed batch; no barrier between iterations",
        "concurrency": "every group of the axis runs at once",
        "iters": cfg.iters if cfg.iters is not None else f"adaptive {MIN_ITERS}-{MAX_ITERS}",
        "target_s_per_row": runner.target_s,
        "warmup": cfg.warmup,
        "check": cfg.check,
        "rounds": cfg.rounds,
        "clock": "time.perf_counter around each call, host side, blocking calls",
    }
