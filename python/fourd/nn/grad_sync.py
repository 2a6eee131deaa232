"""The data-parallel gradient reduction, bucketed.

Each parameter's gradient is summed over the group named by its ``_fourd_grad_axes`` attribute
(GRAD_AXES_ATTR; fourd.nn.Linear weights: "data", their z reduction already done by the
reduce-scatter in backward; everything else, biases and norms included: DEFAULT_GRAD_AXES,
("z", "data"), the batch shards). :func:`set_grad_axes` sets it. The
gradients of one group and dtype are packed into flat buckets of about ``bucket_bytes`` and each
bucket is one all-reduce; buckets are issued back to back (asynchronously) and waited together.

Cross-rank invariant: every rank builds the same buckets in the same order and issues them in
bucket order, so the n-th collective on a communicator is the same bucket on every rank.

Compression (docs/compression.md, docs/training.md): ``compression`` is the codec every bucket
all-reduce is given (None: the grid's policy decides per group, which compresses only groups
that span nodes). Which codec a bucket's all-reduce uses is asked of its communicator when the
buckets are built, which also checks the codec against the bucket's dtype and device, before
any bucket is reduced.

Error feedback (``error_feedback=True``; EF-SGD, 1-bit Adam): a bucket whose all-reduce uses a
lossy codec keeps a residual r, what the codec lost of this rank's contribution. Each step,
with x the bucket's local (scaled) gradients: x += r is what is all-reduced, and
r = x - decode(encode(x)) is kept for the next step, where decode(encode(.)) is the codec's
round trip of the whole bucket on this rank (fourd._C.codec_round_trip). That is the error of the
first hop's encoding, the sender's own quantization: the later re-encodings of partial sums in
the ring, and the rail level of "hierarchical" (which encodes a node's sum, not this rank's
gradient), are not fed back; the usual EF approximation. Residuals belong to their bucket and
start at zero whenever buckets are (re)built. A bucket with no codec or a lossless one keeps
none (error feedback is then a no-op). The round trip is one more encode and decode of the
bucket on the host per step; codecs run on host buffers only.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from .. import _C
from .._tensor import dtype_name, resolve
from ..errors import InvalidArgumentError
from ..grid import axis_mask
from ..parallel_state import mask_obj

DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024

# Which group a parameter's gradient is summed over in the data-parallel step (sync_gradients).
# Parameters without the attribute (norms, embeddings, anything replicated over x and y that
# sees this rank's batch shard) are summed over the batch shards: z and data.
GRAD_AXES_ATTR = "_fourd_grad_axes"
DEFAULT_GRAD_AXES = ("z", "data")


def set_grad_axes(param: torch.nn.Parameter, axes) -> torch.nn.Parameter:
    """Name the group `param`'s gradient is summed over by :func:`sync_gradients` (default
    ("z", "data"): parameters replicated over x, y and z that see this rank's batch shard).
    Use "data" for a parameter sharded over z whose z reduction happens elsewhere, "world" for
    one whose gradient differs on every rank, or any axis tuple. Returns `param`."""
    axis_mask(axes)  # validate now, not at the first step
    setattr(param, GRAD_AXES_ATTR, axes)
    return param


def check_compression(compression, error_feedback):
    """The compression= and error_feedback= arguments of sync_gradients and overlap, checked
    before any communication: (the codec's canonical text, or None for the grid's policy;
    error_feedback as a bool). Raises InvalidArgumentError naming the argument."""
    if compression is not None:
        if not isinstance(compression, str):
            raise InvalidArgumentError(
                f"compression: expected None or a codec name such as 'int8', 'zfp:rate=8', "
                f"'lossless' or 'none', found {compression!r}"
            )
        info = _C.codec_info(compression or "none")  # parses; raises for a bad codec
        compression = info["codec"] or "none"
    if not isinstance(error_feedback, (bool, np.bool_)):
        raise InvalidArgumentError(
            f"error_feedback: expected True or False, found {error_feedback!r}"
        )
    return compression, bool(error_feedback)


def model_params(model) -> list:
    """Unique parameters that require grad, in registration order."""
    seen, out = set(), []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


class Bucket:
    __slots__ = (
        "params",
        "offsets",
        "mask",
        "flat",
        "expected",
        "arrived",
        "launched",
        "work",
        "late",
        "last_pos",
        "ef_codec",
        "residual",
        "next_residual",
        "decoded",
    )

    def __init__(self, mask, dtype, device, params, last_pos):
        self.params = params
        self.mask = mask
        offs, o = [], 0
        for p in params:
            offs.append(o)
            o += p.numel()
        self.offsets = offs
        self.flat = torch.empty(o, dtype=dtype, device=device)
        self.expected = 0
        self.arrived = 0
        self.launched = False
        self.work = None
        self.late = False
        self.last_pos = last_pos
        # error feedback: the lossy codec of the bucket's all-reduce (None: no feedback), the
        # residual carried into this step, the one this step's launch computed (kept at
        # complete(); a late relaunch recomputes it from the same carried residual), and the
        # round trip's output.
        self.ef_codec = None
        self.residual = None
        self.next_residual = None
        self.decoded = None

    def feed_back(self):
        """Error feedback on the filled, scaled bucket: add the carried residual, then compute
        the next one, flat - decode(encode(flat)), of what is about to be all-reduced."""
        flat = self.flat
        if self.decoded is None:
            self.residual = torch.zeros_like(flat)
            self.next_residual = torch.empty_like(flat)
            self.decoded = torch.empty_like(flat)
        flat.add_(self.residual)
        code = resolve(flat, "gradient bucket", False)[2]
        _C.codec_round_trip(
            self.ef_codec, flat.data_ptr(), self.decoded.data_ptr(), flat.numel(), code
        )
        torch.sub(flat, self.decoded, out=self.next_residual)

    def keep_residual(self):
        """The step's all-reduce completed: its residual is carried into the next step."""
        if self.decoded is not None:
            self.residual, self.next_residual = self.next_residual, self.residual


class GradSync:
    """Buckets of a model's parameters and their reduction. `scale` multiplies every gradient
    (1/(Gz*Gdata) when averaging over the batch shards). `compression`, `error_feedback`: see
    the module docstring (checked here, before any communication)."""

    def __init__(
        self,
        model,
        grid,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        average: bool = False,
        compression=None,
        error_feedback=False,
    ):
        self.compression, self.error_feedback = check_compression(compression, error_feedback)
        self.grid = grid
        self.params = model_params(model)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.bucket_bytes = int(bucket_bytes)
        shards = grid.size(("z", "data"))
        self.scale = 1.0 / shards if average else 1.0
        self.masks = []
        for p in self.params:
            axes = getattr(p, GRAD_AXES_ATTR, DEFAULT_GRAD_AXES)
            self.masks.append(axis_mask(axes))
        self.sizes = {m: grid.size(mask_obj(m)) for m in set(self.masks)}
        self.buckets: list = []
        self.bucket_of: dict = {}
        self.local: list = []  # parameters whose reduction group is just this rank

    def build(self, order: list, counts: dict | None = None):
        """Cut the parameters, taken in `order` (a permutation of self.params), into buckets of
        one (group, dtype) each; buckets are sorted by the position of their last parameter."""
        open_: dict = {}
        closed: list = []
        self.local = []
        for pos, p in enumerate(order):
            i = self.index[id(p)]
            mask = self.masks[i]
            if self.sizes[mask] == 1:
                self.local.append(p)
                continue
            key = (mask, p.dtype, p.device)
            cur = open_.get(key)
            nbytes = p.numel() * p.element_size()
            if cur is not None and cur[1] + nbytes > self.bucket_bytes and cur[0]:
                closed.append((key, cur[0], cur[2]))
                cur = None
            if cur is None:
                cur = [[], 0, pos]
                open_[key] = cur
            cur[0].append(p)
            cur[1] += nbytes
            cur[2] = pos
        for key, cur in open_.items():
            if cur[0]:
                closed.append((key, cur[0], cur[2]))
        closed.sort(key=lambda c: c[2])
        self.buckets = [Bucket(k[0], k[1], k[2], ps, last) for k, ps, last in closed]
        self.bucket_of = {}
        for b in self.buckets:
            for p in b.params:
                self.bucket_of[id(p)] = b
            b.expected = sum((counts or {}).get(id(p), 1) for p in b.params)
            b.ef_codec = self.feedback_codec(b)

    def feedback_codec(self, b: Bucket):
        """The codec b's all-reduce will use when it is lossy and error feedback is on, else
        None. Asking the communicator also checks an explicit codec against b's dtype and
        device (InvalidArgumentError, on every rank alike: all build the same buckets)."""
        if self.compression is None and not self.error_feedback:
            return None  # the policy decides as the call runs; nothing to feed back
        flat = b.flat
        choice = self.grid.communicator(mask_obj(b.mask)).compression(
            "all_reduce",
            flat.numel() * flat.element_size(),
            dtype_name(resolve(flat, "gradient bucket", False)[2]),
            flat.device.type,
            self.compression or "",
        )
        codec = choice["codec"]
        if not self.error_feedback or codec is None or not _C.codec_info(codec)["lossy"]:
            return None
        return codec

    def signature(self, order: list, counts: dict | None = None) -> int:
        idx = [self.index[id(p)] for p in order]
        cnt = [(counts or {}).get(id(p), 1) for p in order]
        data = np.asarray(idx + cnt, dtype=np.int64).tobytes()
        return zlib.crc32(data)

    def ranks_agree(self, sig: int) -> bool:
        """One blocking all-reduce over the world: do all ranks have this signature?"""
        a = np.array([sig, -sig], dtype=np.int64)
        self.grid.all_reduce(a, "world", "max")
        return int(a[0]) == sig and int(-a[1]) == sig

    def launch(self, b: Bucket):
        flat = b.flat
        for p, off in zip(b.params, b.offsets):
            n = p.numel()
            g = p.grad
            if g is None:
                flat[off : off + n].zero_()
            else:
                flat[off : off + n].copy_(g.reshape(-1))
        if self.scale != 1.0:
            flat.mul_(self.scale)
        if b.ef_codec is not None:
            b.feed_back()
        b.work = self.grid.all_reduce(
            flat, mask_obj(b.mask), async_op=True, compression=self.compression
        )
        b.launched = True

    def relaunch_sync(self, b: Bucket):
        """A late gradient arrived after the bucket left: reduce it again, blocking."""
        if b.work is not None:
            b.work.wait()
        self.launch(b)

    def complete(self):
        """Wait for every bucket (launching those not yet launched, in order), write the sums
        back into .grad, scale the local-only gradients, and reset for the next step."""
        for b in self.buckets:
            if not b.launched:
                self.launch(b)
        for b in self.buckets:
            b.work.wait()
        for b in self.buckets:
            if b.late:
                self.relaunch_sync(b)
                b.work.wait()
        for b in self.buckets:
            flat = b.flat
            for p, off in zip(b.params, b.offsets):
                src = flat[off : off + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = src.clone()
                else:
                    p.grad.copy_(src)
            if b.ef_codec is not None:
                b.keep_residual()
            b.work = None
            b.launched = False
            b.arrived = 0
            b.late = False
        if self.scale != 1.0:
            for p in self.local:
                if p.grad is not None:
                    p.grad.mul_(self.scale)

    def run(self):
        """Reduce everything now (the non-overlapped path)."""
        self.complete()
