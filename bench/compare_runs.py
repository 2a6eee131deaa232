"""Compare two runs of `python -m fourd.bench` with the same command, cell by cell.

    python bench/compare_runs.py BEFORE.json AFTER.json [--label NAME] [--md OUT.md]

A cell is (collective, axis, dtype, op, size, placement, library, algorithm). For every cell in
both runs it prints time(after) / time(before) of the reported time (the median round), and per
implementation the geometric mean and the extremes. The noise it states is each run's own
same-code difference: auto's cell against the cell of the algorithm auto ran, in the same run
(summary.auto_check: median and largest), so a ratio is "beyond the noise" when it exceeds
1 + the larger of the two runs' largest same-code differences.

A machine that is slower or faster as a whole between the two runs moves every cell, the
baselines too. So it also prints each fourd cell relative to its run's own baseline (the MPI
cell of the same dtype, size and placement, or torch's where MPI has none, e.g. bfloat16):
(fourd / baseline after) / (fourd / baseline before), the change of fourd alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def cells(doc: dict) -> dict:
    out = {}
    for r in doc["rows"]:
        if r.get("time_us") is None:
            continue
        key = (
            r["collective"],
            r["axis"],
            r["dtype"],
            r["op"],
            r["size_bytes"],
            r["in_place"],
            r["library"],
            r.get("algorithm") or r["library"],
        )
        out[key] = r["time_us"]
    return out


def noise(doc: dict) -> tuple[float, float]:
    ac = doc.get("summary", {}).get("auto_check") or {}
    return ac.get("same_algorithm_diff_median", 0.0), ac.get("same_algorithm_diff_max", 0.0)


def gmean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def relative(c: dict) -> dict:
    """fourd cells divided by the same run's baseline cell (MPI, else torch)."""
    out = {}
    for k, t in c.items():
        if k[6] != "fourd":
            continue
        base = None
        for lib, alg in (("mpi", "mpi"), ("torch", "torch-gloo")):
            base = c.get(k[:6] + (lib, alg))
            if base:
                break
        if base:
            out[k] = t / base
    return out


def compare(before: dict, after: dict) -> dict:
    b, a = cells(before), cells(after)
    rb, ra = relative(b), relative(a)
    rel: dict = {}
    for k in sorted(set(rb) & set(ra)):
        rel.setdefault(k[7], []).append(ra[k] / rb[k])
    common = sorted(set(b) & set(a))
    by_impl: dict = {}
    for k in common:
        by_impl.setdefault(k[7] if k[6] == "fourd" else k[6], []).append((k, a[k] / b[k]))
    nb, na = noise(before), noise(after)
    limit = 1.0 + max(nb[1], na[1])
    beyond = [(k, r) for k in common for r in [a[k] / b[k]] if r > limit]
    return {
        "cells": len(common),
        "by_impl": by_impl,
        "noise_before": nb,
        "noise_after": na,
        "limit": limit,
        "beyond": beyond,
        "all": [a[k] / b[k] for k in common],
        "relative": rel,
    }


def report(res: dict, label: str) -> str:
    lines = [f"### {label}", ""]
    nb, na = res["noise_before"], res["noise_after"]
    lines.append(
        f"{res['cells']} cells in both runs. Same-code noise (auto's cell vs the cell of the "
        f"algorithm it ran): before median {100 * nb[0]:.1f}%, largest {100 * nb[1]:.1f}%; "
        f"after median {100 * na[0]:.1f}%, largest {100 * na[1]:.1f}%."
    )
    allr = res["all"]
    lines.append(
        f"after / before over all cells: geometric mean {gmean(allr):.3f}, "
        f"{min(allr):.3f} - {max(allr):.3f}; beyond the noise (> {res['limit']:.3f}): "
        f"{len(res['beyond'])} cells."
    )
    lines += [
        "",
        "| implementation | cells | geomean after/before | min | max |",
        "|---|---|---|---|---|",
    ]
    for impl, rs in sorted(res["by_impl"].items()):
        v = [r for _, r in rs]
        lines.append(f"| {impl} | {len(v)} | {gmean(v):.3f} | {min(v):.3f} | {max(v):.3f} |")
    if res["relative"]:
        lines += [
            "",
            "fourd relative to its run's baseline (MPI, or torch for bfloat16), after / before:",
            "",
            "| algorithm | cells | geomean | min | max |",
            "|---|---|---|---|---|",
        ]
        for alg, v in sorted(res["relative"].items()):
            lines.append(f"| {alg} | {len(v)} | {gmean(v):.3f} | {min(v):.3f} | {max(v):.3f} |")
    if res["beyond"]:
        lines += ["", "Beyond the noise:", ""]
        for k, r in res["beyond"]:
            place = "in place" if k[5] else "out of place"
            lines.append(f"- {k[0]} {k[2]} {k[4]} B {place} {k[6]}/{k[7]}: {r:.3f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--label", default=None)
    p.add_argument("--md", default=None, help="append the report to this Markdown file")
    args = p.parse_args(argv)
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    text = report(compare(before, after), args.label or args.after)
    sys.stdout.write(text)
    if args.md:
        with open(args.md, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
