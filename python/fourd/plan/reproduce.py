"""The model against published numbers, and at scale (tables and plots of docs/planner.md).

    python -m fourd.plan.reproduce --out docs/planner            # everything
    python -m fourd.plan.reproduce --out docs/planner --only axonn pccl

- ``axonn``: predicted all-reduce bus bandwidth by (stride, group size) on Perlmutter next to
  the table AxoNN's communication model uses (Megatron-AxoNN, examples/comm_model.py);
- ``pccl``: hierarchical all-gather and reduce-scatter against the library's flat ring as the
  node count grows (PCCL, arXiv 2504.18658), Frontier and Perlmutter;
- ``scaling``: predicted step time of GPT-20B and GPT-80B from 64 to 4,096 GPUs, the best plan
  with fourd's algorithms against the best plan with flat collectives only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import _C
from .model import AXES, Placement, placement
from .profiles import get_profile
from .search import search

# AxoNN's coded Perlmutter bus bandwidths (GB/s) by (stride, size): Megatron-AxoNN,
# branch gordon-bell-perlmutter, examples/comm_model.py.
AXONN_PERLMUTTER = {
    (1, 2): 76,
    (2, 2): 76,
    (1, 4): 225,
    (1, 8): 80,
    (1, 16): 80,
    (1, 32): 80,
    (1, 64): 80,
    (2, 4): 40,
    (2, 8): 40,
    (2, 16): 40,
    (2, 32): 40,
    (4, 2): 20,
    (4, 4): 20,
    (4, 8): 20,
    (4, 16): 20,
    (8, 2): 20,
    (8, 4): 20,
    (8, 8): 20,
}


def _busbw_ar(seconds: float, nbytes: int, g: int) -> float:
    return 2 * (g - 1) / g * nbytes / seconds / 1e9


def axonn_table() -> tuple:
    """(markdown, rows): predicted flat all-reduce busbw of a 1.3 GB fp16 buffer (AxoNN's
    startup benchmark) on Perlmutter groups of each (stride, size)."""
    prof = get_profile("perlmutter")
    nprof = prof.native()
    n = 1_300_000_000
    rows = []
    for (stride, size), axonn in sorted(AXONN_PERLMUTTER.items()):
        pl = placement(size, stride, size * stride, prof.ranks_per_node)
        t = _C.predict("all_reduce", "flat", n, "float16", pl.native(), nprof)
        best = _C.choose("all_reduce", n, "float16", pl.native(), nprof)
        tb = _C.predict("all_reduce", best, n, "float16", pl.native(), nprof)
        rows.append(
            {
                "stride": stride,
                "size": size,
                "nodes": pl.nodes,
                "ranks_per_node": pl.ranks_per_node,
                "axonn_gbps": axonn,
                "flat_gbps": _busbw_ar(t, n, size),
                "best": best,
                "best_gbps": _busbw_ar(tb, n, size),
            }
        )
    lines = [
        "| stride | size | placement (nodes x k) | AxoNN table GB/s | model, flat GB/s | "
        "model/AxoNN | fourd's choice | its busbw GB/s |",
        "|---:|---:|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stride']} | {r['size']} | {r['nodes']} x {r['ranks_per_node']} | "
            f"{r['axonn_gbps']} | {r['flat_gbps']:.0f} | {r['flat_gbps'] / r['axonn_gbps']:.2f} | "
            f"{r['best']} | {r['best_gbps']:.0f} |"
        )
    return "\n".join(lines) + "\n", rows


PCCL_SIZES = (16 << 20, 128 << 20, 1 << 30)
PCCL_NODES = (2, 4, 8, 16, 32, 64, 128, 256)


def pccl_table(machine: str) -> tuple:
    """(markdown, rows): flat / hierarchical time of all-gather and reduce-scatter (bf16,
    output / input sizes as in PCCL's benchmark) as the node count grows."""
    prof = get_profile(machine)
    nprof = prof.native()
    r = prof.ranks_per_node
    rows = []
    for coll in ("all_gather", "reduce_scatter"):
        for n in PCCL_SIZES:
            for nodes in PCCL_NODES:
                shape = Placement(nodes * r, nodes, r, True).native()
                flat = _C.predict(coll, "flat", n, "bfloat16", shape, nprof)
                ring = _C.predict(coll, "ring", n, "bfloat16", shape, nprof)
                hier = _C.predict(coll, "hierarchical", n, "bfloat16", shape, nprof)
                rows.append(
                    {
                        "machine": machine,
                        "collective": coll,
                        "bytes": n,
                        "nodes": nodes,
                        "gpus": nodes * r,
                        "flat_ms": flat * 1e3,
                        "ring_ms": ring * 1e3,
                        "hierarchical_ms": hier * 1e3,
                        "speedup_vs_flat": flat / hier,
                        "speedup_vs_ring": ring / hier,
                    }
                )
    hdr = "| collective | size | " + " | ".join(f"{n} nodes" for n in PCCL_NODES) + " |"
    lines = [
        f"Speedup of hierarchical over the library's flat ring on {machine} "
        f"({r} GPUs per node), predicted:",
        "",
        hdr,
        "|---|---|" + "---:|" * len(PCCL_NODES),
    ]
    for coll in ("all_gather", "reduce_scatter"):
        for n in PCCL_SIZES:
            sel = [x for x in rows if x["collective"] == coll and x["bytes"] == n]
            lines.append(
                f"| {coll} | {n >> 20} MiB | "
                + " | ".join(f"{x['speedup_vs_flat']:.1f}x" for x in sel)
                + " |"
            )
    return "\n".join(lines) + "\n", rows


def pccl_plot(rows: list, path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    machines = sorted({x["machine"] for x in rows})
    fig, axes = plt.subplots(1, len(machines), figsize=(5.5 * len(machines), 4), squeeze=False)
    for ax, m in zip(axes[0], machines):
        for coll, style in (("all_gather", "-"), ("reduce_scatter", "--")):
            for n in PCCL_SIZES:
                sel = [
                    x
                    for x in rows
                    if x["machine"] == m and x["collective"] == coll and x["bytes"] == n
                ]
                ax.plot(
                    [x["nodes"] for x in sel],
                    [x["speedup_vs_flat"] for x in sel],
                    style,
                    marker="o",
                    ms=3,
                    label=f"{coll} {n >> 20} MiB",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("flat time / hierarchical time")
        ax.set_title(f"{m}: hierarchical vs flat ring (predicted)")
        ax.axhline(1.0, color="k", lw=0.6)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


SCALING_GPUS = (64, 128, 256, 512, 1024, 2048, 4096)


def scaling(machine: str, models=("gpt-20b", "gpt-80b"), gpus=SCALING_GPUS) -> list:
    rows = []
    for model in models:
        for g in gpus:
            best = search(model, g, machine, top_k=1)
            flat = search(model, g, machine, top_k=1, policy="flat")
            if not best.plans:
                rows.append({"machine": machine, "model": model, "gpus": g, "fits": False})
                continue
            b, f = best.plans[0], flat.plans[0]
            rows.append(
                {
                    "machine": machine,
                    "model": model,
                    "gpus": g,
                    "fits": True,
                    "fourd_s": b.step_time,
                    "flat_s": f.step_time,
                    "speedup": f.step_time / b.step_time,
                    "fourd_plan": b.label(),
                    "fourd_algorithms": b.algorithms,
                    "flat_plan": f.label(),
                    "fourd_exposed_s": b.exposed_total,
                    "flat_exposed_s": f.exposed_total,
                    "compute_s": b.compute_time,
                }
            )
    return rows


def scaling_markdown(rows: list) -> str:
    lines = [
        "| machine | model | GPUs | fourd step (s) | flat step (s) | speedup | "
        "fourd plan | algorithms x/y/z/data | flat plan |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        if not r["fits"]:
            lines.append(
                f"| {r['machine']} | {r['model']} | {r['gpus']} | does not fit | | | | | |"
            )
            continue
        algos = "/".join(r["fourd_algorithms"][a] for a in AXES)
        lines.append(
            f"| {r['machine']} | {r['model']} | {r['gpus']} | {r['fourd_s']:.2f} | "
            f"{r['flat_s']:.2f} | {r['speedup']:.2f}x | {r['fourd_plan']} | {algos} | "
            f"{r['flat_plan']} |"
        )
    return "\n".join(lines) + "\n"


def scaling_plot(rows: list, path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    machines = sorted({r["machine"] for r in rows})
    fig, axes = plt.subplots(1, len(machines), figsize=(5.5 * len(machines), 4), squeeze=False)
    for ax, m in zip(axes[0], machines):
        for model in sorted({r["model"] for r in rows}):
            sel = [r for r in rows if r["machine"] == m and r["model"] == model and r["fits"]]
            if not sel:
                continue
            xs = [r["gpus"] for r in sel]
            # time per step x GPUs: flat lines mean perfect strong scaling
            line = ax.plot(xs, [r["fourd_s"] for r in sel], "-o", ms=3, label=f"{model} fourd")[0]
            ax.plot(
                xs,
                [r["flat_s"] for r in sel],
                "--s",
                ms=3,
                color=line.get_color(),
                label=f"{model} flat",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("predicted step time (s)")
        ax.set_title(f"{m}: best plan, fourd vs flat (batch 1024 x 2048)", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fourd.plan.reproduce",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", default="docs/planner")
    ap.add_argument(
        "--only",
        nargs="*",
        choices=["axonn", "pccl", "scaling"],
        default=["axonn", "pccl", "scaling"],
    )
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    cmd = "python -m fourd.plan.reproduce --out " + args.out
    if "axonn" in args.only:
        text, rows = axonn_table()
        with open(os.path.join(args.out, "axonn_busbw.md"), "w", encoding="utf-8") as f:
            f.write(f"<!-- made by: {cmd} --only axonn -->\n\n{text}")
        print(text)
    if "pccl" in args.only:
        all_rows, parts = [], []
        for m in ("frontier", "perlmutter"):
            text, rows = pccl_table(m)
            parts.append(text)
            all_rows += rows
        with open(os.path.join(args.out, "pccl_hierarchical.md"), "w", encoding="utf-8") as f:
            f.write(f"<!-- made by: {cmd} --only pccl -->\n\n" + "\n".join(parts))
        with open(os.path.join(args.out, "pccl_hierarchical.json"), "w", encoding="utf-8") as f:
            json.dump(all_rows, f, indent=1)
        pccl_plot(all_rows, os.path.join(args.out, "pccl_hierarchical.png"))
        print("\n".join(parts))
    if "scaling" in args.only:
        rows = scaling("perlmutter") + scaling("frontier")
        text = scaling_markdown(rows)
        with open(os.path.join(args.out, "scaling.md"), "w", encoding="utf-8") as f:
            f.write(f"<!-- made by: {cmd} --only scaling -->\n\n{text}")
        with open(os.path.join(args.out, "scaling.json"), "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
        scaling_plot(rows, os.path.join(args.out, "scaling.png"))
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
