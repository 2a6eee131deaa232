"""Overlap of a model's fourd.nn.Linear communication with computation (OAR, ORS, OAG) and of
the data-parallel gradient reduction with backward.

    ov = fourd.nn.overlap(model, all_reduce=True, reduce_scatter=True, all_gather=True,
                          prefetch_depth=2, grad_reduce=True, optimizer=opt)
    with ov:                       # or ov.enable() once, ov.disable() to undo
        for batch in data:
            loss = loss_fn(model(batch))
            loss.backward()
            fourd.nn.sync_gradients(model)   # = ov.finish(): the step's remaining waits
            opt.step(); opt.zero_grad()

- OAR (all_reduce): in a Linear's backward the input-gradient all-reduce (over Grow) is issued
  asynchronously and the weight-gradient GEMM runs while it is in flight.
- ORS (reduce_scatter): the weight-gradient reduce-scatter over z is issued asynchronously and
  not waited in the layer; autograd receives no weight gradient from the layer. The gradient is
  delivered later, when the collective has completed (checked without blocking at each later
  Linear backward, or waited in finish()), through the parameter's own hooks, in the order
  autograd's AccumulateGrad uses: tensor hooks (``register_hook``), accumulation into ``.grad``,
  then post-accumulate-grad hooks. So DDP-style hooks, ours included, see every gradient.
- OAG (all_gather): the order in which the Linear layers run is recorded during the first
  forward pass (of each step until it repeats); afterwards, when the layer at position p runs,
  the weight all-gathers of positions p+1..p+prefetch_depth are issued ahead. Backward
  prefetches likewise in reverse (positions p-1..p-depth). If the sequence changes, prefetches
  are dropped for that step and the new sequence is learned from it.
- grad_reduce: the data-parallel buckets (see fourd.nn.sync_gradients) are all-reduced as soon as
  all their gradients have arrived, while backward continues. Bucket composition is learned on
  the first step from the (deterministic) order in which gradients are produced, checked equal on
  every rank, and buckets are issued strictly in bucket order. compression= and
  error_feedback= apply to these all-reduces as in sync_gradients (fourd/nn/grad_sync.py).

Nothing here synchronises with a device or reads a tensor's value on the host: the hot path only
issues collectives and polls their completion flags.

Forward calls made while autograd runs backward (activation recomputation) are not tracked and
gather synchronously. With gradient accumulation, wrap all but the last micro-batch in
``with ov.no_sync():``; deferred gradients are delivered when it exits.
"""

from __future__ import annotations

import collections
import weakref

import torch

from ..errors import InvalidArgumentError
from ..parallel_state import default_grid
from .grad_sync import DEFAULT_BUCKET_BYTES, GradSync, check_compression, model_params
from .linear import Linear, deliver_grad

_engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Handle:
    __slots__ = ("pos",)

    def __init__(self, pos):
        self.pos = pos


class Overlap:
    """Per-model overlap settings and the state they need. Make one with :func:`overlap`."""

    def __init__(
        self,
        model,
        *,
        all_reduce=False,
        reduce_scatter=False,
        all_gather=False,
        prefetch_depth=1,
        grad_reduce=False,
        bucket_bytes=DEFAULT_BUCKET_BYTES,
        average=False,
        optimizer=None,
        grid=None,
        compression=None,
        error_feedback=False,
    ):
        if (
            not isinstance(prefetch_depth, int)
            or isinstance(prefetch_depth, bool)
            or prefetch_depth < 1
        ):
            raise InvalidArgumentError(
                f"prefetch_depth: expected an integer >= 1, found {prefetch_depth!r}"
            )
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise InvalidArgumentError(
                f"bucket_bytes: expected a positive integer, found {bucket_bytes!r}"
            )
        self.model = model
        self.grid = default_grid(grid)
        self.all_reduce = bool(all_reduce)
        self.reduce_scatter = bool(reduce_scatter)
        self.all_gather = bool(all_gather)
        self.prefetch_depth = prefetch_depth
        self.grad_reduce = bool(grad_reduce)
        self.average = bool(average)
        self.bucket_bytes = bucket_bytes
        self.layers = [m for m in model.modules() if isinstance(m, Linear)]
        for m in self.layers:
            if m.grid is not self.grid:
                raise InvalidArgumentError(
                    "model: its fourd.nn.Linear layers were built on another grid than the one "
                    "given to overlap()"
                )
        self.enabled = False
        self._hooks: list = []
        self._opt_hook = None
        self._optimizer = optimizer
        # ORS
        self._pending: collections.deque = collections.deque()
        # OAG
        self._order = None
        self._recording: list = []
        self._pos = 0
        self._mb_start = 0
        self._in_backward = False
        self._mismatch = False
        self._fwd_pref: dict = {}
        self._fwd_issued: set = set()
        self._bwd_pref: dict = {}
        self._bwd_issued: set = set()
        # data-parallel reduction
        self._sync = GradSync(
            model, self.grid, bucket_bytes, self.average, compression, error_feedback
        )
        self.compression = self._sync.compression
        self.error_feedback = self._sync.error_feedback
        self._learned = False
        self._first_seen: dict = {}
        self._counts: dict = {}
        self._no_sync = 0
        self._dirty = False
        self._landing = False
        self.steps = 0
        #: counters since construction: prefetched blocks used in forward / backward, deferred
        #: weight gradients, of which delivered during backward, buckets launched during backward
        self.stats = collections.Counter()

    # ---- switching ------------------------------------------------------------------------
    def enable(self):
        """Attach to the model's Linear layers (and its parameters' gradient hooks)."""
        if self.enabled:
            return self
        old = _engines.get(self.model)
        if old is not None and old is not self and old.enabled:
            raise InvalidArgumentError("model: another fourd.nn.overlap is already enabled on it")
        for m in self.layers:
            m.engine = self
        for p in self._sync.params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        if self._optimizer is not None:
            self._opt_hook = self._optimizer.register_step_pre_hook(self._before_step)
        _engines[self.model] = self
        self.enabled = True
        return self

    def disable(self):
        """Finish what is in flight (as :meth:`finish` when gradients are pending), detach."""
        if not self.enabled:
            return
        if self._dirty or self._pending:
            self.finish()
        for m in self.layers:
            m.engine = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._opt_hook is not None:
            self._opt_hook.remove()
            self._opt_hook = None
        if _engines.get(self.model) is self:
            del _engines[self.model]
        self.enabled = False

    def __enter__(self):
        return self.enable()

    def __exit__(self, *exc):
        if exc[0] is not None:
            # An error in the step: leave collectives to complete on their own; just detach.
            self._dirty = False
            self._pending.clear()
        self.disable()
        return False

    def _before_step(self, optimizer, args, kwargs):
        if self._dirty or self._pending:
            self.finish()

    class _NoSync:
        def __init__(self, ov):
            self.ov = ov

        def __enter__(self):
            self.ov._no_sync += 1

        def __exit__(self, *exc):
            ov = self.ov
            try:
                ov._land_all()
            finally:
                ov._no_sync -= 1
            return False

    def no_sync(self):
        """Context for the micro-batches before the last: no data-parallel reduction during
        their backward; their deferred weight gradients are delivered when it exits."""
        return Overlap._NoSync(self)

    # ---- OAG ------------------------------------------------------------------------------
    def on_forward(self, layer):
        if torch._C._current_graph_task_id() != -1:
            return None  # a forward replayed inside backward (recomputation): not tracked
        if self._in_backward:
            self._in_backward = False  # a new micro-batch
            self._mb_start = self._pos
        p = self._pos
        self._pos += 1
        self._recording.append(layer)
        order = self._order
        if order is not None and not self._mismatch:
            if p >= len(order) or order[p] is not layer:
                self._mismatch = True
                self._fwd_pref.clear()
                self._bwd_pref.clear()
        if self.all_gather and order is not None and not self._mismatch:
            for q in range(p + 1, min(p + 1 + self.prefetch_depth, len(order))):
                if q not in self._fwd_issued:
                    self._fwd_issued.add(q)
                    lq = order[q]
                    if lq.gathers_weight:
                        self._fwd_pref[q] = (lq,) + lq.gather_weight_async()
        return _Handle(p)

    def take_forward(self, handle):
        e = self._fwd_pref.pop(handle.pos, None)
        if e is None or self._mismatch:
            return None
        layer, work, block = e
        if self._order is None or self._order[handle.pos] is not layer:
            return None
        work.wait()
        self.stats["prefetched_forward"] += 1
        return block

    def take_backward(self, handle):
        e = self._bwd_pref.pop(handle.pos, None)
        if e is None:
            return None
        layer, work, block = e
        if self._recording[handle.pos] is not layer:
            return None
        work.wait()
        self.stats["prefetched_backward"] += 1
        return block

    def on_backward(self, layer, handle):
        self._in_backward = True
        self._dirty = True
        self.poll()
        if not self.all_gather:
            return
        p = handle.pos
        lo = max(self._mb_start, p - self.prefetch_depth)
        for q in range(p - 1, lo - 1, -1):
            if q not in self._bwd_issued:
                self._bwd_issued.add(q)
                lq = self._recording[q]
                if lq.gathers_weight:
                    self._bwd_pref[q] = (lq,) + lq.gather_weight_async()

    # ---- ORS ------------------------------------------------------------------------------
    def defer_grad(self, param, work, shard):
        self._dirty = True
        self.stats["deferred"] += 1
        self._pending.append((param, work, shard))
        if not self._learned:
            self._note_order(param)

    def poll(self):
        """Deliver the deferred gradients whose reduce-scatter has completed (in issue order,
        stopping at the first still running). Never blocks."""
        if self._landing:
            return
        self._landing = True
        try:
            q = self._pending
            while q and q[0][1].is_completed():
                param, work, shard = q.popleft()
                work.wait()  # completed: returns at once, raises if it failed
                self.stats["delivered_early"] += 1
                deliver_grad(param, shard)
        finally:
            self._landing = False

    def _land_all(self):
        self._landing = True
        try:
            q = self._pending
            while q:
                param, work, shard = q.popleft()
                work.wait()
                deliver_grad(param, shard)
        finally:
            self._landing = False

    # ---- data-parallel reduction ----------------------------------------------------------
    def _note_order(self, param):
        k = id(param)
        if k not in self._first_seen:
            self._first_seen[k] = len(self._first_seen)

    def _on_grad(self, param):
        self._dirty = True
        if self._no_sync:
            return
        k = id(param)
        self._counts[k] = self._counts.get(k, 0) + 1
        if not self._learned:
            self._note_order(param)
            return
        if not self.grad_reduce:
            return
        b = self._sync.bucket_of.get(k)
        if b is None:
            return
        if b.launched:
            b.late = True
            return
        b.arrived += 1
        if b.arrived >= b.expected:
            self._launch_ready()

    def _launch_ready(self):
        for b in self._sync.buckets:
            if b.launched:
                continue
            if b.arrived < b.expected:
                break
            self._sync.launch(b)
            self.stats["buckets_early"] += 1

    def _learn_buckets(self):
        params = self._sync.params
        seen = sorted(
            (p for p in params if id(p) in self._first_seen), key=lambda p: self._first_seen[id(p)]
        )
        unseen = [p for p in reversed(params) if id(p) not in self._first_seen]
        order = seen + unseen
        counts = {id(p): max(1, self._counts.get(id(p), 0)) for p in params}
        sig = self._sync.signature(order, counts)
        if not self._sync.ranks_agree(sig):
            # Ranks saw gradients in different orders: fall back to what every rank agrees on.
            order = list(reversed(params))
            counts = {id(p): 1 for p in params}
        self._sync.build(order, counts)
        self._learned = True

    def finish(self):
        """The end of a step's backward: deliver every deferred gradient, complete the
        data-parallel reduction, and reset the per-step state. Call before optimizer.step()
        (fourd.nn.sync_gradients(model) calls it)."""
        self._land_all()
        if not self._learned:
            self._learn_buckets()
        else:
            late = any(b.late for b in self._sync.buckets)
            if late:
                # More gradient deliveries than learned (deterministic on every rank): learn the
                # new counts for the next steps.
                for b in self._sync.buckets:
                    b.expected = sum(max(1, self._counts.get(id(p), 0)) for p in b.params)
        self._sync.complete()
        # OAG: adopt the sequence of this step when there was none or it changed.
        if self._recording and (
            self._order is None or self._mismatch or len(self._recording) != len(self._order)
        ):
            self._order = list(self._recording)
        self._recording = []
        self._pos = 0
        self._mb_start = 0
        self._in_backward = False
        self._mismatch = False
        self._fwd_pref.clear()
        self._fwd_issued.clear()
        self._bwd_pref.clear()
        self._bwd_issued.clear()
        self._counts = {}
        self._dirty = False
        self.steps += 1

    @property
    def learned_order(self):
        """The Linear layers in the execution order learned (None before the first step)."""
        return None if self._order is None else list(self._order)


def overlap(
    model,
    *,
    all_reduce=False,
    reduce_scatter=False,
    all_gather=False,
    prefetch_depth=1,
    grad_reduce=False,
    bucket_bytes=DEFAULT_BUCKET_BYTES,
    average=False,
    optimizer=None,
    grid=None,
    compression=None,
    error_feedback=False,
) -> Overlap:
    """Overlap settings for `model` (see the module docstring): a context manager, or call
    ``.enable()``. all_reduce = OAR, reduce_scatter = ORS, all_gather = OAG (prefetch_depth
    layers ahead), grad_reduce = data-parallel buckets reduced during backward. average: the
    gradient reduction divides by the number of batch shards (Gz*Gdata). optimizer: its step()
    first completes the step's pending reductions (so they are never skipped). compression,
    error_feedback: the codec of the gradient buckets' all-reduces (None: the grid's policy)
    and error feedback on them, as in :func:`sync_gradients`."""
    return Overlap(
        model,
        all_reduce=all_reduce,
        reduce_scatter=reduce_scatter,
        all_gather=all_gather,
        prefetch_depth=prefetch_depth,
        grad_reduce=grad_reduce,
        bucket_bytes=bucket_bytes,
        average=average,
        optimizer=optimizer,
        grid=grid,
        compression=compression,
        error_feedback=error_feedback,
    )


_plain: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_same(ov, **given):
    """sync_gradients' arguments against the enabled overlap's (None: not given)."""
    for name, value in given.items():
        if value is None:
            continue
        if name == "compression":
            value = check_compression(value, False)[0]
        elif name == "error_feedback":
            value = check_compression(None, value)[1]
        elif name == "average":
            value = bool(value)
        if value != getattr(ov, name):
            raise InvalidArgumentError(
                f"{name}: the model's overlap() was made with {name}={getattr(ov, name)!r}; "
                f"found {value!r}"
            )


def sync_gradients(
    model, *, average=None, bucket_bytes=None, grid=None, compression=None, error_feedback=None
):
    """The data-parallel gradient reduction: each parameter's .grad summed over its group
    (Linear weights over data; biases, norms and other replicated parameters over z and data
    together, one collective per bucket), in buckets of about bucket_bytes. average=True divides
    by the number of batch shards (Gz*Gdata): use it when the loss is a mean over this rank's
    shard. compression: the codec of every bucket all-reduce ("int8", "zfp:rate=8",
    "lossless", ...; docs/compression.md); None: the grid's policy decides (it compresses only
    groups that span nodes). error_feedback=True (default False): buckets whose all-reduce is
    lossy carry the residual of their encoding into the next step (fourd/nn/grad_sync.py);
    residuals start at zero when the buckets are rebuilt (another bucket_bytes, compression,
    error_feedback, grid or parameter set). Bad arguments raise InvalidArgumentError before any
    communication. Collective over the world. When `model` has an enabled :func:`overlap`, this
    is its ``finish()`` (which uses the overlap's own average/bucket_bytes/compression/
    error_feedback; passing different values raises)."""
    ov = _engines.get(model)
    if ov is not None and ov.enabled:
        _check_same(
            ov,
            average=average,
            bucket_bytes=bucket_bytes,
            compression=compression,
            error_feedback=error_feedback,
        )
        ov.finish()
        return
    avg = bool(average) if average is not None else False
    nbytes = DEFAULT_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
    codec, ef = check_compression(compression, False if error_feedback is None else error_feedback)
    g = default_grid(grid)
    key = (id(g), avg, nbytes, codec, ef, tuple(id(p) for p in model_params(model)))
    entry = _plain.get(model)
    if entry is None or entry[0] != key:
        s = GradSync(model, g, nbytes, avg, codec, ef)
        s.build(list(reversed(s.params)))
        entry = (key, s)
        _plain[model] = entry
    entry[1].run()
