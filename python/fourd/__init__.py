"""fourd: topology-aware hierarchical collectives on a 4D process grid (x, y, z, data).

    import fourd
    grid = fourd.init(x=2, y=2, z=1, data=2)
    fourd.all_reduce(tensor, "x")
    fourd.all_gather(out, inp, ("z", "data"), async_op=True).wait()

Run scripts as ``mpiexec -n N python -m mpi4py script.py`` so that one failing rank ends the job.
"""

from mpi4py import MPI  # noqa: F401  (initialises MPI before the native module loads)

try:
    from . import _C
except ImportError as _e:  # the MPI library fourd was built against is not found
    if "libmpi" not in str(_e):
        raise
    raise ImportError(
        f"fourd: cannot load its native module: {_e}. fourd was built against an MPI library "
        f"that this environment does not have: install the MPICH wheel (pip install "
        f"'fourd[mpich]'), or put the MPI fourd was built with on LD_LIBRARY_PATH, or build "
        f'fourd against the MPI you have (README, "Using another MPI")'
    ) from None
from . import grid as _grid
from ._tensor import Buffer
from .errors import (
    _NATIVE_CLASSES,
    AbortedError,
    BackendError,
    DTypeError,
    Error,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    TimeoutError,
)
from .grid import (  # _FAILED, _FAST_TYPES, _quarantine: the hot paths below
    _FAILED,
    _FAST_TYPES,
    Explanation,
    Grid,
    Subgroup,
    _quarantine,
    finalize,
    get_grid,
    init,
    is_initialized,
)

_C.set_error_classes(_NATIVE_CLASSES)

from .profile.policy import apply as _apply_profile  # noqa: E402
from .profile.policy import calibrate  # noqa: E402

_grid._init_hooks.append(_apply_profile)

Work = _C.Work
__version__ = _C.__version__
HAVE_CUDA = bool(_C.HAVE_CUDA)


def _g(grid):
    return _grid.get_grid() if grid is None else grid


def all_reduce(
    tensor,
    axis="world",
    op="sum",
    *,
    output=None,
    group=None,
    grid=None,
    algorithm="auto",
    async_op=False,
    timeout=None,
    accumulate_fp32=False,
    compression=None,
):
    """Reduce `tensor` over my group along `axis` (torch's all_reduce): in place, or into
    `output` (same count and dtype, not overlapping `tensor`) when given.

    axis: "x", "y", "z", "data", "world", a tuple of axis names (their combined group), a
    Grid.group(ranks), or a fourd parallel_state group; `group=` is torch's name for it (a
    torch ProcessGroup of fourd's backend too). op: "sum", "prod", "min", "max", "avg"
    (floating types) or torch's ReduceOp, also in the axis's place as torch puts it
    (`all_reduce(t, ReduceOp.SUM)`). algorithm: "auto", "flat", "ring", "rhd",
    "hierarchical", "shm". accumulate_fp32: float16/bfloat16 partial sums kept in float32.
    compression: a codec for this call ("none", "lossless", "zfp:rate=8", "zfp:tol=1e-3",
    "int8", "bf16", "auto"; docs/compression.md); None: the grid's policy.
    Returns a Work when async_op=True, else None.
    """
    g = _grid._current if grid is None else grid
    if (
        g is not None
        and timeout is None
        and async_op is False
        and accumulate_fp32 is False
        and compression is None
        and group is None
        and type(tensor) in _FAST_TYPES
    ):  # Grid.all_reduce's hot path, without a second Python frame (see there)
        try:
            plan = g._calls.get((axis, op, algorithm))
        except TypeError:  # an unhashable axis (a list): the general path
            plan = None
        if plan is not None:
            try:
                if output is None:
                    done = plan[3].all_reduce(tensor)
                else:
                    done = type(output) in _FAST_TYPES and plan[3].all_reduce_into(output, tensor)
            except _FAILED:
                _quarantine(tensor, output)
                raise
            if done:
                return None
    if g is None:
        g = _grid.get_grid()  # raises: no grid yet, or finalized
    return g.all_reduce(
        tensor,
        axis,
        op,
        output=output,
        group=group,
        algorithm=algorithm,
        async_op=async_op,
        timeout=timeout,
        accumulate_fp32=accumulate_fp32,
        compression=compression,
    )


def all_gather(
    output,
    input,
    axis="world",
    *,
    group=None,
    grid=None,
    algorithm="auto",
    async_op=False,
    timeout=None,
    compression=None,
):
    """output = the inputs of my group along `axis`, concatenated in group-rank order; or a
    list of one tensor per group rank (torch's form). compression: as all_reduce's (each
    block is encoded once, at its source)."""
    g = _grid._current if grid is None else grid
    if (
        g is not None
        and timeout is None
        and async_op is False
        and compression is None
        and group is None
        and type(output) in _FAST_TYPES
        and type(input) in _FAST_TYPES
    ):  # Grid.all_gather's hot path, without a second Python frame (see there)
        try:
            plan = g._calls.get((axis, "sum", algorithm))
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
    if g is None:
        g = _grid.get_grid()  # raises: no grid yet, or finalized
    return g.all_gather(
        output,
        input,
        axis,
        group=group,
        algorithm=algorithm,
        async_op=async_op,
        timeout=timeout,
        compression=compression,
    )


def reduce_scatter(
    output,
    input,
    axis="world",
    op="sum",
    *,
    group=None,
    grid=None,
    algorithm="auto",
    async_op=False,
    timeout=None,
    accumulate_fp32=False,
    compression=None,
):
    """input holds group-size blocks (or is a list of one tensor per group rank: torch's
    form); the reduced block i ends on group rank i as `output`. compression: as
    all_reduce's."""
    g = _grid._current if grid is None else grid
    if (
        g is not None
        and timeout is None
        and async_op is False
        and accumulate_fp32 is False
        and compression is None
        and group is None
        and type(output) in _FAST_TYPES
        and type(input) in _FAST_TYPES
    ):  # Grid.reduce_scatter's hot path, without a second Python frame (see there)
        try:
            plan = g._calls.get((axis, op, algorithm))
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
    if g is None:
        g = _grid.get_grid()  # raises: no grid yet, or finalized
    return g.reduce_scatter(
        output,
        input,
        axis,
        op,
        group=group,
        algorithm=algorithm,
        async_op=async_op,
        timeout=timeout,
        accumulate_fp32=accumulate_fp32,
        compression=compression,
    )


def broadcast(tensor, src, axis="world", *, group=None, grid=None, async_op=False, timeout=None):
    """Copy `tensor` of group rank `src` (a rank within the group) to the whole group."""
    return _g(grid).broadcast(tensor, src, axis, group=group, async_op=async_op, timeout=timeout)


def barrier(axis="world", *, group=None, grid=None, timeout=None):
    """Wait until every rank of my group along `axis` arrives."""
    return _g(grid).barrier(axis, group=group, timeout=timeout)


def explain(
    collective,
    nbytes,
    axis="world",
    *,
    grid=None,
    dtype="float32",
    in_place=False,
    device="cpu",
    verbose=False,
    compression=None,
):
    """The algorithms `auto` considers for this call, their predicted times, and its choice:
    a dict (`str()` of it, or verbose=True, prints a short table). Its "compression" says
    whether a codec is used (`compression`: the call's argument), where, and why."""
    e = _g(grid).explain(collective, nbytes, axis, dtype, in_place, device, compression)
    if verbose:
        print(e)
    return e


def build_info() -> dict:
    """Version, MPI library, and whether CUDA/NCCL support is compiled in."""
    return {
        "version": __version__,
        "mpi_library": _C.mpi_library_version(),
        "mpi_header_family": _C.mpi_header_family(),  # the mpi.h fourd was compiled with
        "mpi_abi_mismatch": _C.mpi_abi_mismatch(),  # "" when the library matches that header
        "mpi_thread_level": _C.mpi_thread_level(),
        "cuda": HAVE_CUDA,
        "nccl": HAVE_CUDA,
        "nccl_version": _C.nccl_version() if HAVE_CUDA else None,
        "cuda_devices": _C.cuda_device_count()[0] if HAVE_CUDA else 0,
        # Why no CUDA device can be used ("" when one can).
        "cuda_unavailable": (
            _C.cuda_device_count()[1]
            if HAVE_CUDA
            else "this build of fourd has no CUDA support (FOURD_CUDA=ON)"
        ),
    }


def __getattr__(name):
    # Lazy: fourd.nn and fourd.tensor_parallel import torch, which plain users of the
    # collectives may not have.
    if name in ("parallel_state", "tensor_parallel", "nn", "plan", "bench"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fourd' has no attribute {name!r}")


def _at_exit():
    # Runs before mpi4py finalizes MPI (registered later, so called earlier).
    try:
        finalize()
    except Exception:  # noqa: BLE001 - never raise at interpreter exit
        pass


import atexit as _atexit  # noqa: E402

_atexit.register(_at_exit)

__all__ = [
    "AbortedError",
    "BackendError",
    "Buffer",
    "DTypeError",
    "Error",
    "Explanation",
    "Grid",
    "HAVE_CUDA",
    "InvalidArgumentError",
    "MismatchError",
    "NotInitializedError",
    "Subgroup",
    "TimeoutError",
    "Work",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "build_info",
    "calibrate",
    "explain",
    "finalize",
    "get_grid",
    "init",
    "is_initialized",
    "reduce_scatter",
]
