"""Multi-rank tests of fourd.parallel_state as a drop-in for Megatron-Core's parallel_state
(megatron-core 0.19.2), against Megatron's own module and torch layers on the same ranks:

- parity: every group (its torch ranks, size and my rank in it), rank, world size, source
  rank, pipeline neighbour and flag that Megatron's getters give equals fourd's, for every
  tensor-parallel size, every split of it over x, y and z, and two orders;
- the groups work in torch.distributed calls as they are;
- with fourd's module in Megatron's place (``use_in_megatron``), Megatron's own
  ``initialize_model_parallel`` and tensor-parallel mappings, forward and backward, equal
  fourd.tensor_parallel's on integer-valued data;
- Megatron's ColumnParallelLinear and RowParallelLinear, given no tp_group, are sharded over
  fourd's tensor-parallel group and equal the unsharded layer (also with sequence parallelism).

CPU shim: Megatron's mappings and layers allocate on ``torch.cuda.current_device()``; this
file makes that return "cpu" (``torch.cuda.current_device = lambda: "cpu"``) before Megatron is
imported. Nothing else of Megatron is changed. Integer-valued inputs and weights keep every
sum exact, so results are compared with torch.equal.
"""

import importlib
import warnings

import pytest
import torch

torch.cuda.current_device = lambda: "cpu"  # the CPU shim (see above)
warnings.filterwarnings("ignore", module="megatron")  # its imports warn about missing extras
warnings.filterwarnings("ignore", message=".*torch.jit.script_method. is deprecated")

import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402

import fourd  # noqa: E402
import fourd.parallel_state as ps  # noqa: E402
import fourd.tensor_parallel as ftp  # noqa: E402

# Megatron's own parallel_state, kept before anything puts fourd's in its place.
mps = importlib.import_module("megatron.core.parallel_state")

# Megatron asks for tp_group= (its layers and mappings warn when it comes from parallel_state,
# which is the case under test), and torch calls all_gather_into_tensor deprecated.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:When using async grad allreduce:UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

torch.set_num_threads(1)
N = MPI.COMM_WORLD.Get_size()
ME = MPI.COMM_WORLD.Get_rank()
TP_SIZES = [t for t in range(1, N + 1) if N % t == 0]
ORDERS = ["tp-cp-ep-dp-pp", "dp-tp"]


def splits(tp):
    """Every (x, y, z) with x*y*z = tp."""
    return [
        (x, y, tp // (x * y))
        for x in range(1, tp + 1)
        for y in range(1, tp + 1)
        if tp % (x * y) == 0
    ]


@pytest.fixture(scope="module", autouse=True)
def torch_world():
    """torch.distributed up from MPI (fourd's way: no MASTER_ADDR), for Megatron's module."""
    g = fourd.init()
    ps.init_torch_distributed(g)
    yield
    if ps.is_initialized():
        ps.destroy_model_parallel()


# ---- parity with Megatron's own module ------------------------------------------------------

GETTERS = [
    ("get_tensor_model_parallel_group", {}),
    ("get_tensor_model_parallel_group", {"check_initialized": False}),
    ("get_model_parallel_group", {}),
    ("get_gtp_weight_remat_group", {}),
    ("get_pipeline_model_parallel_group", {}),
    ("get_data_parallel_group", {}),
    ("get_data_parallel_group", {"with_context_parallel": True}),
    ("get_data_parallel_group", {"with_gtp_remat": False}),
    ("get_data_parallel_group", {"with_context_parallel": True, "partial_data_parallel": True}),
    ("get_data_parallel_group_gloo", {}),
    ("get_data_parallel_group_gloo", {"with_context_parallel": True}),
    (
        "get_data_parallel_group_gloo",
        {"with_context_parallel": True, "partial_data_parallel": True},
    ),
    ("get_context_parallel_group", {}),
    ("get_context_parallel_global_ranks", {}),
    ("get_hierarchical_context_parallel_groups", {"check_initialized": False}),
    ("get_embedding_group", {}),
    ("get_position_embedding_group", {}),
    ("get_amax_reduction_group", {}),
    ("get_amax_reduction_group", {"with_context_parallel": True}),
    ("get_amax_reduction_group", {"tp_only_amax_red": True}),
    ("get_amax_reduction_group", {"with_context_parallel": True, "tp_only_amax_red": True}),
    ("get_tensor_and_data_parallel_group", {}),
    ("get_tensor_and_data_parallel_group", {"with_context_parallel": True}),
    ("get_tensor_and_context_parallel_group", {}),
    ("get_tensor_model_parallel_world_size", {}),
    ("get_tensor_model_parallel_rank", {}),
    ("get_pipeline_model_parallel_world_size", {}),
    ("get_pipeline_model_parallel_rank", {}),
    ("is_pipeline_first_stage", {}),
    ("is_pipeline_first_stage", {"ignore_virtual": False, "vp_stage": 0}),
    ("is_pipeline_last_stage", {}),
    ("is_pipeline_last_stage", {"ignore_virtual": False, "vp_stage": 0}),
    ("is_rank_in_embedding_group", {}),
    ("is_rank_in_embedding_group", {"ignore_virtual": False, "vp_stage": 0}),
    ("is_rank_in_position_embedding_group", {}),
    ("get_virtual_pipeline_model_parallel_rank", {}),
    ("get_virtual_pipeline_model_parallel_world_size", {}),
    ("get_tensor_model_parallel_src_rank", {}),
    ("get_model_parallel_src_rank", {}),
    ("get_data_parallel_src_rank", {}),
    ("get_data_parallel_src_rank", {"with_context_parallel": True}),
    ("get_pipeline_model_parallel_first_rank", {}),
    ("get_pipeline_model_parallel_last_rank", {}),
    ("get_pipeline_model_parallel_next_rank", {}),
    ("get_pipeline_model_parallel_prev_rank", {}),
    ("get_data_parallel_world_size", {}),
    ("get_data_parallel_world_size", {"with_context_parallel": True, "with_gtp_remat": False}),
    ("get_data_parallel_rank", {}),
    ("get_data_parallel_rank", {"with_context_parallel": True, "partial_data_parallel": True}),
    ("get_context_parallel_world_size", {}),
    ("get_context_parallel_rank", {}),
    ("get_tensor_and_context_parallel_world_size", {}),
    ("get_tensor_and_context_parallel_rank", {}),
    ("get_gtp_weight_remat_world_size", {}),
    ("get_gtp_weight_remat_rank", {}),
    ("get_gtp_weight_remat_global_ranks", {}),
    ("get_expert_gtp_weight_remat_group", {}),
    ("get_expert_gtp_weight_remat_world_size", {}),
    ("get_expert_gtp_weight_remat_rank", {}),
    ("get_expert_gtp_weight_remat_global_ranks", {}),
    ("get_expert_model_parallel_group", {}),
    ("get_expert_model_parallel_src_rank", {}),
    ("get_expert_model_parallel_world_size", {}),
    ("get_expert_model_parallel_rank", {}),
    ("get_expert_tensor_parallel_group", {}),
    ("get_expert_tensor_parallel_world_size", {}),
    ("get_expert_tensor_parallel_rank", {}),
    ("get_expert_tensor_and_model_parallel_group", {}),
    ("get_expert_tensor_and_model_parallel_world_size", {}),
    ("get_expert_tensor_and_model_parallel_rank", {}),
    ("get_expert_tensor_model_pipeline_parallel_group", {}),
    ("get_expert_tensor_model_pipeline_parallel_group", {"with_egtp_remat": True}),
    ("get_expert_data_parallel_group", {}),
    ("get_expert_data_parallel_group", {"with_gtp_remat": False}),
    ("get_expert_data_parallel_group", {"partial_expert_data_parallel": True}),
    ("get_expert_data_parallel_group_gloo", {}),
    ("get_expert_data_parallel_group_gloo", {"partial_expert_data_parallel": True}),
    ("get_expert_data_parallel_rank", {}),
    ("get_expert_data_parallel_world_size", {"with_gtp_remat": False}),
    ("get_intra_distributed_optimizer_instance_group", {}),
    ("get_inter_distributed_optimizer_instance_group", {"check_initialized": False}),
    ("get_all_ranks", {}),
    ("is_initialized", {}),
    ("model_parallel_is_initialized", {}),
]


def _plain(value):
    """A getter's answer in comparable form: a process group as (its torch ranks in group-rank
    order, its size, my rank in it)."""
    if isinstance(value, dist.ProcessGroup):
        return ("group", dist.get_process_group_ranks(value), value.size(), value.rank())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def answers(module):
    out = {}
    for name, kw in GETTERS:
        out[(name, tuple(sorted(kw.items())))] = _plain(getattr(module, name)(**kw))
    dp = module.get_data_parallel_world_size(with_context_parallel=True)
    key = ("get_hybrid_data_context_parallel_groups", "group_size=dp")
    out[key] = _plain(module.get_hybrid_data_context_parallel_groups(group_size=dp))
    buf = module.get_global_memory_buffer().get_tensor((2, 3), torch.float32, "parity")
    out[("get_global_memory_buffer", "get_tensor")] = (tuple(buf.shape), buf.dtype)
    return out


def megatron_answers(tp, order):
    mps.initialize_model_parallel(tp, order=order)
    try:
        return answers(mps)
    finally:
        mps.destroy_model_parallel()


def assert_same(ours, theirs, what):
    diff = [(k, ours[k], theirs[k]) for k in theirs if ours.get(k) != theirs[k]]
    assert not diff, f"{what}: fourd differs from Megatron on {len(diff)} calls: {diff[:5]}"
    assert set(ours) == set(theirs)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_parity_with_megatron(tp):
    theirs = megatron_answers(tp, "tp-cp-ep-dp-pp")
    for x, y, z in splits(tp):  # fourd's own entry point, every split of tp over the axes
        ps.initialize(x=x, y=y, z=z, data=N // tp)
        try:
            assert ps.get_grid().order == "x-y-z-data"
            assert_same(answers(ps), theirs, f"initialize(x={x}, y={y}, z={z})")
        finally:
            ps.destroy_model_parallel()
    # Megatron's entry point, its positional and keyword arguments as Megatron's callers pass
    ps.initialize_model_parallel(
        tp,
        1,
        None,
        None,
        False,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        distributed_timeout_minutes=10,
        order="tp-cp-ep-dp-pp",
    )
    try:
        assert_same(answers(ps), theirs, f"initialize_model_parallel({tp})")
    finally:
        ps.destroy_model_parallel()


@pytest.mark.parametrize("tp", [t for t in TP_SIZES if 1 < t < N])
def test_parity_with_megatron_in_another_order(tp):
    """Megatron's "dp-tp" puts data-parallel peers next to each other: fourd's data-x-y-z."""
    theirs = megatron_answers(tp, "dp-tp")
    ps.initialize_model_parallel(tp, order="dp-tp")
    try:
        assert ps.get_grid().order == "data-x-y-z"
        assert_same(answers(ps), theirs, f"initialize_model_parallel({tp}, order='dp-tp')")
    finally:
        ps.destroy_model_parallel()


# ---- the groups in torch.distributed calls --------------------------------------------------


@pytest.fixture
def mp_state():
    tp = 2 if N % 2 == 0 else 1
    ps.initialize_model_parallel(tp)
    yield tp
    ps.destroy_model_parallel()


def test_groups_in_torch_calls(mp_state):
    for grp in (
        ps.get_tensor_model_parallel_group(),
        ps.get_data_parallel_group(),
        ps.get_pipeline_model_parallel_group(),
        ps.get_amax_reduction_group(),
        ps.get_data_parallel_group_gloo(),
    ):
        ranks = grp.ranks()
        assert isinstance(grp, dist.ProcessGroup)
        assert dist.get_process_group_ranks(grp) == ranks
        assert (dist.get_rank(grp), dist.get_world_size(grp)) == (grp.rank(), grp.size())
        t = torch.full((3,), float(ME + 1))
        dist.all_reduce(t, group=grp)
        assert torch.equal(t, torch.full((3,), float(sum(r + 1 for r in ranks))))
        out = torch.empty(2 * grp.size())
        dist.all_gather_into_tensor(out, torch.full((2,), float(ME)), group=grp)
        assert out.tolist() == [float(r) for r in ranks for _ in range(2)]
        rs = torch.empty(1)
        dist.reduce_scatter_tensor(rs, torch.arange(float(grp.size())), group=grp)
        assert rs.item() == float(grp.rank() * grp.size())
        b = torch.full((2,), float(ME))
        dist.broadcast(b, src=ranks[-1], group=grp)
        assert b.tolist() == [float(ranks[-1])] * 2
        dist.barrier(group=grp)
        objs = [None] * grp.size()
        dist.all_gather_object(objs, {"rank": ME}, group=grp)
        assert objs == [{"rank": r} for r in ranks]
        fourd.all_reduce(t, group=grp)  # and fourd's collectives take the same object
        assert t[0].item() == float(sum(r + 1 for r in ranks)) * grp.size()


def test_unsupported_sizes_raise_on_every_rank():
    for kw, arg in (
        ({"context_parallel_size": 2}, "context_parallel_size"),
        ({"expert_model_parallel_size": 2}, "expert_model_parallel_size"),
        ({"pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size"),
        ({"virtual_pipeline_model_parallel_size": 2}, "virtual_pipeline_model_parallel_size"),
        ({"num_distributed_optimizer_instances": 2}, "num_distributed_optimizer_instances"),
        ({"gtp_remat_size": 2}, "gtp_remat_size"),
    ):
        with pytest.raises(fourd.InvalidArgumentError, match=arg):
            ps.initialize_model_parallel(1, **kw)
    assert not ps.is_initialized()


# ---- Megatron's own code on fourd's module ---------------------------------------------------


@pytest.fixture(scope="module")
def megatron():
    """fourd's parallel_state in Megatron's place (Megatron was imported above, so its modules
    are rebound), then Megatron's layers and mappings."""
    ps.use_in_megatron()
    core = importlib.import_module("megatron.core")
    layers = importlib.import_module("megatron.core.tensor_parallel.layers")
    mappings = importlib.import_module("megatron.core.tensor_parallel.mappings")
    config = importlib.import_module("megatron.core.model_parallel_config")
    utils = importlib.import_module("megatron.core.utils")
    assert core.parallel_state is ps and core.mpu is ps and utils.parallel_state is ps
    assert mappings.get_global_memory_buffer is ps.get_global_memory_buffer
    return layers, mappings, config


def test_initialize_rebinds_megatron_modules_left_on_megatrons_own(megatron):
    """A Megatron module still bound to Megatron's own parallel_state (fourd's put in its place
    by hand, after the import) would see it uninitialised and build unsharded layers:
    initialize rebinds it."""
    utils = importlib.import_module("megatron.core.utils")
    utils.parallel_state = mps
    ps.initialize()
    try:
        assert utils.parallel_state is ps
    finally:
        ps.destroy_model_parallel()


@pytest.fixture(params=TP_SIZES, ids=lambda t: f"tp{t}")
def megatron_tp(request, megatron):
    tp = request.param
    import megatron.core.parallel_state as installed

    assert installed is ps
    installed.initialize_model_parallel(tp)  # Megatron's call, answered by fourd
    yield (tp, *megatron)
    ps.destroy_model_parallel()


def test_megatron_process_group_collection_from_fourd(megatron_tp):
    """Megatron's ProcessGroupCollection.use_mpu_process_groups() reads every group from
    parallel_state, here fourd's."""
    pgc_module = importlib.import_module("megatron.core.process_groups_config")
    pgc = pgc_module.ProcessGroupCollection.use_mpu_process_groups()
    assert pgc.tp is ps.get_tensor_model_parallel_group()
    assert pgc.dp is ps.get_data_parallel_group()
    assert pgc.pp is ps.get_pipeline_model_parallel_group()
    assert pgc.inter_dist_opt is None


def _grad_pair(fn_a, fn_b, x, dy):
    """(output, input gradient) of fn_a and of fn_b on copies of x, for output gradient dy."""
    results = []
    for fn in (fn_a, fn_b):
        xi = x.clone().requires_grad_(True)
        y = fn(xi)
        y.backward(dy(y))
        results.append((y.detach(), xi.grad))
    return results


MAPPINGS = [  # Megatron's name, its fourd.tensor_parallel twin, a tensor of the right shape
    ("copy_to_tensor_model_parallel_region", (4, 3)),
    ("reduce_from_tensor_model_parallel_region", (4, 3)),
    ("scatter_to_tensor_model_parallel_region", (3, 4)),
    ("gather_from_tensor_model_parallel_region", (3, 2)),
    ("scatter_to_sequence_parallel_region", (4, 3)),
    ("gather_from_sequence_parallel_region", (2, 3)),
    ("reduce_scatter_to_sequence_parallel_region", (4, 3)),
    ("all_gather_last_dim_from_tensor_parallel_region", (3, 2)),
    ("reduce_scatter_last_dim_to_tensor_parallel_region", (3, 4)),
]


def test_megatron_mappings_on_fourd(megatron_tp):
    tp, _layers, mappings, _config = megatron_tp
    for name, (rows, cols) in MAPPINGS:
        rows, cols = (rows * tp, cols) if "sequence" in name else (rows, cols * tp)
        x = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols) + ME

        def dy(y):
            return torch.arange(y.numel(), dtype=torch.float32).view_as(y) * (ME + 1)

        (ym, gm), (yf, gf) = _grad_pair(getattr(mappings, name), getattr(ftp, name), x, dy)
        assert torch.equal(ym, yf), name
        assert torch.equal(gm, gf), name
    # sequence parallelism through Megatron's global memory buffer
    x = torch.full((2, 3), float(ME))
    y = mappings.gather_from_sequence_parallel_region(x, use_global_buffer=True)
    ranks = ps.get_tensor_model_parallel_group().ranks()
    assert y.tolist() == [[float(r)] * 3 for r in ranks for _ in range(2)]
    # all-to-all: block j of my input goes to group rank j
    grp = ps.get_tensor_model_parallel_group()
    x = torch.stack([torch.full((2,), float(10 * ME + j)) for j in range(tp)]).view(2 * tp, 1)
    y = mappings.all_to_all(grp, x.view(2 * tp))
    assert y.tolist() == [float(10 * r + grp.rank()) for r in ranks for _ in range(2)]


def _config(config_module, tp, sequence_parallel=False):
    return config_module.ModelParallelConfig(
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
        gradient_accumulation_fusion=False,
    )


def _ints(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).float()


def test_megatron_linear_layers_sharded_like_unsharded(megatron_tp):
    tp, layers, _mappings, config = megatron_tp
    r = ps.get_tensor_model_parallel_rank()
    hidden, ffn = 6, 4 * tp
    w1, b1, w2, b2 = (
        _ints(ffn, hidden, seed=1),
        _ints(ffn, seed=2),
        _ints(hidden, ffn, seed=3),
        _ints(hidden, seed=4),
    )
    cfg = _config(config, tp)
    col = layers.ColumnParallelLinear(
        hidden, ffn, config=cfg, init_method=torch.nn.init.zeros_, bias=True, gather_output=False
    )
    row = layers.RowParallelLinear(
        ffn,
        hidden,
        config=cfg,
        init_method=torch.nn.init.zeros_,
        bias=True,
        input_is_parallel=True,
        skip_bias_add=False,
    )
    # no tp_group given: both took fourd's tensor-parallel group and are sharded over it
    assert col.tp_group is ps.get_tensor_model_parallel_group()
    assert row.tp_group is ps.get_tensor_model_parallel_group()
    assert col.output_size_per_partition == ffn // tp
    assert row.input_size_per_partition == ffn // tp
    c = ffn // tp
    with torch.no_grad():
        col.weight.copy_(w1[r * c : (r + 1) * c])
        col.bias.copy_(b1[r * c : (r + 1) * c])
        row.weight.copy_(w2[:, r * c : (r + 1) * c])
        row.bias.copy_(b2)
    x = _ints(4, 2, hidden, seed=5)
    full = [t.clone().requires_grad_(True) for t in (w1, b1, w2, b2)]
    xr = x.clone().requires_grad_(True)
    ref = torch.nn.functional.linear(
        torch.relu(torch.nn.functional.linear(xr, full[0], full[1])), full[2], full[3]
    )
    xs = x.clone().requires_grad_(True)
    h, _ = col(xs)
    out, _ = row(torch.relu(h))
    assert torch.equal(out, ref.detach())
    dy = _ints(*ref.shape, seed=6)
    ref.backward(dy)
    out.backward(dy)
    assert torch.equal(xs.grad, xr.grad)
    assert torch.equal(col.weight.grad, full[0].grad[r * c : (r + 1) * c])
    assert torch.equal(col.bias.grad, full[1].grad[r * c : (r + 1) * c])
    assert torch.equal(row.weight.grad, full[2].grad[:, r * c : (r + 1) * c])
    assert torch.equal(row.bias.grad, full[3].grad)


def test_megatron_column_layer_gathers_output(megatron_tp):
    tp, layers, _mappings, config = megatron_tp
    r = ps.get_tensor_model_parallel_rank()
    w, b = _ints(3 * tp, 5, seed=7), _ints(3 * tp, seed=8)
    col = layers.ColumnParallelLinear(
        5,
        3 * tp,
        config=_config(config, tp),
        init_method=torch.nn.init.zeros_,
        bias=True,
        gather_output=True,
    )
    with torch.no_grad():
        col.weight.copy_(w[3 * r : 3 * r + 3])
        col.bias.copy_(b[3 * r : 3 * r + 3])
    x = _ints(2, 3, 5, seed=9)
    out, _ = col(x)
    assert torch.equal(out, torch.nn.functional.linear(x, w, b))


# sequence parallelism needs a tensor-parallel size above 1
@pytest.mark.parametrize("megatron_tp", [t for t in TP_SIZES if t > 1], indirect=True)
def test_megatron_layers_with_sequence_parallelism(megatron_tp):
    tp, layers, _mappings, config = megatron_tp
    r = ps.get_tensor_model_parallel_rank()
    hidden, ffn, seq = 4, 2 * tp, 2 * tp
    w1, w2 = _ints(ffn, hidden, seed=11), _ints(hidden, ffn, seed=12)
    cfg = _config(config, tp, sequence_parallel=True)
    col = layers.ColumnParallelLinear(
        hidden, ffn, config=cfg, init_method=torch.nn.init.zeros_, bias=False, gather_output=False
    )
    row = layers.RowParallelLinear(
        ffn,
        hidden,
        config=cfg,
        init_method=torch.nn.init.zeros_,
        bias=False,
        input_is_parallel=True,
        skip_bias_add=False,
    )
    c = ffn // tp
    with torch.no_grad():
        col.weight.copy_(w1[r * c : (r + 1) * c])
        row.weight.copy_(w2[:, r * c : (r + 1) * c])
    x = _ints(seq, 3, hidden, seed=13)  # [sequence, batch, hidden]; I hold sequence rows r*2..
    rows = slice(r * (seq // tp), (r + 1) * (seq // tp))
    xs = x[rows].clone().requires_grad_(True)
    h, _ = col(xs)
    out, _ = row(h)
    xr = x.clone().requires_grad_(True)
    ref = torch.nn.functional.linear(torch.nn.functional.linear(xr, w1), w2)
    assert torch.equal(out, ref[rows].detach())
    dy = _ints(*ref.shape, seed=14)
    ref.backward(dy)
    out.backward(dy[rows])
    assert torch.equal(xs.grad, xr.grad[rows])
