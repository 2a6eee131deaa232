"""Compares two loss logs of examples/train_gpt_4d.py (--loss-log): the loss curves step by step,
the mean loss over the last 10, 50 and 100 steps (one step's loss swings with its batch; the
mean of a window is what a comparison of convergence can rest on), and the step times (median
from step 5, after the warm-up steps), the first file the baseline. Runs made with --eval-every
also compare their held-out losses (one fixed set of batches, the same for every seed): the
measure of convergence that one step's batch does not move.

    python bench/compare_losses.py base.json other.json
"""

import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main(argv):
    base, other = load(argv[0]), load(argv[1])
    lb = [s["loss"] for s in base["steps"]]
    lo = [s["loss"] for s in other["steps"]]
    tb = statistics.median(s["step_s"] for s in base["steps"][5:])
    to = statistics.median(s["step_s"] for s in other["steps"][5:])
    print(f"{'step':>5}{'loss ' + argv[0].rsplit('/', 1)[-1]:>40}{'other':>12}{'rel diff':>10}")
    for i in range(0, len(lb), max(1, len(lb) // 12)):
        print(f"{i:>5}{lb[i]:>40.5f}{lo[i]:>12.5f}{(lo[i] - lb[i]) / lb[i]:>+10.2%}")
    rel = (lo[-1] - lb[-1]) / lb[-1]
    print(f"final loss after {len(lb)} steps: {lb[-1]:.5f} vs {lo[-1]:.5f} ({rel:+.2%})")
    for w in (10, 50, 100):
        if w <= min(len(lb), len(lo)):
            mb, mo = statistics.fmean(lb[-w:]), statistics.fmean(lo[-w:])
            print(f"mean loss of the last {w} steps: {mb:.5f} vs {mo:.5f} ({(mo - mb) / mb:+.2%})")
    print(
        f"median step time from step 5: {tb * 1e3:.1f} ms vs {to * 1e3:.1f} ms "
        f"({(to - tb) / tb:+.1%}; other / base {to / tb:.3f})"
    )
    eb = {e["step"]: e["loss"] for e in base.get("evals") or []}
    for e in other.get("evals") or []:
        if e["step"] in eb:
            b = eb[e["step"]]
            print(
                f"held-out loss after step {e['step']}: {b:.5f} vs {e['loss']:.5f} "
                f"({(e['loss'] - b) / b:+.2%})"
            )
    c = other.get("compression") or {}
    if c:
        print(f"other's data-parallel all-reduce: {c.get('data')}")


if __name__ == "__main__":
    main(sys.argv[1:])
