"""Driver of ``python -m fourd.bench``, in stages: the command line (the same verdict on every
rank), the set-up (session.py), the plan of the cells and the sweep (runner.py), the report
(header.py, printer.py, report.py; the files kept current by files.py), and an exit status
agreed on every rank. SIGINT and SIGTERM end the sweep after the cell in flight on every rank
(stop.py); what was measured is printed and written, and the status is 128 + the signal."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time

from . import files, header, printer, report, session
from .options import HelpRequested, UsageError, parse
from .runner import Runner
from .session import PROG
from .stop import StopRequest, signal_name


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--compression" or a.startswith("--compression=") for a in argv):
        from . import compression  # compressed collectives next to uncompressed ones

        return compression.main(argv)
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
    stop = StopRequest()  # from here on a signal ends the run cleanly (stop.py)
    stop.install()
    try:
        return _run(cfg, world, hosts, argv, start_time, t_start, stop)
    finally:
        stop.restore()


def _run(cfg, world, hosts, argv, start_time, t_start, stop) -> int:
    """The set-up, the sweep, the summary and the files; the exit status every rank agrees on
    (128 + the signal's number after a stop)."""
    s = session.start(cfg, world, hosts, argv, start_time, t_start)
    if isinstance(s, int):
        return _finish(world, s)
    runner = Runner(s, stop)  # plans the cells (collective)
    header.print_header(s, runner)
    out = _outputs(s, runner) if world.Get_rank() == 0 else None
    summary, duration = _sweep(s, runner, out)
    rc = 1 if summary["wrong_total"] > 0 else 0
    if runner.stopped:
        rc = 128 + runner.stopped
    if world.Get_rank() == 0 and (cfg.json or cfg.csv or cfg.plot):
        rc = _write_files(s, runner, out, summary, duration, rc)
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


def _outputs(s, runner) -> files.Outputs | None:
    """Rank 0's --json/--csv, rewritten after every row (files.py); None without them."""
    if not (s.cfg.json or s.cfg.csv):
        return None

    def document(state: str) -> dict:
        summary = report.summarize(runner.rows, runner.wall_s)
        elapsed = time.perf_counter() - s.t_start
        return header.document(s, runner, summary, elapsed, runner.wrong_total == 0, state)

    return files.Outputs(s.cfg.json, s.cfg.csv, document)


def _sweep(s, runner, out) -> tuple[dict, float]:
    """The sweep (the files rewritten after each row), then the summary printed: (summary,
    seconds since start)."""
    runner.skipped.extend(s.notes)
    s.progress.start(runner.cells, runner.estimate_s)
    if out is not None:
        runner.on_row = lambda: _update(out, runner.rows)
        _update(out, runner.rows)  # valid files from the start: the header, no rows yet
    runner.run()
    s.progress.clear()
    summary = report.summarize(runner.rows, runner.wall_s)
    duration = time.perf_counter() - s.t_start
    printer.print_summary(s.printer, summary, duration, len(runner.skipped), _facts(s, runner))
    return summary, duration


def _update(out, rows: list) -> None:
    """The files after a row; the first failure is reported once and ends the rewrites (the
    exit status says so at the end: 3)."""
    if out.error is not None:
        return
    try:
        out.update(rows)
    except OSError as e:
        out.error = f"{type(e).__name__}: {e}"
        print(
            f"{PROG}: error: writing the output files failed: {out.error}",
            file=sys.stderr,
            flush=True,
        )


def _facts(s, runner) -> dict:
    """What the summary says of the run itself (printer.print_summary)."""
    load = session.load_average()
    return {
        "setup_s": s.setup_s,
        "estimate_s": runner.estimate_s,
        "stopped": signal_name(runner.stopped) if runner.stopped else None,
        "cells_done": s.progress.done,
        "cells_planned": runner.cells,
        "rounds": s.cfg.rounds,
        "load": load[0] if load else None,
        "cores": os.cpu_count(),
    }


def _write_files(s, runner, out, summary: dict, duration: float, rc: int) -> int:
    """--json, --csv (their final state) and --plot (rank 0); the status, 3 when a file
    could not be written."""
    cfg, pr, g = s.cfg, s.printer, s.cfg.grid
    state = "interrupted" if runner.stopped else "complete"
    if out is not None and out.error is not None:  # reported when it happened
        rc, out = rc or 3, None
    try:
        if out is not None:
            ok = summary["wrong_total"] == 0
            doc = header.document(s, runner, summary, duration, ok, state)
            out.update(runner.rows, state, doc)
            for path in (cfg.json, cfg.csv):
                if path:
                    pr.line(f"# wrote {path}", always=True)
        if cfg.plot:
            import fourd

            report.write_plot(
                cfg.plot,
                runner.rows,
                f"fourd {fourd.build_info()['version']}, {s.nranks} ranks, grid "
                f"x={g['x']} y={g['y']} z={g['z']} data={g['data']}, "
                f"{','.join(cfg.dtypes)}" + (f" ({state})" if runner.stopped else ""),
                latency_s=s.latency_s,
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
