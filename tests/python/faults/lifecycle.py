"""Interrupts, forks, dropped grids and finalize deadlines, on 2 ranks; one case per run:

    python faults/lifecycle.py CASE

  queued-interrupt  Ctrl-C on a blocking call queued behind async work: KeyboardInterrupt, the
                    call never runs afterwards (its buffer stays as it was), the axis poisoned.
  wait-interrupt    Ctrl-C inside Work.wait(): KeyboardInterrupt, the next call on the axis
                    raises AbortedError at once (poisoned), not after the old deadline.
  fork              fork() right after an async op completes, 20 times; every child exits
                    normally and quickly.
  drop-grid         dropping the last reference to a grid with an async op in flight returns
                    as soon as the op is done (not at its deadline).
  shm-counts        shm all_reduce with counts that differ across ranks; finalize(timeout=2)
                    returns within its deadline on every rank.
  inf-timeout       timeout=inf per call, at init and in finalize: no immediate timeout.
  after-finalize    a native communicator kept past finalize raises instead of crashing.

Each prints "rank <r>: <CASE> ..." lines the test reads.
"""

import os
import signal
import sys
import threading
import time

import mpi4py
import numpy as np

CASE = sys.argv[1]
FORKS = 20
# A forked child that exits normally must not finalize MPI (mpi4py would, at interpreter exit,
# and break the parent's process-manager connection): the parent finalizes by hand.
mpi4py.rc.finalize = CASE != "fork"
from mpi4py import MPI  # noqa: E402

import fourd  # noqa: E402

world = MPI.COMM_WORLD
me = world.Get_rank()


def say(msg):
    os.write(1, (f"rank {me}: {CASE} " + msg + "\n").encode())


def interrupt_in(seconds):
    threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT)).start()


def queued_interrupt():
    g = fourd.init(timeout=20)
    a, b = np.ones(1000, np.float32), np.full(1000, 5.0, np.float32)
    if me == 0:
        w = fourd.all_reduce(a, async_op=True)  # rank 1 joins late: it waits
        interrupt_in(0.5)
        try:
            fourd.all_reduce(b)  # queued behind w
            say("NOT-INTERRUPTED")
        except KeyboardInterrupt:
            say("INTERRUPTED")
        time.sleep(4.0)  # rank 1 arrives meanwhile: the cancelled call must not run
        say(f"untouched={bool((b == 5.0).all())}")
        try:
            fourd.all_reduce(b)
            say("NOT-POISONED")
        except fourd.AbortedError:
            say("POISONED")
        try:
            w.wait()
        except fourd.Error:
            pass
    else:
        time.sleep(2.0)
        for x in (a, b):
            try:
                fourd.all_reduce(x, timeout=2)
            except fourd.Error:
                pass
    world.Barrier()
    g.finalize(timeout=5)


def wait_interrupt():
    g = fourd.init(timeout=60)
    a = np.ones(1000, np.float32)
    if me == 1:
        time.sleep(3.0)  # joins the first all_reduce late, after rank 0 gave up
        try:
            fourd.all_reduce(a, timeout=2)
        except fourd.Error:
            pass
    else:
        w = fourd.all_reduce(a, async_op=True)
        interrupt_in(0.5)
        try:
            w.wait()
            say("NOT-INTERRUPTED")
        except KeyboardInterrupt:
            say("INTERRUPTED")
        t0 = time.monotonic()
        try:
            fourd.all_reduce(a)
            say("NOT-POISONED")
        except fourd.AbortedError:
            say(f"POISONED after {time.monotonic() - t0:.2f} s")
    world.Barrier()
    g.finalize(timeout=5)


def _reap(pid, deadline):
    """The child's exit code; a child still there after `deadline` seconds is killed (-9)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def fork_after_async():
    """Forks right after async operations complete, many times: the progress thread is then
    releasing the operation's buffers, the window a fork must not be hurt by."""
    g = fourd.init(timeout=20)
    a = np.ones(1000, np.float32)
    code, worst = 0, 0.0
    base = sys.getrefcount(a)
    for _ in range(FORKS):
        fourd.all_reduce(a, async_op=True).wait()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os._exit(0) if os.environ.get("FOURD_TEST_HARD_EXIT") else sys.exit(0)
        rc = _reap(pid, 10.0)
        worst = max(worst, time.monotonic() - t0)
        code = code or rc
    say(f"child exit={code} after {worst:.2f} s (slowest of {FORKS} forks)")
    # Every operation's hold on `a` is given back (the progress thread hands it to this one).
    end = time.monotonic() + 5.0
    while sys.getrefcount(a) > base and time.monotonic() < end:
        time.sleep(0.001)
    say(f"released={sys.getrefcount(a) == base} refs={sys.getrefcount(a)} base={base}")
    world.Barrier()
    g.finalize(timeout=5)
    MPI.Finalize()


def drop_grid():
    g = fourd.init(timeout=60)
    fourd.init(timeout=60)  # the current grid now: `g` holds the only reference to the first
    a = np.ones(1000, np.float32)
    if me == 1:
        time.sleep(1.0)
    w = fourd.all_reduce(a, async_op=True, grid=g)
    t0 = time.monotonic()
    del w, g  # the last reference: the grid drains (the op ends when rank 1 has joined)
    say(f"dropped after {time.monotonic() - t0:.2f} s")
    world.Barrier()


def shm_counts():
    fourd.init(x=2, ranks_per_node=2, timeout=30)
    a = np.ones(1000 if me == 0 else 3000, np.float32)
    try:
        fourd.all_reduce(a, "x", algorithm="shm", timeout=3)
    except fourd.Error as e:
        say(f"call raised {type(e).__name__}")
    t0 = time.monotonic()
    ok = fourd.finalize(timeout=2)
    say(f"finalize={ok} after {time.monotonic() - t0:.2f} s")


def inf_timeout():
    fourd.init(timeout=float("inf"))
    a = np.ones(10, np.float32)
    if me == 1:
        time.sleep(0.5)
    fourd.all_reduce(a, timeout=float("inf"))
    w = fourd.all_reduce(a, async_op=True, timeout=float("inf"))
    w.wait(timeout=float("inf"))
    say(f"result={a[0]} finalize={fourd.finalize(timeout=float('inf'))}")


def after_finalize():
    g = fourd.init()
    c = g.communicator("world")
    fourd.finalize()
    try:
        c.barrier(1.0)
        say("NO-ERROR")
    except fourd.AbortedError as e:
        say(f"size={c.size} raised AbortedError: {str(e)[:60]}")


{
    "queued-interrupt": queued_interrupt,
    "wait-interrupt": wait_interrupt,
    "fork": fork_after_async,
    "drop-grid": drop_grid,
    "shm-counts": shm_counts,
    "inf-timeout": inf_timeout,
    "after-finalize": after_finalize,
}[CASE]()
