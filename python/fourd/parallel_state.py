"""Megatron-Core's ``parallel_state`` names on top of the fourd 4D grid.

    import fourd.parallel_state as ps
    ps.initialize(x=2, y=2, z=1, data=2)          # or ps.initialize(grid=existing_grid)
    tp = ps.get_tensor_model_parallel_group()     # x*y*z combined
    fourd.all_reduce(t, tp)                        # a group works wherever an axis does
    torch.distributed.all_reduce(t, group=tp.torch_group())

How Megatron's groups map onto the grid (Gx, Gy, Gz, Gdata):

=========================  ==========================  =====================================
Megatron name              fourd axes                  size
=========================  ==========================  =====================================
tensor model parallel      ("x", "y", "z")             Gx*Gy*Gz
data parallel              "data"                      Gdata
model parallel             ("x", "y", "z")             Gx*Gy*Gz (no pipeline stages)
tensor and data parallel   "world"                     world size
pipeline, context, expert  (none: size 1)              1
=========================  ==========================  =====================================

plus one getter triple per grid axis (``get_x_parallel_group()``, ``..._rank()``,
``..._world_size()`` for x, y, z; data is the data-parallel triple) and
:func:`get_group` for any combination, such as ``get_group(("z", "data"))``, the group over
which biases and norms are reduced.

Group rank i of a group is position i of ``group.ranks()`` (the grid's group-rank order), in
fourd's collectives and in the torch group of :meth:`Group.torch_group` alike.

fourd.nn and fourd.tensor_parallel take their defaults from here: :func:`default_grid` (this
module's grid when initialised, else the current fourd grid), :data:`TP_AXES`, and
:func:`mask_obj`, the shared :class:`AxisMask` of an axis argument.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading

from . import _C
from . import grid as _grid
from .errors import InvalidArgumentError, NotInitializedError

__all__ = [
    "TP_AXES",
    "AxisMask",
    "Group",
    "default_grid",
    "destroy_model_parallel",
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_src_rank",
    "get_data_parallel_world_size",
    "get_grid",
    "get_group",
    "get_model_parallel_group",
    "get_tensor_and_data_parallel_group",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_src_rank",
    "get_tensor_model_parallel_world_size",
    "get_x_parallel_group",
    "get_x_parallel_rank",
    "get_x_parallel_world_size",
    "get_y_parallel_group",
    "get_y_parallel_rank",
    "get_y_parallel_world_size",
    "get_z_parallel_group",
    "get_z_parallel_rank",
    "get_z_parallel_world_size",
    "get_pipeline_model_parallel_group",
    "get_pipeline_model_parallel_rank",
    "get_pipeline_model_parallel_world_size",
    "get_context_parallel_rank",
    "get_context_parallel_world_size",
    "initialize",
    "initialize_model_parallel",
    "init_torch_distributed",
    "is_pipeline_first_stage",
    "is_pipeline_last_stage",
    "mask_obj",
    "model_parallel_is_initialized",
]

#: The axes of Megatron's tensor-parallel group.
TP_AXES = _C.AXES[:3]  # x, y, z


class AxisMask:
    """An axis combination as fourd's collectives accept it (an object with an int ``mask``)."""

    __slots__ = ("mask",)

    def __init__(self, mask: int):
        self.mask = mask

    def __repr__(self) -> str:
        return f"AxisMask({_grid.mask_name(self.mask)!r})"


_MASK_OBJS = tuple(AxisMask(m) for m in range(_C.WORLD_MASK + 1))


def mask_obj(axis) -> AxisMask:
    """The shared AxisMask of an axis argument (a name, a tuple of names, or an int mask)."""
    if isinstance(axis, int) and not isinstance(axis, bool):
        return _MASK_OBJS[axis]
    return _MASK_OBJS[_grid.axis_mask(axis)]


class Group:
    """The ranks of my group along some grid axes: what Megatron calls a process group.

    fourd's collectives accept it wherever they accept an axis (it carries the axis bit mask as
    ``mask``), and :meth:`torch_group` gives the torch.distributed process group over the same
    ranks in the same order. ``size()`` and ``rank()`` mirror torch's ProcessGroup.
    """

    __slots__ = ("mask", "grid", "name", "_ranks", "_rank", "_torch_pg", "__weakref__")

    def __init__(self, grid, axis, name: str | None = None):
        self.mask = mask_obj(axis).mask
        self.grid = grid
        self.name = name or _grid.mask_name(self.mask)
        self._ranks = tuple(grid.ranks(self))
        self._rank = grid.rank(self)
        self._torch_pg = None

    @property
    def axes(self) -> tuple:
        """The grid axes of this group, innermost first in the grid's canonical order."""
        return tuple(a for a in _C.AXES if self.mask & _C.parse_axis(a))

    def ranks(self) -> list:
        """World ranks of the group, in group-rank order."""
        return list(self._ranks)

    def size(self) -> int:
        return len(self._ranks)

    def rank(self) -> int:
        """My rank within the group."""
        return self._rank

    def src_rank(self) -> int:
        """World rank of group rank 0 (Megatron's ``..._src_rank``)."""
        return self._ranks[0]

    # Collectives on this group (the grid it belongs to, not whichever grid is current).
    def all_reduce(self, tensor, op="sum", *, async_op=False, **kw):
        return self.grid.all_reduce(tensor, self, op, async_op=async_op, **kw)

    def all_gather(self, output, input, *, async_op=False, **kw):
        return self.grid.all_gather(output, input, self, async_op=async_op, **kw)

    def reduce_scatter(self, output, input, op="sum", *, async_op=False, **kw):
        return self.grid.reduce_scatter(output, input, self, op, async_op=async_op, **kw)

    def broadcast(self, tensor, src: int = 0, *, async_op=False, **kw):
        return self.grid.broadcast(tensor, src, self, async_op=async_op, **kw)

    def barrier(self, **kw):
        return self.grid.barrier(self, **kw)

    def torch_group(self, backend: str | None = None):
        """The torch.distributed ProcessGroup over this group's ranks (group rank i = position i
        of :meth:`ranks`), created on first use and cached.

        The first call for an axis combination is collective over the whole grid, as
        ``torch.distributed.new_group`` is: every rank calls it for the same axes (each then
        holds its own group; the torch groups of all the other groups along these axes are made
        at the same time, Megatron's way). Initialises torch.distributed from MPI first when
        nobody has (see :func:`init_torch_distributed`). backend: None = the default group's
        backend (gloo on CPU, nccl when CUDA is available).
        """
        if self._torch_pg is not None:
            return self._torch_pg
        import torch.distributed as dist

        info = init_torch_distributed(self.grid, backend=backend)
        of = info["torch_rank_of"]
        mine = tuple(of[r] for r in self._ranks)
        if len(mine) == dist.get_world_size() and list(mine) == sorted(mine):
            self._torch_pg = dist.group.WORLD
            return self._torch_pg
        # Every group along these axes, in one order all ranks agree on (sorted by rank list).
        groups = sorted(set(self.grid.mpi_comm.allgather(mine)))
        kw = {}
        if _state.torch_timeout is not None:
            kw["timeout"] = _state.torch_timeout
        pg = None
        for ranks in groups:
            key = (ranks, backend)
            made = _torch_groups.get(key)
            if made is None:
                # Same call, same order on every rank: torch's group counter stays in step.
                made = dist.new_group(list(ranks), backend=backend, sort_ranks=False, **kw)
                _torch_groups[key] = made
            if ranks == mine:
                pg = made
        self._torch_pg = pg
        return pg

    def __repr__(self) -> str:
        return (
            f"fourd.parallel_state.Group({self.name!r}, axes={'+'.join(self.axes)}, "
            f"ranks={list(self._ranks)}, rank={self._rank})"
        )


# ---- module state --------------------------------------------------------------------------


class _State:
    def __init__(self):
        self.grid = None
        self.owns_grid = False
        self.groups: dict = {}
        self.torch_timeout = None


_state = _State()
_lock = threading.RLock()
_torch_groups: dict = {}
_torch_info: dict | None = None  # set once torch.distributed is up (from MPI or found so)
_torch_default = None  # the default group _torch_info and _torch_groups belong to


def initialize(
    x=1,
    y=1,
    z=1,
    data=None,
    order="x-y-z-data",
    ranks_per_node=None,
    comm=None,
    *,
    grid=None,
    torch_distributed: bool = False,
    backend: str | None = None,
    timeout=None,
):
    """Build (or adopt) the 4D grid and make Megatron's getters answer from it.

    Collective over `comm` (default MPI.COMM_WORLD): every rank passes the same arguments, as for
    :func:`fourd.init`. grid: an existing :class:`fourd.Grid` to adopt instead (the other grid
    arguments must then be left at their defaults). torch_distributed: also initialise
    torch.distributed now (otherwise that happens at the first :meth:`Group.torch_group`).
    Calling it again without :func:`destroy_model_parallel` raises.
    Returns the grid.
    """
    with _lock:
        if _state.grid is not None:
            raise InvalidArgumentError(
                "fourd.parallel_state.initialize: already initialised; call "
                "destroy_model_parallel() first"
            )
    if grid is not None:
        given = {
            "x": x,
            "y": y,
            "z": z,
            "data": data,
            "order": order,
            "ranks_per_node": ranks_per_node,
            "comm": comm,
        }
        defaults = {
            "x": 1,
            "y": 1,
            "z": 1,
            "data": None,
            "order": "x-y-z-data",
            "ranks_per_node": None,
            "comm": None,
        }
        clash = [k for k in given if given[k] != defaults[k]]
        if clash:
            raise InvalidArgumentError(
                f"grid: expected either an existing grid or grid sizes, found both (grid and "
                f"{', '.join(clash)})"
            )
        if not isinstance(grid, _grid.Grid):
            raise InvalidArgumentError(f"grid: expected a fourd.Grid, found {type(grid).__name__}")
        g, owns = grid, False
    else:
        g, owns = (
            _grid.init(
                x=x,
                y=y,
                z=z,
                data=data,
                order=order,
                ranks_per_node=ranks_per_node,
                comm=comm,
                timeout=timeout,
            ),
            True,
        )
    with _lock:
        _state.grid = g
        _state.owns_grid = owns
        _state.groups = {}
        t = timeout if timeout is not None else _grid.default_timeout()
        _state.torch_timeout = datetime.timedelta(seconds=float(t))
    if torch_distributed:
        init_torch_distributed(g, backend=backend)
    return g


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    *,
    x=None,
    y=None,
    z=None,
    **kwargs,
):
    """Megatron's entry point. The tensor-parallel size alone does not say how to split it over
    x, y and z: pass x=, y=, z= (their product must equal tensor_model_parallel_size when that
    is given too); with only the size, the whole of it goes to x (Megatron's 1D tensor
    parallelism). Pipeline parallelism is not part of the 4D grid: only size 1 is accepted."""
    if pipeline_model_parallel_size != 1:
        raise InvalidArgumentError(
            f"pipeline_model_parallel_size: fourd's grid has no pipeline axis; expected 1, found "
            f"{pipeline_model_parallel_size}"
        )
    if x is None and y is None and z is None:
        x, y, z = tensor_model_parallel_size, 1, 1
    else:
        x, y, z = x or 1, y or 1, z or 1
        if tensor_model_parallel_size not in (1, x * y * z):
            raise InvalidArgumentError(
                f"tensor_model_parallel_size: expected x*y*z = {x * y * z}, found "
                f"{tensor_model_parallel_size}"
            )
    return initialize(x=x, y=y, z=z, **kwargs)


def model_parallel_is_initialized() -> bool:
    return _state.grid is not None


def destroy_model_parallel():
    """Forget the groups, and finalize the grid when :func:`initialize` built it.

    torch.distributed stays up, and so do the torch groups made by :meth:`Group.torch_group`:
    they depend only on their rank lists, so a later :func:`initialize` reuses them (destroying
    and re-making them would be collective, and torch may reuse a destroyed group's name).
    ``torch.distributed.destroy_process_group()`` drops them all; fourd notices."""
    with _lock:
        g, owns = _state.grid, _state.owns_grid
        _state.grid = None
        _state.owns_grid = False
        _state.groups = {}
    if g is not None and owns:
        g.finalize()


def get_grid():
    """The grid :func:`initialize` built or adopted."""
    g = _state.grid
    if g is None:
        raise NotInitializedError(
            "fourd.parallel_state: not initialised; call fourd.parallel_state.initialize() first"
        )
    return g


def default_grid(grid=None):
    """The grid fourd.nn and fourd.tensor_parallel work on when given none: `grid` when given,
    else the grid :func:`initialize` built or adopted, else the current fourd grid
    (:func:`fourd.get_grid`, which raises when there is none)."""
    if grid is not None:
        return grid
    g = _state.grid
    return g if g is not None else _grid.get_grid()


def get_group(axis) -> Group:
    """My group along `axis` (an axis name, a tuple of names, "world", or a Group)."""
    if isinstance(axis, Group):
        return axis
    g = get_grid()
    mask = _grid.axis_mask(axis)
    grp = _state.groups.get(mask)
    if grp is None:
        with _lock:
            grp = _state.groups.get(mask)
            if grp is None:
                grp = Group(g, mask, _NAMES.get(mask))
                _state.groups[mask] = grp
    return grp


# Megatron's names of two groups; every other group is named by its axes (fourd.grid.mask_name).
_NAMES = {
    _C.parse_axis("+".join(TP_AXES)): "tensor_model_parallel",
    _C.parse_axis("data"): "data_parallel",
}


# ---- Megatron-Core getters -----------------------------------------------------------------


def get_tensor_model_parallel_group(check_initialized: bool = True) -> Group:
    """x*y*z combined."""
    if not check_initialized and _state.grid is None:
        return None
    return get_group(TP_AXES)


def get_tensor_model_parallel_rank() -> int:
    return get_group(TP_AXES).rank()


def get_tensor_model_parallel_world_size() -> int:
    return get_group(TP_AXES).size()


def get_tensor_model_parallel_src_rank() -> int:
    """World rank of the first rank of my tensor-parallel group."""
    return get_group(TP_AXES).src_rank()


def get_model_parallel_group(check_initialized: bool = True) -> Group:
    """Tensor x pipeline; there are no pipeline stages, so the tensor-parallel group."""
    return get_tensor_model_parallel_group(check_initialized)


def get_data_parallel_group(
    with_context_parallel: bool = False, partial_data_parallel: bool = False
) -> Group:
    """The data axis. Context parallelism has size 1, so with_context_parallel changes nothing;
    partial data parallelism (distributed-optimizer instances) is not supported."""
    if partial_data_parallel:
        raise InvalidArgumentError("partial_data_parallel: not supported by fourd.parallel_state")
    return get_group("data")


def get_data_parallel_rank(
    with_context_parallel: bool = False, partial_data_parallel: bool = False
) -> int:
    return get_data_parallel_group(with_context_parallel, partial_data_parallel).rank()


def get_data_parallel_world_size(
    with_context_parallel: bool = False, partial_data_parallel: bool = False
) -> int:
    return get_data_parallel_group(with_context_parallel, partial_data_parallel).size()


def get_data_parallel_src_rank(with_context_parallel: bool = False) -> int:
    return get_data_parallel_group(with_context_parallel).src_rank()


def get_tensor_and_data_parallel_group(with_context_parallel: bool = False) -> Group:
    """Tensor x data = every rank of the grid."""
    return get_group("world")


def _axis_getters(axis):
    def group() -> Group:
        return get_group(axis)

    def rank() -> int:
        return get_group(axis).rank()

    def world_size() -> int:
        return get_group(axis).size()

    group.__doc__ = f"My group along the grid's {axis} axis."
    rank.__doc__ = f"My coordinate along the grid's {axis} axis."
    world_size.__doc__ = f"G{axis}: the grid's size along {axis}."
    for f, what in ((group, "group"), (rank, "rank"), (world_size, "world_size")):
        f.__name__ = f.__qualname__ = f"get_{axis}_parallel_{what}"
    return group, rank, world_size


get_x_parallel_group, get_x_parallel_rank, get_x_parallel_world_size = _axis_getters("x")
get_y_parallel_group, get_y_parallel_rank, get_y_parallel_world_size = _axis_getters("y")
get_z_parallel_group, get_z_parallel_rank, get_z_parallel_world_size = _axis_getters("z")


# Pipeline and context parallelism are absent from the 4D grid (size 1): these answer what
# Megatron code asks of them.
def get_pipeline_model_parallel_world_size() -> int:
    get_grid()
    return 1


def get_pipeline_model_parallel_rank() -> int:
    get_grid()
    return 0


def get_pipeline_model_parallel_group():
    """A pipeline group of one rank: my own."""
    g = get_grid()
    return _SelfGroup(g)


def is_pipeline_first_stage(ignore_virtual: bool = False) -> bool:
    get_grid()
    return True


def is_pipeline_last_stage(ignore_virtual: bool = False) -> bool:
    get_grid()
    return True


def get_context_parallel_world_size() -> int:
    get_grid()
    return 1


def get_context_parallel_rank() -> int:
    get_grid()
    return 0


class _SelfGroup:
    """A group holding only this rank (size 1); not a fourd collective target."""

    def __init__(self, grid):
        self.grid = grid

    def ranks(self):
        return [self.grid.world_rank]

    def size(self):
        return 1

    def rank(self):
        return 0

    def __repr__(self):
        return f"fourd.parallel_state.Group('pipeline', ranks=[{self.grid.world_rank}])"


# ---- torch.distributed from MPI ------------------------------------------------------------


def _master_address(comm) -> str:
    """An address of rank 0 that every rank can reach: loopback when all ranks share a host,
    else rank 0's first non-loopback IPv4 address (FOURD_TORCH_MASTER_ADDR overrides)."""
    env = os.environ.get("FOURD_TORCH_MASTER_ADDR", "").strip()
    if env:
        return env
    host = socket.gethostname()
    hosts = comm.allgather(host)
    if all(h == hosts[0] for h in hosts):
        return "127.0.0.1"
    addr = None
    if comm.Get_rank() == 0:
        addr = host
        try:
            for info in socket.getaddrinfo(host, None, socket.AF_INET):
                ip = info[4][0]
                if not ip.startswith("127."):
                    addr = ip
                    break
        except OSError:
            pass
    return comm.bcast(addr, root=0)


def _listening_store(dist, addr: str, size: int, timeout):
    """Rank 0's TCPStore, listening on `addr` only (loopback when every rank shares this
    host): the socket is bound here and handed over, since TCPStore alone listens on every
    interface. Returns (store, port)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, 0))
        sock.listen(max(128, size))
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    store = dist.TCPStore(
        addr,
        port,
        size,
        True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )
    return store, port


def _start_torch_distributed(comm, backend: str | None) -> None:
    """torch.distributed.init_process_group over the processes of `comm`, torch rank = rank
    in `comm`: rank 0 opens a TCPStore on a free port and tells the others over MPI. backend:
    None picks nccl when CUDA is available, else gloo. Collective over `comm`."""
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = _state.torch_timeout or datetime.timedelta(seconds=_grid.default_timeout())
    addr = _master_address(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    store, err = None, None
    if rank == 0:
        try:
            store, port = _listening_store(dist, addr, size, timeout)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err, port = repr(e), -1
    else:
        port = None
    port, err = comm.bcast((port, err) if rank == 0 else None, root=0)
    if port < 0:
        raise InvalidArgumentError(f"fourd: could not open torch's TCPStore on rank 0: {err}")
    if rank != 0:
        store = dist.TCPStore(addr, port, size, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)


def init_torch_distributed(grid=None, backend: str | None = None) -> dict:
    """Make sure torch.distributed is initialised, over the same processes as the grid.

    When it is not yet, rank 0 of the grid's communicator opens a TCPStore on a free port and
    tells the others over MPI (no MASTER_ADDR/MASTER_PORT needed), then every rank joins with
    torch rank = grid world rank. backend: None picks nccl when CUDA is available, else gloo.
    When torch.distributed is already up, its world must hold the grid's processes (a mismatch
    raises). Collective over the grid's communicator the first time. Returns
    ``{"torch_rank_of": [torch rank of grid rank r], "backend": ...}``.
    """
    global _torch_info, _torch_default
    import torch.distributed as dist

    if _torch_info is not None and dist.is_initialized() and dist.group.WORLD is _torch_default:
        return _torch_info
    _torch_groups.clear()  # none yet, or made under a default group that is gone
    g = grid if grid is not None else get_grid()
    if not dist.is_initialized():
        _start_torch_distributed(g.mpi_comm, backend)
    torch_rank = dist.get_rank()
    torch_rank_of = g.mpi_comm.allgather(torch_rank)
    if len(set(torch_rank_of)) != len(torch_rank_of):
        raise InvalidArgumentError(
            "torch.distributed: its ranks do not match the grid's processes (two grid ranks "
            f"share torch rank; torch ranks by grid rank: {torch_rank_of})"
        )
    with _lock:
        _torch_info = {"torch_rank_of": torch_rank_of, "backend": dist.get_backend()}
        _torch_default = dist.group.WORLD
    return _torch_info
