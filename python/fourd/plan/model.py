"""The 4D training model of a transformer: collectives per layer and axis, compute, memory.

Layer semantics follow AxoNN's 4D algorithm (docs/planner.md, "The 4D training model"). A
Linear with weight n x k (out x in) on a grid (Gx, Gy, Gz, Gdata), t tokens per rank per
micro-batch:

=========  ======================  =====  =====================================
phase      collective              axis   elements
=========  ======================  =====  =====================================
forward    all-gather weight       z      k n / (Gx Gy)   (gathered output)
forward    all-reduce output       x      t n / Gy
backward   all-gather weight       z      k n / (Gx Gy)
backward   all-reduce dX           y      t k / Gx
backward   reduce-scatter dW       z      k n / (Gx Gy)   (input)
step       all-reduce gradient     data   k n / (Gx Gy Gz)
=========  ======================  =====  =====================================

A *transposed* Linear swaps x and y: its forward all-reduce runs over y with t n / Gx
elements and its backward all-reduce over x with t k / Gy. The MLP's 4h -> h layer is
transposed (n = h, k = 4h), so its backward message carries the factor 4, not its forward
one. With full activation recomputation the forward collectives run twice.

Every collective time comes from the C++ model (``fourd._C.candidates``), the same one the
``auto`` algorithm selection uses.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field, replace

from .. import _C
from .._tensor import ITEMSIZE

AXES = _C.AXES  # ("x", "y", "z", "data")
# The concrete algorithms, in the cost model's tie-break order (fourd._C.ALGORITHMS[0] is auto).
ALGORITHMS = _C.ALGORITHMS[1:]

# Fraction of a GPU's memory the planner lets a configuration use: the rest is for the CUDA
# context, communication buffers and allocator fragmentation.
USABLE_MEMORY_FRACTION = 0.9

# The structural choices a plan makes, each a yes/no question about its grid:
# key -> (test, the structure when yes, the structure when no).
STRUCTURES = {
    "tensor": (
        lambda g: g.x * g.y > 1,
        "with tensor parallelism on x/y (Gx Gy > 1)",
        "without tensor parallelism (Gx = Gy = 1)",
    ),
    "z": (lambda g: g.z > 1, "with z sharding (Gz > 1)", "without z sharding (Gz = 1)"),
    "data": (
        lambda g: g.data > 1,
        "with data parallelism (Gdata > 1)",
        "without data parallelism (Gdata = 1)",
    ),
}

# TransformerSpec.micro_batch that lets evaluate choose the micro-batch of each grid.
AUTO_MICRO_BATCH = 0

# How much slower the traffic that hides under compute is taken to run when the planner says
# what the step depends on: the validation's bound on the collective model's median error
# (docs/planner.md, section 5.1), which overlap's contention for the GPU can add to.
SLOWDOWN = 1.25

# Step times closer than this are inside the model's error: the collective model's median
# error is 12-20% in validation and compute_flops is an assumed fraction of the peak.
MODEL_ERROR = 0.10


def native_module():
    """``fourd._C``, the extension that holds the C++ cost model, the process grid's rank
    arithmetic and the name tables."""
    return _C


# ---- placement ----------------------------------------------------------------------------
#
# Rank arithmetic and node placement are the native core's: fourd._C.ProcessGrid gives the
# groups of an axis, fourd._C.Topology the nodes their ranks sit on (ranks packed
# `ranks_per_node` to a node in rank order), the same code fourd.init runs.


def parse_order(order) -> tuple:
    """ "x-y-z-data" (innermost first), or a sequence of the axis names -> ("x", "y", "z",
    "data"), as fourd._C.parse_order reads it."""
    text = order if isinstance(order, str) else "-".join(str(a) for a in order)
    try:
        canonical = _C.parse_order(text)
    except ValueError:
        raise ValueError(
            f"order: expected a permutation of x, y, z, data such as 'x-y-z-data'; found {order!r}"
        ) from None
    return tuple(canonical.split("-"))


def process_grid(sizes: dict, order) -> _C.ProcessGrid:
    """The native ProcessGrid of `sizes` (axis -> size) laid out in `order`."""
    return _C.ProcessGrid([sizes[a] for a in AXES], "-".join(parse_order(order)))


def strides(sizes: dict, order) -> dict:
    """Stride of each axis: the product of the sizes of the axes inside it."""
    grid = process_grid(sizes, order)
    return {a: grid.stride(a) for a in parse_order(order)}


@dataclass(frozen=True)
class Placement:
    """How the groups of one axis sit on nodes: the worst group of the axis."""

    size: int
    nodes: int
    ranks_per_node: int  # group ranks per node (when uniform; the smallest count otherwise)
    uniform: bool

    def native(self):
        return _C.GroupShape(self.size, self.nodes, self.ranks_per_node, self.uniform)


@functools.lru_cache(maxsize=4096)
def placement(size: int, stride: int, world: int, ranks_per_node: int) -> Placement:
    """Exact placement of the groups of an axis with `size` and `stride` among `world` ranks
    packed `ranks_per_node` to a node in rank order (every group looked at, cached).

    Returns the group with the most nodes; it is uniform when every group with that many
    nodes holds the same number of ranks on each of its nodes.
    """
    if size < 1 or stride < 1 or world % (size * stride) != 0:
        raise ValueError(f"placement: size {size} x stride {stride} does not divide {world}")
    if size == 1:
        return Placement(size=1, nodes=1, ranks_per_node=1, uniform=True)
    # The groups of an axis depend only on its size and stride: they are those of axis y of a
    # grid whose x spans the stride.
    grid = _C.ProcessGrid([stride, size, world // (size * stride), 1])
    topo = _C.Topology.from_ranks_per_node(world, max(1, ranks_per_node))
    shapes = [
        topo.group(grid.group_ranks(r, "y")) for r in range(world) if grid.group_rank(r, "y") == 0
    ]
    worst = max(s["num_nodes"] for s in shapes)
    uniform = all(s["uniform"] for s in shapes if s["num_nodes"] == worst)
    return Placement(size=size, nodes=worst, ranks_per_node=max(1, size // worst), uniform=uniform)


def closed_form_ranks_per_node(size: int, stride: int, ranks_per_node: int) -> int:
    """Group ranks per node when everything divides evenly: min(g, R // s) if s < R, else 1."""
    if stride < ranks_per_node:
        return min(size, max(1, ranks_per_node // stride))
    return 1


def grid_placements(sizes: dict, order, ranks_per_node: int) -> dict:
    """Axis -> Placement of its groups, for a grid of `sizes` laid out in `order`."""
    grid = process_grid(sizes, order)
    return {a: placement(sizes[a], grid.stride(a), grid.world_size, ranks_per_node) for a in AXES}


# ---- the model being trained -------------------------------------------------------------


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer. Sizes in elements; batches in sequences.

    The defaults are a GPT layer (a 4h GeLU MLP, every head with its own keys and values);
    ``ffn_hidden``, ``gated_mlp`` and ``kv_heads`` describe a LLaMA layer (a SwiGLU MLP of
    ``ffn_hidden``, grouped-query attention with ``kv_heads`` key/value heads)."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int = 2048
    vocab: int = 51200
    global_batch: int = 1024  # sequences per optimizer step
    micro_batch: int = AUTO_MICRO_BATCH  # sequences per (data, z) shard per pass; 0: per grid
    dtype: str = "bfloat16"
    recompute: bool = True  # full activation recomputation
    ffn_mult: int = 4
    grad_dtype: str = "float32"  # gradients (data-parallel all-reduce, gradient memory)
    ffn_hidden: int = 0  # the MLP's inner width; 0: ffn_mult x hidden
    gated_mlp: bool = False  # SwiGLU: the up projection is two matrices (gate and up) fused
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: one per head

    @property
    def ffn(self) -> int:
        """The MLP's inner width f."""
        return self.ffn_hidden or self.ffn_mult * self.hidden

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads

    def linears(self) -> list:
        """(name, k_in, n_out, transposed) of one transformer layer: qkv's output holds the
        queries (h) and the keys and values of the key/value heads; a gated MLP's fc1 holds
        its gate and up projections side by side (2f), as Megatron-LM fuses them."""
        h, f = self.hidden, self.ffn
        qkv = h + 2 * self.key_value_heads * (h // self.heads)
        return [
            ("qkv", h, qkv, False),
            ("proj", h, h, True),
            ("fc1", h, 2 * f if self.gated_mlp else f, False),
            ("fc2", f, h, True),
        ]

    def head(self) -> tuple:
        """The LM head (tied with the embedding) as one plain Linear h -> vocab."""
        return ("head", self.hidden, self.vocab, False)

    def tp_params(self) -> int:
        """Parameters sharded over x, y and z (the Linear weights and the tied embedding)."""
        per_layer = sum(k * n for _, k, n, _ in self.linears())
        return self.layers * per_layer + self.hidden * self.vocab

    def replicated_params(self) -> int:
        """Biases and LayerNorm parameters (kept whole on every rank): two LayerNorms (2h
        each), one bias per Linear output, the final LayerNorm."""
        h = self.hidden
        return self.layers * (4 * h + sum(n for _, _, n, _ in self.linears())) + 2 * h

    def params(self) -> int:
        return self.tp_params() + self.replicated_params()

    def splits(self, g) -> bool:
        """Whether the layer splits over the grid's x and y: hidden over Gx and Gy, the query
        and key/value heads over Gy."""
        return not (
            self.hidden % g.x or self.hidden % g.y or self.heads % g.y or self.key_value_heads % g.y
        )

    def with_(self, **changes) -> TransformerSpec:
        return replace(self, **changes)


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int, kv_heads: int = 0):
    """A Llama 2 shape: SwiGLU MLP, sequence 4096, vocabulary 32000, 4M tokens per step."""
    return TransformerSpec(
        name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=4096,
        vocab=32000,
        global_batch=1024,
        ffn_hidden=ffn,
        gated_mlp=True,
        kv_heads=kv_heads,
    )


# GPT shapes of AxoNN's Perlmutter weak-scaling runs (layers, hidden), heads of 128 elements,
# sequence 2048; and the 7B, 13B and 70B shapes of Llama 2 (docs/planner.md, "Model presets").
PRESETS = {
    "gpt-5b": TransformerSpec("gpt-5b", layers=24, hidden=4096, heads=32),
    "gpt-10b": TransformerSpec("gpt-10b", layers=32, hidden=5120, heads=40),
    "gpt-20b": TransformerSpec("gpt-20b", layers=32, hidden=7168, heads=56),
    "gpt-40b": TransformerSpec("gpt-40b", layers=38, hidden=9216, heads=72),
    "gpt-80b": TransformerSpec("gpt-80b", layers=42, hidden=12288, heads=96),
    "llama2-7b": _llama("llama2-7b", layers=32, hidden=4096, heads=32, ffn=11008),
    "llama2-13b": _llama("llama2-13b", layers=40, hidden=5120, heads=40, ffn=13824),
    "llama2-70b": _llama("llama2-70b", layers=80, hidden=8192, heads=64, ffn=28672, kv_heads=8),
}


def get_model(name_or_spec, **overrides) -> TransformerSpec:
    if isinstance(name_or_spec, TransformerSpec):
        spec = name_or_spec
    elif isinstance(name_or_spec, str) and name_or_spec.lower() in PRESETS:
        spec = PRESETS[name_or_spec.lower()]
    else:
        raise ValueError(
            f"model: expected one of {', '.join(PRESETS)} or a TransformerSpec; "
            f"found {name_or_spec!r}"
        )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return spec.with_(**overrides) if overrides else spec


# ---- the collectives of one step ---------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One collective call: `count` identical calls per optimizer step."""

    axis: str
    collective: str
    elements: int
    dtype: str
    count: int  # calls per step
    role: str  # fwd_ar, bwd_ar, fwd_ag, bwd_ag, rs, data_ar
    linear: str
    overlap: str  # none, dW (hidden under the dW GEMM), fwd_compute, bwd_compute

    @property
    def nbytes(self) -> int:
        return self.elements * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class Grid4D:
    x: int
    y: int
    z: int
    data: int

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    def sizes(self) -> dict:
        return {a: self.size(a) for a in AXES}

    @property
    def world(self) -> int:
        return self.x * self.y * self.z * self.data


def batch_split(spec: TransformerSpec, g: Grid4D):
    """(micro_batch, accumulation steps) per (data, z) shard, or None when the batch does not
    split: the global batch must divide by Gdata*Gz, the micro-batch divides the shard. A
    micro-batch chosen per grid (AUTO_MICRO_BATCH) reads as 1 here, its least memory;
    evaluate chooses it."""
    shards = g.data * g.z
    if spec.global_batch % shards:
        return None
    per_shard = spec.global_batch // shards
    mb = min(spec.micro_batch or 1, per_shard)
    if per_shard % mb:
        return None
    return mb, per_shard // mb


def messages(spec: TransformerSpec, g: Grid4D) -> list:
    """Every collective of one optimizer step, with its size and repeat count (volume
    formulas of the module docstring). Axes of size 1 carry nothing."""
    split = batch_split(spec, g)
    if split is None:
        raise ValueError(
            f"global_batch {spec.global_batch} does not split over "
            f"Gdata*Gz = {g.data * g.z} shards (micro-batch {spec.micro_batch})"
        )
    mb, acc = split
    t = mb * spec.seq_len  # tokens per rank per micro-batch
    fwd_runs = 2 if spec.recompute else 1
    out = []
    lins = [(lin, spec.layers) for lin in spec.linears()] + [(spec.head(), 1)]
    for (name, k, n, transposed), reps in lins:
        fx, bx = ("y", "x") if transposed else ("x", "y")  # forward / backward AR axes
        fwd_elems = t * n // g.size(bx)  # output columns are split over the other axis
        bwd_elems = t * k // g.size(fx)
        block = -(-k * n // (g.x * g.y))  # the weight block gathered over z
        shard = -(-block // g.z)
        dt, gdt = spec.dtype, spec.grad_dtype
        if g.size(fx) > 1:
            out.append(
                Message(
                    fx, "all_reduce", fwd_elems, dt, reps * acc * fwd_runs, "fwd_ar", name, "none"
                )
            )
        if g.size(bx) > 1:
            out.append(Message(bx, "all_reduce", bwd_elems, dt, reps * acc, "bwd_ar", name, "dW"))
        if g.z > 1:
            out.append(
                Message("z", "all_gather", block, dt, reps * acc, "fwd_ag", name, "fwd_compute")
            )
            # the backward all-gather, and the recomputed forward's one (also in backward)
            out.append(
                Message(
                    "z",
                    "all_gather",
                    block,
                    dt,
                    reps * acc * fwd_runs,
                    "bwd_ag",
                    name,
                    "bwd_compute",
                )
            )
            out.append(
                Message("z", "reduce_scatter", block, dt, reps * acc, "rs", name, "bwd_compute")
            )
        if g.data > 1:
            out.append(Message("data", "all_reduce", shard, gdt, reps, "data_ar", name, "none"))
    return out


# ---- compute and memory ------------------------------------------------------------------


def compute_flops(spec: TransformerSpec, g: Grid4D) -> dict:
    """FLOPs per rank per micro-batch: forward of one layer, of the head, attention core."""
    mb, _ = batch_split(spec, g)
    t = mb * spec.seq_len
    gemm = sum(2 * t * k * n / (g.x * g.y) for _, k, n, _ in spec.linears())
    # QK^T and AV: 4 b s^2 h per layer; heads are split over y and repeated over x.
    attn = 4 * mb * spec.seq_len**2 * spec.hidden / g.y
    _, k, n, _ = spec.head()
    head = 2 * t * k * n / (g.x * g.y)
    return {"layer_gemm": gemm, "layer_attention": attn, "head": head}


def memory(spec: TransformerSpec, g: Grid4D) -> dict:
    """Bytes per GPU: weights, gradients, optimizer state, transient gathered weights,
    activations (docs/planner.md, "Memory")."""
    mb, _ = batch_split(spec, g)
    t = mb * spec.seq_len
    h, a, s = spec.hidden, spec.heads, spec.seq_len
    p_local = spec.tp_params() / (g.x * g.y * g.z) + spec.replicated_params()
    w_b = ITEMSIZE[spec.dtype]
    weights = w_b * p_local
    grads = ITEMSIZE[spec.grad_dtype] * p_local
    optimizer = 12 * p_local  # fp32 master weights + Adam m and v
    largest = max(k * n for _, k, n, _ in spec.linears() + [spec.head()]) / (g.x * g.y)
    # Gathered blocks: the one in use and the prefetched one, plus dW before its RS.
    transient = (3 * w_b * largest) if g.z > 1 else (w_b * largest)
    # Activations of one layer (flash attention: no s^2 scores kept), 16-bit:
    #   x-split: LN1 in/out, LN2 in/out (2 B) and two dropout masks (1 B): 10 t h / Gx bytes
    #   y-split: Q, K, V, attention out, fc1 out, GeLU out (2 B each): 2 * 12 t h / Gy bytes
    #     for a GPT layer; with grouped-query attention and a gated MLP, the qkv and fc1
    #     outputs at their widths, and the gated product (f)
    #   softmax statistics: 4 B per (sequence, head, position), heads split over y.
    widths = {name: n for name, _, n, _ in spec.linears()}
    y_split = 2 * (widths["qkv"] + h + widths["fc1"] + spec.ffn)
    layer_full = 10 * t * h / g.x + y_split * t / g.y + 4 * mb * (a / g.y) * s
    logits = 6 * t * spec.vocab / g.y  # bf16 logits and their fp32 softmax
    if spec.recompute:
        checkpoints = spec.layers * 2 * t * h / g.x  # each layer's input
        activations = checkpoints + 2 * layer_full + logits  # one layer live, with its grads
    else:
        activations = spec.layers * layer_full + layer_full + logits
    total = weights + grads + optimizer + transient + activations
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer": optimizer,
        "transient": transient,
        "activations": activations,
        "total": total,
    }


def fits(mem: dict, profile) -> bool:
    return mem["total"] <= USABLE_MEMORY_FRACTION * profile.memory_bytes


# ---- collective times through the C++ model ------------------------------------------------


class CollectiveModel:
    """Predicted times of collectives on the groups of a grid: one call into fourd._C per
    distinct (collective, bytes, placement), cached."""

    def __init__(self, profile):
        self.profile = profile
        self._native_profile = profile.native()
        self._cache = {}

    def times(self, collective: str, nbytes: int, dtype: str, pl: Placement) -> dict:
        """{algorithm: seconds} for every concrete algorithm (inf when unsupported)."""
        key = (collective, nbytes, dtype, pl)
        hit = self._cache.get(key)
        if hit is None:
            preds = _C.candidates(collective, int(nbytes), dtype, pl.native(), self._native_profile)
            hit = {p.algorithm: p.seconds for p in preds}
            self._cache[key] = hit
        return hit

    def predict(
        self, collective: str, algorithm: str, nbytes: int, dtype: str, pl: Placement
    ) -> float:
        if algorithm == "auto":
            return min(self.times(collective, nbytes, dtype, pl).values())
        return self.times(collective, nbytes, dtype, pl)[algorithm]


# ---- one configuration ---------------------------------------------------------------------


@dataclass
class Evaluation:
    grid: Grid4D
    order: str
    algorithms: dict  # axis -> algorithm name ("-" for an axis of size 1)
    step_time: float
    compute_time: float
    comm_time: dict  # axis -> seconds of all its collectives per step
    exposed_time: dict  # axis -> seconds not hidden under compute
    memory: dict
    fits: bool
    placements: dict
    detail: dict = field(default_factory=dict)

    @property
    def exposed_total(self) -> float:
        return sum(self.exposed_time.values())


def _choose_axis_algorithms(axis_msgs: dict, policy) -> dict:
    """Per axis: the fixed algorithm with the least total time, or "auto" (per-call best) when
    that is more than 2% faster. `policy` forces one algorithm for every axis (e.g. "flat").
    `axis_msgs` maps an axis to [(count, {algorithm: seconds}), ...]."""
    choice = {}
    for axis, msgs in axis_msgs.items():
        if not msgs:
            choice[axis] = "-"
            continue
        if policy is not None:
            choice[axis] = policy
            continue
        totals = {a: sum(c * t[a] for c, t in msgs) for a in ALGORITHMS}
        best = min(ALGORITHMS, key=lambda a: (totals[a], ALGORITHMS.index(a)))
        auto = sum(c * min(t.values()) for c, t in msgs)
        choice[axis] = "auto" if auto < 0.98 * totals[best] else best
    return choice


@dataclass(frozen=True)
class StepCompute:
    """Compute seconds of one configuration. Per micro-batch pass, keyed "layer" (one
    transformer layer) and "head": `forward` and `backward` (twice the forward); `reps` is how
    many of each a pass runs; `dw` is the dW GEMM of each Linear, by name."""

    forward: dict
    backward: dict
    reps: dict
    recompute: int  # 1 with full activation recomputation (one more forward per pass), else 0
    dw: dict
    micro_batch: int
    accumulation: int

    @property
    def last_backward(self) -> float:
        """Seconds of the last micro-batch's backward pass (what the data all-reduce can hide
        under)."""
        return sum(self.reps[k] * self.backward[k] for k in self.backward)

    @property
    def total(self) -> float:
        """Compute seconds per optimizer step."""
        rec = self.recompute
        return self.accumulation * sum(
            self.reps[k] * (self.forward[k] * (1 + rec) + self.backward[k]) for k in self.forward
        )


def step_compute(spec: TransformerSpec, g: Grid4D, rate: float) -> StepCompute:
    """The compute of one step at `rate` FLOP/s (compute_flops; the dW GEMM of a Linear is
    2 t k n / (Gx Gy), half its backward)."""
    mb, acc = batch_split(spec, g)
    fl = compute_flops(spec, g)
    fwd = {"layer": (fl["layer_gemm"] + fl["layer_attention"]) / rate, "head": fl["head"] / rate}
    t_tok = mb * spec.seq_len
    dw = {
        name: 2 * t_tok * k * n / (g.x * g.y) / rate
        for name, k, n, _ in spec.linears() + [spec.head()]
    }
    return StepCompute(
        forward=fwd,
        backward={k: 2 * v for k, v in fwd.items()},
        reps={"layer": spec.layers, "head": 1},
        recompute=1 if spec.recompute else 0,
        dw=dw,
        micro_batch=mb,
        accumulation=acc,
    )


@dataclass
class _Tally:
    """The collectives of one step under one choice of algorithms, summed by where they run:
    per pass group ("layer", "head") and axis, or for the whole step (comm, data_ar)."""

    comm: dict  # axis -> seconds of all its calls per step
    fwd_ar: dict  # group -> axis -> forward all-reduce seconds, one pass (exposed)
    bwd_ar: dict  # group -> axis -> backward all-reduce seconds not hidden under its dW GEMM
    fwd_ag: dict  # group -> forward z all-gather seconds, one pass
    bwd_z: dict  # group -> backward z stream seconds (all-gathers, recompute's, reduce-scatters)
    data_ar: float = 0.0  # the data-parallel all-reduces of the step

    @classmethod
    def zero(cls, groups) -> _Tally:
        return cls(
            comm={a: 0.0 for a in AXES},
            fwd_ar={k: {a: 0.0 for a in AXES} for k in groups},
            bwd_ar={k: {a: 0.0 for a in AXES} for k in groups},
            fwd_ag={k: 0.0 for k in groups},
            bwd_z={k: 0.0 for k in groups},
        )


def _tally(msgs, times, algos: dict, comp: StepCompute, slowdown=None) -> _Tally:
    """Each message's time with its axis's algorithm ("auto": the best per call), times its
    axis's factor in `slowdown` (axis -> factor; none by default), added to where it runs in
    the schedule of evaluate."""
    t = _Tally.zero(comp.forward)
    slowdown = slowdown or {}
    for m, by_algo in zip(msgs, times):
        a = algos[m.axis]
        sec = min(by_algo.values()) if a == "auto" else by_algo[a]
        sec *= slowdown.get(m.axis, 1.0)
        t.comm[m.axis] += m.count * sec
        grp = "head" if m.linear == "head" else "layer"
        role = m.role
        if role == "fwd_ar":
            t.fwd_ar[grp][m.axis] += sec
        elif role == "bwd_ar":
            t.bwd_ar[grp][m.axis] += max(0.0, sec - comp.dw[m.linear])
        elif role == "fwd_ag":
            t.fwd_ag[grp] += sec
        elif role == "bwd_ag":
            t.bwd_z[grp] += (1 + comp.recompute) * sec
        elif role == "rs":
            t.bwd_z[grp] += sec
        else:
            t.data_ar += m.count * sec
    return t


def _exposed_schedule(t: _Tally, comp: StepCompute, overlap_data: bool) -> tuple:
    """(step seconds, axis -> exposed seconds) of the schedule of evaluate."""
    rec, acc, reps = comp.recompute, comp.accumulation, comp.reps
    c_f, c_b = comp.forward, comp.backward
    exposed = {a: 0.0 for a in AXES}
    micro = 0.0
    for k in c_f:
        exp_ag_f = max(0.0, t.fwd_ag[k] - c_f[k])
        c_b_total = c_b[k] + rec * c_f[k]
        exp_z_b = max(0.0, t.bwd_z[k] - c_b_total)
        far = sum(t.fwd_ar[k].values())
        micro += reps[k] * (
            c_f[k] + far + exp_ag_f + c_b_total + rec * far + sum(t.bwd_ar[k].values()) + exp_z_b
        )
        for a in AXES:
            exposed[a] += acc * reps[k] * ((1 + rec) * t.fwd_ar[k][a] + t.bwd_ar[k][a])
        exposed["z"] += acc * reps[k] * (exp_ag_f + exp_z_b)
    data_exposed = max(0.0, t.data_ar - comp.last_backward) if overlap_data else t.data_ar
    exposed["data"] += data_exposed
    return acc * micro + data_exposed, exposed


def overlap_windows(comp: StepCompute, overlap_data: bool) -> dict:
    """Axis -> seconds of compute per step that the schedule of evaluate hides the axis's
    traffic under: the z stream under all of the layers' compute, the x and y backward
    all-reduces under their Linears' dW GEMMs, the data all-reduce under the last backward
    pass with `overlap_data` (else nothing)."""
    dw = comp.accumulation * (
        comp.reps["layer"] * sum(v for k, v in comp.dw.items() if k != "head") + comp.dw["head"]
    )
    return {
        "x": dw,
        "y": dw,
        "z": comp.total,
        "data": comp.last_backward if overlap_data else 0.0,
    }


def evaluate(
    spec: TransformerSpec,
    g: Grid4D,
    order,
    profile,
    cm: CollectiveModel,
    policy=None,
    overlap_data=False,
    msgs=None,
    baseline=None,
    slowdown=None,
):
    """Predicted step time of one configuration.

    Schedule (per micro-batch, per layer; docs/planner.md "Overlap"): forward all-reduces are
    synchronous (exposed); the z all-gathers are prefetched and hide under the layer's
    compute; each backward all-reduce hides under its Linear's dW GEMM; the backward z stream
    (all-gathers, recompute all-gathers, reduce-scatters) hides under the backward compute;
    the data-parallel all-reduce runs after the last micro-batch (exposed unless
    `overlap_data`, then hidden under the last backward pass).

    `msgs` (from messages(spec, g)) may be passed to share it across orders. With
    `baseline="flat"` (or another algorithm) returns (evaluation, baseline evaluation), the
    second with that algorithm forced on every axis. `slowdown` (axis -> factor) stretches
    every collective of an axis, after the algorithms are chosen: how much the step depends
    on that axis's traffic staying hidden. A spec whose micro_batch is AUTO_MICRO_BATCH is
    evaluated at the micro-batch that gives the least step time and fits (`msgs` unused).
    """
    if spec.micro_batch == AUTO_MICRO_BATCH:
        kw = dict(policy=policy, overlap_data=overlap_data, baseline=baseline, slowdown=slowdown)
        return _evaluate_micro_batches(spec, g, order, profile, cm, **kw)
    order_s = "-".join(parse_order(order))
    pls = grid_placements(g.sizes(), order_s, profile.ranks_per_node)
    if msgs is None:
        msgs = messages(spec, g)
    times = [cm.times(m.collective, m.nbytes, m.dtype, pls[m.axis]) for m in msgs]
    by_axis = {a: [] for a in AXES}
    for m, t in zip(msgs, times):
        by_axis[m.axis].append((m.count, t))
    comp = step_compute(spec, g, profile.compute_flops)
    mem = memory(spec, g)
    ok = fits(mem, profile)

    def schedule(algos: dict) -> Evaluation:
        tally = _tally(msgs, times, algos, comp, slowdown)
        step, exposed = _exposed_schedule(tally, comp, overlap_data)
        return Evaluation(
            grid=g,
            order=order_s,
            algorithms=algos,
            step_time=step,
            compute_time=comp.total,
            comm_time=tally.comm,
            exposed_time=exposed,
            memory=mem,
            fits=ok,
            placements=pls,
            detail={
                "micro_batch": comp.micro_batch,
                "accumulation": comp.accumulation,
                "messages": len(msgs),
                "windows": overlap_windows(comp, overlap_data),
            },
        )

    ev = schedule(_choose_axis_algorithms(by_axis, policy))
    if baseline is None:
        return ev
    return ev, schedule(_choose_axis_algorithms(by_axis, baseline))


def micro_batch_choices(spec: TransformerSpec, g: Grid4D) -> list:
    """The micro-batches evaluate tries on grid `g`: the spec's (capped at the shard's
    batch), or with AUTO_MICRO_BATCH every divisor of the shard's batch, smallest first."""
    split = batch_split(spec, g)
    if split is None or spec.micro_batch != AUTO_MICRO_BATCH:
        return [split[0]] if split else []
    per_shard = split[0] * split[1]
    return [d for d in range(1, per_shard + 1) if per_shard % d == 0]


def _better(ev: Evaluation, than: Evaluation) -> bool:
    """Whether `ev` is the better micro-batch choice: it fits where `than` does not, or it
    takes less time, or as much (everything hidden) with less communication to hide, so that
    the choice rests less on overlap."""
    if ev.fits != than.fits:
        return ev.fits
    if abs(ev.step_time - than.step_time) > 1e-9 * than.step_time:
        return ev.step_time < than.step_time
    return sum(ev.comm_time.values()) < sum(than.comm_time.values())


def _evaluate_micro_batches(spec, g, order, profile, cm, **kw):
    """evaluate with the best micro-batch of `g` (_better) among those that fit
    (activations grow with it, so the first that does not fit ends the search); the smallest
    when none fits."""
    best = best_ev = None
    for mb in micro_batch_choices(spec, g):
        s = spec.with_(micro_batch=mb)
        if best_ev is not None and not fits(memory(s, g), profile):
            break
        r = evaluate(s, g, order, profile, cm, **kw)
        ev = r[0] if isinstance(r, tuple) else r
        if best_ev is None or _better(ev, best_ev):
            best, best_ev = r, ev
    return best


def model_flops_per_step(spec: TransformerSpec) -> float:
    """6 P tokens + attention (no recomputation counted): the useful work of one step."""
    tokens = spec.global_batch * spec.seq_len
    attn = 12 * spec.layers * spec.global_batch * spec.seq_len**2 * spec.hidden
    return 6 * spec.params() * tokens + attn


def divisor_grids(world: int):
    """Every (Gx, Gy, Gz, Gdata) of positive integers whose product is `world`."""
    divs = [d for d in range(1, world + 1) if world % d == 0]
    for x in divs:
        for y in divs:
            if world % (x * y):
                continue
            for z in divs:
                if world % (x * y * z):
                    continue
                yield Grid4D(x, y, z, world // (x * y * z))


def distinct_orders(g: Grid4D) -> list:
    """Orders that place the groups differently: permutations of the axes of size > 1, the
    axes of size 1 appended in default order (their position does not matter)."""
    big = [a for a in AXES if g.size(a) > 1]
    small = [a for a in AXES if g.size(a) == 1]
    return ["-".join(p + tuple(small)) for p in itertools.permutations(big)] or ["x-y-z-data"]
