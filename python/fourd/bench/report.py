"""What the benchmark writes and the figures of its summary: the JSON schema, the CSV and the
plot, and the summary's per-implementation averages, auto check and verdict (printer.py prints
them, files.py keeps the files current during a run). Rank 0 only; nothing here communicates.

The JSON schema (docs/benchmark.md describes every field) is checked by `validate()`, which the
tests run on real output.
"""

from __future__ import annotations

import csv
import json
import math

SCHEMA = "fourd.bench"
SCHEMA_VERSION = 6  # 2: rows gained rounds and round_times_us (--rounds); 3: auto_tuning;
#                     4: auto_choices; 5: progress, the summary's verdict and wall_s, the
#                     bandwidth's latency_s, baselines.torch.latency_s, environment.load_average;
#                     6: the torch-fourd library, ratio_vs_fourd (rows, per_algorithm),
#                     baselines.torch-fourd, the torch baselines' default_group

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
    ("ratio_vs_fourd", (float, type(None))),
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
    ("progress", dict),
)
PROGRESS_STATES = ("running", "complete", "interrupted")
LIBRARIES = ("fourd", "mpi", "torch", "torch-fourd")
# The baselines whose ratio a fourd row carries (ratio_vs_<library>: t_baseline / t_fourd).
RATIO_BASELINES = ("mpi", "torch")
# The baseline whose rows carry their own ratio, ratio_vs_fourd: t_row / t_auto (fourd's auto
# cell of the same size and placement), as the others' t_baseline / t_fourd.
VERSUS_FOURD = "torch-fourd"


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
    state = (doc.get("progress") or {}).get("state", PROGRESS_STATES[0])
    if state not in PROGRESS_STATES:
        errs.append(f"progress.state: expected one of {PROGRESS_STATES}, found {state!r}")
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


def json_clean(v):
    """NaN/inf -> None (JSON has no such numbers), recursively."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_clean(x) for x in v]
    return v


def write_json(path: str, doc: dict):
    with open(path, "w") as f:
        json.dump(json_clean(doc), f, indent=1, allow_nan=False)
        f.write("\n")


def csv_values(r: dict, names: list) -> list:
    """One row's CSV fields, in the order of `names`."""
    out = []
    for k in names:
        v = r.get(k)
        if k in ("times_us", "round_times_us"):
            v = " ".join(f"{x:g}" for x in v or [])
        elif isinstance(v, list):  # auto_choices: names, space-separated
            v = " ".join(str(x) for x in v)
        elif isinstance(v, dict):  # auto_tuning: as in the JSON
            v = json.dumps(json_clean(v), sort_keys=True)
        elif isinstance(v, float):
            v = f"{v:.6g}"
        elif v is None:
            v = ""
        out.append(v)
    return out


def write_csv(path: str, rows: list):
    names = [k for k, _ in ROW_FIELDS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for r in rows:
            w.writerow(csv_values(r, names))


def series_label(row) -> str:
    return row["algorithm"] if row["library"] == "fourd" else row["library"]


def latency_floor_s(group_size: int, latency_s: float | None) -> float:
    """The fewest message latencies a collective of a group of p ranks can take, ceil(log2 p)
    (a rank's result depends on every rank's data, and each round of messages at most doubles
    how many ranks' data a rank has seen: Chan et al., Collective communication: theory,
    practice, and experience, 2007), times the one-way latency of a small message; 0 without
    a latency."""
    if not latency_s or group_size < 2:
        return 0.0
    return math.ceil(math.log2(group_size)) * latency_s


def bound_busbw(row: dict, latency_s: float | None = None) -> float | None:
    """The busbw the bound allows for a row (GB/s): S x bus factor over the longer of the
    bandwidth bound (bound_us) and the latency floor; None without a bound."""
    if not row.get("bound_us"):
        return None
    t = max(row["bound_us"] * 1e-6, latency_floor_s(row["group_size"], latency_s))
    return row["size_bytes"] / t / 1e9 * row["bus_factor"]


def write_plot(path: str, rows: list, title: str, latency_s: float | None = None):
    """busbw (log y) against size (log2 x) per algorithm and baseline, one panel per
    (collective, axis); out-of-place rows, or in-place where an implementation has only those;
    the dotted line is the busbw the bound allows: the bandwidth bound, and at small sizes the
    latency floor of `latency_s` per message round (latency_floor_s). One legend for every
    panel, below them, so that it covers no data; an implementation has the same colour in
    every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    colls = list(dict.fromkeys(r["collective"] for r in rows)) or ["(no rows)"]
    axes = list(dict.fromkeys(r["axis"] for r in rows)) or [""]
    colours = {
        label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(map(series_label, rows)))
    }
    size_fmt = FuncFormatter(lambda v, _pos: fmt_size(int(v)) if v >= 1 else "")
    height = 3.4 * len(colls)
    fig, grid = plt.subplots(
        len(colls), len(axes), figsize=(4.6 * len(axes), height), squeeze=False
    )
    legend: dict = {}
    for i, c in enumerate(colls):
        for j, a in enumerate(axes):
            mine = [r for r in rows if r["collective"] == c and r["axis"] == a]
            _plot_panel(grid[i][j], mine, f"{c} on {a}", size_fmt, colours, latency_s)
            for h, label in zip(*grid[i][j].get_legend_handles_labels()):
                legend.setdefault(label, h)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, _legend_below(fig, legend, 3 * len(axes), height), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend_below(fig, legend: dict, most: int, height: float) -> float:
    """One legend (label -> handle) under the panels, at most `most` entries a line; the
    share of the figure's height it takes (0 without entries)."""
    if not legend:
        return 0.0
    ncol = max(1, min(len(legend), most))
    fig.legend(
        list(legend.values()),
        list(legend),
        loc="lower center",
        ncol=ncol,
        fontsize=7,
        frameon=False,
    )
    return (0.22 * math.ceil(len(legend) / ncol) + 0.1) / height


def _plot_panel(ax, mine: list, title: str, size_fmt, colours: dict, latency_s) -> None:
    """One (collective, axis): a line per series, the bound dotted."""
    variants = list(dict.fromkeys((r["dtype"], r["op"]) for r in mine))
    for key in dict.fromkeys((series_label(r), r["dtype"], r["op"]) for r in mine):
        sel = [r for r in mine if (series_label(r), r["dtype"], r["op"]) == key]
        _plot_series(ax, sel, key, variants, colours.get(key[0]))
    bnd = {r["size_bytes"]: bound_busbw(r, latency_s) for r in mine if r.get("bound_us")}
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


_MARKERS = "os^vDPX*"


def _plot_series(ax, sel: list, key: tuple, variants: list, colour) -> None:
    """One series (label, dtype, op): its out-of-place rows, else its in-place ones; its
    colour is its implementation's, its marker its (dtype, op)'s."""
    oop = [r for r in sel if not r["in_place"]]
    use = sorted(oop or sel, key=lambda r: r["size_bytes"])
    label = key[0] + ("" if oop else " (in-place)")
    if len(variants) > 1:
        label += f" {key[1]}" + ("" if key[2] == "none" else f" {key[2]}")
    marker = _MARKERS[variants.index((key[1], key[2])) % len(_MARKERS)]
    line = "-" if use and use[0]["library"] == "fourd" else "--"
    ax.plot(
        [r["size_bytes"] for r in use],
        [r["busbw_gbps"] for r in use],
        line,
        marker=marker,
        ms=3,
        color=colour,
        label=label,
    )


def fmt_size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def plural(n: int, word: str) -> str:
    """'1 cell', '2 cells'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


AUTO_MARGIN = 1.10  # the "within 10% of the best single algorithm"
# A cell whose mean time is over STALL_RATIO x its per-iteration median had a few iterations
# held up (a busy machine: a rank descheduled, another job's burst), so its mean, and any ratio
# made of it, says more about the machine than about the implementation.
STALL_RATIO = 1.5
# Without auto's twin cells (no auto, or no single algorithm), the run is too noisy to compare
# when more than this share of its cells stalled.
STALLED_SHARE = 0.25


def stalled(row: dict) -> bool:
    """Whether a cell stalled: its mean time over STALL_RATIO x its per-iteration median."""
    med = row.get("time_us_median") or 0.0
    return med > 0 and row["time_us"] > STALL_RATIO * med


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
        "auto_mean_over_median": auto["time_us"] / auto["time_us_median"]
        if auto.get("time_us_median")
        else None,
    }


def verdict(rows: list, ac: dict | None) -> dict | None:
    """Whether the run can compare implementations within AUTO_MARGIN. The measure is the
    run's own noise: auto's cell against the cell of the algorithm it ran, the same code timed
    twice (auto_check); when their median difference exceeds the margin, a difference within
    the margin means nothing. Without such pairs, the share of cells that stalled decides."""
    if not rows:
        return None
    stalls = sum(stalled(r) for r in rows)
    noise = ac.get("same_algorithm_diff_median") if ac else None
    if noise is not None:
        too_noisy, basis = noise > AUTO_MARGIN - 1.0, "same code"
    else:
        too_noisy, basis = stalls > STALLED_SHARE * len(rows), "stalls"
    return {
        "too_noisy": bool(too_noisy),
        "basis": basis,
        "margin": AUTO_MARGIN,
        "noise_median": noise,
        "noise_max": ac.get("same_algorithm_diff_max") if ac else None,
        "stalled_cells": stalls,
        "stall_ratio": STALL_RATIO,
        "cells": len(rows),
    }


def summarize(rows: list, wall_s: dict | None = None) -> dict:
    """Per (collective, axis, implementation): average busbw and efficiency, geometric-mean
    speed ratios; per (collective, axis, dtype, op, size): the fastest fourd algorithm and the
    fastest of all; the auto check and the verdict; `wall_s`, the seconds each implementation's
    cells took (the runner's), as given. Linear in the rows: the files are rewritten, with
    their summary, after every row of a run."""
    fourd_rows = [r for r in rows if r["library"] == "fourd"]
    wrong = sum(r["wrong"] or 0 for r in rows)
    ac = auto_check(rows)
    return {
        "per_algorithm": _per_algorithm(rows),
        "best_per_size": _best_per_size(rows),
        "auto_check": ac,
        "verdict": verdict(rows, ac),
        "wall_s": dict(wall_s or {}),
        "avg_busbw_gbps": (sum(r["busbw_gbps"] for r in fourd_rows) / len(fourd_rows))
        if fourd_rows
        else None,
        "wrong_total": wrong,
        "rows": len(rows),
    }


def _grouped(rows: list, key) -> dict:
    """key(row) -> the rows with that key, in the order of their first row."""
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _per_algorithm(rows: list) -> list:
    per = []
    groups = _grouped(rows, lambda r: (r["collective"], r["axis"], r["library"], r["algorithm"]))
    for (c, a, lib, alg), sel in groups.items():
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
                "ratio_vs_fourd": geomean([r["ratio_vs_fourd"] for r in sel])
                if lib == VERSUS_FOURD
                else None,
            }
        )
    return per


def _best_per_size(rows: list) -> list:
    groups = _grouped(
        rows, lambda r: (r["collective"], r["axis"], r["dtype"], r["op"], r["size_bytes"])
    )
    return [_best_of(key, sel) for key, sel in groups.items()]


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
