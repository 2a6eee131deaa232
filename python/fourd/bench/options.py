"""Command line of ``python -m fourd.bench``: parsing and validation, with no MPI.

Every rank parses the same argv, so every rank reaches the same verdict; the driver then prints
a UsageError on rank 0 only and every rank exits with status 2. Names follow nccl-tests where
nccl-tests has the option (-b -e -f -i -n -w -c -d -o -T -J).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
from dataclasses import dataclass, field

from fourd import _C
from fourd.errors import InvalidArgumentError

from .collectives import DEFAULT_COLLECTIVES, TABLE
from .report import plural

# Names are fourd's (fourd._C); the benchmark adds its own baselines and the CLI spellings below.
DTYPES = _C.DTYPES
# torch-fourd is torch.distributed on fourd's own backend (fourd.distributed): measured when
# asked for (a name, or all), since it times fourd against itself through torch's API.
BASELINES = ("mpi", "torch", "torch-fourd")
DEFAULT_BASELINES = ("mpi", "torch")
# nccl-tests' name for int8, which fourd's parser does not take (fourd._C.parse_dtype takes the
# other spellings: float, double, half, bf16, int, ...).

# Default sweep: 1 KiB .. 16 MiB by 4 keeps a no-flag run on 4 ranks of a 2-core machine well
# inside 90 s while covering the latency-bound and the bandwidth-bound ends.
DEFAULT_MINBYTES = 1024
DEFAULT_MAXBYTES = 16 * 1024 * 1024
DEFAULT_STEPFACTOR = 4.0
MAX_SIZES = 200
DEFAULT_WARMUP = 5


class UsageError(Exception):
    """A bad command line. The message names the option, what was expected and what was found."""


class HelpRequested(Exception):
    """-h/--help: print the help (rank 0) and exit 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class _Parser(argparse.ArgumentParser):
    # argparse would print and sys.exit() on every rank; raise instead, the driver decides.
    def error(self, message):
        raise UsageError(message)

    def exit(self, status=0, message=None):  # pragma: no cover - only reached through error()
        raise UsageError(message or f"exit {status}")


def _size(text: str) -> int:
    """'64', '1K', '16M', '1G', '4KiB', '2MB' -> bytes (binary multiples, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes such as 1024, 64K, 16M or 1G; found {text!r}"
        )
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(m.group(1)) * mult


def parse_rate(text: str) -> float:
    """A link rate in tc syntax -> bytes per second. 'bit' units are bits per second and 'bps'
    units bytes per second (tc's convention, as run_cluster.sh --rate); a bare number is bits/s."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise UsageError(
            "--link-rate: expected a rate such as 4gbit, 800mbit or 1.25gbps (bytes/s); "
            f"found {text!r}"
        )
    mult = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    value = float(m.group(1)) * mult
    bytes_per_s = value if m.group(3) == "bps" else value / 8.0
    if not bytes_per_s > 0:
        raise UsageError(f"--link-rate: expected a positive rate; found {text!r}")
    return bytes_per_s


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m fourd.bench",
        description=(
            "Benchmark fourd's collectives on a 4D process grid, nccl-tests style: time, algbw, "
            "busbw and #wrong per size, out-of-place and in-place, next to MPI (mpi4py) and "
            "torch.distributed (gloo; with --baseline torch-fourd also on fourd's own backend) "
            "on the same ranks, with the physical bound per row. "
            "Run it under MPI: mpiexec -n 4 python -m mpi4py -m fourd.bench"
        ),
        add_help=False,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Sizes take K/M/G suffixes (binary). Lists are comma separated. Exit status: 0 when "
            "every check passed, 1 when a row had #wrong > 0, 2 for a bad command line.\n"
            "See docs/benchmark.md for the output columns and the JSON schema."
        ),
    )
    for add in (_add_sizes, _add_what, _add_grid, _add_output):
        add(p)
    return p


def _add_sizes(p) -> None:
    """Sizes and iterations (the nccl-tests names)."""
    g = p.add_argument_group("sizes and iterations (nccl-tests names)")
    _add_size_range(g)
    _add_iterations(g)


def _add_size_range(g) -> None:
    g.add_argument(
        "-b",
        "--minbytes",
        type=_size,
        default=DEFAULT_MINBYTES,
        metavar="SIZE",
        help="smallest message size in bytes (default 1K)",
    )
    g.add_argument(
        "-e",
        "--maxbytes",
        type=_size,
        default=DEFAULT_MAXBYTES,
        metavar="SIZE",
        help="largest message size in bytes (default 16M)",
    )
    g.add_argument(
        "-f",
        "--stepfactor",
        type=float,
        default=None,
        metavar="F",
        help="multiply the size by F from one row to the next (default 4)",
    )
    g.add_argument(
        "-i",
        "--stepbytes",
        type=_size,
        default=None,
        metavar="SIZE",
        help="add SIZE bytes from one row to the next instead of -f",
    )


def _add_iterations(g) -> None:
    g.add_argument(
        "-n",
        "--iters",
        type=int,
        default=None,
        metavar="N",
        help="timed iterations per row (default: adaptive, 3 to 1000, about 50 ms of "
        "timed work per row)",
    )
    g.add_argument(
        "--target-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="adaptive iterations: about this much timed work per cell and round "
        "(default 0.05, less for sweeps of over 400 cells); longer averages out "
        "more of a busy machine's noise",
    )
    g.add_argument(
        "-w",
        "--warmup_iters",
        "--warmup-iters",
        dest="warmup_iters",
        type=int,
        default=None,
        metavar="N",
        help=f"untimed warm-up iterations per row (default {DEFAULT_WARMUP}, as nccl-tests; "
        "the first row of a run gets 20 more). auto then waits, untimed, for its tuning "
        "to settle: up to 3840 calls by default, at most N when -w is given",
    )
    g.add_argument(
        "-R",
        "--rounds",
        type=int,
        default=1,
        metavar="R",
        help="measure every row R times, the cells of the row in an order rotated "
        "from round to round, and report each cell's median round (default 1); "
        "use 3 or more when comparing implementations within a row on a busy "
        "machine",
    )
    g.add_argument(
        "-c",
        "--check",
        type=int,
        default=1,
        metavar="N",
        help="checked iterations per row against a closed form; 0 = no check "
        "(#wrong shows N/A) (default 1)",
    )
    g.add_argument(
        "--timing",
        default="iteration",
        metavar="MODE",
        help="iteration (default): each iteration timed on every rank, time = mean of "
        "the per-iteration maximum across ranks (the strictest: any rank's jitter "
        "counts); batch: as nccl-tests, each rank times the whole batch of "
        "iterations back to back, time = the slowest rank's batch / iterations",
    )
    g.add_argument(
        "-g",
        "--ngpus",
        type=int,
        default=None,
        metavar="1",
        help="nccl-tests' devices per process: only 1, since fourd drives one device per "
        "rank (launch one rank per GPU)",
    )
    g.add_argument(
        "-T",
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="deadline of each fourd call (default: fourd's, FOURD_TIMEOUT_S or 300)",
    )


def _add_what(p) -> None:
    """What to measure; names are fourd's (fourd._C) and the collective table's."""
    g = p.add_argument_group("what to measure")
    g.add_argument(
        "-d",
        "--datatype",
        default="float",
        metavar="TYPES",
        help="float, double, half, bfloat16, int8, uint8, int32, int64 (or float32, "
        "float64, float16), a comma list, or all (default float)",
    )
    g.add_argument(
        "-o",
        "--op",
        default="sum",
        metavar="OPS",
        help=f"{', '.join(_C.OPS)}, a comma list, or all (default sum); "
        f"{' and '.join(n for n, c in TABLE.items() if not c.reduces)} have no op",
    )
    g.add_argument(
        "--collective",
        default=None,
        metavar="NAMES",
        help=f"{', '.join(TABLE)}, a comma list, or all (default: {','.join(DEFAULT_COLLECTIVES)})",
    )
    g.add_argument(
        "--axis",
        default=None,
        metavar="AXES",
        help=f"{', '.join(_C.AXES)}, world, a combination like z+data, a comma list, or all "
        "(every combination). Default: every axis with more than one rank, "
        "then world",
    )
    g.add_argument(
        "--algorithm",
        default=None,
        metavar="NAMES",
        help=f"{', '.join(_C.ALGORITHMS)}, a comma list, or all. "
        "Default: auto plus every algorithm fourd.explain reports as able to "
        "run the axis",
    )
    g.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help="cpu (numpy buffers, the full table) or cuda (torch CUDA tensors on "
        "cuda:local_rank, timed with CUDA events; needs a GPU build of fourd and "
        "torch with CUDA) (default cpu)",
    )
    g.add_argument(
        "--baseline",
        default=None,
        metavar="NAMES",
        help="mpi, torch (torch.distributed on gloo), torch-fourd (torch.distributed on "
        "fourd's backend, fourd.distributed), a comma list, all, or none (default: mpi and "
        "torch, each where installed)",
    )


def _add_grid(p) -> None:
    """The grid and its topology."""
    g = p.add_argument_group("grid and topology")
    g.add_argument(
        "--grid",
        default=None,
        metavar="SPEC",
        help="grid sizes such as x=2,y=2,z=1,data=1 (missing axes are 1, data "
        "defaults to the remaining ranks; the nodes stay the default grid's, the virtual "
        "ones on one host, unless --ranks-per-node). Default on one host: x=2,data=N/2 "
        "with --ranks-per-node 2 (virtual nodes); on several hosts: x = ranks "
        "per host, data = hosts",
    )
    g.add_argument(
        "--order",
        default="x-y-z-data",
        metavar="ORDER",
        help="rank order, innermost axis first (default x-y-z-data)",
    )
    g.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        metavar="K",
        help="treat every K consecutive ranks as one node (virtual topology)",
    )
    g.add_argument(
        "--link-rate",
        default=None,
        metavar="RATE",
        help="link rate of each node, tc syntax: 4gbit, 800mbit, 1.25gbps (bytes/s). "
        "Default: FOURD_CLUSTER_RATE_BPS (set by bench/cluster/run_cluster.sh)",
    )


def _add_output(p) -> None:
    """Output files and what is printed."""
    g = p.add_argument_group("output")
    g.add_argument("-J", "--json", default=None, metavar="FILE", help="write every row as JSON")
    g.add_argument("--csv", default=None, metavar="FILE", help="write every row as CSV")
    g.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="plot busbw against size per algorithm and baseline (needs matplotlib)",
    )
    g.add_argument(
        "--quiet",
        action="store_true",
        help="print only the summary: no header, tables, notes or progress bar",
    )
    g.add_argument(
        "--progress",
        action="store_true",
        help="show progress even when the output is not a terminal: a bar on stderr where "
        "that is a terminal, else a plain line every 10%% (default: a bar when the "
        "job's stdout is a terminal, none otherwise)",
    )
    g.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, even on a terminal",
    )
    g.add_argument("-h", "--help", action="store_true", help="show this help and exit")


@dataclass
class AxisSpec:
    name: str  # as shown: "x", "z+data", "world"
    mask: int  # fourd's axis bit mask over the non-trivial axes
    group_size: int


@dataclass
class Config:
    """A validated command line, resolved against the world size and the hosts."""

    argv: list
    sizes: list
    iters: int | None
    warmup: int
    rounds: int
    target_time: float | None
    check: int
    timeout: float | None
    dtypes: list
    ops: list
    collectives: list
    axes: list  # of AxisSpec
    axes_requested: bool
    algorithms: list  # "auto" first, then explicit algorithms; None entries never
    algorithms_requested: bool
    baselines: list
    baselines_requested: bool
    grid: dict  # x, y, z, data
    order: str
    ranks_per_node: int | None
    grid_source: str
    link_rate: float | None  # bytes/s
    link_rate_source: str
    json: str | None
    csv: str | None
    plot: str | None
    quiet: bool
    progress: bool  # --progress: shown even when the output is not a terminal
    notes: list = field(default_factory=list)
    no_progress: bool = False
    warmup_requested: bool = False  # -w given: it also bounds auto's wait for its tuning
    device: str = "cpu"
    timing: str = "iteration"
    raw: dict = field(default_factory=dict)


def _sizes(args) -> list[int]:
    lo, hi = args.minbytes, args.maxbytes
    if lo < 1:
        raise UsageError(f"-b/--minbytes: expected at least 1 byte; found {lo}")
    if hi < lo:
        raise UsageError(f"-e/--maxbytes: expected at least -b/--minbytes ({lo}); found {hi}")
    if args.stepbytes is not None and args.stepfactor is not None:
        raise UsageError("-f/--stepfactor and -i/--stepbytes: expected one of them, found both")
    out = (
        _added_sizes(lo, hi, args.stepbytes)
        if args.stepbytes is not None
        else _multiplied_sizes(lo, hi, args.stepfactor)
    )
    if len(out) > MAX_SIZES:
        raise UsageError(
            f"-b/-e/-f/-i: expected at most {MAX_SIZES} sizes; found more (from {lo} to {hi}); "
            f"use a larger step"
        )
    return out


def _added_sizes(lo: int, hi: int, step: int) -> list[int]:
    """lo, lo + step, ... up to hi (-i); one more than MAX_SIZES at most."""
    if step < 1:
        raise UsageError(f"-i/--stepbytes: expected at least 1 byte; found {step}")
    out, s = [], lo
    while s <= hi and len(out) <= MAX_SIZES:
        out.append(s)
        s += step
    return out


def _multiplied_sizes(lo: int, hi: int, factor: float | None) -> list[int]:
    """lo, lo x F, ... up to hi, rounded, without repeats (-f); one more than MAX_SIZES at most."""
    f = DEFAULT_STEPFACTOR if factor is None else factor
    if not (f > 1.0) or math.isinf(f):
        raise UsageError(f"-f/--stepfactor: expected a factor greater than 1; found {f:g}")
    out, s = [], float(lo)
    while round(s) <= hi and len(out) <= MAX_SIZES:
        if not out or round(s) != out[-1]:
            out.append(round(s))
        s *= f
    return out


def _vocabulary(parse, names, aliases=None):
    """A CLI item -> its name in `names` through one of fourd's parsers (fourd._C.parse_*:
    fourd's own aliases included) and the bench's own `aliases`; None when neither knows it."""

    def canonical(item: str) -> str | None:
        key = item.lower()
        if aliases and key in aliases:
            return aliases[key]
        try:
            return names[parse(key, "")]
        except (InvalidArgumentError, IndexError):
            return None

    return canonical


def _choose(text: str | None, option: str, names, canonical, all_value=None) -> list[str] | None:
    """A comma list of names (or 'all') -> the names, each once, in the order given."""
    if text is None:
        return None
    items = _split(text)
    if not items:
        raise UsageError(f"{option}: expected a name or a comma list; found {text!r}")
    if any(i.lower() == "all" for i in items):
        if len(items) > 1:
            raise UsageError(f"{option}: 'all' cannot be combined with other names; found {text!r}")
        return list(all_value if all_value is not None else names)
    out = []
    for i in items:
        v = canonical(i)
        if v is None or v not in names:
            raise UsageError(f"{option}: expected one of {', '.join(names)}, all; found {i!r}")
        if v not in out:
            out.append(v)
    return out


_DTYPE = _vocabulary(_C.parse_dtype, _C.DTYPES)
_OP = _vocabulary(_C.parse_op, _C.OPS)
_COLLECTIVE = _vocabulary(_C.parse_collective, _C.COLLECTIVES)
_ALGORITHM = _vocabulary(_C.parse_algorithm, _C.ALGORITHMS)


def _baseline(item: str) -> str | None:
    key = item.lower()
    return key if key in BASELINES + ("none",) else None


def parse_grid(text: str, world: int) -> dict:
    sizes = _grid_pairs(text)
    x, y, z = sizes.get("x", 1), sizes.get("y", 1), sizes.get("z", 1)
    if "data" not in sizes:
        if world % (x * y * z):
            raise UsageError(
                f"--grid: x*y*z = {x * y * z} must divide the {world} ranks; found {text!r}"
            )
        sizes["data"] = world // (x * y * z)
    total = x * y * z * sizes["data"]
    if total != world:
        raise UsageError(
            f"--grid: x*y*z*data must equal the number of ranks ({world}); found {total} from "
            f"{text!r}"
        )
    return {"x": x, "y": y, "z": z, "data": sizes["data"]}


def _grid_pairs(text: str) -> dict:
    """'x=2,data=3' -> {"x": 2, "data": 3}: fourd's axis names, each once, sizes >= 1."""
    sizes: dict = {}
    for item in _split(text):
        k, sep, v = item.partition("=")
        k = k.strip()
        if not sep or k not in _C.AXES:
            raise UsageError(
                f"--grid: expected axis=size pairs such as x=2,y=2,z=1,data=1; found {item!r}"
            )
        if k in sizes:
            raise UsageError(f"--grid: axis {k!r} given twice in {text!r}")
        try:
            n = int(v)
        except ValueError:
            n = 0
        if n < 1:
            raise UsageError(f"--grid: expected a size >= 1 for {k}; found {v.strip()!r}")
        sizes[k] = n
    if not sizes:
        raise UsageError(f"--grid: expected axis=size pairs such as x=2,data=2; found {text!r}")
    return sizes


def parse_order(text: str) -> str:
    """The grid's own parsing (fourd._C.parse_order); the bench also takes ',' between axes."""
    joined = "-".join(p.strip() for p in re.split(r"[-,]", text) if p.strip())
    try:
        return _C.parse_order(joined)
    except InvalidArgumentError:
        raise UsageError(
            f"--order: expected the four axes x, y, z, data in some order, such as x-y-z-data; "
            f"found {text!r}"
        ) from None


def default_grid(world: int, hosts: list[str]) -> tuple[dict, int | None, str]:
    """The grid of a run without --grid: on several hosts x = ranks per host and data = hosts
    (so x is intra-node and data inter-node); on one host the same shape over virtual nodes of 2
    ranks; on 2 ranks data=2 on the one real node (two one-rank virtual nodes would have no
    level to make hierarchical, and would only keep the node's shared memory from the
    collectives that use it)."""
    distinct = list(dict.fromkeys(hosts))
    if len(distinct) > 1:
        per = [hosts.count(h) for h in distinct]
        contiguous = (
            all(hosts[i] == distinct[i // per[0]] for i in range(world))
            if len(set(per)) == 1
            else False
        )
        if contiguous:
            k = per[0]
            return (
                {"x": k, "y": 1, "z": 1, "data": world // k},
                None,
                f"{len(distinct)} hosts x {k} ranks: x within a host, data across hosts",
            )
        return (
            {"x": 1, "y": 1, "z": 1, "data": world},
            None,
            f"{len(distinct)} hosts with uneven or interleaved ranks: one data axis",
        )
    if world >= 4 and world % 2 == 0:
        return (
            {"x": 2, "y": 1, "z": 1, "data": world // 2},
            2,
            "one host: x=2 within a virtual node of 2 ranks, data across virtual nodes",
        )
    if world == 2:
        return ({"x": 1, "y": 1, "z": 1, "data": 2}, None, "one host: data=2 within the node")
    return ({"x": 1, "y": 1, "z": 1, "data": world}, None, "one host: one data axis")


def parse_axis_name(name: str) -> int:
    """An --axis item -> its mask, by the grid's own parsing (fourd._C.parse_axis)."""
    try:
        return _C.parse_axis(name, "--axis")
    except InvalidArgumentError:
        raise UsageError(
            f"--axis: expected x, y, z, data, world, a combination such as z+data, or all; "
            f"found {name!r}"
        ) from None


def axis_label(mask: int, nontrivial: int) -> str:
    """An axis as the tables name it: 'world' for the group of every axis with more than one
    rank (when that is more than one axis), fourd's name of the mask otherwise."""
    if mask == nontrivial and nontrivial.bit_count() > 1:
        return "world"
    return _C.mask_name(mask)


def _axis_masks(text: str | None, sizes: dict, nontrivial: int, notes: list) -> list[int]:
    """The masks --axis asks for (with repeats), restricted to the axes of more than one rank."""
    single = [_C.parse_axis(a) for a in _C.AXES if sizes[a] > 1]
    if text is None:
        return single + ([nontrivial] if nontrivial.bit_count() > 1 else [])
    items = _split(text)
    if not items:
        raise UsageError(f"--axis: expected an axis name or a comma list; found {text!r}")
    if any(i == "all" for i in items):
        if len(items) > 1:
            raise UsageError(f"--axis: 'all' cannot be combined with other names; found {text!r}")
        return [
            sum(c) for r in range(1, len(single) + 1) for c in itertools.combinations(single, r)
        ]
    masks = []
    for i in items:
        m = parse_axis_name(i) & nontrivial
        if m == 0:
            notes.append(f"axis {i}: a group of 1 rank on this grid, nothing to measure (skipped)")
            continue
        masks.append(m)
    return masks


def resolve_axes(
    text: str | None, sizes: dict, notes: list, order: str = "x-y-z-data"
) -> list[AxisSpec]:
    """--axis against the grid `sizes` (axis -> size): one AxisSpec per distinct group, with its
    size from the grid's own arithmetic (fourd._C.ProcessGrid)."""
    grid = _C.ProcessGrid(sizes=[sizes[a] for a in _C.AXES], order=order)
    nontrivial = 0
    for a in _C.AXES:
        if sizes[a] > 1:
            nontrivial |= _C.parse_axis(a)
    out, seen = [], set()
    for m in _axis_masks(text, sizes, nontrivial, notes):
        if m not in seen:
            seen.add(m)
            out.append(AxisSpec(axis_label(m, nontrivial), m, grid.group_size(m)))
    if not out:
        raise UsageError(
            "--axis: nothing to measure: every requested axis is a group of 1 rank on this grid "
            f"({', '.join(f'{a}={sizes[a]}' for a in _C.AXES)})"
        )
    return out


def parse(
    argv: list[str], world: int, hosts: list[str] | None = None, environ: dict | None = None
) -> Config:
    """Parses and validates argv for a world of `world` ranks on `hosts` (one per rank).
    Raises UsageError (bad arguments) or HelpRequested (-h). No MPI, no I/O beyond checking
    that output folders exist."""
    environ = os.environ if environ is None else environ
    hosts = hosts or ["localhost"] * world
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.help:
        raise HelpRequested(parser.format_help())
    if world < 2:
        raise UsageError(_launch_hint(argv))
    notes: list[str] = []
    sizes = _sizes(args)
    _check_numbers(args)
    _check_devices(args, notes)
    names = _names(args)
    grid, order, rpn, source = _grid(args, world, hosts)
    axes = resolve_axes(args.axis, grid, notes, order)
    link_rate, link_src = _link_rate(args, environ, notes)
    _check_outputs(args)
    device = _one_of(args.device, "--device", ("cpu", "cuda"), "expected cpu or cuda")
    timing = _one_of(args.timing, "--timing", ("iteration", "batch"), "expected iteration or batch")
    return Config(
        timing=timing,
        device=device,
        argv=list(argv),
        sizes=sizes,
        iters=args.iters,
        warmup=DEFAULT_WARMUP if args.warmup_iters is None else args.warmup_iters,
        warmup_requested=args.warmup_iters is not None,
        rounds=args.rounds,
        target_time=args.target_time,
        check=args.check,
        timeout=args.timeout,
        **names,
        axes=axes,
        axes_requested=args.axis is not None,
        algorithms_requested=args.algorithm is not None,
        baselines_requested=args.baseline is not None,
        grid=grid,
        order=order,
        ranks_per_node=rpn,
        grid_source=source,
        link_rate=link_rate,
        link_rate_source=link_src,
        json=args.json,
        csv=args.csv,
        plot=args.plot,
        quiet=args.quiet,
        progress=args.progress,
        no_progress=args.no_progress,
        notes=notes,
        raw={k: v for k, v in vars(args).items() if k != "help"},
    )


def _check_numbers(args) -> None:
    """The counts and durations: each in its range, and -n not with --target-time."""
    if args.iters is not None and args.iters < 1:
        raise UsageError(f"-n/--iters: expected at least 1 timed iteration; found {args.iters}")
    if args.warmup_iters is not None and args.warmup_iters < 0:
        raise UsageError(f"-w/--warmup_iters: expected 0 or more; found {args.warmup_iters}")
    if args.rounds < 1:
        raise UsageError(f"-R/--rounds: expected at least 1 round; found {args.rounds}")
    if args.target_time is not None and not args.target_time > 0:
        raise UsageError(
            f"--target-time: expected a positive number of seconds; found {args.target_time:g}"
        )
    if args.iters is not None and args.target_time is not None:
        raise UsageError(
            "-n/--iters and --target-time: give one (fixed iterations, or adaptive "
            "ones with a target time)"
        )
    if args.check < 0:
        raise UsageError(
            f"-c/--check: expected 0 (off) or a number of checked iterations; found {args.check}"
        )
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(
            f"-T/--timeout: expected a positive number of seconds; found {args.timeout:g}"
        )


def _launch_hint(argv: list[str]) -> str:
    """The error of a run on one rank (started without mpiexec): how to launch it."""
    rest = "".join(f" {a}" for a in argv)
    return (
        "one rank: a collective needs a group of 2 or more, so there is nothing to measure. "
        "Start it under MPI, one rank per core or GPU, for example:\n"
        f"    mpiexec -n 4 python -m mpi4py -m fourd.bench{rest}"
    )


def _check_devices(args, notes: list) -> None:
    """-g/--ngpus (nccl-tests' devices per process): fourd drives one device per rank."""
    if args.ngpus is None:
        return
    if args.ngpus != 1:
        raise UsageError(
            f"-g/--ngpus: fourd drives one device per rank, so only -g 1 is accepted; found "
            f"-g {args.ngpus}. Launch one rank per GPU instead (mpiexec -n <number of GPUs>)"
        )
    notes.append("-g 1: fourd drives one device per rank, as nccl-tests does with -g 1")


def _names(args) -> dict:
    """dtypes, ops, collectives, algorithms ("auto" first by default) and baselines, checked in
    that order."""
    names = {
        "dtypes": _choose(args.datatype, "-d/--datatype", _C.DTYPES, _DTYPE),
        "ops": _choose(args.op, "-o/--op", _C.OPS, _OP),
        "collectives": (
            _choose(args.collective, "--collective", tuple(TABLE), _COLLECTIVE)
            or list(DEFAULT_COLLECTIVES)
        ),
        # By default every algorithm, each kept only where fourd.explain says it can run.
        "algorithms": (
            _choose(args.algorithm, "--algorithm", _C.ALGORITHMS, _ALGORITHM) or list(_C.ALGORITHMS)
        ),
    }
    names["baselines"] = _baselines(args.baseline)
    return names


def _baselines(text: str | None) -> list[str]:
    if text is not None and text.strip().lower() == "none":
        return []
    baselines = _choose(
        text, "--baseline", BASELINES + ("none",), _baseline, all_value=BASELINES
    ) or list(DEFAULT_BASELINES)
    if "none" in baselines:
        raise UsageError(f"--baseline: 'none' cannot be combined with other names; found {text!r}")
    return baselines


def _grid(args, world: int, hosts: list[str]) -> tuple[dict, str, int | None, str]:
    """(grid sizes, order, ranks per node, where the grid came from)."""
    if args.ranks_per_node is not None and not 1 <= args.ranks_per_node <= world:
        raise UsageError(
            f"--ranks-per-node: expected an integer from 1 to the number of ranks ({world}); "
            f"found {args.ranks_per_node}"
        )
    order = parse_order(args.order)
    if args.grid is not None:
        return (parse_grid(args.grid, world), order, *_grid_nodes(args, world, hosts))
    grid, rpn, source = default_grid(world, hosts)
    if args.ranks_per_node is not None:
        rpn = args.ranks_per_node
        source += f" (--ranks-per-node {rpn})"
    return grid, order, rpn, source


def _grid_nodes(args, world: int, hosts: list[str]) -> tuple[int | None, str]:
    """(ranks per node, where the grid came from) of a --grid: the nodes are those of the host
    list, as without --grid (one host: the same virtual nodes as the default grid), unless
    --ranks-per-node says otherwise."""
    if args.ranks_per_node is not None:
        return args.ranks_per_node, f"--grid, --ranks-per-node {args.ranks_per_node}"
    rpn = default_grid(world, hosts)[1]
    if rpn is None:
        return None, "--grid"
    return rpn, (
        f"--grid; virtual nodes of {plural(rpn, 'rank')} as without --grid "
        "(--ranks-per-node changes them)"
    )


def _link_rate(args, environ, notes: list) -> tuple[float | None, str]:
    """(link rate in bytes/s or None, where it came from): --link-rate, else
    FOURD_CLUSTER_RATE_BPS (bits/s, set by the cluster harness)."""
    if args.link_rate is not None:
        return parse_rate(args.link_rate), f"--link-rate {args.link_rate}"
    env = environ.get("FOURD_CLUSTER_RATE_BPS", "").strip()
    if not env:
        return None, "none"
    try:
        bps = float(env)
    except ValueError:
        bps = 0.0
    if bps > 0:
        return bps / 8.0, f"FOURD_CLUSTER_RATE_BPS={env}"
    notes.append(f"FOURD_CLUSTER_RATE_BPS={env!r} is not a rate in bits/s: ignored")
    return None, "none"


def _check_outputs(args) -> None:
    for opt, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot)):
        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise UsageError(f"{opt}: the folder {folder!r} of {path!r} does not exist")
    if args.plot is not None and not args.plot.lower().endswith((".png", ".svg", ".pdf")):
        raise UsageError(
            f"--plot: expected a file name ending in .png, .svg or .pdf; found {args.plot!r}"
        )


def _one_of(value, option: str, choices: tuple, expected: str) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise UsageError(f"{option}: {expected}; found {value!r}")
    return v
