"""python -m fourd.plan: rank the 4D configurations of a transformer on a machine.

python -m fourd.plan --model gpt-20b --gpus 1024 --machine perlmutter
python -m fourd.plan --model llama2-7b --gpus 64
python -m fourd.plan --layers 32 --hidden 7168 --heads 56 --gpus 512 --machine frontier --json
mpiexec -n 8 python -m fourd.plan --calibrate --ranks-per-node 4 --out my-machine.json
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import _C
from .._tensor import ITEMSIZE


def _training_dtypes() -> list:
    """The floating types of at most 32 bits a model trains in: bfloat16, float16, float32."""
    return sorted(d for d in _C.FLOATING_DTYPES if ITEMSIZE[d] <= 4)


def _spec_default(name: str):
    """A TransformerSpec field's default (what a custom model gets when the flag is absent)."""
    from .model import TransformerSpec

    return TransformerSpec.__dataclass_fields__[name].default


def _micro_batch(text: str) -> int:
    """--micro-batch: a positive count, or 'auto' (fourd.plan.model.AUTO_MICRO_BATCH)."""
    from .model import AUTO_MICRO_BATCH

    if text.strip().lower() == "auto":
        return AUTO_MICRO_BATCH
    n = int(text)
    if n < 1:
        raise ValueError(text)
    return n


_micro_batch.__name__ = "micro-batch (a count >= 1 or 'auto')"  # argparse's error names it


def _shape_flags(p: argparse.ArgumentParser) -> None:
    """The model-shape flags: each overrides the preset's value; a custom model takes the
    default named in its help."""
    g = p.add_argument_group(
        "model shape",
        "Each flag overrides the preset's value; 'custom:' is what a custom model gets without it.",
    )
    g.add_argument("--layers", type=int, help="transformer layers (custom: required)")
    g.add_argument("--hidden", type=int, help="hidden size (custom: required)")
    g.add_argument("--heads", type=int, help="attention heads (custom: required)")
    g.add_argument(
        "--seq-len", type=int, help=f"tokens per sequence (custom: {_spec_default('seq_len')})"
    )
    g.add_argument("--vocab", type=int, help=f"vocabulary (custom: {_spec_default('vocab')})")
    g.add_argument(
        "--global-batch",
        type=int,
        help=f"sequences per optimizer step (custom: {_spec_default('global_batch')})",
    )
    g.add_argument(
        "--micro-batch",
        type=_micro_batch,
        help="sequences per (data, z) shard per forward/backward pass (at most the shard's "
        "batch), or 'auto': on each grid the one with the least step time that fits "
        "(default: auto)",
    )
    g.add_argument(
        "--dtype",
        choices=_training_dtypes(),
        help=f"weights and activations (custom: {_spec_default('dtype')})",
    )
    g.add_argument(
        "--no-recompute",
        action="store_true",
        help="keep all activations (default: full activation recomputation)",
    )


def _parser() -> argparse.ArgumentParser:
    from .model import PRESETS
    from .profiles import builtin_names

    p = argparse.ArgumentParser(
        prog="python -m fourd.plan",
        description="Rank 4D configurations (Gx, Gy, Gz, Gdata, axis order, algorithm per axis) "
        "of a transformer by predicted step time, and say why the best one wins. "
        "docs/planner.md describes the model.",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"a preset ({', '.join(PRESETS)}), or 'custom' with --layers, --hidden and "
        "--heads (default: custom when those are given)",
    )
    p.add_argument("--gpus", type=int, default=None, help="number of GPUs (ranks); required")
    p.add_argument(
        "--machine",
        default="perlmutter",
        help=f"a built-in profile ({', '.join(builtin_names())}) or a profile JSON file "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--top", type=int, default=5, help="how many configurations to print (default: %(default)s)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON instead of a table: every plan's per-axis times, placements and "
        "memory, the alternatives, the explanation and the assumptions",
    )
    p.add_argument(
        "--save",
        default=None,
        help="write the best plan to this JSON file "
        "(load it with fourd.plan.Plan.load and pass it to fourd.init(plan=...))",
    )
    _shape_flags(p)
    p.add_argument(
        "--algorithm",
        default=None,
        help="force one algorithm on every axis (e.g. flat) instead of choosing "
        "(default: the best per axis)",
    )
    p.add_argument(
        "--overlap-data",
        action="store_true",
        help="hide the data-parallel all-reduce under the last backward pass "
        "(default: it runs after the pass, exposed)",
    )
    c = p.add_argument_group("calibration (run under mpiexec)")
    c.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine's profile with fourd's collectives and save it",
    )
    c.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks per (virtual) node for --calibrate (default: FOURD_RANKS_PER_NODE, "
        "else the ranks sharing this host)",
    )
    c.add_argument(
        "--out",
        default=None,
        help="where --calibrate writes the profile JSON (default: fourd-profile.json)",
    )
    return p


def _calibrate(args) -> int:
    """--calibrate: measure this machine's profile (collective over MPI.COMM_WORLD)."""
    from mpi4py import MPI

    from ..profile.policy import calibrate

    try:
        prof = calibrate(ranks_per_node=args.ranks_per_node, out=args.out)
    except ValueError as e:
        print(f"python -m fourd.plan: {e}", file=sys.stderr)
        return 2
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(prof.to_dict(), indent=2, sort_keys=True))
        print(f"saved to {args.out or 'fourd-profile.json'}", file=sys.stderr)
    return 0


def _overrides(args) -> dict:
    """The model-shape flags, None where not given (the preset's value stays)."""
    return {
        "layers": args.layers,
        "hidden": args.hidden,
        "heads": args.heads,
        "seq_len": args.seq_len,
        "vocab": args.vocab,
        "global_batch": args.global_batch,
        "micro_batch": args.micro_batch,
        "dtype": args.dtype,
        "recompute": False if args.no_recompute else None,
    }


def _model(args, overrides: dict):
    """The preset name, or a custom TransformerSpec from --layers, --hidden and --heads; None
    (after saying what is missing) when neither is given."""
    from .model import PRESETS, TransformerSpec

    if args.model is not None and args.model != "custom":
        return args.model
    missing = [k for k in ("layers", "hidden", "heads") if overrides[k] is None]
    if missing:
        print(
            f"python -m fourd.plan: give --model (one of {', '.join(PRESETS)}) or "
            f"--layers, --hidden and --heads (missing: {', '.join(missing)})",
            file=sys.stderr,
        )
        return None
    return TransformerSpec("custom", layers=args.layers, hidden=args.hidden, heads=args.heads)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.calibrate:
        return _calibrate(args)

    from .search import format_table, search

    if args.gpus is None:
        print("python -m fourd.plan: --gpus is required", file=sys.stderr)
        return 2
    overrides = _overrides(args)
    model = _model(args, overrides)
    if model is None:
        return 2
    try:
        result = search(
            model,
            args.gpus,
            args.machine,
            top_k=args.top,
            policy=args.algorithm,
            overlap_data=args.overlap_data,
            **overrides,
        )
    except ValueError as e:
        print(f"python -m fourd.plan: {e}", file=sys.stderr)
        return 2
    if args.save and result.plans:
        result.plans[0].save(args.save)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_table(result))
    return 0 if result.plans else 1


if __name__ == "__main__":
    sys.exit(main())
