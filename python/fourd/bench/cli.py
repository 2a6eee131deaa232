"""Driver of ``python -m fourd.bench``: set up the grid and the baselines, run the sweep, print
and write the results, and agree on the exit status on every rank."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import statistics
import sys
import time

from . import bounds, report
from .options import HelpRequested, UsageError, parse
from .report import Printer, fmt_size
from .runner import MAX_ITERS, MIN_ITERS, Progress, Runner

PROG = "python -m fourd.bench"


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


def _versions() -> dict:
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


def _wants_cuda(argv) -> bool:
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1].strip().lower() == "cuda"
        if a.startswith("--device="):
            return a.split("=", 1)[1].strip().lower() == "cuda"
    return False


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    start_time = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, nranks = world.Get_rank(), world.Get_size()
    hosts = world.allgather(socket.gethostname())

    # ---- the command line: same verdict on every rank, printed once --------------------------
    cfg, err, help_text = None, None, None
    try:
        cfg = parse(argv, nranks, hosts)
    except HelpRequested as h:
        help_text = h.text
    except UsageError as e:
        err = str(e)
    if cfg is not None and cfg.plot and rank == 0:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            err = ("--plot: matplotlib is not installed; install it (pip install matplotlib, or "
                   "fourd[bench]) or leave out --plot")
    if help_text is None and _wants_cuda(argv):
        # Without a usable GPU nothing else matters: say so first, on every rank's behalf.
        from . import gpu  # noqa: PLC0415 - only with --device cuda

        reasons = [r for r in world.allgather(gpu.unavailable_reason()) if r]
        if reasons:
            if rank == 0:
                print(f"{PROG}: error: --device cuda: {reasons[0]}", file=sys.stderr, flush=True)
            return _finish(world, 2)
    verdicts = world.allgather((err, help_text is not None))
    if any(h for _, h in verdicts):
        if rank == 0:
            print(help_text, end="")
        return _finish(world, 0)
    errors = [e for e, _ in verdicts if e]
    if errors:
        if rank == 0:
            print(f"{PROG}: error: {errors[0]}\nRun '{PROG} --help' for the options.",
                  file=sys.stderr, flush=True)
        return _finish(world, 2)

    import fourd

    if cfg.device == "cuda":
        from . import gpu  # noqa: PLC0415 - only with --device cuda

        return _finish(world, gpu.run(cfg, world, PROG))

    progress = Progress(0, rank == 0 and not cfg.quiet and (cfg.progress or sys.stderr.isatty()))
    pr = Printer(rank == 0, cfg.quiet, progress)

    try:
        grid = fourd.init(**cfg.grid, order=cfg.order, ranks_per_node=cfg.ranks_per_node)
    except fourd.Error as e:  # raised on every rank (fourd.init checks that ranks agree)
        if rank == 0:
            print(f"{PROG}: error: could not build the grid: {e}", file=sys.stderr, flush=True)
        return _finish(world, 2)

    # ---- optional torch (baseline, and the bfloat16 buffers) ---------------------------------
    want_torch = "torch" in cfg.baselines or "bfloat16" in cfg.dtypes
    torch_err = None
    if want_torch:
        # c10d's C++ warnings (e.g. about reverse DNS of peers in network namespaces) are noise here.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        try:
            import torch  # noqa: F401
        except Exception as e:  # noqa: BLE001
            torch_err = f"{type(e).__name__}: {e}"
    torch_errs = [e for e in world.allgather(torch_err) if e]
    have_torch = not torch_errs
    if want_torch and not have_torch:
        sys.modules.pop("torch", None)
    notes = list(cfg.notes)
    if "torch" in cfg.baselines and not have_torch:
        notes.append(f"torch baseline: torch is not importable ({torch_errs[0]}); no torch rows")

    # ---- bandwidths for the bound --------------------------------------------------------------
    world.Barrier()
    bw_local = bounds.memcpy_bandwidth()
    bw_all = world.allgather(bw_local)
    intra_bps = statistics.median(bw_all)
    link_bps = cfg.link_rate

    # ---- groups of every axis, and how the bound treats them ---------------------------------
    placement = grid.placement()
    axis_info, topo_doc = {}, {}
    for axis in cfg.axes:
        topo = grid.topology(axis.name)
        mine = grid.ranks(axis.name)
        all_groups = sorted(set(world.allgather(tuple(mine))))
        nodes = int(topo.get("num_nodes", 1))
        rpn = topo.get("ranks_per_node") or [axis.group_size]
        k = int(topo.get("k") or max(rpn))
        p = axis.group_size
        one_host = len({placement[r]["host"] for r in mine}) == 1
        if link_bps is None and one_host and nodes > 1:
            bn, bk = 1, p
            btext = (f"all on one host, so virtual nodes share memory: c(p-1)/p S/Bi with p={p}")
            model = "one host"
        else:
            bn, bk = nodes, k
            if nodes > 1 and link_bps is None:
                btext = (f"c(k-1)/k S/Bi with k={k} only (link rate unknown: pass --link-rate)")
                model = "intra only"
            elif nodes > 1:
                btext = (f"max(c(N-1)/N S/Be, c(k-1)/k S/Bi) with N={nodes}, k={k}"
                         if k > 1 else f"c(N-1)/N S/Be with N={nodes}")
                model = "hierarchical"
            else:
                btext = f"c(k-1)/k S/Bi with k={k}"
                model = "one node"
        info = {
            "nodes": nodes, "k": k, "groups": nranks // p,
            "description": topo.get("description", f"{nodes} nodes"),
            "bound_nodes": bn, "bound_k": bk, "bound_text": btext, "bound_model": model,
        }
        axis_info[axis.mask] = info
        topo_doc[axis.name] = {
            "mask": axis.mask, "group_size": p, "groups": nranks // p, "nodes": nodes,
            "ranks_per_node": k, "ranks_per_node_list": list(rpn),
            "uniform": bool(topo.get("uniform", True)), "description": info["description"],
            "group_ranks": [list(g) for g in all_groups], "bound_model": model,
            "bound_nodes": bn, "bound_k": bk,
        }

    # ---- baselines -----------------------------------------------------------------------------
    from .libraries import FourdImpl, MpiImpl, TorchImpl, quiet_torch_warnings

    impls = [FourdImpl(grid, a, cfg.timeout) for a in cfg.algorithms]
    baselines, cleanup, base_doc = [], [], {}
    for name in cfg.baselines:
        if name == "mpi":
            m = MpiImpl(grid)
            m.setup(cfg.axes)
            baselines.append(m)
            cleanup.append(m.free)
            base_doc["mpi"] = {"available": True, "library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
                               "how": "MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block / "
                                      "MPI_Bcast through mpi4py on MPI_Comm_split of the grid's "
                                      "communicator, same ranks in fourd's group order"}
        elif name == "torch":
            if not have_torch:
                base_doc["torch"] = {"available": False, "reason": torch_errs[0]}
                continue
            quiet_torch_warnings()
            t = None
            terr = None
            try:
                t = TorchImpl(grid, timeout_s=max(60.0, cfg.timeout or 0.0))
                t.setup(world, hosts, cfg.axes)
            except Exception as e:  # noqa: BLE001 - agreed on below
                terr = f"{type(e).__name__}: {e}"
            terrs = [e for e in world.allgather(terr) if e]
            if terrs:
                notes.append(f"torch baseline: torch.distributed (gloo) did not start: {terrs[0]}")
                if t is not None:
                    t.close()
                base_doc["torch"] = {"available": False, "reason": terrs[0]}
                continue
            baselines.append(t)
            cleanup.append(t.close)
            base_doc["torch"] = {"available": True, "version": t.version, "backend": "gloo",
                                 "store": t.master,
                                 "how": "torch.distributed all_reduce / all_gather_single / "
                                        "reduce_scatter_single / broadcast on new_group of the "
                                        "same ranks (gloo)"}

    # ---- header ----------------------------------------------------------------------------------
    info = fourd.build_info()
    mpi_lib = (MPI.Get_library_version() or "").strip().splitlines()
    mpi_first = " ".join(mpi_lib[0].split()) if mpi_lib else "?"
    vers = _versions()
    g = cfg.grid
    runner = Runner(cfg, world, grid, impls, baselines, axis_info, intra_bps, link_bps, pr,
                    progress)
    if cfg.iters is None:
        iters_text = (f"adaptive {MIN_ITERS}-{MAX_ITERS} (about {runner.target_s * 1e3:.0f} ms of "
                      f"timed work per row)")
    else:
        iters_text = str(cfg.iters)
    sizes = cfg.sizes
    step = (f"+{fmt_size(cfg.raw['stepbytes'])}" if cfg.raw.get("stepbytes") else
            f"x{cfg.raw.get('stepfactor') or 4:g}")
    pr.line(f"# {PROG}: fourd {info['version']} (CUDA {'yes' if info['cuda'] else 'no'}) | MPI: "
            f"{mpi_first} | Python {vers['python']}, numpy {vers['numpy']}, mpi4py "
            f"{vers.get('mpi4py', '?')}" + (f", torch {vers['torch']}" if vers.get("torch") else ""))
    nhosts = len(set(hosts))
    pr.line(f"# ranks: {nranks} on {nhosts} host{'s' if nhosts > 1 else ''}; grid x={g['x']} "
            f"y={g['y']} z={g['z']} data={g['data']}, order {cfg.order}; {grid.num_nodes} "
            f"node{'s' if grid.num_nodes > 1 else ''}"
            f"{' (virtual: --ranks-per-node ' + str(cfg.ranks_per_node) + ')' if grid.virtual_topology else ''}"
            f" [{cfg.grid_source}]")
    pr.line(f"# sizes: {fmt_size(sizes[0])} .. {fmt_size(sizes[-1])} ({len(sizes)} size{'s' if len(sizes) > 1 else ''}, {step}); "
            f"iterations: {iters_text}; warm-up {cfg.warmup}; check {cfg.check}; "
            + (f"rounds {cfg.rounds} (rotated order; median round); " if cfg.rounds > 1 else "")
            + f"types "
            f"{','.join(cfg.dtypes)}; ops {','.join(cfg.ops)}")
    pr.line("# axes: " + "; ".join(
        f"{a.name} = groups of {a.group_size} ({axis_info[a.mask]['description']})" for a in cfg.axes))
    if cfg.timing == "batch":
        pr.line("# timing (--timing batch): time = the slowest rank's time for the whole batch of "
                "iterations run back to back, divided by the iterations (as nccl-tests), after a "
                "barrier; every group of an axis runs at once")
    else:
        pr.line("# timing: time = mean over iterations of the per-iteration maximum across all "
                "ranks, after a barrier; every group of an axis runs at once (the JSON also has "
                "min, median, p99 and the nccl-tests average across ranks)")
    be_text = (f"Be = {link_bps / 1e9:.3f} GB/s per node ({cfg.link_rate_source})" if link_bps
               else "Be = unknown (no --link-rate, no FOURD_CLUSTER_RATE_BPS)")
    pr.line(f"# bound: Bi = {intra_bps / 1e9:.2f} GB/s per rank (numpy copy of 16 MiB on every "
            f"rank at once; median, range {min(bw_all) / 1e9:.2f}-{max(bw_all) / 1e9:.2f}); "
            f"{be_text}; c = 2 for all_reduce, 1 otherwise; eff = bound / time")
    btxt = []
    for b in baselines:
        if b.library == "mpi":
            btxt.append("mpi = the MPI library's collective via mpi4py on the same ranks")
        else:
            btxt.append(f"torch = torch.distributed {b.version} gloo on the same ranks")
    pr.line(f"# baselines: {'; '.join(btxt) if btxt else 'none'}; vs = t_baseline / t_fourd "
            f"(> 1: fourd faster)")
    pr.line("#")
    pr.line(f"# {'rank':>5}  {'host':<24}{'node':>5}{'local':>6}{'x':>4}{'y':>4}{'z':>4}{'data':>6}")
    shown = placement if len(placement) <= 64 else placement[:32] + placement[-32:]
    for i, row in enumerate(shown):
        if len(placement) > 64 and i == 32:
            pr.line(f"#   ... {len(placement) - 64} more ranks ...")
        pr.line(f"# {row['rank']:>5}  {row['host'][:23]:<24}{row['node']:>5}{row['local_rank']:>6}"
                f"{row['x']:>4}{row['y']:>4}{row['z']:>4}{row['data']:>6}")
    for n in notes:
        pr.note(n)

    # ---- the sweep -------------------------------------------------------------------------------
    runner.skipped.extend(notes)
    progress.total = max(1, runner.cells)
    progress.t0 = time.perf_counter()
    runner.run()
    progress.clear()
    summary = report.summarize(runner.rows)
    duration = time.perf_counter() - t_start
    report.print_summary(pr, summary, duration, len(runner.skipped))
    rc = 1 if summary["wrong_total"] > 0 else 0

    # ---- files (rank 0), then agree on the status --------------------------------------------
    if rank == 0 and (cfg.json or cfg.csv or cfg.plot):
        doc = {
            "schema": report.SCHEMA,
            "schema_version": report.SCHEMA_VERSION,
            "start_time": start_time,
            "duration_s": round(duration, 3),
            "command": [PROG, *argv],
            "args": {
                **{k: v for k, v in cfg.raw.items()},
                "sizes": cfg.sizes, "dtypes": cfg.dtypes, "ops": cfg.ops,
                "collectives": cfg.collectives, "axes": [a.name for a in cfg.axes],
                "algorithms": cfg.algorithms, "baselines": cfg.baselines,
            },
            "environment": {
                **vers, "platform": platform.platform(), "hosts": sorted(set(hosts)),
                "cpu_count": os.cpu_count(), "env": _env_subset(),
            },
            "fourd": dict(info),
            "mpi": {"library": mpi_first, "library_version": "\n".join(mpi_lib),
                    "standard": "{}.{}".format(*MPI.Get_version()), "world_size": nranks,
                    "thread_level": info.get("mpi_thread_level")},
            "grid": {**g, "order": cfg.order, "ranks_per_node": cfg.ranks_per_node,
                     "num_nodes": grid.num_nodes, "virtual_topology": bool(grid.virtual_topology),
                     "source": cfg.grid_source, "world_size": nranks},
            "placement": placement,
            "topology": topo_doc,
            "timing": {
                "mode": cfg.timing,
                "time_us": ("the slowest rank's batch time / iterations (nccl-tests)"
                            if cfg.timing == "batch" else
                            "mean over timed iterations of the per-iteration maximum across ranks"),
                "time_us_rank_avg": "nccl-tests: mean over iterations and ranks",
                "percentiles": "time_us_min/median/p99/max over the per-iteration maxima",
                "barrier": "a world Allreduce (agreeing on the iteration count) before each "
                           "timed batch; no barrier between iterations",
                "concurrency": "every group of the axis runs at once",
                "iters": cfg.iters if cfg.iters is not None else f"adaptive {MIN_ITERS}-{MAX_ITERS}",
                "target_s_per_row": runner.target_s,
                "warmup": cfg.warmup, "check": cfg.check, "rounds": cfg.rounds,
                "clock": "time.perf_counter around each call, host side, blocking calls",
            },
            "bandwidth": {
                "intra_Bps": intra_bps, "intra_per_rank_Bps": bw_all,
                "intra_method": "numpy copy of 16 MiB, best of 5, every rank at once; median over ranks",
                "link_Bps": link_bps, "link_source": cfg.link_rate_source,
                "formula": "T_min = max(c(N-1)/N S/Be, c(k-1)/k S/Bi); c = 2 all_reduce, 1 "
                           "all_gather/reduce_scatter; broadcast S/Be, S/Bi",
            },
            "baselines": base_doc,
            "rows": runner.rows,
            "skipped": runner.skipped,
            "summary": summary,
            "ok": rc == 0,
        }
        try:
            if cfg.json:
                report.write_json(cfg.json, doc)
                pr.line(f"# wrote {cfg.json}", always=True)
            if cfg.csv:
                report.write_csv(cfg.csv, runner.rows)
                pr.line(f"# wrote {cfg.csv}", always=True)
            if cfg.plot:
                report.write_plot(cfg.plot, runner.rows,
                                  f"fourd {info['version']}, {nranks} ranks, grid x={g['x']} y={g['y']} "
                                  f"z={g['z']} data={g['data']}, {','.join(cfg.dtypes)}")
                pr.line(f"# wrote {cfg.plot}", always=True)
        except Exception as e:  # noqa: BLE001 - reported, and the status says so
            print(f"{PROG}: error: writing the output files failed: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
            rc = rc or 3
    rc = world.bcast(rc, root=0)
    return _finish(world, rc, cleanup)
