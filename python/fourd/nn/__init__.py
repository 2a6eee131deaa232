"""4D-parallel layers and the training-step helpers around them.

- :class:`Linear`: AxoNN's 4D-parallel fully-connected layer (layouts in fourd/nn/linear.py and
  docs/training.md).
- :func:`sync_gradients`: the data-parallel gradient reduction, bucketed.
- :func:`overlap`: OAR, ORS, OAG and data-parallel buckets during backward.
- :func:`full_state_dict`: a model's state dict with every Linear's full weight and bias
  (``model.load_state_dict`` takes full or sharded entries).
"""

from __future__ import annotations

import torch

from .grad_sync import DEFAULT_BUCKET_BYTES
from .linear import DEFAULT_GRAD_AXES, GRAD_AXES_ATTR, Linear
from .overlap import Overlap, overlap, sync_gradients

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DEFAULT_GRAD_AXES",
    "GRAD_AXES_ATTR",
    "Linear",
    "Overlap",
    "full_state_dict",
    "overlap",
    "set_grad_axes",
    "sync_gradients",
]


def set_grad_axes(param: torch.nn.Parameter, axes) -> torch.nn.Parameter:
    """Name the group `param`'s gradient is summed over by :func:`sync_gradients` (default
    ("z", "data"): parameters replicated over x, y and z that see this rank's batch shard).
    Use "data" for a parameter sharded over z whose z reduction happens elsewhere, "world" for
    one whose gradient differs on every rank, or any axis tuple."""
    from .. import grid as _gridmod

    _gridmod.axis_mask(axes)  # validate now, not at the first step
    setattr(param, GRAD_AXES_ATTR, axes)
    return param


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
