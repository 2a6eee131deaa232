"""Every bad input raises the right class with a message naming the argument, what was expected
and what was found, on the rank that made it, before any communication (the group stays usable
and the peers' data untouched)."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

import fourd

N = MPI.COMM_WORLD.Get_size()
ME = MPI.COMM_WORLD.Get_rank()


@pytest.fixture()
def grid():
    g = fourd.init(x=2 if N % 2 == 0 else 1)
    yield g
    fourd.finalize()


def expect(exc, words, fn, *a, **k):
    with pytest.raises(exc) as info:
        fn(*a, **k)
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)
    return info.value


def still_works(g):
    t = np.full(4, ME + 1, np.int64)
    fourd.all_reduce(t, "world")
    assert t[0] == N * (N + 1) // 2


def test_axis_and_op_and_algorithm(grid):
    a = np.ones(4, np.float32)
    expect(fourd.InvalidArgumentError, ["axis", "'q'"], fourd.all_reduce, a, "q")
    expect(ValueError, ["axis", "('x', 'w')"], fourd.all_reduce, a, ("x", "w"))
    expect(fourd.InvalidArgumentError, ["op", "'xor'"], fourd.all_reduce, a, "x", "xor")
    expect(
        fourd.InvalidArgumentError,
        ["algorithm", "'magic'"],
        fourd.all_reduce,
        a,
        "x",
        algorithm="magic",
    )
    expect(fourd.InvalidArgumentError, ["timeout"], fourd.all_reduce, a, "x", timeout=-1)
    still_works(grid)


def test_tensor_properties(grid):
    # Good calls first, so that every check below meets the cached plan of "x": the one-call
    # path of CPU tensors (the plan's _C.FastCalls) must leave each of them to the general
    # path and its error.
    want = sum(r + 1 for r in grid.ranks("x"))
    for dt in (torch.float32, torch.float64, torch.int32, torch.bfloat16):
        ok = torch.full((5,), ME + 1, dtype=dt)
        fourd.all_reduce(ok, "x")
        assert ok.tolist() == [want] * 5, (dt, ok)
    # non-contiguous
    t = torch.ones(4, 4)[:, 0]
    expect(fourd.InvalidArgumentError, ["tensor", "contiguous"], fourd.all_reduce, t, "x")
    a = np.ones((4, 4), np.float32)[:, 0]
    expect(ValueError, ["tensor", "C-contiguous"], fourd.all_reduce, a, "x")
    # read-only output
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    expect(fourd.InvalidArgumentError, ["tensor", "writable"], fourd.all_reduce, ro, "x")
    # requires grad where it would be written
    rg = torch.ones(4, requires_grad=True)
    expect(fourd.InvalidArgumentError, ["tensor", "requires grad"], fourd.all_reduce, rg, "x")
    # wrong device (meta tensors stand in for devices this build cannot use)
    expect(
        fourd.InvalidArgumentError,
        ["tensor", "device"],
        fourd.all_reduce,
        torch.ones(4, device="meta"),
        "x",
    )
    # unsupported types
    expect(
        fourd.DTypeError,
        ["tensor", "complex"],
        fourd.all_reduce,
        torch.ones(4, dtype=torch.complex64),
        "x",
    )
    expect(TypeError, ["tensor", "list"], fourd.all_reduce, [1, 2, 3], "x")
    # avg on integers
    expect(
        fourd.InvalidArgumentError,
        ["op", "avg", "int32"],
        fourd.all_reduce,
        np.ones(4, np.int32),
        "x",
        "avg",
    )
    still_works(grid)


def test_sizes_dtypes_overlap(grid):
    p = grid.size("world")
    inp = np.ones(4, np.float32)
    expect(
        fourd.InvalidArgumentError,
        ["output", f"{4 * p}", "found 5"],
        fourd.all_gather,
        np.zeros(5, np.float32),
        inp,
        "world",
    )
    expect(
        fourd.DTypeError,
        ["output", "float32", "float64"],
        fourd.all_gather,
        np.zeros(4 * p, np.float64),
        inp,
        "world",
    )
    if p > 1:
        expect(
            fourd.InvalidArgumentError,
            ["input", "not divisible"],
            fourd.reduce_scatter,
            np.zeros(1, np.float32),
            np.ones(4 * p + 1, np.float32),
            "world",
        )
    expect(
        fourd.InvalidArgumentError,
        ["input", "expected"],
        fourd.reduce_scatter,
        np.zeros(2, np.float32),
        np.ones(4 * p, np.float32),
        "world",
    )
    big = np.zeros(8 * p, np.float32)
    # Overlapping but not this rank's block (the in-place layout, which is allowed).
    expect(fourd.InvalidArgumentError, ["overlaps"], fourd.reduce_scatter, big[1:9], big, "world")
    expect(
        fourd.InvalidArgumentError, ["overlaps"], fourd.all_gather, big[: 4 * p], big[1:5], "world"
    )
    expect(
        fourd.InvalidArgumentError,
        ["src", f"< {p}", f"found {p}"],
        fourd.broadcast,
        inp,
        p,
        "world",
    )
    expect(fourd.InvalidArgumentError, ["src", "int"], fourd.broadcast, inp, "0", "world")
    still_works(grid)


def test_calls_before_init_and_after_finalize():
    fourd.finalize()
    expect(fourd.NotInitializedError, ["init"], fourd.all_reduce, np.ones(2, np.float32), "x")
    g = fourd.init()
    fourd.finalize()
    expect(fourd.NotInitializedError, ["finalize"], fourd.all_reduce, np.ones(2, np.float32), "x")
    expect(fourd.NotInitializedError, ["finalized"], g.all_reduce, np.ones(2, np.float32), "x")
    assert issubclass(fourd.NotInitializedError, fourd.Error)


def test_bad_grids_raise_on_every_rank():
    # Product does not match the world size: every rank raises (none is left waiting).
    expect(fourd.InvalidArgumentError, ["x*y*z*data", f"{N}"], fourd.init, x=N + 1, data=1)
    expect(fourd.InvalidArgumentError, ["x", ">= 1", "found 0"], fourd.init, x=0, data=N)
    expect(fourd.InvalidArgumentError, ["x", "found -2"], fourd.init, x=-2, data=N)
    expect(
        fourd.InvalidArgumentError,
        ["order", "x-y-z-data", "found 'x-y-z'"],
        fourd.init,
        order="x-y-z",
    )
    expect(fourd.InvalidArgumentError, ["order"], fourd.init, order="x-y-y-data")
    expect(fourd.InvalidArgumentError, ["ranks_per_node", "found 0"], fourd.init, ranks_per_node=0)
    expect(fourd.InvalidArgumentError, ["y", "'2'"], fourd.init, y="2")
    if N > 1:
        # Ranks disagree: every rank raises MismatchError naming both sides.
        order = "data-z-y-x" if ME == 0 else "x-y-z-data"
        e = expect(
            fourd.MismatchError,
            ["different grids", "data-z-y-x", "x-y-z-data"],
            fourd.init,
            order=order,
        )
        assert "world rank" in str(e)
    g = fourd.init()
    still_works(g)
    fourd.finalize()


def test_debug_fingerprints_catch_mismatched_calls():
    if N < 2:
        pytest.skip("needs 2 ranks")
    fourd.init(debug=True, timeout=20)
    a = np.ones(10 if ME == 0 else 11, np.float32)
    e = expect(
        fourd.MismatchError,
        ["different collectives", "count 10", "count 11", "world ranks"],
        fourd.all_reduce,
        a,
        "world",
    )
    assert "this rank" in str(e)
    b = np.ones(10, np.float32 if ME == 0 else np.float64)
    expect(fourd.MismatchError, ["float32", "float64"], fourd.all_reduce, b, "world")
    # Same call everywhere: fine.
    c = np.ones(10, np.float32)
    fourd.all_reduce(c, "world")
    assert c[0] == N
    fourd.finalize()
