"""What the benchmark prints and writes: the nccl-tests style tables, the summary, and the
JSON / CSV / PNG files. Rank 0 only; nothing here communicates.

The JSON schema (docs/benchmark.md describes every field) is checked by `validate()`, which the
tests run on real output.
"""

from __future__ import annotations

import csv
import json
import math
import sys

from .collectives import TABLE

SCHEMA = "fourd.bench"
SCHEMA_VERSION = 4  # 2: rows gained rounds and round_times_us (--rounds); 3: auto_tuning;
#                     4: auto_choices

# Every row carries these keys (None where a value does not apply), in this order in the CSV.
ROW_FIELDS = (
    ("collective", str),
    ("axis", str),
    ("library", str),
    ("algorithm", str),
    ("in_place", bool),
    ("size_bytes", int),
    ("requested_bytes", int),
    ("count", int),
    ("dtype", str),
    ("op", str),
    ("group_size", int),
    ("groups", int),
    ("nodes", int),
    ("ranks_per_node", int),
    ("iters", int),
    ("warmup", int),
    ("check_iters", int),
    ("rounds", int),
    ("time_us", float),
    ("time_us_min", float),
    ("time_us_median", float),
    ("time_us_p99", float),
    ("time_us_max", float),
    ("time_us_rank_avg", float),
    ("algbw_gbps", float),
    ("busbw_gbps", float),
    ("bus_factor", float),
    ("wrong", (int, type(None))),
    ("bound_us", (float, type(None))),
    ("bound_sum_us", (float, type(None))),
    ("efficiency", (float, type(None))),
    ("predicted_us", (float, type(None))),
    ("auto_choice", (str, type(None))),
    ("auto_tuning", (dict, type(None))),
    ("auto_choices", (list, type(None))),
    ("ratio_vs_mpi", (float, type(None))),
    ("ratio_vs_torch", (float, type(None))),
    ("times_us", list),
    ("round_times_us", list),
)
TOP_FIELDS = (
    ("schema", str),
    ("schema_version", int),
    ("start_time", str),
    ("duration_s", float),
    ("command", list),
    ("args", dict),
    ("environment", dict),
    ("fourd", dict),
    ("mpi", dict),
    ("grid", dict),
    ("placement", list),
    ("topology", dict),
    ("timing", dict),
    ("bandwidth", dict),
    ("baselines", dict),
    ("rows", list),
    ("skipped", list),
    ("summary", dict),
    ("ok", bool),
)
LIBRARIES = ("fourd", "mpi", "torch")


def validate(doc) -> list[str]:
    """Problems with a JSON document against the schema; [] when it conforms."""
    if not isinstance(doc, dict):
        return [f"top level: expected an object, found {type(doc).__name__}"]
    errs = _top_errors(doc)
    for i, row in enumerate(doc.get("rows") or []):
        errs += _row_errors(i, row)
        if isinstance(row, dict) and len(errs) > 50:
            errs.append("... (stopped after 50 problems)")
            break
    return errs


def _top_errors(doc: dict) -> list[str]:
    errs = []
    for key, typ in TOP_FIELDS:
        if key not in doc:
            errs.append(f"missing top-level key {key!r}")
        elif not isinstance(doc[key], typ) or (typ is int and isinstance(doc[key], bool)):
            errs.append(f"{key}: expected {_tname(typ)}, found {type(doc[key]).__name__}")
    if doc.get("schema") != SCHEMA:
        errs.append(f"schema: expected {SCHEMA!r}, found {doc.get('schema')!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        errs.append(
            f"schema_version: expected {SCHEMA_VERSION}, found {doc.get('schema_version')!r}"
        )
    return errs


def _row_errors(i: int, row) -> list[str]:
    if not isinstance(row, dict):
        return [f"rows[{i}]: expected an object"]
    errs = []
    for key, typ in ROW_FIELDS:
        if key not in row:
            errs.append(f"rows[{i}]: missing {key!r}")
        elif not _has_type(row[key], typ):
            errs.append(f"rows[{i}].{key}: expected {_tname(typ)}, found {type(row[key]).__name__}")
    if row.get("library") not in LIBRARIES:
        errs.append(f"rows[{i}].library: expected one of {LIBRARIES}, found {row.get('library')!r}")
    for key in ("time_us", "time_us_min", "time_us_median", "time_us_p99"):
        v = row.get(key)
        if isinstance(v, (int, float)) and not (math.isfinite(v) and v >= 0):
            errs.append(f"rows[{i}].{key}: expected a finite time >= 0, found {v!r}")
    return errs


def _has_type(v, typ) -> bool:
    """A row value of the field type: an int passes for a float, a bool only for a bool."""
    ok_types = typ if isinstance(typ, tuple) else (typ,)
    if float in ok_types and isinstance(v, int) and not isinstance(v, bool):
        return True
    return isinstance(v, ok_types) and (bool in ok_types or not isinstance(v, bool))


def _tname(typ) -> str:
    if isinstance(typ, tuple):
        return " or ".join("null" if t is type(None) else t.__name__ for t in typ)
    return typ.__name__


def _json_clean(v):
    """NaN/inf -> None (JSON has no such numbers), recursively."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_clean(x) for x in v]
    return v


def write_json(path: str, doc: dict):
    with open(path, "w") as f:
        json.dump(_json_clean(doc), f, indent=1, allow_nan=False)
        f.write("\n")


def write_csv(path: str, rows: list):
    names = [k for k, _ in ROW_FIELDS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for r in rows:
            out = []
            for k in names:
                v = r.get(k)
                if k in ("times_us", "round_times_us"):
                    v = " ".join(f"{x:g}" for x in v or [])
                elif isinstance(v, list):  # auto_choices: names, space-separated
                    v = " ".join(str(x) for x in v)
                elif isinstance(v, dict):  # auto_tuning: as in the JSON
                    v = json.dumps(_json_clean(v), sort_keys=True)
                elif isinstance(v, float):
                    v = f"{v:.6g}"
                elif v is None:
                    v = ""
                out.append(v)
            w.writerow(out)


def series_label(row) -> str:
    return row["algorithm"] if row["library"] == "fourd" else row["library"]


def write_plot(path: str, rows: list, title: str):
    """busbw (log y) against size (log2 x) per algorithm and baseline, one panel per
    (collective, axis); out-of-place rows, or in-place where an implementation has only those;
    the dotted line is the busbw the physical bound allows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = list(dict.fromkeys(r["collective"] for r in rows))
    axes = list(dict.fromkeys(r["axis"] for r in rows))
    if not rows:
        colls, axes = ["(no rows)"], [""]
    from matplotlib.ticker import FuncFormatter

    size_fmt = FuncFormatter(lambda v, _pos: fmt_size(int(v)) if v >= 1 else "")
    fig, grid = plt.subplots(
        len(colls), len(axes), figsize=(4.6 * len(axes), 3.4 * len(colls)), squeeze=False
    )
    for i, c in enumerate(colls):
        for j, a in enumerate(axes):
            mine = [r for r in rows if r["collective"] == c and r["axis"] == a]
            _plot_panel(grid[i][j], mine, f"{c} on {a}", size_fmt)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_panel(ax, mine: list, title: str, size_fmt) -> None:
    """One (collective, axis): a line per series, the bound dotted."""
    multi = len({(r["dtype"], r["op"]) for r in mine}) > 1
    for key in dict.fromkeys((series_label(r), r["dtype"], r["op"]) for r in mine):
        _plot_series(
            ax, [r for r in mine if (series_label(r), r["dtype"], r["op"]) == key], key, multi
        )
    bnd = {}
    for r in mine:
        if r.get("bound_us"):
            bnd[r["size_bytes"]] = r["size_bytes"] / (r["bound_us"] * 1e-6) / 1e9 * r["bus_factor"]
    if bnd:
        xs = sorted(bnd)
        ax.plot(xs, [bnd[x] for x in xs], ":", color="black", label="bound")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(size_fmt)
    if any(r["busbw_gbps"] > 0 for r in mine):
        ax.set_yscale("log")  # small and large sizes differ by orders of magnitude
    ax.set_title(title + (f" ({mine[0]['group_size']} ranks)" if mine else ""), fontsize=9)
    ax.set_xlabel("size (bytes)", fontsize=8)
    ax.set_ylabel("busbw (GB/s)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="both", alpha=0.3)
    if mine:
        ax.legend(fontsize=7)


def _plot_series(ax, sel: list, key: tuple, multi: bool) -> None:
    """One series (label, dtype, op): its out-of-place rows, else its in-place ones."""
    oop = [r for r in sel if not r["in_place"]]
    use = sorted(oop or sel, key=lambda r: r["size_bytes"])
    label = key[0] + ("" if oop else " (in-place)")
    if multi:
        label += f" {key[1]}" + ("" if key[2] == "none" else f" {key[2]}")
    style = "-o" if use and use[0]["library"] == "fourd" else "--s"
    ax.plot(
        [r["size_bytes"] for r in use], [r["busbw_gbps"] for r in use], style, ms=3, label=label
    )


# ---- text output -------------------------------------------------------------------------------


def fmt_size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _t(us):
    if us is None:
        return "n/a"
    return f"{us:.1f}" if us >= 1000 else f"{us:.2f}"


def _r(x):
    return "-" if x is None else f"{x:.2f}x"


def _pct(x):
    return "-" if x is None else f"{x * 100:.0f}%"


ALGO_SHORT = {"hierarchical": "hier"}  # the algorithm column's width
LEFT = "{:>11} {:>11} {:>8} {:>5} {:>11} {:>10}"
BLOCK = " {:>10} {:>6} {:>6} {:>6} {:>5} {:>7} {:>8}"


def _block(row, fourd_row: bool, baselines) -> str:
    """One placement's columns of a table line (n/a where the cell was not measured)."""
    if not isinstance(row, dict):
        return BLOCK.format("n/a", "", "", "", "", "", "")
    wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
    vm = vt = ""
    if fourd_row:
        vm = _r(row.get("ratio_vs_mpi")) if "mpi" in baselines else ""
        vt = _r(row.get("ratio_vs_torch")) if "torch" in baselines else ""
    return BLOCK.format(
        _t(row["time_us"]),
        f"{row['algbw_gbps']:.2f}",
        f"{row['busbw_gbps']:.2f}",
        wrong,
        _pct(row["efficiency"]),
        vm,
        vt,
    )


class Printer:
    """Rank 0's output; on other ranks (and with --quiet, except the summary) it prints nothing."""

    def __init__(self, enabled: bool, quiet: bool, progress=None, stream=None):
        self.enabled = enabled
        self.quiet = quiet
        self.progress = progress
        self.stream = stream or sys.stdout

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

    def table_header(self, coll, axis, info):
        p = axis.group_size
        factor = TABLE[coll].factor_text
        self._out("#")
        self._out(
            f"# {coll} on {axis.name}: groups of {p} ranks ({info['description']}), "
            f"{info['groups']} group{'s' if info['groups'] > 1 else ''} at once; "
            f"busbw = algbw x {factor}; bound: {info['bound_text']}"
        )
        pad = " " * len(LEFT.format(*[""] * 6))
        w = len(BLOCK.format(*[""] * 7))
        self._out(f"#{pad}{'out-of-place':^{w}}{'in-place':^{w}}")
        names = LEFT.format("size", "count", "type", "redop", "algorithm", "bound")
        units = LEFT.format("(B)", "(elements)", "", "", "", "(us)")
        blk = BLOCK.format("time", "algbw", "busbw", "#wrong", "eff", "vs mpi", "vs torch")
        ublk = BLOCK.format("(us)", "(GB/s)", "(GB/s)", "", "", "", "")
        self._out(f"#{names}{blk}{blk}")
        self._out(f"#{units}{ublk}{ublk}")

    def size_rows(self, coll, axis, dtype, op, size, nbytes, count, bnd, group, baselines):
        for impl, cells in group:
            first = next(v for v in cells.values() if isinstance(v, dict))
            alg = impl.label
            if impl.library == "fourd" and impl.algorithm == "auto" and first.get("auto_choice"):
                chs = list(dict.fromkeys(first.get("auto_choices") or [first["auto_choice"]]))
                alg = f"auto({'|'.join(ALGO_SHORT.get(c, str(c)) for c in chs)})"
            left = LEFT.format(
                nbytes, count, dtype, op, alg, _t(bnd["t_min_s"] * 1e6) if bnd else "n/a"
            )
            blocks = "".join(
                _block(cells.get(in_place), impl.library == "fourd", baselines)
                for in_place in (False, True)
            )
            self._out(f" {left}{blocks}")

    def table_footer(self, coll, axis, rows):
        mine = [r for r in rows if r["collective"] == coll and r["axis"] == axis.name]
        if not mine:
            self._out("# (no rows)")
            return
        parts = []
        for label in dict.fromkeys(series_label(r) for r in mine):
            bw = [r["busbw_gbps"] for r in mine if series_label(r) == label]
            parts.append(f"{label} {sum(bw) / len(bw):.2f}")
        self._out(f"# avg busbw (GB/s): {'  '.join(parts)}")


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


AUTO_MARGIN = 1.10  # the "within 10% of the best single algorithm"


def auto_check(rows: list) -> dict | None:
    """auto against the single fourd algorithms of the same run, per (collective, axis, dtype,
    op, size, placement) where auto and at least one single algorithm were measured: how many
    auto cells are within AUTO_MARGIN of the fastest single algorithm by mean time and by
    per-iteration median, the worst cell, and the run's own noise: the difference between the
    auto cell and the cell of the algorithm auto ran (the same code measured twice). The
    choice alone: in how many cells the algorithm auto ran was, in its own cell, within
    AUTO_MARGIN of the fastest (a miss by time whose choice is within is the run's noise).
    Cells whose groups settled on different algorithms have no such twin: counted apart."""
    n = by_time = by_median = split = chosen = 0
    worst, same = None, []
    for k, algs in _fourd_cells(rows).items():
        auto = algs.get("auto")
        singles = {a: r for a, r in algs.items() if a != "auto"}
        if auto is None or not singles:
            continue
        n += 1
        best = min(singles.values(), key=lambda r: r["time_us"])
        ratio = auto["time_us"] / best["time_us"]
        by_time += ratio <= AUTO_MARGIN
        by_median += (
            auto["time_us_median"] / min(r["time_us_median"] for r in singles.values())
            <= AUTO_MARGIN
        )
        if worst is None or ratio > worst["ratio"]:
            worst = _worst_cell(k, ratio, auto, best)
        if len(set(auto.get("auto_choices") or [])) > 1:
            split += 1  # its groups ran different algorithms: no single cell is its twin
            continue
        twin = singles.get(auto["auto_choice"] or "")
        if twin is not None:
            same.append(abs(auto["time_us"] / twin["time_us"] - 1.0))
            chosen += twin["time_us"] / best["time_us"] <= AUTO_MARGIN
    if n == 0:
        return None
    same.sort()
    return {
        "margin": AUTO_MARGIN,
        "cells": n,
        "within_by_time": by_time,
        "within_by_median": by_median,
        "worst": worst,
        "same_algorithm_cells": len(same),
        "choice_within": chosen,
        "groups_split_cells": split,
        **_spread(same),
    }


def _fourd_cells(rows: list) -> dict:
    """(collective, axis, dtype, op, size, in_place) -> algorithm -> fourd row."""
    cells = {}
    for r in rows:
        if r["library"] == "fourd":
            k = (r["collective"], r["axis"], r["dtype"], r["op"], r["size_bytes"], r["in_place"])
            cells.setdefault(k, {})[r["algorithm"]] = r
    return cells


def _spread(same: list) -> dict:
    """The median and the largest of sorted differences (None without any)."""
    return {
        "same_algorithm_diff_median": same[(len(same) - 1) // 2] if same else None,
        "same_algorithm_diff_max": same[-1] if same else None,
    }


def _worst_cell(k: tuple, ratio: float, auto: dict, best: dict) -> dict:
    return {
        "collective": k[0],
        "axis": k[1],
        "dtype": k[2],
        "op": k[3],
        "size_bytes": k[4],
        "in_place": k[5],
        "ratio": ratio,
        "auto_choice": auto["auto_choice"],
        "best_algorithm": best["algorithm"],
    }


def summarize(rows: list) -> dict:
    """Per (collective, axis, implementation): average busbw and efficiency, geometric-mean
    speed ratios; per (collective, axis, dtype, op, size): the fastest fourd algorithm and the
    fastest of all."""
    fourd_rows = [r for r in rows if r["library"] == "fourd"]
    wrong = sum(r["wrong"] or 0 for r in rows)
    return {
        "per_algorithm": _per_algorithm(rows),
        "best_per_size": _best_per_size(rows),
        "auto_check": auto_check(rows),
        "avg_busbw_gbps": (sum(r["busbw_gbps"] for r in fourd_rows) / len(fourd_rows))
        if fourd_rows
        else None,
        "wrong_total": wrong,
        "rows": len(rows),
    }


def _per_algorithm(rows: list) -> list:
    per = []
    keys = list(
        dict.fromkeys((r["collective"], r["axis"], r["library"], r["algorithm"]) for r in rows)
    )
    for c, a, lib, alg in keys:
        sel = [
            r
            for r in rows
            if (r["collective"], r["axis"], r["library"], r["algorithm"]) == (c, a, lib, alg)
        ]
        effs = [r["efficiency"] for r in sel if r["efficiency"] is not None]
        per.append(
            {
                "collective": c,
                "axis": a,
                "library": lib,
                "algorithm": alg,
                "rows": len(sel),
                "avg_busbw_gbps": sum(r["busbw_gbps"] for r in sel) / len(sel),
                "avg_efficiency": (sum(effs) / len(effs)) if effs else None,
                "ratio_vs_mpi": geomean([r["ratio_vs_mpi"] for r in sel])
                if lib == "fourd"
                else None,
                "ratio_vs_torch": geomean([r["ratio_vs_torch"] for r in sel])
                if lib == "fourd"
                else None,
            }
        )
    return per


def _best_per_size(rows: list) -> list:
    best = []
    for key in dict.fromkeys(
        (r["collective"], r["axis"], r["dtype"], r["op"], r["size_bytes"]) for r in rows
    ):
        sel = [
            r
            for r in rows
            if (r["collective"], r["axis"], r["dtype"], r["op"], r["size_bytes"]) == key
        ]
        best.append(_best_of(key, sel))
    return best


def _best_of(key: tuple, sel: list) -> dict:
    """The fastest fourd algorithm and the fastest of all, each implementation at its faster
    placement."""
    by_impl = {}
    for r in sel:
        k = (r["library"], r["algorithm"])
        if k not in by_impl or r["time_us"] < by_impl[k]["time_us"]:
            by_impl[k] = r
    fourd = [r for r in by_impl.values() if r["library"] == "fourd" and r["algorithm"] != "auto"]
    auto = next(
        (r for r in by_impl.values() if r["library"] == "fourd" and r["algorithm"] == "auto"), None
    )
    b = min(fourd, key=lambda r: r["time_us"]) if fourd else auto
    o = min(by_impl.values(), key=lambda r: r["time_us"]) if by_impl else None
    return {
        "collective": key[0],
        "axis": key[1],
        "dtype": key[2],
        "op": key[3],
        "size_bytes": key[4],
        "best_algorithm": _get(b, "algorithm"),
        "best_time_us": _get(b, "time_us"),
        "auto_choice": _get(auto, "auto_choice"),
        "auto_time_us": _get(auto, "time_us"),
        "fastest": series_label(o) if o else None,
        "fastest_time_us": _get(o, "time_us"),
    }


def _get(row: dict | None, key: str):
    return row.get(key) if row else None


def print_summary(pr: Printer, summary: dict, duration: float, skipped_count: int):
    pr.line("#", always=True)
    _print_per_algorithm(pr, summary["per_algorithm"])
    _print_best(pr, summary["best_per_size"])
    if summary.get("auto_check"):
        _print_auto_check(pr, summary["auto_check"])
    wrong = summary["wrong_total"]
    pr.line(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}", always=True)
    avg = summary["avg_busbw_gbps"]
    pr.line(
        f"# Avg bus bandwidth    : {'n/a' if avg is None else f'{avg:.4f}'} GB/s "
        f"(fourd rows, out-of-place and in-place)",
        always=True,
    )
    extra = f", {skipped_count} notes about skipped cells" if skipped_count else ""
    pr.line(
        f"# Collective test concluded: {summary['rows']} rows in {duration:.1f} s{extra}",
        always=True,
    )


def _print_per_algorithm(pr: Printer, per: list) -> None:
    pr.line(
        "# Summary: avg busbw over sizes, out-of-place and in-place; avg eff = bound / time; "
        "vs = geometric mean of t_baseline / t_fourd (> 1: fourd faster)",
        always=True,
    )
    pr.line(
        f"#   {'collective':<15}{'axis':<10}{'algorithm':<13}{'avg busbw':>10}{'avg eff':>9}"
        f"{'vs mpi':>8}{'vs torch':>9}",
        always=True,
    )
    for s in per:
        label = s["algorithm"] if s["library"] == "fourd" else s["library"]
        eff = "-" if s["avg_efficiency"] is None else f"{s['avg_efficiency'] * 100:.0f}%"
        pr.line(
            f"#   {s['collective']:<15}{s['axis']:<10}{label:<13}{s['avg_busbw_gbps']:>10.3f}"
            f"{eff:>9}{_r(s['ratio_vs_mpi']):>8}{_r(s['ratio_vs_torch']):>9}",
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
    if b["fastest"] and b["fastest"] in ("mpi", "torch"):
        txt += "*"
    return txt


def _print_auto_check(pr: Printer, ac: dict) -> None:
    w = ac["worst"]
    where = (
        f"{w['collective']} {w['axis']} {w['dtype']} {fmt_size(w['size_bytes'])} "
        f"{'in-place' if w['in_place'] else 'out-of-place'}: auto ran "
        f"{w['auto_choice']}, fastest {w['best_algorithm']}"
    )
    pr.line(
        f"# auto within {round((ac['margin'] - 1) * 100)}% of the fastest single algorithm: "
        f"{ac['within_by_time']}/{ac['cells']} cells by time, {ac['within_by_median']}/"
        f"{ac['cells']} by per-iteration median; worst {ac['worst']['ratio']:.2f}x "
        f"({where})",
        always=True,
    )
    if ac["same_algorithm_cells"]:
        pr.line(
            f"# run noise: auto's cell vs the cell of the algorithm it ran (same code, "
            f"{ac['same_algorithm_cells']} cells): median difference "
            f"{ac['same_algorithm_diff_median'] * 100:.0f}%, largest "
            f"{ac['same_algorithm_diff_max'] * 100:.0f}%",
            always=True,
        )
        pr.line(
            f"# auto's choice: the algorithm it ran, in its own cell, within "
            f"{round((ac['margin'] - 1) * 100)}% of the fastest in {ac['choice_within']}/"
            f"{ac['same_algorithm_cells']} cells",
            always=True,
        )
    if ac.get("groups_split_cells"):
        pr.line(
            f"# auto's groups split: in {ac['groups_split_cells']} cells the groups of the "
            f"axis settled on different algorithms (auto(a|b) above; docs/algorithms.md)",
            always=True,
        )
