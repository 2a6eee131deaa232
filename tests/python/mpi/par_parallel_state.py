"""Multi-rank tests of fourd.parallel_state (Megatron getters, groups, torch groups from MPI) and
fourd.tensor_parallel (the mappings, forward and backward, against closed forms on
integer-valued data so every sum is exact)."""

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

import fourd
import fourd.parallel_state as ps
import fourd.tensor_parallel as tp

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()


def factorizations(n):
    return [
        (x, y, z, n // (x * y * z))
        for x in range(1, n + 1)
        for y in range(1, n + 1)
        for z in range(1, n + 1)
        if n % (x * y * z) == 0
    ]


GRIDS = factorizations(N)
ORDERS = ["x-y-z-data", "data-z-y-x", "z-x-data-y"]
CASES = [(g, ORDERS[i % len(ORDERS)]) for i, g in enumerate(GRIDS)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "x{}y{}z{}d{}-{}".format(*c[0], c[1]))
def grid(request):
    (x, y, z, d), order = request.param
    g = ps.initialize(x=x, y=y, z=z, data=d, order=order)
    yield g
    ps.destroy_model_parallel()


def members(g, axes):
    """World ranks sharing my coordinates on every axis not in `axes`, in group-rank order."""
    return g.ranks(axes)


# ---- parallel_state ------------------------------------------------------------------------


def test_megatron_getters(grid):
    g = grid
    c = g.coords()
    assert ps.model_parallel_is_initialized()
    tpg = ps.get_tensor_model_parallel_group()
    want_tp = [r for r in range(N) if g.coords(r)["data"] == c["data"]]
    assert sorted(tpg.ranks()) == want_tp
    assert tpg.ranks() == g.ranks(("x", "y", "z"))
    assert ps.get_tensor_model_parallel_world_size() == g.size("x") * g.size("y") * g.size("z")
    assert ps.get_tensor_model_parallel_rank() == tpg.ranks().index(ME)
    assert ps.get_tensor_model_parallel_src_rank() == tpg.ranks()[0]
    assert ps.get_model_parallel_group().ranks() == tpg.ranks()
    dpg = ps.get_data_parallel_group()
    want_dp = [r for r in range(N) if all(g.coords(r)[a] == c[a] for a in ("x", "y", "z"))]
    assert sorted(dpg.ranks()) == want_dp
    assert ps.get_data_parallel_world_size() == g.size("data")
    assert ps.get_data_parallel_rank() == c["data"]
    assert ps.get_data_parallel_src_rank() == dpg.ranks()[0]
    assert ps.get_data_parallel_group(with_context_parallel=True).ranks() == dpg.ranks()
    assert ps.get_tensor_and_data_parallel_group().size() == N
    for a in ("x", "y", "z"):
        grp = getattr(ps, f"get_{a}_parallel_group")()
        assert grp.ranks() == g.ranks(a)
        assert getattr(ps, f"get_{a}_parallel_rank")() == c[a]
        assert getattr(ps, f"get_{a}_parallel_world_size")() == g.size(a)
        assert grp.axes == (a,)
    assert ps.get_group(("z", "data")).ranks() == g.ranks(("z", "data"))
    assert ps.get_group(("data", "z")) is ps.get_group(("z", "data"))
    assert ps.get_pipeline_model_parallel_world_size() == 1
    assert ps.get_pipeline_model_parallel_rank() == 0
    assert ps.get_context_parallel_world_size() == 1
    assert ps.is_pipeline_first_stage() and ps.is_pipeline_last_stage()
    assert ps.get_grid() is g


def test_groups_in_fourd_collectives(grid):
    for grp in (
        ps.get_tensor_model_parallel_group(),
        ps.get_data_parallel_group(),
        ps.get_x_parallel_group(),
        ps.get_group(("z", "data")),
        ps.get_group("world"),
    ):
        t = torch.full((5,), float(ME + 1))
        fourd.all_reduce(t, grp)
        assert torch.equal(t, torch.full((5,), float(sum(r + 1 for r in grp.ranks()))))
        out = torch.empty(grp.size() * 2)
        grp.all_gather(out, torch.full((2,), float(ME)))
        assert out.tolist() == [float(r) for r in grp.ranks() for _ in range(2)]


def test_torch_groups_from_mpi(grid):
    # torch.distributed comes up from MPI on first use, no MASTER_ADDR needed
    for grp in (
        ps.get_tensor_model_parallel_group(),
        ps.get_data_parallel_group(),
        ps.get_x_parallel_group(),
        ps.get_y_parallel_group(),
        ps.get_z_parallel_group(),
        ps.get_group(("z", "data")),
        ps.get_group("world"),
    ):
        pg = grp.torch_group()
        assert dist.is_initialized()
        assert grp.torch_group() is pg
        assert dist.get_world_size(pg) == grp.size()
        assert dist.get_rank(pg) == grp.rank()
        assert dist.get_process_group_ranks(pg) == grp.ranks()
        t = torch.full((3,), float(ME + 1))
        dist.all_reduce(t, group=pg)
        assert torch.equal(t, torch.full((3,), float(sum(r + 1 for r in grp.ranks()))))
        lst = [torch.empty(1) for _ in range(grp.size())]
        dist.all_gather(lst, torch.tensor([float(ME)]), group=pg)
        assert [float(v) for v in lst] == [float(r) for r in grp.ranks()]


def test_lifecycle_and_errors():
    # pytest may run this between tests sharing a module-scoped grid: put it back afterwards
    prev = ps._state.grid
    if prev is not None:
        ps._state.owns_grid = False  # keep it alive through destroy_model_parallel()
        ps.destroy_model_parallel()
    try:
        _lifecycle()
    finally:
        if prev is not None:
            ps.initialize(grid=prev)
            ps._state.owns_grid = True


def _lifecycle():
    assert not ps.model_parallel_is_initialized()
    with pytest.raises(fourd.NotInitializedError, match="initialize"):
        ps.get_tensor_model_parallel_group()
    assert ps.get_tensor_model_parallel_group(check_initialized=False) is None
    g = fourd.init(x=N, data=1)
    ps.initialize(grid=g)
    try:
        assert ps.get_x_parallel_world_size() == N
        with pytest.raises(fourd.InvalidArgumentError, match="already"):
            ps.initialize(x=1)
    finally:
        ps.destroy_model_parallel()
    with pytest.raises(fourd.InvalidArgumentError, match="either an existing grid or grid sizes"):
        ps.initialize(x=2, grid=g)
    ps.initialize_model_parallel(tensor_model_parallel_size=2 if N % 2 == 0 else 1)
    try:
        assert ps.get_tensor_model_parallel_world_size() == (2 if N % 2 == 0 else 1)
        assert ps.get_x_parallel_world_size() == ps.get_tensor_model_parallel_world_size()
    finally:
        ps.destroy_model_parallel()
    with pytest.raises(fourd.InvalidArgumentError, match="pipeline"):
        ps.initialize_model_parallel(1, pipeline_model_parallel_size=2)


# ---- tensor_parallel -------------------------------------------------------------------------

GROUPS = [None, "x", "y", ("z", "data"), "world"]


def _group(spec):
    return ps.get_tensor_model_parallel_group() if spec is None else ps.get_group(spec)


@pytest.mark.parametrize("spec", GROUPS, ids=lambda s: str(s))
def test_mappings(grid, spec):
    grp = _group(spec)
    P, r = grp.size(), grp.rank()
    val = [float(q + 1) for q in grp.ranks()]  # rank q's value (q+1)
    me = float(ME + 1)
    total = sum(val)

    # copy_to: forward identity, backward all-reduce
    x = torch.full((2, 3), 2.0, requires_grad=True)
    y = tp.copy_to_tensor_model_parallel_region(x, group=spec)
    assert torch.equal(y, x)
    y.backward(torch.full((2, 3), me))
    assert torch.equal(x.grad, torch.full((2, 3), total))

    # reduce_from: forward all-reduce, backward identity (input untouched)
    x = torch.full((2, 3), me, requires_grad=True)
    y = tp.reduce_from_tensor_model_parallel_region(x, group=spec)
    assert torch.equal(y, torch.full((2, 3), total)) and torch.equal(x, torch.full((2, 3), me))
    y.backward(torch.full((2, 3), 3.0))
    assert torch.equal(x.grad, torch.full((2, 3), 3.0))

    # scatter_to (last dim) / gather_from (last dim)
    full = torch.arange(4 * 3 * P, dtype=torch.float32).view(4, 3 * P)
    x = full.clone().requires_grad_(True)
    y = tp.scatter_to_tensor_model_parallel_region(x, group=spec)
    assert torch.equal(y, full[:, 3 * r : 3 * r + 3])
    y.backward(torch.full((4, 3), me))
    assert torch.equal(x.grad, torch.tensor(val).repeat_interleave(3).expand(4, 3 * P))

    x = torch.full((4, 2), me, requires_grad=True)
    y = tp.gather_from_tensor_model_parallel_region(x, group=spec)
    assert torch.equal(y, torch.tensor(val).repeat_interleave(2).expand(4, 2 * P))
    y.backward(full[:, : 2 * P].contiguous())
    assert torch.equal(x.grad, full[:, 2 * r : 2 * r + 2])

    # sequence parallel (first dim)
    full = torch.arange(2 * P * 3, dtype=torch.float32).view(2 * P, 3)
    x = full.clone().requires_grad_(True)
    y = tp.scatter_to_sequence_parallel_region(x, group=spec)
    assert torch.equal(y, full[2 * r : 2 * r + 2])
    y.backward(torch.full((2, 3), me))
    assert torch.equal(x.grad, torch.tensor(val).repeat_interleave(2)[:, None].expand(2 * P, 3))

    for reduce_grad in (True, False):
        x = torch.full((2, 3), me, requires_grad=True)
        y = tp.gather_from_sequence_parallel_region(x, reduce_grad, group=spec)
        assert torch.equal(y, torch.tensor(val).repeat_interleave(2)[:, None].expand(2 * P, 3))
        y.backward(full * me)
        exp = full[2 * r : 2 * r + 2] * (total if reduce_grad else me)
        assert torch.equal(x.grad, exp)

    x = (full * me).requires_grad_(True)
    y = tp.reduce_scatter_to_sequence_parallel_region(x, group=spec)
    assert torch.equal(y, full[2 * r : 2 * r + 2] * total)
    y.backward(torch.full((2, 3), me))
    assert torch.equal(x.grad, torch.tensor(val).repeat_interleave(2)[:, None].expand(2 * P, 3))

    # last-dim all-gather / reduce-scatter pair
    x = torch.full((3, 2), me, requires_grad=True)
    y = tp.all_gather_last_dim_from_tensor_parallel_region(x, group=spec)
    assert torch.equal(y, torch.tensor(val).repeat_interleave(2).expand(3, 2 * P))
    g2 = torch.arange(3 * 2 * P, dtype=torch.float32).view(3, 2 * P)
    y.backward(g2 * me)
    assert torch.equal(x.grad, g2[:, 2 * r : 2 * r + 2] * total)

    x = (g2 * me).requires_grad_(True)
    y = tp.reduce_scatter_last_dim_to_tensor_parallel_region(x, group=spec)
    assert torch.equal(y, g2[:, 2 * r : 2 * r + 2] * total)
    y.backward(torch.full((3, 2), me))
    assert torch.equal(x.grad, torch.tensor(val).repeat_interleave(2).expand(3, 2 * P))


def test_mapping_group_objects_axes_and_noop(grid):
    # a Group, an axis name and a tuple all name the same group
    for spec in (ps.get_group(("z", "data")), ("data", "z"), "z+data"):
        x = torch.full((2,), float(ME + 1))
        y = tp.reduce_from_tensor_model_parallel_region(x, group=spec)
        assert float(y[0]) == sum(q + 1 for q in grid.ranks(("z", "data")))
    # a group of one rank: every mapping returns its input itself
    one = [a for a in ("x", "y", "z", "data") if grid.size(a) == 1]
    for a in one:
        x = torch.ones(4, 4, requires_grad=True)
        for fn in (
            tp.copy_to_tensor_model_parallel_region,
            tp.reduce_from_tensor_model_parallel_region,
            tp.scatter_to_tensor_model_parallel_region,
            tp.gather_from_tensor_model_parallel_region,
            tp.scatter_to_sequence_parallel_region,
            tp.gather_from_sequence_parallel_region,
            tp.reduce_scatter_to_sequence_parallel_region,
        ):
            assert fn(x, group=a) is x


def test_mapping_errors(grid):
    big = [a for a in ("x", "y", "z", "data", "world") if grid.size(a) > 1]
    for a in big:
        P = grid.size(a)
        bad = torch.ones(P + 1, P + 1)
        with pytest.raises(fourd.InvalidArgumentError, match="last dimension to be divisible"):
            tp.scatter_to_tensor_model_parallel_region(bad, group=a)
        with pytest.raises(fourd.InvalidArgumentError, match="first dimension to be divisible"):
            tp.scatter_to_sequence_parallel_region(bad, group=a)
        with pytest.raises(fourd.InvalidArgumentError, match="first dimension to be divisible"):
            tp.reduce_scatter_to_sequence_parallel_region(bad, group=a)
        with pytest.raises(fourd.InvalidArgumentError, match="last dimension to be divisible"):
            tp.reduce_scatter_last_dim_to_tensor_parallel_region(bad, group=a)
    with pytest.raises(fourd.InvalidArgumentError, match="axis"):
        tp.copy_to_tensor_model_parallel_region(torch.ones(2), group="w")
