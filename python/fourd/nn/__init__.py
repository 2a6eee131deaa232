"""4D-parallel layers and the training-step helpers around them.

- :class:`Linear`: AxoNN's 4D-parallel fully-connected layer (layouts in fourd/nn/linear.py and
  docs/training.md).
- :func:`sync_gradients`: the data-parallel gradient reduction, bucketed; optionally compressed
  (``compression=``), with error feedback (``error_feedback=True``).
- :func:`overlap`: OAR, ORS, OAG and data-parallel buckets during backward.
- :func:`full_state_dict`: a model's state dict with every Linear's full weight and bias
  (``model.load_state_dict`` takes full or sharded entries).
- :func:`set_grad_axes`: the group a parameter's gradient is summed over by sync_gradients.

The modules depend one way: grad_sync (buckets, which group each gradient is summed over) <-
linear (the layer, and how a deferred gradient reaches its parameter) <- overlap (the engine
that drives both during backward).
"""

from __future__ import annotations

from .grad_sync import DEFAULT_BUCKET_BYTES, DEFAULT_GRAD_AXES, GRAD_AXES_ATTR, set_grad_axes
from .linear import Linear, full_state_dict
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
