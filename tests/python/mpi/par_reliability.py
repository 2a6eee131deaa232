"""Multi-rank regression tests of the failure cases (docs/errors.md): threads, placement that
differs between ranks, counts the MPI library cannot take, settings that must agree, values and
arguments that must be refused on every rank. Run under mpiexec by tests/python/test_failures.py
(2 and 4 ranks)."""

import threading
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

import fourd

N = MPI.COMM_WORLD.Get_size()
ME = MPI.COMM_WORLD.Get_rank()


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("FOURD_CALIBRATE", "0")
    yield
    fourd.finalize()


def test_one_axis_from_two_threads_is_refused_and_other_axes_work():
    g = fourd.init(x=2 if N % 2 == 0 else 1)
    a = np.ones(64, np.float32)
    fourd.all_reduce(a, "world")  # this thread owns "world" now
    errors = []

    def other():
        try:
            fourd.all_reduce(np.ones(64, np.float32), "world")
        except fourd.InvalidArgumentError as e:
            errors.append(str(e))
        # Another axis from this thread is fine, and exact.
        b = np.full(64, ME, np.float32)
        fourd.all_reduce(b, "data", grid=g)
        errors.append(("data", bool((b == sum(g.ranks("data"))).all())))

    t = threading.Thread(target=other)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert "used from another thread" in errors[0], errors
    assert errors[1] == ("data", True), errors
    fourd.all_reduce(a, "world")  # the owner thread keeps working
    assert (a == N * N).all()


def test_mixed_placement_chooses_alike_and_is_exact():
    if N < 2:
        return
    g = fourd.init(x=N, ranks_per_node=N)
    n = 1 << 18
    # Corrections that would make in-place and out-of-place calls choose differently.
    corr = [
        {
            "collective": "all_gather",
            "algorithm": a,
            "group_size": N,
            "nodes": 1,
            "half16": False,
            "in_place": ip,
            "nbytes": float(n * 4 * N),
            "factor": f,
        }
        for a in ("flat", "ring", "rhd", "shm")
        for ip, f in ((True, 0.1 if a == "ring" else 10.0), (False, 0.1 if a == "shm" else 10.0))
    ]
    g.set_profile({"corrections": corr})
    choices = {g.algorithm_for("all_gather", n * 4 * N, "x", in_place=ip) for ip in (True, False)}
    assert len(choices) == 1, choices
    out = np.zeros(n * N, np.float32)
    mine = np.full(n, ME, np.float32)
    for _ in range(3):
        if ME == 0:  # in place on rank 0, out of place elsewhere
            out[ME * n : (ME + 1) * n] = mine
            fourd.all_gather(out, out[ME * n : (ME + 1) * n], "x", timeout=30)
        else:
            fourd.all_gather(out, mine, "x", timeout=30)
        assert (out == np.repeat(np.arange(N, dtype=np.float32), n)).all()


def test_flat_is_never_chosen_beyond_the_mpi_count_limit():
    g = fourd.init()
    big = (1 << 31) + 8  # int8 elements: more than an int counts
    e = g.explain("all_reduce", big, "world", dtype="int8")
    rows = {r["algorithm"]: r for r in e["candidates"]}
    if N > 1:
        assert not rows["flat"]["supported"] and "2147483647" in rows["flat"]["reason"], rows
        assert e["choice"] != "flat", e
        # An explicit flat is refused before any communication (the buffer is never touched).
        fake = fourd.Buffer(np.zeros(1, np.int8).ctypes.data, big, "int8")
        with pytest.raises(fourd.InvalidArgumentError, match="2147483647"):
            fourd.all_reduce(fake, algorithm="flat")


def test_wire_settings_must_agree(monkeypatch):
    if N < 2:
        return
    if ME == 0:
        monkeypatch.setenv("FOURD_RING_SEGMENT_BYTES", "4096")
    with pytest.raises(fourd.MismatchError, match="FOURD_RING_SEGMENT_BYTES"):
        fourd.init()


@pytest.mark.parametrize(
    "var,value",
    [
        ("FOURD_TUNE", "weird"),
        ("FOURD_RING_SEGMENT_BYTES", "12"),
        ("FOURD_HIERARCHICAL_CHUNKS", "0"),
        ("FOURD_SHM_CMA", "maybe"),
        ("FOURD_ALGORITHM", "fastest"),
        ("FOURD_DEBUG", "2"),
        ("FOURD_ABORT_ON_TIMEOUT", "2"),
    ],
)
def test_bad_setting_raises_on_every_rank(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises((fourd.InvalidArgumentError, fourd.MismatchError), match=var):
        fourd.init()


def test_bad_calibrate_setting(monkeypatch):
    monkeypatch.setenv("FOURD_CALIBRATE", "weird")
    with pytest.raises(fourd.InvalidArgumentError, match="FOURD_CALIBRATE"):
        fourd.init()


def test_algorithm_names_parse_alike_in_the_argument_and_the_environment(monkeypatch):
    monkeypatch.setenv("FOURD_ALGORITHM", "Ring")
    g = fourd.init()
    a = np.ones(10, np.float32)
    fourd.all_reduce(a, algorithm="Ring")
    fourd.all_reduce(a)
    assert (a == N * N).all()
    if N > 1:
        assert g.explain("all_reduce", 4096)["choice"] == "ring"


def test_a_size_too_large_on_one_rank_raises_on_every_rank():
    x = 2**31 if ME == 0 else 1
    with pytest.raises(fourd.Error):  # InvalidArgumentError here, MismatchError elsewhere
        fourd.init(x=x, data=N)


@pytest.mark.parametrize(
    "bad",
    [
        dict(async_op="yes"),
        dict(timeout="soon"),
        dict(axis=("x", "x")),
        dict(axis="x+x"),
    ],
)
def test_bad_call_arguments(bad):
    fourd.init()
    a = torch.ones(4)
    axis = bad.pop("axis", "world")
    with pytest.raises(fourd.InvalidArgumentError):
        fourd.all_reduce(a, axis, **bad)


def test_bad_explain_and_init_arguments():
    g = fourd.init()
    with pytest.raises(fourd.InvalidArgumentError, match="nbytes"):
        g.explain("all_reduce", -1)
    with pytest.raises(fourd.InvalidArgumentError, match="in_place"):
        g.explain("all_reduce", 8, in_place="no")
    fourd.finalize()
    with pytest.raises(fourd.InvalidArgumentError, match="comm"):
        fourd.init(comm="garbage")


def test_infinite_timeouts_are_no_timeouts(monkeypatch):
    monkeypatch.setenv("FOURD_TIMEOUT_S", "inf")
    fourd.init()
    a = np.ones(8, np.float32)
    fourd.all_reduce(a, timeout=float("inf"))
    fourd.all_reduce(a, timeout=1e12)
    assert (a == N * N).all()
    assert fourd.finalize(timeout=float("inf"))


def test_groups_of_any_ranks_in_any_order():
    g = fourd.init()
    if N < 2:
        return
    ranks = [N - 1, 0] if N > 2 else [1, 0]
    if ME in ranks:
        sub = g.group(ranks)
        assert sub.communicator.size == 2 and list(sub.communicator.world_ranks) == ranks
        a = np.full(33, ME + 1, np.float64)
        fourd.all_reduce(a, sub)
        assert (a == sum(r + 1 for r in ranks)).all()
        out = np.zeros(4, np.float32)
        fourd.all_gather(out, np.full(2, ME, np.float32), sub)
        assert (out == np.repeat(np.array(ranks, np.float32), 2)).all()  # group-rank order
        assert g.size(sub) == 2 and g.ranks(sub) == ranks
    # The ranks of an axis give that axis's communicator (world and data coincide here).
    c = g.group(g.ranks("world")).communicator
    assert c.name in ("world", "data") and g.ranks(c.name) == g.ranks("world"), c.name
    MPI.COMM_WORLD.Barrier()


def test_a_poisoned_group_is_made_anew_when_asked_again():
    """A group whose operation timed out is poisoned on the ranks that waited. Asked for again,
    it is made anew where every member's copy is poisoned; a member whose copy is healthy (here
    rank 0, which skipped the call) keeps it, so the others' request times out, until that
    member's copy fails too (here: aborted). The new group works; the old one keeps refusing."""
    g = fourd.init()
    if N < 2:
        return
    ranks = list(reversed(range(N)))  # not an axis: a communicator of its own
    sub = g.group(ranks)
    a = np.ones(1000, np.float32)
    if ME != 0:
        with pytest.raises(fourd.TimeoutError):
            fourd.all_reduce(a, sub, timeout=1.0)
        assert sub.communicator.poisoned
        t0 = time.monotonic()
        with pytest.raises(fourd.TimeoutError):
            g.group(ranks, timeout=1.0)
        assert time.monotonic() - t0 < 5
    else:
        assert g.group(ranks) is sub and not sub.communicator.poisoned
    MPI.COMM_WORLD.Barrier()
    if ME == 0:
        sub.communicator.abort("the test's peers timed out")
        assert "the test's peers timed out" in sub.communicator.poison_reason
    again = g.group(ranks, timeout=30)
    assert again is not sub and not again.communicator.poisoned
    assert list(again.communicator.world_ranks) == ranks
    b = np.full(1000, ME + 1, np.float32)
    fourd.all_reduce(b, again)
    assert (b == N * (N + 1) / 2).all()
    assert g.group(ranks) is again  # healthy: cached
    with pytest.raises(fourd.AbortedError):
        fourd.all_reduce(a, sub)  # the old one still refuses, at once
    MPI.COMM_WORLD.Barrier()


def test_members_that_disagree_on_a_group_all_raise():
    g = fourd.init()
    if N < 2:
        return
    ranks = [0, 1] if ME != 1 else [1, 0]
    if ME in (0, 1):
        with pytest.raises(fourd.MismatchError):
            g.group(ranks, timeout=20)
    with pytest.raises(fourd.InvalidArgumentError, match="not in"):
        g.group([r for r in range(N) if r != ME] or [99])
    MPI.COMM_WORLD.Barrier()


def test_init_can_leave_the_current_grid_in_place():
    g = fourd.init()
    h = fourd.init(x=N, make_current=False)
    assert fourd.get_grid() is g and h is not g
    a = np.full(7, ME + 1, np.float64)
    fourd.all_reduce(a, "x", grid=h)
    assert (a == N * (N + 1) / 2).all()
    with pytest.raises(fourd.InvalidArgumentError, match="make_current"):
        fourd.init(make_current="no")
    h.finalize()
    fourd.finalize()


def test_an_object_naming_its_fourd_axis_is_an_axis():
    """What a torch group of fourd's backend or a parallel_state group carries: any argument
    that takes an axis takes it, positionally too."""
    g = fourd.init()

    class Holder:
        def __init__(self, axis):
            self.fourd_axis = axis

    ranks = list(range(N))[::-1]
    for holder in (Holder("world"), Holder(g.group(ranks))):
        a = np.full(5, ME + 1, np.int64)
        fourd.all_reduce(a, holder)
        assert (a == N * (N + 1) // 2).all()
        assert g.size(holder) == N and sorted(g.ranks(holder)) == list(range(N))
    fourd.finalize()


def test_core_share_counts_the_ranks_on_this_kernel_against_their_cores(monkeypatch):
    """How waits poll: every rank here runs on one kernel, so all N count together, against
    the union of their CPU sets; FOURD_POLL forces the outcome either way."""
    import os

    monkeypatch.delenv("FOURD_POLL", raising=False)
    g = fourd.init(ranks_per_node=1)  # virtual nodes do not change who shares the cores
    cores = set().union(*MPI.COMM_WORLD.allgather(sorted(os.sched_getaffinity(0))))
    c = g.core_share
    assert c == {"ranks": N, "cores": len(cores), "oversubscribed": N > len(cores)}, c
    for mode, over in (("yield", True), ("spin", False)):
        monkeypatch.setenv("FOURD_POLL", mode)
        g = fourd.init()
        assert g.core_share == {"ranks": N, "cores": len(cores), "oversubscribed": over}
    fourd.finalize()
