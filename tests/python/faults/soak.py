"""Soak: 10,000 mixed asynchronous operations with random sizes, axes, dtypes and collectives on
4 ranks, every result checked exactly; resident memory growth after warm-up under 5%; no thread
leak. With "faults", three faults are injected on grids of their own while the soak goes on
(docs/errors.md): a rank times out and reuses its buffer while its peer arrives late; Ctrl-C
during Work.wait; two threads running collectives on two different axes at once. Every result
is still exact, the reused buffer is never written, and the soak's grid is untouched.

    python soak.py [TOTAL] [faults]
"""

import os
import signal
import sys
import threading
import time

import numpy as np
import torch
from mpi4py import MPI

import fourd


def say(msg):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (msg + "\n").encode())


TOTAL = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
FAULTS = "faults" in sys.argv[2:]
WINDOW = 16


def rss_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def threads():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


g = fourd.init(x=2, y=1, z=1, ranks_per_node=2)
me = g.world_rank


def fault_timeout_and_reuse():
    """Rank 1 is late; the others time out, reuse their buffer and must find it intact."""
    f = fourd.init(timeout=30)
    t = torch.ones(1 << 12)
    if me == 1:
        time.sleep(1.5)
        try:
            fourd.all_reduce(t, grid=f, algorithm="flat", timeout=2)
        except fourd.Error:
            pass
    else:
        try:
            fourd.all_reduce(t, grid=f, algorithm="flat", timeout=0.3)
            raise AssertionError("no timeout")
        except fourd.TimeoutError:
            t.fill_(-3)
        time.sleep(3.0)
        assert bool((t == -3).all()), "a timed-out operation wrote the reused buffer"
    MPI.COMM_WORLD.Barrier()
    f.finalize(timeout=10)


def fault_interrupt_in_wait():
    """Ctrl-C on rank 0 while it waits for an operation rank 1 joins late: KeyboardInterrupt,
    that grid's axis poisoned; the soak's grid goes on."""
    f = fourd.init(timeout=30)
    a = np.ones(1 << 10, np.float32)
    if me == 1:
        time.sleep(1.5)
    w = fourd.all_reduce(a, grid=f, async_op=True, timeout=5)
    if me == 0:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            w.wait()
        except KeyboardInterrupt:
            pass
        try:
            fourd.all_reduce(a, grid=f)
            raise AssertionError("not poisoned")
        except fourd.AbortedError:
            pass
    else:
        try:
            w.wait()
        except fourd.Error:
            pass
    MPI.COMM_WORLD.Barrier()
    f.finalize(timeout=10)


def fault_threads_on_two_axes():
    """Two threads, each on its own axis of one grid, at once; every result exact."""
    f = fourd.init(x=2, ranks_per_node=2)
    bad, done = [], []

    def run(axis):
        ranks = f.ranks(axis)
        for k in range(200):
            t = np.full(257, me + k, np.float64)
            fourd.all_reduce(t, axis, grid=f)
            if not (t == sum(ranks) + k * len(ranks)).all():
                bad.append((axis, k))
            done.append(axis)

    ts = [threading.Thread(target=run, args=(ax,)) for ax in ("x", "data")]
    for th in ts:
        th.start()
    for th in ts:
        th.join(120)
    assert not bad and not any(th.is_alive() for th in ts), bad
    assert len(done) == 400, len(done)
    MPI.COMM_WORLD.Barrier()
    f.finalize(timeout=10)


FAULT_AT = (
    {3000: fault_timeout_and_reuse, 5000: fault_interrupt_in_wait, 7000: fault_threads_on_two_axes}
    if FAULTS
    else {}
)
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
        w = fourd.all_reduce(t, axis, grid=g, async_op=True)
        want = base * p + sum(ranks)
        pending.append((w, (kind, want, t)))
    elif kind == "all_gather":
        inp = mk(base + me)
        out = mk(np.zeros(n * p))
        w = fourd.all_gather(out, inp, axis, grid=g, async_op=True)
        want = np.concatenate([base + r for r in ranks]) if n else np.zeros(0)
        pending.append((w, (kind, want, out)))
    else:
        inp = mk(np.tile(base, p) + me)
        out = mk(np.zeros(n))
        w = fourd.reduce_scatter(out, inp, axis, grid=g, async_op=True)
        want = base * p + sum(ranks)
        pending.append((w, (kind, want, out)))
    while len(pending) > WINDOW or (pending and pending[0][0].is_completed()):
        w, item = pending.pop(0)
        w.wait(timeout=120)
        check(item)
    if i == TOTAL // 5:
        rss_warm, threads_warm = rss_kib(), threads()
    if i in FAULT_AT:
        for w, item in pending:  # the soak's own operations first: a fault grid is collective
            w.wait(timeout=120)
            check(item)
        pending.clear()
        t0 = time.monotonic()
        FAULT_AT[i]()
        if me == 0:
            took = time.monotonic() - t0
            say(f"rank {me}: fault {FAULT_AT[i].__name__} at {i} done in {took:.3f} s")
for w, item in pending:
    w.wait(timeout=120)
    check(item)
rss_end, threads_end = rss_kib(), threads()
growth = (rss_end - rss_warm) / rss_warm
ok = g.finalize()
fourd.finalize()
say(
    f"rank {me}: SOAK checked={checked} rss_warm_kib={rss_warm} rss_end_kib={rss_end} "
    f"growth={100 * growth:.2f}% threads_warm={threads_warm} threads_end={threads_end} "
    f"finalize={ok} faults={len(FAULT_AT)}"
)
assert checked == TOTAL
assert growth < 0.05, growth
assert threads_end <= threads_warm, (threads_warm, threads_end)
MPI.COMM_WORLD.Barrier()
