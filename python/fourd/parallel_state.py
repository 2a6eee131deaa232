"""Megatron-Core's ``parallel_state`` on top of the fourd 4D grid: a drop-in for
``megatron.core.parallel_state`` (megatron-core 0.19; every public function of it is here).

    import fourd.parallel_state as ps
    ps.use_in_megatron()                           # Megatron's own code now uses this module
    ps.initialize_model_parallel(4)                # Megatron's call; or ps.initialize(x=2, y=2)
    tp = ps.get_tensor_model_parallel_group()      # x*y*z combined, a torch ProcessGroup
    torch.distributed.all_reduce(t, group=tp)      # torch takes the group directly
    fourd.all_reduce(t, tp)                        # and so do fourd's collectives

The layout is Megatron's "tp-cp-ep-dp-pp" (the default order): the tensor-parallel group is the
grid's x, y and z axes combined (x varying fastest), the data-parallel group is its data axis,
and every group, rank, world size and source rank is the one Megatron's own module gives on
the same ranks. The axes the grid does not have (context, expert, pipeline, GTP weight
rematerialisation) have size 1: their groups hold each rank alone, their getters answer, and
asking ``initialize_model_parallel`` for a size above 1 raises :class:`fourd.InvalidArgumentError`
naming the argument.

=================================  ==========================  ================================
Megatron group                     fourd axes                  size
=================================  ==========================  ================================
tensor model parallel, model       ("x", "y", "z")             Gx*Gy*Gz
parallel, tensor and context,
expert tensor (and model,
pipeline), amax (tp only)
data parallel (with or without     "data"                      Gdata
context parallel, partial, GTP),
expert data parallel, their gloo
tensor and data parallel, amax,    "world"                     world size
intra distributed-optimizer
pipeline, context, expert model,   (none: this rank alone)     1
GTP, embedding, position embedding
=================================  ==========================  ================================

plus one getter triple per grid axis (``get_x_parallel_group()``, ``..._rank()``,
``..._world_size()`` for x, y, z) and :func:`get_group` for any combination, such as
``get_group(("z", "data"))``, the group over which biases and norms are reduced.

Every group is a :class:`Group`: a ``torch.distributed.ProcessGroup`` (of fourd's torch backend
when ``fourd.distributed`` provides it, else of torch's default backend, gloo on CPU) that fourd's
collectives also take as their axis. Group rank i is position i of ``group.ranks()`` in both.
:func:`initialize` and :func:`initialize_model_parallel` bring torch.distributed up from MPI
when nobody has (Megatron's layers use no group while ``torch.distributed.is_initialized()`` is
False) and make every group up front, so the getters are local calls.

fourd.nn and fourd.tensor_parallel take their defaults from here: :func:`default_grid` (this
module's grid when initialised, else the current fourd grid), :data:`TP_AXES`, and
:func:`mask_obj`, the shared :class:`AxisMask` of an axis argument.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import sys
import threading
import types
import warnings

import torch
import torch.distributed as dist

from . import _C
from . import grid as _grid
from ._megatron_compat import (
    GlobalMemoryBuffer,
    RankGenerator,
    check_megatron_arguments,
    default_embedding_ranks,
    default_position_embedding_ranks,
    generate_masked_orthogonal_rank_groups,
    grid_order,
    hierarchical_rank_lists,
    nccl_options,
    overwrite_nccl_comm_cfgs,
)
from ._torch_group import (
    Group,
    families_along,
    make_group,
    new_torch_group,
    start_torch,
)
from ._torch_group import _torch_groups as _made_torch_groups
from .errors import InvalidArgumentError, NotInitializedError

__all__ = [
    "TP_AXES",
    "AxisMask",
    "GlobalMemoryBuffer",
    "Group",
    "RankGenerator",
    "create_all_gather_groups",
    "create_group",
    "create_hierarchical_groups",
    "create_hybrid_dp_cp_groups",
    "default_embedding_ranks",
    "default_grid",
    "default_position_embedding_ranks",
    "destroy_global_memory_buffer",
    "destroy_model_parallel",
    "generate_masked_orthogonal_rank_groups",
    "get_all_ranks",
    "get_amax_reduction_group",
    "get_context_parallel_global_ranks",
    "get_context_parallel_group",
    "get_context_parallel_rank",
    "get_context_parallel_world_size",
    "get_data_parallel_group",
    "get_data_parallel_group_gloo",
    "get_data_parallel_rank",
    "get_data_parallel_src_rank",
    "get_data_parallel_world_size",
    "get_embedding_group",
    "get_expert_data_parallel_group",
    "get_expert_data_parallel_group_gloo",
    "get_expert_data_parallel_rank",
    "get_expert_data_parallel_world_size",
    "get_expert_gtp_weight_remat_global_ranks",
    "get_expert_gtp_weight_remat_group",
    "get_expert_gtp_weight_remat_rank",
    "get_expert_gtp_weight_remat_world_size",
    "get_expert_model_parallel_group",
    "get_expert_model_parallel_rank",
    "get_expert_model_parallel_src_rank",
    "get_expert_model_parallel_world_size",
    "get_expert_tensor_and_model_parallel_group",
    "get_expert_tensor_and_model_parallel_rank",
    "get_expert_tensor_and_model_parallel_world_size",
    "get_expert_tensor_model_pipeline_parallel_group",
    "get_expert_tensor_parallel_group",
    "get_expert_tensor_parallel_rank",
    "get_expert_tensor_parallel_world_size",
    "get_global_memory_buffer",
    "get_grid",
    "get_group",
    "get_gtp_weight_remat_global_ranks",
    "get_gtp_weight_remat_group",
    "get_gtp_weight_remat_rank",
    "get_gtp_weight_remat_world_size",
    "get_hierarchical_context_parallel_groups",
    "get_hybrid_data_context_parallel_groups",
    "get_inter_distributed_optimizer_instance_group",
    "get_intra_distributed_optimizer_instance_group",
    "get_model_parallel_group",
    "get_model_parallel_src_rank",
    "get_nccl_options",
    "get_pipeline_model_parallel_first_rank",
    "get_pipeline_model_parallel_group",
    "get_pipeline_model_parallel_last_rank",
    "get_pipeline_model_parallel_next_rank",
    "get_pipeline_model_parallel_prev_rank",
    "get_pipeline_model_parallel_rank",
    "get_pipeline_model_parallel_world_size",
    "get_position_embedding_group",
    "get_tensor_and_context_parallel_group",
    "get_tensor_and_context_parallel_rank",
    "get_tensor_and_context_parallel_world_size",
    "get_tensor_and_data_parallel_group",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_src_rank",
    "get_tensor_model_parallel_world_size",
    "get_virtual_pipeline_model_parallel_rank",
    "get_virtual_pipeline_model_parallel_world_size",
    "get_x_parallel_group",
    "get_x_parallel_rank",
    "get_x_parallel_world_size",
    "get_y_parallel_group",
    "get_y_parallel_rank",
    "get_y_parallel_world_size",
    "get_z_parallel_group",
    "get_z_parallel_rank",
    "get_z_parallel_world_size",
    "init_torch_distributed",
    "initialize",
    "initialize_model_parallel",
    "is_initialized",
    "is_pipeline_first_stage",
    "is_pipeline_last_stage",
    "is_rank_in_embedding_group",
    "is_rank_in_position_embedding_group",
    "mask_obj",
    "model_parallel_is_initialized",
    "overwrite_nccl_comm_cfgs",
    "set_data_parallel_rank",
    "set_expert_model_parallel_rank",
    "set_expert_model_parallel_world_size",
    "set_expert_tensor_parallel_rank",
    "set_expert_tensor_parallel_world_size",
    "set_pipeline_model_parallel_rank",
    "set_pipeline_model_parallel_world_size",
    "set_tensor_model_parallel_rank",
    "set_tensor_model_parallel_world_size",
    "set_virtual_pipeline_model_parallel_rank",
    "set_virtual_pipeline_model_parallel_world_size",
    "update_pg_timeout",
    "use_in_megatron",
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


_TP = _C.parse_axis("+".join(TP_AXES))
_DATA = _C.parse_axis("data")
_WORLD = _C.WORLD_MASK
# The groups initialize() makes up front: Megatron's three axis groups and the grid's axes.
_BUILT_MASKS = (_TP, _DATA, _WORLD, *(_C.parse_axis(a) for a in TP_AXES))
# Megatron's names of two groups; every other axis group is named by its axes.
_NAMES = {_TP: "tensor_model_parallel", _DATA: "data_parallel"}


# ---- module state --------------------------------------------------------------------------


@dataclasses.dataclass
class _Options:
    """What initialize_model_parallel's arguments change about the groups made."""

    create_gloo: bool = True
    embedding_ranks: object = default_embedding_ranks
    position_embedding_ranks: object = default_position_embedding_ranks
    hierarchical_cp_sizes: object = None


class _State:
    """What :func:`initialize` set up; :func:`destroy_model_parallel` resets it."""

    def __init__(self):
        self.grid = None
        self.owns_grid = False
        self.groups: dict = {}  # axis mask -> Group (get_group's)
        # Megatron's groups by role: "tp", "dp", "world", "own" (this rank alone), "dp_gloo",
        # "embd", "pos_embd"; None where this rank is in no group of that role.
        self.roles: dict = {}
        self.hierarchical_cp = None
        self.torch_timeout = None
        self.overrides: dict = {}  # Megatron's set_..._world_size / _rank values, by name
        self.virtual_rank = None
        self.virtual_size = None
        self.memory_buffer = None


_state = _State()
_lock = threading.RLock()
_group_tags = itertools.count()  # create_group's calls: a torch group of its own each


def _reset_state(grid=None, owns=False) -> None:
    _state.grid, _state.owns_grid = grid, owns
    _state.groups, _state.roles, _state.overrides = {}, {}, {}
    _state.hierarchical_cp = None
    _state.virtual_rank = _state.virtual_size = None
    _state.memory_buffer = None


def _label(mask: int) -> str:
    return _NAMES.get(mask) or _grid.mask_name(mask)


def _ranks_group(g, ranks_of_pipeline, label: str, timeout):
    """My group among those a Megatron embedding-ranks function picks from each pipeline
    group (here each rank alone); empty picks make no group."""
    family = []
    for r in range(g.world_size):
        ranks = tuple(int(q) for q in ranks_of_pipeline([r]))
        if ranks and ranks not in family:
            family.append(ranks)
    return make_group(g, None, family, label, timeout=timeout)


def _build_groups(g, opts: _Options, timeout):
    """Every group the getters hand out, made in one order all ranks share (collective over the
    whole world). Returns (groups by axis mask, groups by Megatron role)."""
    groups = {
        m: make_group(g, _MASK_OBJS[m], families_along(g, m), _label(m), timeout=timeout)
        for m in _BUILT_MASKS
    }
    own = make_group(g, None, [(r,) for r in range(g.world_size)], "this_rank", timeout=timeout)
    roles = {"tp": groups[_TP], "dp": groups[_DATA], "world": groups[_WORLD], "own": own}
    roles["dp_gloo"] = None
    if opts.create_gloo:
        family = families_along(g, _DATA)
        roles["dp_gloo"] = make_group(
            g, _MASK_OBJS[_DATA], family, "data_parallel_gloo", "gloo", timeout=timeout
        )
    roles["embd"] = _ranks_group(g, opts.embedding_ranks, "embedding", timeout)
    roles["pos_embd"] = _ranks_group(
        g, opts.position_embedding_ranks, "position_embedding", timeout
    )
    return groups, roles


def _setup(g, owns: bool, backend, timeout, opts: _Options):
    """Bring torch.distributed up, make the groups and publish them (or finalize an owned grid
    and re-raise when that fails)."""
    seconds = float(timeout) if timeout is not None else _grid.default_timeout()
    t = datetime.timedelta(seconds=seconds)
    try:
        start_torch(g, backend, t)
        groups, roles = _build_groups(g, opts, t)
    except BaseException:
        if owns:
            g.finalize()
        raise
    with _lock:
        _reset_state(g, owns)
        _state.torch_timeout = t
        _state.groups, _state.roles = groups, roles
        if opts.hierarchical_cp_sizes:
            _state.hierarchical_cp = [roles["own"]] * len(opts.hierarchical_cp_sizes)
        _state.memory_buffer = GlobalMemoryBuffer()
    me = sys.modules[__name__]
    if sys.modules.get(_MEGATRON) is me:  # put in Megatron's place by hand: finish the job
        _rebind_megatron(me)
    return g


def _check_not_initialized() -> None:
    if _state.grid is not None:
        raise InvalidArgumentError(
            "fourd.parallel_state.initialize: already initialised; call "
            "destroy_model_parallel() first"
        )


def _adopted(grid, given: dict):
    """`grid` checked for adoption: a fourd.Grid, with no grid sizes given beside it."""
    clash = [k for k, (value, default) in given.items() if value != default]
    if clash:
        raise InvalidArgumentError(
            f"grid: expected either an existing grid or grid sizes, found both (grid and "
            f"{', '.join(clash)})"
        )
    if not isinstance(grid, _grid.Grid):
        raise InvalidArgumentError(f"grid: expected a fourd.Grid, found {type(grid).__name__}")
    return grid


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
    torch_distributed: bool = True,
    backend: str | None = None,
    timeout=None,
):
    """Build (or adopt) the 4D grid and make Megatron's getters answer from it.

    Collective over `comm` (default MPI.COMM_WORLD): every rank passes the same arguments, as for
    :func:`fourd.init`. grid: an existing :class:`fourd.Grid` to adopt instead (the other grid
    arguments must then be left at their defaults). torch.distributed is brought up from MPI
    when it is not yet (see :func:`init_torch_distributed`; backend: that of its default group)
    and every group is made now; ``torch_distributed`` is accepted and has no effect. timeout:
    the deadline of fourd's collectives and of the torch groups, in seconds. Calling it again
    without :func:`destroy_model_parallel` raises. Returns the grid.
    """
    with _lock:
        _check_not_initialized()
    if grid is not None:
        given = {
            "x": (x, 1),
            "y": (y, 1),
            "z": (z, 1),
            "data": (data, None),
            "order": (order, "x-y-z-data"),
            "ranks_per_node": (ranks_per_node, None),
            "comm": (comm, None),
        }
        return _setup(_adopted(grid, given), False, backend, timeout, _Options())
    g = _grid.init(
        x=x,
        y=y,
        z=z,
        data=data,
        order=order,
        ranks_per_node=ranks_per_node,
        comm=comm,
        timeout=timeout,
    )
    return _setup(g, True, backend, timeout, _Options())


def _tp_split(tp: int, x, y, z) -> tuple:
    """(x, y, z) for a tensor-parallel size: all of it on x unless x, y, z are given (their
    product must then be the size, when the size is given too)."""
    if x is None and y is None and z is None:
        return tp, 1, 1
    x, y, z = x or 1, y or 1, z or 1
    if tp not in (1, x * y * z):
        raise InvalidArgumentError(
            f"tensor_model_parallel_size: expected x*y*z = {x * y * z}, found {tp}"
        )
    return x, y, z


def _world_of(grid, comm) -> int:
    if grid is not None:
        return grid.world_size
    from mpi4py import MPI

    return (MPI.COMM_WORLD if comm is None else comm).Get_size()


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size=None,
    pipeline_model_parallel_comm_backend=None,
    use_sharp: bool = False,
    context_parallel_size: int = 1,
    hierarchical_context_parallel_sizes=None,
    hybrid_context_parallel: bool = False,
    expert_model_parallel_size: int = 1,
    gtp_remat_size: int = 1,
    expert_gtp_remat_size: int = 1,
    num_distributed_optimizer_instances: int = 1,
    expert_tensor_parallel_size=None,
    nccl_communicator_config_path=None,
    distributed_timeout_minutes: int = 30,
    order: str = "tp-cp-ep-dp-pp",
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    create_gloo_process_groups: bool = True,
    high_priority_stream_groups=None,
    sharp_enabled_group=None,
    rank_offset: int = 0,
    local_world_size=None,
    *,
    x=None,
    y=None,
    z=None,
    data=None,
    ranks_per_node=None,
    comm=None,
    grid=None,
    backend=None,
    timeout=None,
):
    """Megatron's entry point, with Megatron's arguments in Megatron's order.

    The tensor-parallel size alone does not say how to split it over x, y and z: pass x=, y=,
    z= (their product must equal tensor_model_parallel_size when that is given too); with only
    the size, all of it goes to x (Megatron's 1D tensor parallelism). order: Megatron's tokens
    ("tp-cp-ep-dp-pp", "tp-dp-pp", ...) or fourd's axis order. Sizes above 1 for the axes the
    grid lacks, and the options that need them, raise :class:`fourd.InvalidArgumentError`;
    what only tunes NCCL communicators (use_sharp, sharp_enabled_group,
    nccl_communicator_config_path, high_priority_stream_groups,
    pipeline_model_parallel_comm_backend) is checked as Megatron checks it and has no other
    effect. distributed_timeout_minutes: the deadline of the torch groups and of fourd's
    collectives (timeout=, in seconds, overrides it). Keyword-only, fourd's: data=,
    ranks_per_node=, comm=, grid= (adopt a grid), backend= (the default torch group's) as for
    :func:`initialize`. Collective over the world.
    """
    arguments = dict(locals())
    world = _world_of(grid, comm)
    tp = tensor_model_parallel_size
    check_megatron_arguments(arguments, tp, world)
    with _lock:
        _check_not_initialized()
    opts = _Options(
        create_gloo=bool(create_gloo_process_groups),
        embedding_ranks=get_embedding_ranks or default_embedding_ranks,
        position_embedding_ranks=get_position_embedding_ranks or default_position_embedding_ranks,
        hierarchical_cp_sizes=hierarchical_context_parallel_sizes,
    )
    if timeout is None:
        timeout = 60.0 * distributed_timeout_minutes
    if grid is not None:
        _adopted(grid, {"x": (x, None), "y": (y, None), "z": (z, None)})
        have = math.prod(grid.shape[a] for a in TP_AXES)
        if tp not in (1, have):
            raise InvalidArgumentError(
                f"tensor_model_parallel_size: the grid's x*y*z is {have}, found {tp}"
            )
        return _setup(grid, False, backend, timeout, opts)
    x, y, z = _tp_split(tp, x, y, z)
    fourd_order = grid_order(order, x * y * z, world // (x * y * z))
    g = _grid.init(x, y, z, data, fourd_order, ranks_per_node, comm, timeout=float(timeout))
    return _setup(g, True, backend, timeout, opts)


def is_initialized() -> bool:
    """Whether the groups exist (Megatron's test before it uses any)."""
    return _state.grid is not None


def model_parallel_is_initialized() -> bool:
    return _state.grid is not None


def destroy_model_parallel():
    """Forget the groups and Megatron's set_... values, and finalize the grid when
    :func:`initialize` built it, unless torch's default group of backend fourd runs on it (then
    ``destroy_process_group`` finalizes it: fourd.distributed.keep_world_grid).

    torch.distributed stays up, and so do the torch groups under the Groups: they depend only
    on their rank lists, so a later :func:`initialize` reuses them (destroying and re-making
    them would be collective, and torch may reuse a destroyed group's name).
    ``torch.distributed.destroy_process_group()`` drops them all; fourd notices."""
    with _lock:
        g, owns = _state.grid, _state.owns_grid
        _reset_state()
    if g is not None and owns and not _torch_keeps(g):
        g.finalize()


def _torch_keeps(g) -> bool:
    """torch's default group of backend fourd runs on `g` and now owns it (keep_world_grid)."""
    backend = sys.modules.get("fourd.distributed")
    return backend is not None and backend.keep_world_grid(g)


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
    """My group along `axis` (an axis name, a tuple of names, "world", or a Group). The groups
    of Megatron's getters and of the grid's axes exist from :func:`initialize` on; the first
    call for another combination makes its torch groups, so it is collective over the whole
    world (every rank asks for the same axes)."""
    if isinstance(axis, Group):
        return axis
    g = get_grid()
    mask = _grid.axis_mask(axis)
    grp = _state.groups.get(mask)
    if grp is None:
        with _lock:
            grp = _state.groups.get(mask)
            if grp is None:
                family = families_along(g, mask)
                grp = make_group(
                    g, _MASK_OBJS[mask], family, _label(mask), timeout=_state.torch_timeout
                )
                _state.groups[mask] = grp
    return grp


def init_torch_distributed(grid=None, backend: str | None = None) -> dict:
    """Make sure torch.distributed is initialised, over the same processes as the grid.

    When it is not yet, rank 0 of the grid's communicator opens a TCPStore on a free port and
    tells the others over MPI (no MASTER_ADDR/MASTER_PORT needed), then every rank joins with
    torch rank = grid world rank. backend None: fourd's when ``fourd.distributed`` registers
    it, else nccl when CUDA is available, else gloo. When torch.distributed is already up, its
    world must hold the grid's processes (a mismatch raises). Collective over the grid's
    communicator the first time. Returns ``{"torch_rank_of": [torch rank of grid rank r],
    "backend": ...}``.
    """
    return start_torch(grid if grid is not None else get_grid(), backend, _state.torch_timeout)


_MEGATRON = "megatron.core.parallel_state"


def use_in_megatron():
    """Make Megatron-Core use this module as its parallel_state.

    It becomes ``sys.modules["megatron.core.parallel_state"]`` (so Megatron modules imported
    from now on import it) and ``megatron.core.parallel_state``, and every Megatron module
    already imported is rebound to it (see :func:`_rebind_megatron`). Either order works:
    before importing Megatron, or after. Returns this module."""
    me = sys.modules[__name__]
    sys.modules[_MEGATRON] = me
    core = sys.modules.get("megatron.core")
    if core is not None:
        core.parallel_state = me
    _rebind_megatron(me)
    return me


def _rebind_megatron(me) -> None:
    """In every imported Megatron module, a name bound to Megatron's own parallel_state module
    (``parallel_state``, ``mpu``) now names `me`, and a name bound to one of its functions or
    classes (``from megatron.core.parallel_state import get_global_memory_buffer``) names
    `me`'s of the same name. Megatron's modules bind parallel_state when they are imported: a
    module still bound to Megatron's own (never initialised) sees ``is_initialized()`` False,
    and then Megatron's layers get no tensor-parallel group and build unsharded layers."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron") or module is None or module is me:
            continue
        if getattr(module, "__name__", None) == _MEGATRON:
            continue  # Megatron's own parallel_state keeps its own globals
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType):
                if value.__name__ == _MEGATRON and value is not me:
                    setattr(module, attr, me)
            elif getattr(value, "__module__", None) == _MEGATRON:
                ours = getattr(me, getattr(value, "__name__", ""), None)
                if ours is not None:
                    setattr(module, attr, ours)


# ---- Megatron-Core getters -----------------------------------------------------------------


def _torch_up() -> bool:
    return dist.is_available() and dist.is_initialized()


def _group(role: str, check_initialized: bool = True, what: str | None = None):
    """The Group of a Megatron role; None when there is none and check_initialized is False."""
    grp = _state.roles.get(role)
    if grp is None and check_initialized:
        what = what or role
        if _state.grid is None:
            raise NotInitializedError(
                f"fourd.parallel_state: the {what} group is not initialized; call "
                f"initialize_model_parallel() or fourd.parallel_state.initialize() first"
            )
        raise NotInitializedError(f"fourd.parallel_state: this rank has no {what} group")
    return grp


def _global_ranks(role: str, what: str) -> list:
    return _group(role, True, what).ranks()


def _set(name: str):
    """The value Megatron's set_<name>() gave, None when none."""
    return _state.overrides.get(name)


def _size(role: str, what: str, name: str) -> int:
    """The set value of `name`, else the size of the role's group."""
    v = _set(name)
    return _group(role, True, what).size() if v is None else v


def _rank(role: str, what: str, name: str) -> int:
    """The set value of `name`, else my rank in the role's group."""
    v = _set(name)
    return _group(role, True, what).rank() if v is None else v


def _size_or_zero(role: str, what: str, rank: bool = False) -> int:
    """Megatron's answer for a group's world size (or my rank in it): 0 while torch.distributed
    is down."""
    if not _torch_up():
        return 0
    grp = _group(role, True, what)
    return grp.rank() if rank else grp.size()


def get_model_parallel_group(check_initialized=True):
    """Tensor x pipeline x GTP: with no pipeline stages, the tensor-parallel group."""
    return _group("tp", check_initialized, "model parallel")


def get_tensor_model_parallel_group(check_initialized=True):
    """x*y*z combined."""
    return _group("tp", check_initialized, "tensor model parallel")


def get_gtp_weight_remat_group(check_initialized=True):
    """GTP weight rematerialisation: size 1, this rank alone."""
    return _group("own", check_initialized, "GTP weight remat")


def get_gtp_weight_remat_world_size():
    grp = get_gtp_weight_remat_group(False) if _torch_up() else None
    return grp.size() if grp is not None else 0


def get_gtp_weight_remat_rank():
    grp = get_gtp_weight_remat_group(False) if _torch_up() else None
    return grp.rank() if grp is not None else 0


def get_gtp_weight_remat_global_ranks(check_initialized=True):
    grp = get_gtp_weight_remat_group(check_initialized)
    return None if grp is None else grp.ranks()


def get_pipeline_model_parallel_group(check_initialized=True):
    """No pipeline stages: this rank alone."""
    return _group("own", check_initialized, "pipeline model parallel")


def get_data_parallel_group(
    with_context_parallel=False, with_gtp_remat=True, partial_data_parallel=False
):
    """The data axis. Context parallelism and GTP have size 1 and there is one distributed-
    optimizer instance, so every variant is the same group; partial_data_parallel needs
    with_context_parallel, as in Megatron."""
    if partial_data_parallel and not with_context_parallel:
        raise InvalidArgumentError(
            "partial_data_parallel: the partial data-parallel group includes context "
            "parallelism; pass with_context_parallel=True"
        )
    return _group("dp", True, "data parallel")


def get_data_parallel_group_gloo(with_context_parallel=False, partial_data_parallel=False):
    """The data axis as a gloo group (none with create_gloo_process_groups=False)."""
    if partial_data_parallel and not with_context_parallel:
        raise InvalidArgumentError(
            "partial_data_parallel: the partial data-parallel group includes context "
            "parallelism; pass with_context_parallel=True"
        )
    return _group("dp_gloo", True, "data parallel gloo")


def get_context_parallel_group(check_initialized=True):
    """No context parallelism: this rank alone."""
    return _group("own", check_initialized, "context parallel")


def get_context_parallel_global_ranks(check_initialized=True):
    grp = get_context_parallel_group(check_initialized)
    return None if grp is None else grp.ranks()


def get_hierarchical_context_parallel_groups(check_initialized=True):
    """One group (this rank alone) per level of hierarchical_context_parallel_sizes; None when
    none were given."""
    if _state.hierarchical_cp is None and check_initialized:
        raise NotInitializedError(
            "fourd.parallel_state: no hierarchical context-parallel groups (give "
            "initialize_model_parallel hierarchical_context_parallel_sizes)"
        )
    return _state.hierarchical_cp


def get_hybrid_data_context_parallel_groups(check_initialized=True, group_size=None):
    """The data-parallel group when group_size is its size (hybrid context parallelism, which
    would make the smaller ones, is not supported)."""
    dp = _group("dp", check_initialized, "data parallel")
    if dp is not None and group_size == dp.size():
        return dp
    raise InvalidArgumentError(
        f"group_size: no hybrid data-context-parallel group of size {group_size} "
        f"(hybrid_context_parallel is not supported; the data-parallel group has size "
        f"{None if dp is None else dp.size()})"
    )


def get_embedding_group(check_initialized=True):
    """The ranks get_embedding_ranks picks (by default each rank alone: one pipeline stage)."""
    return _group("embd", check_initialized, "embedding")


def get_position_embedding_group(check_initialized=True):
    return _group("pos_embd", check_initialized, "position embedding")


def get_amax_reduction_group(with_context_parallel=False, tp_only_amax_red=False):
    """FP8 amax reduction: the tensor-parallel group (tp_only_amax_red), else the world."""
    if tp_only_amax_red:
        return _group("tp", True, "FP8 amax reduction")
    return _group("world", True, "FP8 amax reduction")


def get_tensor_and_data_parallel_group(check_initialized=True, with_context_parallel=False):
    """Tensor x data = every rank of the grid."""
    return _group("world", check_initialized, "tensor and data parallel")


def get_tensor_and_context_parallel_group(check_initialized=True):
    return _group("tp", check_initialized, "tensor and context parallel")


# Megatron's set_... functions: the getter of the same name answers the value set until
# destroy_model_parallel().


def set_tensor_model_parallel_world_size(world_size):
    _state.overrides["tensor_model_parallel_world_size"] = world_size


def set_pipeline_model_parallel_world_size(world_size):
    _state.overrides["pipeline_model_parallel_world_size"] = world_size


def set_tensor_model_parallel_rank(rank):
    _state.overrides["tensor_model_parallel_rank"] = rank


def set_pipeline_model_parallel_rank(rank):
    _state.overrides["pipeline_model_parallel_rank"] = rank


def set_data_parallel_rank(rank):
    _state.overrides["data_parallel_rank"] = rank


def set_expert_model_parallel_world_size(world_size):
    _state.overrides["expert_model_parallel_world_size"] = world_size


def set_expert_model_parallel_rank(rank):
    _state.overrides["expert_model_parallel_rank"] = rank


def set_expert_tensor_parallel_world_size(world_size):
    _state.overrides["expert_tensor_parallel_world_size"] = world_size


def set_expert_tensor_parallel_rank(rank):
    _state.overrides["expert_tensor_parallel_rank"] = rank


def set_virtual_pipeline_model_parallel_world_size(world_size):
    _state.virtual_size = world_size


def get_tensor_model_parallel_world_size():
    return _size("tp", "tensor model parallel", "tensor_model_parallel_world_size")


def get_pipeline_model_parallel_world_size():
    return _size("own", "pipeline model parallel", "pipeline_model_parallel_world_size")


def get_tensor_model_parallel_rank():
    return _rank("tp", "tensor model parallel", "tensor_model_parallel_rank")


def get_pipeline_model_parallel_rank():
    return _rank("own", "pipeline model parallel", "pipeline_model_parallel_rank")


def is_pipeline_first_stage(ignore_virtual=True, vp_stage=None):
    """Megatron's test: with no pipeline stages, True (unless a virtual stage other than the
    first is asked for)."""
    if not ignore_virtual and get_virtual_pipeline_model_parallel_world_size() is not None:
        if vp_stage is None:
            raise InvalidArgumentError("vp_stage: must be given when virtual pipeline is enabled")
        if vp_stage != 0:
            return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual=True, vp_stage=None):
    vp = get_virtual_pipeline_model_parallel_world_size()
    if not ignore_virtual and vp is not None:
        if vp_stage is None:
            raise InvalidArgumentError("vp_stage: must be given when virtual pipeline is enabled")
        if vp_stage != vp - 1:
            return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def is_rank_in_embedding_group(ignore_virtual=True, vp_stage=None):
    grp = _state.roles.get("embd")
    if grp is None:
        return False
    me, ranks = grp.grid.world_rank, grp.ranks()
    if ignore_virtual:
        return me in ranks
    if me == ranks[0]:
        return is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    if me == ranks[-1]:
        return is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    return True


def is_rank_in_position_embedding_group():
    grp = _state.roles.get("pos_embd")
    return grp is not None and grp.grid.world_rank in grp.ranks()


def get_virtual_pipeline_model_parallel_rank():
    return _state.virtual_rank


def set_virtual_pipeline_model_parallel_rank(rank):
    warnings.warn(
        "set_virtual_pipeline_model_parallel_rank in global scope is deprecated. "
        "Pass vp_stage explicitly to is_pipeline_first_stage, is_pipeline_last_stage, etc.",
        DeprecationWarning,
        stacklevel=2,
    )
    _state.virtual_rank = rank


def get_virtual_pipeline_model_parallel_world_size():
    return _state.virtual_size


def get_tensor_model_parallel_src_rank():
    """World rank of the first rank of my tensor-parallel group."""
    return _global_ranks("tp", "tensor model parallel")[0]


def get_model_parallel_src_rank():
    return _global_ranks("tp", "model parallel")[0]


def get_data_parallel_src_rank(with_context_parallel=False):
    return _global_ranks("dp", "data parallel")[0]


def _pipeline_rank(step: int) -> int:
    ranks = _global_ranks("own", "pipeline model parallel")
    size = get_pipeline_model_parallel_world_size()
    return ranks[(get_pipeline_model_parallel_rank() + step) % size]


def get_pipeline_model_parallel_first_rank():
    return _global_ranks("own", "pipeline model parallel")[0]


def get_pipeline_model_parallel_last_rank():
    ranks = _global_ranks("own", "pipeline model parallel")
    return ranks[get_pipeline_model_parallel_world_size() - 1]


def get_pipeline_model_parallel_next_rank():
    return _pipeline_rank(1)


def get_pipeline_model_parallel_prev_rank():
    return _pipeline_rank(-1)


def get_data_parallel_world_size(
    with_context_parallel=False, with_gtp_remat=True, partial_data_parallel=False
):
    """0 while torch.distributed is down, as in Megatron."""
    if not _torch_up():
        return 0
    return get_data_parallel_group(
        with_context_parallel, with_gtp_remat, partial_data_parallel
    ).size()


def get_data_parallel_rank(
    with_context_parallel=False, with_gtp_remat=True, partial_data_parallel=False
):
    """The set value, else 0 while torch.distributed is down, as in Megatron."""
    v = _set("data_parallel_rank")
    if v is not None or not _torch_up():
        return v or 0
    return get_data_parallel_group(
        with_context_parallel, with_gtp_remat, partial_data_parallel
    ).rank()


def get_context_parallel_world_size():
    return _size_or_zero("own", "context parallel")


def get_context_parallel_rank():
    return _size_or_zero("own", "context parallel", rank=True)


def get_tensor_and_context_parallel_world_size():
    return _size_or_zero("tp", "tensor and context parallel")


def get_tensor_and_context_parallel_rank():
    return _size_or_zero("tp", "tensor and context parallel", rank=True)


# ---- Megatron-Core's expert getters: experts share the tensor-parallel axes, no expert axis


def get_expert_gtp_weight_remat_group(check_initialized=True):
    return _group("own", check_initialized, "expert GTP weight remat")


def get_expert_gtp_weight_remat_world_size():
    grp = get_expert_gtp_weight_remat_group(False) if _torch_up() else None
    return grp.size() if grp is not None else 0


def get_expert_gtp_weight_remat_rank():
    grp = get_expert_gtp_weight_remat_group(False) if _torch_up() else None
    return grp.rank() if grp is not None else 0


def get_expert_gtp_weight_remat_global_ranks(check_initialized=True):
    grp = get_expert_gtp_weight_remat_group(check_initialized)
    return None if grp is None else grp.ranks()


def get_expert_model_parallel_group(check_initialized=True):
    """No expert parallelism: this rank alone."""
    return _group("own", check_initialized, "expert model parallel")


def get_expert_model_parallel_src_rank():
    return _global_ranks("own", "expert model parallel")[0]


def get_expert_model_parallel_world_size():
    v = _set("expert_model_parallel_world_size")
    return _size_or_zero("own", "expert model parallel") if v is None else v


def get_expert_model_parallel_rank():
    v = _set("expert_model_parallel_rank")
    return _size_or_zero("own", "expert model parallel", rank=True) if v is None else v


def get_expert_tensor_parallel_group(check_initialized=True):
    return _group("tp", check_initialized, "expert tensor parallel")


def get_expert_tensor_parallel_world_size():
    """Megatron's answer: the set value, else the group's size, else (no group) the set
    tensor-parallel world size."""
    v, grp = _set("expert_tensor_parallel_world_size"), _state.roles.get("tp")
    if v is not None:
        return v
    return _set("tensor_model_parallel_world_size") if grp is None else grp.size()


def get_expert_tensor_parallel_rank():
    v, grp = _set("expert_tensor_parallel_rank"), _state.roles.get("tp")
    if v is not None:
        return v
    return _set("tensor_model_parallel_rank") if grp is None else grp.rank()


def get_expert_tensor_and_model_parallel_group(check_initialized=True):
    return _group("tp", check_initialized, "expert tensor and model parallel")


def get_expert_tensor_and_model_parallel_world_size():
    return _size_or_zero("tp", "expert tensor and model parallel")


def get_expert_tensor_and_model_parallel_rank():
    return _size_or_zero("tp", "expert tensor and model parallel", rank=True)


def get_expert_tensor_model_pipeline_parallel_group(check_initialized=True, with_egtp_remat=False):
    return _group("tp", check_initialized, "expert tensor-model-pipeline parallel")


def get_expert_data_parallel_group(
    check_initialized=True, with_gtp_remat=True, partial_expert_data_parallel=False
):
    """Expert data parallelism: the data axis (experts are not split over ranks)."""
    return _group("dp", check_initialized, "expert data parallel")


def get_expert_data_parallel_group_gloo(partial_expert_data_parallel=False):
    return _group("dp_gloo", True, "expert data parallel gloo")


def get_expert_data_parallel_rank(with_gtp_remat=True, partial_expert_data_parallel=False):
    return _size_or_zero("dp", "expert data parallel", rank=True)


def get_expert_data_parallel_world_size(with_gtp_remat=True, partial_expert_data_parallel=False):
    return _size_or_zero("dp", "expert data parallel")


def get_intra_distributed_optimizer_instance_group(check_initialized=True):
    """One distributed-optimizer instance: every rank."""
    return _group("world", check_initialized, "intra distributed optimizer instance")


def get_inter_distributed_optimizer_instance_group(check_initialized=True):
    """None: with one distributed-optimizer instance there is no group between instances."""
    return _group("inter_dist_opt", check_initialized, "inter distributed optimizer instance")


# ---- the grid's own axes -------------------------------------------------------------------


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


# ---- Megatron-Core's helpers ---------------------------------------------------------------


def get_global_memory_buffer():
    """Megatron's scratch buffers (:class:`GlobalMemoryBuffer`), made by initialize."""
    if _state.memory_buffer is None:
        raise NotInitializedError(
            "fourd.parallel_state: the global memory buffer is not initialized"
        )
    return _state.memory_buffer


def _set_global_memory_buffer():
    if _state.memory_buffer is not None:
        raise InvalidArgumentError(
            "fourd.parallel_state: the global memory buffer is already initialized"
        )
    _state.memory_buffer = GlobalMemoryBuffer()


def destroy_global_memory_buffer():
    _state.memory_buffer = None


def get_all_ranks():
    """My tensor, GTP, data, context, pipeline and expert ranks, joined by '_'."""
    ranks = [
        get_tensor_model_parallel_rank(),
        get_gtp_weight_remat_rank(),
        get_data_parallel_rank(),
        get_context_parallel_rank(),
        get_pipeline_model_parallel_rank(),
        get_expert_model_parallel_rank(),
    ]
    return "_".join(str(r or 0) for r in ranks)


def get_nccl_options(pg_name, nccl_comm_cfgs):
    """None: fourd's groups are not NCCL communicators, so NCCL options do not apply."""
    return nccl_options(pg_name, nccl_comm_cfgs)


def create_group(
    ranks=None,
    timeout=None,
    backend=None,
    pg_options=None,
    use_local_synchronization=False,
    group_desc=None,
):
    """Megatron's helper: a new torch ProcessGroup over `ranks` (torch ranks; None = all), of
    fourd's torch backend unless `backend` is given. Collective over the whole world. NCCL
    pg_options and use_local_synchronization are not supported (they raise)."""
    if pg_options is not None:
        raise InvalidArgumentError(
            "pg_options: NCCL options do not apply to fourd's groups; expected None"
        )
    if use_local_synchronization:
        raise InvalidArgumentError("use_local_synchronization: not supported; expected False")
    if ranks is None:
        ranks = range(dist.get_world_size())
    tag = ("create_group", next(_group_tags))
    return new_torch_group(list(ranks), backend, timeout=timeout, desc=group_desc, tag=tag)


def create_hierarchical_groups(
    rank,
    ranks,
    hierarchical_group_sizes,
    create_gloo_process_groups=False,
    pg_options=None,
    timeout=None,
    group_desc=None,
):
    """Megatron's helper: for each level of `hierarchical_group_sizes` (innermost first), the
    torch groups of that level over `ranks`; returns (rank's group per level, its gloo group
    per level or None). Collective over the whole world."""
    groups, gloo_groups = [], []
    for level, lists in enumerate(
        hierarchical_rank_lists(list(ranks), list(hierarchical_group_sizes))
    ):
        desc = f"HIERARCHICAL_{group_desc}_L{level}"
        for sub in lists:
            pg = create_group(sub, timeout=timeout, group_desc=desc)
            gloo = None
            if create_gloo_process_groups:
                gloo = create_group(sub, timeout=timeout, backend="gloo", group_desc=desc + "_GLOO")
            if rank in sub:
                groups.append(pg)
                gloo_groups.append(gloo)
    return groups, gloo_groups


def create_hybrid_dp_cp_groups(rank, ranks, pg_options):
    """Megatron's helper: torch groups over consecutive blocks of `ranks` for each power of 2
    from 2 up to half their number; returns {size: rank's group}. Collective over the world."""
    out = {}
    for size in [2**i for i in range(int(math.log2(len(ranks))))][1:]:
        for i in range(0, len(ranks), size):
            block = list(ranks[i : i + size])
            pg = create_group(block, pg_options=pg_options, group_desc=f"HYBRID_DP_CP_GROUP_{size}")
            if rank in block:
                out[size] = pg
    return out


def create_all_gather_groups(for_expert_parallelism=False, timeout=None, nccl_comm_cfgs=None):
    """Megatron's helper: a data-parallel group with a communicator of its own, for all-gathers
    that overlap the reduce-scatters of the data-parallel group; returns (it, None) (there are
    no expert-parallel groups). Collective over the world."""
    if _state.grid is None:
        raise NotInitializedError(
            "create_all_gather_groups() requires parallel state to be initialized. "
            "Call initialize_model_parallel() first."
        )
    g = _state.grid
    family = families_along(g, _DATA)
    ag = make_group(
        g,
        _MASK_OBJS[_DATA],
        family,
        "data_parallel_all_gather",
        timeout=timeout or _state.torch_timeout,
        tag="all_gather",
    )
    return ag, None


def update_pg_timeout(timeout, pg=None):
    """Set the timeout of one torch group, or of the default group and every one fourd made,
    after a barrier on it (the default group when pg is None)."""
    set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if set_timeout is None:
        return
    dist.barrier(pg)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if pg is not None:
        set_timeout(timeout, pg._pg if isinstance(pg, Group) else pg)
        return
    targets = [None] + [
        p for p in _made_torch_groups.values() if p is not dist.GroupMember.NON_GROUP_MEMBER
    ]
    for p in targets:
        set_timeout(timeout, p)
