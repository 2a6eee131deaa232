"""A 4D Linear layer's training step, timed step by step: how soon `auto` settles, and what it
costs against the cost model's choice alone (FOURD_TUNE=0).

    mpiexec -n 8 python -m mpi4py bench/linear_step.py --steps 30 --rounds 2 \
        --json bench/results/linear_step_np8.json

The layer is fourd.nn.Linear(1024, 4096) on the grid x2y2z1d2 (8 ranks), 2048 tokens in all
(1024 per batch shard), float32: forward, backward, fourd.nn.sync_gradients and an SGD step.
Its calls: the output's all-reduce over x (8 MiB), dX's over y (2 MiB), dW's over data
(4 MiB) and db's over z+data (8 KiB).

Each round runs every mode in turn on a fresh grid in this one process (so that their ratios
come from one run; the order rotates from round to round): "off" (FOURD_TUNE=0), "on" (the
default: a size's exploration runs inside its second call; the first round starts with no
saved tuning, later rounds with what the round before saved at finalize), "inline"
(FOURD_TUNE=inline: one step of it per call, nothing saved or read). The profile and the saved
tuning live in a cache directory of this run's own (--cache; a new temporary one by default),
so the first "on" round starts fresh.

Printed per mode and round: the slowest rank's time of each step, the first step after which
every call of the layer is settled, and the median step time from step 5 on against "off" of
the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from mpi4py import MPI

WORLD = MPI.COMM_WORLD


def _calls(g, layer, tokens):
    """The layer's collectives as (axis, collective, nbytes): what the step issues."""
    t = tokens // (g.size("z") * g.size("data"))
    calls = [
        ("x", "all_reduce", 4 * t * layer.local_out),
        ("y", "all_reduce", 4 * t * layer.local_in),
        ("data", "all_reduce", 4 * layer.shard_numel),
        (("z", "data"), "all_reduce", 4 * layer.local_out),
    ]
    return [c for c in calls if g.size(c[0]) > 1]


def run_mode(mode: str, steps: int, tokens: int, cache: str) -> dict:
    import fourd
    import fourd.nn

    env = {"off": "0", "on": "1", "inline": "inline"}[mode]
    os.environ["FOURD_TUNE"] = env
    os.environ["FOURD_TUNE_CACHE"] = "0" if mode == "inline" else "1"
    os.environ["XDG_CACHE_HOME"] = cache
    g = fourd.init(x=2, y=2, z=1, data=WORLD.Get_size() // 4)
    torch.manual_seed(0)
    layer = fourd.nn.Linear(1024, 4096, grid=g)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    shard = tokens // (g.size("z") * g.size("data"))
    gen = torch.Generator().manual_seed(1 + g.rank("data"))
    # As in a stack of layers, the input needs its gradient: dX's all-reduce runs too.
    x = torch.randn(shard, layer.local_in, generator=gen).requires_grad_(True)
    calls = _calls(g, layer, tokens)
    saved_at_start = {
        f"{axis}:{n}": g.explain(c, n, axis, "float32", True)["tuning"]["saved"]
        for axis, c, n in calls
    }
    times, settled_after = [], None
    for step in range(1, steps + 1):
        WORLD.Barrier()
        t0 = time.perf_counter()
        y = layer(x)
        y.square().mean().backward()
        x.grad = None
        fourd.nn.sync_gradients(layer, grid=g)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        times.append(WORLD.allreduce(dt, op=MPI.MAX))
        states = [g.explain(c, n, axis, "float32", True)["tuning"]["state"] for axis, c, n in calls]
        # Settled: one algorithm runs ("provisional" too: a switch runs until its re-check,
        # thousands of calls later for small sizes).
        done = all(s in ("settled", "provisional", "single", "off") for s in states)
        # Every rank's state must agree before a step counts as settled.
        done = WORLD.allreduce(int(done), op=MPI.MIN) == 1
        if done and settled_after is None:
            settled_after = step
        elif not done:
            settled_after = None
    final = {
        f"{axis}:{n}": g.explain(c, n, axis, "float32", True)["tuning"] for axis, c, n in calls
    }
    choice = {
        f"{axis}:{n}": g.explain(c, n, axis, "float32", True)["choice"] for axis, c, n in calls
    }
    fourd.finalize()
    return {
        "mode": mode,
        "times_s": times,
        "settled_after_step": settled_after,
        "saved_at_start": saved_at_start,
        "tuning": {
            k: {"state": v["state"], "settled": v["settled"], "measured_s": v["measured_s"]}
            for k, v in final.items()
        },
        "choice": choice,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--modes", default="off,on,inline")
    ap.add_argument("--cache", default=None, help="cache directory (default: a new temporary one)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if WORLD.Get_size() % 4:
        print("linear_step: needs a multiple of 4 ranks (x2y2, data = ranks / 4)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    cache = a.cache or WORLD.bcast(
        tempfile.mkdtemp(prefix="fourd-linear-step-") if WORLD.rank == 0 else None
    )
    rounds = []
    for r in range(a.rounds):
        modes = a.modes.split(",")
        modes = modes[r % len(modes) :] + modes[: r % len(modes)]  # no mode always first
        rows = [run_mode(m, a.steps, a.tokens, cache) for m in modes]
        rounds.append(rows)
        if WORLD.rank == 0:
            base = next((x for x in rows if x["mode"] == "off"), None)
            print(f"# round {r + 1}")
            for x in rows:
                tail = x["times_s"][4:]
                med = statistics.median(tail) if tail else float("nan")
                vs = ""
                if base is not None and base["times_s"][4:]:
                    vs = f"  {med / statistics.median(base['times_s'][4:]):.3f}x off"
                saved = sum(x["saved_at_start"].values())
                label = x["mode"] + (f" ({saved} saved)" if saved else "")
                first = " ".join(f"{t * 1e3:.0f}" for t in x["times_s"][:6])
                print(
                    f"{label:12s} settled after step {x['settled_after_step']}; steps 1-6 ms: "
                    f"{first}; median from step 5: {med * 1e3:.1f} ms{vs}"
                )
                for k, v in x["tuning"].items():
                    ms = " ".join(f"{t * 1e3:.2f}" for t in v["measured_s"])
                    was = " (saved at start)" if x["saved_at_start"][k] else ""
                    print(
                        f"    {k}: runs {x['choice'][k]}; tuning {v['state']} {v['settled']}{was}"
                        f"  measured ms: {ms}"
                    )
            sys.stdout.flush()
    if WORLD.rank == 0 and a.json:
        doc = {
            "command": "mpiexec -n "
            + str(WORLD.Get_size())
            + " python -m mpi4py "
            + " ".join(["bench/linear_step.py", *(argv if argv is not None else sys.argv[1:])]),
            "ranks": WORLD.Get_size(),
            "steps": a.steps,
            "tokens": a.tokens,
            "rounds": rounds,
            "noise": _noise(rounds),
        }
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return 0


def _noise(rounds) -> dict:
    """The spread of "off" itself: its median from step 5 in each round, and the spread of
    its steps (75th over 25th percentile) within a round."""
    out = {}
    offs = [x for rows in rounds for x in rows if x["mode"] == "off"]
    if offs:
        meds = [statistics.median(x["times_s"][4:]) for x in offs if x["times_s"][4:]]
        iqr = [
            float(np.percentile(x["times_s"][4:], 75) / np.percentile(x["times_s"][4:], 25))
            for x in offs
            if len(x["times_s"]) > 8
        ]
        out = {"off_medians_s": meds, "off_p75_over_p25": iqr}
    return out


if __name__ == "__main__":
    sys.exit(main())
