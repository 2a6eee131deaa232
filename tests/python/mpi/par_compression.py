"""Multi-rank tests of compressed collectives (docs/compression.md).

Lossless codecs: exact results on integer-valued data for every collective, algorithm and
dtype they take. Lossy codecs: the error against the float64 oracle within the documented
bound (fourd._C.codec_bound composed as docs/compression.md says), on integer and random
data, and the same result on every rank. Counts 0, 1, odd, not divisible by the group, and
large. Also: the per-axis policy compresses the calls it names and only those, FOURD_COMPRESSION
replaces it, bad codec strings fail before any communication, and ranks that disagree raise
MismatchError instead of hanging.
"""

import hashlib
import itertools
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

import fourd
from fourd import _C

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter"]
LOSSLESS = ["lossless", "lossless:zstd", "zfp:reversible"]
LOSSY = ["zfp:rate=8", "zfp:rate=16", "zfp:tol=1e-3", "int8", "int8:block=64", "bf16"]
COUNTS = [0, 1, 7, 13, 1001, 2**16 + 3]
DT_CODE = {np.float32: 0, np.float64: 1, np.int32: 6, np.int64: 7, np.int8: 4}


def rpn_values():
    return [None] + [r for r in (1, 2) if r < N and N % r == 0]


@pytest.fixture(autouse=True)
def _finalize():
    yield
    fourd.finalize()


def ints(rank, count, dtype):
    """Integer values 1..4 (exact in every dtype and in every sum of up to 8 ranks)."""
    pattern = np.array([(rank + 1 + i % 3) % 4 + 1 for i in range(3)], np.float64)
    return np.resize(pattern, count).astype(dtype)


def randoms(rank, count, dtype):
    rng = np.random.default_rng(1234 + rank)
    return rng.standard_normal(count).astype(dtype)


def expected(coll, inputs, me, count):
    """float64 oracle of a sum over the group of `inputs` (one array per group rank)."""
    stack = np.stack([a.astype(np.float64) for a in inputs])
    if coll == "all_reduce":
        return stack.sum(0)
    if coll == "all_gather":
        return np.concatenate(list(stack))
    return stack.sum(0)[me * count : (me + 1) * count]


def run(g, coll, axis, x, count, codec, algorithm):
    p = g.size(axis)
    if coll == "all_reduce":
        out = x.copy()
        fourd.all_reduce(out, axis, grid=g, compression=codec, algorithm=algorithm)
    elif coll == "all_gather":
        out = np.empty(count * p, x.dtype)
        fourd.all_gather(out, x, axis, grid=g, compression=codec, algorithm=algorithm)
    else:
        out = np.empty(count, x.dtype)
        fourd.reduce_scatter(out, x, axis, grid=g, compression=codec, algorithm=algorithm)
    return out


def chain_of(g, axis, algorithm):
    """(hops of the codec's chain, fan-in before it): hierarchical across nodes compresses the
    rail level (its inputs are intra-node sums of k ranks); otherwise the whole group's ring."""
    t = g.topology(axis)
    if algorithm in ("auto", "hierarchical") and t["num_nodes"] > 1 and t["uniform"]:
        return t["num_nodes"] - 1, t["k"]
    return g.size(axis) - 1, 1


def bound(codec, dtype, coll, g, axis, algorithm, absmax):
    chain, fan_in = chain_of(g, axis, algorithm)
    code = DT_CODE[dtype]
    if coll == "all_gather":
        return _C.codec_bound(codec, code, 0, absmax, True)
    return _C.codec_bound(codec, code, chain, fan_in * absmax, coll == "all_reduce")


def same_on_every_rank(g, axis, out):
    """Whether every member of my group along `axis` holds the same bytes (collective over
    the world)."""
    mine = (tuple(g.ranks(axis)), hashlib.sha1(out.tobytes()).hexdigest())
    return all(h == mine[1] for ranks, h in WORLD.allgather(mine) if ranks == mine[0])


def shapes():
    for rpn in rpn_values():
        yield rpn, (1, 1, 1, N), "data"
        if N >= 4:
            yield rpn, (2, 1, 1, N // 2), ("x", "data")


def test_lossless_codecs_are_exact():
    cases = itertools.product(shapes(), LOSSLESS, COLLECTIVES, ["ring", "hierarchical", "flat"])
    dtypes = itertools.cycle([np.float32, np.float64, np.int32, np.int64, np.int8])
    # Large: several segments per ring step (test_parallel runs this suite with 64 KiB
    # segments, FOURD_RING_SEGMENT_BYTES, so the count that shows it stays cheap to check).
    counts = itertools.cycle([*COUNTS, 2**18 + 3])
    grids = {}
    for (rpn, sizes, axis), codec, coll, algo in cases:
        dtype = next(dtypes)
        if codec.startswith("zfp") and dtype not in (np.float32, np.float64):
            dtype = np.float64
        if dtype == np.int8 and coll != "all_gather":
            dtype = np.int32  # int8 sums of 8 ranks stay exact, but keep the oracle simple
        key = (rpn, sizes)
        if key not in grids:
            fourd.finalize()
            grids = {key: fourd.init(*sizes, ranks_per_node=rpn)}
        g = grids[key]
        count = next(counts)
        me, ranks = g.rank(axis), g.ranks(axis)
        n_in = count * g.size(axis) if coll == "reduce_scatter" else count
        inputs = [ints(r, n_in, dtype) for r in ranks]
        out = run(g, coll, axis, inputs[me].copy(), count, codec, algo)
        want = expected(coll, inputs, me, count)
        assert np.array_equal(out.astype(np.float64), want), (codec, coll, algo, dtype, count, rpn)


def check_lossy(g, axis, codec, coll, algo, dtype, count, data):
    me, ranks = g.rank(axis), g.ranks(axis)
    n_in = count * g.size(axis) if coll == "reduce_scatter" else count
    inputs = [data(r, n_in, dtype) for r in ranks]
    out = run(g, coll, axis, inputs[me].copy(), count, codec, algo)
    want = expected(coll, inputs, me, count)
    absmax = max(float(np.abs(a).max()) if a.size else 0.0 for a in inputs)
    # The codec's bound plus the rounding of the sum itself in `dtype`.
    eps = float(np.finfo(dtype).eps)
    b = bound(codec, dtype, coll, g, axis, algo, absmax) + 2 * len(ranks) ** 2 * absmax * eps
    err = float(np.abs(out.astype(np.float64) - want).max()) if out.size else 0.0
    assert err <= b, (codec, coll, algo, dtype, count, err, b)
    if coll != "reduce_scatter":
        assert same_on_every_rank(g, axis, out), (codec, coll, algo)
    return err


def test_lossy_codecs_within_their_bound():
    cases = itertools.product(shapes(), LOSSY, COLLECTIVES, ["ring", "hierarchical"])
    counts = itertools.cycle(COUNTS)
    datas = itertools.cycle([randoms, ints])
    dtypes = itertools.cycle([np.float32, np.float64])
    key = None
    errors = {}
    for (rpn, sizes, axis), codec, coll, algo in cases:
        if key != (rpn, sizes):
            fourd.finalize()
            g = fourd.init(*sizes, ranks_per_node=rpn)
            key = (rpn, sizes)
        data = next(datas)
        err = check_lossy(g, axis, codec, coll, algo, next(dtypes), next(counts), data)
        if data is randoms:
            errors[codec] = max(errors.get(codec, 0.0), err)
    # A lossy codec that changed nothing on random data was not applied.
    for codec, err in errors.items():
        assert err > 0, f"{codec} left random data unchanged: not applied"


def test_int8_takes_half_precision_inputs():
    g = fourd.init(1, 1, 1, N, ranks_per_node=1 if N > 1 else None)
    t = torch.tensor(randoms(ME, 4099, np.float32)).to(torch.bfloat16)
    ref = [torch.tensor(randoms(r, 4099, np.float32)).to(torch.bfloat16) for r in range(N)]
    fourd.all_reduce(t, "data", grid=g, compression="int8")
    want = torch.stack([r.double() for r in ref]).sum(0)
    absmax = max(float(r.double().abs().max()) for r in ref)
    b = _C.codec_bound("int8", 3, N - 1, absmax, True) + 2 * N * absmax * 2**-8 * N
    assert float((t.double() - want).abs().max()) <= b


def test_policy_compresses_only_what_it_names():
    if N < 2:
        pytest.skip("needs 2 ranks: a policy compresses only groups that span nodes")
    g = fourd.init(1, 1, 1, N, ranks_per_node=1, compression={"data": "int8"})
    e = fourd.explain("all_reduce", 1 << 20, "data", grid=g)
    assert e["compression"]["codec"] == "int8:block=256", e["compression"]
    # a call with a named codec runs the codec's algorithm: tuning says so, and never runs
    assert e["tuning"]["state"] == "compressed", e["tuning"]
    assert e["tuning"]["codec"] == "int8:block=256", e["tuning"]
    raw = fourd.explain("all_reduce", 1 << 20, "data", grid=g, compression="none")["tuning"]
    assert raw["state"] == "not yet run", raw
    x = randoms(ME, 10007, np.float32)
    inputs = [randoms(r, 10007, np.float32) for r in range(N)]
    y = x.copy()
    fourd.all_reduce(y, "data", grid=g)
    want = np.stack([a.astype(np.float64) for a in inputs]).sum(0)
    assert float(np.abs(y - want).max()) > 1e-4  # the codec ran: int8's error is visible
    assert g.tuning("all_reduce", 4 * 10007, "data")["state"] == "compressed"
    z = x.copy()
    fourd.all_reduce(z, "data", grid=g, compression="none")  # the argument wins
    assert float(np.abs(z - want).max()) < 1e-4
    ints_ = ints(ME, 999, np.int64)
    fourd.all_reduce(ints_, "data", grid=g)  # int8 takes no int64: runs uncompressed, exact
    assert np.array_equal(
        ints_, expected("all_reduce", [ints(r, 999, np.int64) for r in range(N)], 0, 999)
    )
    fourd.finalize()
    # One node: the policy compresses nothing (no slow link); explain says why.
    g = fourd.init(1, 1, 1, N, compression={"data": "int8"})
    if g.topology("data")["num_nodes"] == 1:
        e = fourd.explain("all_reduce", 1 << 20, "data", grid=g)
        assert e["compression"]["codec"] is None and "one node" in e["compression"]["note"]
        assert e["tuning"]["state"] != "compressed", e["tuning"]
        y = x.copy()
        fourd.all_reduce(y, "data", grid=g)
        assert float(np.abs(y - want).max()) < 1e-4


def test_presets_and_policy_text():
    assert _C.compression_policy("mzhybrid") == "data=zfp:rate=8;x,y,z=lossless:lz4"
    assert _C.policy_codec("mzhybrid", "x") == "lossless:lz4"
    assert _C.policy_codec("mzhybrid", "data") == "zfp:rate=8"
    assert _C.policy_codec("mzhybrid", "z+data") is None
    assert _C.policy_codec("zhybrid", "y") == "zfp:rate=16"
    text = fourd.grid.compression_policy({"data": "int8", ("x", "y", "z"): "lossless"})
    assert text == "data=int8:block=256;x,y,z=lossless:lz4"


def test_environment_replaces_the_policy():
    if N < 2:
        pytest.skip("needs 2 ranks")
    os.environ["FOURD_COMPRESSION"] = "none"
    try:
        g = fourd.init(1, 1, 1, N, ranks_per_node=1, compression={"data": "int8"})
        assert fourd.explain("all_reduce", 1 << 20, "data", grid=g)["compression"]["codec"] is None
        fourd.finalize()
        os.environ["FOURD_COMPRESSION"] = "data=bf16"
        g = fourd.init(1, 1, 1, N, ranks_per_node=1)
        c = fourd.explain("all_reduce", 1 << 20, "data", grid=g)["compression"]
        assert c["codec"] == "bf16" and c["source"] == "FOURD_COMPRESSION"
    finally:
        del os.environ["FOURD_COMPRESSION"]


BAD = [
    ("zfp:rate=0", "rate"),
    ("zfp:rate=65", "rate"),
    ("zfp:tol=-1e-3", "tol"),
    ("zfp:tol=nan", "tol"),
    ("int8:block=3", "block"),
    ("gzip", "gzip"),
    ("zfp:speed=3", "speed"),
]


@pytest.mark.parametrize("codec,word", BAD)
def test_bad_codecs_fail_before_any_communication(codec, word):
    g = fourd.init(1, 1, 1, N)
    if ME == 0:  # only rank 0 calls: an error after any communication would hang it
        with pytest.raises(fourd.InvalidArgumentError, match=word):
            fourd.all_reduce(np.ones(100, np.float32), "data", grid=g, compression=codec)
    WORLD.Barrier()


@pytest.mark.parametrize(
    "codec,dtype", [("zfp:rate=8", np.int32), ("bf16", np.int64), ("int8", np.int32)]
)
def test_a_codec_on_a_dtype_it_cannot_take(codec, dtype):
    g = fourd.init(1, 1, 1, N)
    if ME == 0:
        with pytest.raises(fourd.InvalidArgumentError, match="compression"):
            fourd.all_reduce(np.ones(100, dtype), "data", grid=g, compression=codec)
    WORLD.Barrier()
    with pytest.raises(fourd.InvalidArgumentError, match="rate"):
        fourd.init(1, 1, 1, N, compression={"data": "zfp:rate=0"})


def test_ranks_with_different_policies_raise_mismatch():
    if N < 2:
        pytest.skip("needs 2 ranks")
    policy = {"data": "int8"} if ME == 0 else {"data": "bf16"}
    with pytest.raises(fourd.MismatchError, match="compression"):
        fourd.init(1, 1, 1, N, compression=policy)


def test_ranks_calling_different_codecs_raise_mismatch_in_debug_mode():
    if N < 2:
        pytest.skip("needs 2 ranks")
    g = fourd.init(1, 1, 1, N, debug=True, timeout=60)
    with pytest.raises(fourd.MismatchError, match="compression"):
        fourd.all_reduce(
            np.ones(1000, np.float32), "data", grid=g, compression="int8" if ME == 0 else "bf16"
        )


def test_auto_is_exact_and_explained():
    g = fourd.init(1, 1, 1, N, ranks_per_node=1 if N > 1 else None)
    for count in (0, 5, 100003):
        x = ints(ME, count, np.float32)
        fourd.all_reduce(x, "data", grid=g, compression="auto")
        assert np.array_equal(
            x, expected("all_reduce", [ints(r, count, np.float32) for r in range(N)], 0, count)
        )
    c = fourd.explain("all_reduce", 1 << 24, "data", grid=g, compression="auto")["compression"]
    assert c["codec"] == "auto" and "auto decides" in c["where"]


def test_async_compressed_calls_complete_in_order():
    g = fourd.init(1, 1, 1, N, ranks_per_node=1 if N > 1 else None)
    xs = [ints(ME, 5000 + i, np.float32) for i in range(4)]
    works = [
        fourd.all_reduce(x, "data", grid=g, compression=c, async_op=True)
        for x, c in zip(xs, ["lossless", "int8", "zfp:reversible", "none"])
    ]
    for w in works:
        w.wait()
    for i, x in enumerate(xs):
        want = expected("all_reduce", [ints(r, 5000 + i, np.float32) for r in range(N)], 0, 0)
        if i == 1:
            assert float(np.abs(x - want).max()) <= 4 * N * N / 254 + 1e-3
        else:
            assert np.array_equal(x, want)
