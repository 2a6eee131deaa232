"""torch.distributed on backend "fourd", against gloo on the same ranks and inputs (real torch
code, integer-valued data so every sum is exact): every collective torch routes to a backend,
sync and async, on the world, on grid axes and on arbitrary groups; the Work API; pipeline
send/recv; DDP (with and without a bf16 compression hook), FSDP2, DeviceMesh and DTensor; the
ways of starting it (plain under mpiexec, env://, fourd://, a device map); bad input and a rank
that skips a collective. Run under mpiexec by tests/python/test_torch_backend.py (2 and 4
ranks)."""

import datetime
import socket
import time

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

import fourd
import fourd.distributed as fdist

N = MPI.COMM_WORLD.Get_size()
ME = MPI.COMM_WORLD.Get_rank()
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
TIMEOUT = datetime.timedelta(seconds=120)


def values(rank, count, dtype=torch.float32, offset=0, small=False):
    """Per-rank integers 1..4 (1..2 with `small`, for products), exact in every dtype."""
    i = torch.arange(offset, offset + count)
    v = (rank + 1 + i) % 2 + 1 if small else (rank + 1 + i % 3) % 4 + 1
    return v.to(dtype)


def no_master_env(monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def world_sum_check():
    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert (t == N * (N + 1) / 2).all(), t


# ---- starting it -----------------------------------------------------------------------------


def test_plain_init_under_mpiexec(monkeypatch):
    no_master_env(monkeypatch)
    dist.init_process_group("fourd")
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (ME, N)
        assert dist.get_backend() == "fourd"
        assert isinstance(dist.group.WORLD, fdist.ProcessGroup)
        world_sum_check()
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        assert store.host == "127.0.0.1"  # every rank on this host: the store on loopback
    finally:
        dist.destroy_process_group()


def test_a_rank_other_than_mpis_raises_on_every_rank(monkeypatch):
    no_master_env(monkeypatch)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank"):
        dist.init_process_group("fourd", rank=0, world_size=N)
    assert not dist.is_initialized() and time.monotonic() - t0 < 20


def test_fourd_url(monkeypatch):
    no_master_env(monkeypatch)
    dist.init_process_group("fourd", init_method="fourd://", timeout=TIMEOUT)
    try:
        world_sum_check()
    finally:
        dist.destroy_process_group()


def test_env_init_with_torch_ranks_not_mpi_ranks(monkeypatch):
    """The usual env:// path (torch's own handler); torch ranks numbered backwards from MPI's:
    the backend's grid follows torch's numbering."""
    port = None
    if ME == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = MPI.COMM_WORLD.bcast(port, root=0)
    rank = N - 1 - ME
    for var, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port), ("RANK", rank)):
        monkeypatch.setenv(var, str(value))
    monkeypatch.setenv("WORLD_SIZE", str(N))
    dist.init_process_group("fourd")
    try:
        assert dist.get_rank() == rank
        t = torch.full((4,), float(rank))
        dist.broadcast(t, 0)
        assert (t == 0).all()
        x = torch.zeros(N)
        x[rank] = rank + 1
        dist.all_reduce(x)
        assert x.tolist() == [r + 1.0 for r in range(N)]
    finally:
        dist.destroy_process_group()


def test_device_map(monkeypatch):
    no_master_env(monkeypatch)
    dist.init_process_group("cpu:fourd,cuda:nccl")
    try:
        assert "cpu:fourd" in dist.get_backend_config()
        assert isinstance(dist.group.WORLD, fdist.ProcessGroup)
        world_sum_check()
    finally:
        dist.destroy_process_group()


def test_mismatched_counts_with_debug_raise_on_every_rank(monkeypatch):
    """FOURD_DEBUG=1 at init: ranks that call all_reduce with different counts all raise
    torch's DistBackendError with fourd's MismatchError as the cause."""
    no_master_env(monkeypatch)
    monkeypatch.setenv("FOURD_DEBUG", "1")
    dist.init_process_group("fourd", timeout=datetime.timedelta(seconds=20))
    try:
        t = torch.ones(10 if ME == 0 else 11)
        with pytest.raises(dist.DistBackendError) as info:
            dist.all_reduce(t)
        assert isinstance(info.value, fourd.Error)
        assert isinstance(info.value.__cause__, fourd.MismatchError)
        assert "count 10" in str(info.value) and "count 11" in str(info.value)
    finally:
        dist.destroy_process_group()


# ---- the world of the rest: a user's grid, adopted ------------------------------------------


@pytest.fixture(scope="module")
def world():
    """init_process_group("fourd") over a grid made first (x = 2, data = N / 2): the backend
    adopts it, so groups of grid axes use the grid's own communicators. gloo groups of the
    same ranks are the oracle."""
    grid = fourd.init(x=2, data=N // 2)
    dist.init_process_group("fourd", timeout=TIMEOUT)
    groups = {"world": (dist.group.WORLD, dist.new_group(backend="gloo"), list(range(N)))}
    layouts = {
        "x": [grid.ranks("x")] if N == 2 else [[0, 1], [2, 3]],
        "data": [[r] for r in range(N)] if N == 2 else [[0, 2], [1, 3]],
        "reversed": [list(reversed(range(N)))],
        "pairs": [[3, 0], [2, 1]] if N == 4 else [[1, 0]],  # not axes; every rank in one
    }
    for name, lists in layouts.items():
        for ranks in lists:
            f = dist.new_group(ranks, sort_ranks=False)
            g = dist.new_group(ranks, backend="gloo", sort_ranks=False)
            if ME in ranks:
                groups[name] = (f, g, ranks)
    yield grid, groups
    dist.destroy_process_group()
    fourd.finalize()


GROUPS = ["world", "x", "data", "reversed", "pairs"]


def test_groups_map_onto_grid_axes(world):
    grid, groups = world
    assert dist.group.WORLD.fourd_axis.communicator.world_ranks == list(range(N))
    assert groups["x"][0].fourd_axis.communicator.name == "x"
    if N == 4:
        assert groups["data"][0].fourd_axis.communicator.name == "data"
        assert groups["pairs"][0].fourd_axis.ranks == ((3, 0) if ME in (0, 3) else (2, 1))
    rev = groups["reversed"][0]
    assert rev.fourd_axis.ranks == tuple(reversed(range(N)))
    assert dist.get_rank(rev) == N - 1 - ME
    # fourd's own collectives take the torch group.
    t = torch.full((2,), float(ME))
    fourd.all_reduce(t, group=rev)
    assert (t == N * (N - 1) / 2).all()


@pytest.fixture()
def groups(world):
    """name -> (fourd group, gloo group, world ranks) of the groups this rank belongs to."""
    return world[1]


def assert_same(a, b):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a, b), (a, b)


def run(fn, group, async_op):
    """fn(group, async_op) -> (work or None, result); waits for the work."""
    work, result = fn(group, async_op)
    if async_op:
        assert work is not None
        work.wait()
        if isinstance(group, fdist.ProcessGroup):
            assert isinstance(work, fdist.Work)
            assert work.is_completed() and work.is_success() and work.exception() is None
    else:
        assert work is None
    return result


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("name", GROUPS)
def test_all_reduce_every_dtype_and_op(groups, name, async_op):
    g = groups[name]
    me = dist.get_rank(g[0])
    # Twice over: a blocking call of a dtype and op seen before takes allreduce's hot path.
    for _sweep in range(2):
        for dtype in DTYPES:
            for op in OPS:
                small = op == dist.ReduceOp.PRODUCT

                def call(group, a, op=op, dtype=dtype, small=small):
                    t = values(me, 33, dtype, small=small)
                    return dist.all_reduce(t, op=op, group=group, async_op=a), t

                assert_same(*(run(call, grp, async_op) for grp in g[:2]))
        if not async_op:
            made = set(g[0]._native.learned())
            codes = fourd._tensor._TORCH_CODES
            assert {(0, codes[d], o.value) for d in DTYPES for o in OPS} <= made, made
    # AVG (gloo has none): the sum over the group size.
    t = values(me, 16, torch.float64)
    s = t.clone()
    run(lambda grp, a: (dist.all_reduce(t, dist.ReduceOp.AVG, grp, a), t), g[0], async_op)
    run(lambda grp, a: (dist.all_reduce(s, group=grp, async_op=a), s), g[1], async_op)
    assert_same(t, s / len(g[2]))


@pytest.mark.parametrize("name", ["world", "reversed"])
def test_hot_paths_take_only_their_calls(groups, name):
    """Once float32 SUM went through, the native hot paths (one call from the backend's
    method) take what they can and hand the rest to the general path, every result exact
    against gloo: a tensor that requires grad (its data, as torch's
    backends), a view into a larger buffer, an op not seen yet, a dtype pair that differs."""
    _, g, ranks = groups[name]  # groups of every rank: a new one is collective over them
    f = dist.new_group(ranks, sort_ranks=False)  # nothing learnt yet
    n, me = len(ranks), dist.get_rank(f)
    codes = fourd._tensor._TORCH_CODES
    assert f._native.learned() == []
    for grp in (f, g):  # learn float32 SUM for the three collectives
        dist.all_reduce(values(me, 5), group=grp)
        dist.all_gather_single(torch.empty(n * 5), values(me, 5), group=grp)
        dist.reduce_scatter_single(torch.empty(5), values(me, n * 5), group=grp)
    made = set(f._native.learned())
    assert {(k, codes[torch.float32], 0) for k in range(3)} <= made, made
    assert (0, codes[torch.float32], dist.ReduceOp.PRODUCT.value) not in made, made

    def cases(group):
        out = []
        p = values(me, 9).requires_grad_()
        dist.all_reduce(p, group=group)
        assert p.requires_grad
        out.append(p.detach())
        big = values(me, 40)
        dist.all_reduce(big[8:19], group=group)  # a view at an offset: only it changes
        out.append(big)
        m = values(me, 7, small=True)
        dist.all_reduce(m, op=dist.ReduceOp.PRODUCT, group=group)
        out.append(m)
        ag = torch.zeros(n * 3 + 2)
        src = values(me, 3).requires_grad_()
        dist.all_gather_single(ag[1 : 1 + n * 3], src, group=group)
        out.append(ag)
        rs = torch.zeros(3)
        dist.reduce_scatter_single(rs, values(me, n * 3, offset=1), dist.ReduceOp.MAX, group)
        out.append(rs)
        return out

    assert_same(cases(f), cases(g))
    made = set(f._native.learned())
    assert (0, codes[torch.float32], dist.ReduceOp.PRODUCT.value) in made, made
    assert (2, codes[torch.float32], dist.ReduceOp.MAX.value) in made, made
    # The general path names what it does not take, on every rank before any data moves.
    with pytest.raises(fourd.InvalidArgumentError, match="contiguous"):
        dist.all_reduce(values(me, 24).view(4, 6).t(), group=f)
    with pytest.raises(fourd.DTypeError, match="float64"):
        dist.all_gather_single(torch.empty(n * 3, dtype=torch.float64), values(me, 3), group=f)


@pytest.mark.parametrize("count", [0, 1, 7])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("name", GROUPS)
def test_gathers_scatters_and_broadcast(groups, name, async_op, count):
    f, g, ranks = groups[name]
    n, me = len(ranks), dist.get_rank(f)

    def all_gather(group, a):
        out = [torch.empty(count) for _ in range(n)]
        return dist.all_gather(out, values(me, count), group=group, async_op=a), out

    def into_tensor(group, a):
        out = torch.empty(n * count, dtype=torch.int32)
        src = values(me, count, torch.int32)
        return dist.all_gather_single(out, src, group=group, async_op=a), out

    def reduce_scatter(group, a):
        out = torch.empty(count)
        ins = [values(me, count, offset=j) for j in range(n)]
        return dist.reduce_scatter(out, ins, group=group, async_op=a), out

    def reduce_scatter_tensor(group, a):
        out = torch.empty(count, dtype=torch.int64)
        src = values(me, n * count, torch.int64)
        return dist.reduce_scatter_single(out, src, group=group, async_op=a), out

    for fn in (all_gather, into_tensor, reduce_scatter, reduce_scatter_tensor):
        assert_same(run(fn, f, async_op), run(fn, g, async_op))
    # Again: a blocking call of a dtype (and op) that went through once takes the hot path.
    for fn in (into_tensor, reduce_scatter_tensor):
        assert_same(run(fn, f, async_op), run(fn, g, async_op))
    if not async_op:
        made, codes = set(f._native.learned()), fourd._tensor._TORCH_CODES
        assert (fdist._HOT_ALL_GATHER, codes[torch.int32], 0) in made, made
        assert (fdist._HOT_REDUCE_SCATTER, codes[torch.int64], 0) in made, made
    for root in range(n):

        def broadcast(group, a, root=root):
            t = values(me, count, torch.float64, offset=root)
            src = dist.get_global_rank(group, root)
            return dist.broadcast(t, src, group=group, async_op=a), t

        def reduce(group, a, root=root):
            t = values(me, count, torch.int32)
            dst = dist.get_global_rank(group, root)
            return dist.reduce(t, dst, group=group, async_op=a), t

        assert_same(run(broadcast, f, async_op), run(broadcast, g, async_op))
        r_f, r_g = run(reduce, f, async_op), run(reduce, g, async_op)
        if me == root:
            assert_same(r_f, r_g)
        else:
            assert_same(r_f, values(me, count, torch.int32))  # left unchanged


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("name", GROUPS)
def test_mpi_path_collectives(groups, name, async_op):
    """gather, scatter, all_to_all (list), all_to_all_single (even and uneven), barrier."""
    f, g, ranks = groups[name]
    n, me = len(ranks), dist.get_rank(f)
    for root in range(n):
        dst = ranks[root]

        def gather(group, a, root=root, dst=dst):
            out = [torch.empty(5, dtype=torch.int32) for _ in range(n)] if me == root else None
            t = values(me, 5, torch.int32)
            return dist.gather(t, out, dst=dst, group=group, async_op=a), out

        def scatter(group, a, root=root, dst=dst):
            out = torch.empty(3, dtype=torch.float64)
            ins = [values(j, 3, torch.float64) for j in range(n)] if me == root else None
            return dist.scatter(out, ins, src=dst, group=group, async_op=a), out

        r_f, r_g = run(gather, f, async_op), run(gather, g, async_op)
        if me == root:
            assert_same(r_f, r_g)
        assert_same(run(scatter, f, async_op), run(scatter, g, async_op))

    def all_to_all(group, a):
        out = [torch.empty(3) for j in range(n)]
        ins = [values(me, 3, offset=j) for j in range(n)]
        return dist.all_to_all(out, ins, group=group, async_op=a), out

    def even(group, a):
        out = torch.empty(2 * n, 3)
        t = values(me, 6 * n).view(2 * n, 3)
        return dist.all_to_all_single(out, t, group=group, async_op=a), out

    def uneven(group, a):
        send = [(me + 2 * j) % 3 for j in range(n)]  # rows to group rank j
        recv = [(j + 2 * me) % 3 for j in range(n)]  # rows from group rank j
        out = torch.empty(sum(recv), 2, dtype=torch.int64)
        t = values(me, 2 * sum(send), torch.int64).view(-1, 2)
        return dist.all_to_all_single(out, t, recv, send, group=group, async_op=a), out

    for fn in (all_to_all, even, uneven):
        assert_same(run(fn, f, async_op), run(fn, g, async_op))
    # all_to_all of blocks of different sizes (gloo takes one size): rank j's block for me.
    out = [torch.empty(j + 1 + me, dtype=torch.int16) for j in range(n)]
    ins = [values(me, me + 1 + j, torch.int16, offset=j) for j in range(n)]
    run(lambda grp, a: (dist.all_to_all(out, ins, group=grp, async_op=a), out), f, async_op)
    assert_same(out, [values(j, j + 1 + me, torch.int16, offset=me) for j in range(n)])
    w = dist.barrier(group=f, async_op=async_op)
    if async_op:
        w.wait()


def test_uneven_all_gather_and_bytes_of_any_dtype(groups):
    f, g, ranks = groups["reversed"]
    n, me = len(ranks), dist.get_rank(f)
    out = [torch.empty(j + 1, dtype=torch.int16) for j in range(n)]
    dist.all_gather(out, values(me, me + 1, torch.int16), group=f)
    assert_same(out, [values(j, j + 1, torch.int16) for j in range(n)])
    flags = torch.tensor([me % 2 == 0, True])
    dist.broadcast(flags, ranks[0], group=f)
    assert flags.tolist() == [True, True]
    both_out = [torch.empty(2, dtype=torch.bool) for _ in range(n)]
    dist.all_gather(both_out, torch.tensor([me == 0, True]), group=f)
    assert [b.tolist() for b in both_out] == [[j == 0, True] for j in range(n)]
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": me}, group=f)
    assert objs == [{"rank": j} for j in range(n)]
    # reduce_scatter of blocks of different sizes: block j is j + 1 long.
    out = torch.empty(me + 1, dtype=torch.int32)
    dist.reduce_scatter(out, [values(me, j + 1, torch.int32) for j in range(n)], group=f)
    assert_same(out, sum(values(r, me + 1, torch.int32) for r in range(n)))


def test_coalesced_calls(groups):
    f, g, ranks = groups["world"]
    n = len(ranks)
    for group in (f, g):
        ts = [values(ME, k + 1, torch.float32) for k in range(3)]
        with dist._coalescing_manager(group=group, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=group)
        cm.wait()
        if group is f:
            got = ts
        else:
            assert_same(got, ts)
    mixed = [values(ME, 3, torch.float64), values(ME, 2, torch.int32)]
    with dist._coalescing_manager(group=f, async_ops=False):
        for t in mixed:
            dist.all_reduce(t, group=f)
    assert_same(mixed[0], sum(values(r, 3, torch.float64) for r in range(n)))
    assert_same(mixed[1], sum(values(r, 2, torch.int32) for r in range(n)))
    outs = [torch.empty(n * 2) for _ in range(2)]
    with dist._coalescing_manager(group=f, async_ops=False):
        for k, o in enumerate(outs):
            dist.all_gather_single(o, values(ME, 2, offset=k), group=f)
    for k, o in enumerate(outs):
        assert_same(o, torch.cat([values(r, 2, offset=k) for r in range(n)]))


def test_work_api_and_futures(groups):
    f = groups["world"][0]
    t = values(ME, 1000, torch.float32)
    expected = sum(values(r, 1000, torch.float32) for r in range(N))
    w = dist.all_reduce(t, group=f, async_op=True)
    assert isinstance(w, fdist.Work)
    fut = w.get_future().then(lambda fu: fu.value()[0] + 1)
    assert_same(fut.wait(), expected + 1)
    assert w.is_completed() and w.is_success() and w.exception() is None
    assert_same(w.result()[0], expected)
    assert w.wait() is True  # again: fine
    # Many in flight, completed in the background, waited for in reverse.
    ts = [values(ME, 64, torch.int64, offset=k) for k in range(20)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    futures = [w.get_future() for w in works]
    for k in reversed(range(20)):
        futures[k].wait()
        assert_same(ts[k], sum(values(r, 64, torch.int64, offset=k) for r in range(N)))
    # A tensor that requires grad: its data is reduced.
    p = torch.ones(4, requires_grad=True)
    dist.all_reduce(p)
    assert (p.detach() == N).all() and p.requires_grad


def forward_stages(group, micro):
    """Activations down the pipeline (rank r -> r + 1) with isend/irecv: what each stage got."""
    got = []
    for m in range(micro):
        if ME > 0:
            prev = torch.empty(8)
            dist.irecv(prev, ME - 1, group=group).wait()
            got.append(prev)
        if ME < N - 1:
            dist.isend(values(ME, 8, offset=m) + 10 * ME, ME + 1, group=group).wait()
    return got


def backward_stages(group, micro):
    """Gradients up the pipeline (rank r -> r - 1) with batch_isend_irecv: what each got."""
    got = []
    for m in range(micro):
        ops, grad_in = [], torch.empty(8, dtype=torch.float64)
        if ME < N - 1:
            ops.append(dist.P2POp(dist.irecv, grad_in, ME + 1, group))
            got.append(grad_in)
        if ME > 0:
            grad = values(ME, 8, torch.float64, offset=m)
            ops.append(dist.P2POp(dist.isend, grad, ME - 1, group))
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return got


def test_pipeline_send_recv(groups):
    """Pipeline stages along the world, forward and backward, as with gloo."""
    f, g, _ = groups["world"]
    for stages in (forward_stages, backward_stages):
        assert_same(stages(f, 4), stages(g, 4))
    assert len(forward_stages(f, 1)) == (1 if ME > 0 else 0)


def test_recv_from_any_source_names_the_sender(groups):
    f = groups["world"][0]
    if ME == 0:
        for _ in range(N - 1):
            x = torch.empty(2)
            src = dist.recv(x, group=f)
            assert (x == src).all()
    else:
        dist.send(torch.full((2,), float(ME)), 0, group=f)


def test_work_wait_with_a_timeout_then_again(groups):
    """Work.wait(timeout) on a receive whose send comes later raises; the receive goes on."""
    f = groups["world"][0]
    if ME == 0:
        x = torch.empty(3)
        w = dist.irecv(x, 1, group=f, tag=7)
        late = datetime.timedelta(milliseconds=50)
        expect(dist.DistBackendError, ["did not complete within"], w.wait, late)
        assert not w.is_completed()
    MPI.COMM_WORLD.Barrier()
    if ME == 1:
        dist.send(torch.arange(3.0), 0, group=f, tag=7)
    if ME == 0:
        assert w.wait() and torch.equal(x, torch.arange(3.0))


# ---- training code -----------------------------------------------------------------------------


def small_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def train_ddp(group, hook=None, steps=5):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(small_model(), process_group=group)
    if hook is not None:
        model.register_comm_hook(group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(ME, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def bf16_hook(group, bucket):
    """torch's bf16_compress_hook (which DDP refuses by its name on a CPU build of torch):
    the bucket all-reduced in bfloat16, through the Work's future."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, group, bucket)


@pytest.mark.parametrize("hook", [None, bf16_hook])
def test_ddp_matches_gloo(groups, hook):
    f, g, _ = groups["world"]
    ours, theirs = train_ddp(f, hook), train_ddp(g, hook)
    # bfloat16 sums round at every addition, in each library's own order: a bf16 tolerance.
    tol = {"rtol": 2e-2, "atol": 2e-4} if hook else {"rtol": 1e-5, "atol": 1e-6}
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tol)
    start = [p.detach() for p in small_model().parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(ours, start))  # it trained


def test_fsdp2_matches_the_unsharded_model(groups):
    """fully_shard over the world: each step's loss (averaged over the ranks) is the loss of
    the unsharded model trained on all ranks' batches at once."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (N,))
    sharded, reference = small_model(), small_model()
    for layer in (sharded[0], sharded[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(4):
        x, y = batch(ME, step)
        loss = torch.nn.functional.mse_loss(sharded(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=groups["world"][1])
        xs, ys = zip(*(batch(r, step) for r in range(N)))
        ref = torch.nn.functional.mse_loss(reference(torch.cat(xs)), torch.cat(ys))
        ref_opt.zero_grad()
        ref.backward()
        ref_opt.step()
        torch.testing.assert_close(mean / N, ref.detach(), rtol=1e-5, atol=1e-6)


def test_device_mesh_and_dtensor_redistribute_match_gloo(groups):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    shape, names = (2, N // 2), ("dp", "tp")
    ours = init_device_mesh("cpu", shape, mesh_dim_names=names)
    gloo = init_device_mesh(
        "cpu", shape, mesh_dim_names=names, backend_override={0: "gloo", 1: "gloo"}
    )
    assert isinstance(ours.get_group("dp"), fdist.ProcessGroup)
    full = values(0, 8 * 6, torch.float32).view(8, 6)
    results = []
    for mesh in (ours, gloo):
        d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
        replicated = d.redistribute(mesh, [Replicate(), Replicate()]).to_local()
        local = values(ME, 12, torch.float32).view(3, 4)
        partial = DTensor.from_local(local, mesh, [Partial(), Partial()])
        summed = partial.redistribute(mesh, [Replicate(), Replicate()]).to_local()
        results.append((replicated, summed))
    assert_same(results[0][0], full)
    assert_same(results[0], results[1])
    assert_same(results[0][1], sum(values(r, 12, torch.float32).view(3, 4) for r in range(N)))


# ---- bad input ---------------------------------------------------------------------------------


def expect(exc, words, fn, *a, **k):
    with pytest.raises(exc) as info:
        fn(*a, **k)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    return info.value


def test_bad_input_raises_on_every_rank(groups):
    f = groups["world"][0]
    expect(TypeError, ["int16"], dist.all_reduce, torch.ones(3, dtype=torch.int16), group=f)
    expect(
        ValueError,
        ["BAND"],
        dist.all_reduce,
        torch.ones(3, dtype=torch.int32),
        dist.ReduceOp.BAND,
        f,
    )
    expect(
        ValueError,
        ["avg", "int32"],
        dist.all_reduce,
        torch.ones(3, dtype=torch.int32),
        dist.ReduceOp.AVG,
        f,
    )
    # A good call first, so that the bad one takes the hot path (the native core's checks).
    dist.all_gather_single(torch.empty(N * 3), torch.ones(3), group=f)
    expect(
        ValueError,
        ["output", str(N * 3 + 1)],
        dist.all_gather_single,
        torch.empty(N * 3 + 1),
        torch.ones(3),
        group=f,
    )
    expect(ValueError, ["contiguous"], dist.all_reduce, torch.ones(4, 4).t(), group=f)
    # Splits that disagree between ranks: every rank raises before any data moves.
    n = N
    send = [1] * n
    recv = [1] * n
    if ME == 0:
        recv[n - 1] = 2
    out = torch.empty(sum(recv))
    expect(
        ValueError, ["all_to_all_single"], dist.all_to_all_single, out, torch.ones(n), recv, send, f
    )
    # gather of tensors of different sizes on one rank: every rank raises.
    t = torch.ones(3 if ME != N - 1 else 4)
    gl = [torch.empty(3) for _ in range(N)] if ME == 0 else None
    expect(ValueError, ["gather"], dist.gather, t, gl, 0, f)
    world_sum_check()  # the group still works


@pytest.mark.parametrize("warm", [False, True])
def test_a_rank_that_skips_a_collective(groups, warm):
    """The last rank skips an all_reduce: the others raise DistBackendError (fourd's message:
    operation, group ranks, sequence number) within the deadline, and at once on the next call
    (the group is poisoned); the skipper's late call never waits past its deadline. `warm`: a
    good call of the same dtype and op went first, so the skipped one takes allreduce's hot
    path (one native call), not fourd.all_reduce's. Then every rank aborts the group and makes
    one of the same ranks again, which works (docs/errors.md). The group is made, and warmed,
    under a generous deadline (a group's first call sets up its shared-memory window, several
    MPI collectives that a stall of this 2-core machine can hold up for seconds) and then set
    to the tight one with torch's ProcessGroup.set_timeout."""
    deadline = 1.5
    ranks = list(reversed(range(N)))  # not a grid axis: a communicator of its own
    g = dist.new_group(ranks, timeout=datetime.timedelta(seconds=60), sort_ranks=False)
    a = torch.ones(1 << 12)
    if warm:
        dist.all_reduce(a, group=g)
        assert (a == N).all(), a
        assert g._native.learned(), "the good call did not make allreduce's hot path"
    for bad in (1.5, datetime.timedelta(0)):
        with pytest.raises(fourd.InvalidArgumentError, match="set_timeout"):
            g.set_timeout(bad)
    g.set_timeout(datetime.timedelta(seconds=deadline))
    if ME != N - 1:
        t0 = time.monotonic()
        e = expect(
            dist.DistBackendError, ["all_reduce", str(ranks), "seq"], dist.all_reduce, a, group=g
        )
        assert time.monotonic() - t0 < deadline + 2
        assert isinstance(e.__cause__, fourd.TimeoutError)
        t1 = time.monotonic()
        expect(dist.DistBackendError, [], dist.all_reduce, a, group=g)
        assert time.monotonic() - t1 < 0.5
    else:
        time.sleep(deadline + 0.5)
        t0 = time.monotonic()
        try:
            dist.all_reduce(a, group=g)
        except dist.DistBackendError:
            pass
        assert time.monotonic() - t0 < deadline + 2
    MPI.COMM_WORLD.Barrier()
    world_sum_check()  # other groups are untouched
    # Recovery as a torch program does it: abort the failed group everywhere (the late rank's
    # call may have completed), then make a group of the same ranks again.
    g.abort()
    expect(dist.DistBackendError, ["poisoned"], dist.all_reduce, a, group=g)
    dist.destroy_process_group(g)
    h = dist.new_group(ranks, timeout=datetime.timedelta(seconds=60), sort_ranks=False)
    b = torch.full((5,), float(ME + 1))
    dist.all_reduce(b, group=h)
    assert (b == N * (N + 1) / 2).all(), b


def test_a_timed_out_mpi_call_never_writes_the_tensor_reused_after_it(groups):
    """recv goes to the MPI library, whose receive stays posted after the deadline. Rank 0
    gives up (0.5 s deadline) and reuses its tensor; rank 1 sends late, and the library
    completes rank 0's receive while rank 0 makes other MPI calls: it writes the old storage
    (quarantined; the test holds it to see the write land), never the tensor rank 0 reuses."""
    g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=60))
    if ME > 1:
        return
    g.set_timeout(datetime.timedelta(seconds=0.5))
    n = 1000
    if ME == 1:
        time.sleep(1.0)
        dist.send(torch.full((n,), 5.0), dst=0, group=g)
        return
    out = torch.zeros(n)
    old = out.untyped_storage()
    at = old.data_ptr()
    expect(dist.DistBackendError, ["recv", "timed out"], dist.recv, out, src=1, group=g)
    assert out.untyped_storage().data_ptr() != at, "the tensor kept the storage MPI writes"
    out.fill_(-7)
    seen = torch.tensor([], dtype=torch.float32).set_(old)
    deadline = time.monotonic() + 60
    while not (seen == 5).all():
        assert time.monotonic() < deadline, "rank 1's late send never landed"
        MPI.COMM_WORLD.Iprobe()  # MPI progress, as a real program's later calls make
        time.sleep(0.01)
    assert (out == -7).all(), out
