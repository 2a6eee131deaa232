"""Markdown tables of recorded `python -m fourd.bench` runs, as quoted in bench/README.md.

    python bench/results/tables.py bench/results/onenode_np4_all_reduce.json [--hier]
    python bench/results/tables.py --overhead bench/results/overhead_8B_np4.json ...

One row per (collective, dtype, size, placement): auto's time, the fastest single fourd
algorithm of the same run, auto against the MPI library (mpi4py) and torch.distributed (gloo),
auto over the best (1.00 = auto picked the best; < 1 happens through noise), and with --hier
the hierarchical algorithm's speed-up over flat and ring in the same row, the physical bound
of the row (the bench's `bound_us`) and the share of it that hierarchical and flat reach
(bound / time). Ratios only compare rows of one run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys


def load(path: str) -> dict:
    """A recorded run: JSON, or gzipped JSON (the recordings over 500 KB are stored as .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _size(b: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def _ratio(x) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def cells(doc: dict) -> dict:
    """(collective, dtype, size, in_place) -> {label: row}; label = fourd algorithm or library."""
    out: dict = {}
    for r in doc["rows"]:
        key = (r["collective"], r["dtype"], r["size_bytes"], r["in_place"])
        label = r["algorithm"] if r["library"] == "fourd" else r["library"]
        out.setdefault(key, {})[label] = r
    return out


def _hier_columns(c: dict, auto: dict) -> list[str]:
    """hier vs flat, hier vs ring, the row's bound, and the efficiencies of hier and flat."""
    h = c.get("hierarchical")
    out = []
    for other in ("flat", "ring"):
        o = c.get(other)
        out.append(_ratio(o["time_us"] / h["time_us"]) if h and o else "n/a")
    f = c.get("flat")
    out.append(f"{auto['bound_us']:.0f}" if auto.get("bound_us") else "n/a")
    out.append(
        f"{h['efficiency']:.0%} / {f['efficiency']:.0%}"
        if h and f and h.get("efficiency") and f.get("efficiency")
        else "n/a"
    )
    return out


def result_table(doc: dict, hier: bool) -> str:
    head = [
        "collective",
        "dtype",
        "size",
        "placement",
        "auto (us)",
        "best single algorithm (us)",
        "auto vs MPI",
        "auto vs gloo",
        "auto / best",
    ]
    if hier:
        head += ["hier vs flat", "hier vs ring", "bound (us)", "eff hier / flat"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_key = cells(doc)
    for key in sorted(by_key):
        c = by_key[key]
        auto = c.get("auto")
        singles = {a: r for a, r in c.items() if a not in ("auto", "mpi", "torch")}
        if auto is None or not singles:
            continue
        best_name, best = min(singles.items(), key=lambda kv: kv[1]["time_us"])
        row = [
            key[0],
            key[1],
            _size(key[2]),
            "in" if key[3] else "out",
            f"{auto['time_us']:.0f}",
            f"{best_name} {best['time_us']:.0f}",
            _ratio(auto.get("ratio_vs_mpi")),
            _ratio(auto.get("ratio_vs_torch")),
            f"{auto['time_us'] / best['time_us']:.2f}",
        ]
        if hier:
            row += _hier_columns(c, auto)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def overhead_table(paths: list[str]) -> str:
    lines = [
        "| ranks | size | timing | fourd flat out / in place (us) | "
        "MPI via mpi4py out / in place (us) | fourd - MPI (out / in place) |",
        "|---|---|---|---|---|---|",
    ]
    for p in paths:
        doc = load(p)
        mode = doc.get("timing", {}).get("mode", "iteration")
        by = {}
        for r in doc["rows"]:
            by[(r["library"], r["in_place"])] = r
        f_o, f_i = by[("fourd", False)], by[("fourd", True)]
        m_o, m_i = by[("mpi", False)], by[("mpi", True)]
        n = doc["grid"]["world_size"]
        size = f_o["size_bytes"]
        if size <= 4096:
            diff = (
                f"{f_o['time_us'] - m_o['time_us']:+.1f} / "
                f"{f_i['time_us'] - m_i['time_us']:+.1f} us"
            )
        else:
            diff = (
                f"{m_o['time_us'] / f_o['time_us']:.2f}x / "
                f"{m_i['time_us'] / f_i['time_us']:.2f}x of MPI's speed"
            )
        lines.append(
            f"| {n} | {_size(size)} | {mode} | {f_o['time_us']:.2f} / {f_i['time_us']:.2f} | "
            f"{m_o['time_us']:.2f} / {m_i['time_us']:.2f} | {diff} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--hier", action="store_true", help="add hierarchical vs flat / ring columns")
    ap.add_argument("--overhead", action="store_true", help="the per-call overhead table")
    a = ap.parse_args(argv)
    if a.overhead:
        print(overhead_table(a.json))
        return 0
    for p in a.json:
        print(result_table(load(p), a.hier))
    return 0


if __name__ == "__main__":
    sys.exit(main())
