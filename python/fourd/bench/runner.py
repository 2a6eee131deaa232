"""The sweep: for every (collective, axis, dtype, op, size), every implementation, out-of-place
and in-place, a checked call, warm-up, then timed iterations.

Cross-rank invariants (why this cannot hang):
  * every decision that changes which collectives run is taken from values identical on every
    rank: the command line, the grid shape, static support rules, or results of a world
    Allreduce (which algorithms every group accepts at a size; whether the first, guarded call
    of a row failed anywhere, together with the iteration estimate);
  * a rank whose first call fails makes no further call in that row; the world then agrees to
    skip it, so no rank is left waiting in a later call;
  * only rank 0 prints or writes files, and it never communicates while doing so;
  * a signal (stop.py) is acted on only through that same Allreduce, so every rank stops
    after the same cell.

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
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from fourd import _C
from fourd._tensor import ITEMSIZE

from . import bounds, check
from .collectives import TABLE, Collective
from .libraries import Buffers
from .printer import algorithm_width
from .report import RATIO_BASELINES, VERSUS_FOURD, fmt_size
from .stop import Stopped, signal_name

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
MAX_ITERS = 1000  # a 20 us cell timed over only 20 calls (0.4 ms) moved 1.5x with one 250 us
#                   scheduling stall of a rank (4 ranks on 2 cores)
CELL_OVERHEAD_S = 0.003  # the estimate's cost of a cell beyond its calls (Runner._estimate)
# fourd errors raised by argument validation, before any communication: the same at every size.
_STATIC_ERRORS = ("InvalidArgumentError", "DTypeError")
_SETTLED = ("settled", "single", "off")  # tuning states in which auto runs one algorithm


def cell_count(collective: str, size: int, dtype: str, p: int) -> int:
    """Elements of S (nccl-tests rounding: a multiple of the group size for the collectives
    whose S is one block per rank, all-gather and reduce-scatter)."""
    n = size // ITEMSIZE[dtype]
    if TABLE[collective].blocked:
        n -= n % p
    return n


def target_seconds(cells: int) -> float:
    """Timed work per row for adaptive iterations: TARGET_S, less for very long sweeps."""
    return max(MIN_TARGET_S, min(TARGET_S, SWEEP_BUDGET_S / max(cells, 1)))


@dataclass
class SizeRow:
    """One (collective, axis, dtype, op, size) of the sweep: what the cells of every
    implementation in it share, and (in `group`) what they measured."""

    coll: Collective
    axis: object  # options.AxisSpec
    info: dict  # the axis' topology and bound model (cli.py)
    dtype: str
    opname: str  # the row's op; "none" for a collective without one
    real_op: str  # the op the calls are given ("sum" where the collective has none)
    size: int  # the size asked for
    nbytes: int  # S after rounding
    count: int  # elements of S
    bnd: dict | None  # bounds.bound()
    explained: dict  # in_place -> Grid.explain() of fourd's auto
    cands: dict  # algorithm -> explain's candidate (out of place)
    runnable: dict  # algorithm -> every group of the axis accepts it
    group: list = field(default_factory=list)  # (impl, {in_place: row dict or reason})
    finished: int = 0  # entries of `group` already recorded and printed


def explore_seconds(nbytes: int, times: dict, choice) -> float:
    """The seconds auto's tuning in use spends exploring one (collective, size, dtype): per
    candidate of its shortlist, two passes of untimed and timed calls, at the candidate's
    predicted time. The shortlist and the counts are docs/algorithms.md's ("Tuning in use",
    steps 1 and 2; cpp/src/internal/tuner.hpp): below 256 KiB every supported algorithm, 16
    untimed and 64 timed calls; above, the algorithms predicted within 4x of the choice, four
    at most, 2 untimed calls below 4 MiB (as many as carry 96 MiB, 2 to 6, from 4 MiB) and
    timed calls carrying 12 MiB (3 to 12). Grid.tuning reports these only once a size has
    been called ("explore_calls"), so the estimate states them here; a native figure before
    the first call would replace this copy."""
    algs = {a: t for a, t in times.items() if a != "auto"}
    best = algs.get(choice or "")
    if best is None or len(algs) < 2:
        return 0.0  # one candidate: nothing is explored ("single")
    mib = 1 << 20
    if nbytes < 256 * 1024:
        shortlist, untimed, timed = list(algs.values()), 16, 64
    else:
        shortlist = sorted(t for t in algs.values() if t <= 4.0 * best)[:4]
        untimed = 2 if nbytes < 4 * mib else min(6, max(2, 96 * mib // nbytes))
        timed = min(12, max(3, 12 * mib // max(nbytes, 1)))
    if len(shortlist) < 2:
        return 0.0
    return 2 * (untimed + timed) * sum(shortlist)


class Runner:
    """The sweep over the planned cells of a session (session.py); collective over the world.
    `stop`: the StopRequest whose signal the cells' agreement carries (stop.py)."""

    def __init__(self, s, stop=None):
        cfg = s.cfg
        self.cfg, self.world, self.grid = cfg, s.world, s.grid
        self.fourd_impls = s.impls  # FourdImpl per algorithm, "auto" first
        self.baselines = s.baselines  # MpiImpl / TorchImpl
        self.axis_info = s.axis_info  # mask -> dict(topology, nodes, k, bound nodes/k, model)
        self.intra_bps, self.link_bps = s.intra_bps, s.link_bps
        self.latency_s = s.latency_s
        self.printer = s.printer
        self.progress = s.progress
        self.stop = stop
        self.stopped = 0  # the signal every rank agreed to stop on (0: none)
        self.on_row = None  # called after each measured size is recorded (rank 0: the files)
        self.wall_s: dict = {}  # implementation label -> seconds its cells took
        self.rows: list = []
        self.skipped: list = []
        self._notes_seen: set = set()
        self._failed: dict = {}  # (library/algorithm, axis, coll, dtype, op, in_place) -> reason
        self._oracle = check.Oracle()
        self._first_cell = True
        # (collective, dtype, in place, bytes) of auto's cells timed before its tuning settled
        self._unsettled: set = set()
        self._last_impl = None  # (library, algorithm) of the cell measured last
        self.wrong_total = 0
        self._cell_est: dict = {}  # (collective, mask, size, library, algorithm) -> seconds
        self.cells = self.total_cells()
        self.target_s = (
            cfg.target_time if cfg.target_time is not None else target_seconds(self.cells)
        )
        self.estimate_s = self._estimate()
        self.printer.alg_width = algorithm_width(
            [i.label for i in (*self.fourd_impls, *self.baselines)],
            [i.algorithm for i in self.fourd_impls],
        )
        Buffers.reserve(max(cfg.sizes))  # every row's arrays come from these (libraries.py)

    # ---- notes -------------------------------------------------------------------------------
    def note(self, key, text):
        if key in self._notes_seen:
            return
        self._notes_seen.add(key)
        self.skipped.append(text)
        self.printer.note(text)

    # ---- the check ---------------------------------------------------------------------------
    def _fill(self, impl, axis, bufs, inp, res, in_place, op, p):
        self._oracle.fill(
            bufs.coll,
            inp,
            res,
            in_place,
            op,
            bufs.dtype,
            p,
            impl.group_rank(axis),
            impl.root_group_rank(axis),
        )

    def _verify(self, impl, axis, bufs, res, op, p) -> int:
        return self._oracle.wrong(
            bufs.coll, res, op, bufs.dtype, p, impl.group_rank(axis), bufs.count, bufs.block
        )

    # ---- one cell ----------------------------------------------------------------------------
    def measure(self, impl, axis, bufs, in_place, op, p):
        """Returns (stats dict, None) or (None, reason). Collective over the world.

        The first call is guarded. A rank whose call raised skips the checks and the warm-up;
        then one world Allreduce both agrees on failure (every rank skips the cell when any rank
        failed) and serves as the barrier before the timed batch, with the iteration estimate.
        fourd validates arguments identically on every rank of a group before communicating,
        so the ranks of one group fail or succeed together. The same Allreduce carries a
        signal any rank received (stop.py): then every rank raises Stopped here."""
        call, local_err, est, wrong = self._prepare(impl, axis, bufs, in_place, op, p)
        self._first_cell = False
        signum = self.stop.signum if self.stop is not None else 0
        flags = np.array([1.0 if local_err else 0.0, est, float(signum)])
        self.world.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
        if flags[2] > 0:
            raise Stopped(int(flags[2]))
        if flags[0] > 0:
            reasons = self.world.allgather(local_err)
            return None, next((r for r in reasons if r), "failed on another rank")
        self._settle(impl, call, flags[1])
        if self.cfg.iters is None:
            iters = int(
                min(MAX_ITERS, max(MIN_ITERS, math.ceil(self.target_s / max(flags[1], 1e-9))))
            )
        else:
            iters = self.cfg.iters
        ts = self._timed(call, iters)
        ts[iters] = wrong
        return self._stats(ts, iters), None

    def _prepare(self, impl, axis, bufs, in_place, op, p):
        """The guarded first call (checked), the other checked calls and the warm-up:
        (call, this rank's error or None, seconds of the last call, wrong elements)."""
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
            est = self._warm_up(impl, axis, bufs, in_place, call, est)
        return call, local_err, est, wrong

    def _warm_up(self, impl, axis, bufs, in_place, call, est: float) -> float:
        """-w untimed calls (more for the first cell of a run), then auto's wait for its
        tuning; returns the seconds of the last call."""
        cfg = self.cfg
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
        where = impl.tuned_axis(axis)
        if where is not None:
            est = self._wait_for_tuning(where, bufs, in_place, call, est)
        return est

    def _wait_for_tuning(self, where, bufs, in_place, call, est: float) -> float:
        """Tuning in use (docs/algorithms.md): the first calls of a size run auto's shortlist
        in turn; auto is measured once they have settled, as in a training run's later steps.
        How many calls that took is in the row's auto_tuning. `where`: the axis argument of
        the calls' tuning (an axis name; the group's Subgroup for torch-fourd, whose calls
        run auto on the fourd communicator of its torch group)."""
        nbytes = bufs.count * ITEMSIZE[bufs.dtype]
        ex = self.grid.explain(bufs.collective, nbytes, where, dtype=bufs.dtype, in_place=in_place)
        if ex["forced_by_env"] or ex["set_by_plan"]:
            return est
        # An explicit -w bounds this wait too: the user asked for that many untimed calls.
        limit = self.cfg.warmup if self.cfg.warmup_requested else TUNING_MAX_CALLS
        state = None
        # The tuning's state alone on each call (Grid.tuning): Grid.explain prices every
        # candidate, too slow to ask between calls.
        for i in range(limit + 1):
            state = self.grid.tuning(bufs.collective, nbytes, where, bufs.dtype, in_place)["state"]
            if state in _SETTLED or i == limit:
                break
            t0 = time.perf_counter()
            call()
            est = time.perf_counter() - t0
        if state not in _SETTLED and self.cfg.warmup_requested:
            self._unsettled.add((bufs.collective, bufs.dtype, bool(in_place), nbytes))
            self.note(
                ("unsettled",),
                f"auto was timed before its tuning settled in some cells: -w {self.cfg.warmup} "
                "also bounds auto's untimed calls (leave -w out to let it settle, up to "
                f"{TUNING_MAX_CALLS}); those cells include calls of its other candidates, and "
                "their auto_tuning.state says so",
            )
        return est

    def _settle(self, impl, call, slowest: float) -> None:
        """More warm-up for long calls right after another implementation's cell."""
        same_impl = self._last_impl == (impl.library, impl.algorithm)
        self._last_impl = (impl.library, impl.algorithm)
        warmup = self.cfg.warmup
        if slowest >= LONG_CALL_S and warmup < LONG_CALL_WARMUP and not same_impl:
            # Long calls (the slowest rank's last warm-up, agreed above) get at least
            # LONG_CALL_WARMUP when another implementation ran just before: then the
            # point-to-point collectives (fourd's and MPICH's own; a bare 8 MiB Sendrecv too)
            # took 4-12 calls to reach their steady speed (8-16 MiB, 2 ranks), so with 5 the
            # first cell of a row (auto's) read up to 1.15x slower than the same algorithm's
            # own cell later in the row. The in-place cell follows its own out-of-place one.
            for _ in range(LONG_CALL_WARMUP - warmup):
                call()

    def _timed(self, call, iters: int) -> np.ndarray:
        """The timed calls: seconds per iteration, and one spare slot at the end."""
        ts = np.empty(iters + 1)
        if self.cfg.timing == "batch":
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
        return ts

    def _stats(self, ts: np.ndarray, iters: int) -> dict:
        """Every rank's times (and, in the last slot, wrong elements) gathered: the cell's
        statistics over the per-iteration maxima across ranks."""
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
            "wrong": wrong_sum if self.cfg.check > 0 else None,
        }

    # ---- planning the cells ------------------------------------------------------------------
    def total_cells(self) -> int:
        """Rows the sweep will try (fourd algorithms that fourd.explain accepts at the largest
        size, every baseline, both placements); the same on every rank (one Allreduce)."""
        cfg = self.cfg
        n = 0
        self._plan = {}  # (collective, mask) -> the implementations planned
        for c in cfg.collectives:
            ops = [o for o in cfg.ops] if TABLE[c].reduces else ["none"]
            for axis in cfg.axes:
                nf = [impl for impl in self.fourd_impls if self._planned(impl, c, axis)]
                self._plan[(c, axis.mask)] = nf + list(self.baselines)
                n += (
                    len(cfg.dtypes)
                    * len(ops)
                    * len(cfg.sizes)
                    * (len(nf) + len(self.baselines))
                    * 2
                )
        return int(self.world.allreduce(n, op=MPI.MAX))

    # ---- the estimate ------------------------------------------------------------------------
    def _estimate(self) -> float:
        """Seconds the sweep should take (the header's estimate), and each planned cell's share
        in self._cell_est (the progress bar's time left); the same on every rank (one
        Allreduce).

        A cell, per round: its calls (checked, warm-up, timed) at the time one call should take,
        plus CELL_OVERHEAD_S (the agreement, the gathering of the times, the row's
        bookkeeping); auto adds, once per (size, dtype, op), the calls its tuning explores
        (explore_seconds; its re-checks after a switch are not counted). One call's time is
        fourd's cost model's (Grid.explain): the algorithm's prediction, auto's choice's for
        auto and the baselines, and for torch no less than gloo's small all_reduce timed on
        the measured groups at its start, far above the model's on a machine with more ranks
        than cores."""
        cfg, total, first = self.cfg, 0.0, True
        for c in cfg.collectives:
            coll = TABLE[c]
            variants = len(cfg.dtypes) * (len(cfg.ops) if coll.reduces else 1)
            op = cfg.ops[0] if coll.reduces else None
            for axis in cfg.axes:
                for size in cfg.sizes:
                    times, explore_s = self._call_seconds(c, size, axis)
                    for impl in self._plan[(c, axis.mask)]:
                        t = times.get(impl.algorithm, times["auto"])
                        if impl.library == "torch":
                            t = max(t, getattr(impl, "latency_s", 0.0))
                        both = sum(
                            impl.unsupported(c, cfg.dtypes[0], op, ip) is None
                            for ip in (False, True)
                        )
                        extra = explore_s if impl.algorithm == "auto" else 0.0
                        e = self._cell_seconds(t, first) + extra / max(both, 1)
                        first = False
                        self._cell_est[(c, axis.mask, size, impl.library, impl.algorithm)] = e
                        total += e * both * variants
        return float(self.world.allreduce(total, op=MPI.MAX))

    def _call_seconds(self, collective: str, size: int, axis) -> tuple[dict, float]:
        """({algorithm: predicted seconds of one call, "auto": its choice's}, the seconds
        auto's tuning explores at this size), from Grid.explain."""
        fallback = max(self.latency_s or 1e-6, size / max(self.intra_bps, 1.0))
        try:
            ex = self.grid.explain(collective, size, axis.name)
        except Exception:  # noqa: BLE001 - a collective explain does not cover
            return {"auto": fallback}, 0.0
        times = {
            x["algorithm"]: float(x["predicted_s"])
            for x in ex.get("candidates", [])
            if x.get("supported", True)
            and x.get("predicted_s") is not None
            and math.isfinite(float(x["predicted_s"]))
        }
        times["auto"] = times.get(ex.get("choice") or "", fallback)
        explore = 0.0
        if TABLE[collective].takes_algorithm and ex.get("source") in (None, "model"):
            explore = explore_seconds(size, times, ex.get("choice"))
            if self.cfg.warmup_requested:  # -w N bounds the wait (_wait_for_tuning)
                explore = min(explore, self.cfg.warmup * times["auto"])
        return times, explore

    def _cell_seconds(self, t: float, first: bool) -> float:
        """One cell's seconds (both rounds of its calls) at `t` seconds per call."""
        cfg = self.cfg
        iters = cfg.iters or int(
            min(MAX_ITERS, max(MIN_ITERS, math.ceil(self.target_s / max(t, 1e-9))))
        )
        untimed = max(cfg.check, 1) + (cfg.warmup if cfg.check > 0 else max(0, cfg.warmup - 1))
        if t >= LONG_CALL_S:
            untimed += max(0, LONG_CALL_WARMUP - cfg.warmup)
        if first:
            untimed += FIRST_CELL_WARMUP
        return cfg.rounds * ((iters + untimed) * t + CELL_OVERHEAD_S)

    def _planned(self, impl, collective: str, axis) -> int:
        """1 when fourd's `impl` is planned for the collective on `axis`, else 0."""
        if impl.algorithm == "auto":
            return 1
        if not TABLE[collective].takes_algorithm:
            return 0
        try:
            ex = self.grid.explain(collective, self.cfg.sizes[-1], axis.name)
            cand = {x["algorithm"]: x for x in ex["candidates"]}.get(impl.algorithm)
            return 1 if cand is None or cand.get("supported", True) else 0
        except Exception:  # noqa: BLE001
            return 1

    # ---- the sweep ---------------------------------------------------------------------------
    def run(self):
        """The sweep. Each size's lines are printed, and on_row called, as soon as its cells
        are measured. The torch.distributed (gloo) cells of every row run in a second pass,
        after all the others, in tables of their own: right after gloo's large collectives the
        next cells (the next row's auto cell first) ran 1.15-1.8x slower than the same
        algorithm a moment later, for more than a second and whatever the pause (4 ranks on 2
        cores; the machine was idle in between, so no thread was left busy). A signal agreed
        on (stop.py) ends the sweep after the cell in flight: self.stopped."""
        torch_b = [b for b in self.baselines if b.library == "torch"]
        first = list(self.fourd_impls) + [b for b in self.baselines if b.library != "torch"]
        pending = []  # rows waiting for their torch cells (second pass)
        for coll in self.cfg.collectives:
            for axis in self.cfg.axes:
                pending += self._sweep_table(TABLE[coll], axis, first, later=bool(torch_b))
                if self.stopped:
                    return
        if torch_b:
            self._torch_pass(pending, torch_b)

    def _variants(self, coll: Collective, axis):
        """The (dtype, op) of a table's rows; avg on an integer type is noted and skipped."""
        cfg = self.cfg
        for dtype in cfg.dtypes:
            for op in cfg.ops if coll.reduces else ["none"]:
                if op == "avg" and dtype not in _C.FLOATING_DTYPES:
                    self.note(
                        ("avg-int", dtype),
                        f"avg on {dtype}: fourd averages floating types only (skipped)",
                    )
                    self.progress.step(
                        "", len(cfg.sizes) * 2 * (len(self.fourd_impls) + len(self.baselines))
                    )
                    continue
                yield dtype, op

    def _sweep_table(self, coll: Collective, axis, impls, later: bool) -> list:
        """The rows of one (collective, axis) table for `impls`, printed as they come; returns
        them for the torch pass (`later`)."""
        info = self.axis_info[axis.mask]
        ratio_libs = ratio_columns(impls)
        self.printer.table_header(coll.name, axis, info, [f"vs {lib}" for lib in ratio_libs])
        pending = []
        for dtype, op in self._variants(coll, axis):
            for size in self.cfg.sizes:
                row = self._run_size(coll, axis, info, dtype, op, size, impls)
                if row is not None:
                    self._finish_size(row, ratio_libs)
                    if later:
                        pending.append(row)
                if self.stopped:
                    break
            if self.stopped:
                break
        self.printer.table_footer(coll.name, axis, self.rows)
        return pending

    def _torch_pass(self, pending: list, torch_b: list) -> None:
        """The torch.distributed cells of every row, each table's lines printed as they come,
        with auto's cell of the same size and placement to compare."""
        libs = [b.library for b in torch_b]
        for _, table in itertools.groupby(pending, key=lambda r: (r.coll.name, r.axis.mask)):
            table = list(table)
            coll, axis = table[0].coll, table[0].axis
            self.printer.table_header(
                coll.name,
                axis,
                table[0].info,
                ["auto vs"],
                title=f"# {coll.name} on {axis.name}: torch.distributed (gloo), measured after "
                "every other cell; auto vs = t_torch / t_auto at the same size and placement "
                "(> 1: fourd's auto faster)",
            )
            for row in table:
                bufs = Buffers(coll.name, row.dtype, row.count, axis.group_size)
                if self.cfg.check == 0:
                    bufs.zero()
                self._measure_impls(row, torch_b, bufs)
                auto = next(
                    (c for i, c in row.group if i.library == "fourd" and i.algorithm == "auto"), {}
                )
                self._finish_size(row, [], versus=auto)
                if self.stopped:
                    break
            self.printer.table_footer(coll.name, axis, self.rows, libraries=libs)
            if self.stopped:
                return

    def _run_size(self, coll: Collective, axis, info, dtype, op, size, impls):
        """Measures the cells of `impls` for one row; returns the row (None when the size is
        too small for the group)."""
        p = axis.group_size
        count = cell_count(coll.name, size, dtype, p)
        if count == 0:
            self.note(
                ("small", coll.name, axis.mask, dtype, size),
                f"{coll.name} {axis.name} {dtype}: {size} B is less than one element per rank "
                "(skipped)",
            )
            self.progress.step("", (len(self.fourd_impls) + len(self.baselines)) * 2)
            return None
        nbytes = count * ITEMSIZE[dtype]
        bufs = Buffers(coll.name, dtype, count, p)
        if self.cfg.check == 0:
            bufs.zero()
        explained = self._explain(coll.name, nbytes, axis, dtype)
        cands = {c["algorithm"]: c for c in explained[False].get("candidates", [])}
        row = SizeRow(
            coll=coll,
            axis=axis,
            info=info,
            dtype=dtype,
            opname=op if coll.reduces else "none",
            real_op=op if coll.reduces else "sum",
            size=size,
            nbytes=nbytes,
            count=count,
            bnd=bounds.bound(
                coll.name,
                nbytes,
                info["bound_nodes"],
                info["bound_k"],
                self.intra_bps,
                self.link_bps,
            ),
            explained=explained,
            cands=cands,
            runnable=self._runnable(cands),
        )
        self._measure_impls(row, impls, bufs)
        self._oracle.clear()
        return row

    def _explain(self, collective: str, nbytes: int, axis, dtype: str) -> dict:
        """What auto runs, per placement (measured corrections of the model may differ)."""
        explained = {}
        for in_place in (False, True):
            try:
                explained[in_place] = self.grid.explain(
                    collective, nbytes, axis.name, dtype=dtype, in_place=in_place
                )
            except Exception as e:  # noqa: BLE001 - a collective explain does not cover
                explained[in_place] = {"candidates": [], "choice": None, "error": str(e)}
        return explained

    def _runnable(self, cands: dict) -> dict:
        """algorithm -> whether every group of the axis accepts it. What fourd.explain accepts
        can differ between the groups of an axis (uneven nodes); an algorithm runs only where
        every group accepts it (one Allreduce per size)."""
        ok = np.array(
            [
                0 if (i.algorithm in cands and not cands[i.algorithm].get("supported", True)) else 1
                for i in self.fourd_impls
            ],
            dtype=np.int32,
        )
        if ok.size:
            self.world.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)
        return {i.algorithm: bool(f) for i, f in zip(self.fourd_impls, ok)}

    def _measure_impls(self, row: SizeRow, impls, bufs):
        """The cells of `impls` for `row`, added to row.group.

        With --rounds R every cell is measured R times: round r runs the implementations in
        the order rotated by r (each in-place cell right after its own out-of-place one), so
        that whatever the position in a row costs (the first cell after another row's, a drift
        of the machine's load) falls on every implementation alike; each cell reports its
        median round (the lower middle one for even R) and keeps every round's time."""
        todo = [impl for impl in impls if self._wanted(row, impl)]
        measured = self._rounds(row, todo, bufs)
        if any(i.library == "fourd" and i.algorithm == "auto" for i in todo):
            self._ask_auto_again(row)
        for impl in todo:
            cells = {
                in_place: self._median_round(row, impl, in_place, got)
                if isinstance(got, list)
                else got
                for in_place, got in measured[id(impl)].items()
            }
            if any(isinstance(v, dict) for v in cells.values()):
                row.group.append((impl, cells))
        self._oracle.clear()

    def _wanted(self, row: SizeRow, impl) -> bool:
        """Whether `impl` has cells in the row; a note says why not."""
        if impl.library != "fourd":
            return True
        if impl.algorithm != "auto" and not row.coll.takes_algorithm:
            if self.cfg.algorithms_requested:
                self.note(
                    ("bcast-alg",),
                    f"{row.coll.name}: fourd.{row.coll.name} takes no "
                    "algorithm argument, so only auto is measured",
                )
            return False
        if not row.runnable[impl.algorithm]:
            cand = row.cands.get(impl.algorithm)
            local = cand is not None and not cand.get("supported", True)
            reason = (
                (cand.get("reason") or "not supported")
                if local
                else "fourd.explain rejects it for another group of this axis"
            )
            self.note(
                ("alg", impl.algorithm, reason),
                f"{impl.algorithm} on {row.axis.name}: {reason} (skipped)",
            )
            return False
        return True

    def _rounds(self, row: SizeRow, todo: list, bufs) -> dict:
        """id(impl) -> {in_place: [stats of every round] or the reason the cell is n/a}; on a
        stop (stop.py), what was measured until then (a cell then has the rounds it got)."""
        rounds = self.cfg.rounds
        measured = {id(impl): {} for impl in todo}
        for r in range(rounds):
            for j in range(len(todo)):
                impl = todo[(j + r) % len(todo)]
                cells = measured[id(impl)]
                for in_place in (False, True):
                    if r > 0 and not isinstance(cells.get(in_place), list):
                        continue  # n/a in the first round: n/a in all
                    try:
                        got = self._measure_cell(row, impl, bufs, in_place)
                    except Stopped as e:
                        self._stopping(e.signum)
                        return measured
                    if isinstance(got, dict):
                        cells.setdefault(in_place, []).append(got)
                    else:
                        cells[in_place] = got
                    if r == rounds - 1:
                        self.progress.step(
                            f"{row.coll.name} {row.axis.name} {fmt_size(row.size)} {impl.label}",
                            est_s=self._cell_est.get(
                                (
                                    row.coll.name,
                                    row.axis.mask,
                                    row.size,
                                    impl.library,
                                    impl.algorithm,
                                ),
                                0.0,
                            ),
                        )
        return measured

    def _stopping(self, signum: int) -> None:
        """Every rank agreed on a signal: the sweep ends after this row (rank 0 says so)."""
        self.stopped = signum
        again = " (Ctrl-C again aborts at once)" if signal_name(signum) == "SIGINT" else ""
        self.printer.line(
            f"# {signal_name(signum)}: every rank stops after the cell in flight; the cells "
            f"measured so far are printed and written{again}",
            always=True,
        )

    def _ask_auto_again(self, row: SizeRow) -> None:
        """What auto ran: asked again now, since tuning in use may have settled on another
        algorithm than the model's choice during the row (docs/algorithms.md). Each group
        settles on its own, so the groups of an axis may run different algorithms: every
        group's choice, by the group's lowest world rank."""
        lowest = min(self.grid.ranks(row.axis.name))
        for in_place in (False, True):
            try:
                row.explained[in_place] = self.grid.explain(
                    row.coll.name, row.nbytes, row.axis.name, dtype=row.dtype, in_place=in_place
                )
            except Exception:  # noqa: BLE001, S110 - as when the row began
                pass
            mine = (lowest, row.explained[in_place].get("choice"))
            row.explained[in_place]["group_choices"] = [
                c
                for _, c in sorted(set(self.world.allgather(mine)), key=lambda t: (t[0], str(t[1])))
            ]

    def _median_round(self, row: SizeRow, impl, in_place: bool, got: list) -> dict:
        """The row dict of a cell from its rounds' stats: the median round's, with every
        round's time, and every round's checks in #wrong."""
        got.sort(key=lambda st: st["time_us"])
        stats = dict(got[(len(got) - 1) // 2])
        stats["rounds"] = len(got)
        stats["round_times_us"] = [round(st["time_us"], 3) for st in got]
        if stats["wrong"] is not None:  # every round's checks count
            stats["wrong"] = sum(st["wrong"] for st in got)
        return self._record(row, impl, in_place, stats)

    def _measure_cell(self, row: SizeRow, impl, bufs, in_place):
        """One cell: its stats, or the reason it is n/a (noted once)."""
        coll, axis, dtype = row.coll.name, row.axis, row.dtype
        key = (impl.library, impl.algorithm, axis.mask, coll, dtype, row.opname, in_place)
        why = impl.unsupported(coll, dtype, row.real_op if row.coll.reduces else None, in_place)
        if why is not None:
            self.note(("static", impl.library, why), f"{impl.library}: {why} (n/a)")
            return why
        why = self._failed.get(key)
        if why is not None:
            return why
        t0 = time.perf_counter()
        try:
            stats, reason = self.measure(impl, axis, bufs, in_place, row.real_op, axis.group_size)
        finally:
            self.wall_s[impl.label] = self.wall_s.get(impl.label, 0.0) + time.perf_counter() - t0
        if stats is not None:
            return stats
        # Static for the baselines (a dtype or op they lack), per size for fourd.
        if impl.library != "fourd" or reason.startswith(_STATIC_ERRORS) or "not built" in reason:
            self._failed[key] = reason
        where = "in-place" if in_place else "out-of-place"
        self.note(
            ("fail", impl.library, coll, in_place, reason),
            f"{impl.library} {coll} {where}: {reason} (n/a; first seen with "
            f"{impl.label} on {axis.name}, {dtype} {row.opname}, {row.nbytes} B)",
        )
        return reason

    # ---- the row's results -------------------------------------------------------------------
    def _finish_size(self, row: SizeRow, ratio_libs: list, versus: dict | None = None):
        """Ratios, rows and printed lines of the cells of `row` measured since its last
        finish (the first pass's, then the torch pass's); then on_row."""
        group, new = row.group, row.group[row.finished :]
        row.finished = len(group)
        # Ratios: baseline time / fourd time, same placement (>1: fourd is faster); a baseline
        # measured in a later pass fills its ratio into the fourd rows already recorded. A
        # torch-fourd row carries its own: its time over auto's (ratio_vs_fourd).
        for impl, cells in group:
            for in_place, rec in cells.items():
                if not isinstance(rec, dict):
                    continue
                if impl.library == "fourd":
                    self._ratios(group, in_place, rec)
                elif impl.library == VERSUS_FOURD:
                    rec["ratio_vs_fourd"] = _over_auto(group, in_place, rec)
        for _impl, cells in new:
            for in_place in (False, True):
                rec = cells.get(in_place)
                if isinstance(rec, dict):
                    self.rows.append(rec)
                    if rec["wrong"]:
                        self.wrong_total += rec["wrong"]
        self.printer.size_rows(row, new, ratio_libs, versus)
        if self.on_row is not None:
            self.on_row()

    def _ratios(self, group: list, in_place: bool, rec: dict) -> None:
        for b in self.baselines:
            if b.library not in RATIO_BASELINES:
                continue
            other = next((c.get(in_place) for i, c in group if i is b), None)
            r = None
            if isinstance(other, dict) and rec["time_us"] > 0:
                r = other["time_us"] / rec["time_us"]
            rec[f"ratio_vs_{b.library}"] = r

    def _record(self, row: SizeRow, impl, in_place: bool, stats: dict) -> dict:
        """The JSON row of one cell (report.ROW_FIELDS)."""
        explained = row.explained[in_place]
        p, bnd = row.axis.group_size, row.bnd
        algbw, busbw = bounds.bandwidths(row.coll.name, row.nbytes, p, stats["time_us"] * 1e-6)
        rec = {
            "collective": row.coll.name,
            "axis": row.axis.name,
            "library": impl.library,
            "algorithm": impl.algorithm,
            "in_place": in_place,
            "size_bytes": row.nbytes,
            "requested_bytes": row.size,
            "count": row.count,
            "dtype": row.dtype,
            "op": row.opname,
            "group_size": p,
            "groups": self.world.Get_size() // p,
            "nodes": row.info["nodes"],
            "ranks_per_node": row.info["k"],
            "warmup": self.cfg.warmup,
            "check_iters": self.cfg.check,
            "rounds": stats.get("rounds", 1),
            **stats,
            "algbw_gbps": algbw,
            "busbw_gbps": busbw,
            "bus_factor": bounds.bus_factor(row.coll.name, p),
            "bound_us": bnd["t_min_s"] * 1e6 if bnd else None,
            "bound_sum_us": bnd["t_sum_s"] * 1e6 if bnd else None,
            "efficiency": (bnd["t_min_s"] * 1e6 / stats["time_us"])
            if bnd and stats["time_us"] > 0
            else None,
            "auto_choice": None,
            "auto_tuning": None,
            "auto_choices": None,
            "predicted_us": None,
            "ratio_vs_mpi": None,
            "ratio_vs_torch": None,
            "ratio_vs_fourd": None,
        }
        if impl.library == "fourd":
            _auto_fields(rec, impl, explained)
            if rec["auto_tuning"] is not None:
                # Its state when the timing began: the timed calls may finish the exploration.
                key = (row.coll.name, row.dtype, bool(in_place), row.nbytes)
                timed_unsettled = key in self._unsettled
                rec["auto_tuning"] = {**rec["auto_tuning"], "timed_unsettled": timed_unsettled}
        return rec


def ratio_columns(impls) -> list[str]:
    """The ratio columns of a table of `impls`: one per baseline whose ratio the fourd lines
    carry (vs mpi), then vs fourd on the torch-fourd line."""
    libs = [i.library for i in impls]
    return [b for b in libs if b in RATIO_BASELINES] + (["fourd"] if VERSUS_FOURD in libs else [])


def _over_auto(group: list, in_place: bool, rec: dict) -> float | None:
    """A row's time over the time of fourd's auto cell of the same size and placement."""
    auto = next(
        (c.get(in_place) for i, c in group if i.library == "fourd" and i.algorithm == "auto"),
        None,
    )
    if isinstance(auto, dict) and auto["time_us"] > 0:
        return rec["time_us"] / auto["time_us"]
    return None


def _auto_fields(rec: dict, impl, explained: dict) -> None:
    """A fourd row's auto_choice / auto_tuning / auto_choices (auto) and predicted_us."""
    cands = {c["algorithm"]: c for c in explained.get("candidates", [])}
    if impl.algorithm == "auto":
        rec["auto_choice"] = explained.get("choice")
        rec["auto_tuning"] = explained.get("tuning")
        rec["auto_choices"] = explained.get("group_choices")
        cand = cands.get(explained.get("choice") or "")
    else:
        cand = cands.get(impl.algorithm)
    if cand is not None and cand.get("predicted_s") is not None:
        ps = float(cand["predicted_s"])
        rec["predicted_us"] = ps * 1e6 if math.isfinite(ps) else None
