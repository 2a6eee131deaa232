"""The things a row can time: fourd (one per algorithm), MPI through mpi4py, and
torch.distributed on gloo and on fourd's own backend (torch-fourd), each on a group of exactly
the same ranks.

An implementation gives, for one (collective, placement) on one set of buffers, a call to time
and the place where its result lands (for the check). It never communicates outside those calls,
so every rank takes the same path. Whether a cell can run at all is decided in two steps:
`unsupported()` (static reasons, identical on every rank), then a guarded first call whose
failure is agreed on by all ranks (runner.py).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import warnings

import numpy as np

import fourd
from fourd import _C

from .check import NUMPY_STORAGE
from .collectives import TABLE, MpiArgs, TorchArgs

# Two arenas (send, receive) that every row's buffers are carved from. Allocated and written
# once, at the size of the largest row (Buffers.reserve): a row that allocated its own arrays
# ran its first cells (auto's) on freshly faulted pages, while the kernel was still working on
# them (numpy asks for huge pages for large arrays), and read up to 1.5x slow at 64 MiB.
_ARENA = {"send": np.zeros(0, np.uint8), "recv": np.zeros(0, np.uint8)}


def _carve(which: str, count: int, storage) -> np.ndarray:
    nbytes = count * np.dtype(storage).itemsize
    if _ARENA[which].nbytes < nbytes:  # a row larger than reserved: grow (and touch) once
        Buffers.reserve(nbytes)
    return _ARENA[which][:nbytes].view(storage)


class Buffers:
    """The send and receive arrays of one (collective, axis, dtype, size), shared by every
    implementation and carved from arenas that live for the whole run; their counts are the
    collective's (collectives.py). Storage is numpy; bfloat16 is stored as its uint16 bit
    pattern. Contents are whatever the previous row left; the check fills what it compares."""

    @staticmethod
    def reserve(nbytes: int) -> None:
        """Makes both arenas at least `nbytes` long, every page written."""
        for which in ("send", "recv"):
            if _ARENA[which].nbytes < nbytes:
                _ARENA[which] = np.zeros(0, np.uint8)  # release the old one first
                a = np.empty(nbytes, np.uint8)
                a.fill(0)  # fault every page now, not in a timed cell
                _ARENA[which] = a

    def __init__(self, collective: str, dtype: str, count: int, p: int):
        self.collective, self.dtype, self.count, self.p = collective, dtype, count, p
        self.coll = TABLE[collective]
        self.block = count // p if self.coll.blocked else count
        storage = NUMPY_STORAGE[dtype]
        nsend, nrecv = self.coll.counts(count, p)
        self.send = _carve("send", nsend, storage) if nsend else None  # None: one buffer
        self.recv = _carve("recv", nrecv, storage)

    def zero(self) -> None:
        """Zeros both arrays (rows without the check: no stale bit patterns, such as another
        dtype's, that would read as denormals or NaNs)."""
        for a in (self.send, self.recv):
            if a is not None:
                a.fill(0)


class Impl:
    library = ""
    label = ""
    algorithm = ""
    api = ""  # whose calls these are in the collective table's rules (in_place_only); library

    def group_rank(self, axis) -> int:
        raise NotImplementedError

    def root_group_rank(self, axis) -> int:
        return 0

    def tuned_axis(self, axis):
        """The axis argument of Grid.tuning for the calls of fourd's auto this implementation
        makes on `axis` (the runner waits for their tuning to settle), or None."""
        return None

    def unsupported(self, collective, dtype, op, in_place) -> str | None:
        """Why this library cannot run the cell (the same on every rank), or None."""
        if not in_place:
            return TABLE[collective].in_place_only.get(self.api or self.library)
        return None

    def make_call(self, axis, bufs: Buffers, in_place: bool, op):
        """(call, input_view, result_view): `call()` runs the collective once; input_view is the
        array the check fills; result_view the array the check compares."""
        raise NotImplementedError


class FourdImpl(Impl):
    """fourd's public API (fourd.all_reduce, ...) with one algorithm ("auto" included)."""

    library = "fourd"

    def __init__(self, grid, algorithm: str, timeout):
        self.grid, self.algorithm, self.timeout = grid, algorithm, timeout
        self.label = algorithm

    def group_rank(self, axis) -> int:
        return self.grid.rank(axis.name)

    def tuned_axis(self, axis):
        return axis.name if self.algorithm == "auto" else None

    def unsupported(self, collective, dtype, op, in_place):
        if not TABLE[collective].takes_algorithm and self.algorithm != "auto":
            return f"fourd.{collective} takes no algorithm argument (only auto is measured)"
        return super().unsupported(collective, dtype, op, in_place)

    def make_call(self, axis, bufs, in_place, op):
        inp, res = bufs.coll.views(bufs, in_place, self.group_rank(axis))
        i, o = _fourd_view(inp, bufs.dtype), _fourd_view(res, bufs.dtype)
        call = bufs.coll.fourd(
            self.grid, axis.name, op, self.algorithm, self.timeout, i, o, in_place
        )
        return call, inp, res


def _fourd_view(arr: np.ndarray, dtype: str):
    """What fourd is passed: the array itself, or a fourd.Buffer over the bit pattern of a
    dtype numpy lacks (bfloat16)."""
    return arr if arr.dtype.name == dtype else fourd.Buffer.of(arr, dtype)


class MpiImpl(Impl):
    """The MPI library's own collective (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block,
    MPI_Bcast) through mpi4py, on a communicator split from the grid's with the same ranks in
    the same order as fourd's group."""

    library = "mpi"
    label = "mpi"
    algorithm = "mpi"

    def __init__(self, grid):
        from mpi4py import MPI

        self.MPI = MPI
        self.grid = grid
        self.comms: dict = {}
        self.types = {
            "float32": MPI.FLOAT,
            "float64": MPI.DOUBLE,
            "float16": getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL),
            "bfloat16": getattr(MPI, "BFLOAT16_T", MPI.DATATYPE_NULL),
            "int8": MPI.INT8_T,
            "uint8": MPI.UINT8_T,
            "int32": MPI.INT32_T,
            "int64": MPI.INT64_T,
        }
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def setup(self, axes):
        """Collective over the world: one Split per axis, in the same order on every rank."""
        world = self.grid.mpi_comm
        for axis in axes:
            ranks = self.grid.ranks(axis.name)
            self.comms[axis.mask] = world.Split(min(ranks), self.grid.rank(axis.name))

    def free(self):
        for c in self.comms.values():
            try:
                c.Free()
            except Exception:  # noqa: BLE001, S110 - best effort at exit
                pass
        self.comms.clear()

    def group_rank(self, axis) -> int:
        return self.comms[axis.mask].Get_rank()

    def unsupported(self, collective, dtype, op, in_place):
        why = super().unsupported(collective, dtype, op, in_place)
        if why is not None:
            return why
        if op == "avg":
            return "MPI has no average reduction"
        if self.types[dtype] == self.MPI.DATATYPE_NULL:
            return f"this MPI library has no {dtype} datatype"
        return None

    def make_call(self, axis, bufs, in_place, op):
        comm = self.comms[axis.mask]
        coll = bufs.coll
        inp, res = coll.views(bufs, in_place, comm.Get_rank())
        if in_place and coll.mpi_in_place_result_first:
            res = inp[: bufs.block]
        args = MpiArgs(
            self.MPI, comm, self.types[bufs.dtype], self.ops[op] if coll.reduces else None
        )
        return coll.mpi(args, inp, res, in_place), inp, res


class TorchSession:
    """torch.distributed for the torch baselines, initialised from MPI (rank 0 picks a free port
    and broadcasts it), with one new_group per group of every axis for each backend measured,
    made by every rank in the same order. The default group is gloo's, or fourd's when
    torch-fourd is measured: a group of fourd's backend needs its default group on fourd
    (docs/torch.md), and gloo's groups are then new_group(backend="gloo") over the same
    store."""

    def __init__(self, grid, timeout_s: float):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.grid = torch, dist, grid
        self.timeout_s = timeout_s
        self.roots: dict = {}  # axis mask -> the world rank of fourd's group rank 0
        self.version = torch.__version__
        self.master = ""
        self.default = ""  # the default group's backend
        torch.set_num_threads(1)  # ranks already share the cores; no intra-op threads
        self.ops = {
            "sum": dist.ReduceOp.SUM,
            "prod": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX,
            "avg": getattr(dist.ReduceOp, "AVG", None),
        }
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = (
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        )

    @staticmethod
    def rendezvous(world, hosts) -> tuple[str, int]:
        """Collective: (address, port) of rank 0's store, the same on every rank."""
        addr, port = None, 0
        if world.Get_rank() == 0:
            addr = os.environ.get("MASTER_ADDR")
            if not addr:
                if len(set(hosts)) == 1:
                    addr = "127.0.0.1"
                else:
                    try:
                        addr = socket.gethostbyname(socket.gethostname())
                    except OSError:
                        addr = socket.gethostname()
            try:
                with socket.socket() as s:
                    s.bind((addr if addr != "localhost" else "127.0.0.1", 0))
                    port = s.getsockname()[1]
            except OSError:
                port = 0
        return world.bcast((addr, port), root=0)

    def setup(self, world, hosts, axes, impls) -> None:
        """Collective over the world: the default group, then every group of each of `impls`
        (TorchImpl and TorchFourdImpl). Raises on failure (the caller agrees on the outcome)."""
        # The bench's own MPI communication first, so that a torch failure on one rank cannot
        # leave the ranks in different MPI calls; after this point only torch waits (with its
        # timeout), fourd's backend included: its MPI calls have that deadline.
        groups = []
        for axis in axes:
            mine = tuple(self.grid.ranks(axis.name))
            groups.append((axis, mine, sorted(set(world.allgather(mine)))))
            self.roots[axis.mask] = mine[0]  # fourd's and MPI's group rank 0
        addr, port = self.rendezvous(world, hosts)
        if not port:
            raise RuntimeError(f"rank 0 could not open a port on {addr} for torch.distributed")
        self.master = f"{addr}:{port}"
        self.default = "fourd" if any(i.backend == "fourd" for i in impls) else "gloo"
        self.dist.init_process_group(
            self.default,
            init_method=f"tcp://{addr}:{port}",
            rank=world.Get_rank(),
            world_size=world.Get_size(),
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )
        for impl in impls:
            impl.make_groups(groups, world.Get_rank())
        for impl in impls:
            impl.started()

    def close(self):
        try:
            if self.dist.is_initialized():
                self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass


class TorchImpl(Impl):
    """torch.distributed with the gloo backend, on one group of the same ranks per group of
    every axis (made by TorchSession). Buffers are torch views of the same numpy arrays."""

    library = "torch"
    label = "torch"
    algorithm = "torch-gloo"
    api = "torch"
    backend = "gloo"

    def __init__(self, session: TorchSession):
        self.session = session
        self.torch, self.dist, self.grid = session.torch, session.dist, session.grid
        self.groups: dict = {}  # axis mask -> this rank's group
        self.axis_names: dict = {}  # axis mask -> its name
        self.roots = session.roots
        self.version = session.version
        self.ops = session.ops
        self.latency_s = 0.0  # one small gloo all_reduce (started)

    @property
    def master(self) -> str:
        return self.session.master

    def make_groups(self, groups: list, me: int) -> None:
        """Collective over the world: every rank calls new_group for every group, in one
        order (`groups`: (axis, my ranks, every group's ranks) per axis)."""
        for axis, _mine, every in groups:
            self.axis_names[axis.mask] = axis.name
            for ranks in every:
                pg = self._new_group(ranks)
                if me in ranks:
                    self.groups[axis.mask] = pg

    def _new_group(self, ranks: tuple):
        backend = None if self.session.default == self.backend else self.backend
        return self.dist.new_group(list(ranks), backend=backend)

    def started(self) -> None:
        """After every group exists (collective over the world): gloo's small-call price."""
        self.latency_s = max(self._small_call_seconds(pg) for pg in self.groups.values())

    def _small_call_seconds(self, group, calls: int = 8) -> float:
        """The median time of an 8-byte all_reduce on this rank's group of an axis, every group
        at once as in the sweep (after 2 untimed calls): what one gloo call costs at least,
        for the header's estimate (runner.py), which fourd's cost model cannot price. On the
        2-core VM the world's one group timed 0.8 ms and the sweep's groups, two at once,
        ran 5.7 ms (the median of their cells' medians). Collective over the world."""
        t = self.torch.zeros(2, dtype=self.torch.float32)
        times = []
        for i in range(calls + 2):
            t0 = time.perf_counter()
            self.dist.all_reduce(t, group=group)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    def doc(self) -> dict:
        """The JSON "baselines" entry."""
        return {
            "available": True,
            "version": self.version,
            "backend": self.backend,
            "default_group": self.session.default,
            "store": self.master,
            "latency_s": self.latency_s,
            "how": f"torch.distributed {' / '.join(c.torch_name for c in TABLE.values())} on "
            "new_group of the same ranks (gloo)",
        }

    def group_rank(self, axis) -> int:
        return self.dist.get_rank(self.groups[axis.mask])

    def root_group_rank(self, axis) -> int:
        return self.dist.get_group_rank(self.groups[axis.mask], self.roots[axis.mask])

    def unsupported(self, collective, dtype, op, in_place):
        why = super().unsupported(collective, dtype, op, in_place)
        if why is not None:
            return why
        if op == "avg" and (self.ops["avg"] is None or dtype not in _C.FLOATING_DTYPES):
            return "gloo has no average for this type"
        return None

    def make_call(self, axis, bufs, in_place, op):
        pg = self.groups[axis.mask]
        coll = bufs.coll
        inp, res = coll.views(bufs, in_place, self.dist.get_rank(pg))
        args = TorchArgs(
            self.dist,
            pg,
            self.ops[op] if coll.reduces else None,
            self.roots[axis.mask],
            self.session.all_gather,
            self.session.reduce_scatter,
        )
        return (
            coll.torch(args, self._tensor(inp, bufs.dtype), self._tensor(res, bufs.dtype)),
            inp,
            res,
        )

    def _tensor(self, arr: np.ndarray, dtype: str):
        """A torch tensor sharing `arr`'s memory (bfloat16 reinterpreted from its bits)."""
        t = self.torch.from_numpy(arr)
        return t if arr.dtype.name == dtype else t.view(getattr(self.torch, dtype))


class TorchFourdImpl(TorchImpl):
    """torch.distributed on fourd's own backend (fourd.distributed, imported before the
    session starts): the same torch calls as the gloo baseline, on new_group of the axis's
    world ranks in fourd's group order (sort_ranks=False), which the backend maps onto the
    grid's own communicator of the axis. Its cells run fourd's auto under torch's API; the
    rows' ratio_vs_fourd is their time over direct auto's (runner.py)."""

    library = "torch-fourd"
    label = "torch-fourd"
    algorithm = "torch-fourd"
    backend = "fourd"

    def __init__(self, session: TorchSession):
        super().__init__(session)
        self.mapped: dict = {}  # axis name -> communicator names (communicators())

    def _new_group(self, ranks: tuple):
        backend = None if self.session.default == self.backend else self.backend
        return self.dist.new_group(list(ranks), backend=backend, sort_ranks=False)

    def started(self) -> None:
        """After every group exists (on every rank): which fourd communicator the backend
        gave each axis's group. Nothing to price: its calls are fourd's, priced by fourd's
        cost model."""
        for mask, pg in self.groups.items():
            name = self.axis_names[mask]
            self.mapped[name] = {
                "torch_group": pg.fourd_axis.name,
                "grid_axis": self.grid.communicator(_C.mask_name(mask)).name,
                "direct": self.grid.communicator(name).name,
            }

    def communicators(self) -> dict:
        """axis name -> the names of the fourd communicator the backend gave the axis's group
        ("torch_group"), of the grid's own communicator of the axis's mask ("grid_axis": the
        same when the backend mapped the group onto it), and of the one fourd's own cells use
        ("direct": the axis as the bench names it, so world is the grid's world communicator,
        the same ranks as the combination of its axes of more than one rank)."""
        return {a: dict(c) for a, c in self.mapped.items()}

    def tuned_axis(self, axis):
        return self.groups[axis.mask].fourd_axis

    def unsupported(self, collective, dtype, op, in_place):
        # fourd's backend averages floating types (the sweep skips avg on integers).
        return Impl.unsupported(self, collective, dtype, op, in_place)

    def doc(self) -> dict:
        comms = self.communicators()
        return {
            "available": True,
            "version": self.version,
            "backend": self.backend,
            "default_group": self.session.default,
            "store": self.master,
            "communicators": {a: c["torch_group"] for a, c in comms.items()},
            "grid_communicators": all(c["torch_group"] == c["grid_axis"] for c in comms.values()),
            "direct_communicators": {a: c["direct"] for a, c in comms.items()},
            "how": f"torch.distributed {' / '.join(c.torch_name for c in TABLE.values())} on "
            "new_group of the same ranks in fourd's group order, backend fourd "
            "(fourd.distributed): fourd's auto on the group's fourd communicator",
        }


def quiet_torch_warnings():
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed.*")
