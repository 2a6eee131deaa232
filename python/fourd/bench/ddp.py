"""``python -m fourd.bench.ddp`` (also ``bench/ddp_step.py``): a DistributedDataParallel training
step on torch.distributed's backend "fourd" against the same step on "gloo", in one run.

    mpiexec -n 4 python -m mpi4py -m fourd.bench.ddp --json ddp.json
    mpiexec -n 4 python -m mpi4py bench/ddp_step.py --json ddp.json
    bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node 2 --rate 4gbit -- \\
        python -m mpi4py bench/ddp_step.py --json ddp.json

One model (a stack of Linear layers with ReLU between them, float32, 33.6 M parameters by
default: communication matters) is built twice from one seed and wrapped in DDP twice, on the
default group (backend fourd) and on a gloo group of the same ranks (DDP's defaults otherwise:
bucket_cap_mb 25). Both train on the same batches: rank r's batch of step i comes from a seed of
(seed, i, r). The timed steps come in blocks that alternate between the backends, so a drift of
the machine falls on both alike. A step is timed on every rank around zero_grad, forward,
backward (DDP all-reduces the gradients' buckets during it and waits for them before it returns)
and the optimizer's step; its time is the slowest rank's, as in python -m fourd.bench. A third
copy without DDP ("compute") times the same step with no communication, so the difference is
what the gradients' all-reduce costs.

After the last step the parameters of the two DDP models are compared: the same start, data
and arithmetic, with the gradients summed in a different order by each backend, so they agree
within float tolerance. The exit status says so: 0 when they agree, 1 when not, 2 for a bad
command line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .cli import _finish
from .report import plural

PROG = "python -m fourd.bench.ddp"
SCHEMA = "fourd.bench.ddp"
SCHEMA_VERSION = 2  # 2: fourd_tuning, the settling steps
BACKENDS = ("fourd", "gloo")  # the DDP models compared, in the first block's order
COMPUTE = "compute"  # the model alone, no DDP: no communication


class UsageError(Exception):
    """A bad command line: the message names the option, what was expected and what was found."""


class _Parser(argparse.ArgumentParser):
    # argparse would print and exit on every rank; raise instead, the driver decides.
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description=(
            "A DDP training step on torch.distributed's backend fourd against the same step "
            "on gloo, in one run: the same model, batch and seed, timed steps in blocks "
            "alternating between the backends, the median and spread of each, their ratio, "
            "and the parameters of the two compared after the last step. Run it under MPI: "
            "mpiexec -n 4 python -m mpi4py -m fourd.bench.ddp"
        ),
        allow_abbrev=False,
    )
    m = p.add_argument_group("model and data")
    m.add_argument("--layers", type=int, default=8, help="Linear layers (default 8)")
    m.add_argument("--width", type=int, default=2048, help="features of each layer (default 2048)")
    m.add_argument("--batch", type=int, default=16, help="samples per rank and step (default 16)")
    m.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    m.add_argument("--seed", type=int, default=0, help="seed of the weights and data (default 0)")
    m.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=None,
        help="DDP's bucket_cap_mb (default: DDP's own, 25)",
    )
    s = p.add_argument_group("steps")
    s.add_argument("--warmup", type=int, default=3, help="untimed steps per model (default 3)")
    s.add_argument(
        "--settle",
        type=int,
        default=150,
        metavar="N",
        help="after the warm-up, more untimed steps (of both DDP models, so that they stay "
        "in step) until fourd's tuning of every gradient bucket's size has settled, at most "
        "N (default 150; 0: none). The timed steps are then a later step of training, as "
        "the collective benchmark times auto",
    )
    s.add_argument(
        "--steps", type=int, default=10, help="timed steps per model and block (default 10)"
    )
    s.add_argument("--blocks", type=int, default=5, help="blocks of timed steps (default 5)")
    s.add_argument(
        "--no-compute",
        action="store_true",
        help="leave out the model without DDP (the step's compute alone)",
    )
    s.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per rank (default: the host's cores over its ranks, at least 1)",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="deadline of every collective, in seconds (default 600)",
    )
    c = p.add_argument_group("the comparison and the output")
    c.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    c.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance (default 1e-6)")
    c.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    return p


@dataclass
class Config:
    """A validated command line."""

    argv: list
    layers: int
    width: int
    batch: int
    lr: float
    seed: int
    bucket_cap_mb: float | None
    warmup: int
    settle: int
    steps: int
    blocks: int
    compute: bool
    threads: int | None
    timeout: float
    rtol: float
    atol: float
    json: str | None

    @property
    def timed_steps(self) -> int:
        """Timed steps of each model: its share of every block."""
        return self.blocks * self.steps


def parse(argv: list[str]) -> Config:
    """Parses and checks argv (no MPI): UsageError names what is wrong."""
    a = build_parser().parse_args(argv)
    for name in ("layers", "width", "batch", "steps", "blocks"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name}: expected at least 1; found {getattr(a, name)}")
    for name in ("warmup", "settle"):
        if getattr(a, name) < 0:
            raise UsageError(f"--{name}: expected 0 or more steps; found {getattr(a, name)}")
    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads: expected at least 1; found {a.threads}")
    for name in ("lr", "timeout"):
        if not getattr(a, name) > 0:
            raise UsageError(f"--{name}: expected a positive number; found {getattr(a, name):g}")
    if a.bucket_cap_mb is not None and not a.bucket_cap_mb > 0:
        raise UsageError(f"--bucket-cap-mb: expected a positive size; found {a.bucket_cap_mb:g}")
    if not (a.rtol >= 0 and a.atol >= 0):
        raise UsageError(f"--rtol/--atol: expected 0 or more; found {a.rtol:g} and {a.atol:g}")
    if a.json is not None and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        raise UsageError(f"--json: the folder of {a.json!r} does not exist")
    return Config(
        argv=list(argv),
        layers=a.layers,
        width=a.width,
        batch=a.batch,
        lr=a.lr,
        seed=a.seed,
        bucket_cap_mb=a.bucket_cap_mb,
        warmup=a.warmup,
        settle=a.settle,
        steps=a.steps,
        blocks=a.blocks,
        compute=not a.no_compute,
        threads=a.threads,
        timeout=a.timeout,
        rtol=a.rtol,
        atol=a.atol,
        json=a.json,
    )


# ---- the model, the data, one step ----------------------------------------------------------


def make_model(torch, cfg: Config):
    """layers x Linear(width, width), ReLU between them, from cfg.seed: the same weights on
    every rank and for every copy."""
    torch.manual_seed(cfg.seed)
    layers = []
    for i in range(cfg.layers):
        layers.append(torch.nn.Linear(cfg.width, cfg.width))
        if i < cfg.layers - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def batch(torch, cfg: Config, step: int, rank: int):
    """Rank `rank`'s (input, target) of step `step`: the same for every model."""
    g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 65_537 + rank)
    x = torch.randn(cfg.batch, cfg.width, generator=g)
    return x, torch.randn(cfg.batch, cfg.width, generator=g)


@dataclass
class Trainee:
    """One copy of the model with its optimizer, the steps it took and their times."""

    name: str
    model: object  # DDP, or the bare module (compute)
    optimizer: object
    step: int = 0
    times: list = field(default_factory=list)  # this rank's seconds per timed step
    loss: float = float("nan")  # of its last step

    def train(self, torch, cfg: Config, rank: int, steps: int, timed: bool) -> None:
        """`steps` steps on the next batches; each timed on this rank when `timed`."""
        mse = torch.nn.functional.mse_loss
        loss = None
        for _ in range(steps):
            x, y = batch(torch, cfg, self.step, rank)
            t0 = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            loss = mse(self.model(x), y)
            loss.backward()  # DDP: returns once every bucket's all-reduce is done
            self.optimizer.step()
            t = time.perf_counter() - t0
            if timed:
                self.times.append(t)
            self.step += 1
        if loss is not None:
            self.loss = float(loss.detach())

    @property
    def module(self):
        return getattr(self.model, "module", self.model)


def trainees(torch, dist, cfg: Config) -> list[Trainee]:
    """The DDP copies (backend fourd on the default group, gloo on a group of every rank) and
    the bare one. Collective over the world: DDP broadcasts rank 0's weights at construction
    (the same weights here, from one seed) and new_group is called by every rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    extra = {} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}
    out = []
    for name, group in (("fourd", None), ("gloo", gloo)):
        model = DDP(make_model(torch, cfg), process_group=group, **extra)
        out.append(Trainee(name, model, torch.optim.SGD(model.parameters(), lr=cfg.lr)))
    if cfg.compute:
        model = make_model(torch, cfg)
        out.append(Trainee(COMPUTE, model, torch.optim.SGD(model.parameters(), lr=cfg.lr)))
    return out


# Tuning states in which auto runs one algorithm for good. "compressed": a codec is in use
# (FOURD_COMPRESSION or init's policy), and such calls run the codec's algorithm, untuned.
# "provisional" (a switch the exploration made) is not: its re-check comes about 10 s of steps
# later (a bucket's size is called once per step) and runs a whole exploration inside one
# step, which must not fall on a timed one.
SETTLED = ("settled", "single", "off", "compressed")


def bucket_sizes(ddp) -> list[int]:
    """The bytes of each of DDP's gradient buckets: once DDP has rebuilt them (after its first
    steps, in the order the gradients became ready), those; before that, the initial ones."""
    data = ddp._get_ddp_logging_data()
    text = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(v) for v in str(text).replace(",", " ").split()]


def tuning_of(dist, ddp) -> dict[int, dict]:
    """What fourd's tuning knows of the in-place float32 all_reduce of each bucket size on
    DDP's group (fourd.explain(...)["tuning"]); {} when the group is not fourd's."""
    import fourd

    axis = getattr(getattr(dist.group, "WORLD", None), "fourd_axis", None)
    if axis is None:
        return {}
    return {
        n: fourd.explain("all_reduce", n, axis, in_place=True)["tuning"]
        for n in sorted(set(bucket_sizes(ddp)))
    }


def tuning_states(dist, ddp) -> dict[int, str]:
    """The tuning state of each bucket size (tuning_of)."""
    return {n: t["state"] for n, t in tuning_of(dist, ddp).items()}


def settle(torch, dist, world, cfg: Config, by: dict) -> dict:
    """Untimed steps of both DDP models, in turn, until fourd's tuning of every bucket size
    has settled (checked on every rank, agreed with a MIN), at most cfg.settle: what a run
    sees after its first steps. The gloo model takes the same steps, so that the two still
    train on the same batches and their parameters can be compared at the end."""
    from mpi4py import MPI

    rank, steps = world.Get_rank(), 0
    states = tuning_states(dist, by["fourd"].model)
    while steps < cfg.settle:
        done = all(s in SETTLED for s in states.values()) and by["fourd"].step > 1
        if world.allreduce(int(done), op=MPI.MIN):
            break
        for name in ("fourd", "gloo"):
            by[name].train(torch, cfg, rank, 1, timed=False)
        steps += 1
        states = tuning_states(dist, by["fourd"].model)
    return {
        "max_steps": cfg.settle,
        "steps": steps,
        "settled": all(s in SETTLED for s in states.values()),
        "states": {str(n): s for n, s in states.items()},
        # candidates, measured_s, call_period_s, recheck_gap, ... of each bucket size
        "tuning": {str(n): t for n, t in tuning_of(dist, by["fourd"].model).items()},
    }


def run_steps(torch, dist, world, cfg: Config, models: list[Trainee]) -> dict:
    """Every model's warm-up, the settling steps, then the blocks: each model's timed steps
    in turn, the order reversed from one block to the next; a barrier before each model's
    turn, so that every rank starts it together. Returns what settle() found."""
    rank = world.Get_rank()
    for m in models:
        world.Barrier()
        m.train(torch, cfg, rank, cfg.warmup, timed=False)
    world.Barrier()
    tuning = settle(torch, dist, world, cfg, {m.name: m for m in models})
    for b in range(cfg.blocks):
        for m in models if b % 2 == 0 else models[::-1]:
            world.Barrier()
            m.train(torch, cfg, rank, cfg.steps, timed=True)
    return tuning


# ---- what the run found ---------------------------------------------------------------------


def step_stats(seconds: np.ndarray) -> dict:
    """Milliseconds of the per-step maxima across ranks: median and spread."""
    ms = seconds * 1e3
    return {
        "steps": int(ms.size),
        "median_ms": float(np.median(ms)),
        "min_ms": float(ms.min()),
        "p25_ms": float(np.percentile(ms, 25)),
        "p75_ms": float(np.percentile(ms, 75)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "step_ms": [round(float(x), 3) for x in ms],
    }


def gathered_stats(world, models: list[Trainee]) -> dict:
    """name -> step_stats of the slowest rank's time of every timed step. Collective."""
    out = {}
    for m in models:
        mine = np.array(m.times, np.float64)
        every = np.empty((world.Get_size(), mine.size))
        world.Allgather(mine, every)
        out[m.name] = step_stats(every.max(axis=0))
    return out


def compare_parameters(torch, world, a, b, rtol: float, atol: float) -> dict:
    """The two modules' parameters against each other on every rank: the largest absolute and
    relative difference over all ranks, and whether every element is within atol + rtol |b|
    (and finite). Collective."""
    worst = np.zeros(3)  # max |a - b|, max |a - b| / max(|a|, |b|), 1 where out of tolerance
    for p, q in zip(a.parameters(), b.parameters()):
        p, q = p.detach(), q.detach()
        d = (p - q).abs()
        scale = torch.maximum(p.abs(), q.abs()).clamp_min(torch.finfo(p.dtype).tiny)
        worst[0] = max(worst[0], float(d.max()))
        worst[1] = max(worst[1], float((d / scale).max()))
        bad = not bool(torch.isfinite(p).all() and (d <= atol + rtol * q.abs()).all())
        worst[2] = max(worst[2], float(bad))
    from mpi4py import MPI

    world.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    return {
        "max_abs_diff": float(worst[0]),
        "max_rel_diff": float(worst[1]),
        "rtol": rtol,
        "atol": atol,
        "agree": bool(worst[2] == 0),
    }


def communication_ms(stats: dict) -> dict:
    """What each backend's median step spends beyond compute's: the gradients' all-reduce
    (and DDP's bookkeeping); empty without the compute model."""
    if COMPUTE not in stats:
        return {}
    base = stats[COMPUTE]["median_ms"]
    return {b: stats[b]["median_ms"] - base for b in BACKENDS}


# ---- the run --------------------------------------------------------------------------------


def default_threads(world) -> int:
    """The cores of this host over the ranks on it, at least 1. Collective."""
    hosts = world.allgather(socket.gethostname())
    return max(1, (os.cpu_count() or 1) // hosts.count(socket.gethostname()))


def _model_doc(cfg: Config, module) -> dict:
    params = sum(p.numel() for p in module.parameters())
    return {
        "layers": cfg.layers,
        "width": cfg.width,
        "description": f"{cfg.layers} x Linear({cfg.width}, {cfg.width}), ReLU between",
        "parameters": params,
        "bytes": params * 4,
        "dtype": "float32",
        "batch_per_rank": cfg.batch,
        "optimizer": f"SGD lr={cfg.lr:g}",
        "bucket_cap_mb": cfg.bucket_cap_mb if cfg.bucket_cap_mb is not None else 25,
        "bucket_cap_mb_source": (
            "--bucket-cap-mb" if cfg.bucket_cap_mb is not None else "DDP's default"
        ),
    }


def _environment(torch, world, threads: int) -> dict:
    import fourd

    cluster = {
        k[len("FOURD_CLUSTER_") :].lower(): v
        for k, v in sorted(os.environ.items())
        if k.startswith("FOURD_CLUSTER_")
    }
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fourd": fourd.build_info(),
        "platform": platform.platform(),
        "hosts": world.allgather(socket.gethostname()),
        "cpu_count": os.cpu_count(),
        "threads_per_rank": threads,
        "cluster": cluster or None,  # run_cluster.sh's FOURD_CLUSTER_* (nodes, rate, ...)
    }


def _fourd_choice(dist, cfg: Config) -> dict | None:
    """What fourd's auto runs for a gradient bucket on the default group (fourd.explain)."""
    import fourd

    pg = getattr(dist.group, "WORLD", None)
    axis = getattr(pg, "fourd_axis", None)
    if axis is None:
        return None
    nbytes = int((cfg.bucket_cap_mb or 25) * (1 << 20))
    ex = fourd.explain("all_reduce", nbytes, axis)
    return {"bucket_bytes": nbytes, "choice": ex["choice"], "topology": ex["topology"]}


def run(cfg: Config, world) -> dict:
    """The whole measurement (collective over the world): the results document."""
    import torch
    import torch.distributed as dist

    import fourd.distributed  # noqa: F401 - registers the backend "fourd"

    threads = cfg.threads or default_threads(world)
    torch.set_num_threads(threads)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    dist.init_process_group("fourd", timeout=datetime.timedelta(seconds=cfg.timeout))
    try:
        models = trainees(torch, dist, cfg)
        tuning = run_steps(torch, dist, world, cfg, models)
        stats = gathered_stats(world, models)
        by = {m.name: m for m in models}
        params = compare_parameters(
            torch, world, by["fourd"].module, by["gloo"].module, cfg.rtol, cfg.atol
        )
        doc = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "start_time": started,
            "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
            "world_size": world.Get_size(),
            "args": {k: v for k, v in vars(cfg).items() if k != "argv"},
            "environment": _environment(torch, world, threads),
            "model": _model_doc(cfg, by["fourd"].module),
            "steps_per_model": by["fourd"].step,
            "fourd_tuning": tuning,
            "timing": "per step: the slowest rank's time of zero_grad + forward + backward "
            "(DDP's all-reduce of the gradients' buckets, waited for) + SGD step; timed steps "
            "in blocks alternating between the models, a barrier before each model's turn",
            "fourd_auto": _fourd_choice(dist, cfg),
            "backends": stats,
            "ratio_gloo_over_fourd": stats["gloo"]["median_ms"] / stats["fourd"]["median_ms"],
            "communication_ms": communication_ms(stats),
            "final_loss": {m.name: m.loss for m in models},
            "parameters": {"compared_after_steps": by["fourd"].step, **params},
        }
    finally:
        dist.destroy_process_group()
    doc["duration_s"] = round(time.perf_counter() - t0, 3)
    doc["ok"] = doc["parameters"]["agree"]
    return doc


def _settled_text(t: dict) -> str:
    sizes = ", ".join(f"{int(n) / 2**20:.1f} MiB {s}" for n, s in t["states"].items())
    if t["settled"]:
        return f"{t['steps']} more (DDP models) until fourd's tuning settled ({sizes})"
    return f"{t['steps']} more (DDP models), fourd's tuning NOT settled ({sizes})"


def report(doc: dict) -> str:
    """The printed summary of a results document."""
    m, st = doc["model"], doc["backends"]
    env = doc["environment"]
    lines = [
        f"# {PROG}: torch {env['torch']}, fourd {env['fourd']['version']}, "
        f"{doc['world_size']} ranks on {plural(len(set(env['hosts'])), 'host')}, "
        f"{plural(env['threads_per_rank'], 'torch thread')} per rank",
        f"# model: {m['description']}, {m['parameters']:,} parameters "
        f"({m['bytes'] / 1e6:.1f} MB float32); batch {m['batch_per_rank']} per rank; "
        f"{m['optimizer']}; DDP bucket_cap_mb {m['bucket_cap_mb']:g} ({m['bucket_cap_mb_source']})",
        f"# steps: {doc['args']['warmup']} untimed, {_settled_text(doc['fourd_tuning'])}, "
        f"then {doc['args']['blocks']} blocks x "
        f"{doc['args']['steps']} timed steps per model, in turn: {', '.join(st)}, then the "
        "reverse, block by block",
        f"# {doc['timing']}",
        "#",
        f"# {'model':<10}{'steps':>6}{'median':>10}{'min':>10}{'p25':>10}{'p75':>10}"
        f"{'max':>10}   (ms per step)",
    ]
    for name, s in st.items():
        lines.append(
            f"# {name:<10}{s['steps']:>6}{s['median_ms']:>10.1f}{s['min_ms']:>10.1f}"
            f"{s['p25_ms']:>10.1f}{s['p75_ms']:>10.1f}{s['max_ms']:>10.1f}"
        )
    lines.append(
        f"# gloo / fourd: {doc['ratio_gloo_over_fourd']:.2f}x per step (medians; > 1: fourd faster)"
    )
    comm = doc["communication_ms"]
    if comm:
        lines.append(
            "# beyond compute's median step: "
            + ", ".join(f"{b} {comm[b]:.1f} ms" for b in BACKENDS)
        )
    if doc.get("fourd_auto"):
        a = doc["fourd_auto"]
        lines.append(
            f"# fourd's auto for a {a['bucket_bytes'] >> 20} MiB bucket: {a['choice']} "
            f"({a['topology']})"
        )
    p = doc["parameters"]
    verdict = "agree" if p["agree"] else "DIFFER"
    lines.append(
        f"# parameters after {p['compared_after_steps']} steps, fourd vs gloo: max |diff| "
        f"{p['max_abs_diff']:.3g}, max relative {p['max_rel_diff']:.3g}: {verdict} within "
        f"rtol {p['rtol']:g}, atol {p['atol']:g}"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Runs the benchmark under MPI; returns the exit status (the same on every rank)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if any(a in ("-h", "--help") for a in argv):
        if rank == 0:
            build_parser().print_help()
        return 0
    try:
        cfg = parse(argv)
        if world.Get_size() < 2:
            raise UsageError(
                "one rank: DDP needs 2 or more to communicate. Start it under MPI, for "
                f"example:\n    mpiexec -n 4 python -m mpi4py -m fourd.bench.ddp {shlex.join(argv)}"
            )
    except UsageError as e:
        if rank == 0:
            print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return _finish(world, 2)
    doc = run(cfg, world)
    if rank == 0:
        print(report(doc), flush=True)
        if cfg.json:
            with open(cfg.json, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            print(f"# wrote {cfg.json}", flush=True)
    return _finish(world, 0 if doc["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
