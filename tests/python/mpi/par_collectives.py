"""Multi-rank sweep of the collectives against closed-form oracles on integer-valued data.

Every factorization of the world into (x, y, z, data), several orders, virtual topologies,
every dtype and op, counts 0, 1, 7, 1000 and 2**20+3, in place and out of place, numpy and torch.
The full cross product would take hours on 2 cores; the sweep rotates dtype, op, count and
library over the grids so that every value of every factor meets every other factor's values
several times.
"""

import itertools

import numpy as np
import pytest
import torch
from mpi4py import MPI
from patterns import oracle, values

import fourd

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()

ORDERS = ["x-y-z-data", "data-z-y-x", "z-x-data-y", "y-data-x-z"]
AXES = ["x", "y", "z", "data", "world", ("x", "y"), ("z", "data"), ("x", "y", "z"), ("y", "data")]
NP_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]
TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]
OPS = ["sum", "prod", "min", "max", "avg"]
COUNTS = [0, 1, 7, 1000]
BIG = 2**20 + 3


def factorizations(n):
    out = []
    for x in range(1, n + 1):
        for y in range(1, n + 1):
            for z in range(1, n + 1):
                if n % (x * y * z) == 0:
                    out.append((x, y, z, n // (x * y * z)))
    return out


def rpn_values(n):
    return [None] + [r for r in (1, 2, 4, 8) if r <= n]


def is_float(dt):
    return dt in (np.float32, np.float64, np.float16) or dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
    )


def legal(op, dt, group):
    if op == "avg" and not is_float(dt):
        return False
    if (
        op == "prod"
        and group > 3
        and dt
        in (np.int8, np.uint8, np.float16, torch.int8, torch.uint8, torch.float16, torch.bfloat16)
    ):
        return False  # 4**8 overflows these types; not a fourd limitation
    return True


def make(lib, dt, arr):
    if lib == "numpy":
        return arr.astype(dt)
    return torch.from_numpy(arr.astype(np.float64)).to(dt)


def as_np(t):
    if isinstance(t, torch.Tensor):
        return t.to(torch.float64).numpy()
    return t.astype(np.float64)


def check(got, want, op, dt):
    if op == "avg" and dt in (np.float16, torch.float16, torch.bfloat16):
        np.testing.assert_allclose(as_np(got), want, rtol=1e-2)
    else:
        got = as_np(got)
        if not np.array_equal(got, want):  # the fast test first; the assertion reports where
            np.testing.assert_array_equal(got, want)


def plan():
    """The rotated sweep: (sizes, order, rpn, k) per grid; k rotates axis, lib, dtype, op,
    count and placement. Every factorization meets every virtual topology; up to 4 ranks in
    each of three orders, from 8 ranks (20 factorizations x 5 topologies) in one order each,
    rotating, so that every order still meets every factorization shape and topology."""
    cases = []
    counter = itertools.count()
    for f, sizes in enumerate(factorizations(N)):
        for j, rpn in enumerate(rpn_values(N)):
            orders = ORDERS[:3] if N < 8 else [ORDERS[(f + j) % 3]]
            for order in orders:
                k = next(counter)
                cases.append((sizes, order, rpn, k))
    return cases


@pytest.fixture(autouse=True)
def _inline_tuning(monkeypatch):
    # This sweep checks results on hundreds of fresh grids, each size called a few times. With
    # the default tuning every size would run its whole exploration inside its second call
    # (up to 640 runs below 256 KiB: 2.3x this sweep's time on 4 ranks); inline, each call
    # runs one candidate, so the sweep's calls still run every algorithm auto may choose.
    # par_algorithms.py tests the default tuning's results and schedule.
    monkeypatch.setenv("FOURD_TUNE", "inline")


@pytest.mark.parametrize("case", plan(), ids=lambda c: f"{c[0]}-{c[1]}-rpn{c[2]}")
def test_sweep(case):
    sizes, order, rpn, k = case
    x, y, z, d = sizes
    g = fourd.init(x=x, y=y, z=z, data=d, order=order, ranks_per_node=rpn)
    assert g.shape == {"x": x, "y": y, "z": z, "data": d}
    for j, axis in enumerate(AXES):
        s = k * len(AXES) + j
        ranks = g.ranks(axis)
        p = len(ranks)
        assert g.size(axis) == p and ranks[g.rank(axis)] == ME
        lib = "numpy" if s % 2 == 0 else "torch"
        dts = NP_DTYPES if lib == "numpy" else TORCH_DTYPES
        dt = dts[s % len(dts)]
        count = COUNTS[(s // 2) % len(COUNTS)]
        inplace = (s // 3) % 2 == 0
        # all_reduce: every op
        for op in OPS:
            if not legal(op, dt, p):
                continue
            t = make(lib, dt, values(ME, count))
            fourd.all_reduce(t, axis, op)
            check(t, oracle(op, ranks, count), op, dt)
        # all_gather (in place: the input is this rank's block of the output)
        out = make(lib, dt, np.zeros(count * p))
        if inplace and count:
            gr = g.rank(axis)
            blk = out[gr * count : (gr + 1) * count]
            blk[:] = make(lib, dt, values(ME, count))
            fourd.all_gather(out, blk, axis)
        else:
            fourd.all_gather(out, make(lib, dt, values(ME, count)), axis)
        want = np.concatenate([values(r, count) for r in ranks]) if count else np.zeros(0)
        check(out, want, "sum", dt)
        # reduce_scatter
        for op in ("sum", "max"):
            inp = make(lib, dt, values(ME, count * p))
            o = make(lib, dt, np.zeros(count))
            fourd.reduce_scatter(o, inp, axis, op)
            gr = g.rank(axis)
            check(o, oracle(op, ranks, count * p)[gr * count : (gr + 1) * count], op, dt)
        # broadcast from the last group rank
        b = make(lib, dt, values(ME, max(count, 1)))
        fourd.broadcast(b, p - 1, axis)
        check(b, values(ranks[-1], max(count, 1)), "sum", dt)
    fourd.barrier()
    fourd.finalize()


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_large_counts(lib):
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=max(1, N // 2))
    for axis in ("x", "world"):
        ranks = g.ranks(axis)
        p = len(ranks)
        dt = np.float32 if lib == "numpy" else torch.bfloat16
        t = make(lib, dt, values(ME, BIG))
        fourd.all_reduce(t, axis)
        check(t, oracle("sum", ranks, BIG), "sum", dt)
        out = make(lib, dt, np.zeros(BIG * p))
        fourd.all_gather(out, make(lib, dt, values(ME, BIG)), axis)
        check(out, np.concatenate([values(r, BIG) for r in ranks]), "sum", dt)
        inp = make(lib, dt, values(ME, BIG * p))
        o = make(lib, dt, np.zeros(BIG))
        fourd.reduce_scatter(o, inp, axis)
        gr = g.rank(axis)
        check(o, oracle("sum", ranks, BIG * p)[gr * BIG : (gr + 1) * BIG], "sum", dt)
    fourd.finalize()


def test_async_many_axes_in_flight():
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    works, bufs = [], []
    axes = ["x", "data", "world", ("x", "data")]
    for i in range(24):
        axis = axes[i % len(axes)]
        t = torch.full((50_000,), float(ME + 1 + i), dtype=torch.float64)
        works.append(fourd.all_reduce(t, axis, async_op=True))
        bufs.append((axis, t, i))
    for w in works:
        w.wait(timeout=120)
        assert w.is_completed()
    for axis, t, i in bufs:
        assert torch.all(t == sum(r + 1 + i for r in g.ranks(axis)))
    fourd.finalize()


def test_grid_matches_independent_rank_arithmetic():
    for sizes in factorizations(N):
        for order in ORDERS:
            g = fourd.init(x=sizes[0], y=sizes[1], z=sizes[2], data=sizes[3], order=order)
            names = order.split("-")
            strides, s = {}, 1
            for a in names:
                strides[a] = s
                s *= g.shape[a]
            c = g.coords()
            assert sum(c[a] * strides[a] for a in names) == ME
            for a in ("x", "y", "z", "data"):
                want = [ME + (i - c[a]) * strides[a] for i in range(g.shape[a])]
                assert g.ranks(a) == want
            fourd.finalize()


def test_init_from_a_plan():
    from fourd.plan.search import Plan

    class Choice:  # anything with grid_kwargs() and per-axis algorithms
        algorithms = {"x": "flat", "data": "flat", "y": "-", "z": "-"}

        def grid_kwargs(self):
            return {
                "x": 2 if N % 2 == 0 else 1,
                "y": 1,
                "z": 1,
                "data": N // (2 if N % 2 == 0 else 1),
                "order": "data-x-y-z",
            }

    g = fourd.init(plan=Choice())
    assert g.order == "data-x-y-z"
    assert g.shape["x"] == Choice().grid_kwargs()["x"]
    if g.size("data") > 1:
        assert g.algorithm_for("all_reduce", 1 << 20, "data") == "flat"
    t = torch.full((10,), float(ME))
    fourd.all_reduce(t, "data")
    assert torch.all(t == sum(g.ranks("data")))
    fourd.finalize()
    assert hasattr(Plan, "grid_kwargs")


@pytest.mark.parametrize("algorithm", ["auto", "flat", "ring", "rhd"])
def test_in_place_reduce_scatter(algorithm):
    """The output may be this rank's block of the input (nccl-tests' in-place layout)."""
    g = fourd.init(x=2 if N % 2 == 0 else 1)
    for axis in ("x", "world"):
        p, gr = g.size(axis), g.rank(axis)
        for count in (1, 7, 1000):
            buf = torch.from_numpy(values(ME, count * p)).to(torch.float32)
            fourd.reduce_scatter(buf[gr * count : (gr + 1) * count], buf, axis, algorithm=algorithm)
            want = oracle("sum", g.ranks(axis), count * p)[gr * count : (gr + 1) * count]
            check(buf[gr * count : (gr + 1) * count], want, "sum", torch.float32)
    fourd.finalize()


def test_numpy_hot_path_takes_only_what_it_may():
    """A blocking call on numpy arrays of a planned axis is one native call (the plan's
    _C.FastCalls) that reads the arrays' own fields: every dtype fourd has, C-contiguous, in
    native byte order, the output writable. The hot path must answer True for exactly those
    (and do the collective) and False, having done nothing, for the rest, which the general
    path then runs or refuses: each case twice, so that the second call finds the plan."""
    g = fourd.init(x=2 if N % 2 == 0 else 1)
    for axis in ("world", "x"):
        p, gr, ranks = g.size(axis), g.rank(axis), g.ranks(axis)
        for _ in range(2):
            for dt in NP_DTYPES + [np.longlong, np.intc]:
                a = values(ME, 7).astype(dt)
                fourd.all_reduce(a, axis)
                check(a, oracle("sum", ranks, 7), "sum", dt)
                out = np.zeros(p * 5, dt)
                fourd.all_gather(out, values(ME, 5).astype(dt), axis)
                check(out, np.concatenate([values(r, 5) for r in ranks]), "sum", dt)
                rs = np.zeros(3, dt)
                fourd.reduce_scatter(rs, values(ME, 3 * p).astype(dt), axis, "max")
                check(rs, oracle("max", ranks, 3 * p)[gr * 3 : (gr + 1) * 3], "max", dt)
            fast = g._calls[(axis, "sum", "auto")][3]
            two_d = values(ME, 12).reshape(3, 4)  # C-contiguous, 2-D
            assert fast.all_reduce(two_d) is True
            check(two_d.ravel(), oracle("sum", ranks, 12), "sum", np.float64)
            zero_d = np.array(float(ME + 1))
            assert fast.all_reduce(zero_d) is True and zero_d == sum(r + 1 for r in ranks)
            ro = values(ME, 4)  # a read-only input is fine, a read-only output is not
            ro.flags.writeable = False
            out = np.zeros(4 * p)
            assert fast.all_gather(out, ro) is True
            check(out, np.concatenate([values(r, 4) for r in ranks]), "sum", np.float64)
            assert fast.all_reduce(ro) is False
            with pytest.raises(fourd.InvalidArgumentError, match="writable"):
                fourd.all_reduce(ro, axis)
            fortran = np.asfortranarray(values(ME, 12).reshape(3, 4))
            assert fast.all_reduce(fortran) is False
            with pytest.raises(ValueError, match="C-contiguous"):
                fourd.all_reduce(fortran, axis)
            swapped = values(ME, 6).astype(">f8")  # not the native byte order
            assert fast.all_reduce(swapped) is False
            with pytest.raises((fourd.DTypeError, ValueError)):
                fourd.all_reduce(swapped, axis)
            for other in (np.uint16, np.bool_, np.complex64):
                assert fast.all_reduce(np.zeros(4, other)) is False
                with pytest.raises((fourd.DTypeError, ValueError)):
                    fourd.all_reduce(np.zeros(4, other), axis)
            mixed = np.zeros(4 * p, np.float32)  # output and input of different dtypes
            assert fast.all_gather(mixed, values(ME, 4)) is False
            assert fast.all_reduce([1.0]) is False
    with pytest.raises(TypeError):
        fourd._C.FastCalls()  # made by the grid's plans only
    fourd.finalize()


def test_torch_hot_path_takes_only_what_it_may():
    """A blocking call on CPU torch tensors of a planned axis is one native call that reads the
    tensors itself. It must give the general path's results and errors: inputs that require
    grad are read, views at an offset are used in place, a tensor subclass or a non-contiguous
    tensor goes the general way, and an output that requires grad is refused (on every rank,
    before anything is sent), each case twice so that the second call finds the plan made."""
    g = fourd.init(x=2 if N % 2 == 0 else 1)
    for axis in ("world", "x"):
        p, gr, ranks = g.size(axis), g.rank(axis), g.ranks(axis)
        for _ in range(2):
            big = torch.zeros(3 + p * 5, dtype=torch.float64)
            src = torch.from_numpy(values(ME, 5)).requires_grad_()
            fourd.all_gather(big[3:], src, axis)  # an input that requires grad, a view at 3
            assert torch.all(big[:3] == 0)
            want = np.concatenate([values(r, 5) for r in ranks])
            assert np.array_equal(big[3:].numpy(), want)

            out = torch.zeros(7, dtype=torch.float64)
            inp = torch.from_numpy(values(ME, 7 * p)).requires_grad_()
            fourd.reduce_scatter(out, inp, axis, "max")
            want = oracle("max", ranks, 7 * p)[gr * 7 : (gr + 1) * 7]
            check(out, want, "max", torch.float64)

            t = torch.nn.Parameter(torch.from_numpy(values(ME, 9)), requires_grad=False)
            fourd.all_reduce(t, axis)  # a subclass of Tensor: the general path
            check(t.detach(), oracle("sum", ranks, 9), "sum", torch.float64)

            r = torch.zeros(11)
            fourd.all_reduce(torch.from_numpy(values(ME, 11)).float().requires_grad_(), axis,
                             output=r)  # fmt: skip
            check(r, oracle("sum", ranks, 11), "sum", torch.float32)

            with pytest.raises(fourd.InvalidArgumentError, match="requires grad"):
                fourd.all_reduce(torch.ones(4, requires_grad=True), axis)
            with pytest.raises(fourd.InvalidArgumentError, match="requires grad"):
                fourd.all_gather(torch.zeros(p * 2, requires_grad=True), torch.ones(2), axis)
            with pytest.raises(fourd.InvalidArgumentError, match="contiguous"):
                fourd.all_reduce(torch.ones(4, 6).t(), axis)
            empty = torch.zeros(0)
            fourd.all_reduce(empty, axis)
            fourd.all_gather(torch.zeros(0), empty, axis)
    fourd.finalize()
