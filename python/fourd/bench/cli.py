"""Driver of ``python -m fourd.bench``, in stages: the command line (the same verdict on every
rank), the set-up (session.py), the plan of the cells and the sweep (runner.py), the report
(header.py, report.py), and an exit status agreed on every rank."""

from __future__ import annotations

import datetime
import socket
import sys
import time

from . import header, report, session
from .options import HelpRequested, UsageError, parse
from .runner import Runner
from .session import PROG


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    start_time = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    cfg, rc = _command_line(argv, world, hosts)
    if cfg is None:
        return _finish(world, rc)
    if cfg.device == "cuda":
        from . import gpu  # only with --device cuda

        return _finish(world, gpu.run(cfg, world, PROG))
    s = session.start(cfg, world, hosts, argv, start_time, t_start)
    if isinstance(s, int):
        return _finish(world, s)
    runner = Runner(
        cfg,
        world,
        s.grid,
        s.impls,
        s.baselines,
        s.axis_info,
        s.intra_bps,
        s.link_bps,
        s.printer,
        s.progress,
    )  # plans the cells (collective)
    header.print_header(s, runner)
    summary, duration = _sweep(s, runner)
    rc = 1 if summary["wrong_total"] > 0 else 0
    if world.Get_rank() == 0 and (cfg.json or cfg.csv or cfg.plot):
        rc = _write_files(s, runner, summary, duration, rc)
    rc = world.bcast(rc, root=0)
    return _finish(world, rc, s.cleanup)


def _command_line(argv, world, hosts):
    """(Config, None) to run, or (None, exit status) after rank 0 printed the help or the one
    error every rank agreed on."""
    rank = world.Get_rank()
    cfg, err, help_text = _parse_here(argv, world.Get_size(), hosts, rank)
    if help_text is None and _wants_cuda(argv) and _no_gpu(world):
        return None, 2
    verdicts = world.allgather((err, help_text is not None))
    if any(h for _, h in verdicts):
        if rank == 0:
            print(help_text, end="")
        return None, 0
    errors = [e for e, _ in verdicts if e]
    if errors:
        if rank == 0:
            print(
                f"{PROG}: error: {errors[0]}\nRun '{PROG} --help' for the options.",
                file=sys.stderr,
                flush=True,
            )
        return None, 2
    return cfg, None


def _parse_here(argv, world_size: int, hosts, rank: int):
    """This rank's verdict on the command line: (Config or None, error or None, help or None).
    Every rank parses the same argv, so all reach the same one (matplotlib is looked for on
    rank 0, the one that plots)."""
    cfg, err, help_text = None, None, None
    try:
        cfg = parse(argv, world_size, hosts)
    except HelpRequested as h:
        help_text = h.text
    except UsageError as e:
        err = str(e)
    if cfg is not None and cfg.plot and rank == 0:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            err = (
                "--plot: matplotlib is not installed; install it (pip install matplotlib, or "
                "fourd[bench]) or leave out --plot"
            )
    return cfg, err, help_text


def _no_gpu(world) -> bool:
    """--device cuda without a usable GPU on some rank: rank 0 says why (before any other
    error: without a GPU nothing else matters)."""
    from . import gpu  # only with --device cuda

    reasons = [r for r in world.allgather(gpu.unavailable_reason()) if r]
    if reasons and world.Get_rank() == 0:
        print(f"{PROG}: error: --device cuda: {reasons[0]}", file=sys.stderr, flush=True)
    return bool(reasons)


def _wants_cuda(argv) -> bool:
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1].strip().lower() == "cuda"
        if a.startswith("--device="):
            return a.split("=", 1)[1].strip().lower() == "cuda"
    return False


def _sweep(s, runner) -> tuple[dict, float]:
    """The sweep, then the summary printed: (summary, seconds since start)."""
    runner.skipped.extend(s.notes)
    s.progress.total = max(1, runner.cells)
    s.progress.t0 = time.perf_counter()
    runner.run()
    s.progress.clear()
    summary = report.summarize(runner.rows)
    duration = time.perf_counter() - s.t_start
    report.print_summary(s.printer, summary, duration, len(runner.skipped))
    return summary, duration


def _write_files(s, runner, summary: dict, duration: float, rc: int) -> int:
    """--json, --csv and --plot (rank 0); the status, 3 when a file could not be written."""
    cfg, pr, g = s.cfg, s.printer, s.cfg.grid
    try:
        if cfg.json:
            report.write_json(cfg.json, header.document(s, runner, summary, duration, rc == 0))
            pr.line(f"# wrote {cfg.json}", always=True)
        if cfg.csv:
            report.write_csv(cfg.csv, runner.rows)
            pr.line(f"# wrote {cfg.csv}", always=True)
        if cfg.plot:
            import fourd

            report.write_plot(
                cfg.plot,
                runner.rows,
                f"fourd {fourd.build_info()['version']}, {s.nranks} ranks, grid "
                f"x={g['x']} y={g['y']} z={g['z']} data={g['data']}, "
                f"{','.join(cfg.dtypes)}",
            )
            pr.line(f"# wrote {cfg.plot}", always=True)
    except Exception as e:  # noqa: BLE001 - reported, and the status says so
        print(
            f"{PROG}: error: writing the output files failed: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
        rc = rc or 3
    return rc


def _finish(world, rc: int, cleanup=()) -> int:
    """Release everything; for a non-zero status also finalize MPI here, so that mpi4py's
    runner (python -m mpi4py) exits with the status instead of calling MPI_Abort on every rank
    (which would print one abort line per rank)."""
    for f in cleanup:
        try:
            f()
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass
    if rc != 0:
        from mpi4py import MPI

        sys.stdout.flush()
        sys.stderr.flush()
        try:
            import fourd

            fourd.finalize()
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass
        if MPI.Is_initialized() and not MPI.Is_finalized():
            world.Barrier()
            MPI.Finalize()
    return rc
