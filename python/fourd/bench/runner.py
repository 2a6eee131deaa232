"""The sweep: for every (collective, axis, dtype, op, size), every implementation, out-of-place
and in-place, a checked call, warm-up, then timed iterations.

Cross-rank invariants (why this cannot hang):
  * every decision that changes which collectives run is taken from values identical on every
    rank: the command line, the grid shape, static support rules, or results of a world
    Allreduce (which algorithms every group accepts at a size; whether the first, guarded call
    of a row failed anywhere, together with the iteration estimate);
  * a rank whose first call fails makes no further call in that row; the world then agrees to
    skip it, so no rank is left waiting in a later call;
  * only rank 0 prints or writes files, and it never communicates while doing so.

Timing: a world Allreduce (which doubles as the barrier, the failure agreement and the
iteration count), then each timed iteration is measured on every rank with time.perf_counter();
one Allgather of the per-rank times gives the per-iteration maximum across ranks and the
nccl-tests average. time_us is the mean over iterations of the per-iteration maximum; min,
median, p99 and max are over the same per-iteration maxima. Every group of the axis runs at
once, as in a real 4D job.
"""

from __future__ import annotations

import itertools
import math
import sys
import time

import numpy as np
from mpi4py import MPI

from . import bounds, check
from .libraries import Buffers
from .options import FLOATING, ITEMSIZE, REDUCING

TARGET_S = 0.05  # adaptive iterations: about this much timed work per row ...
SWEEP_BUDGET_S = 20.0  # ... or less, so that the timed work of a whole sweep stays near this
MIN_TARGET_S = 0.01
FIRST_CELL_WARMUP = 20  # extra untimed calls before the first timed cell of a run
LONG_CALL_S = 100e-6  # calls at least this long (the slowest rank's) ...
LONG_CALL_WARMUP = 12  # ... get at least this many warm-up calls
TUNING_MAX_CALLS = 3840  # auto: untimed calls until its tuning has settled, at most this many
#                          (the longest: below 256 KiB 4 candidates x 2 passes x (16 + 64)
#                          calls = 640, and for a switch 4 x 640 run provisionally and 640 more
#                          to re-check it)
MIN_ITERS = 3
MAX_ITERS = 1000  # 20 before: a 20 us cell then timed 0.4 ms of calls, and one 250 us
# scheduling stall of a rank (4 ranks on 2 cores) moved its mean 1.5x
# fourd errors raised by argument validation, before any communication: the same at every size.
_STATIC_ERRORS = ("InvalidArgumentError", "DTypeError")


def cell_count(collective: str, size: int, dtype: str, p: int) -> int:
    """Elements of S (nccl-tests rounding: a multiple of the group size for all-gather and
    reduce-scatter)."""
    n = size // ITEMSIZE[dtype]
    if collective in ("all_gather", "reduce_scatter"):
        n -= n % p
    return n


def target_seconds(cells: int) -> float:
    """Timed work per row for adaptive iterations: TARGET_S, less for very long sweeps."""
    return max(MIN_TARGET_S, min(TARGET_S, SWEEP_BUDGET_S / max(cells, 1)))


class Progress:
    """A one-line progress bar on rank 0's stderr, shown once a sweep has taken 2 s."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = max(total, 1), enabled
        self.done = 0
        self.t0 = time.perf_counter()
        self.shown = False

    def step(self, label: str, n: int = 1):
        self.done += n
        if not self.enabled or time.perf_counter() - self.t0 < 2.0:
            return
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(frac * 30)
        el = time.perf_counter() - self.t0
        eta = el / frac - el if frac > 0 else 0.0
        sys.stderr.write(f"\r\033[K[{bar:<30}] {frac * 100:3.0f}%  {el:5.0f} s, ~{eta:4.0f} s left  {label}")
        sys.stderr.flush()
        self.shown = True

    def clear(self):
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False


class Runner:
    def __init__(self, cfg, world, grid, impls, baselines, axis_info, intra_bps, link_bps,
                 printer, progress):
        self.cfg, self.world, self.grid = cfg, world, grid
        self.fourd_impls = impls  # FourdImpl per algorithm, "auto" first
        self.baselines = baselines  # MpiImpl / TorchImpl
        self.axis_info = axis_info  # mask -> dict(topology, nodes, k, bound nodes/k, model)
        self.intra_bps, self.link_bps = intra_bps, link_bps
        self.printer = printer
        self.progress = progress
        self.rows: list = []
        self.skipped: list = []
        self._notes_seen: set = set()
        self._failed: dict = {}  # (library/algorithm, axis, coll, dtype, op, in_place) -> reason
        self._cache: dict = {}
        self._first_cell = True
        self._last_impl = None  # (library, algorithm) of the cell measured last
        self.wrong_total = 0
        self.cells = self.total_cells()
        self.target_s = cfg.target_time if cfg.target_time is not None else target_seconds(self.cells)
        Buffers.reserve(max(cfg.sizes))  # every row's arrays come from these (libraries.py)

    # ---- notes -------------------------------------------------------------------------------
    def note(self, key, text):
        if key in self._notes_seen:
            return
        self._notes_seen.add(key)
        self.skipped.append(text)
        self.printer.note(text)

    # ---- data --------------------------------------------------------------------------------
    def _input(self, kind, op, dtype, p, g, n):
        key = ("in", kind, op, dtype, p, g, n)
        a = self._cache.get(key)
        if a is None:
            if kind == "gather":
                v = check.gather_input(g, n)
            elif kind == "bcast":
                v = check.gather_input(0, n) if g == 0 else np.zeros(n)
            else:
                v = check.reduce_input(op, dtype, p, g, n)
            a = self._cache[key] = check.to_storage(v, dtype)
        return a

    def _expected(self, collective, op, dtype, p, g, bufs):
        key = ("exp", collective, op, dtype, p, g, bufs.count)
        e = self._cache.get(key)
        if e is None:
            if collective == "all_reduce":
                e = check.reduced(op, dtype, p, 0, bufs.count)
            elif collective == "reduce_scatter":
                e = check.reduced(op, dtype, p, g * bufs.block, bufs.block)
            elif collective == "all_gather":
                e = check.gathered(p, bufs.block)
            else:
                e = check.gather_input(0, bufs.count)
            if op != "avg" or collective not in REDUCING:
                e = check.to_storage(e, dtype)  # exact integers: compare in the storage type
            self._cache[key] = e
        return e

    def _fill(self, impl, axis, bufs, inp, res, in_place, op, p):
        g = impl.group_rank(axis)
        c, dt = bufs.collective, bufs.dtype
        if c in REDUCING:
            if not in_place:
                res.fill(0)
            np.copyto(inp, self._input("reduce", op, dt, p, g, inp.size))
        elif c == "all_gather":
            res.fill(0)
            np.copyto(inp, self._input("gather", None, dt, p, g, inp.size))
        else:
            root = impl.root_group_rank(axis)
            np.copyto(res, self._input("bcast", None, dt, p, 0 if g == root else 1, res.size))

    def _verify(self, impl, axis, bufs, res, op, p) -> int:
        g = impl.group_rank(axis)
        exp = self._expected(bufs.collective, op, bufs.dtype, p, g, bufs)
        return check.count_wrong(res, bufs.dtype, exp, op if bufs.collective in REDUCING else None)

    # ---- one cell ----------------------------------------------------------------------------
    def measure(self, impl, axis, bufs, in_place, op, p):
        """Returns (stats dict, None) or (None, reason). Collective over the world.

        The first call is guarded. A rank whose call raised skips the checks and the warm-up;
        then one world Allreduce both agrees on failure (every rank skips the cell when any rank
        failed) and serves as the barrier before the timed batch, with the iteration estimate.
        fourd validates arguments identically on every rank of a group before communicating,
        so the ranks of one group fail or succeed together."""
        cfg = self.cfg
        local_err, est, wrong = None, 0.0, 0
        call = inp = res = None
        try:
            call, inp, res = impl.make_call(axis, bufs, in_place, op)
            if cfg.check > 0:
                self._fill(impl, axis, bufs, inp, res, in_place, op, p)
            t0 = time.perf_counter()
            call()
            est = time.perf_counter() - t0
            if cfg.check > 0:
                wrong += self._verify(impl, axis, bufs, res, op, p)
        except Exception as e:  # noqa: BLE001 - agreed on below, then reported as n/a
            local_err = f"{type(e).__name__}: {e}".strip()
        if local_err is None:
            for _ in range(max(0, cfg.check - 1)):
                self._fill(impl, axis, bufs, inp, res, in_place, op, p)
                call()
                wrong += self._verify(impl, axis, bufs, res, op, p)
            warm = cfg.warmup if cfg.check > 0 else max(0, cfg.warmup - 1)
            if self._first_cell:
                # The first cell of a run follows start-up (init's calibration, the bounds'
                # copies, baselines' set-up): measured at once, it ran 1.3-3x slower than the
                # same algorithm's later rows. A fixed count, the same on every rank.
                warm += FIRST_CELL_WARMUP
            for _ in range(warm):
                t0 = time.perf_counter()
                call()
                est = time.perf_counter() - t0
            if impl.library == "fourd" and impl.algorithm == "auto":
                # Tuning in use (docs/algorithms.md): the first calls of a size run auto's
                # shortlist in turn; measured once they have settled, as in a training run's
                # later steps. How many calls that took is in the row's auto_tuning.
                nbytes = bufs.count * ITEMSIZE[bufs.dtype]
                ex = self.grid.explain(bufs.collective, nbytes, axis.name,
                                       dtype=bufs.dtype, in_place=in_place)
                if not (ex["forced_by_env"] or ex["set_by_plan"]):
                    # The tuning's state alone on each call (explain prices every candidate).
                    comm = self.grid.communicator(axis.name)
                    for _ in range(TUNING_MAX_CALLS):
                        state = comm.tuning(bufs.collective, nbytes, bufs.dtype, in_place)["state"]
                        if state in ("settled", "single", "off"):
                            break
                        t0 = time.perf_counter()
                        call()
                        est = time.perf_counter() - t0
        self._first_cell = False
        flags = np.array([1.0 if local_err else 0.0, est])
        self.world.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
        if flags[0] > 0:
            reasons = self.world.allgather(local_err)
            return None, next((r for r in reasons if r), "failed on another rank")
        same_impl = self._last_impl == (impl.library, impl.algorithm)
        self._last_impl = (impl.library, impl.algorithm)
        if flags[1] >= LONG_CALL_S and cfg.warmup < LONG_CALL_WARMUP and not same_impl:
            # Long calls (the slowest rank's last warm-up, agreed above) get at least
            # LONG_CALL_WARMUP when another implementation ran just before: then the
            # point-to-point collectives (fourd's and MPICH's own; a bare 8 MiB Sendrecv too)
            # took 4-12 calls to reach their steady speed (8-16 MiB, 2 ranks), so with 5 the
            # first cell of a row (auto's) read up to 1.15x slower than the same algorithm's
            # own cell later in the row. The in-place cell follows its own out-of-place one.
            for _ in range(LONG_CALL_WARMUP - cfg.warmup):
                call()
        if cfg.iters is None:
            iters = int(min(MAX_ITERS, max(MIN_ITERS, math.ceil(self.target_s / max(flags[1], 1e-9)))))
        else:
            iters = cfg.iters
        ts = np.empty(iters + 1)
        if cfg.timing == "batch":
            # nccl-tests: the batch back to back, one clock read at each end; every iteration
            # gets the batch average, so the statistics below are those of the batch.
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            ts[:iters] = (time.perf_counter() - t0) / iters
        else:
            for i in range(iters):
                t0 = time.perf_counter()
                call()
                ts[i] = time.perf_counter() - t0
        ts[iters] = wrong
        allts = np.empty((self.world.Get_size(), iters + 1))
        self.world.Allgather(ts, allts)
        wrong_sum = round(allts[:, iters].sum())
        us = allts[:, :iters].max(axis=0) * 1e6  # per-iteration maximum across ranks
        return {
            "iters": iters,
            "time_us": float(us.mean()),
            "time_us_min": float(us.min()),
            "time_us_median": float(np.median(us)),
            "time_us_p99": float(np.percentile(us, 99)),
            "time_us_max": float(us.max()),
            "time_us_rank_avg": float(allts[:, :iters].mean() * 1e6),
            "times_us": [round(float(x), 3) for x in us],
            "wrong": wrong_sum if cfg.check > 0 else None,
        }, None

    # ---- the sweep ---------------------------------------------------------------------------
    def total_cells(self) -> int:
        """Rows the sweep will try (fourd algorithms that fourd.explain accepts at the largest
        size, every baseline, both placements); the same on every rank (one Allreduce)."""
        cfg = self.cfg
        n = 0
        for c in cfg.collectives:
            ops = [o for o in cfg.ops] if c in REDUCING else ["none"]
            for axis in cfg.axes:
                nf = 0
                for impl in self.fourd_impls:
                    if impl.algorithm == "auto":
                        nf += 1
                    elif c != "broadcast":
                        try:
                            ex = self.grid.explain(c, cfg.sizes[-1], axis.name)
                            cand = {x["algorithm"]: x for x in ex["candidates"]}.get(impl.algorithm)
                            nf += 1 if cand is None or cand.get("supported", True) else 0
                        except Exception:  # noqa: BLE001
                            nf += 1
                n += len(cfg.dtypes) * len(ops) * len(cfg.sizes) * (nf + len(self.baselines)) * 2
        return int(self.world.allreduce(n, op=MPI.MAX))

    def run(self):
        """The sweep. Without a torch baseline every row is printed as soon as it is measured.
        With one, the torch.distributed (gloo) cells of every row run in a second pass, after
        all the others: right after gloo's large collectives the next cells (the next row's
        auto cell first) ran 1.15-1.8x slower than the same algorithm a moment later, for more
        than a second and whatever the pause (4 ranks on 2 cores; the machine was idle in
        between, so no thread was left busy). The tables are then printed at the end."""
        cfg = self.cfg
        torch_b = [b for b in self.baselines if b.library == "torch"]
        first = list(self.fourd_impls) + [b for b in self.baselines if b.library != "torch"]
        pending = []  # rows waiting for their torch cells (second pass)
        for coll in cfg.collectives:
            for axis in cfg.axes:
                info = self.axis_info[axis.mask]
                if not torch_b:
                    self.printer.table_header(coll, axis, info)
                for dtype in cfg.dtypes:
                    ops = cfg.ops if coll in REDUCING else ["none"]
                    for op in ops:
                        if op == "avg" and dtype not in FLOATING:
                            self.note(("avg-int", dtype), f"avg on {dtype}: fourd averages floating "
                                      f"types only (skipped)")
                            self.progress.step("", len(cfg.sizes) * 2 * (len(self.fourd_impls) + len(self.baselines)))
                            continue
                        for size in cfg.sizes:
                            ctx = self._run_size(coll, axis, info, dtype, op, size, first)
                            if ctx is None:
                                continue
                            if torch_b:
                                pending.append(ctx)
                            else:
                                self._finish_size(ctx)
                if not torch_b:
                    self.printer.table_footer(coll, axis, self.rows)
        if not torch_b:
            return
        for _, table in itertools.groupby(pending, key=lambda c: (c["coll"], c["axis"].mask)):
            table = list(table)
            coll, axis = table[0]["coll"], table[0]["axis"]
            self.printer.table_header(coll, axis, table[0]["info"])
            for ctx in table:
                bufs = Buffers(coll, ctx["dtype"], ctx["count"], axis.group_size,
                               check.NUMPY_STORAGE[ctx["dtype"]])
                if cfg.check == 0:
                    bufs.zero()
                self._measure_impls(ctx, torch_b, bufs)
                self._finish_size(ctx)
            self.printer.table_footer(coll, axis, self.rows)

    def _run_size(self, coll, axis, info, dtype, op, size, impls):
        """Measures the cells of `impls` for one row; returns the row's context (None when
        the size is too small for the group)."""
        cfg = self.cfg
        p = axis.group_size
        count = cell_count(coll, size, dtype, p)
        nimpl = len(self.fourd_impls) + len(self.baselines)
        if count == 0:
            self.note(("small", coll, axis.mask, dtype, size),
                      f"{coll} {axis.name} {dtype}: {size} B is less than one element per rank (skipped)")
            self.progress.step("", nimpl * 2)
            return None
        nbytes = count * ITEMSIZE[dtype]
        bufs = Buffers(coll, dtype, count, p, check.NUMPY_STORAGE[dtype])
        if cfg.check == 0:
            bufs.zero()
        opname = op if coll in REDUCING else "none"
        real_op = op if coll in REDUCING else "sum"
        # What auto runs, per placement (measured corrections of the model may differ).
        explained = {}
        for in_place in (False, True):
            try:
                explained[in_place] = self.grid.explain(coll, nbytes, axis.name, dtype=dtype,
                                                        in_place=in_place)
            except Exception as e:  # noqa: BLE001 - a collective explain does not cover
                explained[in_place] = {"candidates": [], "choice": None, "error": str(e)}
        cands = {c["algorithm"]: c for c in explained[False].get("candidates", [])}
        # What fourd.explain accepts can differ between the groups of an axis (uneven nodes);
        # run an algorithm only where every group accepts it (one Allreduce per size).
        ok = np.array([0 if (i.algorithm in cands and not cands[i.algorithm].get("supported", True))
                       else 1 for i in self.fourd_impls], dtype=np.int32)
        if ok.size:
            self.world.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)
        runnable = {i.algorithm: bool(f) for i, f in zip(self.fourd_impls, ok)}
        bnd = bounds.bound(coll, nbytes, info["bound_nodes"], info["bound_k"], self.intra_bps,
                           self.link_bps)
        ctx = {"coll": coll, "axis": axis, "info": info, "dtype": dtype, "opname": opname,
               "real_op": real_op, "size": size, "nbytes": nbytes, "count": count, "bnd": bnd,
               "explained": explained, "cands": cands, "runnable": runnable, "group": []}
        self._measure_impls(ctx, impls, bufs)
        self._cache.clear()
        return ctx

    def _measure_impls(self, ctx, impls, bufs):
        """The cells of `impls` for the row `ctx`, added to ctx["group"].

        With --rounds R every cell is measured R times: round r runs the implementations in
        the order rotated by r (each in-place cell right after its own out-of-place one), so
        that whatever the position in a row costs (the first cell after another row's, a drift
        of the machine's load) falls on every implementation alike; each cell reports its
        median round (the lower middle one for even R) and keeps every round's time."""
        coll, axis, dtype, size = ctx["coll"], ctx["axis"], ctx["dtype"], ctx["size"]
        cands, runnable = ctx["cands"], ctx["runnable"]
        todo = []
        for impl in impls:
            if impl.library == "fourd" and impl.algorithm != "auto" and coll == "broadcast":
                if self.cfg.algorithms_requested:
                    self.note(("bcast-alg",), "broadcast: fourd.broadcast takes no algorithm "
                              "argument, so only auto is measured")
                continue
            if impl.library == "fourd" and not runnable[impl.algorithm]:
                cand = cands.get(impl.algorithm)
                local = cand is not None and not cand.get("supported", True)
                reason = (cand.get("reason") or "not supported") if local else \
                    "fourd.explain rejects it for another group of this axis"
                self.note(("alg", impl.algorithm, reason),
                          f"{impl.algorithm} on {axis.name}: {reason} (skipped)")
                continue
            if impl.library == "fourd" and dtype == "bfloat16" and not _have_torch():
                self.note(("bf16-torch",), "bfloat16 rows need torch to pass the buffer to fourd (skipped)")
                self.progress.step("", 2)
                continue
            todo.append(impl)
        rounds = self.cfg.rounds
        measured = {id(impl): {} for impl in todo}  # in_place -> [stats...] or a reason
        for r in range(rounds):
            for j in range(len(todo)):
                impl = todo[(j + r) % len(todo)]
                cells = measured[id(impl)]
                for in_place in (False, True):
                    if r > 0 and not isinstance(cells.get(in_place), list):
                        continue  # n/a in the first round: n/a in all
                    got = self._measure_cell(ctx, impl, bufs, in_place)
                    if isinstance(got, dict):
                        cells.setdefault(in_place, []).append(got)
                    else:
                        cells[in_place] = got
                    if r == rounds - 1:
                        self.progress.step(f"{coll} {axis.name} {size} B {impl.label}")
        # What auto ran: asked again now, since tuning in use may have settled on another
        # algorithm than the model's choice during the row (docs/algorithms.md).
        # Each group settles on its own, so the groups of an axis may run different algorithms
        # (docs/algorithms.md): every group's choice, by the group's lowest world rank.
        if any(i.library == "fourd" and i.algorithm == "auto" for i in todo):
            lowest = min(self.grid.ranks(axis.name))
            for in_place in (False, True):
                try:
                    ctx["explained"][in_place] = self.grid.explain(
                        coll, ctx["nbytes"], axis.name, dtype=dtype, in_place=in_place)
                except Exception:  # noqa: BLE001 - as when the row began
                    pass
                mine = (lowest, ctx["explained"][in_place].get("choice"))
                ctx["explained"][in_place]["group_choices"] = \
                    [c for _, c in sorted(set(self.world.allgather(mine)), key=lambda t: (t[0], str(t[1])))]
        for impl in todo:
            cells = {}
            for in_place, got in measured[id(impl)].items():
                if isinstance(got, list):
                    got.sort(key=lambda st: st["time_us"])
                    stats = dict(got[(len(got) - 1) // 2])
                    stats["rounds"] = len(got)
                    stats["round_times_us"] = [round(st["time_us"], 3) for st in got]
                    if stats["wrong"] is not None:  # every round's checks count
                        stats["wrong"] = sum(st["wrong"] for st in got)
                    cells[in_place] = self._row(coll, axis, ctx["info"], impl, dtype, ctx["opname"],
                                                size, ctx["nbytes"], ctx["count"], in_place,
                                                stats, ctx["bnd"], ctx["explained"][in_place])
                else:
                    cells[in_place] = got
            if any(isinstance(v, dict) for v in cells.values()):
                ctx["group"].append((impl, cells))
        self._cache.clear()

    def _measure_cell(self, ctx, impl, bufs, in_place):
        """One cell: its stats, or the reason it is n/a (noted once)."""
        coll, axis, dtype = ctx["coll"], ctx["axis"], ctx["dtype"]
        opname, real_op = ctx["opname"], ctx["real_op"]
        key = (impl.library, impl.algorithm, axis.mask, coll, dtype, opname, in_place)
        why = impl.unsupported(coll, dtype, real_op if coll in REDUCING else None, in_place)
        if why is not None:
            self.note(("static", impl.library, why), f"{impl.library}: {why} (n/a)")
            return why
        why = self._failed.get(key)
        if why is not None:
            return why
        stats, reason = self.measure(impl, axis, bufs, in_place, real_op, axis.group_size)
        if stats is not None:
            return stats
        # Static for the baselines (a dtype or op they lack), per size for fourd.
        if impl.library != "fourd" or reason.startswith(_STATIC_ERRORS) or "not built" in reason:
            self._failed[key] = reason
        where = "in-place" if in_place else "out-of-place"
        self.note(("fail", impl.library, coll, in_place, reason),
                  f"{impl.library} {coll} {where}: {reason} (n/a; first seen with "
                  f"{impl.label} on {axis.name}, {dtype} {opname}, {ctx['nbytes']} B)")
        return reason

    def _finish_size(self, ctx):
        """Ratios, rows and the printed lines of one measured row."""
        group = ctx["group"]
        # Ratios: baseline time / fourd time, same placement (>1: fourd is faster).
        for impl, cells in group:
            if impl.library != "fourd":
                continue
            for in_place, row in cells.items():
                if not isinstance(row, dict):
                    continue
                for b in self.baselines:
                    other = next((c.get(in_place) for i, c in group if i is b), None)
                    r = None
                    if isinstance(other, dict) and row["time_us"] > 0:
                        r = other["time_us"] / row["time_us"]
                    row[f"ratio_vs_{b.library}"] = r
        for impl, cells in group:
            for in_place in (False, True):
                row = cells.get(in_place)
                if isinstance(row, dict):
                    self.rows.append(row)
                    if row["wrong"]:
                        self.wrong_total += row["wrong"]
        self.printer.size_rows(ctx["coll"], ctx["axis"], ctx["dtype"], ctx["opname"], ctx["size"],
                               ctx["nbytes"], ctx["count"], ctx["bnd"], group,
                               [b.library for b in self.baselines])

    def _row(self, coll, axis, info, impl, dtype, opname, size, nbytes, count, in_place, stats,
             bnd, explained):
        cands = {c["algorithm"]: c for c in explained.get("candidates", [])}
        p = axis.group_size
        algbw, busbw = bounds.bandwidths(coll, nbytes, p, stats["time_us"] * 1e-6)
        row = {
            "collective": coll,
            "axis": axis.name,
            "library": impl.library,
            "algorithm": impl.algorithm,
            "in_place": in_place,
            "size_bytes": nbytes,
            "requested_bytes": size,
            "count": count,
            "dtype": dtype,
            "op": opname,
            "group_size": p,
            "groups": self.world.Get_size() // p,
            "nodes": info["nodes"],
            "ranks_per_node": info["k"],
            "warmup": self.cfg.warmup,
            "check_iters": self.cfg.check,
            "rounds": stats.get("rounds", 1),
            **stats,
            "algbw_gbps": algbw,
            "busbw_gbps": busbw,
            "bus_factor": bounds.bus_factor(coll, p),
            "bound_us": bnd["t_min_s"] * 1e6 if bnd else None,
            "bound_sum_us": bnd["t_sum_s"] * 1e6 if bnd else None,
            "efficiency": (bnd["t_min_s"] * 1e6 / stats["time_us"]) if bnd and stats["time_us"] > 0 else None,
            "auto_choice": None,
            "auto_tuning": None,
            "auto_choices": None,
            "predicted_us": None,
            "ratio_vs_mpi": None,
            "ratio_vs_torch": None,
        }
        if impl.library == "fourd":
            if impl.algorithm == "auto":
                row["auto_choice"] = explained.get("choice")
                row["auto_tuning"] = explained.get("tuning")
                row["auto_choices"] = explained.get("group_choices")
                cand = cands.get(explained.get("choice") or "")
            else:
                cand = cands.get(impl.algorithm)
            if cand is not None and cand.get("predicted_s") is not None:
                ps = float(cand["predicted_s"])
                row["predicted_us"] = ps * 1e6 if math.isfinite(ps) else None
        return row


def _have_torch() -> bool:
    return "torch" in sys.modules
