"""Megatron-Core's tensor-parallel mappings (autograd functions) over fourd collectives.

Every function takes an optional ``group``: a :class:`fourd.parallel_state.Group`, an axis name
("x", "y", "z", "data", "world") or a tuple of names. The default is the tensor-parallel group
(x*y*z) of :mod:`fourd.parallel_state`, or of the current fourd grid when parallel_state is not
initialised. With a group of one rank every function returns its input unchanged (no copy, no
communication). Chunk i of a split or gather belongs to group rank i.

=============================================  ========================  ========================
function                                       forward                   backward
=============================================  ========================  ========================
copy_to_tensor_model_parallel_region           identity                  all-reduce
reduce_from_tensor_model_parallel_region       all-reduce                identity
scatter_to_tensor_model_parallel_region        split last dim            all-gather last dim
gather_from_tensor_model_parallel_region       all-gather last dim       split last dim
scatter_to_sequence_parallel_region            split first dim           all-gather first dim
gather_from_sequence_parallel_region           all-gather first dim      reduce-scatter first dim
                                                                         (split if
                                                                         tensor_parallel_output_
                                                                         grad=False)
reduce_scatter_to_sequence_parallel_region     reduce-scatter first dim  all-gather first dim
all_gather_last_dim_from_tensor_parallel_      all-gather last dim       reduce-scatter last dim
region
reduce_scatter_last_dim_to_tensor_parallel_    reduce-scatter last dim   all-gather last dim
region
=============================================  ========================  ========================

A dimension that the group size does not divide raises :class:`fourd.InvalidArgumentError`
before any communication. Gradients are never modified in place (autograd may hand the same
gradient tensor to several consumers); each all-reduce works on a fresh copy.
"""

from __future__ import annotations

import torch

from . import grid as _gridmod
from . import parallel_state as _ps
from .errors import InvalidArgumentError

__all__ = [
    "all_gather_last_dim_from_tensor_parallel_region",
    "copy_to_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region",
    "gather_from_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "reduce_scatter_last_dim_to_tensor_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
    "scatter_to_tensor_model_parallel_region",
]


class _Resolved:
    """(grid, mask, size, rank) of a group argument."""

    __slots__ = ("grid", "mask", "size", "rank")

    def __init__(self, grid, mask):
        self.grid = grid
        self.mask = mask
        self.size = grid.size(mask)
        self.rank = grid.rank(mask)


_cache: dict = {}


def _resolve(group) -> _Resolved:
    if isinstance(group, _ps.Group):
        grid, mask = group.grid, _ps.mask_obj(group.mask)
    else:
        grid = _ps._state.grid if _ps._state.grid is not None else _gridmod.get_grid()
        mask = _gridmod.axis_mask(_ps.TP_AXES if group is None else group)
    mask = _ps.mask_obj(mask)
    key = (id(grid), mask.mask)
    r = _cache.get(key)
    if r is None or r.grid is not grid:
        r = _Resolved(grid, mask)
        _cache[key] = r
    return r


def _check_divides(fn: str, t: torch.Tensor, dim: int, g: _Resolved):
    if t.dim() == 0:
        raise InvalidArgumentError(f"{fn}: input: expected at least one dimension, found a scalar")
    n = t.shape[dim]
    if n % g.size:
        which = "last" if dim == -1 else "first"
        raise InvalidArgumentError(
            f"{fn}: input: expected its {which} dimension to be divisible by the group size "
            f"{g.size} ({_gridmod.mask_name(g.mask.mask)}), found {n} (shape {tuple(t.shape)})")


# ---- primitives (no autograd) -------------------------------------------------------------

def _all_reduce(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    out = t.detach().clone(memory_format=torch.contiguous_format)
    g.grid.all_reduce(out, g.mask)
    return out


def _split(t: torch.Tensor, dim: int, g: _Resolved) -> torch.Tensor:
    c = t.shape[dim] // g.size
    return t.narrow(dim, g.rank * c, c).contiguous()


def _gather_first(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    t = t.detach().contiguous()
    out = torch.empty((g.size * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    g.grid.all_gather(out, t, g.mask)
    return out


def _gather_last(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    t = t.detach().contiguous()
    out = torch.empty((g.size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
    g.grid.all_gather(out, t, g.mask)
    # out[p] is group rank p's chunk: (..., c) -> (..., P, c) -> (..., P*c)
    return out.movedim(0, -2).reshape(tuple(t.shape[:-1]) + (g.size * t.shape[-1],))


def _reduce_scatter_first(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    t = t.detach().contiguous()
    out = torch.empty((t.shape[0] // g.size,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    g.grid.reduce_scatter(out, t, g.mask)
    return out


def _reduce_scatter_last(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    c = t.shape[-1] // g.size
    blocks = t.detach().reshape(tuple(t.shape[:-1]) + (g.size, c)).movedim(-2, 0).contiguous()
    out = torch.empty(tuple(t.shape[:-1]) + (c,), dtype=t.dtype, device=t.device)
    g.grid.reduce_scatter(out, blocks, g.mask)
    return out


# ---- autograd functions --------------------------------------------------------------------

class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return _all_reduce(dy, ctx.g), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        return _all_reduce(x, g)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _ScatterLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _split(x, -1, g)

    @staticmethod
    def backward(ctx, dy):
        return _gather_last(dy, ctx.g), None


class _GatherLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _gather_last(x, g)

    @staticmethod
    def backward(ctx, dy):
        return _split(dy, -1, ctx.g), None


class _ScatterFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _split(x, 0, g)

    @staticmethod
    def backward(ctx, dy):
        return _gather_first(dy, ctx.g), None


class _GatherFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, reduce_grad):
        ctx.g = g
        ctx.reduce_grad = reduce_grad
        return _gather_first(x, g)

    @staticmethod
    def backward(ctx, dy):
        if ctx.reduce_grad:
            return _reduce_scatter_first(dy, ctx.g), None, None
        return _split(dy, 0, ctx.g), None, None


class _ReduceScatterFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _reduce_scatter_first(x, g)

    @staticmethod
    def backward(ctx, dy):
        return _gather_first(dy, ctx.g), None


class _GatherLastReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _gather_last(x, g)

    @staticmethod
    def backward(ctx, dy):
        return _reduce_scatter_last(dy, ctx.g), None


class _ReduceScatterLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return _reduce_scatter_last(x, g)

    @staticmethod
    def backward(ctx, dy):
        return _gather_last(dy, ctx.g), None


# ---- public API ----------------------------------------------------------------------------

def copy_to_tensor_model_parallel_region(input_, group=None):
    """Forward: identity. Backward: all-reduce (sum) of the gradient over `group`."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    return _CopyToRegion.apply(input_, g)


def reduce_from_tensor_model_parallel_region(input_, group=None):
    """Forward: all-reduce (sum) over `group`. Backward: identity."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    return _ReduceFromRegion.apply(input_, g)


def scatter_to_tensor_model_parallel_region(input_, group=None):
    """Forward: keep chunk (group rank) of the last dimension. Backward: all-gather it."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    _check_divides("scatter_to_tensor_model_parallel_region", input_, -1, g)
    return _ScatterLast.apply(input_, g)


def gather_from_tensor_model_parallel_region(input_, group=None):
    """Forward: all-gather along the last dimension. Backward: keep my chunk of the gradient."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    if input_.dim() == 0:
        raise InvalidArgumentError(
            "gather_from_tensor_model_parallel_region: input: expected at least one dimension, "
            "found a scalar")
    return _GatherLast.apply(input_, g)


def scatter_to_sequence_parallel_region(input_, group=None):
    """Forward: keep chunk (group rank) of the first dimension. Backward: all-gather it."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    _check_divides("scatter_to_sequence_parallel_region", input_, 0, g)
    return _ScatterFirst.apply(input_, g)


def gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad: bool = True,
                                         group=None, output_split_sizes=None,
                                         use_global_buffer: bool = False):
    """Forward: all-gather along the first dimension. Backward: reduce-scatter of the gradient
    (tensor_parallel_output_grad=True, the gradient is a partial sum on each rank) or keep my
    chunk (False, the gradient is already complete on each rank). Uneven splits
    (output_split_sizes) are not supported; use_global_buffer is accepted and ignored."""
    if output_split_sizes is not None:
        raise InvalidArgumentError(
            "gather_from_sequence_parallel_region: output_split_sizes: uneven splits are not "
            "supported; expected None")
    g = _resolve(group)
    if g.size == 1:
        return input_
    if input_.dim() == 0:
        raise InvalidArgumentError(
            "gather_from_sequence_parallel_region: input: expected at least one dimension, found "
            "a scalar")
    return _GatherFirst.apply(input_, g, bool(tensor_parallel_output_grad))


def reduce_scatter_to_sequence_parallel_region(input_, group=None, input_split_sizes=None,
                                               use_global_buffer: bool = False):
    """Forward: reduce-scatter (sum) along the first dimension. Backward: all-gather it."""
    if input_split_sizes is not None:
        raise InvalidArgumentError(
            "reduce_scatter_to_sequence_parallel_region: input_split_sizes: uneven splits are "
            "not supported; expected None")
    g = _resolve(group)
    if g.size == 1:
        return input_
    _check_divides("reduce_scatter_to_sequence_parallel_region", input_, 0, g)
    return _ReduceScatterFirst.apply(input_, g)


def all_gather_last_dim_from_tensor_parallel_region(input_, group=None):
    """Forward: all-gather along the last dimension. Backward: reduce-scatter along it."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    if input_.dim() == 0:
        raise InvalidArgumentError(
            "all_gather_last_dim_from_tensor_parallel_region: input: expected at least one "
            "dimension, found a scalar")
    return _GatherLastReduceScatter.apply(input_, g)


def reduce_scatter_last_dim_to_tensor_parallel_region(input_, group=None):
    """Forward: reduce-scatter (sum) along the last dimension. Backward: all-gather along it."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    _check_divides("reduce_scatter_last_dim_to_tensor_parallel_region", input_, -1, g)
    return _ReduceScatterLast.apply(input_, g)
