"""The 4D process grid and its collectives (the public API lives in fourd/__init__.py)."""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from . import _C
from ._tensor import DTYPES, resolve
from .errors import BackendError, InvalidArgumentError, NotInitializedError

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


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Grid:
    """A 4D process grid over MPI ranks: axes x, y, z (tensor parallel) and data.

    Made by :func:`fourd.init`. Group rank i along an axis is position i of ``ranks(axis)``; the
    innermost axis of a combination varies fastest.
    """

    def __init__(self, native, comm, order: str):
        self._native = native
        self._mpi_comm = comm
        self._comms: dict = {}
        self._order = order
        self._rank = native.world_rank
        self._coords = native.coords(self._rank)
        self._finalized = False
        # (axis, op, algorithm) -> (communicator, op code, algorithm code): the per-call
        # argument checks done once per distinct hashable combination (the hot path of small
        # messages). Cleared whenever what it derives from changes.
        self._calls: dict = {}

    def set_axis_algorithm(self, axis, algorithm: str) -> None:
        """Make `algorithm` the default of `axis` for calls that ask for "auto" (as
        ``fourd.init(plan=...)`` does with the planner's choice per axis); "auto" clears it.
        The native selector applies it (explicit argument > this > FOURD_ALGORITHM > tuning
        in use > cost model)."""
        _algo_code(algorithm)
        self._comm(axis_mask(axis)).default_algorithm = algorithm

    # ---- shape and ranks -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def world_rank(self) -> int:
        return self._rank

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
        return self._comm(axis_mask(axis)).size

    def rank(self, axis="world") -> int:
        return self._comm(axis_mask(axis)).rank

    def coords(self, rank: int | None = None) -> dict:
        c = self._coords if rank is None else self._native.coords(rank)
        return dict(zip(AXES, c))

    def ranks(self, axis="world") -> list:
        """World ranks of my group along `axis`, in group-rank order."""
        return list(self._comm(axis_mask(axis)).world_ranks)

    def rank_of(self, **coords) -> int:
        c = [coords.get(a, self._coords[i]) for i, a in enumerate(AXES)]
        return self._native.rank_of(c)

    def topology(self, axis="world") -> dict:
        """How my group along `axis` sits on nodes: num_nodes, ranks_per_node, uniform, ..."""
        return dict(self._comm(axis_mask(axis)).topology)

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
        return self._comm(axis_mask(axis))

    def _comm(self, mask: int):
        c = self._comms.get(mask)
        if c is None:
            if self._finalized:
                raise NotInitializedError("fourd: this grid was finalized; call fourd.init() again")
            c = self._native.communicator(mask)
            self._comms[mask] = c
        return c

    # ---- collectives -----------------------------------------------------------------------
    def all_reduce(
        self,
        tensor,
        axis="world",
        op="sum",
        *,
        output=None,
        algorithm="auto",
        async_op=False,
        timeout=None,
        accumulate_fp32=False,
    ):
        """Reduce `tensor` over the group along `axis`: in place, or into `output` (same count
        and dtype, not overlapping `tensor`) when given."""
        try:
            comm, opc, algc = self._calls[(axis, op, algorithm)]
        except (KeyError, TypeError):
            comm, opc, algc = self._plan_call(axis, op, algorithm)
        tmo = 0.0 if timeout is None else _timeout(timeout)
        if output is None:
            if (
                not async_op
                and type(tensor) is np.ndarray
                and comm.all_reduce_array(tensor, opc, algc, tmo, accumulate_fp32)
            ):
                return None  # the common blocking numpy call, in one native call
            p, n, dt, dev, idx, st = resolve(tensor, "tensor", True)
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
            )
        ip, n, dt, dev, idx, st = resolve(tensor, "tensor", False)
        op_, oc, odt, odev, _, _ = resolve(output, "output", True)
        _check_pair(dt, odt, dev, odev)
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
        )

    def _plan_call(self, axis, op, algorithm):
        mask = axis_mask(axis)
        plan = (self._comm(mask), _op_code(op), _algo_code(algorithm))
        try:
            if len(self._calls) < 256:
                self._calls[(axis, op, algorithm)] = plan
        except TypeError:  # an unhashable axis (a list): checked every call
            pass
        return plan

    def all_gather(
        self, output, input, axis="world", *, algorithm="auto", async_op=False, timeout=None
    ):
        """output = the inputs of the group along `axis`, concatenated in group-rank order."""
        try:
            comm, _, algc = self._calls[(axis, "sum", algorithm)]
        except (KeyError, TypeError):
            comm, _, algc = self._plan_call(axis, "sum", algorithm)
        ip, ic, idt, dev, idx, st = resolve(input, "input", False)
        op_, oc, odt, odev, _, _ = resolve(output, "output", True)
        _check_pair(idt, odt, dev, odev)
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
        )

    def reduce_scatter(
        self,
        output,
        input,
        axis="world",
        op="sum",
        *,
        algorithm="auto",
        async_op=False,
        timeout=None,
        accumulate_fp32=False,
    ):
        """Reduce `input` (group-size blocks) over the group; block i ends on group rank i."""
        try:
            comm, opc, algc = self._calls[(axis, op, algorithm)]
        except (KeyError, TypeError):
            comm, opc, algc = self._plan_call(axis, op, algorithm)
        ip, ic, idt, dev, idx, st = resolve(input, "input", False)
        op_, oc, odt, odev, _, _ = resolve(output, "output", True)
        _check_pair(idt, odt, dev, odev)
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
        )

    def broadcast(self, tensor, src, axis="world", *, async_op=False, timeout=None):
        """Copy `tensor` of group rank `src` to every rank of the group along `axis`."""
        comm = self._comm(axis_mask(axis))
        if not isinstance(src, int) or isinstance(src, bool):
            raise InvalidArgumentError(f"src: expected a group rank (int), found {src!r}")
        p, n, dt, dev, idx, st = resolve(tensor, "tensor", True)
        return comm.broadcast(
            p, n, dt, dev, idx, st, src, _timeout(timeout), async_op, tensor if async_op else None
        )

    def barrier(self, axis="world", *, timeout=None):
        self._comm(axis_mask(axis)).barrier(_timeout(timeout))

    def explain(
        self,
        collective: str,
        nbytes: int,
        axis="world",
        dtype: str = "float32",
        in_place: bool = False,
        device: str = "cpu",
    ) -> dict:
        """The candidates `auto` considers for this call, with predicted times and whether each
        can run, and its choice: the native selector's answer (internal/selector.hpp), for
        buffers on `device` ("cpu" or "cuda"). "source" says where the choice comes from
        ("plan", "FOURD_ALGORITHM", "tuning", "model", "device", "broadcast", "one rank");
        "tuning" is what tuning in use knows of the call. `in_place`: the call's output is its
        input (all_reduce), or holds it as this rank's block (all_gather, reduce_scatter);
        measured corrections of the model may differ."""
        comm = self._comm(axis_mask(axis))
        n, ip = int(nbytes), bool(in_place)
        e = comm.explain(collective, n, dtype, ip, device)
        return {
            "collective": collective,
            "nbytes": n,
            "axis": mask_name(axis_mask(axis)),
            "dtype": dtype,
            "in_place": ip,
            "device": device,
            "topology": comm.topology["description"],
            "candidates": e["candidates"],
            "choice": e["choice"],
            "source": e["source"],
            "forced_by_env": e["source"] == "FOURD_ALGORITHM",
            "set_by_plan": e["source"] == "plan",
            "tuning": comm.tuning(collective, n, dtype, ip),
        }

    def tuning(
        self,
        collective: str,
        nbytes: int,
        axis="world",
        dtype: str = "float32",
        in_place: bool = False,
    ) -> dict:
        """What tuning in use knows of this call (``explain(...)["tuning"]``, without pricing
        the candidates): state, candidates, measured_s, settled, explore_calls, recheck_gap."""
        return self._comm(axis_mask(axis)).tuning(collective, int(nbytes), dtype, bool(in_place))

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
        return self._comm(axis_mask(axis)).choose(
            collective, int(nbytes), dtype, bool(in_place), device
        )

    def finalize(self, timeout: float | None = None) -> bool:
        """Wait for operations in flight (up to the timeout), then free the communicators."""
        if self._finalized:
            return True
        self._finalized = True
        self._comms.clear()
        self._calls.clear()
        t = default_timeout() if timeout is None else float(timeout)
        return self._native.finalize(t)

    def __repr__(self) -> str:
        s = ", ".join(f"{a}={v}" for a, v in self.shape.items())
        return f"fourd.Grid({s}, order='{self._order}', rank {self._rank}/{self.world_size})"


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

    def first(v: str) -> str:
        return v.strip().splitlines()[0] if v.strip() else "?"

    if mpi4py_version.strip() != fourd_version.strip() or (
        mpi4py_initialized and not fourd_initialized
    ):
        return (
            "fourd: mpi4py and fourd use two different MPI libraries in this process "
            f'(mpi4py: "{first(mpi4py_version)}"; fourd: "{first(fourd_version)}"), so '
            "mpi4py's communicators mean nothing to fourd. Use one MPI for both: build fourd "
            "against the MPI that mpi4py uses (see mpi4py.get_config()), or install mpi4py "
            "and the MPI fourd was built with (pip install --force-reinstall mpich mpi4py)."
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
        if not isinstance(v, int) or isinstance(v, bool):
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
    elif not isinstance(data, int) or isinstance(data, bool):
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
    if ok and ranks_per_node >= 1:
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
) -> Grid:
    """Build the 4D grid over the ranks of `comm` (default MPI.COMM_WORLD). Collective: every
    rank must pass the same arguments (checked; a mismatch raises on every rank)."""
    global _current, _was_finalized
    from mpi4py import MPI

    _check_mpi_library(MPI)
    if plan is not None:
        kw = plan.grid_kwargs() if hasattr(plan, "grid_kwargs") else dict(plan)
        x, y, z = kw.get("x", 1), kw.get("y", 1), kw.get("z", 1)
        data = kw.get("data", data)
        order = kw.get("order", order)
    comm = MPI.COMM_WORLD if comm is None else comm
    args, local_error = _native_args(x, y, z, data, order, ranks_per_node, timeout, comm.Get_size())
    dbg = _env_flag("FOURD_DEBUG") if debug is None else bool(debug)
    abort = _env_flag("FOURD_ABORT_ON_TIMEOUT")
    try:
        native = _C.Grid(comm.py2f(), *args, dbg, abort)
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
        _current = g
        _all_grids.add(g)
        _was_finalized = False
    return g


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
