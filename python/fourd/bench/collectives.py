"""The collectives the benchmark measures: one entry per collective, as nccl-tests has one
struct per collective (its getCollByteCount, getBw, initData/check and runColl).

An entry holds everything that differs from one collective to the next:

  * the element counts: the input and output arrays for a size S of `count` elements on a
    group of p ranks, and where the input and the result sit in the one buffer of the
    in-place form (nccl-tests' in-place offsets);
  * the bus-bandwidth factor, busbw = algbw x factor(p), which is also the share of S that
    every node (or rank) must move in the physical bound (bounds.py);
  * the oracle: what group rank g's input holds and what its result must be, from check.py's
    closed forms, and whether the result array is cleared before the checked call;
  * the call of each library on those arrays: fourd's public API, MPI through mpi4py and
    torch.distributed, and the placements a library lacks, with the reason a note prints.

Adding a collective means adding one entry to TABLE. Its names are fourd's own
(fourd._C.COLLECTIVES); an entry whose name fourd does not know fails at import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

import fourd
from fourd import _C

from . import check


@dataclass(frozen=True)
class Collective:
    """One collective as the benchmark measures it (see the module docstring)."""

    name: str
    reduces: bool  # takes an op (and a row per op); the others run with op "none"
    blocked: bool  # S is p blocks, one per rank: counts are rounded down to a multiple of p
    factor_text: str  # the bus factor as the table header prints it
    bus: Callable[[int], float]  # the bus factor for a group of n > 1 ranks
    counts: Callable[[int, int], tuple[int, int]]  # (count, p) -> (input, output) elements;
    #                                                 input 0: one buffer, no input array
    source: Callable  # (op, dtype, p, g, root, n) -> group rank g's n input values (float64)
    expected: Callable  # (op, dtype, p, g, count, block) -> g's result values (float64)
    clear_result: Callable[[bool], bool]  # in_place -> zero the result array before the check
    fourd: Callable  # (grid, axis, op, algorithm, timeout, inp, res, in_place) -> call()
    mpi: Callable  # (MpiArgs, inp, res, in_place) -> call()
    torch: Callable  # (TorchArgs, ti, tr) -> call()
    # In place, the one buffer is the output ("recv") or the input ("send"), whichever holds
    # all of S; the input, or the result, is then block g of it where these say so.
    in_place_buffer: str = "recv"
    in_place_input_is_block: bool = False
    in_place_result_is_block: bool = False
    mpi_in_place_result_first: bool = False  # MPI's in-place form leaves the result at block 0
    takes_algorithm: bool = True  # fourd's call takes an algorithm argument
    # library -> why it has no out-of-place form (a note prints it; the cell shows n/a)
    in_place_only: Mapping[str, str] = field(default_factory=dict)
    in_default_sweep: bool = True  # measured when --collective is not given
    mpi_name: str = ""  # the MPI function (the JSON's description of the baseline)
    torch_name: str = ""  # the torch.distributed function

    def bus_factor(self, n: int) -> float:
        return self.bus(n) if n > 1 else 0.0

    def views(self, bufs, in_place: bool, g: int):
        """(input, result) arrays of group rank g for one placement (nccl-tests placement)."""
        if bufs.send is None:
            return bufs.recv, bufs.recv
        if not in_place:
            return bufs.send, bufs.recv
        whole = bufs.send if self.in_place_buffer == "send" else bufs.recv
        block = whole[g * bufs.block : (g + 1) * bufs.block]
        return (
            block if self.in_place_input_is_block else whole,
            block if self.in_place_result_is_block else whole,
        )

    @property
    def whole_buffer_in_place(self) -> bool:
        """In place, input and result are the same whole buffer (one buffer, no block)."""
        return not (self.in_place_input_is_block or self.in_place_result_is_block)


@dataclass(frozen=True)
class MpiArgs:
    """What an MPI call needs besides its arrays."""

    MPI: object  # the mpi4py.MPI module
    comm: object  # the group's communicator
    dtype: object  # the MPI datatype of the row
    op: object  # the MPI reduction (None for a collective without one)


@dataclass(frozen=True)
class TorchArgs:
    """What a torch.distributed call needs besides its tensors."""

    dist: object  # torch.distributed
    group: object  # the group's process group
    op: object  # the ReduceOp (None for a collective without one)
    root: int  # the world rank of the group's root (broadcast)
    all_gather: Callable  # all_gather_single, or all_gather_into_tensor
    reduce_scatter: Callable  # reduce_scatter_single, or reduce_scatter_tensor


# ---- the oracle (check.py's closed forms) ------------------------------------------------------


def _reduce_source(op, dtype, p, g, root, n):
    return check.reduce_input(op, dtype, p, g, n)


def _gather_source(op, dtype, p, g, root, n):
    return check.gather_input(g, n)


def _broadcast_source(op, dtype, p, g, root, n):
    return check.gather_input(0, n) if g == root else np.zeros(n)


def _all_reduce_expected(op, dtype, p, g, count, block):
    return check.reduced(op, dtype, p, 0, count)


def _reduce_scatter_expected(op, dtype, p, g, count, block):
    return check.reduced(op, dtype, p, g * block, block)


def _all_gather_expected(op, dtype, p, g, count, block):
    return check.gathered(p, block)


def _broadcast_expected(op, dtype, p, g, count, block):
    return check.gather_input(0, count)


# ---- fourd (the public API) --------------------------------------------------------------------
# Each returns a closure over plain locals: it is the call the timed loop makes.


def _fourd_all_reduce(grid, axis, op, algorithm, timeout, inp, res, in_place):
    if in_place:

        def call():
            fourd.all_reduce(res, axis, op, grid=grid, algorithm=algorithm, timeout=timeout)
    else:
        # Separate send and receive buffers: what out-of-place means in nccl-tests.
        def call():
            fourd.all_reduce(
                inp, axis, op, output=res, grid=grid, algorithm=algorithm, timeout=timeout
            )

    return call


def _fourd_all_gather(grid, axis, op, algorithm, timeout, inp, res, in_place):
    def call():
        fourd.all_gather(res, inp, axis, grid=grid, algorithm=algorithm, timeout=timeout)

    return call


def _fourd_reduce_scatter(grid, axis, op, algorithm, timeout, inp, res, in_place):
    def call():
        fourd.reduce_scatter(res, inp, axis, op, grid=grid, algorithm=algorithm, timeout=timeout)

    return call


def _fourd_broadcast(grid, axis, op, algorithm, timeout, inp, res, in_place):
    def call():
        fourd.broadcast(res, 0, axis, grid=grid, timeout=timeout)

    return call


# ---- MPI through mpi4py ------------------------------------------------------------------------


def _mpi_all_reduce(a: MpiArgs, inp, res, in_place):
    comm, mop = a.comm, a.op
    if in_place:
        rb, ip = [res, a.dtype], a.MPI.IN_PLACE
        return lambda: comm.Allreduce(ip, rb, mop)
    sb, rb = [inp, a.dtype], [res, a.dtype]
    return lambda: comm.Allreduce(sb, rb, mop)


def _mpi_all_gather(a: MpiArgs, inp, res, in_place):
    comm, rb = a.comm, [res, a.dtype]
    if in_place:
        ip = a.MPI.IN_PLACE
        return lambda: comm.Allgather(ip, rb)
    sb = [inp, a.dtype]
    return lambda: comm.Allgather(sb, rb)


def _mpi_reduce_scatter(a: MpiArgs, inp, res, in_place):
    comm, mop, sb = a.comm, a.op, [inp, a.dtype]
    if in_place:
        ip = a.MPI.IN_PLACE
        return lambda: comm.Reduce_scatter_block(ip, sb, mop)
    rb = [res, a.dtype]
    return lambda: comm.Reduce_scatter_block(sb, rb, mop)


def _mpi_broadcast(a: MpiArgs, inp, res, in_place):
    comm, b = a.comm, [res, a.dtype]
    return lambda: comm.Bcast(b, root=0)


# ---- torch.distributed -------------------------------------------------------------------------


def _torch_all_reduce(a: TorchArgs, ti, tr):
    dist, pg, top = a.dist, a.group, a.op
    return lambda: dist.all_reduce(tr, op=top, group=pg)


def _torch_all_gather(a: TorchArgs, ti, tr):
    ag, pg = a.all_gather, a.group
    return lambda: ag(tr, ti, group=pg)


def _torch_reduce_scatter(a: TorchArgs, ti, tr):
    rs, pg, top = a.reduce_scatter, a.group, a.op
    return lambda: rs(tr, ti, op=top, group=pg)


def _torch_broadcast(a: TorchArgs, ti, tr):
    dist, pg, root = a.dist, a.group, a.root
    return lambda: dist.broadcast(tr, src=root, group=pg)


# ---- the table ---------------------------------------------------------------------------------

_ENTRIES = (
    Collective(
        name="all_reduce",
        mpi_name="MPI_Allreduce",
        torch_name="all_reduce",
        reduces=True,
        blocked=False,
        factor_text="2(n-1)/n",
        bus=lambda n: 2.0 * (n - 1) / n,
        counts=lambda count, p: (count, count),
        source=_reduce_source,
        expected=_all_reduce_expected,
        clear_result=lambda in_place: not in_place,
        fourd=_fourd_all_reduce,
        mpi=_mpi_all_reduce,
        torch=_torch_all_reduce,
        in_place_only={"torch": "torch.distributed.all_reduce works in place only"},
    ),
    Collective(
        name="all_gather",
        mpi_name="MPI_Allgather",
        torch_name="all_gather_single",
        reduces=False,
        blocked=True,
        factor_text="(n-1)/n",
        bus=lambda n: (n - 1) / n,
        counts=lambda count, p: (count // p, count),
        source=_gather_source,
        expected=_all_gather_expected,
        clear_result=lambda in_place: True,
        fourd=_fourd_all_gather,
        mpi=_mpi_all_gather,
        torch=_torch_all_gather,
        in_place_input_is_block=True,
    ),
    Collective(
        name="reduce_scatter",
        mpi_name="MPI_Reduce_scatter_block",
        torch_name="reduce_scatter_single",
        reduces=True,
        blocked=True,
        factor_text="(n-1)/n",
        bus=lambda n: (n - 1) / n,
        counts=lambda count, p: (count, count // p),
        source=_reduce_source,
        expected=_reduce_scatter_expected,
        clear_result=lambda in_place: not in_place,
        fourd=_fourd_reduce_scatter,
        mpi=_mpi_reduce_scatter,
        torch=_torch_reduce_scatter,
        in_place_buffer="send",
        in_place_result_is_block=True,
        mpi_in_place_result_first=True,
    ),
    Collective(
        name="broadcast",
        mpi_name="MPI_Bcast",
        torch_name="broadcast",
        reduces=False,
        blocked=False,
        factor_text="1",
        bus=lambda n: 1.0,
        counts=lambda count, p: (0, count),
        source=_broadcast_source,
        expected=_broadcast_expected,
        clear_result=lambda in_place: False,
        fourd=_fourd_broadcast,
        mpi=_mpi_broadcast,
        torch=_torch_broadcast,
        takes_algorithm=False,
        in_default_sweep=False,
        in_place_only={
            "fourd": "fourd.broadcast works on one buffer (in place)",
            "mpi": "broadcast is measured in place only",
            "torch": "torch.distributed.broadcast works in place only",
        },
    ),
)

_unknown = [c.name for c in _ENTRIES if c.name not in _C.COLLECTIVES]
if _unknown:
    raise ImportError(
        f"fourd.bench: the collective table names {_unknown}, which fourd does not "
        f"know (fourd._C.COLLECTIVES = {_C.COLLECTIVES})"
    )

# In fourd's order; a collective of fourd's without an entry is not measured.
TABLE: dict[str, Collective] = {
    name: c for name in _C.COLLECTIVES for c in _ENTRIES if c.name == name
}
DEFAULT_COLLECTIVES = tuple(name for name, c in TABLE.items() if c.in_default_sweep)
