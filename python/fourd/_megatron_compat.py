"""Megatron-Core's vocabulary as fourd.parallel_state speaks it: the order strings and the
arguments of ``initialize_model_parallel`` translated onto the 4D grid (with a clear error for
what the grid cannot do), and the rank-arithmetic helpers, the memory buffer and the NCCL
option helpers that ``megatron.core.parallel_state`` exports (megatron-core 0.19), so that
code importing them from a drop-in parallel_state finds them.

fourd's grid has tensor-parallel axes (x, y, z; Megatron's tp) and a data axis (dp). Megatron's
other axes (context cp, expert ep, pipeline pp, GTP weight rematerialisation gtp_remat) have
size 1 under fourd: their groups are each rank alone.
"""

from __future__ import annotations

import contextlib
import math

from .errors import InvalidArgumentError

#: Megatron's parallelism tokens, in the order its RankGenerator appends the ones an order
#: string leaves out.
MEGATRON_TOKENS = ("tp", "pp", "dp", "ep", "cp", "gtp_remat")


def grid_order(order: str, tp: int, dp: int) -> str:
    """fourd's axis order for an order string. fourd's own (a permutation of its axes, such as
    "x-y-z-data") is returned as is. Megatron's ("tp-cp-ep-dp-pp": the first token varies
    fastest) becomes the same layout on the grid: tp is x-y-z (x fastest), dp is data, and the
    size-1 tokens drop out. Tokens Megatron would append (those the string leaves out) go at
    the end, as Megatron's RankGenerator puts them; tp and dp sizes above 1 must be named."""
    if not isinstance(order, str):
        raise InvalidArgumentError(
            f"order: expected a string such as 'tp-cp-ep-dp-pp', found {order!r}"
        )
    tokens = order.lower().split("-")
    if not set(tokens) <= set(MEGATRON_TOKENS):
        return order  # fourd's vocabulary: fourd.init parses and checks it
    if len(set(tokens)) != len(tokens):
        raise InvalidArgumentError(f"order: a token appears twice in {order!r}")
    for name, size in (("tp", tp), ("dp", dp)):
        if name not in tokens and size != 1:
            raise InvalidArgumentError(
                f"order: the {name} size is {size}, but {order!r} does not name {name}"
            )
    tokens += [t for t in MEGATRON_TOKENS if t not in tokens]
    return "-".join("x-y-z" if t == "tp" else "data" for t in tokens if t in ("tp", "dp"))


def _expect(arg: str, value, expected, why: str) -> None:
    if value != expected:
        raise InvalidArgumentError(f"{arg}: {why}; expected {expected!r}, found {value!r}")


_NO_AXIS = "fourd's grid has no such axis"
# initialize_model_parallel's arguments that must keep their defaults on fourd's grid.
_FIXED = (
    ("pipeline_model_parallel_size", 1, "fourd's grid has no pipeline axis"),
    (
        "virtual_pipeline_model_parallel_size",
        None,
        "interleaving needs pipeline stages, and fourd's grid has none",
    ),
    ("context_parallel_size", 1, _NO_AXIS + " (context parallelism)"),
    ("hybrid_context_parallel", False, "it needs context parallelism, and " + _NO_AXIS),
    ("expert_model_parallel_size", 1, _NO_AXIS + " (expert parallelism)"),
    ("gtp_remat_size", 1, _NO_AXIS + " (GTP weight rematerialisation)"),
    ("expert_gtp_remat_size", 1, _NO_AXIS + " (expert GTP weight rematerialisation)"),
    (
        "num_distributed_optimizer_instances",
        1,
        "partial distributed-optimizer groups are not supported by fourd.parallel_state",
    ),
    ("rank_offset", 0, "fourd's grid spans every rank"),
)


def check_megatron_arguments(a: dict, tp: int, world: int) -> None:
    """Raise for the arguments of Megatron's ``initialize_model_parallel`` that fourd's grid
    cannot honour (`a` holds them by name). What concerns only NCCL communicators (SHARP, the
    NCCL configuration file, high-priority streams, the pipeline backend) is checked as
    Megatron checks it and has no other effect: fourd's groups are not NCCL communicators."""
    for arg, expected, why in _FIXED:
        _expect(arg, a[arg], expected, why)
    if a["expert_tensor_parallel_size"] is not None:
        why = "experts share the tensor-parallel axes (x, y, z) on fourd's grid"
        _expect("expert_tensor_parallel_size", a["expert_tensor_parallel_size"], tp, why)
    if a["local_world_size"] is not None:
        _expect("local_world_size", a["local_world_size"], world, "fourd's grid spans every rank")
    sizes = a["hierarchical_context_parallel_sizes"]
    if sizes and math.prod(sizes) != 1:
        why = "their product must be the context-parallel size, 1 on fourd's grid"
        _expect("hierarchical_context_parallel_sizes", list(sizes), [1] * len(sizes), why)
    sharp = a["sharp_enabled_group"]
    if sharp is not None and not a["use_sharp"]:
        raise InvalidArgumentError("sharp_enabled_group: only valid when use_sharp is True")
    if sharp not in (None, "dp"):
        why = "Megatron's choices are 'dp' and 'dp_replica'"
        if sharp == "dp_replica":
            why = "'dp_replica' needs num_distributed_optimizer_instances > 1"
        _expect("sharp_enabled_group", sharp, "dp", why)
    pp_backend = a["pipeline_model_parallel_comm_backend"]
    if pp_backend not in (None, "nccl", "ucc"):
        raise InvalidArgumentError(
            f"pipeline_model_parallel_comm_backend: expected None, 'nccl' or 'ucc', found "
            f"{pp_backend!r}"
        )


# ---- Megatron's rank arithmetic --------------------------------------------------------------


def _offsets(sizes, strides, dims) -> list:
    """Rank offsets of every combination of the dimensions `dims`, the first varying fastest."""
    out = [0]
    for d in dims:
        out = [o + k * strides[d] for k in range(sizes[d]) for o in out]
    return out


def generate_masked_orthogonal_rank_groups(world_size: int, parallel_size, mask) -> list:
    """Megatron's groups of an orthogonal layout: with the parallel sizes listed fastest first
    (rank = sum of index_i * stride_i, stride_i the product of the sizes before i), the groups
    whose members differ only along the dimensions where `mask` is True. Groups are listed with
    the other dimensions' first varying fastest; members with the masked dimensions' first
    varying fastest (Megatron's own order)."""
    sizes = [int(s) for s in parallel_size]
    if len(mask) != len(sizes):
        raise InvalidArgumentError(
            f"mask: expected {len(sizes)} entries (one per parallel size), found {len(mask)}"
        )
    if math.prod(sizes) != world_size:
        raise InvalidArgumentError(
            f"parallel_size: expected sizes whose product is world_size {world_size}, found {sizes}"
        )
    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    inner = [i for i, m in enumerate(mask) if m]
    outer = [i for i, m in enumerate(mask) if not m]
    members = _offsets(sizes, strides, inner)
    return [[base + m for m in members] for base in _offsets(sizes, strides, outer)]


class RankGenerator:
    """Megatron's RankGenerator: the rank groups of a (tp, ep, dp, pp, cp, gtp_remat) layout in
    a given order ("tp-cp-ep-dp-pp": first token fastest), for code that builds its own groups.
    ``get_ranks("tp-dp")`` lists the groups spanning those tokens, offset by rank_offset."""

    def __init__(self, tp, ep, dp, pp, cp, order, rank_offset=0, gtp_remat=1):
        if ep != 1 and cp != 1:
            raise InvalidArgumentError("ep, cp: expected at most one of them above 1")
        self.tp, self.ep, self.dp, self.pp, self.cp = tp, ep, dp, pp, cp
        self.gtp_remat = gtp_remat
        self.rank_offset = rank_offset
        self.world_size = tp * dp * pp * cp * ep * gtp_remat
        self.name_to_size = {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "ep": ep,
            "cp": cp,
            "gtp_remat": gtp_remat,
        }
        tokens = order.lower().split("-")
        for name, size in self.name_to_size.items():
            if name not in tokens:
                if size != 1:
                    raise InvalidArgumentError(
                        f"order: the size of {name} is {size}, but {order!r} does not name it"
                    )
                tokens.append(name)
        self.order = "-".join(tokens)
        self.ordered_size = [self.name_to_size[t] for t in tokens]

    def get_mask(self, order: str, token: str) -> list:
        """One bool per token of `order`: True for the tokens named in `token` ("tp-dp")."""
        ordered = order.split("-")
        wanted = set(token.split("-"))
        unknown = wanted - set(ordered)
        if unknown:
            raise InvalidArgumentError(f"token: {sorted(unknown)} not in the order {order!r}")
        return [t in wanted for t in ordered]

    def get_ranks(self, token: str) -> list:
        mask = self.get_mask(self.order, token)
        groups = generate_masked_orthogonal_rank_groups(self.world_size, self.ordered_size, mask)
        return [[r + self.rank_offset for r in g] for g in groups]

    def get_gtp_ranks(self, gtp_remat_size: int) -> list:
        """The GTP weight-rematerialisation groups (each rank alone when the size is 1)."""
        _expect("gtp_remat_size", gtp_remat_size, self.gtp_remat, "the layout's gtp_remat size")
        return self.get_ranks("gtp_remat")


def default_embedding_ranks(pp_ranks) -> list:
    """The ranks holding word embeddings: the first and last pipeline stages."""
    return [pp_ranks[0]] if len(pp_ranks) == 1 else [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks(pp_ranks) -> list:
    """The ranks holding position embeddings: the first pipeline stage."""
    return [pp_ranks[0]]


def hierarchical_rank_lists(ranks, sizes) -> list:
    """For each level of a hierarchy of group sizes (innermost first), the sub-lists of `ranks`
    that level groups: level i groups members that differ in digit i of their position in
    `ranks`, read as a mixed-radix number with the sizes as digits, the first fastest."""
    if math.prod(sizes) != len(ranks):
        raise InvalidArgumentError(
            f"hierarchical_group_sizes: expected sizes whose product is the group size "
            f"{len(ranks)}, found {list(sizes)}"
        )
    levels = []
    for level, size in enumerate(sizes):
        inner = math.prod(sizes[:level])  # positions within one block of this level
        outer = len(ranks) // (inner * size)
        levels.append(
            [
                [ranks[o * inner * size + k * inner + i] for k in range(size)]
                for o in range(outer)
                for i in range(inner)
            ]
        )
    return levels


def nccl_options(pg_name, nccl_comm_cfgs):
    """Megatron's ``get_nccl_options``: None, always. NCCL communicator settings have no
    meaning for fourd's groups, which are not NCCL communicators."""
    return None


def overwrite_nccl_comm_cfgs(nccl_comm_cfgs, pg_name, key_value_pair) -> None:
    """Set one key of one group's entry in a Megatron NCCL configuration dict."""
    nccl_comm_cfgs.setdefault(pg_name, {})[key_value_pair[0]] = key_value_pair[1]


class GlobalMemoryBuffer:
    """Megatron's reusable scratch buffers: ``get_tensor(shape, dtype, name)`` returns a view of
    the first numel(shape) elements of one flat buffer per (name, dtype), grown when too small.
    Callers must not use two tensors of the same name at once. Buffers live on the current CUDA
    device when CUDA is available, else on the CPU."""

    def __init__(self):
        self.buffer: dict = {}

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        import torch

        n = math.prod(tensor_shape)
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < n:
            device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
            with (mem_alloc_context or contextlib.nullcontext)():
                buf = torch.empty(n, dtype=dtype, device=device, requires_grad=False)
            self.buffer[(name, dtype)] = buf
        return buf[:n].view(*tensor_shape)
