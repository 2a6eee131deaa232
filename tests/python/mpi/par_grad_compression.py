"""Multi-rank tests of compressed gradient synchronisation (fourd.nn.sync_gradients and the
overlap's grad_reduce with compression= and error_feedback=; fourd/nn/grad_sync.py).

- Lossless codecs give bit-identical gradients to the uncompressed reduction, on integer-valued
  gradients (sums exact in float32 and float64), plain and overlapped; error feedback on a
  lossless codec, or with no codec at all, changes nothing.
- int8: the averaged gradients are within the documented bound of the compressed ring
  (fourd._C.codec_bound, docs/compression.md: chain of Gdata - 1 hops plus the all-gather) of
  the exact float64 mean, and the codec really ran (the error is not 0).
- Error feedback: every step all-reduces the same fixed, non-constant gradient g (the same
  on every rank, so the exact mean is g). Without feedback int8's rounding of g is the same
  every step, so the running mean of the reduced gradients keeps that error; with feedback
  the residual of each rank's own encoding is added to the next step and the running mean
  converges towards g. Over 20 steps the relative L2 error of the running mean with feedback
  is at most half the error without it, on the plain path, the overlapped path and with the
  grid's policy naming the codec (ranks_per_node=1 makes the group span "nodes").
- Residuals start at zero when the buckets are rebuilt (a new bucket size).
- Bad arguments raise fourd.InvalidArgumentError before any communication (only rank 0 calls:
  an error after communicating would leave it waiting).
"""

import zlib

import pytest
import torch
from mpi4py import MPI

import fourd
import fourd.nn as fnn
from fourd import _C

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()
STEPS = 20
SHAPES = {"w1": ((3000,), torch.float32), "w2": ((40, 25), torch.float32)}
SHAPES64 = {"w3": ((777,), torch.float64)}
DT_CODE = {torch.float32: 0, torch.float64: 1}


class Params(torch.nn.Module):
    """Bare parameters; forward() makes each one's gradient the fixed tensor given for it."""

    def __init__(self, shapes):
        super().__init__()
        for name, (shape, dtype) in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape, dtype=dtype)))

    def forward(self, grads):
        return sum((p * grads[n]).sum().double() for n, p in self.named_parameters())


@pytest.fixture
def grid():
    g = fourd.init(1, 1, 1, N, timeout=120)
    yield g
    fourd.finalize()


def int_grads(model, rank):
    """Integer values 1..4, different on every rank: every sum is exact."""
    out = {}
    for i, (n, p) in enumerate(model.named_parameters()):
        k = torch.arange(p.numel(), dtype=torch.float64).view_as(p)
        out[n] = ((k * (i + 3) + rank) % 4 + 1).to(p.dtype)
    return out


def random_grads(model, seed):
    gen = torch.Generator().manual_seed(seed)
    return {
        n: torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        for n, p in model.named_parameters()
    }


def set_grads(model, grads):
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()


def synced(model, grads, **kw):
    set_grads(model, grads)
    fnn.sync_gradients(model, **kw)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def exact_sum(model, per_rank):
    """float64 oracle: the sum over ranks of per_rank(r)'s gradients."""
    all_ = [per_rank(r) for r in range(N)]
    return {n: sum(a[n].double() for a in all_) for n, _ in model.named_parameters()}


def shapes_all():
    return {**SHAPES, **SHAPES64}


# ---- lossless: bit-identical --------------------------------------------------------------


@pytest.mark.parametrize("codec", ["lossless", "lossless:zstd", "zfp:reversible"])
@pytest.mark.parametrize("average", [False, True])
def test_lossless_is_bit_identical(grid, codec, average):
    model = Params(shapes_all())
    grads = int_grads(model, ME)
    plain = synced(model, grads, average=average)
    want = exact_sum(model, lambda r: int_grads(model, r))
    for ef in (False, True):
        for _ in range(2):  # error feedback, were it applied, would change step 2
            got = synced(model, grads, average=average, compression=codec, error_feedback=ef)
            for n in got:
                assert torch.equal(got[n], plain[n]), (codec, ef, n)
                scale = 1.0 / N if average else 1.0
                assert torch.equal(got[n].double(), want[n] * scale), (codec, ef, n)


def test_lossless_overlapped_is_bit_identical(grid):
    model = Params(shapes_all())
    grads = int_grads(model, ME)
    plain = synced(model, grads)
    ov = fnn.overlap(
        model, grad_reduce=True, bucket_bytes=4096, compression="lossless", error_feedback=True
    )
    with ov:
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(grads).backward()
            fnn.sync_gradients(model)
            for n, p in model.named_parameters():
                assert torch.equal(p.grad, plain[n]), n
    assert ov.compression == "lossless:lz4" and ov.error_feedback
    if N > 1:
        assert ov.stats["buckets_early"] > 0, ov.stats


def test_error_feedback_without_a_codec_is_a_no_op(grid):
    model = Params(shapes_all())
    grads = random_grads(model, 100 + ME)
    # Tuning in use may switch algorithm at a size's second call (float sums then round
    # differently): compare calls made after it.
    for _ in range(2):
        synced(model, grads, average=True)
    plain = synced(model, grads, average=True)
    for _ in range(3):
        got = synced(model, grads, average=True, error_feedback=True)  # no policy either
        for n in got:
            assert torch.equal(got[n], plain[n]), n


# ---- int8: within the documented bound ------------------------------------------------------


def int8_bound(absmax, dtype):
    """The compressed ring's bound (one node: the ring over the whole group) plus the
    rounding of the sum itself."""
    eps = float(torch.finfo(dtype).eps)
    b = _C.codec_bound("int8:block=256", DT_CODE[dtype], N - 1, absmax, True)
    return b + 2 * N * N * absmax * eps


@pytest.mark.parametrize("average", [False, True])
def test_int8_within_the_documented_bound(grid, average):
    model = Params(shapes_all())
    got = synced(model, random_grads(model, 7 + ME), average=average, compression="int8")
    want = exact_sum(model, lambda r: random_grads(model, 7 + r))
    scale = 1.0 / N if average else 1.0
    for n, p in model.named_parameters():
        inputs = [random_grads(model, 7 + r)[n].double() * scale for r in range(N)]
        absmax = max(float(t.abs().max()) for t in inputs)
        err = float((got[n].double() - want[n] * scale).abs().max())
        assert err <= int8_bound(absmax, p.dtype), (n, err, int8_bound(absmax, p.dtype))
        if N > 1:
            assert err > 0, f"{n}: int8 changed nothing: the codec did not run"
    # every rank holds the same gradients
    digest = zlib.crc32(b"".join(got[n].numpy().tobytes() for n in sorted(got)))
    assert len(set(WORLD.allgather(digest))) == 1


# ---- error feedback ----------------------------------------------------------------------


def fixed_gradient(model):
    """Non-constant, the same on every rank (so the exact mean is g itself)."""
    return random_grads(model, 4321)


def running_mean_error(step, g):
    """Relative L2 error of the mean over STEPS steps of the synced gradients against g."""
    acc = {n: torch.zeros_like(t, dtype=torch.float64) for n, t in g.items()}
    for _ in range(STEPS):
        out = step()
        for n in acc:
            acc[n] += out[n].double()
    num = sum(float((acc[n] / STEPS - g[n].double()).square().sum()) for n in acc)
    den = sum(float(g[n].double().square().sum()) for n in acc)
    return (num / den) ** 0.5


def plain_step(model, g, **kw):
    return lambda: synced(model, g, average=True, **kw)


def overlapped_step(model, g):
    def step():
        model.zero_grad(set_to_none=True)
        model(g).backward()
        fnn.sync_gradients(model)
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    return step


def ef_errors(path, codec):
    errs = {}
    for ef in (False, True):
        model = Params(shapes_all())
        g = fixed_gradient(model)
        if path == "overlap":
            with fnn.overlap(
                model, grad_reduce=True, average=True, compression=codec, error_feedback=ef
            ):
                errs[ef] = running_mean_error(overlapped_step(model, g), g)
        else:
            errs[ef] = running_mean_error(
                plain_step(model, g, compression=codec, error_feedback=ef), g
            )
    return errs


@pytest.mark.parametrize("path", ["plain", "overlap"])
def test_error_feedback_makes_the_running_mean_converge(grid, path):
    if N < 2:
        pytest.skip("needs 2 ranks: one rank reduces nothing")
    errs = ef_errors(path, "int8")
    assert errs[False] > 0, errs
    assert errs[True] <= 0.5 * errs[False], errs


def test_error_feedback_follows_the_policy():
    if N < 2:
        pytest.skip("needs 2 ranks: a policy compresses only groups that span nodes")
    fourd.init(1, 1, 1, N, ranks_per_node=1, compression={("z", "data"): "int8"})
    try:
        errs = ef_errors("plain", None)
        assert errs[False] > 0, errs  # the policy's codec ran
        assert errs[True] <= 0.5 * errs[False], errs
    finally:
        fourd.finalize()


def test_residuals_start_at_zero_when_buckets_are_rebuilt(grid):
    model = Params(shapes_all())
    g = fixed_gradient(model)
    first = synced(model, g, compression="int8")
    ef = [synced(model, g, compression="int8", error_feedback=True) for _ in range(3)]
    for n in first:
        assert torch.equal(ef[0][n], first[n]), n  # step 1: nothing fed back yet
    if N > 1:
        assert any(not torch.equal(ef[1][n], first[n]) for n in first)  # fed back
    # Another bucket size rebuilds the buckets, and so does coming back: each time the first
    # step feeds nothing back.
    other = synced(model, g, compression="int8", bucket_bytes=8192)
    rebuilt = synced(model, g, compression="int8", error_feedback=True, bucket_bytes=8192)
    again = synced(model, g, compression="int8", error_feedback=True)
    for n in first:
        assert torch.equal(rebuilt[n], other[n]), n
        assert torch.equal(again[n], first[n]), n


# ---- bad arguments ------------------------------------------------------------------------


BAD = [
    ({"compression": "int9"}, "int9"),
    ({"compression": "zfp:rate=0"}, "rate"),
    ({"compression": 8}, "compression"),
    ({"compression": "int8", "error_feedback": "yes"}, "error_feedback"),
]


@pytest.mark.parametrize("kw,word", BAD)
def test_bad_arguments_fail_before_any_communication(grid, kw, word):
    model = Params(shapes_all())
    set_grads(model, int_grads(model, ME))
    if ME == 0:  # only rank 0 calls: an error after any communication would hang it
        with pytest.raises(fourd.InvalidArgumentError, match=word):
            fnn.sync_gradients(model, **kw)
        with pytest.raises(fourd.InvalidArgumentError, match=word):
            fnn.overlap(model, grad_reduce=True, **kw)
    WORLD.Barrier()
    # nothing was left queued: the next reduction is exact on every rank
    got = synced(model, int_grads(model, ME))
    want = exact_sum(model, lambda r: int_grads(model, r))
    for n in got:
        assert torch.equal(got[n].double(), want[n]), n


def test_a_codec_the_gradient_dtype_cannot_take(grid):
    model = Params({"h": ((64,), torch.bfloat16)})
    set_grads(model, {"h": torch.ones(64, dtype=torch.bfloat16)})
    if ME == 0 and N > 1:  # checked when the buckets are built, before any is reduced
        with pytest.raises(fourd.InvalidArgumentError, match="compression"):
            fnn.sync_gradients(model, compression="zfp:rate=8")
    WORLD.Barrier()


def test_overlap_and_sync_gradients_must_agree(grid):
    model = Params(shapes_all())
    with fnn.overlap(model, grad_reduce=True, compression="int8", error_feedback=True):
        model(int_grads(model, ME)).backward()
        if ME == 0:  # raised before finish() communicates
            with pytest.raises(fourd.InvalidArgumentError, match="compression"):
                fnn.sync_gradients(model, compression="lossless")
            with pytest.raises(fourd.InvalidArgumentError, match="error_feedback"):
                fnn.sync_gradients(model, error_feedback=False)
        WORLD.Barrier()
        fnn.sync_gradients(model, compression="int8:block=256", error_feedback=True)
