"""The 4D process grid and its collectives (the public API lives in fourd/__init__.py)."""

from __future__ import annotations

import math
import numbers
import os
import sys
import threading
import weakref

import numpy as np

from . import _C, _tensor
from ._tensor import DTYPES, resolve
from .errors import (
    AbortedError,
    BackendError,
    InvalidArgumentError,
    NotInitializedError,
    TimeoutError,
)

AXES = _C.AXES  # ("x", "y", "z", "data"), the native core's names
_BIT = {a: 1 << i for i, a in enumerate(AXES)}
WORLD_MASK = _C.WORLD_MASK

_mask_cache: dict = {}


def axis_mask(axis) -> int:
    """Bit mask of an axis argument: "x", "y", "z", "data", "world", "z+data", a tuple of axis
    names (their combined group; the tuple's own order does not matter, a repeated name is an
    error), or a group object with a ``mask`` attribute (fourd.parallel_state groups)."""
    try:
        return _mask_cache[axis]
    except (KeyError, TypeError):
        pass
    m = getattr(axis, "mask", None)
    if isinstance(m, int) and not isinstance(axis, (str, tuple, list)):
        return m
    if (
        isinstance(axis, (tuple, list, frozenset, set))
        and axis
        and all(isinstance(n, str) for n in axis)
    ):
        text = "world" if "world" in axis else "+".join(axis)
    elif isinstance(axis, str):
        text = axis
    else:
        text = None
    if text is None or not text:
        raise InvalidArgumentError(
            f"axis: expected 'x', 'y', 'z', 'data', 'world', or a tuple of those names such as "
            f"('z', 'data'); found {axis!r}"
        )
    try:
        mask = _C.parse_axis(text, "axis")
    except InvalidArgumentError as e:
        if isinstance(axis, str):
            raise
        # Name the caller's own argument (a tuple), not the joined text parsed.
        raise InvalidArgumentError(str(e).replace(f"'{text}'", repr(axis))) from None
    try:
        _mask_cache[axis] = mask
    except TypeError:
        pass
    return mask


def mask_name(mask: int) -> str:
    return _C.mask_name(mask)


def _op_code(op) -> int:
    if not isinstance(op, str):  # torch.distributed.ReduceOp and similar enums: by name
        op = str(getattr(op, "name", op)).rsplit(".", 1)[-1]
    return _C.parse_op(op, "op")


def _algo_code(algorithm) -> int:
    if not isinstance(algorithm, str):
        raise InvalidArgumentError(
            f"algorithm: expected one of {', '.join(repr(a) for a in _C.ALGORITHMS)}; found "
            f"{algorithm!r}"
        )
    return _C.parse_algorithm(algorithm, "algorithm")


def _is_op(value) -> bool:
    """A reduce op given where an axis goes: torch's ReduceOp (or RedOpType), or an op name
    (no axis is named like an op)."""
    if isinstance(value, str):
        try:
            _C.parse_op(value, "op")
            return True
        except InvalidArgumentError:
            return False
    return type(value).__name__ in ("ReduceOp", "RedOpType")


def _group_axis(group, axis):
    """torch's group= as an axis: an axis name or tuple, a fourd group (parallel_state: its
    mask), a Subgroup, or a torch ProcessGroup made by fourd's backend (its `fourd_axis`)."""
    if axis != "world" and not _is_op(axis):
        raise InvalidArgumentError(
            f"group: given together with axis={axis!r}; name the group once (group= is "
            f"torch's name for fourd's axis=)"
        )
    return getattr(group, "fourd_axis", group)


def _like(t, count: int):
    """An empty contiguous buffer of `count` elements of `t`'s kind (torch or numpy)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        return torch.empty(count, dtype=t.dtype, device=t.device)
    return np.empty(count, dtype=np.asarray(t).dtype)


def _concatenated(parts):
    """One contiguous buffer holding `parts` one after the other (torch's list forms)."""
    torch = sys.modules.get("torch")
    if torch is not None and all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat([p.detach().reshape(-1) for p in parts])
    return np.concatenate([np.asarray(p).reshape(-1) for p in parts])


class _ListWork:
    """The Work of torch's list form of all_gather: the gathered blocks are copied into the
    list once the operation has completed."""

    def __init__(self, work, finish):
        self._work, self._finish, self._done = work, finish, False

    def wait(self, timeout=None):
        self._work.wait(timeout)
        if not self._done:
            self._done = True
            self._finish()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    @property
    def description(self) -> str:
        return self._work.description


def _gather_into_list(grid, outputs, input, axis, algorithm, async_op, timeout, compression):
    """torch's all_gather(tensor_list, tensor): gathered into one buffer, then split."""
    n = int(getattr(input, "numel", lambda: np.asarray(input).size)())
    if len(outputs) != grid.size(axis):
        raise InvalidArgumentError(
            f"output: expected a list of {grid.size(axis)} tensors (one per group rank), found "
            f"{len(outputs)}"
        )
    flat = _like(input, n * len(outputs))

    def finish():
        for i, out in enumerate(outputs):
            block = flat[i * n : (i + 1) * n]
            if hasattr(out, "copy_"):
                out.copy_(block.reshape(out.shape))
            else:
                np.copyto(out, block.reshape(out.shape))

    w = grid.all_gather(
        flat,
        input,
        axis,
        algorithm=algorithm,
        async_op=async_op,
        timeout=timeout,
        compression=compression,
    )
    if async_op:
        return _ListWork(w, finish)
    finish()
    return None


def _codec_arg(value) -> str:
    """A call's compression= argument as the core takes it (it parses and checks it)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"compression: expected a codec name such as 'zfp:rate=8', 'int8', 'lossless' or "
            f"'none', found {value!r}"
        )
    return value or "none"


def _with_codec(tuning: dict, compression: dict) -> dict:
    """A call's tuning record, as state "compressed" where a named codec applies to it: such a
    call runs the codec's algorithm (selector.cpp, compressedAlgorithm) and is never tuned.
    "auto" decides per size at the first call; where it leaves a size raw, tuning applies."""
    codec = (compression or {}).get("codec") or "none"
    if codec in ("none", "auto") or tuning.get("state") == "off":
        return tuning
    return dict(tuning, state="compressed", codec=codec)


def compression_policy(value) -> str:
    """The policy text of fourd.init(compression=...): None (no policy), a codec for every
    axis, a preset ("mzhybrid", "zhybrid"), policy text ("data=zfp:rate=8;x,y,z=lossless"), or
    a dict {axis or tuple of axes: codec}. The core parses and checks it (docs/compression.md)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return _C.compression_policy(value)
    if not isinstance(value, dict):
        raise InvalidArgumentError(
            f"compression: expected None, a codec or preset name, or a dict {{axis: codec}}, "
            f"found {value!r}"
        )
    entries = []
    for axes, codec in value.items():
        names = (axes,) if isinstance(axes, str) else axes
        if not isinstance(names, tuple) or not all(isinstance(a, str) for a in names):
            raise InvalidArgumentError(
                f"compression: expected an axis name or a tuple of axis names as key, found "
                f"{axes!r}"
            )
        entries.append(",".join(names) + "=" + _codec_arg(codec))
    return _C.compression_policy(";".join(entries))


def _algo_name(code: int) -> str:
    return _C.ALGORITHMS[code]


def _timeout(timeout) -> float:
    if timeout is None:
        return 0.0
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"timeout: expected seconds (a positive number), found {timeout!r}"
        ) from None
    if not t > 0:
        raise InvalidArgumentError(
            f"timeout: expected seconds (a positive number), found {timeout!r}"
        )
    return t


_FLAG_VALUES = {
    "": False,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
}


def _env_flag(name: str) -> bool:
    """A FOURD_ switch: 1/true/yes/on or 0/false/no/off (unset: off); InvalidArgumentError
    for any other value."""
    raw = os.environ.get(name, "")
    value = _FLAG_VALUES.get(raw.strip().lower())
    if value is None:
        raise InvalidArgumentError(
            f"{name}: expected 1 or 0 (true/false, yes/no, on/off); found {raw!r}"
        )
    return value


def _flag(value, arg: str) -> bool:
    """A bool argument (async_op=, accumulate_fp32=, in_place=): a bool or 0/1, nothing else."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise InvalidArgumentError(f"{arg}: expected True or False, found {value!r}")


def _nbytes(value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidArgumentError(f"nbytes: expected a byte count >= 0, found {value!r}")
    return int(value)


def _fmt_seconds(t: float) -> str:
    if t != t or t == float("inf"):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


class Explanation(dict):
    """What Grid.explain returns: a dict (its keys are documented there) that prints as a
    short table."""

    def __str__(self) -> str:
        place = "in place" if self["in_place"] else "out of place"
        lines = [
            f"{self['collective']} of {_fmt_bytes(self['nbytes'])} {self['dtype']} ({place}) "
            f"on axis '{self['axis']}' ({self['topology']}): auto runs {self['choice']} "
            f"(chosen by {self['source']})",
            f"  {'algorithm':<14}{'predicted':>12}{'correction':>12}  note",
        ]
        for r in self["candidates"]:
            mark = "*" if r["algorithm"] == self["choice"] else " "
            pred = _fmt_seconds(r["predicted_s"]) if r["candidate"] else "-"
            corr = f"{r['correction']:.2f}" if r["candidate"] else ""
            note = r["reason"]
            lines.append(f"{mark} {r['algorithm']:<14}{pred:>12}{corr:>12}  {note}".rstrip())
        t = self["tuning"]
        tuned = f"tuning in use: {t['state']}"
        if t.get("settled"):
            tuned += f", runs {t['settled']}"
        if t.get("candidates"):
            tuned += f" (tried {', '.join(t['candidates'])})"
        lines.append("  " + tuned)
        c = self.get("compression") or {}
        if c.get("codec"):
            lines.append(f"  compression: {c['codec']} (from the {c['source']}), on {c['where']}")
        elif c.get("note"):
            lines.append(f"  compression: none ({c['note']})")
        return "\n".join(lines)


class Subgroup:
    """A group of world ranks of a grid (Grid.group), usable as `axis=` of every collective.
    `ranks` are its world ranks in group-rank order."""

    __slots__ = ("communicator", "ranks")

    def __init__(self, communicator, ranks: tuple):
        self.communicator = communicator
        self.ranks = ranks

    @property
    def name(self) -> str:
        return self.communicator.name

    def __repr__(self) -> str:
        return f"fourd.Subgroup({list(self.ranks)})"


class Grid:
    """A 4D process grid over MPI ranks: axes x, y, z (tensor parallel) and data.

    Made by :func:`fourd.init`. Group rank i along an axis is position i of ``ranks(axis)``; the
    innermost axis of a combination varies fastest.
    """

    def __init__(self, native, comm, order: str):
        self._native = native
        self._mpi_comm = comm
        self._comms: dict = {}
        # Saved choices of tuning in use (profile/tuning.py; set at init by the profile policy):
        # seeds every communicator made here and saves theirs at finalize.
        self._tuning = None
        self._order = order
        self._rank = native.world_rank
        self._coords = native.coords(self._rank)
        self._finalized = False
        # (axis, op, algorithm) -> (communicator, op code, algorithm code): the per-call
        # argument checks done once per distinct hashable combination (the hot path of small
        # messages). Cleared whenever what it derives from changes.
        self._calls: dict = {}
        self._groups: dict = {}  # tuple of world ranks -> Subgroup

    def set_axis_algorithm(self, axis, algorithm: str) -> None:
        """Make `algorithm` the default of `axis` for calls that ask for "auto" (as
        ``fourd.init(plan=...)`` does with the planner's choice per axis); "auto" clears it.
        The native selector applies it (explicit argument > this > FOURD_ALGORITHM > tuning
        in use > cost model)."""
        _algo_code(algorithm)
        self._comm_for(axis).default_algorithm = algorithm

    # ---- shape and ranks -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def world_rank(self) -> int:
        return self._rank

    @property
    def core_share(self) -> dict:
        """How this rank's waits poll (FOURD_POLL, docs/errors.md): ``ranks``, the world ranks
        that share its cores (those on the same kernel: containers and network namespaces on
        one machine count together, at least the MPI shared-memory domain), ``cores``, the
        CPUs they may run on together, and ``oversubscribed``, whether waits yield at once and
        progress threads nap (more such ranks than cores, or FOURD_POLL=yield)."""
        return dict(self._native.core_share)

    @property
    def shape(self) -> dict:
        return dict(zip(AXES, self._native.sizes))

    @property
    def order(self) -> str:
        return self._order

    @property
    def mpi_comm(self):
        """The mpi4py communicator the grid was built on."""
        return self._mpi_comm

    def size(self, axis="world") -> int:
        return self._comm_for(axis).size

    def rank(self, axis="world") -> int:
        return self._comm_for(axis).rank

    def coords(self, rank: int | None = None) -> dict:
        c = self._coords if rank is None else self._native.coords(rank)
        return dict(zip(AXES, c))

    def ranks(self, axis="world") -> list:
        """World ranks of my group along `axis`, in group-rank order."""
        return list(self._comm_for(axis).world_ranks)

    def rank_of(self, **coords) -> int:
        c = [coords.get(a, self._coords[i]) for i, a in enumerate(AXES)]
        return self._native.rank_of(c)

    def topology(self, axis="world") -> dict:
        """How my group along `axis` sits on nodes: num_nodes, ranks_per_node, uniform, ..."""
        return dict(self._comm_for(axis).topology)

    def placement(self) -> list:
        """One row per world rank: host, node, local rank, grid coordinates."""
        n = self._native
        hosts = n.host_names
        return [
            {
                "rank": r,
                "host": hosts[r],
                "node": n.node_of(r),
                "local_rank": n.local_rank(r),
                **dict(zip(AXES, n.coords(r))),
            }
            for r in range(n.world_size)
        ]

    def node_of(self, rank: int) -> int:
        """Node index (0 .. num_nodes - 1) of a world rank, as the grid's topology places it."""
        return self._native.node_of(rank)

    def local_rank(self, rank: int) -> int:
        """Index of a world rank among the ranks of its node."""
        return self._native.local_rank(rank)

    @property
    def profile(self):
        """A copy of the machine profile (``fourd._C.MachineProfile``) that `auto` prices
        with."""
        return self._native.profile

    def set_profile(self, profile) -> None:
        """Replace the machine profile: a ``MachineProfile`` or a dict of some of its fields
        (the others keep their current values). Every rank must pass the same profile."""
        if isinstance(profile, dict):
            merged = self._native.profile.to_dict()
            merged.update(profile)
            profile = _C.MachineProfile(**merged)
        self._calls.clear()
        self._native.set_profile(profile)

    @property
    def num_nodes(self) -> int:
        return self._native.num_nodes

    @property
    def virtual_topology(self) -> bool:
        return self._native.virtual_topology

    def communicator(self, axis):
        """The native communicator of my group along `axis` (advanced use)."""
        return self._comm_for(axis)

    def group(self, ranks, timeout=None) -> Subgroup:
        """The group of these world ranks, in this order (group rank i = ranks[i]), as an
        `axis=` every collective takes. Collective over the listed ranks only; every member
        passes the same list. Ranks that form an axis (or a combination) give that axis's
        communicator; any other list gets a communicator of its own, with its topology, so
        `auto` and `hierarchical` work on it. Asked for again after an operation on it failed
        (its communicator poisoned: docs/errors.md), such a group gets a new communicator; a
        grid axis keeps its own."""
        try:
            ranks = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"ranks: expected a list of world ranks, found {ranks!r}"
            ) from None
        if self._finalized:
            raise NotInitializedError("fourd: this grid was finalized; call fourd.init() again")
        key = tuple(ranks)
        sub = self._groups.get(key)
        if sub is None or sub.communicator.poisoned:
            t = 0.0 if timeout is None else _timeout(timeout)
            sub = self._groups[key] = Subgroup(self._native.group(ranks, t), key)
        return sub

    def _comm(self, mask: int):
        c = self._comms.get(mask)
        if c is None:
            if self._finalized:
                raise NotInitializedError("fourd: this grid was finalized; call fourd.init() again")
            c = self._native.communicator(mask)
            if self._tuning is not None:
                self._tuning.seed(c)
            self._comms[mask] = c
        return c

    def _attach_tuning(self, saved) -> None:
        """Saved choices of tuning in use (profile/tuning.py): seeds the communicators made so
        far, then every later one; saved again at finalize. Collective (init)."""
        self._tuning = saved
        for c in self._comms.values():
            saved.seed(c)

    def _comm_for(self, axis):
        """The native communicator of an axis argument: a name, a tuple of names, a mask
        holder, a Subgroup of this grid, or an object that names one of those as its
        `fourd_axis` (a torch ProcessGroup of fourd's backend, a parallel_state group)."""
        if not isinstance(axis, (str, tuple, Subgroup)):
            axis = getattr(axis, "fourd_axis", axis)
        if isinstance(axis, Subgroup):
            return axis.communicator
        return self._comm(axis_mask(axis))

    # ---- collectives -----------------------------------------------------------------------
    def all_reduce(
        self,
        tensor,
        axis="world",
        op="sum",
        *,
        output=None,
        group=None,
        algorithm="auto",
        async_op=False,
        timeout=None,
        accumulate_fp32=False,
        compression=None,
    ):
        """Reduce `tensor` over the group along `axis`: in place, or into `output` (same count
        and dtype, not overlapping `tensor`) when given. `group=` is torch's name for the
        axis (an axis, a fourd group, or a torch ProcessGroup of fourd's backend).
        `compression`: a codec for this call (docs/compression.md); None: the grid's policy."""
        if (
            timeout is None
            and async_op is False
            and accumulate_fp32 is False
            and compression is None
            and group is None
            and type(tensor) in _FAST_TYPES
        ):  # the common blocking call of a known axis (numpy, CPU torch), in one native call
            try:
                plan = self._calls.get((axis, op, algorithm))
            except TypeError:  # an unhashable axis (a list): the general path
                plan = None
            if plan is not None:
                try:
                    if output is None:
                        done = plan[3].all_reduce(tensor)
                    else:
                        done = type(output) in _FAST_TYPES and plan[3].all_reduce_into(
                            output, tensor
                        )
                except _FAILED:
                    _quarantine(tensor, output)
                    raise
                if done:
                    return None
        if group is not None:
            axis = _group_axis(group, axis)
        if async_op is not False and async_op is not True:
            async_op = _flag(async_op, "async_op")
        if accumulate_fp32 is not False and accumulate_fp32 is not True:
            accumulate_fp32 = _flag(accumulate_fp32, "accumulate_fp32")
        try:
            plan = self._calls[(axis, op, algorithm)]
        except (KeyError, TypeError):
            plan = self._plan_call(axis, op, algorithm)
        comm, opc, algc, _ = plan
        tmo = 0.0 if timeout is None else _timeout(timeout)
        codec = "" if compression is None else _codec_arg(compression)
        if (
            not async_op
            and not codec
            and _all_reduce_now(plan, tensor, output, timeout, accumulate_fp32)
        ):  # the first call of an axis, or a group's
            return None
        if output is None:
            return _all_reduce_in_place(
                comm, tensor, opc, algc, tmo, async_op, accumulate_fp32, codec
            )
        return _all_reduce_into(
            comm, tensor, output, opc, algc, tmo, async_op, accumulate_fp32, codec
        )

    def _plan_call(self, axis, op, algorithm):
        """(communicator, op code, algorithm code, its _C.FastCalls: the blocking hot paths)."""
        if _is_op(axis):  # torch's habit: all_reduce(t, ReduceOp.SUM), the op where axis goes
            comm, opc = self._comm_for("world"), _op_code(axis)
        else:
            comm, opc = self._comm_for(axis), _op_code(op)
        algc = _algo_code(algorithm)
        plan = (comm, opc, algc, _C.fast_calls(comm, opc, algc))
        try:
            if len(self._calls) < 256:
                self._calls[(axis, op, algorithm)] = plan
        except TypeError:  # an unhashable axis (a list): checked every call
            pass
        return plan

    def all_gather(
        self,
        output,
        input,
        axis="world",
        *,
        group=None,
        algorithm="auto",
        async_op=False,
        timeout=None,
        compression=None,
    ):
        """output = the inputs of the group along `axis`, concatenated in group-rank order.
        `output` may also be a list of one tensor per group rank (torch's form)."""
        if (
            timeout is None
            and async_op is False
            and compression is None
            and group is None
            and type(output) in _FAST_TYPES
            and type(input) in _FAST_TYPES
        ):  # the common blocking call of a known axis (numpy, CPU torch), in one native call
            try:
                plan = self._calls.get((axis, "sum", algorithm))
            except TypeError:  # an unhashable axis (a list): the general path
                plan = None
            if plan is not None:
                try:
                    done = plan[3].all_gather(output, input)
                except _FAILED:
                    _quarantine(output, input)
                    raise
                if done:
                    return None
        if group is not None:
            axis = _group_axis(group, axis)
        if isinstance(output, (list, tuple)):
            return _gather_into_list(
                self, output, input, axis, algorithm, async_op, timeout, compression
            )
        if async_op is not False and async_op is not True:
            async_op = _flag(async_op, "async_op")
        try:
            plan = self._calls[(axis, "sum", algorithm)]
        except (KeyError, TypeError):
            plan = self._plan_call(axis, "sum", algorithm)
        comm, _, algc, _ = plan
        if _arrays_at_once(async_op, compression, output, input) and _all_gather_now(
            plan, output, input, timeout
        ):  # the first call of an axis, or a group's
            return None
        ip, ic, idt, dev, idx, st = resolve(input, "input", False)
        op_, oc, odt, odev, _, _ = resolve(output, "output", True)
        _check_pair(idt, odt, dev, odev)
        try:
            return comm.all_gather(
                ip,
                ic,
                op_,
                oc,
                idt,
                dev,
                idx,
                st,
                algc,
                0.0 if timeout is None else _timeout(timeout),
                async_op,
                (output, input) if async_op else None,
                "" if compression is None else _codec_arg(compression),
            )
        except _FAILED:
            _quarantine(output, input)
            raise

    def reduce_scatter(
        self,
        output,
        input,
        axis="world",
        op="sum",
        *,
        group=None,
        algorithm="auto",
        async_op=False,
        timeout=None,
        accumulate_fp32=False,
        compression=None,
    ):
        """Reduce `input` (group-size blocks) over the group; block i ends on group rank i.
        `input` may also be a list of one tensor per group rank (torch's form)."""
        if (
            timeout is None
            and async_op is False
            and accumulate_fp32 is False
            and compression is None
            and group is None
            and type(output) in _FAST_TYPES
            and type(input) in _FAST_TYPES
        ):  # the common blocking call of a known axis (numpy, CPU torch), in one native call
            try:
                plan = self._calls.get((axis, op, algorithm))
            except TypeError:  # an unhashable axis (a list): the general path
                plan = None
            if plan is not None:
                try:
                    done = plan[3].reduce_scatter(output, input)
                except _FAILED:
                    _quarantine(output, input)
                    raise
                if done:
                    return None
        if group is not None:
            axis = _group_axis(group, axis)
        if isinstance(input, (list, tuple)):
            input = _concatenated(input)
        if async_op is not False and async_op is not True:
            async_op = _flag(async_op, "async_op")
        if accumulate_fp32 is not False and accumulate_fp32 is not True:
            accumulate_fp32 = _flag(accumulate_fp32, "accumulate_fp32")
        try:
            plan = self._calls[(axis, op, algorithm)]
        except (KeyError, TypeError):
            plan = self._plan_call(axis, op, algorithm)
        comm, opc, algc, _ = plan
        if _arrays_at_once(async_op, compression, output, input) and _reduce_scatter_now(
            plan, output, input, timeout, accumulate_fp32
        ):  # the first call of an axis, or a group's
            return None
        ip, ic, idt, dev, idx, st = resolve(input, "input", False)
        op_, oc, odt, odev, _, _ = resolve(output, "output", True)
        _check_pair(idt, odt, dev, odev)
        try:
            return comm.reduce_scatter(
                ip,
                ic,
                op_,
                oc,
                idt,
                dev,
                idx,
                st,
                opc,
                algc,
                0.0 if timeout is None else _timeout(timeout),
                async_op,
                accumulate_fp32,
                (output, input) if async_op else None,
                "" if compression is None else _codec_arg(compression),
            )
        except _FAILED:
            _quarantine(output, input)
            raise

    def broadcast(self, tensor, src, axis="world", *, group=None, async_op=False, timeout=None):
        """Copy `tensor` of group rank `src` to every rank of the group along `axis`."""
        if group is not None:
            axis = _group_axis(group, axis)
        if async_op is not False and async_op is not True:
            async_op = _flag(async_op, "async_op")
        comm = self._comm_for(axis)
        if not isinstance(src, int) or isinstance(src, bool):
            raise InvalidArgumentError(f"src: expected a group rank (int), found {src!r}")
        p, n, dt, dev, idx, st = resolve(tensor, "tensor", True)
        try:
            return comm.broadcast(
                p,
                n,
                dt,
                dev,
                idx,
                st,
                src,
                _timeout(timeout),
                async_op,
                tensor if async_op else None,
            )
        except _FAILED:
            _quarantine(tensor)
            raise

    def barrier(self, axis="world", *, group=None, timeout=None):
        if group is not None:
            axis = _group_axis(group, axis)
        self._comm_for(axis).barrier(_timeout(timeout))

    def explain(
        self,
        collective: str,
        nbytes: int,
        axis="world",
        dtype: str = "float32",
        in_place: bool = False,
        device: str = "cpu",
        compression=None,
    ) -> dict:
        """The candidates `auto` considers for this call, with predicted times and whether each
        can run (`supported`: a request by name runs; `candidate`: auto may pick it; `reason`
        says why either is false, or why a runnable algorithm is no candidate), and its choice:
        the native selector's answer (internal/selector.hpp), for
        buffers on `device` ("cpu" or "cuda"). "source" says where the choice comes from
        ("plan", "FOURD_ALGORITHM", "tuning", "model", "device", "broadcast", "one rank");
        "tuning" is what tuning in use knows of the call. `in_place`: the call's output is its
        input (all_reduce), or holds it as this rank's block (all_gather, reduce_scatter);
        measured corrections of the model may differ."""
        comm = self._comm_for(axis)
        n, ip = _nbytes(nbytes), _flag(in_place, "in_place")
        e = comm.explain(collective, n, dtype, ip, device)
        for r in e["candidates"]:
            r["candidate"] = bool(r["supported"]) and math.isfinite(r["predicted_s"])
        codec = comm.compression(
            collective, n, dtype, device, "" if compression is None else _codec_arg(compression)
        )
        tuning = _with_codec(comm.tuning(collective, n, dtype, ip), codec)
        return Explanation(
            {
                "collective": collective,
                "nbytes": n,
                "axis": comm.name,
                "dtype": dtype,
                "in_place": ip,
                "device": device,
                "topology": comm.topology["description"],
                "candidates": e["candidates"],
                "choice": e["choice"],
                "source": e["source"],
                "forced_by_env": e["source"] == "FOURD_ALGORITHM",
                "set_by_plan": e["source"] == "plan",
                "tuning": tuning,
                "compression": codec,
            }
        )

    def tuning(
        self,
        collective: str,
        nbytes: int,
        axis="world",
        dtype: str = "float32",
        in_place: bool = False,
    ) -> dict:
        """What tuning in use knows of this call (``explain(...)["tuning"]``, without pricing
        the candidates): state, candidates, measured_s, settled, explore_calls, recheck_gap,
        call_period_s, saved, placement_agreed, settled_in_place (docs/algorithms.md,
        "Placement"); state "compressed" (with its `codec`) where the grid's policy
        puts a codec on the call, which then runs the codec's algorithm untuned."""
        comm, n = self._comm_for(axis), _nbytes(nbytes)
        t = comm.tuning(collective, n, dtype, _flag(in_place, "in_place"))
        return _with_codec(t, comm.compression(collective, n, dtype, "cpu", ""))

    def algorithm_for(
        self,
        collective: str,
        nbytes: int,
        axis="world",
        dtype: str = "float32",
        in_place: bool = False,
        device: str = "cpu",
    ) -> str:
        """The algorithm a call with algorithm="auto" runs (the native selector's choice: the
        axis default set by a plan, else FOURD_ALGORITHM, else what tuning in use chose,
        provisionally or for good, else the cost model's choice; while the calls of a size
        explore, they run its shortlist in turn)."""
        return self._comm_for(axis).choose(
            collective, _nbytes(nbytes), dtype, _flag(in_place, "in_place"), device
        )

    def finalize(self, timeout: float | None = None) -> bool:
        """Wait for operations in flight (up to the timeout), then free the communicators."""
        if self._finalized:
            return True
        self._finalized = True
        if self._tuning is not None:  # rank 0 only writes; never raises
            self._tuning.save(self)
        self._comms.clear()
        self._calls.clear()
        self._groups.clear()
        t = default_timeout() if timeout is None else float(timeout)
        return self._native.finalize(t)

    def __repr__(self) -> str:
        s = ", ".join(f"{a}={v}" for a, v in self.shape.items())
        return f"fourd.Grid({s}, order='{self._order}', rank {self._rank}/{self.world_size})"


def _all_reduce_in_place(comm, tensor, opc, algc, tmo, async_op, accumulate_fp32, codec):
    """Grid.all_reduce in place, the general path."""
    p, n, dt, dev, idx, st = resolve(tensor, "tensor", True)
    try:
        return comm.all_reduce(
            p,
            p,
            n,
            dt,
            dev,
            idx,
            st,
            opc,
            algc,
            tmo,
            async_op,
            accumulate_fp32,
            tensor if async_op else None,
            codec,
        )
    except _FAILED:
        _quarantine(tensor)
        raise


def _all_reduce_into(comm, tensor, output, opc, algc, tmo, async_op, accumulate_fp32, codec):
    """Grid.all_reduce out of place."""
    ip, n, dt, dev, idx, st = resolve(tensor, "tensor", False)
    op_, oc, odt, odev, _, _ = resolve(output, "output", True)
    _check_pair(dt, odt, dev, odev)
    try:
        return comm.all_reduce_into(
            ip,
            n,
            op_,
            oc,
            dt,
            dev,
            idx,
            st,
            opc,
            algc,
            tmo,
            async_op,
            accumulate_fp32,
            (output, tensor) if async_op else None,
            codec,
        )
    except _FAILED:
        _quarantine(output, tensor)
        raise


def _select_cuda_device(native, rank: int) -> None:
    """One GPU per local rank: torch.cuda.set_device(local_rank % device_count) when torch is
    imported, CUDA is available and nobody has chosen a device yet (CUDA not initialised)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not _C.HAVE_CUDA:
        return
    try:
        if not torch.cuda.is_available() or torch.cuda.is_initialized():
            return
        count = torch.cuda.device_count()
        if count > 0:
            torch.cuda.set_device(native.local_rank(rank) % count)
    except (AttributeError, RuntimeError):  # a CPU-only or mocked torch: keep the CPU path
        return


def _check_pair(idt, odt, dev, odev):
    if idt != odt:
        from .errors import DTypeError

        raise DTypeError(f"output: expected the input's dtype {DTYPES[idt]}, found {DTYPES[odt]}")
    if dev != odev:
        raise InvalidArgumentError("output: expected the input's device, found another device")


def default_timeout() -> float:
    """The deadline of every wait when a call gives none: FOURD_TIMEOUT_S, else 300 s."""
    v = os.environ.get("FOURD_TIMEOUT_S")
    if v:
        try:
            t = float(v)
            if t > 0:
                return t
        except ValueError:
            pass
        raise InvalidArgumentError(
            f"FOURD_TIMEOUT_S: expected a positive number of seconds, found {v!r}"
        )
    return 300.0


# Buffers of operations that failed (timeout, interrupt, backend error) while the MPI library
# may still write them: a collective the library started cannot be cancelled, and completes
# when the late peers arrive. They are kept alive for the rest of the process, and a torch
# tensor among them gets fresh storage (holding its current values), so that the caller can
# go on using the tensor while the library writes only into the old storage. Other tensors
# that view the same storage, and numpy arrays, keep the old memory (docs/errors.md).
_QUARANTINE: list = []


# The common blocking calls on numpy arrays and contiguous CPU torch tensors with a timeout= or
# accumulate_fp32=, or at the first call of a plan, in one native call each through the plan's
# _C.FastCalls (the calls without either take it inline in the Grid methods and the module
# functions): True when done; False when the native call does not take these objects (the
# caller then takes the general path, which names the problem). A torch tensor fourd writes
# must not require grad there (the general path says why).
_FAST_TYPES = _tensor.FAST_TYPES  # numpy arrays; torch.Tensor once torch is seen


def _all_reduce_now(plan, tensor, output, timeout, acc32) -> bool:
    if type(tensor) not in _FAST_TYPES:
        return False
    tmo = 0.0 if timeout is None else _timeout(timeout)
    try:
        if output is None:
            return plan[3].all_reduce(tensor, tmo, acc32)
        if type(output) in _FAST_TYPES:
            return plan[3].all_reduce_into(output, tensor, tmo, acc32)
        return False
    except _FAILED:
        _quarantine(tensor, output)
        raise


def _all_gather_now(plan, output, input, timeout) -> bool:
    tmo = 0.0 if timeout is None else _timeout(timeout)
    try:
        return plan[3].all_gather(output, input, tmo)
    except _FAILED:
        _quarantine(output, input)
        raise


def _reduce_scatter_now(plan, output, input, timeout, acc32) -> bool:
    tmo = 0.0 if timeout is None else _timeout(timeout)
    try:
        return plan[3].reduce_scatter(output, input, tmo, acc32)
    except _FAILED:
        _quarantine(output, input)
        raise


def _arrays_at_once(async_op, compression, output, input) -> bool:
    """Whether a call with an output and an input is the common blocking one (numpy arrays,
    torch tensors) that a single native call (the plan's `_C.FastCalls`) may take."""
    return (
        not async_op
        and compression is None
        and type(output) in _FAST_TYPES
        and type(input) in _FAST_TYPES
    )


def _quarantine(*objs) -> None:
    torch = sys.modules.get("torch")
    for o in objs:
        if o is None:
            continue
        if torch is not None and isinstance(o, torch.Tensor) and o.device.type == "cpu":
            old = torch.empty(0, dtype=o.dtype).set_(
                o.untyped_storage(), o.storage_offset(), o.size(), o.stride()
            )
            fresh = o.detach().clone(memory_format=torch.contiguous_format)
            # On the tensor itself: `o.data` is another tensor object, and its set_ would
            # leave `o` on the old storage. no_grad admits leaves that require grad.
            with torch.no_grad():
                o.set_(fresh.untyped_storage(), 0, o.size(), fresh.stride())
            _QUARANTINE.append(old)
        else:
            _QUARANTINE.append(o)


# What a collective's caller sees when its buffers may still be written (quarantined above).
_FAILED = (TimeoutError, AbortedError, BackendError, KeyboardInterrupt)


_state = threading.local()
# Called with the new Grid at the end of init(), before it becomes current. The layer above
# (fourd/__init__.py) registers the profile policy here, so that grid.py imports nothing of it.
_init_hooks: list = []
_lock = threading.Lock()
_current: Grid | None = None
_all_grids: weakref.WeakSet[Grid] = weakref.WeakSet()
_was_finalized = False


def _parse_order(order) -> str:
    if isinstance(order, (tuple, list)):
        order = "-".join(str(a) for a in order)
    if not isinstance(order, str):
        raise InvalidArgumentError(f"order: expected a string like 'x-y-z-data', found {order!r}")
    return order


def _mpi_library_problem(
    mpi4py_version: str,
    mpi4py_initialized: bool,
    fourd_version: str,
    fourd_initialized: bool,
    abi_mismatch: str,
) -> str | None:
    """Why fourd's MPI cannot work with mpi4py's in this process, or None. Two MPI libraries
    in one process either answer separately (fourd's is then never initialised, and mpi4py's
    communicators mean nothing to it) or, when the other library's symbols are global in the
    process, fourd's calls reach a library whose handles and constants differ from the mpi.h
    fourd was compiled with (abi_mismatch, from the native side): the first call with a handle
    would crash."""
    if abi_mismatch:
        return abi_mismatch

    def clean(v: str) -> str:
        # Open MPI counts the terminating NUL in the length it returns: mpi4py keeps it.
        return v.replace("\x00", "").strip()

    def first(v: str) -> str:
        return clean(v).splitlines()[0] if clean(v) else "?"

    if clean(mpi4py_version) != clean(fourd_version) or (
        mpi4py_initialized and not fourd_initialized
    ):
        return (
            "fourd: mpi4py and fourd use two different MPI libraries in this process "
            f'(mpi4py: "{first(mpi4py_version)}"; fourd: "{first(fourd_version)}"), so '
            "mpi4py's communicators mean nothing to fourd. Use one MPI for both: build fourd "
            "against the MPI that mpi4py uses (see mpi4py.get_config()), or install mpi4py "
            'against the MPI fourd was built with (README, "Using another MPI"; for the '
            "MPICH wheel: pip install 'fourd[mpich]' mpi4py)."
        )
    return None


def _check_mpi_library(MPI) -> None:
    """Raises BackendError when fourd and mpi4py do not share one MPI library (no MPI call
    with a handle is made before this check)."""
    problem = _mpi_library_problem(
        MPI.Get_library_version(),
        bool(MPI.Is_initialized()),
        _C.mpi_library_version(),
        bool(_C.mpi_initialized()),
        _C.mpi_abi_mismatch(),
    )
    if problem:
        raise BackendError(problem)


def _grid_sizes(x, y, z, data, world: int):
    """(sizes, first local error). Bad values become -1 so that the native agreement check
    still runs on every rank (and every rank raises)."""
    error = None
    sizes = []
    for name, v in zip(AXES[:3], (x, y, z)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v < 2**31:
            error = error or InvalidArgumentError(
                f"{name}: expected an integer grid size >= 1, found {v!r}"
            )
            v = -1
        sizes.append(v)
    if data is None:
        # world / (x*y*z); when it does not divide, the native agreement check reports the
        # product on every rank (so no rank is left waiting).
        xyz = sizes[0] * sizes[1] * sizes[2]
        data = max(1, world // xyz) if xyz > 0 else 1
    elif not isinstance(data, int) or isinstance(data, bool) or not 1 <= data < 2**31:
        error = error or InvalidArgumentError(
            f"data: expected an integer grid size >= 1 or None, found {data!r}"
        )
        data = -1
    sizes.append(data)
    return sizes, error


def _ranks_per_node(ranks_per_node):
    """(rpn for the native grid: 0 none, -1 invalid; the local error), FOURD_RANKS_PER_NODE
    when the argument is None."""
    if ranks_per_node is None:
        env = os.environ.get("FOURD_RANKS_PER_NODE", "").strip()
        if not env:
            return 0, None
        try:
            ranks_per_node = int(env)
        except ValueError:
            return -1, InvalidArgumentError(
                f"FOURD_RANKS_PER_NODE: expected an integer >= 1, found {env!r}"
            )
    ok = isinstance(ranks_per_node, int) and not isinstance(ranks_per_node, bool)
    if ok and 1 <= ranks_per_node < 2**31:
        return ranks_per_node, None
    return -1, InvalidArgumentError(
        f"ranks_per_node: expected None or an integer >= 1, found {ranks_per_node!r}"
    )


def _native_args(x, y, z, data, order, ranks_per_node, timeout, world: int):
    """The native grid's arguments and the first error found locally (raised only if the
    native grid, which compares every rank's arguments first, does not raise its own)."""
    sizes, error = _grid_sizes(x, y, z, data, world)
    try:
        order_s = _parse_order(order)
    except InvalidArgumentError as e:
        error, order_s = error or e, "invalid"
    rpn, rpn_error = _ranks_per_node(ranks_per_node)
    error = error or rpn_error
    try:
        t = default_timeout() if timeout is None else _timeout(timeout)
    except InvalidArgumentError as e:
        error, t = error or e, -1.0
    return (sizes, order_s, rpn, t if t > 0 else -1.0), error


def init(
    x=1,
    y=1,
    z=1,
    data=None,
    order="x-y-z-data",
    ranks_per_node=None,
    comm=None,
    *,
    timeout=None,
    debug=None,
    plan=None,
    make_current=True,
    compression=None,
) -> Grid:
    """Build the 4D grid over the ranks of `comm` (default MPI.COMM_WORLD). Collective: every
    rank must pass the same arguments (checked; a mismatch raises on every rank). The new grid
    becomes the one fourd's module-level calls use, unless `make_current=False` (a library
    that builds a grid of its own, such as the torch backend, leaves the user's in place).
    `compression`: the per-axis codec policy (compression_policy; FOURD_COMPRESSION replaces
    it; docs/compression.md)."""
    global _current, _was_finalized
    from mpi4py import MPI

    _check_mpi_library(MPI)
    make_current = _flag(make_current, "make_current")
    if plan is not None:
        kw = plan.grid_kwargs() if hasattr(plan, "grid_kwargs") else dict(plan)
        x, y, z = kw.get("x", 1), kw.get("y", 1), kw.get("z", 1)
        data = kw.get("data", data)
        order = kw.get("order", order)
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise InvalidArgumentError(f"comm: expected an mpi4py communicator, found {comm!r}")
    args, local_error = _native_args(x, y, z, data, order, ranks_per_node, timeout, comm.Get_size())
    try:
        dbg = _env_flag("FOURD_DEBUG") if debug is None else _flag(debug, "debug")
        abort = _env_flag("FOURD_ABORT_ON_TIMEOUT")
    except InvalidArgumentError as e:
        # Raised once every rank has compared its arguments (an invalid timeout marks this
        # rank's as invalid there), so that no rank is left waiting.
        local_error, dbg, abort = local_error or e, False, False
        args = (*args[:3], -1.0)
    try:
        policy = compression_policy(compression)
    except InvalidArgumentError as e:
        local_error, policy = local_error or e, "invalid"
    try:
        native = _C.Grid(comm.py2f(), *args, dbg, abort, policy)
    except Exception:
        if local_error is not None:
            raise local_error from None
        raise
    g = Grid(native, comm, native.order)
    for ax, algo in (getattr(plan, "algorithms", None) or {}).items():
        if algo not in (None, "-", "auto") and g.size(ax) > 1:
            g.set_axis_algorithm(ax, algo)
    for hook in _init_hooks:  # the machine profile of `auto` (registered by fourd/__init__.py)
        hook(g)
    _select_cuda_device(native, g._rank)
    with _lock:
        if make_current:
            _current = g
            _was_finalized = False
        _all_grids.add(g)
    return g


def _after_fork_in_child() -> None:
    """A child of fork(): the grids, their MPI state and their progress threads are the
    parent's. The child forgets them (finalize and garbage collection then touch nothing: the
    native side leaks them, see forkedChild() in op_context.hpp)."""
    global _current, _was_finalized
    for g in list(_all_grids):
        g._finalized = True
        g._comms.clear()
        g._calls.clear()
        g._groups.clear()
    _current = None
    _was_finalized = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def get_grid() -> Grid:
    """The grid of the last :func:`init`."""
    g = _current
    if g is None:
        if _was_finalized:
            raise NotInitializedError("fourd: the grid was finalized; call fourd.init() again")
        raise NotInitializedError("fourd: no grid yet; call fourd.init() first")
    return g


def is_initialized() -> bool:
    return _current is not None


def finalize(timeout: float | None = None) -> bool:
    """Wait for operations in flight (up to the deadline) and free every grid's communicators."""
    global _current, _was_finalized
    with _lock:
        grids = list(_all_grids)
        _current = None
        _was_finalized = True
    ok = True
    for g in grids:
        ok = g.finalize(timeout) and ok
    return ok
