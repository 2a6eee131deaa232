"""fourd.nn.Linear: AxoNN's 4D-parallel fully-connected layer (Y = X W^T + b).

Layout of a plain layer (transpose=False) with W of shape (out n, in k), on the rank with grid
coordinates (x, y, z, data):

- weight: W is cut into Gy x Gx blocks of (n/Gy) x (k/Gx); block (y, x) is flattened and cut
  into Gz pieces; this rank keeps piece z, a 1-D parameter of n*k/(Gx*Gy*Gz) elements.
- input: (..., k/Gx): the x-th slice of the features, for this rank's batch shard; ranks that
  differ only in x or y hold the same batch shard (the shard is indexed by (data, z)).
- output: (..., n/Gy): the y-th slice of the output features, complete (after the all-reduce
  over x), the same on every x.
- bias: the y-th slice (n/Gy), replicated over x and z; added after the all-reduce. Its
  gradient is summed over the batch shards: over ("z", "data"), by fourd.nn.sync_gradients.

transpose=True swaps the roles of x and y (input features split over y, output over x), so a
plain layer followed by a transposed one needs no redistribution between them.

Collectives per call (elements per rank; T = tokens of this rank's shard, kl = k/Gcol,
nl = n/Grow, Gcol = Gx and Grow = Gy for a plain layer, swapped when transposed):

  forward   all-gather  weight   over z     nl*kl          (prefetched with OAG)
            all-reduce  output   over Gcol  T*nl
  backward  all-gather  weight   over z     nl*kl          (prefetched with OAG)
            all-reduce  dX       over Grow  T*kl           (async under the dW GEMM with OAR)
            reduce-scatter dW    over z     nl*kl -> nl*kl/Gz (deferred with ORS)
  step      all-reduce  dW       over data  nl*kl/Gz       (fourd.nn.sync_gradients, bucketed)
            all-reduce  db       over z+data nl            (same, bucketed)
"""

from __future__ import annotations

import math

import torch

from ..errors import InvalidArgumentError
from ..parallel_state import default_grid, mask_obj
from .grad_sync import DEFAULT_GRAD_AXES, GRAD_AXES_ATTR


def deliver_grad(param: torch.nn.Parameter, grad: torch.Tensor) -> None:
    """Hand `grad` to the leaf `param` as autograd's AccumulateGrad does: its tensor hooks
    (``register_hook``, each may replace the gradient), accumulation into ``.grad``, then its
    post-accumulate-grad hooks. A weight gradient deferred by ORS arrives this way, so hooks
    such as the data-parallel buckets' see it like any other."""
    hooks = param._backward_hooks
    if hooks:
        for h in list(hooks.values()):
            r = h(grad)
            if r is not None:
                grad = r
    with torch.no_grad():
        if param.grad is None:
            param.grad = grad.view_as(param) if grad.shape != param.shape else grad
        else:
            param.grad.add_(grad.view_as(param.grad))
    post = getattr(param, "_post_accumulate_grad_hooks", None)
    if post:
        for h in list(post.values()):
            h(param)


class _LinearFn(torch.autograd.Function):
    """Y_partial = X W_block^T, all-reduced over the column axis. The gathered block is rebuilt
    in backward (never kept).

    `w` is the weight shard, so autograd accumulates the gradient this returns and runs the
    weight's hooks; or, when the weight gradient is deferred (ORS), a zero-size token that
    stands in for it: autograd would otherwise call the weight's hooks with None at once, and
    the engine delivers the real gradient through those hooks later."""

    @staticmethod
    def forward(ctx, x, w, layer, handle, defer):
        block = layer._forward_block(handle)
        x2 = x.reshape(-1, layer.local_in)
        y = torch.matmul(x2, block.t())
        if layer._gcol > 1:
            layer.grid.all_reduce(y, layer._col_mask)
        ctx.save_for_backward(x)
        ctx.layer = layer
        ctx.handle = handle
        ctx.defer = defer
        return y.view(tuple(x.shape[:-1]) + (layer.local_out,))

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        (x,) = ctx.saved_tensors
        eng = layer.engine if ctx.handle is not None else None
        if eng is not None:
            eng.on_backward(layer, ctx.handle)
        block = layer._backward_block(ctx.handle)
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy2 = dy.reshape(-1, layer.local_out)
        x2 = x.reshape(-1, layer.local_in)
        oar = eng is not None and eng.all_reduce
        ors = ctx.defer
        dx = gw = None
        dx_work = None
        # With ORS and no backward all-reduce, dW goes first so its reduce-scatter starts early.
        dw_first = ors and layer._grow == 1
        if need_dw and dw_first:
            gw = layer._weight_grad(dy2, x2, eng, ors)
        if need_dx:
            dx = torch.matmul(dy2, block)
            if layer._grow > 1:
                dx_work = layer.grid.all_reduce(dx, layer._row_mask, async_op=oar)
        if need_dw and not dw_first:
            gw = layer._weight_grad(dy2, x2, eng, ors)
        if dx_work is not None:
            dx_work.wait()
        if dx is not None:
            dx = dx.view(x.shape)
        return dx, gw, None, None, None


class Linear(torch.nn.Module):
    """4D-parallel ``torch.nn.Linear(in_features, out_features, bias)``.

    in_features / out_features are the full (unsharded) sizes. Requires Gcol | in_features,
    Grow | out_features and Gz | (in/Gcol)*(out/Grow) (Gcol, Grow = Gx, Gy, swapped when
    transpose=True). The full weight is initialised as torch.nn.Linear does (same RNG draws, so
    the same seed gives the same full weight as torch.nn.Linear), then this rank's shard kept;
    init_method(full_weight) replaces the weight initialisation. grid: default the
    parallel_state grid, else the current fourd grid.

    ``load_state_dict`` accepts the full weight (out, in) and bias (out,) as well as this rank's
    shards; :meth:`full_weight` / :func:`fourd.nn.full_state_dict` gather them back.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        transpose: bool = False,
        *,
        grid=None,
        init_method=None,
        dtype=None,
        device=None,
    ):
        super().__init__()
        g = default_grid(grid)
        self.grid = g
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.transpose = bool(transpose)
        self.row_axis, self.col_axis = ("x", "y") if self.transpose else ("y", "x")
        self._row_mask = mask_obj(self.row_axis)
        self._col_mask = mask_obj(self.col_axis)
        self._z_mask = mask_obj("z")
        self._grow, self._gcol, self._gz = (
            g.size(self.row_axis),
            g.size(self.col_axis),
            g.size("z"),
        )
        self._row, self._col, self._zc = (g.rank(self.row_axis), g.rank(self.col_axis), g.rank("z"))
        kind = "transposed " if self.transpose else ""
        if self.out_features % self._grow:
            raise InvalidArgumentError(
                f"out_features: a {kind}fourd.nn.Linear splits it over {self.row_axis} "
                f"(G{self.row_axis}={self._grow}); expected a multiple of {self._grow}, found "
                f"{self.out_features}"
            )
        if self.in_features % self._gcol:
            raise InvalidArgumentError(
                f"in_features: a {kind}fourd.nn.Linear splits it over {self.col_axis} "
                f"(G{self.col_axis}={self._gcol}); expected a multiple of {self._gcol}, found "
                f"{self.in_features}"
            )
        self.local_out = self.out_features // self._grow
        self.local_in = self.in_features // self._gcol
        block = self.local_out * self.local_in
        if block % self._gz:
            raise InvalidArgumentError(
                f"in_features, out_features: the weight block ({self.local_out} x "
                f"{self.local_in} = {block} elements) is split over z (Gz={self._gz}); expected "
                f"a multiple of {self._gz}"
            )
        self.shard_numel = block // self._gz
        #: The enabled fourd.nn.Overlap that drives this layer's collectives (its enable() sets
        #: it, disable() clears it), or None.
        self.engine = None
        self._grad_token = None  # stands in for the weight in autograd when ORS defers its grad

        fk = {"dtype": dtype, "device": device}
        full = torch.empty(self.out_features, self.in_features, **fk)
        if init_method is None:
            torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5))
        else:
            init_method(full)
        self.weight = torch.nn.Parameter(self._shard_weight(full))
        setattr(self.weight, GRAD_AXES_ATTR, ("data",))
        if bias:
            full_b = torch.empty(self.out_features, **fk)
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(full_b, -bound, bound)
            self.bias = torch.nn.Parameter(self._shard_bias(full_b))
            setattr(self.bias, GRAD_AXES_ATTR, DEFAULT_GRAD_AXES)
        else:
            self.register_parameter("bias", None)

    # ---- layout ---------------------------------------------------------------------------
    def _shard_weight(self, full: torch.Tensor) -> torch.Tensor:
        r0, c0 = self._row * self.local_out, self._col * self.local_in
        blk = full[r0 : r0 + self.local_out, c0 : c0 + self.local_in].reshape(-1)
        s = self.shard_numel
        return blk[self._zc * s : (self._zc + 1) * s].clone()

    def _shard_bias(self, full: torch.Tensor) -> torch.Tensor:
        r0 = self._row * self.local_out
        return full[r0 : r0 + self.local_out].clone()

    @property
    def gathers_weight(self) -> bool:
        """Whether the weight is sharded over z (Gz > 1), so that forward and backward
        all-gather its block."""
        return self._gz > 1

    def gather_weight_async(self):
        """Issues the all-gather of the weight block over z; returns (work, block), the block
        (local_out, local_in) valid once work is waited. OAG's prefetch."""
        w = self.weight.detach()
        out = torch.empty(self.local_out * self.local_in, dtype=w.dtype, device=w.device)
        work = self.grid.all_gather(out, w, self._z_mask, async_op=True)
        return work, out.view(self.local_out, self.local_in)

    def _gather_block(self) -> torch.Tensor:
        w = self.weight.detach()
        if self._gz == 1:
            return w.view(self.local_out, self.local_in)
        out = torch.empty(self.local_out * self.local_in, dtype=w.dtype, device=w.device)
        self.grid.all_gather(out, w, self._z_mask)
        return out.view(self.local_out, self.local_in)

    def _forward_block(self, handle):
        if self._gz > 1 and handle is not None:
            b = self.engine.take_forward(handle)
            if b is not None:
                return b
        return self._gather_block()

    def _backward_block(self, handle):
        if self._gz > 1 and handle is not None and self.engine is not None:
            b = self.engine.take_backward(handle)
            if b is not None:
                return b
        return self._gather_block()

    def _weight_grad(self, dy2, x2, eng, ors):
        dw = torch.matmul(dy2.t(), x2).view(-1)  # the (local_out, local_in) block, flattened
        if self._gz == 1:
            return dw
        shard = torch.empty(self.shard_numel, dtype=dw.dtype, device=dw.device)
        if ors:
            if eng is not None:
                work = self.grid.reduce_scatter(shard, dw, self._z_mask, async_op=True)
                eng.defer_grad(self.weight, work, shard)
            else:  # overlap disabled between forward and backward: deliver now
                self.grid.reduce_scatter(shard, dw, self._z_mask)
                deliver_grad(self.weight, shard)
            return None
        self.grid.reduce_scatter(shard, dw, self._z_mask)
        return shard

    # ---- forward --------------------------------------------------------------------------
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 0 or input.shape[-1] != self.local_in:
            raise InvalidArgumentError(
                f"input: a {'transposed ' if self.transpose else ''}fourd.nn.Linear"
                f"({self.in_features}, {self.out_features}) takes its features split over "
                f"{self.col_axis}: expected a last dimension of {self.local_in}, found shape "
                f"{tuple(input.shape)}"
            )
        eng = self.engine
        handle = None
        w = self.weight
        defer = False
        if eng is not None and torch.is_grad_enabled():
            handle = eng.on_forward(self)
            if handle is not None and eng.reduce_scatter and self._gz > 1 and w.requires_grad:
                defer = True
                if self._grad_token is None:
                    self._grad_token = torch.empty(
                        0, dtype=w.dtype, device=w.device, requires_grad=True
                    )
                w = self._grad_token
        out = _LinearFn.apply(input, w, self, handle, defer)
        if self.bias is not None:
            out = out + self.bias
        return out

    # ---- state dict -----------------------------------------------------------------------
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        kw = prefix + "weight"
        w = state_dict.get(kw)
        if w is not None and tuple(w.shape) == (self.out_features, self.in_features):
            state_dict[kw] = self._shard_weight(w.to(self.weight.dtype))
        kb = prefix + "bias"
        b = state_dict.get(kb)
        if (
            b is not None
            and self.bias is not None
            and tuple(b.shape) == (self.out_features,)
            and self.local_out != self.out_features
        ):
            state_dict[kb] = self._shard_bias(b.to(self.bias.dtype))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    @torch.no_grad()
    def full_weight(self) -> torch.Tensor:
        """The full (out_features, in_features) weight, on every rank. Collective over the
        tensor-parallel ranks (x, y, z)."""
        g = self.grid
        block = self._gather_block().contiguous()
        xy = mask_obj(("x", "y"))
        n_xy = g.size(xy)
        blocks = torch.empty((n_xy,) + tuple(block.shape), dtype=block.dtype, device=block.device)
        if n_xy > 1:
            g.all_gather(blocks, block, xy)
        else:
            blocks[0].copy_(block)
        full = torch.empty(
            self.out_features, self.in_features, dtype=block.dtype, device=block.device
        )
        for i, r in enumerate(g.ranks(xy)):
            c = g.coords(r)
            row, col = c[self.row_axis], c[self.col_axis]
            full[
                row * self.local_out : (row + 1) * self.local_out,
                col * self.local_in : (col + 1) * self.local_in,
            ] = blocks[i]
        return full

    @torch.no_grad()
    def full_bias(self):
        """The full (out_features,) bias on every rank (collective over the row axis), or None."""
        if self.bias is None:
            return None
        b = self.bias.detach().contiguous()
        if self._grow == 1:
            return b.clone()
        out = torch.empty(self.out_features, dtype=b.dtype, device=b.device)
        self.grid.all_gather(out, b, self._row_mask)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, transpose={self.transpose}, "
            f"local=({self.local_out} x {self.local_in}) / Gz={self._gz}"
        )


@torch.no_grad()
def full_state_dict(model: torch.nn.Module) -> dict:
    """``model.state_dict()`` with each fourd.nn.Linear's weight and bias replaced by the full
    (unsharded) tensors, on every rank. Collective: every rank of the grid calls it."""
    sd = model.state_dict()
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            prefix = name + "." if name else ""
            sd[prefix + "weight"] = m.full_weight()
            if m.bias is not None:
                sd[prefix + "bias"] = m.full_bias()
    return sd
