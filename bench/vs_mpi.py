"""fourd's `auto` against the MPI library's collective, per collective and size, from the JSON
of `python -m fourd.bench` (rows with the `mpi` baseline): the geometric mean over the cells of
a size (every axis, placement, dtype and op) of t_mpi / t_auto (> 1: fourd faster), the worst
cell, every cell under --floor, and the run's own noise, for reading a run against the
never-behind-MPI criterion (docs/benchmark.md).

    python bench/vs_mpi.py bench/results/default_np4.json.gz [--floor 0.95]

The noise is what the same code measures twice in one run: auto's cell against the cell of the
algorithm it ran (the bench's "run noise" line, and the same statistic as the table's,
t_algorithm / t_auto per size, whose spread around 1.0 is how far the table's figures move
with no difference in code), and, with 3 or more rounds, each cell's spread between its rounds
(max / min of the round times of MPI's own cell, whose code fourd does not change).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def gmean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def fmt_size(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def cell_key(r):
    """A row's cell: (collective, size, axis, in_place, dtype, op)."""
    return (r["collective"], r["size_bytes"], r["axis"], r["in_place"], r["dtype"], r["op"])


def cells(rows):
    """{(collective, size, axis, in_place, dtype, op): (t_auto, t_mpi, auto_ran, mpi_rounds)};
    auto_ran names every algorithm the axis's groups ran (a|b where they settled differently)."""
    by = {}
    for r in rows:
        k = cell_key(r)
        if r["library"] == "fourd" and r["algorithm"] == "auto":
            by.setdefault(k, {})["auto"] = r
        elif r["library"] == "mpi":
            by.setdefault(k, {})["mpi"] = r
    out = {}
    for k, v in by.items():
        if "auto" in v and "mpi" in v:
            a, m = v["auto"], v["mpi"]
            ran = "|".join(dict.fromkeys(a.get("auto_choices") or [a.get("auto_choice")]))
            out[k] = (a["time_us"], m["time_us"], ran, m.get("round_times_us"))
    return out


def same_code(rows):
    """{(collective, size): [t_algorithm / t_auto]} over the cells where every group of the
    axis ran one algorithm and the row has that algorithm's own cell: the same code timed twice
    in one run."""
    by = {}
    for r in rows:
        if r["library"] == "fourd":
            by.setdefault(cell_key(r), {})[r["algorithm"]] = r
    out = {}
    for k, v in by.items():
        a = v.get("auto")
        ran = set(a.get("auto_choices") or [a.get("auto_choice")]) if a else set()
        if len(ran) == 1 and (alg := ran.pop()) in v:
            out.setdefault(k[:2], []).append(v[alg]["time_us"] / a["time_us"])
    return out


def round_spread(rounds):
    rounds = [t for t in rounds or [] if t]
    return max(rounds) / min(rounds) if len(rounds) >= 2 else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json")
    p.add_argument("--floor", type=float, default=0.95)
    a = p.parse_args(argv)
    doc = load(a.json)
    cs = cells(doc["rows"])
    if not cs:
        raise SystemExit(f"{a.json}: no cell has both fourd auto and the mpi baseline")
    colls = sorted({k[0] for k in cs})
    sizes = sorted({k[1] for k in cs})
    print(f"# {a.json}: {doc.get('command', '')}")
    print("# t_mpi / t_auto, geometric mean over the cells of a size (> 1: fourd faster)")
    print("| size | " + " | ".join(colls) + " |")
    print("|---|" + "---|" * len(colls))
    for s in sizes:
        line = []
        for c in colls:
            rs = [m / t for k, (t, m, _, _) in cs.items() if k[0] == c and k[1] == s]
            line.append(f"{gmean(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})" if rs else "-")
        print(f"| {fmt_size(s)} | " + " | ".join(line) + " |")
    allr = {k: m / t for k, (t, m, _, _) in cs.items()}
    print(f"# all {len(allr)} cells: geomean {gmean(list(allr.values())):.3f}")
    ac = (doc.get("summary") or {}).get("auto_check") or {}
    if ac.get("same_algorithm_diff_median") is not None:
        print(
            "# run noise (auto's cell vs the cell of the algorithm it ran, same code): median "
            f"{ac['same_algorithm_diff_median']:.1%}, largest {ac['same_algorithm_diff_max']:.1%}"
        )
    aa = [gmean(v) for v in same_code(doc["rows"]).values()]
    if aa:
        print(
            "# the same code timed twice (the cell of the algorithm auto ran / auto's cell), "
            f"geometric mean per collective and size: {min(aa):.2f}-{max(aa):.2f}; "
            f"under 1.00 in {sum(x < 1 for x in aa)} of {len(aa)}, under 0.95 in "
            f"{sum(x < 0.95 for x in aa)}"
        )
    spreads = [round_spread(v[3]) for v in cs.values()]
    spreads = [x for x in spreads if x]
    if spreads:
        print(
            "# MPI's own cells between rounds (max/min of the round times): median "
            f"{statistics.median(spreads):.2f}x, largest {max(spreads):.2f}x"
        )
    low = sorted((r, k) for k, r in allr.items() if r < a.floor)
    print(f"# cells under {a.floor}: {len(low)} of {len(allr)}")
    for r, k in low:
        t, m, ran, rounds = cs[k]
        sp = round_spread(rounds)
        print(
            f"#   {k[0]} {fmt_size(k[1])} {k[2]} {'in' if k[3] else 'out of'} place {k[4]}: "
            f"{r:.2f}x (auto ran {ran}; {t:.1f} us vs MPI {m:.1f} us"
            + (f"; MPI's rounds spread {sp:.2f}x)" if sp else ")")
        )


if __name__ == "__main__":
    main()
