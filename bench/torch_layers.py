"""Where the time of a torch.distributed call on backend fourd goes, layer by layer.

    mpiexec -n 2 python -m mpi4py bench/torch_layers.py --bytes 8 --json layers.json

For all_reduce (in place), all_gather_into_tensor (in place: the input is the rank's block of
the output) and reduce_scatter_tensor of float32 CPU tensors on the world group, every rank
times, interleaved in rounds after a barrier, the same blocking call made at each layer:

- `fourd`: fourd's own call on numpy arrays over the same memory (`fourd.all_reduce(a,
  group)`, one native call for a known axis);
- `fourd-t`: fourd's own call on the torch tensors (one native call too, reading the tensors'
  attributes);
- `native`: the backend's hot path alone (`ProcessGroup._native`, one native call that reads
  the tensors and torch's options object);
- `method`: the backend's method as torch calls it (`pg.allreduce([t], opts)`, ...);
- `torch`: `torch.distributed.all_reduce(t)`, `all_gather_single`, `reduce_scatter_single`.

Rank 0 prints, per collective, each layer's median over the rounds of the mean time per call
(and the fastest round), and the difference to the layer below it. A one-rank run (`-n 1`)
prices the Python layers alone: the collective itself is then a local no-op.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    ReduceOp,
    ReduceScatterOptions,
)

import fourd
import fourd.distributed  # noqa: F401  (registers the backend)

LAYERS = ("fourd", "fourd-t", "native", "method", "torch")


def calls(pg, count: int) -> dict:
    """collective -> layer -> a blocking call of `count` float32 elements a rank."""
    n, r = dist.get_world_size(), dist.get_rank()
    ar = torch.zeros(count)
    ag = torch.zeros(n * count)
    ag_in = ag[r * count : (r + 1) * count]
    rs_in, rs_out = torch.ones(n * count), torch.zeros(count)
    a_ar, a_ag, a_ag_in = ar.numpy(), ag.numpy(), ag_in.numpy()
    a_rs_in, a_rs_out = rs_in.numpy(), rs_out.numpy()
    ax = pg.fourd_axis
    o_ar = AllreduceOptions()
    o_ar.reduceOp, o_ar.asyncOp = ReduceOp.SUM, False
    o_ag = AllgatherOptions()
    o_ag.asyncOp = False
    o_rs = ReduceScatterOptions()
    o_rs.reduceOp, o_rs.asyncOp = ReduceOp.SUM, False
    return {
        "all_reduce": {
            "fourd": lambda: fourd.all_reduce(a_ar, ax),
            "fourd-t": lambda: fourd.all_reduce(ar, ax),
            "native": lambda: pg._native.all_reduce(ar, o_ar),
            "method": lambda: pg.allreduce([ar], o_ar),
            "torch": lambda: dist.all_reduce(ar),
        },
        "all_gather": {
            "fourd": lambda: fourd.all_gather(a_ag, a_ag_in, ax),
            "fourd-t": lambda: fourd.all_gather(ag, ag_in, ax),
            "native": lambda: pg._native.all_gather(ag, ag_in, o_ag),
            "method": lambda: pg.all_gather_single(ag, ag_in, o_ag),
            "torch": lambda: dist.all_gather_single(ag, ag_in),
        },
        "reduce_scatter": {
            "fourd": lambda: fourd.reduce_scatter(a_rs_out, a_rs_in, ax),
            "fourd-t": lambda: fourd.reduce_scatter(rs_out, rs_in, ax),
            "native": lambda: pg._native.reduce_scatter(rs_out, rs_in, o_rs),
            "method": lambda: pg.reduce_scatter_single(rs_out, rs_in, o_rs),
            "torch": lambda: dist.reduce_scatter_single(rs_out, rs_in),
        },
    }


def measure(layers: dict, iters: int, rounds: int) -> dict:
    """layer -> the mean seconds a call of each round (every layer once a round, in turn)."""
    for f in layers.values():  # warm-up; the torch layer also makes the hot path
        for _ in range(50):
            f()
    if not layers["native"]():
        raise RuntimeError("the backend's hot path did not take the call")
    times = {k: [] for k in layers}
    for _ in range(rounds):
        for k, f in layers.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                f()
            times[k].append((time.perf_counter() - t0) / iters)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bytes", type=int, default=8, help="bytes a rank contributes (float32)")
    p.add_argument("--iters", type=int, default=2000, help="calls a layer a round")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json", help="write every round's times here (rank 0)")
    args = p.parse_args()
    dist.init_process_group("fourd")
    pg = dist.group.WORLD
    count = max(1, args.bytes // 4)
    out = {"bytes": count * 4, "ranks": dist.get_world_size(), "times_s": {}}
    for coll, layers in calls(pg, count).items():
        times = measure(layers, args.iters, args.rounds)
        out["times_s"][coll] = times
        if dist.get_rank() == 0:
            below = None  # (layer, its median) of the layer printed last
            for k in LAYERS:
                v = sorted(times[k])
                med = v[len(v) // 2] * 1e6
                step = "" if below is None else f"  {med - below[1]:+5.2f} us over {below[0]}"
                print(f"{coll:15s} {k:7s} median {med:8.2f} us  fastest {v[0] * 1e6:8.2f}{step}")
                below = (k, med)
    if dist.get_rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    dist.destroy_process_group()
    fourd.finalize()


if __name__ == "__main__":
    main()
