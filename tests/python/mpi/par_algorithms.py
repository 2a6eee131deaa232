"""Multi-rank tests of every algorithm (flat, ring, rhd, hierarchical, shm, auto).

Closed-form oracles on integer-valued data (sums and products are exact), over grid shapes x
orders x virtual topologies (ranks_per_node 1, 2, 4, 8 and an uneven 3) x axes (single and
combined) x collectives x dtypes x ops x counts (0, 1, odd, not divisible by k or N, 2**20+3).
The full cross product would take hours with 8 ranks on 2 cores, so the factors rotate: every
algorithm meets every dtype, op, count and axis kind several times. Where an algorithm cannot
run a group, the call must raise InvalidArgumentError carrying the reason that explain() gives.
Also: `auto` always picks a supported algorithm, asynchronous operations of every algorithm in
flight on several axes, completion while the caller only polls, and issue order per group.
"""

import itertools
import math
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI
from patterns import oracle, values

import fourd

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()

ALGOS = ["flat", "ring", "rhd", "hierarchical", "shm"]
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter"]
ORDERS = ["x-y-z-data", "data-z-y-x", "z-x-data-y"]
AXES = [
    "x",
    "y",
    "z",
    "data",
    "world",
    ("x", "y"),
    ("z", "data"),
    ("x", "y", "z"),
    ("y", "data"),
    ("x", "data"),
]
DTYPES = [np.float32, np.float64, np.float16, torch.bfloat16, np.int8, np.uint8, np.int32, np.int64]
OPS = ["sum", "prod", "min", "max", "avg"]
COUNTS = [0, 1, 7, 13, 1001]
BIG = 2**20 + 3


def factorizations(n):
    return [
        (x, y, z, n // (x * y * z))
        for x in range(1, n + 1)
        for y in range(1, n + 1)
        for z in range(1, n + 1)
        if n % (x * y * z) == 0
    ]


def rpn_values(n):
    out = [None] + [r for r in (1, 2, 4, 8) if r <= n]
    if n >= 4:
        out.append(3)  # uneven: 3+1 on 4 ranks, 3+3+2 on 8
    return out


def is_float(dt):
    return dt in (np.float32, np.float64, np.float16, torch.bfloat16)


def legal(op, dt, group):
    if op == "avg" and not is_float(dt):
        return False
    if op == "prod" and group > 3 and dt in (np.int8, np.uint8, np.float16, torch.bfloat16):
        return False  # 4**8 overflows these types; not a fourd limitation
    return True


def make(dt, arr):
    if dt is torch.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64)).to(dt)
    return np.ascontiguousarray(arr).astype(dt)


def zeros(dt, n):
    return make(dt, np.zeros(n))


def as_np(t):
    if isinstance(t, torch.Tensor):
        return t.to(torch.float64).numpy()
    return t.astype(np.float64)


def check(got, want, op, dt, what):
    if op == "avg" and dt in (np.float16, torch.bfloat16):
        np.testing.assert_allclose(as_np(got), want, rtol=1e-2, err_msg=what)
    elif op == "avg":
        np.testing.assert_allclose(as_np(got), want, rtol=1e-6, err_msg=what)
    else:
        got = as_np(got)
        if not np.array_equal(got, want):  # the fast test first; the assertion reports where
            np.testing.assert_array_equal(got, want, err_msg=what)


def support(g, collective, axis):
    """{algorithm: (supported, reason)} from explain() (identical on every rank)."""
    rows = g.explain(collective, 4096, axis)["candidates"]
    return {r["algorithm"]: (r["supported"], r["reason"]) for r in rows}


def run_one(g, algo, coll, axis, dt, op, count, inplace, what):
    """Runs one collective with `algo` and compares it with the closed form."""
    ranks = g.ranks(axis)
    p = len(ranks)
    gr = g.rank(axis)
    if coll == "all_reduce":
        t = make(dt, values(ME, count))
        out = t if inplace else zeros(dt, count)
        if inplace:
            fourd.all_reduce(t, axis, op, algorithm=algo)
        else:
            # The public API is in place; the native call takes separate buffers.
            _native_all_reduce(g, t, out, axis, op, algo)
        check(out, oracle(op, ranks, count), op, dt, what)
    elif coll == "all_gather":
        out = zeros(dt, count * p)
        if inplace and count:
            blk = out[gr * count : (gr + 1) * count]
            blk[:] = make(dt, values(ME, count))
            fourd.all_gather(out, blk, axis, algorithm=algo)
        else:
            fourd.all_gather(out, make(dt, values(ME, count)), axis, algorithm=algo)
        want = np.concatenate([values(r, count) for r in ranks]) if count else np.zeros(0)
        check(out, want, "sum", dt, what)
    else:
        inp = make(dt, values(ME, count * p))
        # In place: the output is this rank's block of the input (nccl-tests' convention).
        out = inp[gr * count : (gr + 1) * count] if inplace and count else zeros(dt, count)
        fourd.reduce_scatter(out, inp, axis, op, algorithm=algo)
        check(out, oracle(op, ranks, count * p)[gr * count : (gr + 1) * count], op, dt, what)


def _native_all_reduce(g, src, dst, axis, op, algo):
    """Out of place: src reduced into dst."""
    fourd.all_reduce(src, axis, op, output=dst, grid=g, algorithm=algo)


def cases():
    """Grid shapes x virtual topologies. Up to 4 ranks every pair; at 8 ranks (20 shapes, where
    a grid costs about a second to build on 2 cores) the topology rotates over the shapes."""
    out = []
    rpns = rpn_values(N)
    k = itertools.count()
    for j, sizes in enumerate(factorizations(N)):
        chosen = rpns if N <= 4 else [rpns[j % len(rpns)]]
        for rpn in chosen:
            i = next(k)
            out.append((sizes, ORDERS[i % len(ORDERS)], rpn, i))
    return out


@pytest.mark.parametrize(
    "case", cases(), ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}-rpn{c[2]}"
)
def test_sweep(case):
    sizes, order, rpn, k = case
    x, y, z, d = sizes
    g = fourd.init(x=x, y=y, z=z, data=d, order=order, ranks_per_node=rpn)
    # A few axes per grid (rotating), always including a combined one.
    axes = [AXES[(k + j) % len(AXES)] for j in range(3)]
    if not any(isinstance(a, tuple) or a == "world" for a in axes):
        axes.append(AXES[5 + k % 5])
    s = k * 7
    for axis in axes:
        p = g.size(axis)
        for coll in COLLECTIVES:
            sup = support(g, coll, axis)
            for algo in ALGOS:
                s += 1
                dt = DTYPES[s % len(DTYPES)]
                op = OPS[(s // 3) % len(OPS)] if coll != "all_gather" else "sum"
                if not legal(op, dt, p):
                    op = "max"
                count = COUNTS[(s // 2) % len(COUNTS)]
                inplace = (s // 5) % 2 == 0
                what = (
                    f"{algo} {coll} axis={axis} p={p} dtype={dt} op={op} count={count} "
                    f"inplace={inplace}"
                )
                ok, reason = sup[algo]
                if not ok and p > 1:
                    # An explicit request for an algorithm that cannot run here names the reason.
                    with pytest.raises(fourd.InvalidArgumentError, match="cannot run") as ei:
                        run_one(g, algo, coll, axis, dt, op, max(count, 1), inplace, what)
                    assert reason and reason in str(ei.value), (reason, str(ei.value))
                    continue
                run_one(g, algo, coll, axis, dt, op, count, inplace, what)
    fourd.barrier()
    fourd.finalize()


def test_large_counts_every_algorithm():
    """2**20+3 elements: several ring segments and shared-memory chunks, counts not divisible by
    the group, the rail or the node size. Each algorithm once, on the widest axis that runs it:
    first on two virtual nodes (hierarchical), then on the real node (shm)."""
    todo = list(ALGOS)
    for rpn in (max(1, N // 2), None):
        g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=rpn)
        for algo in list(todo):
            axis = next((a for a in ("world", "x") if support(g, "all_reduce", a)[algo][0]), None)
            if axis is None:
                continue
            todo.remove(algo)
            i = ALGOS.index(algo)
            p = g.size(axis)
            for j, coll in enumerate(COLLECTIVES):
                dt = [np.float32, torch.bfloat16, np.int32][(i + j) % 3]
                count = BIG if coll == "all_reduce" else BIG // p + 1
                run_one(
                    g, algo, coll, axis, dt, "sum", count, (i + j) % 2 == 0, f"{algo} {coll} {axis}"
                )
        fourd.finalize()
    assert not todo, todo


def test_shm_all_gather_every_placement():
    """shm's all_gather beyond its direct reads goes through the window when any rank is out of
    place and reads the peers directly when every rank is in place (the suites run it streamed
    from 64 KiB): all in place, all out of place, and rank 0 alone in place, each exact, twice
    in a row (the second call starts from the window's state after the first)."""
    g = fourd.init(ranks_per_node=None)
    if not support(g, "all_gather", "world")["shm"][0]:
        return
    for count in (1, 4099, BIG // N + 1):
        for placement in ("in", "out", "rank 0 in"):
            inplace = placement == "in" or (placement == "rank 0 in" and ME == 0)
            for rnd in range(2):
                what = f"shm all_gather count={count} {placement} place, call {rnd}"
                run_one(g, "shm", "all_gather", "world", np.int32, "sum", count, inplace, what)
    fourd.finalize()


def test_reduce_scatter_in_place_every_algorithm():
    """In place, the output is this rank's block of the input; ring, rhd, shm and hierarchical
    take it as it is, flat through scratch. Counts up to several pipeline chunks of
    hierarchical's two-level path (2 MiB each), on two virtual nodes and on the real one."""
    for rpn in (max(1, N // 2), None):
        g = fourd.init(ranks_per_node=rpn)
        for algo in ALGOS:
            if not support(g, "reduce_scatter", "world")[algo][0]:
                continue
            for count in (1, 7, BIG):
                what = f"{algo} rpn={rpn} count={count} in place"
                run_one(g, algo, "reduce_scatter", "world", np.int32, "sum", count, True, what)
        fourd.finalize()


def test_flat_small_calls_through_persistent_requests():
    """flat's calls of at most 8 KiB run through the MPI library's persistent requests, one per
    (collective, count, dtype, op), at most 32 per communicator (mpi_backend.cpp): 40 counts
    twice over, so slots are made, reused and evicted (the same one on every rank, or the
    calls would mismatch), each checked exactly, in place and out of place, against a dtype
    and an op that changes with the count."""
    g = fourd.init(ranks_per_node=max(1, N // 2))
    for rnd in range(2):
        for i, count in enumerate(range(1, 81, 2)):
            dt = [np.int32, np.float32, torch.bfloat16][(i + rnd) % 3]
            op = ["sum", "max"][i % 2]
            what = f"flat count={count} dtype={dt} op={op} round {rnd}"
            run_one(g, "flat", "all_reduce", "world", dt, op, count, i % 2 == 0, what)
            run_one(g, "flat", "all_gather", "world", dt, "sum", count, i % 2 == 1, what)
            run_one(g, "flat", "reduce_scatter", "world", dt, op, count, i % 2 == 0, what)
    fourd.finalize()


def test_accumulate_fp32_every_algorithm():
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=max(1, N // 2))
    for algo in ALGOS:
        for axis in ("x", "world"):
            ok, _ = support(g, "all_reduce", axis)[algo]
            if not ok and g.size(axis) > 1:
                continue
            t = make(torch.bfloat16, values(ME, 1001))
            fourd.all_reduce(t, axis, "avg", algorithm=algo, accumulate_fp32=True)
            check(t, oracle("avg", g.ranks(axis), 1001), "avg", torch.bfloat16, algo)
    fourd.finalize()


def test_auto_always_picks_a_supported_algorithm():
    sizes = [0, 1, 64, 4096, 65536, 2**20, 2**24, 2**28]
    for rpn in rpn_values(N) if N <= 4 else [None, 2, 3]:
        g = fourd.init(x=2 if N % 2 == 0 else 1, y=2 if N % 4 == 0 else 1, ranks_per_node=rpn)
        for mask in range(1, 16):
            axis = tuple(a for b, a in zip((1, 2, 4, 8), ("x", "y", "z", "data")) if mask & b)
            for coll in COLLECTIVES:
                for nbytes in sizes:
                    e = g.explain(coll, nbytes, axis)
                    rows = {r["algorithm"]: r for r in e["candidates"]}
                    assert e["choice"] in rows or g.size(axis) == 1, e
                    if g.size(axis) > 1:
                        assert rows[e["choice"]]["supported"], e
                    # The choice is the cheapest supported prediction.
                    best = min(r["predicted_s"] for r in rows.values() if r["candidate"])
                    if g.size(axis) > 1:
                        assert rows[e["choice"]]["predicted_s"] <= best * (1 + 1e-12), e
            # And `auto` runs there.
            t = make(np.int32, values(ME, 1001))
            fourd.all_reduce(t, axis, algorithm="auto")
            check(t, oracle("sum", g.ranks(axis), 1001), "sum", np.int32, f"auto {axis}")
        fourd.finalize()


def test_unsupported_algorithms_raise_with_the_reason():
    g = fourd.init(x=N)
    # One node (no virtual split): hierarchical has no inter-node level. Asked for by name it
    # runs its intra level alone (code written for a cluster runs on one machine), and explain
    # says so; auto leaves it out.
    if N > 1:
        t = make(np.int32, values(ME, 1001))
        fourd.all_reduce(t, "x", algorithm="hierarchical")
        check(t, oracle("sum", g.ranks("x"), 1001), "sum", np.int32, "hierarchical, one node")
        row = next(
            r
            for r in g.explain("all_reduce", 4004, "x")["candidates"]
            if r["algorithm"] == "hierarchical"
        )
        # Runnable by name (supported), never auto's choice (the model prices it out).
        assert row["supported"] and "intra-node level alone" in row["reason"], row
        assert g.explain("all_reduce", 4004, "x")["choice"] != "hierarchical"
    fourd.finalize()
    if N >= 2:
        g = fourd.init(x=N, ranks_per_node=1)  # every rank its own node: shm cannot span them
        with pytest.raises(fourd.InvalidArgumentError, match="shm.*cannot run.*nodes"):
            fourd.all_gather(np.zeros(2 * N, np.int64), np.ones(2, np.int64), "x", algorithm="shm")
        fourd.finalize()
    if N >= 4:
        g = fourd.init(x=N, ranks_per_node=3)  # uneven nodes
        with pytest.raises(fourd.InvalidArgumentError, match="hierarchical.*different numbers"):
            fourd.reduce_scatter(
                np.zeros(1, np.int32), np.ones(N, np.int32), "x", algorithm="hierarchical"
            )
        fourd.finalize()
    del g


def _axes_for(g, algo):
    out = []
    for axis in ("x", "data", "world", ("x", "data")):
        ok, _ = support(g, "all_reduce", axis)[algo]
        if ok or g.size(axis) == 1:
            out.append(axis)
    return out


@pytest.mark.parametrize("algo", ALGOS)
def test_async_in_flight_on_several_axes(algo):
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    axes = _axes_for(g, algo)
    assert axes, f"{algo} runs on none of the axes of this grid"
    works, bufs = [], []
    for i in range(12):
        axis = axes[i % len(axes)]
        t = torch.full((20_001,), float(ME + 1 + i), dtype=torch.float64)
        works.append(fourd.all_reduce(t, axis, algorithm=algo, async_op=True))
        bufs.append((axis, t, i))
        o = torch.zeros(3 * g.size(axis), dtype=torch.int32)
        works.append(
            fourd.all_gather(
                o, torch.full((3,), ME, dtype=torch.int32), axis, algorithm=algo, async_op=True
            )
        )
        bufs.append((axis, o, -1))
    for w in works:
        w.wait(timeout=120)
        assert w.is_completed()
    for axis, t, i in bufs:
        if i >= 0:
            assert torch.all(t == sum(r + 1 + i for r in g.ranks(axis))), (algo, axis, i)
        else:
            want = torch.tensor([r for r in g.ranks(axis) for _ in range(3)], dtype=torch.int32)
            assert torch.equal(t, want), (algo, axis)
    fourd.finalize()


@pytest.mark.parametrize("algo", ALGOS)
def test_async_completes_while_caller_only_polls(algo):
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    for axis in _axes_for(g, algo)[:2]:
        t = torch.full((300_001,), float(ME + 1), dtype=torch.float32)
        w = fourd.all_reduce(t, axis, algorithm=algo, async_op=True)
        deadline = time.monotonic() + 120
        while not w.is_completed():
            assert time.monotonic() < deadline, f"{algo} on {axis} never completed"
            time.sleep(0.005)
        w.wait()
        assert torch.all(t == sum(r + 1 for r in g.ranks(axis))), (algo, axis)
    fourd.finalize()


@pytest.mark.parametrize("algo", ALGOS)
def test_async_issue_order_per_group(algo):
    """sum, prod, sum on one buffer: any reordering gives a different result."""
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    for axis in _axes_for(g, algo):
        p = g.size(axis)
        ranks = g.ranks(axis)
        t = torch.full((4097,), ME + 1, dtype=torch.int64)
        works = [
            fourd.all_reduce(t, axis, op, algorithm=algo, async_op=True)
            for op in ("sum", "prod", "sum", "max")
        ]
        # Another axis in flight meanwhile.
        other = torch.full((999,), ME + 1, dtype=torch.int64)
        wo = fourd.all_reduce(other, "world", algorithm="auto", async_op=True)
        for w in works:
            w.wait(timeout=120)
        wo.wait(timeout=120)
        s = sum(r + 1 for r in ranks)
        want = p * s**p
        assert torch.all(t == want), (algo, axis, int(t[0]), want)
        assert torch.all(other == sum(r + 1 for r in range(N)))
    fourd.finalize()


# ---- auto's tuning in use (cpp/src/internal/tuner.hpp) ----------------------------------------


def _tied_profile(g, calls):
    """Gives the grid a profile under which, for each (axis, nbytes, in_place, dtype) of
    `calls`, every supported algorithm is predicted alike for that all_reduce (measured
    corrections of the model), so that tuning has rivals to try. Returns the profile to
    restore."""
    saved = g.profile
    g.set_profile({"corrections": []})
    corr = []
    for axis, nbytes, in_place, dtype in calls:
        rows = [
            r
            for r in g.explain("all_reduce", nbytes, axis, dtype, in_place)["candidates"]
            if r["candidate"]
        ]
        best = min(r["predicted_s"] for r in rows)
        corr += [
            {
                "collective": "all_reduce",
                "algorithm": r["algorithm"],
                "group_size": g.size(axis),
                "nodes": g.topology(axis)["num_nodes"],
                "half16": False,
                "in_place": in_place,
                "nbytes": float(nbytes),
                "factor": best / r["predicted_s"],
            }
            for r in rows
        ]
    g.set_profile({"corrections": corr})
    return saved


def _agreed_by_my_group(g, axis, value):
    everyone = WORLD.allgather(value)
    return all(everyone[r] == value for r in g.ranks(axis))


def test_a_switchs_recheck_comes_after_10_s_of_calls_at_the_slowest_ranks_call_period(
    monkeypatch,
):
    """A switch (here seeded, so that it does not depend on the machine's timings) times the
    program's calls of its size: after 4 intervals, one MAX all-reduce makes the period common,
    and the re-check comes once the switch has run the calls that span 10 s at that period.
    Rank 0 alone waits 0.25 s before each call; the others call at once (they wait inside the
    collective, so rank 0's pace is theirs too), and every member counts the same calls:
    ceil(10 s / the period), at most 40."""
    monkeypatch.setenv("FOURD_TUNE", "on")
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    axis = "world"
    if g.size(axis) == 1:
        return
    count = 1021  # below 256 KiB: every supported algorithm is a candidate
    nbytes = 4 * count
    saved = _tied_profile(g, [(axis, nbytes, True, "int32")])
    try:
        want = oracle("sum", g.ranks(axis), count)

        def call(what):
            t = make(np.int32, values(ME, count))
            fourd.all_reduce(t, axis, algorithm="auto")
            check(t, want, "sum", np.int32, what)
            return g.explain("all_reduce", nbytes, axis, "int32", True)["tuning"]

        for i in range(2):  # seen once, then explored and decided
            tu = call(f"call {i}")
        cands = tu["candidates"]
        assert len(cands) >= 2, tu
        comm = g._comm_for(axis)
        figures = [2.0, 1.0] + [3.0] * (len(cands) - 2)
        assert comm.seed_tuning([("all_reduce", nbytes, "int32", cands[1], 0, cands, figures)]) == 1
        tu = call("the seeded switch's first call")
        e = tu["explore_calls"]
        assert tu["state"] == "provisional" and tu["recheck_gap"] == 4 * e, tu
        assert tu["call_period_s"] == 0, tu  # one call: no interval yet
        for i in range(4):  # four intervals, the last call agrees on them
            if ME == 0:
                time.sleep(0.25)
            tu = call(f"the switch's call {i + 2}")
        p = tu["call_period_s"]
        assert 0.25 <= p < 30, tu
        gap = min(4 * e, max(5, math.ceil(10.0 / p)))
        assert gap <= 40 and tu["recheck_gap"] == gap, tu
        assert _agreed_by_my_group(g, axis, (p, gap)), tu
        states = []
        for i in range(5, gap):  # the rest of the gap: still the switch
            states.append(call(f"the switch's call {i + 1}")["state"])
        assert states == ["provisional"] * (gap - 5), states
        tu = call("the call that re-checks it")
        assert tu["state"] == "settled" and tu["settled"] in cands, tu
        assert _agreed_by_my_group(g, axis, (tu["settled"], tu["measured_s"])), tu
    finally:
        g.set_profile(saved)


@pytest.mark.parametrize(
    "count,warm,timed,mode",
    [(2**16 + 5, 2, 12, "on"), (1021, 16, 64, "on"), (1021, 16, 64, "inline")],
)
def test_auto_tuning_in_use_settles_alike_on_every_rank(count, warm, timed, mode, monkeypatch):
    # on (the default): the first call of a size runs the model's choice, the whole
    # exploration runs inside the second; inline: one step of it per call
    monkeypatch.setenv("FOURD_TUNE", mode)
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    # int32: just over 256 KiB (2 untimed calls, then 12 timed ones: tuner.hpp's floor and cap),
    # or just under 4 KiB (below 256 KiB: 16 untimed and 64 timed calls)
    nbytes = 4 * count
    axes = [a for a in ("x", "world") if g.size(a) > 1]
    for axis in axes:
        saved = _tied_profile(g, [(axis, nbytes, True, "int32")])
        model = g.explain("all_reduce", nbytes, axis, "int32", True)
        assert model["tuning"]["state"] == "not yet run", model["tuning"]
        states = []
        inputs = [make(np.int32, values(ME, count, j)) for j in range(3)]  # period 3
        wants = [oracle("sum", g.ranks(axis), count, j) for j in range(3)]
        for i in range(4000):
            t = inputs[i % 3].copy()
            fourd.all_reduce(t, axis, algorithm="auto")
            check(t, wants[i % 3], "sum", np.int32, f"auto {axis} #{i}")
            tu = g.explain("all_reduce", nbytes, axis, "int32", True)["tuning"]
            states.append(tu["state"])
            if tu["state"] == "settled":
                break
        cands = tu["candidates"]
        assert cands[0] == model["choice"] and 2 <= len(cands) <= 4, tu
        # Two passes; a candidate gets its untimed and timed calls in each, upfront from 256
        # KiB once out of place and once in place.
        e = tu["explore_calls"]
        placements = 2 if mode == "on" and nbytes >= 256 * 1024 else 1
        assert e == 2 * len(cands) * placements * (warm + timed), tu
        # A switch runs 4 explorations' calls before its re-check, or fewer that span 10 s at
        # its call period (the group's MAX of what each rank measured over the switch's calls
        # after the deciding one: 4 intervals).
        period = tu["call_period_s"]
        switched = "provisional" in states
        assert period > 0 if switched else period == 0, (tu, states)
        gap = min(4 * e, max(5, math.ceil(10.0 / period))) if switched else 4 * e
        assert tu["recheck_gap"] == gap, (tu, states.count("provisional"))
        if mode == "on" and states[1] == "settled":  # the model's choice kept: final at once
            assert states == ["seen once", "settled"], (states, cands)
        elif mode == "on":  # a switch runs provisionally, then the exploration runs again in
            # one call before it is final (which may keep it, or return to the model's choice)
            assert states == ["seen once"] + ["provisional"] * gap + ["settled"], (
                states,
                cands,
            )
        elif states[e - 1] == "settled":
            assert states == ["exploring"] * (e - 1) + ["settled"], (states, cands)
        else:
            assert states == ["exploring"] * (e - 1) + ["provisional"] * (gap + 1) + [
                "rechecking"
            ] * (e - 1) + ["settled"], (states, cands)
        assert len(tu["measured_s"]) == len(cands) and all(s > 0 for s in tu["measured_s"]), tu
        assert tu["settled"] in cands
        # The group's common times (a MAX all-reduce): every member settles alike, split or not
        # (a split key runs another algorithm where every rank calls in place).
        split = tu["placement_agreed"]
        assert split == (tu["settled_in_place"] is not None), tu
        assert placements == 2 or not split, tu
        in_place = tu["settled_in_place"] if split else tu["settled"]
        assert _agreed_by_my_group(
            g,
            axis,
            (tu["settled"], in_place, tu["measured_s"], tu["call_period_s"], tu["recheck_gap"]),
        ), tu
        assert g.explain("all_reduce", nbytes, axis, "int32", True)["choice"] == in_place
        assert g.algorithm_for("all_reduce", nbytes, axis, "int32", True) == in_place
        # The out-of-place call shares the key the in-place one tuned.
        oop = g.explain("all_reduce", nbytes, axis, "int32")
        assert oop["tuning"]["state"] == "settled" and oop["choice"] == tu["settled"], oop
        for i in range(3):  # later calls run the settled algorithm, exact
            t = make(np.int32, values(ME, count, 50 + i))
            fourd.all_reduce(t, axis, algorithm="auto")
            check(
                t, oracle("sum", g.ranks(axis), count, 50 + i), "sum", np.int32, f"{axis} settled"
            )
        g.set_profile(saved)
        # A new profile prices the shortlists anew.
        assert (
            g.explain("all_reduce", nbytes, axis, "int32", True)["tuning"]["state"] == "not yet run"
        )
    # A call that moves nothing has nothing to time.
    assert g.explain("all_reduce", 0, "world")["tuning"]["state"] == "off"
    fourd.finalize()


def test_a_key_split_by_placement_agrees_on_it_per_call_and_stays_exact():
    """A split key (seeded here, so that it does not depend on the machine's timings) runs one
    algorithm where every rank calls in place and another otherwise, agreed per call: every
    collective stays exact in place, out of place, and with the ranks' placements mixed (rank 0
    in place, the others out of place), and never hangs."""
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    axis = "world"
    p, gr = g.size(axis), g.rank(axis)
    comm = g._comm_for(axis)
    for coll in COLLECTIVES:
        count = 2**16 + 3  # int32 just over 256 KiB per rank's block
        nb = 4 * count * (1 if coll == "all_reduce" else p)
        for i in range(2):  # seen once, then explored: the shortlist a seed must come from
            run_one(g, "auto", coll, axis, np.int32, "max", count, False, f"{coll} {i}")
        cands = g.explain(coll, nb, axis, "int32")["tuning"]["candidates"]
        if len(cands) < 2:
            continue
        out_alg, in_alg = cands[0], cands[1]
        assert comm.seed_tuning([(coll, nb, "int32", out_alg, in_alg)]) == 1
        tu = g.explain(coll, nb, axis, "int32", True)["tuning"]
        assert tu["placement_agreed"] and tu["settled_in_place"] == in_alg, tu
        assert tu["settled"] == out_alg, tu
        assert g.explain(coll, nb, axis, "int32", True)["choice"] == in_alg
        assert g.explain(coll, nb, axis, "int32")["choice"] == out_alg
        for i, mode in enumerate(("in", "out", "mixed", "in", "mixed", "out")):
            inplace = mode == "in" or (mode == "mixed" and gr == 0)
            what = f"split {coll}: {out_alg} / {in_alg} in place, call {i} ({mode})"
            run_one(g, "auto", coll, axis, np.int32, "max", count, inplace, what)
        saved = [c for c in comm.tuned_calls() if c[:3] == (coll, nb, "int32")]
        assert saved == [(coll, nb, "int32", out_alg, in_alg)], saved
    fourd.finalize()


def test_auto_exploration_in_the_second_call_leaves_every_placement_exact():
    """The second call of a size explores every candidate on buffers that leave its result
    as one run would (operation.cpp, trialSpec): its own output must still be exact, in place
    and out of place, for each collective, and the calls after it settled."""
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    cases = itertools.product(
        [a for a in ("x", "world") if g.size(a) > 1], COLLECTIVES, (True, False)
    )
    for i, (axis, coll, inplace) in enumerate(cases):
        # A size of its own per case (placement shares a size's tuning), about 2 KiB of int32:
        # below 256 KiB every supported algorithm is explored.
        count = 509 + 2 * i
        p, gr = g.size(axis), g.rank(axis)
        nb = 4 * count * (1 if coll == "all_reduce" else p)
        assert g.explain(coll, nb, axis, "int32", inplace)["tuning"]["state"] == "not yet run"
        states = []
        for call in ("first", "second, which explores"):
            what = f"auto {coll} {axis} in_place={inplace} (the {call} call)"
            if coll == "reduce_scatter" and inplace:
                inp = make(np.int32, values(ME, count * p))
                mine = inp[gr * count : (gr + 1) * count]
                fourd.reduce_scatter(mine, inp, axis, "max")
                want = oracle("max", g.ranks(axis), count * p)[gr * count : (gr + 1) * count]
                check(mine, want, "max", np.int32, what)
            else:
                run_one(g, "auto", coll, axis, np.int32, "max", count, inplace, what)
            states.append(g.explain(coll, nb, axis, "int32", inplace)["tuning"]["state"])
        tu = g.explain(coll, nb, axis, "int32", inplace)["tuning"]
        assert states[0] in ("seen once", "single"), (what, states)
        assert tu["state"] in ("settled", "provisional", "single"), (what, tu)
        assert _agreed_by_my_group(g, axis, (tu["state"], tu["settled"])), tu
        run_one(g, "auto", coll, axis, np.int32, "max", count, inplace, what + ", again")
    # From 256 KiB the exploration also runs the other placement than the call's, on buffers
    # of its own (from 2 MiB paged as the call's are: huge pages or not): the call's result
    # stays exact.
    cases = itertools.product((2**16 + 7, 2**19 + 5), COLLECTIVES, (True, False))
    for i, (base, coll, inplace) in enumerate(cases):
        axis = "world"
        count = base + 2 * i
        p = g.size(axis)
        if p == 1:
            break
        nb = 4 * count * (1 if coll == "all_reduce" else p)
        for call in ("first", "second, which explores both placements", "third"):
            what = f"auto {coll} {axis} in_place={inplace} (the {call} call)"
            run_one(g, "auto", coll, axis, np.int32, "max", count, inplace, what)
        tu = g.explain(coll, nb, axis, "int32", inplace)["tuning"]
        assert tu["state"] in ("settled", "provisional", "single"), (what, tu)
        if tu["state"] != "single":
            # 2 untimed calls below 4 MiB (from 4 MiB, 2-6 that carry 96 MiB), then timed ones
            # that carry 12 MiB (3-12).
            warm = 2 if nb < 4 << 20 else min(6, max(2, math.ceil((96 << 20) / nb)))
            timed = min(12, max(3, math.ceil((12 << 20) / nb)))
            assert tu["explore_calls"] == 2 * 2 * len(tu["candidates"]) * (warm + timed), tu
        assert _agreed_by_my_group(g, axis, (tu["settled"], tu["settled_in_place"])), tu
    fourd.finalize()


def test_auto_tuning_with_operations_in_flight_on_several_axes():
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    count = 2**18 + 7
    nbytes = 8 * count
    axes = [a for a in ("x", "data", "world") if g.size(a) > 1]
    if not axes:
        fourd.finalize()
        return
    saved = _tied_profile(g, [(axis, nbytes, True, "float64") for axis in axes])
    works, bufs = [], []
    for i in range(22 * len(axes)):
        axis = axes[i % len(axes)]
        t = torch.full((count,), float(ME + 1 + i), dtype=torch.float64)
        works.append(fourd.all_reduce(t, axis, algorithm="auto", async_op=True))
        bufs.append((axis, t, i))
    # Issue order per group holds through the tuning: sum, prod, sum, max on one buffer.
    t = torch.full((count,), ME + 1, dtype=torch.int64)
    ordered = [
        fourd.all_reduce(t, axes[0], op, algorithm="auto", async_op=True)
        for op in ("sum", "prod", "sum", "max")
    ]
    for w in works + ordered:
        w.wait(timeout=180)
        assert w.is_completed()
    for axis, buf, i in bufs:
        assert torch.all(buf == sum(r + 1 + i for r in g.ranks(axis))), (axis, i)
    p = g.size(axes[0])
    assert torch.all(t == p * sum(r + 1 for r in g.ranks(axes[0])) ** p)
    for axis in axes:
        tu = g.explain("all_reduce", nbytes, axis, "float64", True)["tuning"]
        assert tu["state"] in ("exploring", "provisional", "settled"), (axis, tu)
        assert _agreed_by_my_group(g, axis, (tu["state"], tu["settled"], tu["measured_s"])), tu
    g.set_profile(saved)
    fourd.finalize()


def test_auto_tuning_off_with_FOURD_TUNE_0(monkeypatch):
    monkeypatch.setenv("FOURD_TUNE", "0")
    g = fourd.init(x=2 if N % 2 == 0 else 1, ranks_per_node=2)
    count = 2**18 + 5
    for i in range(3):
        t = make(np.int32, values(ME, count, i))
        fourd.all_reduce(t, "world", algorithm="auto")
        check(t, oracle("sum", g.ranks("world"), count, i), "sum", np.int32, "FOURD_TUNE=0")
    e = g.explain("all_reduce", 4 * count, "world", "int32", True)
    assert e["tuning"]["state"] == "off" or N == 1, e["tuning"]
    fourd.finalize()
