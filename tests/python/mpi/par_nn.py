"""Multi-rank proof of fourd.nn.Linear, sync_gradients and overlap against an unsharded model.

For every factorization (x, y, z, data) of the world size, a small MLP block (plain Linear, GELU,
transposed Linear) and a tiny pre-LN transformer block (attention + MLP, residuals, LayerNorms)
are built from the full weights of a torch.nn reference model that every rank also runs on the
full batch. Two training steps (forward, backward, sync_gradients, SGD) are compared: the
forward output, every parameter gradient and the input gradient must equal the reference's
corresponding shard (float32, rtol 1e-5), without overlap and with all of OAR, ORS, OAG
(depth 2) and data-parallel buckets during backward at once on every grid, and (the transformer
block, which has every kind of call the MLP has) with each of them alone (OAG at depths 1 and
2) on the grids where it has communication to overlap. The MLP uses a summed loss, the
transformer a mean loss with sync_gradients(average=True).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

import fourd
import fourd.nn as fnn
import fourd.parallel_state as ps
import fourd.tensor_parallel as tp

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RTOL = 1e-5


def factorizations(n):
    return [
        (x, y, z, n // (x * y * z))
        for x in range(1, n + 1)
        for y in range(1, n + 1)
        for z in range(1, n + 1)
        if n % (x * y * z) == 0
    ]


GRIDS = factorizations(N)
CONFIGS = {
    "none": {},
    "oar": {"all_reduce": True},
    "ors": {"reduce_scatter": True},
    "oag": {"all_gather": True},
    "oag2": {"all_gather": True, "prefetch_depth": 2},
    "dp": {"grad_reduce": True, "bucket_bytes": 512},
    "all": {
        "all_reduce": True,
        "reduce_scatter": True,
        "all_gather": True,
        "prefetch_depth": 2,
        "grad_reduce": True,
        "bucket_bytes": 512,
    },
}


def close(actual, expected, what):
    """rtol 1e-5 elementwise; atol 1e-6 x the largest reference magnitude covers entries that
    cancel to ~0 (their absolute error is set by the size of the summands, not the result)."""
    atol = 1e-6 * max(float(expected.abs().max()), 1e-30)
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=atol, msg=lambda m: f"{what}: {m}")


# ---- models ---------------------------------------------------------------------------------


class MLPRef(torch.nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.fc1 = torch.nn.Linear(h, f)
        self.fc2 = torch.nn.Linear(f, h)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MLP4D(torch.nn.Module):
    """Input (tokens, h/Gx), output (tokens, h/Gx): plain then transposed, no redistribution."""

    def __init__(self, h, f):
        super().__init__()
        self.fc1 = fnn.Linear(h, f)
        self.fc2 = fnn.Linear(f, h, transpose=True)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def attention(qkv, heads):
    """qkv: (B, S, heads*3*hd) with per-head [q k v] blocks; causal attention."""
    b, s, w = qkv.shape
    hd = w // (3 * heads)
    q, k, v = qkv.view(b, s, heads, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, s, heads * hd)


class BlockRef(torch.nn.Module):
    def __init__(self, h, f, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, f)
        self.fc2 = torch.nn.Linear(f, h)

    def forward(self, x):
        x = x + self.proj(attention(self.qkv(self.ln1(x)), self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Block4D(torch.nn.Module):
    """The residual stream is full width (replicated over x and y) on each batch shard; each
    half-block scatters it over x, runs plain + transposed Linear (heads split over y), and
    gathers the result back over x."""

    def __init__(self, h, f, heads):
        super().__init__()
        gy = ps.get_y_parallel_world_size()
        self.heads = heads // gy
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = fnn.Linear(h, 3 * h)
        self.proj = fnn.Linear(h, h, transpose=True)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = fnn.Linear(h, f)
        self.fc2 = fnn.Linear(f, h, transpose=True)

    def forward(self, x):
        a = tp.scatter_to_tensor_model_parallel_region(self.ln1(x), group="x")
        a = self.proj(attention(self.qkv(a), self.heads))
        x = x + tp.gather_from_tensor_model_parallel_region(a, group="x")
        m = tp.scatter_to_tensor_model_parallel_region(self.ln2(x), group="x")
        m = self.fc2(F.gelu(self.fc1(m)))
        return x + tp.gather_from_tensor_model_parallel_region(m, group="x")


# ---- harness --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=GRIDS, ids=lambda g: "x{}y{}z{}d{}".format(*g))
def grid(request):
    x, y, z, d = request.param
    g = ps.initialize(x=x, y=y, z=z, data=d)
    yield g
    ps.destroy_model_parallel()


def shard_rows(g, t):
    """This rank's batch shard (rows) of t: shard index data*Gz + z."""
    c, gz, gd = g.coords(), g.size("z"), g.size("data")
    s = c["data"] * gz + c["z"]
    n = t.shape[0] // (gz * gd)
    return t[s * n : (s + 1) * n]


def feat(t, g, axis):
    """The slice of the last dimension that my coordinate along `axis` holds."""
    n = g.size(axis)
    c = t.shape[-1] // n
    i = g.rank(axis)
    return t[..., i * c : (i + 1) * c]


def expected_grad(mod4d, name, full):
    """The shard of a full reference gradient that parameter `name` of mod4d holds."""
    owner, _, leaf = name.rpartition(".")
    m = mod4d.get_submodule(owner) if owner else mod4d
    if isinstance(m, fnn.Linear):
        return m._shard_weight(full) if leaf == "weight" else m._shard_bias(full)
    return full


def run_case(g, kind, cfg_name, steps=2, lr=0.05):
    torch.manual_seed(1234)
    if kind == "mlp":
        h, f, b = 16, 64, 16
        ref, mod = MLPRef(h, f), MLP4D(h, f)
        xin = torch.randn(b, h)
        upstream = torch.randn(b, h)
        average = False
    else:
        h, f, heads, b, s = 32, 64, 8, 8, 4
        ref, mod = BlockRef(h, f, heads), Block4D(h, f, heads)
        xin = torch.randn(b, s, h)
        upstream = torch.randn(b, s, h)
        average = True
    mod.load_state_dict(ref.state_dict())
    cfg = dict(CONFIGS[cfg_name])
    bucket = cfg.pop("bucket_bytes", fnn.DEFAULT_BUCKET_BYTES)
    ov = fnn.overlap(mod, average=average, bucket_bytes=bucket, **cfg) if cfg else None
    if ov is not None:
        ov.enable()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
    opt = torch.optim.SGD(mod.parameters(), lr=lr)
    try:
        for step in range(steps):
            # reference: the full batch
            xr = xin.clone().requires_grad_(True)
            out_r = ref(xr)
            if kind == "mlp":
                (out_r * upstream).sum().backward()
            else:
                ((out_r * upstream).sum() / (b * s)).backward()
            # 4D: my batch shard (and, for the MLP, my x-slice of the features)
            x_loc = shard_rows(g, xin)
            up_loc = shard_rows(g, upstream)
            if kind == "mlp":
                x_loc, up_loc = feat(x_loc, g, "x"), feat(up_loc, g, "x")
            x_loc = x_loc.clone().requires_grad_(True)
            out = mod(x_loc)
            exp_out = shard_rows(g, out_r.detach())
            if kind == "mlp":
                exp_out = feat(exp_out, g, "x")
                (out * up_loc).sum().backward()
            else:
                local_tokens = x_loc.shape[0] * x_loc.shape[1]
                ((out * up_loc).sum() / local_tokens).backward()
            fnn.sync_gradients(mod, average=average)
            tag = f"{kind} {cfg_name} grid={tuple(g.shape.values())} step {step}"
            close(out.detach(), exp_out, f"{tag} output")
            exp_dx = shard_rows(g, xr.grad)
            if kind == "mlp":
                exp_dx = feat(exp_dx, g, "x")
            else:
                # The input gradient is not averaged by sync_gradients: the shard's mean loss
                # weighs each token by 1/local_tokens, the reference by 1/(b*s).
                exp_dx = exp_dx * ((b * s) / local_tokens)
            close(x_loc.grad, exp_dx, f"{tag} input grad")
            ref_grads = {n: p.grad for n, p in ref.named_parameters()}
            for n, p in mod.named_parameters():
                assert p.grad is not None, f"{tag}: {n} has no gradient"
                close(p.grad, expected_grad(mod, n, ref_grads[n]), f"{tag} grad {n}")
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad(set_to_none=True)
            opt.zero_grad(set_to_none=True)
        full = fnn.full_state_dict(mod)
        for n, t in ref.state_dict().items():
            close(full[n], t, f"{kind} {cfg_name} full_state_dict {n}")
        if ov is not None:
            st = ov.stats
            if cfg.get("all_gather") and g.size("z") > 1:
                assert st["prefetched_forward"] > 0 and st["prefetched_backward"] > 0, st
            if cfg.get("reduce_scatter") and g.size("z") > 1:
                assert st["deferred"] > 0, st
            if cfg.get("grad_reduce") and g.size(("z", "data")) > 1:
                assert st["buckets_early"] > 0, st
    finally:
        if ov is not None:
            ov.disable()


# ---- tests ----------------------------------------------------------------------------------


def has_work(shape, cfg_name):
    """Whether overlap option cfg_name has communication to overlap on grid shape (x, y, z,
    data): OAR the x/y all-reduces, ORS and OAG the z reduce-scatter and all-gather, dp the
    gradient all-reduce over z and data. Elsewhere the option's path is the "none" path, which
    runs on every grid, as does "all"."""
    x, y, z, d = shape
    if cfg_name == "oar":
        return x * y > 1
    if cfg_name in ("ors", "oag", "oag2"):
        return z > 1
    if cfg_name == "dp":
        return z * d > 1
    return True


# Each (grid, overlap option) pair where the option has work; the grid fixture is module-scoped,
# so the pairs of one grid share its initialization.
CASES = pytest.mark.parametrize(
    "grid,cfg",
    [(g, c) for g in GRIDS for c in CONFIGS if has_work(g, c)],
    indirect=["grid"],
    scope="module",
    ids=lambda v: "x{}y{}z{}d{}".format(*v) if isinstance(v, tuple) else v,
)


@pytest.mark.parametrize("cfg", ["none", "all"])
def test_mlp_block(grid, cfg):
    """The MLP pair on its own (the input sliced over x, no scatter or gather), without overlap
    and with every option at once; the transformer block below runs each option alone."""
    run_case(grid, "mlp", cfg)


@CASES
def test_transformer_block(grid, cfg):
    run_case(grid, "block", cfg)


class Chain3Ref(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.c = torch.nn.Linear(h, h)
        self.b = torch.nn.Linear(h, h)
        self.a = torch.nn.Linear(h, h)

    def forward(self, x):
        return self.c(F.gelu(self.b(F.gelu(self.a(x)))))


class Chain3(torch.nn.Module):
    """Registered c, b, a; run a, b, c (plain, transposed, plain)."""

    def __init__(self, h):
        super().__init__()
        self.c = fnn.Linear(h, h)
        self.b = fnn.Linear(h, h, transpose=True)
        self.a = fnn.Linear(h, h)

    def forward(self, x):
        return self.c(F.gelu(self.b(F.gelu(self.a(x)))))


def test_oag_learns_execution_order_and_ors_keeps_hooks(grid):
    g = grid
    h, b = 16, 8
    torch.manual_seed(7)
    ref = Chain3Ref(h)
    xin, up = torch.randn(b, h), torch.randn(b, h)

    def run(cfg):
        mod = Chain3(h)
        mod.load_state_dict(ref.state_dict())
        seen = []
        # the hooks a DDP/ZeRO-style wrapper would register on a weight
        mod.b.weight.register_hook(lambda gr: seen.append(("tensor", gr.clone())))
        mod.b.weight.register_post_accumulate_grad_hook(
            lambda p: seen.append(("post", p.grad.clone()))
        )
        ov = fnn.overlap(mod, **cfg)
        grads = []
        with ov:
            for _ in range(3):
                xl = feat(shard_rows(g, xin), g, "x")
                out = mod(xl)
                (out * feat(shard_rows(g, up), g, "y")).sum().backward()
                fnn.sync_gradients(mod)
                grads.append({n: p.grad.clone() for n, p in mod.named_parameters()})
                mod.zero_grad(set_to_none=True)
        return mod, ov, seen, grads

    mod, ov, seen, grads = run(
        {
            "all_gather": True,
            "prefetch_depth": 2,
            "reduce_scatter": True,
            "all_reduce": True,
            "grad_reduce": True,
            "bucket_bytes": 256,
        }
    )
    assert ov.learned_order == [mod.a, mod.b, mod.c]  # execution order, not registration
    if g.size("z") > 1:
        assert ov.stats["prefetched_forward"] >= 2 * 2, ov.stats  # steps 2, 3: positions 1, 2
        assert ov.stats["prefetched_backward"] >= 3 * 2, ov.stats
        assert ov.stats["deferred"] == 3 * 3, ov.stats
    _, _, seen_plain, grads_plain = run({})
    # ORS delivers through the same hooks, once per step, with the same gradient
    assert [k for k, _ in seen] == [k for k, _ in seen_plain] == ["tensor", "post"] * 3
    for (_, a), (_, p) in zip(seen, seen_plain):
        close(a, p, "hook gradient under ORS")
    ref_out = ref(xin)
    (ref_out * up).sum().backward()
    for step in range(3):
        for n, _p in mod.named_parameters():
            close(
                grads[step][n],
                expected_grad(mod, n, dict(ref.named_parameters())[n].grad),
                f"chain step {step} {n}",
            )
            close(grads_plain[step][n], grads[step][n], f"chain plain vs overlap {n}")


def test_gradient_accumulation_with_no_sync(grid):
    g = grid
    torch.manual_seed(11)
    h, f, heads, b, s = 32, 64, 8, 8, 4
    ref, mod = BlockRef(h, f, heads), Block4D(h, f, heads)
    mod.load_state_dict(ref.state_dict())
    xs = [torch.randn(b, s, h) for _ in range(2)]
    ups = [torch.randn(b, s, h) for _ in range(2)]
    for x, u in zip(xs, ups):
        (ref(x) * u).sum().backward()
    ov = fnn.overlap(
        mod,
        all_reduce=True,
        reduce_scatter=True,
        all_gather=True,
        grad_reduce=True,
        bucket_bytes=512,
    )
    with ov:
        for step in range(2):
            with ov.no_sync():
                (mod(shard_rows(g, xs[0])) * shard_rows(g, ups[0])).sum().backward()
            (mod(shard_rows(g, xs[1])) * shard_rows(g, ups[1])).sum().backward()
            fnn.sync_gradients(mod)
            for n, p in mod.named_parameters():
                close(
                    p.grad,
                    expected_grad(mod, n, dict(ref.named_parameters())[n].grad),
                    f"accumulation step {step} {n}",
                )
            mod.zero_grad(set_to_none=True)
    if g.size(("z", "data")) > 1:
        assert ov.stats["buckets_early"] > 0, ov.stats


def test_linear_errors(grid):
    g = grid
    gx, gy, gz = g.size("x"), g.size("y"), g.size("z")
    if gx > 1:
        with pytest.raises(fourd.InvalidArgumentError, match="in_features: .* splits it over x"):
            fnn.Linear(gx + 1, gy)
    if gy > 1:
        with pytest.raises(ValueError, match="out_features: .* splits it over y"):
            fnn.Linear(gx, gy + 1)
        with pytest.raises(ValueError, match="in_features: a transposed .* splits it over y"):
            fnn.Linear(gy + 1, gx, transpose=True)
    if gz > 1:
        with pytest.raises(
            ValueError, match=r"weight block \(1 x 1 = 1 elements\) is split over z"
        ):
            fnn.Linear(gx, gy)
    lin = fnn.Linear(4 * gx, 4 * gy * gz)
    with pytest.raises(ValueError, match=f"expected a last dimension of {4}"):
        lin(torch.ones(3, 4 * gx + 1))
