"""fourd's groups as torch.distributed process groups, for fourd.parallel_state.

Three things live here:

- :func:`new_torch_group`, the one place fourd makes a torch ProcessGroup:
  ``torch.distributed.new_group(ranks, backend=...)`` with the backend of
  :func:`torch_backend` ("fourd" once ``fourd.distributed`` registers it, else torch's default).
- :class:`Group`, a group of the grid that is both a fourd group (fourd's collectives take it
  as ``axis=``/``group=``) and a ``torch.distributed.ProcessGroup`` that every torch.distributed
  call accepts directly (``dist.all_reduce(t, group=g)``, ``dist.get_rank(g)``, DDP's
  ``process_group=``, DeviceMesh.from_group, functional collectives).
- torch.distributed brought up from MPI (:func:`start_torch`), so that nobody has to set
  MASTER_ADDR and MASTER_PORT.

How a Group is a ProcessGroup: torch keeps its process groups in dictionaries keyed by the
ProcessGroup object that ``new_group`` returned (its ranks, backend and name), and a C++
ProcessGroup accepts neither new attributes nor another class. So a Group is a Python subclass
of ProcessGroup holding the real one: it hashes and compares equal to it, so that torch's
lookups of the Group find the real group's entries, and every method and property of torch's
ProcessGroup interface (the collectives, ``name()``, ``group_name``, ``_device_types`` ...) is
forwarded to it, from Python and from C++ alike (a C++ caller such as DDP's reducer reaches the
forwarding methods through torch's PyProcessGroup trampoline). The Group's own C++ part has no
backend and never communicates.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import threading
import types

import torch.distributed as dist

from . import _C
from . import grid as _grid
from .errors import InvalidArgumentError

_PG = dist.ProcessGroup
_lock = threading.RLock()
# (torch ranks, backend, tag) -> ProcessGroup, for the life of the default group.
_torch_groups: dict = {}
_torch_info: dict | None = None  # set once torch.distributed is up (from MPI or found so)
_torch_default = None  # the default group that _torch_info and _torch_groups belong to
_UNSET = object()
_backend_choice = _UNSET


def torch_backend() -> str | None:
    """The backend of the torch process groups fourd makes: "fourd" when importing
    ``fourd.distributed`` registers that c10d backend, else None (torch's default: the
    default group's backend, gloo on CPU). Decided once per process."""
    global _backend_choice
    if _backend_choice is _UNSET:
        try:
            importlib.import_module("fourd.distributed")
            have = "fourd" in dist.Backend.backend_list
        except ModuleNotFoundError as e:
            if e.name != "fourd.distributed":
                raise  # fourd.distributed exists but needs something missing: say so
            have = False
        _backend_choice = "fourd" if have else None
    return _backend_choice


def new_torch_group(ranks, backend=None, *, timeout=None, desc=None, tag=None):
    """The torch ProcessGroup over `ranks` (torch ranks; group rank i = ranks[i]), made by
    ``torch.distributed.new_group(ranks, backend=..., sort_ranks=False)`` the first time and
    cached per (ranks, backend, tag) for the life of the default group. backend None =
    :func:`torch_backend`; a distinct `tag` asks for a communicator of its own over the same
    ranks. The world in its own order with the default group's backend is the default group.

    Collective over torch's whole world, as ``new_group`` is: every rank makes the same calls
    in the same order, members or not (a non-member gets torch's NON_GROUP_MEMBER)."""
    if backend is None:
        backend = torch_backend()
    default = dist.get_backend()
    key = (tuple(ranks), backend or default, tag)
    with _lock:
        pg = _torch_groups.get(key)
        if pg is None:
            world = list(range(dist.get_world_size()))
            if tag is None and list(ranks) == world and (backend or default) == default:
                pg = dist.group.WORLD
            else:
                kw = {"timeout": timeout} if timeout is not None else {}
                if desc:
                    kw["group_desc"] = desc
                pg = dist.new_group(list(ranks), backend=backend, sort_ranks=False, **kw)
            _torch_groups[key] = pg
    return pg


def _forward_method(name: str):
    def method(self, *args, **kwargs):
        return getattr(self._pg, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"torch's ProcessGroup.{name}, on this group's torch process group."
    return method


def _forward_property(name: str, settable: bool):
    def get(self):
        return getattr(self._pg, name)

    def put(self, value):
        setattr(self._pg, name, value)

    return property(get, put if settable else None, doc=f"torch's ProcessGroup.{name}.")


class Group(_PG):
    """My group of the grid along some axes (or of some world ranks): what Megatron calls a
    process group.

    It is a ``torch.distributed.ProcessGroup`` (see the module docstring), so torch calls take
    it directly; fourd's collectives take it wherever they take an axis (``fourd.all_reduce(t,
    g)``, ``group=g``), and it has fourd's own ``all_reduce/all_gather/reduce_scatter/
    broadcast/barrier`` on the grid it belongs to. Group rank i is position i of
    :meth:`ranks` in both worlds. ``size()`` and ``rank()`` are torch's.

    grid: its grid. axis: what fourd's collectives get for it (the shared AxisMask of its axes,
    or a ``fourd.Subgroup`` for ranks that form no axis). ranks: its world ranks in group-rank
    order. torch_pg: the torch ProcessGroup over the same ranks. family: every group of its
    kind (its own included), as made together by :func:`make_group`.
    """

    def __init__(self, grid, axis, ranks, torch_pg, label=None, family=()):
        ranks = tuple(ranks)
        _PG.__init__(self, ranks.index(grid.world_rank), len(ranks))
        self.grid = grid
        self.fourd_axis = axis
        mask = getattr(axis, "mask", None)
        self.mask = mask if isinstance(mask, int) else None
        self._ranks = ranks
        self._rank = ranks.index(grid.world_rank)
        self._pg = torch_pg
        self._family = tuple(family) or (ranks,)
        self._label = label or (_grid.mask_name(self.mask) if self.mask else "ranks")
        self._other_backends: dict = {}
        # The C++ side answers C++ callers' getGroupName() (functional collectives) as the
        # real group does.
        _PG._set_group_name(self, torch_pg.group_name)

    # torch's lookups of a Group find the torch group it stands for (see the module docstring)
    def __eq__(self, other):
        return other is self or other is self._pg

    def __hash__(self):
        return hash(self._pg)

    @property
    def axes(self) -> tuple:
        """The grid axes of this group, innermost first in the grid's canonical order (none for
        a group that is no axis combination)."""
        if self.mask is None:
            return ()
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

    # ---- fourd's collectives on this group (its grid, not whichever grid is current) ------
    def all_reduce(self, tensor, op="sum", *, async_op=False, **kw):
        return self.grid.all_reduce(tensor, self.fourd_axis, op, async_op=async_op, **kw)

    def all_gather(self, output, input, *, async_op=False, **kw):
        return self.grid.all_gather(output, input, self.fourd_axis, async_op=async_op, **kw)

    # Three names that torch's ProcessGroup has too: torch's own call forms (a list of tensors,
    # or BarrierOptions) go to the torch group, fourd's forms to fourd.
    def reduce_scatter(self, output, input, *args, async_op=False, **kw):
        """fourd's ``reduce_scatter(output, input, op="sum")`` on this group; torch's form
        (lists of tensors) on its torch group."""
        if isinstance(output, list):
            return self._pg.reduce_scatter(output, input, *args, **kw)
        axis = self.fourd_axis
        return self.grid.reduce_scatter(output, input, axis, *args, async_op=async_op, **kw)

    def broadcast(self, tensor, *args, async_op=False, **kw):
        """fourd's ``broadcast(tensor, src=0)`` (src a group rank) on this group; torch's form
        (a list of tensors) on its torch group."""
        if isinstance(tensor, list):
            return self._pg.broadcast(tensor, *args, **kw)
        src = args[0] if args else kw.pop("src", 0)
        return self.grid.broadcast(tensor, src, self.fourd_axis, async_op=async_op, **kw)

    def barrier(self, *args, **kw):
        """fourd's barrier on this group; torch's form (BarrierOptions) on its torch group."""
        if args or "opts" in kw:
            return self._pg.barrier(*args, **kw)
        return self.grid.barrier(self.fourd_axis, **kw)

    def torch_group(self, backend: str | None = None):
        """The torch ProcessGroup over this group's ranks (group rank i = position i of
        :meth:`ranks`). backend None: the one this Group forwards to (fourd's backend when
        available). Another backend (such as "gloo"): made on first use for every group of
        this kind at once, so that first call is collective over the whole world, as
        ``torch.distributed.new_group`` is; cached."""
        if backend is None:
            return self._pg
        pg = self._other_backends.get(backend)
        if pg is None:
            pg = _my_torch_group(self.grid, self._family, self._label, backend)[1]
            self._other_backends[backend] = pg
        return pg

    def __repr__(self) -> str:
        axes = "+".join(self.axes) or "-"
        return (
            f"fourd.parallel_state.Group({self._label!r}, axes={axes}, "
            f"ranks={list(self._ranks)}, rank={self._rank})"
        )


def _forward_torch_interface(cls) -> None:
    """Give `cls` a forwarding method or property for every method and property of torch's
    ProcessGroup that `cls` does not define itself (read from torch's class, so a torch
    version with other methods needs no change here)."""
    own = set(vars(cls))
    for name, attr in vars(_PG).items():
        if name.startswith(("__", "_pybind11")) or name in own:
            continue
        if isinstance(attr, property):
            setattr(cls, name, _forward_property(name, attr.fset is not None))
        elif isinstance(attr, types.FunctionType) or type(attr).__name__ == "instancemethod":
            setattr(cls, name, _forward_method(name))


_forward_torch_interface(Group)


def families_along(grid, mask: int) -> list:
    """Every group of the grid along the axes of `mask`, as tuples of world ranks in group-rank
    order, sorted: the same list on every rank (pure rank arithmetic, no communication)."""
    pgrid = _C.ProcessGrid(sizes=[grid.shape[a] for a in _C.AXES], order=grid.order)
    return sorted({tuple(pgrid.group_ranks(r, mask)) for r in range(grid.world_size)})


def _my_torch_group(grid, family, label, backend, timeout=None, tag=None):
    """Make the torch groups of every member of `family` (tuples of world ranks, the same
    list on every rank), in its order; return (my ranks, my torch group), or None when no
    group of the family holds me. Collective over the whole world."""
    of = torch_ranks(grid)
    me = grid.world_rank
    mine = None
    for ranks in family:
        pg = new_torch_group([of[r] for r in ranks], backend, timeout=timeout, desc=label, tag=tag)
        if me in ranks:
            mine = (tuple(ranks), pg)
    return mine


def make_group(grid, axis, family, label=None, backend=None, *, timeout=None, tag=None):
    """My Group among `family` (every group of one kind, as tuples of world ranks in group-rank
    order, the same list on every rank), or None when no group of it holds me. Makes the torch
    groups of the whole family, so it is collective over the whole world. axis: fourd's axis
    argument for my group (an AxisMask); None for ranks that form no axis combination, which
    then get a ``fourd.Subgroup`` (``Grid.group``, collective over those ranks)."""
    mine = _my_torch_group(grid, family, label, backend, timeout, tag)
    if mine is None:
        return None
    if axis is None:
        axis = grid.group(mine[0])
    return Group(grid, axis, mine[0], mine[1], label, family)


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


def _listening_store(addr: str, size: int, timeout):
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


def _default_backend(backend: str | None) -> str:
    """The default group's backend: `backend` when given, else fourd's when registered, else
    nccl when CUDA is available, else gloo."""
    if backend is not None:
        return backend
    import torch

    return torch_backend() or ("nccl" if torch.cuda.is_available() else "gloo")


def _start_torch_distributed(comm, backend: str | None, timeout) -> None:
    """torch.distributed.init_process_group over the processes of `comm`, torch rank = rank
    in `comm`: rank 0 opens a TCPStore on a free port and tells the others over MPI.
    Collective over `comm`."""
    backend = _default_backend(backend)
    addr = _master_address(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    store, err = None, None
    if rank == 0:
        try:
            store, port = _listening_store(addr, size, timeout)
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


def start_torch(grid, backend: str | None = None, timeout=None) -> dict:
    """Make sure torch.distributed is initialised over the same processes as `grid`.

    When it is not yet, rank 0 of the grid's communicator opens a TCPStore on a free port and
    tells the others over MPI (no MASTER_ADDR/MASTER_PORT needed), then every rank joins with
    torch rank = grid world rank; backend as :func:`_default_backend`. When torch.distributed
    is already up, its world must hold the grid's processes (a mismatch raises). Collective
    over the grid's communicator the first time. Returns ``{"torch_rank_of": [torch rank of
    grid rank r], "backend": ...}``."""
    global _torch_info, _torch_default
    if _torch_info is not None and dist.is_initialized() and dist.group.WORLD is _torch_default:
        return _torch_info
    with _lock:
        _torch_groups.clear()  # none yet, or made under a default group that is gone
    if timeout is None:
        timeout = datetime.timedelta(seconds=_grid.default_timeout())
    if not dist.is_initialized():
        _start_torch_distributed(grid.mpi_comm, backend, timeout)
    torch_rank_of = grid.mpi_comm.allgather(dist.get_rank())
    if len(set(torch_rank_of)) != len(torch_rank_of):
        raise InvalidArgumentError(
            "torch.distributed: its ranks do not match the grid's processes (two grid ranks "
            f"share torch rank; torch ranks by grid rank: {torch_rank_of})"
        )
    with _lock:
        _torch_info = {"torch_rank_of": torch_rank_of, "backend": dist.get_backend()}
        _torch_default = dist.group.WORLD
    return _torch_info


def torch_ranks(grid) -> list:
    """torch rank of each grid world rank (torch.distributed brought up when it is not)."""
    return start_torch(grid)["torch_rank_of"]
