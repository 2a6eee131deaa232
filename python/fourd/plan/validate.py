"""Predicted against measured collective times.

Reads the JSON of ``python -m fourd.bench --json`` (rows with at least: collective, axis,
algorithm, size_bytes, dtype, time_us, group_size, nodes, ranks_per_node), predicts each row
with the C++ model and a profile, and reports the relative error per row, per (collective,
algorithm) and overall::

    python -m fourd.plan.validate bench.json --machine my-profile.json \\
        --out docs/planner/validation.md --plot docs/planner/validation.png

Exit status 0 when the median absolute error is under the threshold (25% by default), 1 when
not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from .. import _C
from .model import Placement
from .profiles import get_profile

REQUIRED = (
    "collective",
    "algorithm",
    "size_bytes",
    "dtype",
    "time_us",
    "group_size",
    "nodes",
    "ranks_per_node",
)


def load_rows(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if isinstance(d, dict):
        for key in ("rows", "results", "data"):
            if isinstance(d.get(key), list):
                d = d[key]
                break
    if not isinstance(d, list):
        raise ValueError(f"{path}: expected a list of rows or an object with 'rows'")
    return d


def compare(rows, profile) -> list:
    """Rows of fourd's algorithms (and 'auto') with predicted_us and error = (pred - meas)/meas.
    Rows of other libraries, single-rank groups and zero-byte sizes are skipped."""
    nprof = profile.native()
    out = []
    for r in rows:
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"bench row {r!r}: missing {missing}")
        algo = str(r["algorithm"])
        if algo not in _C.ALGORITHMS:
            continue
        g, nodes, k = int(r["group_size"]), int(r["nodes"]), int(r["ranks_per_node"])
        n = int(r["size_bytes"])
        meas = float(r["time_us"])
        if g < 2 or n <= 0 or meas <= 0:
            continue
        uniform = nodes * k == g
        shape = Placement(g, nodes, k if uniform else max(1, g // nodes), uniform).native()
        pred = _C.predict(r["collective"], algo, n, r["dtype"], shape, nprof) * 1e6
        if pred == float("inf"):
            continue
        out.append({**r, "predicted_us": pred, "error": (pred - meas) / meas})
    return out


def summary(compared: list, threshold: float = 0.25) -> dict:
    if not compared:
        return {"rows": 0, "median_abs_error": None, "pass": False, "groups": {}}
    errs = [abs(x["error"]) for x in compared]
    groups = {}
    for x in compared:
        groups.setdefault(f"{x['collective']}/{x['algorithm']}", []).append(abs(x["error"]))
    med = statistics.median(errs)
    return {
        "rows": len(compared),
        "median_abs_error": med,
        "within_25pct": sum(e < 0.25 for e in errs) / len(errs),
        "pass": med < threshold,
        "threshold": threshold,
        "groups": {
            k: {"rows": len(v), "median_abs_error": statistics.median(v)}
            for k, v in sorted(groups.items())
        },
    }


def report_markdown(compared: list, summ: dict, source: str, machine: str) -> str:
    lines = [
        f"# Predicted vs measured: {source}",
        "",
        f"Profile: `{machine}`. Rows: {summ['rows']}. "
        f"Median absolute error: "
        + (f"{100 * summ['median_abs_error']:.1f}%" if summ["rows"] else "n/a")
        + f" (threshold {100 * summ.get('threshold', 0.25):.0f}%: "
        + ("pass" if summ["pass"] else "FAIL")
        + ").",
        "",
        "| collective/algorithm | rows | median abs error |",
        "|---|---:|---:|",
    ]
    for k, v in summ["groups"].items():
        lines.append(f"| {k} | {v['rows']} | {100 * v['median_abs_error']:.1f}% |")
    lines += [
        "",
        "| collective | axis | algorithm | bytes | group (nodes x k) | measured us | "
        "predicted us | error |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for x in compared:
        lines.append(
            f"| {x['collective']} | {x.get('axis', '')} | {x['algorithm']} | {x['size_bytes']} | "
            f"{x['group_size']} ({x['nodes']} x {x['ranks_per_node']}) | {x['time_us']:.1f} | "
            f"{x['predicted_us']:.1f} | {100 * x['error']:+.0f}% |"
        )
    return "\n".join(lines) + "\n"


def plot(compared: list, path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for algo in sorted({x["algorithm"] for x in compared}):
        xs = [x["time_us"] for x in compared if x["algorithm"] == algo]
        ys = [x["predicted_us"] for x in compared if x["algorithm"] == algo]
        ax.scatter(xs, ys, s=12, label=algo)
    lo = min(min(x["time_us"], x["predicted_us"]) for x in compared)
    hi = max(max(x["time_us"], x["predicted_us"]) for x in compared)
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [1.25 * lo, 1.25 * hi], "k:", lw=0.6)
    ax.plot([lo, hi], [0.75 * lo, 0.75 * hi], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (us)")
    ax.set_ylabel("predicted (us)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fourd.plan.validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("bench_json")
    ap.add_argument("--machine", required=True, help="profile name or JSON (e.g. calibrated)")
    ap.add_argument("--out", help="write a markdown report here")
    ap.add_argument("--plot", help="write a predicted-vs-measured scatter plot (PNG) here")
    ap.add_argument("--threshold", type=float, default=0.25)
    args = ap.parse_args(argv)
    try:
        profile = get_profile(args.machine)
        compared = compare(load_rows(args.bench_json), profile)
    except (OSError, ValueError) as e:
        print(f"validate: {e}", file=sys.stderr)
        return 2
    summ = summary(compared, args.threshold)
    text = report_markdown(compared, summ, args.bench_json, profile.name)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    if args.plot and compared:
        plot(compared, args.plot)
    print(json.dumps({k: v for k, v in summ.items() if k != "groups"}, indent=2))
    for k, v in summ["groups"].items():
        print(f"  {k:<28} rows {v['rows']:>4}  median |error| {100 * v['median_abs_error']:.1f}%")
    return 0 if summ["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
