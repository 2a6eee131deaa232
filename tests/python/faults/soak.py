"""Soak: 10,000 mixed asynchronous operations with random sizes, axes, dtypes and collectives on
4 ranks, every result checked exactly; resident memory growth after warm-up under 5%; no thread
leak."""

import os
import sys

import numpy as np
import torch
from mpi4py import MPI

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


TOTAL = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
WINDOW = 16


def rss_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def threads():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


g = fourd.init(x=2, y=1, z=1, ranks_per_node=2)
me = g.world_rank
rng = np.random.default_rng(1234)  # same seed on every rank: same sequence of calls
axes = ["x", "data", "world", ("x", "data")]
dtypes = [np.float32, np.float64, np.int32, np.int64, torch.bfloat16, torch.float16]
pending = []
checked = 0
rss_warm = threads_warm = None


def check(item):
    global checked
    kind, want, got = item
    if isinstance(got, torch.Tensor):
        got = got.to(torch.float64).numpy()
    assert np.array_equal(np.asarray(got, dtype=np.float64), want), kind
    checked += 1


for i in range(TOTAL):
    axis = axes[rng.integers(len(axes))]
    dt = dtypes[rng.integers(len(dtypes))]
    n = int(rng.integers(0, 5000))
    kind = ["all_reduce", "all_gather", "reduce_scatter"][rng.integers(3)]
    ranks = g.ranks(axis)
    p = len(ranks)
    base = (np.arange(n) % 5).astype(np.float64)

    def mk(vals, dt=dt):
        return torch.from_numpy(vals).to(dt) if isinstance(dt, torch.dtype) else vals.astype(dt)

    if kind == "all_reduce":
        t = mk(base + me)
        w = fourd.all_reduce(t, axis, async_op=True)
        want = base * p + sum(ranks)
        pending.append((w, (kind, want, t)))
    elif kind == "all_gather":
        inp = mk(base + me)
        out = mk(np.zeros(n * p))
        w = fourd.all_gather(out, inp, axis, async_op=True)
        want = np.concatenate([base + r for r in ranks]) if n else np.zeros(0)
        pending.append((w, (kind, want, out)))
    else:
        inp = mk(np.tile(base, p) + me)
        out = mk(np.zeros(n))
        w = fourd.reduce_scatter(out, inp, axis, async_op=True)
        want = base * p + sum(ranks)
        pending.append((w, (kind, want, out)))
    while len(pending) > WINDOW or (pending and pending[0][0].is_completed()):
        w, item = pending.pop(0)
        w.wait(timeout=120)
        check(item)
    if i == TOTAL // 5:
        rss_warm, threads_warm = rss_kib(), threads()
for w, item in pending:
    w.wait(timeout=120)
    check(item)
rss_end, threads_end = rss_kib(), threads()
growth = (rss_end - rss_warm) / rss_warm
ok = fourd.finalize()
say(
    f"rank {me}: SOAK checked={checked} rss_warm_kib={rss_warm} rss_end_kib={rss_end} "
    f"growth={100 * growth:.2f}% threads_warm={threads_warm} threads_end={threads_end} "
    f"finalize={ok}"
)
assert checked == TOTAL
assert growth < 0.05, growth
assert threads_end <= threads_warm, (threads_warm, threads_end)
MPI.COMM_WORLD.Barrier()
