"""Train a tiny GPT on synthetic data with 4D parallelism (x, y, z, data), on CPU or CUDA.

    # 8 ranks, Gx=2, Gy=2, Gz=1, Gdata=2, every overlap option on
    mpiexec -n 8 python -m mpi4py examples/train_gpt_4d.py --x 2 --y 2 --z 1 --data 2 --overlap all
    # the same model, unsharded, in one process (the reference the 4D run must match)
    python examples/train_gpt_4d.py --reference
    # step time with each overlap option off and on, in one launch
    mpiexec -n 8 python -m mpi4py examples/train_gpt_4d.py --x 2 --y 2 --z 2 --sweep
    # on GPUs (each rank on cuda:(local rank % device count), as fourd.init chooses)
    mpiexec -n 4 python -m mpi4py examples/train_gpt_4d.py --y 2 --z 2 --device cuda
    # compressed collectives: a per-axis policy, and the loss curve written for comparison
    mpiexec -n 4 python -m mpi4py examples/train_gpt_4d.py --data 4 \
        --compression "data=int8;x,y,z=lossless" --error-feedback --loss-log int8_ef.json

The model: token + position embeddings, pre-LN transformer blocks (causal attention, GELU MLP),
a final LayerNorm and an untied output projection. In the 4D model the residual stream is full
width on each batch shard (replicated over x and y); each half-block takes its x-slice,
runs a plain fourd.nn.Linear (QKV, MLP up; heads and hidden units split over y) and a
transposed one (attention output, MLP down; output split over x), and gathers over x again.
The output projection is a plain Linear whose vocabulary slices are gathered over y.

Batch shard of a rank: rows [s*b, (s+1)*b) of the global batch, s = data*Gz + z. The loss is the
mean over the rank's shard; sync_gradients(average=True) makes the step equal to the mean over
the global batch, so the losses match the single-process run (printed per step; with --json the
run also writes losses and step times).

Compression: --compression is the policy of fourd.init(compression=...). A policy compresses
only groups that span nodes, so on one machine it compresses nothing; --compress-on-one-node
also passes the policy's data-axis codec to fourd.nn.sync_gradients (and the overlap's
grad_reduce) explicitly, which compresses every data-parallel gradient bucket wherever it runs.
The model's initial weights and every batch depend only on --seed and the step, so runs with
and without compression train on the same data from the same weights; --loss-log writes each
step's loss and time with the arguments, for comparing their loss curves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

OVERLAPS = {
    "none": {},
    "oar": {"all_reduce": True},
    "ors": {"reduce_scatter": True},
    "oag": {"all_gather": True},
    "dp": {"grad_reduce": True},
    "all": {"all_reduce": True, "reduce_scatter": True, "all_gather": True, "grad_reduce": True},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--x", type=int, default=1)
    p.add_argument("--y", type=int, default=1)
    p.add_argument("--z", type=int, default=1)
    p.add_argument("--data", type=int, default=None, help="default: world / (x*y*z)")
    p.add_argument("--order", default="x-y-z-data")
    p.add_argument(
        "--reference",
        action="store_true",
        help="run the unsharded torch.nn model in this one process (no MPI)",
    )
    p.add_argument(
        "--overlap",
        default="none",
        choices=list(OVERLAPS),
        help="which overlap to turn on (all = OAR+ORS+OAG+data-parallel buckets)",
    )
    p.add_argument("--prefetch-depth", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument(
        "--sweep",
        action="store_true",
        help="time every --overlap setting in this launch, print a table",
    )
    p.add_argument(
        "--turn",
        type=int,
        default=2,
        help="with --sweep: steps each setting runs before the next takes its turn",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="every N steps and after the last, the mean loss on a held-out set of "
        "--eval-batches batches that does not depend on --seed (0: never)",
    )
    p.add_argument("--eval-batches", type=int, default=8, metavar="B")
    p.add_argument(
        "--lr-decay",
        action="store_true",
        help="cosine decay of the learning rate to 10%% of --lr over --steps",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per process (default 1 under MPI, torch's default alone)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the model and its batches live (cuda: the device fourd.init chose)",
    )
    add_compression_args(p)
    p.add_argument("--json", default=None, help="write losses and step times here (rank 0)")
    p.add_argument(
        "--loss-log",
        default=None,
        metavar="FILE",
        help="write JSON here (rank 0): each step's loss and time, the arguments, and the codec "
        "the gradient all-reduces use",
    )
    p.add_argument(
        "--dump-tensors",
        default=None,
        metavar="PREFIX",
        help="after the last step, rank 0 saves its weights and gradients as PREFIX_weights.npy "
        "and PREFIX_grads.npy (float32), real data for the codec benchmark",
    )
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.eval_every < 0:
        p.error(f"--eval-every: expected N >= 0 (0: never); found {args.eval_every}")
    if args.eval_batches < 1:
        p.error(f"--eval-batches: expected B >= 1; found {args.eval_batches}")
    return args


def add_compression_args(p):
    """--compression, --compress-on-one-node, --error-feedback (the module docstring)."""
    p.add_argument(
        "--compression",
        default=None,
        help="compression policy passed to fourd.init(compression=...): a codec or preset for "
        "every axis ('int8', 'zfp:rate=8', 'lossless', 'mzhybrid', 'zhybrid') or per-axis "
        "entries such as 'data=zfp:rate=8;x,y,z=lossless'. A policy compresses only groups "
        "that span nodes: on one machine it compresses nothing (see --compress-on-one-node)",
    )
    p.add_argument(
        "--compress-on-one-node",
        action="store_true",
        help="also pass the policy's data-axis codec explicitly to sync_gradients, so every "
        "data-parallel gradient bucket (the z+data ones too) is compressed even on one node",
    )
    p.add_argument(
        "--error-feedback",
        action="store_true",
        help="error feedback on the gradient buckets whose all-reduce is lossy "
        "(fourd.nn.sync_gradients(error_feedback=True))",
    )


# ---- model -----------------------------------------------------------------------------------


class Par:
    """The parallel pieces a model needs; the unsharded reference uses identities."""

    def __init__(self, fourd_nn=None, tp=None, gy=1):
        self.nn, self.tp, self.gy = fourd_nn, tp, gy

    def linear(self, i, o, transpose=False, bias=True):
        if self.nn is None:
            return torch.nn.Linear(i, o, bias=bias)
        return self.nn.Linear(i, o, bias=bias, transpose=transpose)

    def scatter(self, t, axis):
        return t if self.tp is None else self.tp.scatter_to_tensor_model_parallel_region(t, axis)

    def gather(self, t, axis):
        return t if self.tp is None else self.tp.gather_from_tensor_model_parallel_region(t, axis)


def attention(qkv, heads):
    """qkv: (B, S, heads*3*hd), per-head [q k v] blocks, so a y-slice holds whole heads."""
    b, s, w = qkv.shape
    hd = w // (3 * heads)
    q, k, v = qkv.view(b, s, heads, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)
    att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(s, s, dtype=torch.bool, device=qkv.device).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, s, heads * hd)


class Block(torch.nn.Module):
    def __init__(self, h, heads, par: Par):
        super().__init__()
        self.par = par
        self.heads = heads // par.gy
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = par.linear(h, 3 * h)
        self.proj = par.linear(h, h, transpose=True)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = par.linear(h, 4 * h)
        self.fc2 = par.linear(4 * h, h, transpose=True)

    def forward(self, x):
        p = self.par
        a = self.proj(attention(self.qkv(p.scatter(self.ln1(x), "x")), self.heads))
        x = x + p.gather(a, "x")
        m = self.fc2(F.gelu(self.fc1(p.scatter(self.ln2(x), "x"))))
        return x + p.gather(m, "x")


class GPT(torch.nn.Module):
    def __init__(self, vocab, hidden, heads, layers, seq, par: Par):
        super().__init__()
        self.par = par
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(seq, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads, par) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden)
        self.head = par.linear(hidden, vocab, bias=False)

    def forward(self, idx):
        s = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.par.scatter(self.ln_f(x), "x"))
        return self.par.gather(logits, "y")


def batch(step, args, base=0):
    """The global batch of a step: sequences of an affine recurrence mod vocab, 10% noise."""
    g = torch.Generator().manual_seed(base + args.seed * 100003 + step)
    v, b, s = args.vocab, args.batch, args.seq + 1
    start = torch.randint(0, v, (b, 1), generator=g)
    mult = torch.randint(1, 4, (b, 1), generator=g)
    t = torch.arange(s).view(1, s)
    seqs = (start + mult * t * 7) % v
    noise = torch.rand(b, s, generator=g) < 0.1
    seqs = torch.where(noise, torch.randint(0, v, (b, s), generator=g), seqs)
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


EVAL_SEED = 2**31 - 1  # held-out batches: seeds no training batch of any --seed uses


def eval_batch(i, args):
    """Batch i of the held-out set: the same for every --seed, so runs compare on one set."""
    return batch(i, argparse.Namespace(**{**vars(args), "seed": 0}), base=EVAL_SEED)


def lr_at(step, args):
    """--lr, or with --lr-decay a cosine from --lr down to 10% of it at the last step."""
    if not args.lr_decay or args.steps <= 1:
        return args.lr
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / (args.steps - 1))))


def set_lr(opt, step, args):
    for group in opt.param_groups:
        group["lr"] = lr_at(step, args)


def print_evals(evals):
    for e in evals:
        print(f"held-out loss after step {e['step']}: {e['loss']:.6f}")


def eval_due(step, args):
    last = step == args.steps - 1
    return args.eval_every > 0 and (last or (step + 1) % args.eval_every == 0)


# ---- runs ------------------------------------------------------------------------------------


def held_out_loss(model, args, rows=slice(None)):
    """The mean loss of `model` over the held-out set (`rows` of each batch: a rank's shard)."""
    total = 0.0
    with torch.no_grad():
        for i in range(args.eval_batches):
            inp, tgt = (t[rows].to(args.device) for t in eval_batch(i, args))
            logits = model(inp)
            total += float(F.cross_entropy(logits.reshape(-1, args.vocab), tgt.reshape(-1)))
    return total / args.eval_batches


def run_reference(args):
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.hidden, args.heads, args.layers, args.seq, Par()).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    losses, times, evals = [], [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        set_lr(opt, step, args)
        inp, tgt = (t.to(args.device) for t in batch(step, args))
        logits = model(inp)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tgt.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(args)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach())
        if eval_due(step, args):
            evals.append({"step": step, "loss": held_out_loss(model, args)})
    return [float(v) for v in losses], times, evals


class Trainer:
    """One 4D model, its optimizer and its overlap setting, stepped one step at a time."""

    def __init__(self, args, overlap_name, grid):
        import fourd.nn as fnn
        import fourd.parallel_state as ps
        import fourd.tensor_parallel as tp

        self.fnn, self.args, self.grid = fnn, args, grid
        gz, gd = grid.size("z"), grid.size("data")
        if args.batch % (gz * gd):
            raise SystemExit(f"--batch {args.batch}: expected a multiple of Gz*Gdata = {gz * gd}")
        self.shards = gz * gd
        torch.manual_seed(args.seed)  # same on every rank: every rank draws the same full weights
        self.model = GPT(
            args.vocab,
            args.hidden,
            args.heads,
            args.layers,
            args.seq,
            Par(fnn, tp, ps.get_y_parallel_world_size()),
        ).to(args.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        cfg = dict(OVERLAPS[overlap_name])
        if cfg.get("all_gather"):
            cfg["prefetch_depth"] = args.prefetch_depth
        self.bucket = int(args.bucket_mb * 2**20)
        # The gradient all-reduces' codec: None, the grid's policy decides (--compression); a
        # codec with --compress-on-one-node.
        self.sync = {
            "compression": getattr(args, "sync_compression", None),
            "error_feedback": bool(getattr(args, "error_feedback", False)),
        }
        # "none": no overlap object at all, the plain blocking path.
        self.ov = None
        if cfg:
            self.ov = fnn.overlap(
                self.model,
                average=True,
                bucket_bytes=self.bucket,
                optimizer=self.opt,
                **self.sync,
                **cfg,
            ).enable()
        c = grid.coords()
        self.rows = args.batch // self.shards
        self.first = (c["data"] * gz + c["z"]) * self.rows
        self.losses, self.times, self.evals = [], [], []
        if args.eval_every and overlap_name != "none":
            raise SystemExit("--eval-every: expected --overlap none (overlap hooks every forward)")

    def step(self, step):
        grid, model, args = self.grid, self.model, self.args
        grid.barrier()  # time every step from a common start (not part of training)
        t0 = time.perf_counter()
        set_lr(self.opt, step, args)
        inp, tgt = batch(step, args)
        inp = inp[self.first : self.first + self.rows].to(args.device)
        tgt = tgt[self.first : self.first + self.rows].to(args.device)
        logits = model(inp)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tgt.reshape(-1))
        loss.backward()
        self.fnn.sync_gradients(model, average=True, bucket_bytes=self.bucket, **self.sync)
        if args.dump_tensors and step == args.steps - 1:
            dump_tensors(args.dump_tensors, model, grid.world_rank)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        _sync(args)
        self.times.append(time.perf_counter() - t0)
        self.losses.append(loss.detach())
        if eval_due(step, args):
            mine = held_out_loss(model, args, slice(self.first, self.first + self.rows))
            self.evals.append((step, mine))

    def finish(self):
        """Global loss per step (mean of the shards' means) and the slowest rank's step times:
        two collectives, once, after training."""
        if self.ov is not None:
            self.ov.disable()
        ls = torch.stack(self.losses).contiguous()
        self.grid.all_reduce(ls, ("z", "data"))
        ls /= self.shards
        tt = torch.tensor(self.times, dtype=torch.float64)
        self.grid.all_reduce(tt, "world", "max")
        ev = torch.tensor([v for _, v in self.evals], dtype=torch.float64)
        if len(ev):
            self.grid.all_reduce(ev, ("z", "data"))  # every shard's mean, averaged
            ev /= self.shards
        stats = dict(self.ov.stats) if self.ov is not None else {}
        learned = len(self.ov.learned_order or []) if self.ov is not None else None
        return {
            "losses": ls.tolist(),
            "step_times": tt.tolist(),
            "median_step_s": summarize(tt.tolist()),
            "stats": stats,
            "linear_calls_learned": learned,
            "evals": [{"step": st, "loss": v} for (st, _), v in zip(self.evals, ev.tolist())],
        }


def _sync(args):
    """Step times include the GPU's work: wait for it before reading the clock."""
    if args.device == "cuda":
        torch.cuda.synchronize()


def run_4d(args, names, grid):
    """Train one model per overlap setting. With several settings they take turns, `--turn`
    steps each, so that slow and quiet periods of a shared machine hit every setting alike."""
    trainers = {n: Trainer(args, n, grid) for n in names}
    turn = max(1, args.turn) if len(names) > 1 else args.steps
    for s0 in range(0, args.steps, turn):
        for n in names:
            for s in range(s0, min(s0 + turn, args.steps)):
                trainers[n].step(s)
    return {n: t.finish() for n, t in trainers.items()}


AXES = ("x", "y", "z", "data")


def policy_arg(text):
    """--compression as fourd.init takes it: None, per-axis entries "data=int8;x,y,z=lossless"
    as a dict {axes: codec}, else the text itself (a codec or a preset)."""
    if not text:
        return None
    entries = {}
    for entry in text.split(";"):
        head, sep, codec = entry.strip().partition("=")
        axes = tuple(a.strip() for a in head.split(","))
        if not sep or not all(a in AXES for a in axes):
            return text  # a codec for every axis ("zfp:rate=8") or a preset
        entries[axes if len(axes) > 1 else axes[0]] = codec.strip()
    return entries


def data_codec(policy_text):
    """The codec a policy (fourd.grid.compression_policy's canonical text) names for the data
    axis: the first entry that lists data, or a bare codec (every axis); None if none."""
    for entry in policy_text.split(";") if policy_text else []:
        head, sep, codec = entry.partition("=")
        axes = head.split(",")
        if not sep or not all(a in AXES for a in axes):
            return entry
        if "data" in axes:
            return codec
    return None


def init_grid(args, ps):
    """The grid: parallel_state's, built with the compression policy when one is given."""
    import fourd

    args.sync_compression = None
    if args.compress_on_one_node and not args.compression:
        raise SystemExit("--compress-on-one-node: expected --compression too")
    policy = policy_arg(args.compression)
    if policy is None:
        return ps.initialize(x=args.x, y=args.y, z=args.z, data=args.data, order=args.order)
    if args.compress_on_one_node:
        args.sync_compression = data_codec(fourd.grid.compression_policy(policy))
        if args.sync_compression is None:
            raise SystemExit(f"--compress-on-one-node: {args.compression!r} names no data codec")
    g = fourd.init(
        x=args.x, y=args.y, z=args.z, data=args.data, order=args.order, compression=policy
    )
    return ps.initialize(grid=g)


def compression_info(args, grid):
    """What the gradient all-reduces use: the codec of each data-parallel group, its source
    and where it applies, or why a policy codec does not apply."""
    import fourd

    out = {
        "policy": fourd.grid.compression_policy(policy_arg(args.compression)) or None,
        "sync_gradients_compression": args.sync_compression,
        "error_feedback": args.error_feedback,
    }
    nbytes = int(args.bucket_mb * 2**20)
    for axis in ("data", ("z", "data")):
        e = grid.explain("all_reduce", nbytes, axis, compression=args.sync_compression)
        out["+".join(axis) if isinstance(axis, tuple) else axis] = e["compression"]
    return out


def print_compression(comp):
    d = comp["data"]
    print(
        f"compression: policy {comp['policy']}; sync_gradients codec "
        f"{comp['sync_gradients_compression']}, error feedback {comp['error_feedback']}; "
        f"data-parallel all-reduce uses {d['codec']} ({d['note'] or d['where']})"
    )


def write_outputs(args, results, shape, world, comp):
    """--json (every setting's results) and --loss-log (the --overlap setting's curve)."""
    if args.json:
        out = {"mode": "4d", "grid": shape, "world": world, "results": results, "args": vars(args)}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.loss_log:
        r = results[args.overlap]
        write_loss_log(
            args.loss_log,
            args,
            r["losses"],
            r["step_times"],
            evals=r["evals"],
            mode="4d",
            grid=shape,
            world=world,
            compression=comp,
        )


def dump_tensors(prefix, model, rank):
    """Rank 0's weights and (synchronized) gradients of the last step, flattened in parameter
    order, as PREFIX_weights.npy and PREFIX_grads.npy (float32): real data for measuring
    codecs (python -m fourd.bench --compression ... --data PREFIX_grads.npy)."""
    if rank != 0:
        return
    import numpy as np

    params = [p for p in model.parameters() if p.grad is not None]
    w = torch.cat([p.detach().reshape(-1).float().cpu() for p in params])
    g = torch.cat([p.grad.detach().reshape(-1).float().cpu() for p in params])
    np.save(f"{prefix}_weights.npy", w.numpy())
    np.save(f"{prefix}_grads.npy", g.numpy())


def write_loss_log(path, args, losses, times, **extra):
    steps = [{"step": i, "loss": v, "step_s": t} for i, (v, t) in enumerate(zip(losses, times))]
    out = {**extra, "args": vars(args), "steps": steps, "final_loss": losses[-1]}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def summarize(times):
    steady = times[2:] if len(times) > 4 else times
    return statistics.median(steady)


def main(argv=None):
    args = parse_args(argv)
    if args.reference:
        if args.threads:
            torch.set_num_threads(args.threads)
        losses, times, evals = run_reference(args)
        for i, v in enumerate(losses):
            print(f"step {i:3d} loss {v:.6f}")
        print_evals(evals)
        out = {
            "mode": "reference",
            "losses": losses,
            "step_times": times,
            "median_step_s": summarize(times),
            "evals": evals,
            "args": vars(args),
        }
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        if args.loss_log:
            write_loss_log(args.loss_log, args, losses, times, evals=evals, mode="reference")
        return out

    from mpi4py import MPI

    try:
        import fourd  # noqa: F401
    except ImportError:  # running from a source checkout without installing
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import fourd  # noqa: F401
    import fourd.parallel_state as ps

    world = MPI.COMM_WORLD.Get_size()
    torch.set_num_threads(args.threads or (1 if world > 1 else torch.get_num_threads()))
    grid = init_grid(args, ps)
    me = grid.world_rank
    shape = grid.shape
    try:
        names = list(OVERLAPS) if args.sweep else [args.overlap]
        comp = compression_info(args, grid)
        results = run_4d(args, names, grid)
        if me == 0 and not args.quiet and not args.sweep:
            r = results[args.overlap]
            for i, v in enumerate(r["losses"]):
                print(f"step {i:3d} loss {v:.6f}  {r['step_times'][i] * 1e3:8.1f} ms")
            print_evals(r["evals"])
            if args.compression:
                print_compression(comp)
            if r["stats"] or r["linear_calls_learned"]:
                print(
                    f"overlap: Linear calls per step learned: {r['linear_calls_learned']}; "
                    f"counters: {r['stats']}"
                )
        if me == 0:
            if args.sweep or not args.quiet:
                base = results.get("none", {}).get("median_step_s")
                print(
                    f"\ngrid {shape} world {world}, {args.layers} layers, hidden {args.hidden}, "
                    f"batch {args.batch}x{args.seq}, {args.steps} steps, "
                    f"torch threads {torch.get_num_threads()}"
                )
                print(
                    f"{'overlap':8s} {'median step (ms)':>17s} {'vs none':>8s} {'final loss':>11s}"
                )
                for name, r in results.items():
                    rel = f"{r['median_step_s'] / base:7.2f}x" if base else "      -"
                    print(
                        f"{name:8s} {r['median_step_s'] * 1e3:17.1f} {rel:>8s} "
                        f"{r['losses'][-1]:11.6f}"
                    )
            write_outputs(args, results, shape, world, comp)
        return results
    finally:
        ps.destroy_model_parallel()
        if args.compression:  # built by init_grid, adopted by parallel_state
            grid.finalize()


if __name__ == "__main__":
    main()
