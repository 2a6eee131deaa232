"""What the benchmark prints, on rank 0: the nccl-tests style tables, the notes and the summary
(report.py computes the figures; nothing here communicates).

A table has the left columns once, then an out-of-place and an in-place block. A block has one
ratio column per baseline measured in the same pass as the fourd cells whose ratio the fourd
lines carry (`vs mpi`), and with torch-fourd a `vs fourd` column on its own line:
t_torch-fourd / t_auto. The torch (gloo) baseline runs in a pass of its own after every other
cell (runner.py says why), so its lines come in a table of their own, whose ratio column is
`auto vs`: t_torch / t_auto at the same size and placement. A ratio made from a cell that
stalled (report.stalled) is marked `?`.
"""

from __future__ import annotations

import sys

from .collectives import TABLE
from .report import (
    AUTO_MARGIN,
    LIBRARIES,
    RATIO_BASELINES,
    STALL_RATIO,
    VERSUS_FOURD,
    fmt_size,
    plural,
    series_label,
    stalled,
)

ALGO_SHORT = {"hierarchical": "hier"}  # inside auto(...), where several names share the column
ALG_WIDTH = 11  # the algorithm column at its narrowest
LEFT = "{:>11} {:>11} {:>8} {:>5}"  # size, count, type, redop; then algorithm and bound
BLOCK = " {:>10} {:>6} {:>6} {:>6} {:>5}"  # time, algbw, busbw, #wrong, eff
RATIO = " {:>8}"


def algorithm_width(labels: list[str], fourd_algorithms: list[str]) -> int:
    """The algorithm column's width: every label, and auto(a|b) for the two longest of fourd's
    algorithms (two groups of an axis that settled apart; more than two is rare and may
    overflow)."""
    short = sorted((len(ALGO_SHORT.get(a, a)) for a in fourd_algorithms if a != "auto"), reverse=1)
    split = len("auto(|)") + sum(short[:2]) if len(short) >= 2 else 0
    return max([ALG_WIDTH, split, *(len(x) for x in labels)])


def _t(us):
    if us is None:
        return "n/a"
    return f"{us:.1f}" if us >= 1000 else f"{us:.2f}"


def _r(x, mark: bool = False):
    return "-" if x is None else f"{x:.2f}x" + ("?" if mark else "")


def _pct(x):
    return "-" if x is None else f"{x * 100:.0f}%"


def auto_label(impl, first: dict) -> str:
    """auto(x), or auto(x|y) where the groups of the axis settled on different algorithms."""
    if impl.library != "fourd" or impl.algorithm != "auto" or not first.get("auto_choice"):
        return impl.label
    chs = list(dict.fromkeys(first.get("auto_choices") or [first["auto_choice"]]))
    return f"auto({'|'.join(ALGO_SHORT.get(c, str(c)) for c in chs)})"


class Printer:
    """Rank 0's output; on other ranks (and with --quiet, except the summary) it prints nothing."""

    def __init__(self, enabled: bool, quiet: bool, progress=None, stream=None):
        self.enabled = enabled
        self.quiet = quiet
        self.progress = progress
        self.stream = stream or sys.stdout
        self.alg_width = ALG_WIDTH
        self._stall_noted = False

    def _out(self, text: str, always: bool = False):
        if not self.enabled or (self.quiet and not always):
            return
        if self.progress is not None:
            self.progress.clear()
        print(text.rstrip(), file=self.stream, flush=True)

    def line(self, text: str = "", always: bool = False):
        self._out(text, always)

    def note(self, text: str):
        self._out(f"# note: {text}")

    def _left(self, size, count, dtype, op, alg, bound) -> str:
        return LEFT.format(size, count, dtype, op) + f" {alg:>{self.alg_width}} {bound:>10}"

    def _blank(self, ratios: int) -> str:
        return BLOCK.format("n/a", "", "", "", "") + RATIO.format("") * ratios

    def table_header(self, coll, axis, info, ratio_names: list[str], title: str | None = None):
        """The lines above a table: its title, the placements and the column names, with one
        ratio column per name in `ratio_names`."""
        p = axis.group_size
        self._out("#")
        self._out(
            title
            or f"# {coll} on {axis.name}: groups of {p} ranks ({info['description']}), "
            f"{plural(info['groups'], 'group')} at once; busbw = algbw x "
            f"{TABLE[coll].factor_text}; bound: {info['bound_text']}"
        )
        pad = " " * len(self._left(*[""] * 6))
        r = len(ratio_names)
        w = len(BLOCK.format(*[""] * 5) + RATIO.format("") * r)
        self._out(f"#{pad}{'out-of-place':^{w}}{'in-place':^{w}}")
        names = self._left("size", "count", "type", "redop", "algorithm", "bound")
        units = self._left("(B)", "(elements)", "", "", "", "(us)")
        blk = BLOCK.format("time", "algbw", "busbw", "#wrong", "eff") + "".join(
            RATIO.format(n) for n in ratio_names
        )
        ublk = BLOCK.format("(us)", "(GB/s)", "(GB/s)", "", "") + RATIO.format("") * r
        self._out(f"#{names}{blk}{blk}")
        self._out(f"#{units}{ublk}{ublk}")

    def _block(self, row, ratios: list) -> str:
        """One placement's columns (n/a where the cell was not measured); `ratios`: (value,
        stalled) per ratio column."""
        if not isinstance(row, dict):
            return self._blank(len(ratios))
        wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
        text = BLOCK.format(
            _t(row["time_us"]),
            f"{row['algbw_gbps']:.2f}",
            f"{row['busbw_gbps']:.2f}",
            wrong,
            _pct(row["efficiency"]),
        )
        for value, mark in ratios:
            text += RATIO.format(_r(value, mark) if value is not None or mark is not None else "")
            if mark and not self._stall_noted:
                self._stall_noted = True
        return text

    def size_rows(self, row, group: list, ratio_libs: list[str], versus: dict | None = None):
        """The lines of one measured size (a runner.SizeRow): one per implementation in
        `group`. fourd lines get the ratio to each baseline in `ratio_libs`; with `versus`
        (auto's cells by placement: the torch pass), the baseline lines get t_base / t_auto."""
        bnd = _t(row.bnd["t_min_s"] * 1e6) if row.bnd else "n/a"
        noted = self._stall_noted
        for impl, cells in group:
            first = next(v for v in cells.values() if isinstance(v, dict))
            left = self._left(
                row.nbytes, row.count, row.dtype, row.opname, auto_label(impl, first), bnd
            )
            blocks = "".join(
                self._block(
                    cells.get(in_place), _ratios(impl, in_place, cells, group, ratio_libs, versus)
                )
                for in_place in (False, True)
            )
            self._out(f" {left}{blocks}")
        if self._stall_noted and not noted:
            self.note(
                f"?: a ratio made of a cell that stalled (its mean time over {STALL_RATIO:g}x its "
                "per-iteration median: a few iterations were held up, a busy machine): it is "
                "noise, not a property of the implementations; the JSON has both figures"
            )

    def table_footer(self, coll, axis, rows, libraries=None):
        """The average busbw of each implementation in the table (of `libraries` only, when
        given: the torch pass's table)."""
        mine = [
            r
            for r in rows
            if r["collective"] == coll
            and r["axis"] == axis.name
            and (libraries is None or r["library"] in libraries)
        ]
        if not mine:
            self._out("# (no rows)")
            return
        parts = []
        for label in dict.fromkeys(series_label(r) for r in mine):
            bw = [r["busbw_gbps"] for r in mine if series_label(r) == label]
            parts.append(f"{label} {sum(bw) / len(bw):.2f}")
        self._out(f"# avg busbw (GB/s): {'  '.join(parts)}")


def _ratios(impl, in_place: bool, cells: dict, group: list, libs: list, versus) -> list:
    """(value, stalled) of each ratio column of one placement of a line."""
    rec = cells.get(in_place)
    if versus is not None:  # the torch pass: the baseline against auto's cell
        return [_over_auto(impl, rec, versus.get(in_place))]
    if impl.library not in ("fourd", VERSUS_FOURD) or not isinstance(rec, dict):
        return [(None, None)] * len(libs)
    return [_column(impl, in_place, rec, group, lib) for lib in libs]


def _over_auto(impl, rec, auto) -> tuple:
    """(t_baseline / t_auto, stalled) of a baseline's line in the torch pass."""
    if impl.library == "fourd" or not isinstance(rec, dict) or not isinstance(auto, dict):
        return (None, None)
    value = rec["time_us"] / auto["time_us"] if auto["time_us"] > 0 else None
    return (value, stalled(rec) or stalled(auto))


def _column(impl, in_place: bool, rec: dict, group: list, lib: str) -> tuple:
    """(value, stalled) of the column `vs lib` on the line of `impl`: a fourd line's ratio to
    a baseline, the torch-fourd line's vs fourd (against auto's cell); (None, None) in the
    column of another kind of line."""
    if (impl.library == VERSUS_FOURD) != (lib == "fourd"):
        return (None, None)
    lib_of, alg = ("fourd", "auto") if lib == "fourd" else (lib, None)  # the other cell's
    other = next(
        (c.get(in_place) for i, c in group if i.library == lib_of and alg in (None, i.algorithm)),
        None,
    )
    value = rec.get(f"ratio_vs_{lib}")
    return (value, bool(value is not None and (stalled(rec) or _stalled(other))))


def _stalled(row) -> bool:
    return isinstance(row, dict) and stalled(row)


# ---- the summary -------------------------------------------------------------------------------


def print_summary(pr: Printer, summary: dict, duration: float, skipped_count: int, run=None):
    """The summary after the tables. `run` (optional): what the driver knows of the run,
    "setup_s", "estimate_s", "stopped" (the signal's name), "cells_done", "cells_planned",
    "rounds", "load" (the load average) and "cores"."""
    run = run or {}
    pr.line("#", always=True)
    _print_per_algorithm(pr, summary["per_algorithm"])
    _print_best(pr, summary["best_per_size"])
    if summary.get("auto_check"):
        _print_auto_check(pr, summary["auto_check"])
    if summary.get("verdict"):
        _print_verdict(pr, summary["verdict"], run)
    if summary.get("wall_s"):
        _print_time(pr, summary["wall_s"], duration, run)
    if run.get("stopped"):
        pr.line(
            f"# stopped by {run['stopped']} after {run.get('cells_done', 0)} of "
            f"{plural(run.get('cells_planned', 0), 'cell')}: the tables above, this summary "
            "and the files hold every cell measured",
            always=True,
        )
    wrong = summary["wrong_total"]
    pr.line(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}", always=True)
    avg = summary["avg_busbw_gbps"]
    pr.line(
        f"# Avg bus bandwidth    : {'n/a' if avg is None else f'{avg:.4f}'} GB/s "
        f"(fourd rows, out-of-place and in-place)",
        always=True,
    )
    extra = f", {plural(skipped_count, 'note')} about skipped cells" if skipped_count else ""
    pr.line(
        f"# Collective test concluded: {plural(summary['rows'], 'row')} in {duration:.1f} s{extra}",
        always=True,
    )


def _print_per_algorithm(pr: Printer, per: list) -> None:
    libs = [lib for lib in RATIO_BASELINES if any(s["library"] == lib for s in per)]
    if any(s["library"] == VERSUS_FOURD for s in per):
        libs.append("fourd")  # filled on the torch-fourd line: t_torch-fourd / t_auto
    pr.line(
        "# Summary: avg busbw over sizes, out-of-place and in-place; avg eff = bound / time"
        + ("; vs = geometric mean of t_baseline / t_fourd (> 1: fourd faster)" if libs else ""),
        always=True,
    )
    pr.line(
        f"#   {'collective':<15}{'axis':<10}{'algorithm':<13}{'avg busbw':>10}{'avg eff':>9}"
        + "".join(f"{'vs ' + lib:>9}" for lib in libs),
        always=True,
    )
    for s in per:
        label = s["algorithm"] if s["library"] == "fourd" else s["library"]
        eff = "-" if s["avg_efficiency"] is None else f"{s['avg_efficiency'] * 100:.0f}%"
        pr.line(
            f"#   {s['collective']:<15}{s['axis']:<10}{label:<13}{s['avg_busbw_gbps']:>10.3f}"
            f"{eff:>9}" + "".join(f"{_r(s[f'ratio_vs_{lib}']):>9}" for lib in libs),
            always=True,
        )


def _print_best(pr: Printer, best: list) -> None:
    pr.line(
        "# Best fourd algorithm per size (fastest placement; [auto's choice]; * = a baseline "
        "was faster):",
        always=True,
    )
    groups = list(dict.fromkeys((b["collective"], b["axis"], b["dtype"], b["op"]) for b in best))
    for g in groups:
        items = [
            _best_item(b) for b in best if (b["collective"], b["axis"], b["dtype"], b["op"]) == g
        ]
        op = "" if g[3] == "none" else f" {g[3]}"
        pr.line(f"#   {g[0]} {g[1]} {g[2]}{op}: {' '.join(items)}", always=True)


def _best_item(b: dict) -> str:
    txt = f"{fmt_size(b['size_bytes'])}:{b['best_algorithm'] or '-'}"
    if b["auto_choice"] and b["auto_choice"] != b["best_algorithm"]:
        txt += f"[{b['auto_choice']}]"
    if b["fastest"] and b["fastest"] in LIBRARIES[1:]:
        txt += "*"
    return txt


def _worst_text(w: dict) -> str:
    """Where the worst auto cell was, and what it says: a cell whose fastest single algorithm
    is the one auto ran, or whose auto cell stalled, is the run's noise."""
    where = (
        f"{w['collective']} {w['axis']} {w['dtype']} {fmt_size(w['size_bytes'])} "
        f"{'in-place' if w['in_place'] else 'out-of-place'}: auto ran {w['auto_choice']}"
    )
    if w["auto_choice"] == w["best_algorithm"]:
        where += ", itself the fastest single algorithm there, so the gap is the run's noise"
    else:
        where += f", fastest {w['best_algorithm']}"
    stall = w.get("auto_mean_over_median")
    if stall is not None and stall > STALL_RATIO:
        where += f"; auto's cell stalled (its mean {stall:.1f}x its median)"
    return where


def _print_auto_check(pr: Printer, ac: dict) -> None:
    margin = round((ac["margin"] - 1) * 100)
    pr.line(
        f"# auto within {margin}% of the fastest single algorithm: "
        f"{ac['within_by_time']}/{plural(ac['cells'], 'cell')} by time, "
        f"{ac['within_by_median']}/{ac['cells']} by per-iteration median; worst "
        f"{ac['worst']['ratio']:.2f}x "
        f"({_worst_text(ac['worst'])})",
        always=True,
    )
    if ac["same_algorithm_cells"]:
        pr.line(
            f"# run noise: auto's cell vs the cell of the algorithm it ran (same code, "
            f"{plural(ac['same_algorithm_cells'], 'cell')}): median difference "
            f"{ac['same_algorithm_diff_median'] * 100:.0f}%, largest "
            f"{ac['same_algorithm_diff_max'] * 100:.0f}%",
            always=True,
        )
        pr.line(
            f"# auto's choice: the algorithm it ran, in its own cell, within "
            f"{margin}% of the fastest in {ac['choice_within']}/"
            f"{plural(ac['same_algorithm_cells'], 'cell')}",
            always=True,
        )
    if ac.get("groups_split_cells"):
        pr.line(
            f"# auto's groups split: in {plural(ac['groups_split_cells'], 'cell')} the groups "
            f"of the axis settled on different algorithms (auto(a|b) above; docs/algorithms.md)",
            always=True,
        )


def _print_verdict(pr: Printer, v: dict, run: dict) -> None:
    """One plain line: can this run compare the algorithms within the margin, or not."""
    margin = round((AUTO_MARGIN - 1) * 100)
    load = ""
    if run.get("load") is not None and run.get("cores"):
        load = f" (load average {run['load']:.1f} on {plural(run['cores'], 'core')})"
    stalls = (
        f"; {v['stalled_cells']} of {plural(v['cells'], 'cell')} stalled (marked ?)"
        if v["stalled_cells"]
        else ""
    )
    if v["basis"] == "same code":
        measured = (
            f"the same code measured twice differed by a median {v['noise_median'] * 100:.0f}% "
            f"(largest {v['noise_max'] * 100:.0f}%)"
        )
    else:
        measured = f"{v['stalled_cells']} of {plural(v['cells'], 'cell')} stalled"
        stalls = ""
    if v["too_noisy"]:
        again = "-R 5 " if run.get("rounds", 1) < 5 else ""
        pr.line(
            f"# verdict: too noisy to compare within {margin}%: {measured}{stalls}{load}; "
            f"rerun with {again}on a quiet machine",
            always=True,
        )
    else:
        pr.line(
            f"# verdict: quiet enough to compare within {margin}%: {measured}{stalls}",
            always=True,
        )


def _print_time(pr: Printer, wall: dict, duration: float, run: dict) -> None:
    """Where the time went: each implementation's cells (untimed calls included), the set-up,
    and the estimate the header gave."""
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in wall.items())
    setup = f"; set-up {run['setup_s']:.1f} s" if run.get("setup_s") is not None else ""
    est = ""
    if run.get("estimate_s"):
        est = f"; the header's estimate for the sweep was {run['estimate_s']:.0f} s"
    pr.line(
        f"# time per implementation, warm-up and checks included: {parts}{setup}{est}",
        always=True,
    )
