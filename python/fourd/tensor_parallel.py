"""Megatron-Core's tensor-parallel mappings (autograd functions) over fourd collectives.

Every function takes an optional ``group``: a :class:`fourd.parallel_state.Group`, a torch
process group of fourd's backend (it names its axis in ``fourd_axis``), an axis name ("x", "y",
"z", "data", "world") or a tuple of names. The default is the tensor-parallel group
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

from .errors import InvalidArgumentError
from .grid import Subgroup, mask_name
from .parallel_state import TP_AXES, Group, default_grid, mask_obj

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
    """(grid, axis, size, rank) of a group argument; axis is what fourd's collectives take."""

    __slots__ = ("grid", "axis", "size", "rank")

    def __init__(self, grid, axis):
        self.grid = grid
        self.axis = axis
        self.size = grid.size(axis)
        self.rank = grid.rank(axis)

    @property
    def name(self) -> str:
        mask = getattr(self.axis, "mask", None)
        return mask_name(mask) if isinstance(mask, int) else self.axis.name


_cache: dict = {}


def _resolve(group) -> _Resolved:
    """A Group (its grid and axis), a torch group of fourd's backend (its ``fourd_axis``), or an
    axis argument on the default grid (None: the tensor-parallel axes)."""
    if isinstance(group, Group):
        grid, axis = group.grid, group.fourd_axis
    else:
        grid = default_grid()
        axis = getattr(group, "fourd_axis", TP_AXES if group is None else group)
        if not isinstance(axis, Subgroup):
            axis = mask_obj(axis)
    key = (id(grid), id(axis))
    r = _cache.get(key)
    if r is None or r.grid is not grid or r.axis is not axis:
        r = _Resolved(grid, axis)
        _cache[key] = r
    return r


def _check_not_scalar(fn: str, t: torch.Tensor):
    if t.dim() == 0:
        raise InvalidArgumentError(f"{fn}: input: expected at least one dimension, found a scalar")


def _check_divides(fn: str, t: torch.Tensor, dim: int, g: _Resolved):
    _check_not_scalar(fn, t)
    n = t.shape[dim]
    if n % g.size:
        which = "last" if dim == -1 else "first"
        raise InvalidArgumentError(
            f"{fn}: input: expected its {which} dimension to be divisible by the group size "
            f"{g.size} ({g.name}), found {n} (shape {tuple(t.shape)})"
        )


# ---- primitives (no autograd) -------------------------------------------------------------


def _all_reduce(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    out = t.detach().clone(memory_format=torch.contiguous_format)
    g.grid.all_reduce(out, g.axis)
    return out


def _split(t: torch.Tensor, dim: int, g: _Resolved) -> torch.Tensor:
    c = t.shape[dim] // g.size
    return t.narrow(dim, g.rank * c, c).contiguous()


def _gather_first(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    t = t.detach().contiguous()
    out = torch.empty((g.size * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    g.grid.all_gather(out, t, g.axis)
    return out


def _gather_last(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    t = t.detach().contiguous()
    out = torch.empty((g.size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
    g.grid.all_gather(out, t, g.axis)
    # out[p] is group rank p's chunk: (..., c) -> (..., P, c) -> (..., P*c)
    return out.movedim(0, -2).reshape(tuple(t.shape[:-1]) + (g.size * t.shape[-1],))


def _reduce_scatter_first(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    t = t.detach().contiguous()
    out = torch.empty((t.shape[0] // g.size,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    g.grid.reduce_scatter(out, t, g.axis)
    return out


def _reduce_scatter_last(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    c = t.shape[-1] // g.size
    blocks = t.detach().reshape(tuple(t.shape[:-1]) + (g.size, c)).movedim(-2, 0).contiguous()
    out = torch.empty(tuple(t.shape[:-1]) + (c,), dtype=t.dtype, device=t.device)
    g.grid.reduce_scatter(out, blocks, g.axis)
    return out


# ---- autograd functions -------------------------------------------------------------------


def _split_first(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    return _split(t, 0, g)


def _split_last(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    return _split(t, -1, g)


def _mapping(name: str, forward, backward):
    """An autograd function ``apply(x, g)``: ``forward(x, g)``, and the gradient
    ``backward(dy, g)`` (none for ``g``)."""

    def fwd(ctx, x, g):
        ctx.g = g
        return forward(x, g)

    def bwd(ctx, dy):
        return backward(dy, ctx.g), None

    return type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(fwd), "backward": staticmethod(bwd)},
    )


def _identity_view(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    # The identity as a view: a distinct tensor object that shares the input's storage.
    return t.view_as(t)


def _identity(t: torch.Tensor, g: _Resolved) -> torch.Tensor:
    return t


_CopyToRegion = _mapping("_CopyToRegion", _identity_view, _all_reduce)
_ReduceFromRegion = _mapping("_ReduceFromRegion", _all_reduce, _identity)
_ScatterLast = _mapping("_ScatterLast", _split_last, _gather_last)
_GatherLast = _mapping("_GatherLast", _gather_last, _split_last)
_ScatterFirst = _mapping("_ScatterFirst", _split_first, _gather_first)
_GatherFirst = _mapping("_GatherFirst", _gather_first, _reduce_scatter_first)
_GatherFirstSplitGrad = _mapping("_GatherFirstSplitGrad", _gather_first, _split_first)
_ReduceScatterFirst = _mapping("_ReduceScatterFirst", _reduce_scatter_first, _gather_first)
_GatherLastReduceScatter = _mapping("_GatherLastReduceScatter", _gather_last, _reduce_scatter_last)
_ReduceScatterLast = _mapping("_ReduceScatterLast", _reduce_scatter_last, _gather_last)


def _apply(fn: str, function, input_, group, divide_dim=None, need_dim=False):
    """`function` over the resolved `group`, or `input_` itself for a group of one rank. Checks
    first that input_ has a dimension (need_dim) or that `divide_dim` splits evenly."""
    g = _resolve(group)
    if g.size == 1:
        return input_
    if divide_dim is not None:
        _check_divides(fn, input_, divide_dim, g)
    elif need_dim:
        _check_not_scalar(fn, input_)
    return function.apply(input_, g)


# ---- public API ----------------------------------------------------------------------------


def copy_to_tensor_model_parallel_region(input_, group=None):
    """Forward: identity. Backward: all-reduce (sum) of the gradient over `group`."""
    return _apply("copy_to_tensor_model_parallel_region", _CopyToRegion, input_, group)


def reduce_from_tensor_model_parallel_region(input_, group=None):
    """Forward: all-reduce (sum) over `group`. Backward: identity."""
    return _apply("reduce_from_tensor_model_parallel_region", _ReduceFromRegion, input_, group)


def scatter_to_tensor_model_parallel_region(input_, group=None):
    """Forward: keep chunk (group rank) of the last dimension. Backward: all-gather it."""
    return _apply(
        "scatter_to_tensor_model_parallel_region", _ScatterLast, input_, group, divide_dim=-1
    )


def gather_from_tensor_model_parallel_region(input_, group=None):
    """Forward: all-gather along the last dimension. Backward: keep my chunk of the gradient."""
    return _apply(
        "gather_from_tensor_model_parallel_region", _GatherLast, input_, group, need_dim=True
    )


def scatter_to_sequence_parallel_region(input_, group=None):
    """Forward: keep chunk (group rank) of the first dimension. Backward: all-gather it."""
    return _apply("scatter_to_sequence_parallel_region", _ScatterFirst, input_, group, divide_dim=0)


def gather_from_sequence_parallel_region(
    input_,
    tensor_parallel_output_grad: bool = True,
    group=None,
    output_split_sizes=None,
    use_global_buffer: bool = False,
):
    """Forward: all-gather along the first dimension. Backward: reduce-scatter of the gradient
    (tensor_parallel_output_grad=True, the gradient is a partial sum on each rank) or keep my
    chunk (False, the gradient is already complete on each rank). Uneven splits
    (output_split_sizes) are not supported; use_global_buffer is accepted and ignored."""
    if output_split_sizes is not None:
        raise InvalidArgumentError(
            "gather_from_sequence_parallel_region: output_split_sizes: uneven splits are not "
            "supported; expected None"
        )
    function = _GatherFirst if tensor_parallel_output_grad else _GatherFirstSplitGrad
    return _apply("gather_from_sequence_parallel_region", function, input_, group, need_dim=True)


def reduce_scatter_to_sequence_parallel_region(
    input_, group=None, input_split_sizes=None, use_global_buffer: bool = False
):
    """Forward: reduce-scatter (sum) along the first dimension. Backward: all-gather it."""
    if input_split_sizes is not None:
        raise InvalidArgumentError(
            "reduce_scatter_to_sequence_parallel_region: input_split_sizes: uneven splits are "
            "not supported; expected None"
        )
    return _apply(
        "reduce_scatter_to_sequence_parallel_region",
        _ReduceScatterFirst,
        input_,
        group,
        divide_dim=0,
    )


def all_gather_last_dim_from_tensor_parallel_region(input_, group=None):
    """Forward: all-gather along the last dimension. Backward: reduce-scatter along it."""
    return _apply(
        "all_gather_last_dim_from_tensor_parallel_region",
        _GatherLastReduceScatter,
        input_,
        group,
        need_dim=True,
    )


def reduce_scatter_last_dim_to_tensor_parallel_region(input_, group=None):
    """Forward: reduce-scatter (sum) along the last dimension. Backward: all-gather along it."""
    return _apply(
        "reduce_scatter_last_dim_to_tensor_parallel_region",
        _ReduceScatterLast,
        input_,
        group,
        divide_dim=-1,
    )
