"""Compare two runs of `python -m fourd.bench` with the same command, cell by cell.

    python bench/compare_runs.py BEFORE.json AFTER.json [--label NAME] [--md OUT.md]
    python bench/compare_runs.py B1.json,B2.json A1.json,A2.json     (repeated runs, pooled)

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

Repeated runs of each build (comma-separated, e.g. from an ABBA order: before, after, after,
before, which cancels a drift of the machine that is linear in time) are pooled: a cell's time
is the geometric mean over the runs of its build, and each cell also has its own cross-run
noise, the larger of the two builds' ratios between their own runs of that cell (the same code
measured in two runs). A pooled cell is beyond the noise only when its after/before ratio
exceeds both that cell's cross-run noise and 1 + the largest same-code difference within any
run.
"""

from __future__ import annotations

import argparse
import gzip
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


def pooled(docs: list[dict]) -> tuple[dict, dict]:
    """Cells in every run of one build: the geometric mean of their times, and their spread
    (largest over smallest time across the runs; 1.0 for a single run)."""
    runs = [cells(d) for d in docs]
    keys = set.intersection(*(set(r) for r in runs))
    mean = {k: gmean([r[k] for r in runs]) for k in keys}
    spread = {k: max(r[k] for r in runs) / min(r[k] for r in runs) for k in keys}
    return mean, spread


def compare(before: dict | list, after: dict | list) -> dict:
    bd = before if isinstance(before, list) else [before]
    ad = after if isinstance(after, list) else [after]
    (b, sb), (a, sa) = pooled(bd), pooled(ad)
    rb, ra = relative(b), relative(a)
    rel: dict = {}
    for k in sorted(set(rb) & set(ra)):
        rel.setdefault(k[7], []).append(ra[k] / rb[k])
    common = sorted(set(b) & set(a))
    by_impl: dict = {}
    for k in common:
        by_impl.setdefault(k[7] if k[6] == "fourd" else k[6], []).append((k, a[k] / b[k]))
    nb = max((noise(d) for d in bd), key=lambda x: x[1])
    na = max((noise(d) for d in ad), key=lambda x: x[1])
    limit = 1.0 + max(nb[1], na[1])
    cross = {k: max(sb[k], sa[k]) for k in common}
    beyond = [(k, r) for k in common for r in [a[k] / b[k]] if r > limit and r > cross[k]]
    return {
        "runs": (len(bd), len(ad)),
        "cross": sorted(cross.values()),
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
    runs = res.get("runs", (1, 1))
    if max(runs) > 1:
        cr = res["cross"]
        lines.append(
            f"Pooled: {runs[0]} runs before, {runs[1]} after. Cross-run noise (the same build's "
            f"cell in two runs, larger/smaller): median {100 * (cr[len(cr) // 2] - 1):.1f}%, "
            f"largest {100 * (cr[-1] - 1):.1f}%; a cell is beyond the noise only above its own "
            "cross-run noise too."
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


def load(paths: str) -> dict | list:
    """One JSON file, or a comma-separated list of them (repeated runs of one build)."""
    docs = []
    for path in paths.split(","):
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            docs.append(json.load(f))
    return docs[0] if len(docs) == 1 else docs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--label", default=None)
    p.add_argument("--md", default=None, help="append the report to this Markdown file")
    args = p.parse_args(argv)
    before, after = load(args.before), load(args.after)
    text = report(compare(before, after), args.label or args.after)
    sys.stdout.write(text)
    if args.md:
        with open(args.md, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
