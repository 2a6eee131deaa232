"""The three things a row can time: fourd (one per algorithm), MPI through mpi4py, and
torch.distributed (gloo), each on a group of exactly the same ranks.

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
import warnings

import numpy as np

from .options import FLOATING

OPS_MPI = ("sum", "prod", "min", "max")


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
    implementation and carved from arenas that live for the whole run. Storage is numpy;
    bfloat16 is stored as its uint16 bit pattern. Contents are whatever the previous row left;
    the check fills what it compares."""

    @staticmethod
    def reserve(nbytes: int) -> None:
        """Makes both arenas at least `nbytes` long, every page written."""
        for which in ("send", "recv"):
            if _ARENA[which].nbytes < nbytes:
                _ARENA[which] = np.zeros(0, np.uint8)  # release the old one first
                a = np.empty(nbytes, np.uint8)
                a.fill(0)  # fault every page now, not in a timed cell
                _ARENA[which] = a

    def __init__(self, collective: str, dtype: str, count: int, p: int, storage):
        self.collective, self.dtype, self.count, self.p = collective, dtype, count, p
        self.block = count // p if collective in ("all_gather", "reduce_scatter") else count
        if collective == "all_gather":
            self.send = _carve("send", self.block, storage)
            self.recv = _carve("recv", count, storage)
        elif collective == "reduce_scatter":
            self.send = _carve("send", count, storage)
            self.recv = _carve("recv", self.block, storage)
        elif collective == "all_reduce":
            self.send = _carve("send", count, storage)
            self.recv = _carve("recv", count, storage)
        else:  # broadcast: one buffer
            self.send = None
            self.recv = _carve("recv", count, storage)
        self._torch = {}

    def zero(self) -> None:
        """Zeros both arrays (rows without the check: no stale bit patterns, such as another
        dtype's, that would read as denormals or NaNs)."""
        for a in (self.send, self.recv):
            if a is not None:
                a.fill(0)

    def torch_view(self, arr: np.ndarray):
        """A torch tensor sharing `arr`'s memory (bfloat16 reinterpreted from its bits)."""
        import torch

        t = torch.from_numpy(arr)
        if self.dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t


class Impl:
    library = ""
    label = ""
    algorithm = ""

    def group_rank(self, axis) -> int:
        raise NotImplementedError

    def root_group_rank(self, axis) -> int:
        return 0

    def unsupported(self, collective, dtype, op, in_place) -> str | None:
        return None

    def make_call(self, axis, bufs: Buffers, in_place: bool, op):
        """(call, input_view, result_view): `call()` runs the collective once; input_view is the
        array the check fills; result_view the array the check compares."""
        raise NotImplementedError


def _views(bufs: Buffers, in_place: bool, g: int):
    """nccl-tests placement: in-place all-gather sends from block g of the output, in-place
    reduce-scatter leaves the result in block g of the input."""
    c = bufs.collective
    b = bufs.block
    if c == "all_reduce":
        return (bufs.recv, bufs.recv) if in_place else (bufs.send, bufs.recv)
    if c == "all_gather":
        return (bufs.recv[g * b:(g + 1) * b], bufs.recv) if in_place else (bufs.send, bufs.recv)
    if c == "reduce_scatter":
        return (bufs.send, bufs.send[g * b:(g + 1) * b]) if in_place else (bufs.send, bufs.recv)
    return bufs.recv, bufs.recv


class FourdImpl(Impl):
    library = "fourd"

    def __init__(self, grid, algorithm: str, timeout):
        self.grid, self.algorithm, self.timeout = grid, algorithm, timeout
        self.label = algorithm

    def group_rank(self, axis) -> int:
        return self.grid.rank(axis.name)

    def unsupported(self, collective, dtype, op, in_place):
        if collective == "broadcast" and self.algorithm != "auto":
            return "fourd.broadcast takes no algorithm argument (only auto is measured)"
        if collective == "broadcast" and not in_place:
            return "fourd.broadcast works on one buffer (in place)"
        return None

    def _obj(self, arr, bufs):
        return bufs.torch_view(arr) if bufs.dtype == "bfloat16" else arr

    def make_call(self, axis, bufs, in_place, op):
        import fourd

        g = self.group_rank(axis)
        inp, res = _views(bufs, in_place, g)
        a, grid, t, name = self.algorithm, self.grid, self.timeout, axis.name
        c = bufs.collective
        if c == "all_reduce" and not in_place:
            # Separate send and receive buffers: what out-of-place means in nccl-tests.
            i, o = self._obj(inp, bufs), self._obj(res, bufs)

            def call():
                fourd.all_reduce(i, name, op, output=o, grid=grid, algorithm=a, timeout=t)
        elif c == "all_reduce":
            obj = self._obj(res, bufs)

            def call():
                fourd.all_reduce(obj, name, op, grid=grid, algorithm=a, timeout=t)
        elif c == "all_gather":
            o, i = self._obj(res, bufs), self._obj(inp, bufs)

            def call():
                fourd.all_gather(o, i, name, grid=grid, algorithm=a, timeout=t)
        elif c == "reduce_scatter":
            o, i = self._obj(res, bufs), self._obj(inp, bufs)

            def call():
                fourd.reduce_scatter(o, i, name, op, grid=grid, algorithm=a, timeout=t)
        else:
            obj = self._obj(res, bufs)

            def call():
                fourd.broadcast(obj, 0, name, grid=grid, timeout=t)
        return call, inp, res


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
            "float32": MPI.FLOAT, "float64": MPI.DOUBLE,
            "float16": getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL),
            "bfloat16": getattr(MPI, "BFLOAT16_T", MPI.DATATYPE_NULL),
            "int8": MPI.INT8_T, "uint8": MPI.UINT8_T, "int32": MPI.INT32_T, "int64": MPI.INT64_T,
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
        if collective == "broadcast" and not in_place:
            return "broadcast is measured in place only"
        if op == "avg":
            return "MPI has no average reduction"
        if self.types[dtype] == self.MPI.DATATYPE_NULL:
            return f"this MPI library has no {dtype} datatype"
        return None

    def make_call(self, axis, bufs, in_place, op):
        MPI = self.MPI
        comm = self.comms[axis.mask]
        T = self.types[bufs.dtype]
        c = bufs.collective
        g = comm.Get_rank()
        if c == "all_reduce":
            mop = self.ops[op]
            if in_place:
                rb = [bufs.recv, T]
                return (lambda: comm.Allreduce(MPI.IN_PLACE, rb, mop)), bufs.recv, bufs.recv
            sb, rb = [bufs.send, T], [bufs.recv, T]
            return (lambda: comm.Allreduce(sb, rb, mop)), bufs.send, bufs.recv
        if c == "all_gather":
            rb = [bufs.recv, T]
            if in_place:
                inp = bufs.recv[g * bufs.block:(g + 1) * bufs.block]
                return (lambda: comm.Allgather(MPI.IN_PLACE, rb)), inp, bufs.recv
            sb = [bufs.send, T]
            return (lambda: comm.Allgather(sb, rb)), bufs.send, bufs.recv
        if c == "reduce_scatter":
            mop = self.ops[op]
            if in_place:
                # MPI's in-place form leaves the result at the start of the buffer.
                sb = [bufs.send, T]
                return ((lambda: comm.Reduce_scatter_block(MPI.IN_PLACE, sb, mop)), bufs.send,
                        bufs.send[:bufs.block])
            sb, rb = [bufs.send, T], [bufs.recv, T]
            return (lambda: comm.Reduce_scatter_block(sb, rb, mop)), bufs.send, bufs.recv
        b = [bufs.recv, T]
        return (lambda: comm.Bcast(b, root=0)), bufs.recv, bufs.recv


class TorchImpl(Impl):
    """torch.distributed with the gloo backend, initialised from MPI (rank 0 picks a free port
    and broadcasts it), with one new_group per group of every axis, made by every rank in the
    same order. Buffers are torch views of the same numpy arrays."""

    library = "torch"
    label = "torch"
    algorithm = "torch-gloo"

    def __init__(self, grid, timeout_s: float):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.grid = torch, dist, grid
        self.timeout_s = timeout_s
        self.groups: dict = {}
        self.roots: dict = {}
        self.version = torch.__version__
        self.master = ""
        torch.set_num_threads(1)  # ranks already share the cores; no intra-op threads
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
                    "avg": getattr(dist.ReduceOp, "AVG", None)}
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

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

    def setup(self, world, hosts, axes):
        """Collective over the world. Raises on failure (the caller agrees on the outcome)."""
        dist = self.dist
        # All MPI communication first, so that a torch failure on one rank cannot leave the
        # ranks in different MPI calls; after this point only torch waits (with its timeout).
        groups = []
        for axis in axes:
            mine = tuple(self.grid.ranks(axis.name))
            groups.append((axis, mine, sorted(set(world.allgather(mine)))))
        addr, port = self.rendezvous(world, hosts)
        if not port:
            raise RuntimeError(f"rank 0 could not open a port on {addr} for torch.distributed")
        self.master = f"{addr}:{port}"
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{port}", rank=world.Get_rank(),
            world_size=world.Get_size(), timeout=datetime.timedelta(seconds=self.timeout_s))
        me = world.Get_rank()
        for axis, mine, every in groups:
            for ranks in every:  # every rank calls new_group for every group, in one order
                pg = dist.new_group(list(ranks))
                if me in ranks:
                    self.groups[axis.mask] = pg
            self.roots[axis.mask] = mine[0]  # fourd's and MPI's group rank 0

    def close(self):
        try:
            if self.dist.is_initialized():
                self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass

    def group_rank(self, axis) -> int:
        return self.dist.get_rank(self.groups[axis.mask])

    def root_group_rank(self, axis) -> int:
        return self.dist.get_group_rank(self.groups[axis.mask], self.roots[axis.mask])

    def unsupported(self, collective, dtype, op, in_place):
        if collective in ("all_reduce", "broadcast") and not in_place:
            return f"torch.distributed.{collective} works in place only"
        if op == "avg" and (self.ops["avg"] is None or dtype not in FLOATING):
            return "gloo has no average for this type"
        return None

    def make_call(self, axis, bufs, in_place, op):
        dist = self.dist
        pg = self.groups[axis.mask]
        g = dist.get_rank(pg)
        inp, res = _views(bufs, in_place, g)
        ti, tr = bufs.torch_view(inp), bufs.torch_view(res)
        c = bufs.collective
        if c == "all_reduce":
            top = self.ops[op]
            return (lambda: dist.all_reduce(tr, op=top, group=pg)), inp, res
        if c == "all_gather":
            ag = self._ag
            return (lambda: ag(tr, ti, group=pg)), inp, res
        if c == "reduce_scatter":
            rs, top = self._rs, self.ops[op]
            return (lambda: rs(tr, ti, op=top, group=pg)), inp, res
        root = self.roots[axis.mask]
        return (lambda: dist.broadcast(tr, src=root, group=pg)), res, res


def quiet_torch_warnings():
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed.*")
