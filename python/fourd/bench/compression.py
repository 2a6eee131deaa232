"""``python -m fourd.bench --compression CODECS``: compressed collectives next to the same call
uncompressed, in one run.

For every collective and size, each variant runs in turn, in alternating order over --rounds
rounds (the median of the rounds is reported): the uncompressed call with --algorithm
(hierarchical by default: its rail level is where a codec goes), the same call with each codec
of --compression, and the MPI library's own collective (mpi4py) for context. Reported per cell:
time, speed-up over uncompressed, busbw on the logical size (nccl-tests factors), logical bytes,
the wire bytes one rank sent in compressed messages (counted by the core) next to the raw bytes
the same level would carry, the ratio, the max and RMS error against the uncompressed result
with the documented bound (docs/compression.md), and each codec's own encode and decode speed
on one core next to the link rate per rank, so that a reader sees which one bounds the time.

Data (--data): "normal" (gradient-like, N(0, 1e-2)), "ints" (integer values 1..4), or a .npy
file (a trained model's weights or gradients, flattened and tiled to the size).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from .options import _size

FACTORS = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p}
FACTORS["reduce_scatter"] = FACTORS["all_gather"]
# name -> (torch dtype name, fourd's dtype code)
DTYPES = {"float32": ("float32", 0), "float64": ("float64", 1), "bfloat16": ("bfloat16", 3)}


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m fourd.bench --compression", description=__doc__)
    p.add_argument("--compression", required=True, help="codecs, comma-separated (auto allowed)")
    p.add_argument("--collective", default="all_reduce", help="comma-separated")
    p.add_argument("-b", "--minbytes", default="16M")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=5)
    p.add_argument("-w", "--warmup_iters", type=int, default=2)
    p.add_argument("-R", "--rounds", type=int, default=3)
    p.add_argument("--axis", default="world", choices=["world", "data"])
    p.add_argument("--algorithm", default="hierarchical")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--data", default="normal", help="normal, ints, or a .npy file")
    p.add_argument("--no-mpi", action="store_true", help="leave out the MPI library's call")
    p.add_argument("--link-rate", default=None, help="the node link, e.g. 1gbit (for the report)")
    p.add_argument("--ranks-per-node", type=int, default=None)
    p.add_argument("-J", "--json", default=None)
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    a.codecs = [c.strip() for c in a.compression.split(",") if c.strip()]
    a.collectives = [c.strip() for c in a.collective.split(",")]
    for c in a.collectives:
        if c not in FACTORS:
            p.error(f"--collective: expected all_reduce, all_gather or reduce_scatter, found {c}")
    a.sizes = []
    s, e = _size(a.minbytes), _size(a.maxbytes)
    while s <= e:
        a.sizes.append(s)
        s *= max(2, a.stepfactor)
    return a


def rate_bytes(text):
    """'1gbit' / '100mbit' -> bytes per second."""
    t = text.lower().rstrip("ps").rstrip("/")
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * mult / 8
    return float(t)


def make_data(kind, count, dtype, rank):
    if kind == "normal":
        return (np.random.default_rng(7 + rank).standard_normal(count) * 1e-2).astype(dtype)
    if kind == "ints":
        return np.resize(np.arange(1, 5, dtype=np.float64), count).astype(dtype) + rank % 2
    src = np.load(kind).astype(dtype).ravel()
    start = (rank * 7919) % max(1, src.size)
    return np.resize(np.roll(src, -start), count)


class Cell:
    """One collective and size: its buffers and the calls of each variant."""

    def __init__(self, fourd, g, args, coll, nbytes):
        self.fourd, self.g, self.args, self.coll = fourd, g, args, coll
        import torch

        self.p = g.size(args.axis)
        name, self.code = DTYPES[args.dtype]
        dtype = getattr(torch, name)
        es = torch.empty(0, dtype=dtype).element_size()
        self.nbytes = nbytes // (es * self.p) * (es * self.p)
        n = self.nbytes // es
        inn = n if coll != "all_gather" else n // self.p
        outn = n if coll != "reduce_scatter" else n // self.p
        wide = make_data(
            args.data, inn, np.float64 if name == "float64" else np.float32, g.rank(args.axis)
        )
        self.x = torch.from_numpy(wide).to(dtype)
        self.out = torch.empty(outn, dtype=dtype)
        self.mpi = name != "bfloat16"  # mpi4py reduces no bfloat16

    def call(self, codec):
        f, a = self.fourd, self.args
        kw = dict(grid=self.g, algorithm=a.algorithm, compression=codec)
        if self.coll == "all_reduce":
            f.all_reduce(self.x, a.axis, output=self.out, **kw)
        elif self.coll == "all_gather":
            f.all_gather(self.out, self.x, a.axis, **kw)
        else:
            f.reduce_scatter(self.out, self.x, a.axis, **kw)

    def call_mpi(self, comm):
        x, out = self.x.numpy(), self.out.numpy()
        if self.coll == "all_reduce":
            comm.Allreduce(x, out)
        elif self.coll == "all_gather":
            comm.Allgather(x, out)
        else:
            comm.Reduce_scatter_block(x, out)

    def timed(self, fn, comm):
        a = self.args
        for _ in range(a.warmup_iters):
            fn()
        comm.Barrier()
        w0 = self.fourd._C.codec_wire_bytes()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            fn()
        dt = (time.perf_counter() - t0) / a.iters
        wire = (self.fourd._C.codec_wire_bytes() - w0) / a.iters
        return comm.allreduce(dt, op=_max()), wire


def _max():
    from mpi4py import MPI

    return MPI.MAX


def raw_level_bytes(g, axis, coll, nbytes, algorithm):
    """Bytes one rank sends over the codec's level uncompressed (the rail of hierarchical, or
    the whole group's ring)."""
    t = g.topology(axis)
    if algorithm == "hierarchical" and t["num_nodes"] > 1:
        p, n = t["num_nodes"], nbytes / t["k"]
    else:
        p, n = g.size(axis), nbytes
    return (2.0 if coll == "all_reduce" else 1.0) * (p - 1) / p * n


def codec_speed(fourd, codec, x, code):
    """(encode, decode) MB/s of one core on up to 16 MiB of x, and the ratio there."""
    if codec == "auto":
        codec = "lossless"
    y = x[: min(x.numel(), (16 << 20) // x.element_size())].clone()
    z = y.clone()
    best = None
    for _ in range(3):
        b, te, td = fourd._C.codec_round_trip(codec, y.data_ptr(), z.data_ptr(), y.numel(), code)
        if best is None or te + td < best[1] + best[2]:
            best = (b, te, td)
    raw = y.numel() * y.element_size()
    return raw / best[1] / 1e6, raw / best[2] / 1e6, raw / max(1, best[0])


def errors(ref, out):
    d = out.double().numpy() - ref.double().numpy()
    if d.size == 0:
        return 0.0, 0.0
    return float(np.abs(d).max()), float(np.sqrt(np.mean(d * d)))


def bound_of(fourd, g, args, coll, codec, absmax, code):
    if codec == "auto" or not fourd._C.codec_info(codec)["lossy"]:
        return 0.0
    t = g.topology(args.axis)
    if args.algorithm in ("auto", "hierarchical") and t["num_nodes"] > 1 and t["uniform"]:
        chain, fan = t["num_nodes"] - 1, t["k"]
    else:
        chain, fan = g.size(args.axis) - 1, 1
    if coll == "all_gather":
        return fourd._C.codec_bound(codec, code, 0, absmax, True)
    return fourd._C.codec_bound(codec, code, chain, fan * absmax, coll == "all_reduce")


def measure_cell(fourd, g, args, coll, nbytes, comm, sub):
    cell = Cell(fourd, g, args, coll, nbytes)
    variants = ["none", *args.codecs] + (["mpi"] if cell.mpi and not args.no_mpi else [])
    times = {v: [] for v in variants}
    wires = {v: 0.0 for v in variants}
    cell.call("none")
    ref = cell.out.clone()
    errs = {}
    for v in args.codecs:
        cell.call(v)
        errs[v] = errors(ref, cell.out)
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            fn = (lambda: cell.call_mpi(sub)) if v == "mpi" else (lambda v=v: cell.call(v))
            t, w = cell.timed(fn, comm)
            times[v].append(t)
            wires[v] = max(wires[v], w)
    absmax = comm.allreduce(
        float(cell.x.double().abs().max()) if cell.x.numel() else 0.0, op=_max()
    )
    return cell, ref, times, wires, errs, absmax


def rows_of(fourd, g, args, coll, nbytes, comm, sub, link):
    cell, ref, times, wires, errs, absmax = measure_cell(fourd, g, args, coll, nbytes, comm, sub)
    med = {v: statistics.median(ts) for v, ts in times.items()}
    noise = {v: (max(ts) - min(ts)) / med[v] if med[v] > 0 else 0.0 for v, ts in times.items()}
    raw = raw_level_bytes(g, args.axis, coll, cell.nbytes, args.algorithm)
    fac = FACTORS[coll](cell.p)
    rows = []
    for v in times:
        row = {
            "collective": coll,
            "nbytes": cell.nbytes,
            "variant": v,
            "time_s": med[v],
            "times_s": times[v],
            "spread": noise[v],
            "speedup_vs_uncompressed": med["none"] / med[v],
            "busbw_GBps": cell.nbytes / med[v] * fac / 1e9,
            "logical_bytes": cell.nbytes,
            "raw_level_bytes_per_rank": raw,
        }
        if v not in ("none", "mpi"):
            enc, dec, ratio_here = codec_speed(fourd, v, cell.x, cell.code)
            wire = comm.allreduce(wires[v], op=_max())
            bnd = bound_of(fourd, g, args, coll, v, absmax, cell.code)
            max_err = comm.allreduce(errs[v][0], op=_max())
            row.update(
                wire_bytes_per_rank=wire,
                ratio=raw / wire if wire else None,
                max_error=max_err,
                rms_error=comm.allreduce(errs[v][1], op=_max()),
                bound=bnd,
                within_bound=max_err <= bnd,
                encode_MBps_core=enc,
                decode_MBps_core=dec,
                ratio_on_input=ratio_here,
                link_MBps_rank=link / 1e6 if link else None,
            )
        rows.append(row)
    return rows


def link_per_rank(g, args):
    t = g.topology(args.axis)
    if not args.link_rate:
        return None
    return rate_bytes(args.link_rate) / max(1, t["k"] if t["num_nodes"] > 1 else 1)


def print_rows(rows, out=sys.stdout, head=True):
    header = (
        f"{'collective':<15}{'size':>9} {'variant':<16}{'time':>10}{'x uncomp':>9}{'busbw':>8}"
        f"{'ratio':>7}{'max err':>10}{'bound':>10}{'enc MB/s':>9}{'dec MB/s':>9}{'link':>7}"
    )
    if head:
        print(header, file=out)
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "-"
        err = f"{r['max_error']:.2e}" if "max_error" in r else "-"
        bnd = f"{r['bound']:.2e}" if r.get("bound") else ("0" if "bound" in r else "-")
        enc = f"{r['encode_MBps_core']:.0f}" if "encode_MBps_core" in r else "-"
        dec = f"{r['decode_MBps_core']:.0f}" if "decode_MBps_core" in r else "-"
        link = f"{r['link_MBps_rank']:.0f}" if r.get("link_MBps_rank") else "-"
        print(
            f"{r['collective']:<15}{r['nbytes'] >> 20:>7}Mi {r['variant']:<16}"
            f"{r['time_s'] * 1e3:>8.1f}ms{r['speedup_vs_uncompressed']:>8.2f}x"
            f"{r['busbw_GBps']:>8.3f}{ratio:>7}{err:>10}{bnd:>10}{enc:>9}{dec:>9}{link:>7}",
            file=out,
        )


def write_files(args, rows, argv, g):
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "schema": "fourd.bench.compression/1",
                    "command": "python -m fourd.bench " + " ".join(argv),
                    "ranks": g.world_size,
                    "topology": g.topology(args.axis)["description"],
                    "link_rate": args.link_rate,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    if args.csv:
        keys = sorted({k for r in rows for k in r if k != "times_s"})
        with open(args.csv, "w") as f:
            f.write(",".join(keys) + "\n")
            for r in rows:
                f.write(",".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + "\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    from mpi4py import MPI

    import fourd

    comm = MPI.COMM_WORLD
    g = fourd.init(1, 1, 1, comm.Get_size(), ranks_per_node=args.ranks_per_node)
    sub = comm  # the grid is 1 x 1 x 1 x world: every axis argument names the world's ranks
    link = link_per_rank(g, args)
    rows = []
    for coll in args.collectives:
        for nbytes in args.sizes:
            new = rows_of(fourd, g, args, coll, nbytes, comm, sub, link)
            if comm.Get_rank() == 0:
                print_rows(new, head=not rows)
                sys.stdout.flush()
            rows += new
    if comm.Get_rank() == 0:
        write_files(args, rows, argv, g)
    fourd.finalize()
    return 0
