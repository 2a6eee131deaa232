"""The torch.distributed backend "fourd": fourd's collectives under DDP, FSDP2, DeviceMesh,
DTensor and any other code that calls torch.distributed.

    import fourd.distributed                       # registers the backend "fourd"
    torch.distributed.init_process_group("fourd")  # under mpiexec: ranks and store from MPI

What runs where (docs/torch.md is the user's guide):

- all_reduce, all_gather (list, into one tensor, coalesced), reduce_scatter (list, one tensor,
  coalesced), broadcast, reduce and barrier run on fourd's algorithms over the group's fourd
  communicator, ``Grid.group(ranks)`` of the backend's grid: the grid's own axis communicator
  when the ranks form an axis (or a combination of axes), else one of its own with its
  topology, so ``auto`` and ``hierarchical`` work on every group;
- send/recv (and batch_isend_irecv over them), gather, scatter, all_to_all, all_to_all_single
  and all_gather of uneven sizes go to the MPI library (mpi4py) on a duplicate of that
  communicator, as non-blocking calls completed by polling against the group's deadline.

Every wait has the group's deadline (``init_process_group(timeout=)``, ``new_group(timeout=)``);
a failure (deadline, poisoned group, MPI error, ranks that disagree) raises
:class:`DistBackendError`, a ``torch.distributed.DistBackendError`` with fourd's message.

The backend's grid is the current fourd grid when it spans torch's world in torch's rank order
(``fourd.init`` before ``init_process_group``), else one made here with ``x`` = the world size
and ended with the default group (``destroy_process_group``).

Under ``mpiexec`` the default ``env://`` rendezvous needs no MASTER_ADDR/MASTER_PORT once this
module is imported: rank and world size come from MPI.COMM_WORLD and rank 0 opens torch's
TCPStore on a free port, announced over MPI (``init_method="fourd://"`` names that rendezvous
explicitly).
"""

from __future__ import annotations

import atexit
import datetime
import functools
import importlib
import json
import os
import socket
import threading
import time
import urllib.parse

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C import _distributed_c10d as _c10d

from . import _C, _tensor
from . import grid as _grid
from ._torch_group import _listening_store
from .errors import (
    AbortedError,
    BackendError,
    Error,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    TimeoutError,
)

__all__ = ["DistBackendError", "ProcessGroup", "Work"]

# The module (torch.distributed.rendezvous is also the name of its function).
_rendezvous = importlib.import_module("torch.distributed.rendezvous")

BACKEND = "fourd"


class DistBackendError(dist.DistBackendError, Error):
    """An operation of backend fourd failed: its deadline passed, its group was poisoned by an
    earlier failure, the MPI library failed, or (FOURD_DEBUG=1) the ranks made different calls.
    Both torch's ``DistBackendError`` (what torch's own backends raise) and a ``fourd.Error``;
    the message is fourd's (operation, group, ranks, sequence number), the fourd error is its
    ``__cause__``."""


# fourd's errors of a failed operation; argument errors (ValueError, TypeError) pass unchanged.
_FAILURES = (TimeoutError, AbortedError, BackendError, MismatchError, MPI.Exception)


def _failure(e: BaseException) -> BaseException:
    """The exception a torch caller sees for `e`."""
    if isinstance(e, _FAILURES) and not isinstance(e, DistBackendError):
        err = DistBackendError(f"fourd: MPI error: {e}" if isinstance(e, MPI.Exception) else str(e))
        err.__cause__ = e
        return err
    return e


def _translated(method):
    """A ProcessGroup method whose fourd failures reach torch as DistBackendError."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except _FAILURES as e:
            raise _failure(e) from e

    return call


# Objects an MPI operation that failed may still write or read: the MPI library cannot cancel
# a started collective, so they stay alive for the rest of the process (as fourd's own).
_QUARANTINE: list = []


# ---- tensors, ops ----------------------------------------------------------------------------

# torch dtypes fourd computes on; the others travel as bytes where nothing is reduced.
_FOURD_DTYPES = frozenset(getattr(torch, n) for n in _tensor.CODES if hasattr(torch, n))
_OPS: dict = {}  # torch's RedOpType -> fourd's op name


def _op(reduce_op) -> str:
    """fourd's name of a torch ReduceOp (or RedOpType)."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = _OPS.get(kind)
    if name is None:
        label = getattr(kind, "name", str(kind))
        try:
            name = _C.OPS[_C.parse_op(label, "op")]
        except InvalidArgumentError:
            raise InvalidArgumentError(
                f"op: backend fourd reduces with {', '.join(_C.OPS)} (avg on floating types); "
                f"found ReduceOp.{label}"
            ) from None
        _OPS[kind] = name
    return name


# The hot paths' collectives (_C.TorchCalls.learn's kind).
_HOT_ALL_REDUCE, _HOT_ALL_GATHER, _HOT_REDUCE_SCATTER = 0, 1, 2


def _hot_calls(axis, timeout: float):
    """The native hot paths of a group's blocking all_reduce, all_gather_into_tensor and
    reduce_scatter_tensor (auto's algorithm, the group's deadline), taking every torch op
    that fourd has by its RedOpType value."""
    _tensor._torch_module()  # registers torch's tensor type and dtypes with the native side
    ops = {}
    for kind in dist.ReduceOp.RedOpType.__members__.values():
        try:
            code = _C.parse_op(_op(kind), "op")
        except InvalidArgumentError:  # BAND, PREMUL_SUM, ...: the general path says so
            continue
        # The native side reads an op by its hash (torch's ReduceOp hashes to its RedOpType
        # value): an op whose hash is not that is never taken there, so never misread.
        if hash(dist.ReduceOp(kind)) == kind.value:
            ops[kind.value] = code
    return _C.TorchCalls(axis.communicator, _C.parse_algorithm("auto", "algorithm"), timeout, ops)


def _one(tensors, what: str):
    """The one tensor (or list) of torch's list-of-one arguments."""
    if len(tensors) != 1:
        raise InvalidArgumentError(
            f"{what}: backend fourd takes one tensor (one device) per call; found {len(tensors)}"
        )
    return tensors[0]


def _buf(t: torch.Tensor) -> torch.Tensor:
    """`t` as fourd writes it: its data when it requires grad (torch's backends do the same)."""
    return t.detach() if t.requires_grad else t


def _contiguous(t: torch.Tensor, arg: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"{arg}: expected a contiguous tensor, found one with strides {tuple(t.stride())} "
            f"(call .contiguous())"
        )
    return t.detach()


def _movable(t: torch.Tensor, arg: str) -> torch.Tensor:
    """`t` for a collective that moves bytes and reduces nothing: itself, or its bytes when
    fourd has no name for its dtype (bool, int16, complex, float8, ...)."""
    if t.dtype in _FOURD_DTYPES:
        return _buf(t)
    return _contiguous(t, arg).reshape(-1).view(torch.uint8)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _span(t: torch.Tensor, arg: str):
    """An MPI buffer over a contiguous CPU tensor's bytes (no copy)."""
    if not t.is_cpu:
        raise InvalidArgumentError(
            f"{arg}: backend fourd moves this collective's tensors through the MPI library, "
            f"which takes CPU tensors; found one on {t.device}"
        )
    _contiguous(t, arg)
    n = _nbytes(t)
    return MPI.buffer.fromaddress(t.data_ptr(), n) if n else np.empty(0, np.uint8)


def _local_problem(tensors, arg: str) -> str | None:
    """Why the MPI library cannot take these tensors as they are (None when it can)."""
    for t in tensors:
        if not t.is_cpu:
            return (
                f"{arg}: backend fourd moves this collective's tensors through the MPI "
                f"library, which takes CPU tensors; found one on {t.device}"
            )
        if not t.is_contiguous():
            return f"{arg}: expected contiguous tensors, found strides {tuple(t.stride())}"
    return None


def _seconds(timeout) -> float | None:
    """A torch timeout (timedelta or milliseconds) in seconds; None when unset (<= 0)."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout / 1e3
    return s if s > 0 else None


def _quarantine(op) -> None:
    """A failed MPI operation: its requests and buffers stay alive (the library's collective
    cannot be cancelled and writes its output when the late ranks arrive), and each torch
    tensor among its buffers gets fresh storage holding its values, as fourd's own calls do
    (grid._quarantine), so that the caller can reuse its tensors."""
    _QUARANTINE.append(op)
    stack = [op.keep]
    while stack:
        o = stack.pop()
        if isinstance(o, (tuple, list)):
            stack.extend(o)
        elif isinstance(o, torch.Tensor):
            _grid._quarantine(o)


def _mpi_wait(requests, deadline: float, what: str, keep=()) -> None:
    """Completes non-blocking MPI calls by polling until `deadline` (time.monotonic()); on
    expiry raises DistBackendError, keeping `requests` and `keep` alive (the library may still
    write them)."""
    pause = 0.0
    while not MPI.Request.Testall(requests):
        if time.monotonic() >= deadline:
            _QUARANTINE.append((requests, keep))
            raise DistBackendError(
                f"fourd: {what} did not complete by its deadline: not every process of the "
                f"group reached it"
            )
        time.sleep(pause)
        pause = min(pause * 2 + 1e-5, 1e-3)


# ---- Work ------------------------------------------------------------------------------------


class _FourdOp:
    """A fourd asynchronous operation (a native fourd.Work)."""

    __slots__ = ("work",)
    waitable = True  # its wait blocks without the GIL until done

    def __init__(self, work):
        self.work = work

    def progress(self, block: float) -> bool:
        """True once done (raising its error); waits up to `block` seconds (< 0: until done)."""
        w = self.work
        if block < 0 or w.is_completed():
            w.wait()
            return True
        if block == 0:
            return False
        try:
            w.wait(block)
        except TimeoutError:
            if not w.is_completed():  # the slice ended, not the operation
                return False
            w.wait()
        return True


class _MpiOp:
    """Non-blocking MPI calls of one operation on a group's MPI communicator, completed by
    polling (MPI_Testall) against the group's deadline: no call here blocks in MPI."""

    __slots__ = ("pg", "what", "requests", "statuses", "keep", "deadline")
    waitable = False

    def __init__(self, pg, what: str, requests: list, keep, statuses=None):
        self.pg, self.what, self.requests, self.keep = pg, what, requests, keep
        self.statuses = statuses
        self.deadline = time.monotonic() + pg._timeout

    def progress(self, block: float) -> bool:
        end = None if block < 0 else time.monotonic() + block
        pause = 0.0
        while not MPI.Request.Testall(self.requests, self.statuses):
            now = time.monotonic()
            if now >= self.deadline:
                raise self.pg._expired(self)
            if end is not None and now >= end:
                return False
            time.sleep(pause if end is None else min(pause, end - now))
            pause = min(pause * 2 + 1e-5, 1e-3)
        return True


class _Several:
    """The operations of a coalesced call, done when all are."""

    __slots__ = ("works",)
    waitable = False

    def __init__(self, works: list):
        self.works = works

    def progress(self, block: float) -> bool:
        if block < 0:
            for w in self.works:
                w.wait()
            return True
        if not all(w.is_completed() for w in self.works):
            return False
        for w in self.works:
            w.wait()  # re-raises the first error
        return True


class Work(dist.Work):
    """The torch Work of an asynchronous operation of backend fourd.

    ``wait()`` blocks until it is done (re-raising its error); ``is_completed()``,
    ``exception()`` and ``is_success()`` never block; ``get_future()`` is a torch Future
    completed (with ``result()``, the output tensors) in the background, so DDP communication
    hooks can chain on it. Thread-safe: one thread at a time moves the operation on.
    """

    def __init__(self, what: str, pending, result=(), finish=None):
        super().__init__()
        self._what = what
        self._pending = pending
        self._result = list(result)
        self._finish = finish  # copies results out once the operation completed
        self._lock = threading.Lock()
        self._done = False
        self._error = None
        self._future = None
        self._source = -1

    def _advance(self, block: float, wait_for_lock: bool = False) -> bool:
        """Moves the operation on, waiting up to `block` seconds (< 0: until done); True once
        it completed (successfully or with an error, kept for wait() and the future)."""
        if not self._lock.acquire(wait_for_lock):
            return self._done  # another thread moves it on
        try:
            if self._done:
                return True
            try:
                if not self._pending.progress(block):
                    return False
                if self._finish is not None:
                    self._finish()
                self._source = _source_of(self._pending)
            except Exception as e:  # noqa: BLE001 - kept, re-raised by wait() and the future
                self._error = _failure(e)
            self._done = True
            future = self._future
        finally:
            self._lock.release()
        if future is not None:
            self._settle(future)
        return True

    def _settle(self, future) -> None:
        if self._error is not None:
            future.set_exception(self._error)
        else:
            future.set_result(self._result)

    def wait(self, timeout=None) -> bool:
        limit = _seconds(timeout)
        if limit is None:
            self._advance(-1.0, True)
        else:
            end = time.monotonic() + limit
            while not self._advance(min(0.05, max(0.0, end - time.monotonic())), True):
                if time.monotonic() >= end:
                    raise DistBackendError(
                        f"fourd: Work.wait: {self._what} did not complete within {limit} s "
                        f"(it keeps running; wait again, or let the group's deadline end it)"
                    )
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._advance(0.0)

    def is_success(self) -> bool:
        return self._advance(0.0) and self._error is None

    def exception(self):
        self._advance(0.0)
        return self._error

    def result(self) -> list:
        return self._result

    def get_future(self):
        with self._lock:
            if self._future is not None:
                return self._future
            self._future = torch.futures.Future()
            done = self._done
        if done:
            self._settle(self._future)
        else:
            _progress().add(self)
        return self._future

    def _source_rank(self) -> int:
        """The group rank a recv from any source received from (torch's recv asks)."""
        return self._source

    source_rank = _source_rank

    def __repr__(self) -> str:
        state = "completed" if self._done else "running"
        return f"<fourd.distributed.Work {self._what} {state}>"


def _source_of(pending) -> int:
    statuses = getattr(pending, "statuses", None)
    return statuses[0].Get_source() if statuses else -1


class _Progress:
    """One daemon thread that completes the Works nobody waits for: those whose future was
    asked for (DDP hooks chain on it) and MPI operations (MPI progresses them only inside MPI
    calls). fourd operations it waits for natively, without the GIL; MPI ones it polls. It is
    stopped at interpreter exit (_stop_progress), before fourd and mpi4py finalize: a thread
    still polling MPI then would call it during MPI_Finalize."""

    def __init__(self):
        self._cv = threading.Condition()
        self._works: list = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="fourd.distributed", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Ends the thread (within `timeout`: it waits at most 2 ms at a time)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def add(self, work: Work) -> None:
        with self._cv:
            self._works.append(work)
            self._cv.notify()

    def _run(self) -> None:
        pause = 0.0
        while True:
            with self._cv:
                while not self._works and not self._stop:
                    self._cv.wait()
                    pause = 0.0
                if self._stop:
                    return
                works = list(self._works)
            left = [w for w in works if not w._advance(0.0)]
            with self._cv:
                finished = {id(w) for w in works} - {id(w) for w in left}
                self._works = [w for w in self._works if id(w) not in finished]
            if finished:
                pause = 0.0
                continue
            native = [w for w in left if w._pending.waitable]
            began = time.monotonic()
            if native:
                native[0]._advance(0.002)  # returns at once if another thread waits for it
            if time.monotonic() - began < 1e-4:
                time.sleep(pause)
                pause = min(pause * 2 + 2e-5, 1e-3)


_progress_thread: _Progress | None = None
_progress_lock = threading.Lock()


def _progress() -> _Progress:
    global _progress_thread
    with _progress_lock:
        if _progress_thread is None:
            _progress_thread = _Progress()
        return _progress_thread


def _stop_progress() -> None:
    """At exit: registered after fourd's own exit handler, so it runs first."""
    global _progress_thread
    with _progress_lock:
        thread, _progress_thread = _progress_thread, None
    if thread is not None:
        thread.stop(1.0)


atexit.register(_stop_progress)


def _forget_progress_thread() -> None:
    global _progress_thread
    _progress_thread = None  # a child of fork() has no such thread


os.register_at_fork(after_in_child=_forget_progress_thread)


# ---- the world: the fourd grid under the default group ---------------------------------------


class _World:
    """The fourd grid of the default group of backend fourd (set while that group exists)."""

    def __init__(self):
        self.grid = None
        self.owned = False  # made here (x = world size), finalized with the default group

    def open(self, rank: int, size: int, timeout: float):
        deadline = time.monotonic() + timeout
        comm = _torch_ordered_world(rank, size, deadline)
        current = _usable_current_grid()
        if current is not None and current.mpi_comm.Compare(comm) in (MPI.IDENT, MPI.CONGRUENT):
            self.grid, self.owned = current, False
        else:
            self.grid, self.owned = _new_grid(size, comm, timeout, current), True
        return self.grid

    def close(self) -> None:
        grid, owned = self.grid, self.owned
        self.grid, self.owned = None, False
        if grid is not None and owned:
            grid.finalize()

    def subgroup_grid(self):
        if self.grid is None:
            raise InvalidArgumentError(
                "backend: a group of backend fourd needs the default group on backend fourd "
                "(torch.distributed.init_process_group('fourd'), or a device map naming fourd)"
            )
        return self.grid


_WORLD = _World()


def keep_world_grid(grid) -> bool:
    """Whether torch's default group of backend fourd runs on `grid` (it adopted the grid that
    was current at init_process_group). If so, that group takes the grid over: it is finalized
    with the default group (destroy_process_group, or exit), and the caller that built it (such
    as parallel_state.destroy_model_parallel) must not finalize it, or every torch group of
    backend fourd would be left on a finalized grid."""
    if grid is not None and _WORLD.grid is grid:
        _WORLD.owned = True
        return True
    return False


def _torch_ordered_world(rank: int, size: int, deadline: float):
    """MPI.COMM_WORLD's processes in torch's rank order (torch rank r = rank r in the result).
    env:// may number the processes otherwise than MPI; every process must be both."""
    world = MPI.COMM_WORLD
    if world.Get_size() != size:
        raise InvalidArgumentError(
            f"backend fourd: torch's world has {size} processes, MPI's {world.Get_size()}: "
            f"start the job with mpiexec or srun (one MPI process per torch rank)"
        )
    order = np.empty(size, np.int64)
    mine = np.array([rank], np.int64)
    _mpi_wait(
        [world.Iallgather(mine, order)], deadline, "init_process_group: the torch ranks", order
    )
    if sorted(order.tolist()) != list(range(size)):
        raise InvalidArgumentError(
            f"backend fourd: the torch ranks of the MPI processes are {order.tolist()}, not "
            f"0..{size - 1} once each"
        )
    if (order == np.arange(size)).all():
        return world
    return world.Split(0, rank)  # every process is known to be here: this cannot wait long


def _usable_current_grid():
    """The current fourd grid, or None (none, or finalized)."""
    if not _grid.is_initialized():
        return None
    g = _grid.get_grid()
    try:
        g.size()
    except NotInitializedError:
        return None
    return g


def _new_grid(size: int, comm, timeout: float, previous):
    """A grid of x = size over `comm`. A grid that was current before stays current (the
    user's own, for fourd's direct calls); without one, this grid becomes current."""
    return _grid.init(x=size, comm=comm, timeout=timeout, make_current=previous is None)


# ---- the ProcessGroup ------------------------------------------------------------------------

_AR = _c10d.AllreduceOptions()
_ARC = _c10d.AllreduceCoalescedOptions()
_AG = _c10d.AllgatherOptions()
_RS = _c10d.ReduceScatterOptions()
_BC = _c10d.BroadcastOptions()
_RD = _c10d.ReduceOptions()
_BA = _c10d.BarrierOptions()
_GA = _c10d.GatherOptions()
_SC = _c10d.ScatterOptions()
_AA = _c10d.AllToAllOptions()


class ProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup of backend "fourd" over some world ranks, group rank i being the
    i-th of them (torch's ``global_ranks_in_group``).

    ``fourd_axis`` is the group as fourd's own collectives take it (a ``fourd.Subgroup``:
    ``fourd.all_reduce(t, group=pg)`` runs on it). Made by torch through the registered
    backend (``init_process_group``, ``new_group``, DeviceMesh), collectively over the group's
    ranks: its fourd communicator and the MPI duplicate of it for the calls fourd has no
    algorithm for.
    """

    def __init__(self, store, rank: int, size: int, grid, ranks: list, timeout: float):
        # torch 2.13's (store, rank, size) constructor makes no Python subclass: the store is
        # kept here instead (for the backends of a device map).
        super().__init__(rank, size)
        self._grid = grid
        self._ranks = tuple(ranks)
        self._timeout = timeout
        self.fourd_axis = grid.group(list(ranks), timeout)
        self._name = f"'{self.fourd_axis.name}' (world ranks {list(ranks)})"
        self._mpi = _duplicate(self.fourd_axis.communicator.mpi_handle, timeout, self._name)
        if self._mpi.Get_rank() != rank:
            raise InvalidArgumentError(
                f"fourd: group {self._name}: torch's group rank {rank} is rank "
                f"{self._mpi.Get_rank()} of its MPI communicator"
            )
        self._mpi_failure = None  # why the MPI calls of this group are aborted
        # The hot paths of allreduce, all_gather_single and reduce_scatter_single: one native
        # call each for a (collective, dtype, op) that went through fourd's general path once.
        self._native = _hot_calls(self.fourd_axis, timeout)
        self._mpi_seq = 0
        self._store = store
        self._devices: dict = {}  # device type -> torch backend of a device map, or False
        self._coalesced = None  # Works of a start/end_coalescing bracket
        self._is_world = False
        self._group_name = self._group_desc = ""

    def getBackendName(self) -> str:
        return BACKEND

    # torch names a group after making it; a Python ProcessGroup keeps the name itself (torch's
    # own keeps it in its per-device backends, of which this has none).
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return f"fourd.distributed.ProcessGroup({list(self._ranks)}, rank {self.rank()})"

    # ---- plumbing ------------------------------------------------------------------------

    def _work(self, what: str, pending, result, finish=None) -> Work:
        w = Work(what, pending, result, finish)
        if self._coalesced is not None:
            self._coalesced.append(w)
        return w

    def _fourd(self, what: str, call, async_op: bool, result, finish=None):
        """Runs `call(async_op)` (a fourd collective): None when blocking, else a Work."""
        if not async_op:
            call(False)
            if finish is not None:
                finish()
            return None
        return self._work(what, _FourdOp(call(True)), result, finish)

    def _alive(self, what: str) -> None:
        if self._mpi_failure is not None:
            raise DistBackendError(
                f"fourd: {what} on group {self._name}: the group's MPI calls were aborted by "
                f"an earlier failure: {self._mpi_failure}"
            )

    def _mpi_call(self, what: str, start, async_op: bool, result=(), finish=None, status=False):
        """Starts the MPI calls of one operation (`start()` returns (requests, kept objects))
        and completes them: at once when blocking (None), else in a Work."""
        self._alive(what)
        self._mpi_seq += 1
        requests, keep = start()
        statuses = [MPI.Status()] if status else None
        op = _MpiOp(self, f"{what} (MPI call {self._mpi_seq})", requests, keep, statuses)
        if async_op:
            w = self._work(what, op, result, finish)
            _progress().add(w)  # MPI moves it on only inside MPI calls
            return w
        try:
            op.progress(-1.0)
        except BaseException as e:  # a deadline (poisoned in _expired) or Ctrl-C
            _quarantine(op)
            self._mpi_failure = self._mpi_failure or f"{what} was interrupted ({e!r})"
            raise
        if finish is not None:
            finish()
        return None

    def _expired(self, op: _MpiOp) -> DistBackendError:
        msg = (
            f"fourd: {op.what} on group {self._name} timed out after {self._timeout:g} s: "
            f"not every rank of the group took part"
        )
        self._mpi_failure = msg
        _quarantine(op)
        return DistBackendError(msg + "; the group's later MPI calls raise at once")

    def _agree(self, problem: str | None, what: str) -> None:
        """Every rank learns whether any found its arguments invalid, before data moves: each
        raises (its own problem, or which ranks had one), so none is left waiting."""
        flags = np.zeros(self.size(), np.int8)
        mine = np.array([1 if problem else 0], np.int8)
        self._wait([self._mpi.Iallgather(mine, flags)], f"{what}: the argument check", flags)
        if problem:
            raise InvalidArgumentError(f"{what}: {problem}")
        bad = np.flatnonzero(flags).tolist()
        if bad:
            raise InvalidArgumentError(
                f"{what}: group rank(s) {bad} of group {self._name} found their arguments "
                f"invalid (their error says why); nothing was sent"
            )

    def _exchange(self, mine: np.ndarray, what: str, alltoall: bool = False) -> np.ndarray:
        """Every rank's `mine` (an int64 vector), or with `alltoall` element j from rank j."""
        n = self.size()
        got = np.empty(mine.size if alltoall else (n, mine.size), np.int64)
        call = self._mpi.Ialltoall if alltoall else self._mpi.Iallgather
        self._wait([call(mine, got)], f"{what}: the size exchange", (mine, got))
        return got

    def _wait(self, requests: list, what: str, keep) -> None:
        """Completes the MPI calls of an argument check; on expiry the group's MPI calls are
        aborted (the library may still match these)."""
        try:
            _mpi_wait(requests, time.monotonic() + self._timeout, f"{what} on {self._name}", keep)
        except DistBackendError as e:
            self._mpi_failure = str(e)
            raise

    def _route(self, t: torch.Tensor):
        """The torch backend of a device map for `t` (None: fourd's own; CPU is fourd's)."""
        return None if t.is_cpu else self._elsewhere(t)

    def _elsewhere(self, t: torch.Tensor):
        """The torch backend for `t`'s device when a device map names another backend for it
        ("cpu:fourd,cuda:nccl"), else None (fourd's own)."""
        device = t.device.type
        backend = self._devices.get(device)
        if backend is None:
            backend = self._devices[device] = _device_backend(self, device)
        return backend or None

    # ---- fourd's collectives -------------------------------------------------------------

    def allreduce(self, tensors, opts=_AR):
        # The hot path (blocking calls in a loop: Megatron's tensor-parallel all-reduces): a
        # blocking call on one contiguous CPU tensor of a dtype and op that went through once
        # is one native call (_hot_calls), without fourd.all_reduce's resolution.
        t = tensors[0] if len(tensors) == 1 else _one(tensors, "all_reduce")
        try:
            if self._native.all_reduce(t, opts):
                return None
        except _FAILURES as e:
            _grid._quarantine(t)
            raise _failure(e) from e
        if not t.is_cpu and self._elsewhere(t):
            return self._elsewhere(t).allreduce(tensors, opts)
        reduce_op = opts.reduceOp
        op = _OPS.get(reduce_op.op) or _op(reduce_op)
        buf = t.detach() if t.requires_grad else t
        try:
            if not opts.asyncOp:
                self._grid.all_reduce(buf, self.fourd_axis, op, timeout=self._timeout)
                self._native.learn(_HOT_ALL_REDUCE, t.dtype, reduce_op.op.value)
                return None
            w = self._grid.all_reduce(
                buf, self.fourd_axis, op, async_op=True, timeout=self._timeout
            )
        except _FAILURES as e:
            raise _failure(e) from e
        return self._work("all_reduce", _FourdOp(w), tensors)

    @_translated
    def allreduce_coalesced(self, tensors, opts=_ARC):
        if not tensors:
            return self._work("all_reduce_coalesced", _Several([]), [])
        if other := self._route(tensors[0]):
            return other.allreduce_coalesced(tensors, opts)
        op = _op(opts.reduceOp)
        if len({t.dtype for t in tensors}) != 1:  # one flat buffer per call needs one dtype
            works = [self._all_reduce_one(t, op, True) for t in tensors]
            return self._after(works, opts.asyncOp, "all_reduce_coalesced", tensors)
        flat = torch.cat([_buf(t).reshape(-1) for t in tensors])

        def finish():
            at = 0
            for t in tensors:
                _buf(t).copy_(flat[at : at + t.numel()].view(t.shape))
                at += t.numel()

        call = functools.partial(self._grid.all_reduce, flat, self.fourd_axis, op)
        return self._fourd(
            "all_reduce_coalesced",
            lambda a: call(async_op=a, timeout=self._timeout),
            opts.asyncOp,
            tensors,
            finish,
        )

    def _all_reduce_one(self, t, op: str, async_op: bool):
        return self._fourd(
            "all_reduce",
            lambda a: self._grid.all_reduce(
                _buf(t), self.fourd_axis, op, async_op=a, timeout=self._timeout
            ),
            async_op,
            [t],
        )

    def _after(self, works: list, async_op: bool, what: str, result):
        """One Work over `works` (a coalesced call), or None once they are done (blocking)."""
        if not async_op:
            for w in works:
                w.wait()
            return None
        return self._work(what, _Several(works), result)

    def all_gather_single(self, output, input, opts=_AG):
        # The hot path (FSDP's parameter gathers), as allreduce's.
        try:
            if self._native.all_gather(output, input, opts):
                return None
        except _FAILURES as e:
            _grid._quarantine(output, input)
            raise _failure(e) from e
        if other := self._route(input):
            return other._allgather_base(output, input, opts)
        try:
            w = self._fourd(
                "all_gather_into_tensor",
                lambda a: self._grid.all_gather(
                    _movable(output, "output_tensor"),
                    _movable(input, "input_tensor"),
                    self.fourd_axis,
                    async_op=a,
                    timeout=self._timeout,
                ),
                opts.asyncOp,
                [output],
            )
        except _FAILURES as e:
            raise _failure(e) from e
        if not opts.asyncOp:
            self._native.learn(_HOT_ALL_GATHER, input.dtype, 0)
        return w

    @_translated
    def all_gather_single_coalesced(self, outputs, inputs, opts=_AG):
        if len(outputs) != len(inputs):
            raise InvalidArgumentError(
                f"output_tensors: expected one per input ({len(inputs)}), found {len(outputs)}"
            )
        works = [self.all_gather_single(o, i, _async(_AG)) for o, i in zip(outputs, inputs)]
        return self._after(works, opts.asyncOp, "all_gather_into_tensor_coalesced", outputs)

    @_translated
    def allgather(self, output_tensors, input_tensors, opts=_AG):
        outs = _one(output_tensors, "all_gather")
        t = _one(input_tensors, "all_gather")
        if other := self._route(t):
            return other.allgather(output_tensors, input_tensors, opts)
        n = self.size()
        if len(outs) != n:
            raise InvalidArgumentError(
                f"tensor_list: expected {n} tensors (one per rank of the group), found {len(outs)}"
            )
        if any(o.numel() != t.numel() or o.dtype != t.dtype for o in outs):
            return self._gather_uneven(outs, t, opts.asyncOp)
        k = t.numel()
        flat = torch.empty(n * k, dtype=t.dtype)

        def finish():
            for i, o in enumerate(outs):
                _buf(o).copy_(flat[i * k : (i + 1) * k].view(o.shape))

        return self._fourd(
            "all_gather",
            lambda a: self._grid.all_gather(
                _movable(flat, "tensor_list"),
                _movable(t, "tensor"),
                self.fourd_axis,
                async_op=a,
                timeout=self._timeout,
            ),
            opts.asyncOp,
            output_tensors,
            finish,
        )

    @_translated
    def allgather_coalesced(self, output_lists, input_list, opts=_AG):
        works = [self.allgather([o], [i], _async(_AG)) for o, i in zip(output_lists, input_list)]
        return self._after(works, opts.asyncOp, "all_gather_coalesced", output_lists)

    def reduce_scatter_single(self, output, input, opts=_RS):
        # The hot path (FSDP's gradient reductions), as allreduce's.
        try:
            if self._native.reduce_scatter(output, input, opts):
                return None
        except _FAILURES as e:
            _grid._quarantine(output, input)
            raise _failure(e) from e
        reduce_op = opts.reduceOp
        if other := self._route(input):
            return other._reduce_scatter_base(output, input, opts)
        op = _op(reduce_op)
        try:
            w = self._fourd(
                "reduce_scatter_tensor",
                lambda a: self._grid.reduce_scatter(
                    _buf(output),
                    _buf(input),
                    self.fourd_axis,
                    op,
                    async_op=a,
                    timeout=self._timeout,
                ),
                opts.asyncOp,
                [output],
            )
        except _FAILURES as e:
            raise _failure(e) from e
        if not opts.asyncOp:
            self._native.learn(_HOT_REDUCE_SCATTER, input.dtype, reduce_op.op.value)
        return w

    @_translated
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=_RS):
        if len(outputs) != len(inputs):
            raise InvalidArgumentError(
                f"outputs: expected one per input ({len(inputs)}), found {len(outputs)}"
            )
        each = _async(_RS, opts.reduceOp)
        works = [self.reduce_scatter_single(o, i, each) for o, i in zip(outputs, inputs)]
        return self._after(works, opts.asyncOp, "reduce_scatter_tensor_coalesced", outputs)

    @_translated
    def reduce_scatter(self, output_tensors, input_tensors, opts=_RS):
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if other := self._route(out):
            return other.reduce_scatter(output_tensors, input_tensors, opts)
        n, op = self.size(), _op(opts.reduceOp)
        if len(ins) != n:
            raise InvalidArgumentError(
                f"input_list: expected {n} tensors (one per rank of the group), found {len(ins)}"
            )
        if any(i.dtype != out.dtype for i in ins):
            raise InvalidArgumentError(
                f"input_list: expected tensors of the output's dtype {out.dtype}, found "
                f"{sorted({str(i.dtype) for i in ins})}"
            )
        flat = torch.cat([_buf(i).reshape(-1) for i in ins])
        if all(i.numel() == out.numel() for i in ins):
            return self._fourd(
                "reduce_scatter",
                lambda a: self._grid.reduce_scatter(
                    _buf(out), flat, self.fourd_axis, op, async_op=a, timeout=self._timeout
                ),
                opts.asyncOp,
                output_tensors,
            )
        # Blocks of different sizes: reduce them all, keep mine.
        total = torch.empty_like(flat)
        at = sum(i.numel() for i in ins[: self.rank()])
        mine = ins[self.rank()]
        if mine.numel() != out.numel():
            raise InvalidArgumentError(
                f"output: expected {mine.numel()} elements (input_list[{self.rank()}]), found "
                f"{out.numel()}"
            )

        def finish():
            _buf(out).copy_(total[at : at + out.numel()].view(out.shape))

        return self._fourd(
            "reduce_scatter",
            lambda a: self._grid.all_reduce(
                flat, self.fourd_axis, op, output=total, async_op=a, timeout=self._timeout
            ),
            opts.asyncOp,
            output_tensors,
            finish,
        )

    def broadcast(self, tensors, opts=_BC):
        t = _one(tensors, "broadcast")
        if other := self._route(t):
            return other.broadcast(tensors, opts)
        if opts.rootTensor != 0:
            raise InvalidArgumentError(f"rootTensor: expected 0, found {opts.rootTensor}")
        try:
            return self._fourd(
                "broadcast",
                lambda a: self._grid.broadcast(
                    _movable(t, "tensor"),
                    opts.rootRank,
                    self.fourd_axis,
                    async_op=a,
                    timeout=self._timeout,
                ),
                opts.asyncOp,
                tensors,
            )
        except _FAILURES as e:
            raise _failure(e) from e

    @_translated
    def reduce(self, tensors, opts=_RD):
        """An all-reduce whose result only the root keeps (the others' tensors are left
        unchanged): fourd's algorithms, every dtype and op of all_reduce."""
        t = _one(tensors, "reduce")
        if other := self._route(t):
            return other.reduce(tensors, opts)
        op, root = _op(opts.reduceOp), opts.rootRank
        if not 0 <= root < self.size():
            raise InvalidArgumentError(
                f"dst: expected a rank of the group (0..{self.size() - 1}), found {root}"
            )
        out = None if self.rank() == root else torch.empty_like(t)
        return self._fourd(
            "reduce",
            lambda a: self._grid.all_reduce(
                _buf(t), self.fourd_axis, op, output=out, async_op=a, timeout=self._timeout
            ),
            opts.asyncOp,
            tensors,
        )

    @_translated
    def barrier(self, opts=_BA):
        timeout = _seconds(opts.timeout) or self._timeout
        if not opts.asyncOp:
            self._grid.barrier(self.fourd_axis, timeout=timeout)
            return None
        return self._mpi_call("barrier", lambda: ([self._mpi.Ibarrier()], None), True)

    def start_coalescing(self, device) -> None:
        """torch's coalescing bracket: the asynchronous operations until end_coalescing are
        gathered into one Work (each runs as it is called)."""
        self._coalesced = []

    def end_coalescing(self, device) -> Work:
        works, self._coalesced = self._coalesced or [], None
        return Work("coalesced operations", _Several(works), [])

    # ---- through the MPI library ---------------------------------------------------------

    @_translated
    def send(self, tensors, dstRank: int, tag: int):
        t = _one(tensors, "send")
        if other := self._route(t):
            return other.send(tensors, dstRank, tag)
        self._check_peer(dstRank, tag, "dst")
        buf = _span(t, "tensor")
        return self._mpi_call(
            "send", lambda: ([self._mpi.Isend([buf, MPI.BYTE], dstRank, tag)], t), True, tensors
        )

    @_translated
    def recv(self, tensors, srcRank: int, tag: int):
        t = _one(tensors, "recv")
        if other := self._route(t):
            return other.recv(tensors, srcRank, tag)
        self._check_peer(srcRank, tag, "src")
        buf = _span(t, "tensor")
        return self._mpi_call(
            "recv", lambda: ([self._mpi.Irecv([buf, MPI.BYTE], srcRank, tag)], t), True, tensors
        )

    @_translated
    def recv_anysource(self, tensors, tag: int):
        t = _one(tensors, "recv")
        if other := self._route(t):
            return other.recv_anysource(tensors, tag)
        self._check_peer(0, tag, "src")
        buf = _span(t, "tensor")
        return self._mpi_call(
            "recv",
            lambda: ([self._mpi.Irecv([buf, MPI.BYTE], MPI.ANY_SOURCE, tag)], t),
            True,
            tensors,
            status=True,
        )

    def _check_peer(self, peer: int, tag: int, arg: str) -> None:
        if not 0 <= peer < self.size():
            raise InvalidArgumentError(
                f"{arg}: expected a rank of the group (0..{self.size() - 1}), found {peer}"
            )
        if not 0 <= tag <= _tag_limit():
            raise InvalidArgumentError(f"tag: expected 0..{_tag_limit()}, found {tag}")

    @_translated
    def gather(self, output_tensors, input_tensors, opts=_GA):
        t, root = _one(input_tensors, "gather"), opts.rootRank
        if other := self._route(t):
            return other.gather(output_tensors, input_tensors, opts)
        outs = output_tensors[0] if output_tensors else []
        problem = _local_problem([t, *outs], "gather") or _blocks_problem(
            self, t, outs, root, "gather_list"
        )
        sizes = self._sizes(problem, t, "gather")
        send = _span(t, "tensor")
        flat = torch.empty(int(sizes.sum()), dtype=torch.uint8) if self.rank() == root else None

        def start():
            recv = None
            if flat is not None:
                recv = [_span(flat, "gather_list"), (sizes.tolist(), _displs(sizes)), MPI.BYTE]
            return [self._mpi.Igatherv([send, MPI.BYTE], recv, root)], (t, flat)

        def finish():
            if flat is not None:
                _unpack(flat, outs)

        return self._mpi_call("gather", start, opts.asyncOp, output_tensors, finish)

    @_translated
    def scatter(self, output_tensors, input_tensors, opts=_SC):
        out, root = _one(output_tensors, "scatter"), opts.rootRank
        if other := self._route(out):
            return other.scatter(output_tensors, input_tensors, opts)
        ins = input_tensors[0] if input_tensors else []
        problem = _local_problem([out, *ins], "scatter") or _blocks_problem(
            self, out, ins, root, "scatter_list"
        )
        sizes = self._sizes(problem, out, "scatter")
        recv = _span(out, "tensor")
        flat = _pack(ins) if self.rank() == root else None

        def start():
            send = None
            if flat is not None:
                send = [_span(flat, "scatter_list"), (sizes.tolist(), _displs(sizes)), MPI.BYTE]
            return [self._mpi.Iscatterv(send, [recv, MPI.BYTE], root)], (out, flat)

        return self._mpi_call("scatter", start, opts.asyncOp, output_tensors)

    def _sizes(self, problem: str | None, t: torch.Tensor, what: str) -> np.ndarray:
        """The bytes of every rank's `t` once all ranks agreed their arguments are valid and
        their tensors of one size (gather and scatter move blocks of one size)."""
        self._alive(what)
        sizes = self._exchange(np.array([_nbytes(t)], np.int64), what)[:, 0]
        if problem is None and (sizes != sizes[0]).any():
            problem = f"tensor: the ranks' tensors differ in size: {sizes.tolist()} bytes"
        self._agree(problem, what)
        return sizes

    @_translated
    def alltoall(self, output_tensors, input_tensors, opts=_AA):
        if input_tensors and (other := self._route(input_tensors[0])):
            return other.alltoall(output_tensors, input_tensors, opts)
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise InvalidArgumentError(
                f"all_to_all: expected {n} output and {n} input tensors (one per rank of the "
                f"group), found {len(output_tensors)} and {len(input_tensors)}"
            )
        problem = _local_problem([*input_tensors, *output_tensors], "all_to_all")
        send = np.array([_nbytes(t) for t in input_tensors], np.int64)
        recv = np.array([_nbytes(t) for t in output_tensors], np.int64)
        self._check_alltoall(send, recv, "all_to_all", problem)
        flat_in, flat_out = _pack(input_tensors), torch.empty(int(recv.sum()), dtype=torch.uint8)

        def finish():
            _unpack(flat_out, output_tensors)

        return self._mpi_call(
            "all_to_all",
            lambda: self._alltoallv(flat_in, send, flat_out, recv),
            opts.asyncOp,
            output_tensors,
            finish,
        )

    @_translated
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=_AA):
        if other := self._route(input):
            splits = (output_split_sizes, input_split_sizes)
            return other.alltoall_base(output, input, *splits, opts)
        n = self.size()
        send, bad_send = _split_bytes(input, input_split_sizes, n, "input")
        recv, bad_recv = _split_bytes(output, output_split_sizes, n, "output")
        problem = _local_problem([input, output], "all_to_all_single") or bad_send or bad_recv
        self._check_alltoall(send, recv, "all_to_all_single", problem)
        return self._mpi_call(
            "all_to_all_single",
            lambda: self._alltoallv(input, send, output, recv),
            opts.asyncOp,
            [output],
        )

    def _check_alltoall(self, send, recv, what: str, problem: str | None) -> None:
        """What each rank sends me must be what I expect from it, on every pair of ranks."""
        self._alive(what)
        arriving = self._exchange(send, what, alltoall=True)
        bad = np.flatnonzero(arriving != recv).tolist()
        if problem is None and bad:
            problem = (
                f"the bytes this rank expects from group rank(s) {bad} "
                f"({recv[bad].tolist()}) differ from what they send ({arriving[bad].tolist()})"
            )
        self._agree(problem, what)

    def _alltoallv(self, input, send, output, recv):
        s = [_span(input, "input"), (send.tolist(), _displs(send)), MPI.BYTE]
        r = [_span(output, "output"), (recv.tolist(), _displs(recv)), MPI.BYTE]
        return [self._mpi.Ialltoallv(s, r)], (input, output)

    def _gather_uneven(self, outs: list, t: torch.Tensor, async_op: bool):
        """all_gather into a list of tensors of different sizes: MPI_Iallgatherv of bytes."""
        problem = _local_problem([t, *outs], "all_gather")
        if problem is None and any(o.dtype != t.dtype for o in outs):
            problem = f"tensor_list: expected tensors of the input's dtype {t.dtype}"
        self._alive("all_gather")
        recv = np.array([_nbytes(o) for o in outs], np.int64)
        sizes = self._exchange(np.array([_nbytes(t)], np.int64), "all_gather")[:, 0]
        if problem is None and (sizes != recv).any():
            problem = (
                f"tensor_list: its tensors hold {recv.tolist()} bytes, the ranks' inputs "
                f"{sizes.tolist()}"
            )
        self._agree(problem, "all_gather")
        send, flat = _span(t, "tensor"), torch.empty(int(recv.sum()), dtype=torch.uint8)

        def start():
            r = [_span(flat, "tensor_list"), (recv.tolist(), _displs(recv)), MPI.BYTE]
            return [self._mpi.Iallgatherv([send, MPI.BYTE], r)], (t, flat)

        return self._mpi_call("all_gather", start, async_op, [outs], lambda: _unpack(flat, outs))

    # ---- lifecycle -----------------------------------------------------------------------

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """torch's ProcessGroup.set_timeout: the deadline of every later call of the group
        (calls already started keep theirs), the backends of a device map's other devices
        included. A group can be made and warmed up under a generous deadline and then run
        under a tight one."""
        if not isinstance(timeout, datetime.timedelta):
            raise InvalidArgumentError(
                f"fourd: set_timeout takes a datetime.timedelta; found {type(timeout).__name__}"
            )
        seconds = _seconds(timeout)
        if seconds is None:
            raise InvalidArgumentError(
                f"fourd: set_timeout: the timeout must be > 0; found {timeout}"
            )
        self._timeout = seconds
        self._native.timeout = seconds
        for backend in self._devices.values():
            if backend:
                backend._set_default_timeout(timeout)

    def shutdown(self) -> None:
        """Frees the group's MPI duplicate; the default group also ends the grid made for it."""
        mpi, self._mpi = self._mpi, None
        if mpi is not None and not MPI.Is_finalized():
            mpi.Free()
        if self._is_world:
            self._is_world = False
            _WORLD.close()

    def abort(self) -> None:
        """torch's abort: every later call of the group raises DistBackendError on this rank,
        fourd's collectives included (the group's fourd communicator is poisoned; a grid axis's
        for all its users). A new_group of the same ranks afterwards gets a new communicator."""
        self._mpi_failure = self._mpi_failure or "the group was aborted"
        self.fourd_axis.communicator.abort(f"torch.distributed aborted group {self._name}")


def _async(options, reduce_op=None):
    """A copy of a collective's options that asks for an asynchronous call."""
    o = type(options)()
    o.asyncOp = True
    if reduce_op is not None:
        o.reduceOp = reduce_op
    return o


def _displs(counts: np.ndarray) -> list:
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64).tolist()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a uint8 view (any dtype)."""
    return t.detach().reshape(-1).view(torch.uint8)


def _pack(tensors) -> torch.Tensor:
    """The bytes of contiguous `tensors`, one after the other, in one new uint8 tensor."""
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([_bytes(t) for t in tensors])


def _unpack(flat: torch.Tensor, tensors) -> None:
    """Copies consecutive byte blocks of `flat` into contiguous `tensors` (each its size)."""
    at = 0
    for t in tensors:
        n = _nbytes(t)
        _bytes(t).copy_(flat[at : at + n])
        at += n


def _blocks_problem(pg, t, blocks, root: int, arg: str) -> str | None:
    """What is wrong with the root's list of blocks of gather or scatter (`t`: this rank's
    own tensor, which every block must match)."""
    n = pg.size()
    if not 0 <= root < n:
        return f"root: expected a rank of the group (0..{n - 1}), found {root}"
    if pg.rank() != root:
        return None
    if len(blocks) != n:
        return f"{arg}: expected {n} tensors (one per rank of the group), found {len(blocks)}"
    for i, b in enumerate(blocks):
        if b.dtype != t.dtype or b.numel() != t.numel():
            return (
                f"{arg}[{i}]: expected {t.numel()} elements of {t.dtype} (as tensor), found "
                f"{b.numel()} of {b.dtype}"
            )
    return None


def _split_bytes(t: torch.Tensor, splits, n: int, arg: str):
    """(bytes to or from each rank of all_to_all_single, what is wrong or None): `splits`
    rows of dim 0 each, even when empty."""
    rows = t.shape[0] if t.dim() else 1
    row = _nbytes(t) // rows if rows else 0
    splits = list(splits or [])
    if not splits:
        if rows % n:
            zero = np.zeros(n, np.int64)
            return zero, f"{arg}: {rows} rows do not split evenly over {n} ranks (give splits)"
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        problem = (
            f"{arg}_split_sizes: expected {n} counts >= 0 summing to {rows} (the rows of "
            f"{arg}), found {splits}"
        )
        return np.zeros(n, np.int64), problem
    return np.array(splits, np.int64) * row, None


def _duplicate(handle: int, timeout: float, name: str):
    """A duplicate of a fourd communicator (fourd's own traffic uses the original), made with
    a non-blocking MPI_Comm_idup against the deadline."""
    comm, request = MPI.Comm.f2py(handle).Idup()
    _mpi_wait([request], time.monotonic() + timeout, f"new group {name}: MPI_Comm_idup", comm)
    return comm


@functools.cache
def _tag_limit() -> int:
    return int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))


def _device_backend(pg: ProcessGroup, device: str):
    """The torch backend a device map ("cpu:fourd,cuda:nccl") names for `device`, made on
    first use over the group's store; False when that is fourd itself."""
    config = dict(
        pair.strip().split(":", 1) for pair in dist.get_backend_config(pg).split(",") if ":" in pair
    )
    name = config.get(device)
    if name == BACKEND or (name is None and device == "cuda" and _C.HAVE_CUDA):
        return False
    store = dist.PrefixStore(f"{device}/", pg._store)
    timeout = datetime.timedelta(seconds=pg._timeout)
    if name == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        options.global_ranks_in_group = list(pg._ranks)
        options.group_name = pg.group_name
        backend = dist.ProcessGroupNCCL(store, pg.rank(), pg.size(), options)
    elif name == "gloo":
        backend = dist.ProcessGroupGloo(store, pg.rank(), pg.size(), timeout)
    else:
        raise InvalidArgumentError(
            f"tensor: a {device} tensor, but group {pg._name} runs backend "
            f"{dist.get_backend_config(pg)!r}: backend fourd takes CPU tensors"
            f"{' and CUDA tensors' if _C.HAVE_CUDA else ''}; name a backend for {device} in a "
            f"device map such as 'cpu:fourd,cuda:nccl'"
        )
    backend._set_sequence_number_for_group()
    return backend


# ---- torch's entry points: the backend and the rendezvous ------------------------------------


def _create_process_group(options, backend_options=None) -> ProcessGroup:
    """torch's constructor of backend fourd (extended API): the default group (no ranks
    listed) opens the backend's grid; every group is collective over its own ranks."""
    timeout = options.timeout.total_seconds()
    ranks = list(options.global_ranks_in_group)
    world = not ranks
    if world:
        ranks = list(range(options.group_size))
        grid = _WORLD.open(options.group_rank, options.group_size, timeout)
    else:
        grid = _WORLD.subgroup_grid()
    try:
        pg = ProcessGroup(
            options.store, options.group_rank, options.group_size, grid, ranks, timeout
        )
    except BaseException:
        if world:
            _WORLD.close()
        raise
    pg._is_world = world
    return pg


_HOST_BYTES = 256
_REPLY_BYTES = 1024


def _store_address(hosts: np.ndarray) -> str:
    """An address of rank 0 every rank reaches: FOURD_TORCH_MASTER_ADDR, else loopback when
    all ranks share this host, else this host's first non-loopback IPv4 address."""
    named = os.environ.get("FOURD_TORCH_MASTER_ADDR", "").strip()
    if named:
        return named
    if (hosts == hosts[0]).all():
        return "127.0.0.1"
    host = socket.gethostname()
    try:
        for info in socket.getaddrinfo(host, None, socket.AF_INET):
            if not info[4][0].startswith("127."):
                return info[4][0]
    except OSError:
        pass
    return host


def _store_over_mpi(comm, timeout: datetime.timedelta, problem: str | None):
    """torch's store for the processes of `comm`: rank 0 opens a TCPStore on a free port and
    announces it over MPI (non-blocking calls, polled against the deadline). `problem`: what
    is wrong with this rank's arguments; every rank raises if any rank has one."""
    deadline = time.monotonic() + timeout.total_seconds()
    rank, size = comm.Get_rank(), comm.Get_size()
    name = socket.gethostname().encode()[: _HOST_BYTES - 1]
    mine = np.zeros(_HOST_BYTES, np.uint8)  # the host name, then a flag: arguments invalid
    mine[: len(name)] = np.frombuffer(name, np.uint8)
    mine[-1] = problem is not None
    hosts = np.empty((size, _HOST_BYTES), np.uint8) if rank == 0 else None
    _mpi_wait([comm.Igather(mine, hosts, 0)], deadline, "rendezvous: the hosts", hosts)
    reply, store = np.zeros(_REPLY_BYTES, np.uint8), None
    if rank == 0:
        text = _open_store(hosts, size, timeout)
        store = text.pop("store", None)
        text = json.dumps(text)
        reply[: len(text)] = np.frombuffer(text.encode(), np.uint8)
    _mpi_wait([comm.Ibcast(reply, 0)], deadline, "rendezvous: rank 0's store", reply)
    info = json.loads(reply.tobytes().rstrip(b"\0"))
    if problem is not None or "invalid" in info:
        raise ValueError(problem or f"init_process_group: {info['invalid']}")
    if "error" in info:
        raise dist.DistStoreError(f"fourd: rank 0 could not open torch's TCPStore: {info['error']}")
    if rank != 0:
        store = dist.TCPStore(info["addr"], info["port"], size, False, timeout=timeout)
    return store


def _open_store(hosts: np.ndarray, size: int, timeout) -> dict:
    """Rank 0's part: {"store", "addr", "port"}, or {"invalid": ...} when some rank's arguments
    are wrong, or {"error": ...} when the store cannot open."""
    bad = np.flatnonzero(hosts[:, -1]).tolist()
    if bad:
        return {"invalid": f"rank(s) {bad} were given a rank or world size other than MPI's"}
    try:
        addr = _store_address(hosts[:, :-1])
        store, port = _listening_store(addr, size, timeout)
    except Exception as e:  # noqa: BLE001 - reported on every rank
        return {"error": repr(e)[: _REPLY_BYTES // 2]}
    return {"store": store, "addr": addr, "port": port}


def _mpi_rendezvous(url: str, timeout=datetime.timedelta(minutes=30), **kwargs):
    """torch's rendezvous of a job started by mpiexec or srun (``fourd://``, and ``env://``
    without MASTER_ADDR/MASTER_PORT): rank and world size of MPI.COMM_WORLD, a store from
    rank 0. A rank or world size given to init_process_group must be MPI's."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    problem = None
    for key, value in (("rank", rank), ("world_size", size)):
        given = int(query.get(key, -1))
        if given not in (-1, value) and problem is None:
            problem = (
                f"init_process_group: {key}={given}, but MPI makes this process's {key} "
                f"{value}; a job started by mpiexec takes both from MPI (leave them out)"
            )
    store = _store_over_mpi(comm, timeout, problem)
    yield store, rank, size
    raise RuntimeError("fourd:// rendezvous: a process cannot rendezvous twice")


def _install_rendezvous() -> None:
    """Registers fourd:// and lets env:// fall back to it when MASTER_ADDR or MASTER_PORT is
    not set (where torch's own handler would raise), so that the plain
    ``init_process_group("fourd")`` works under mpiexec. torch has no public way to extend a
    scheme: its handler table is wrapped in place."""
    try:
        _rendezvous.register_rendezvous_handler("fourd", _mpi_rendezvous)
    except RuntimeError:  # registered by an earlier import of this module
        pass
    handlers = getattr(_rendezvous, "_rendezvous_handlers", None)
    env = handlers.get("env") if handlers is not None else None
    if env is None or getattr(env, "fourd_fallback", False):
        return

    def env_or_mpi(url, **kwargs):
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            return env(url, **kwargs)
        return _mpi_rendezvous(url, **kwargs)

    env_or_mpi.fourd_fallback = True
    handlers["env"] = env_or_mpi


_install_rendezvous()
dist.Backend.register_backend(
    BACKEND,
    _create_process_group,
    extended_api=True,
    devices=["cpu", "cuda"] if _C.HAVE_CUDA else ["cpu"],
)
