"""Multi-rank checks of fourd's collectives on CUDA tensors against the CPU path.

Run under mpiexec on 1, 2 and 4 ranks by tests/python/test_gpu.py::test_collectives_on_cuda.
Every rank uses cuda:(local rank % device count), so on a machine with fewer GPUs than ranks
several ranks share one GPU and fourd picks its MPI backend (CUDA-aware MPI or pinned-host
staging); with one GPU per rank it picks NCCL. Each case runs the same call on CPU tensors
(the oracle: fourd's CPU path, itself checked against closed forms by par_collectives.py) and
on CUDA tensors, on integer-valued data so that every sum is exact, and compares bit for bit.
Skipped, with the reason, without torch CUDA or a GPU build of fourd.
"""

import socket

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="torch is not installed")

import fourd  # noqa: E402

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()


def _skip_reason():
    if not torch.cuda.is_available():
        return f"no CUDA device: torch.cuda is unavailable (torch {torch.__version__})"
    if not fourd.HAVE_CUDA:
        return "fourd was built without its GPU part; rebuild with FOURD_CUDA=ON"
    return None


_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
COUNTS = [0, 1, 7, 1000, 2**20 + 3]  # the last one spans two 4 MiB staging chunks (float32)


@pytest.fixture(scope="module")
def grid():
    g = fourd.init(data=N)
    yield g
    g.finalize()


def _backend_is_nccl() -> bool:
    """NCCL when no two ranks share a GPU and FOURD_CUDA_BACKEND is not mpi (as fourd decides)."""
    import os

    if os.environ.get("FOURD_CUDA_BACKEND", "").lower() == "mpi":
        return False
    me = (socket.gethostname(), torch.cuda.current_device())
    everyone = WORLD.allgather(me)
    return len(set(everyone)) == len(everyone)


def _data(dtype, op, count, seed):
    g = torch.Generator().manual_seed(1000 * seed + count)
    lo, hi = (-2, 3) if op == "prod" else (-20, 21)
    if dtype in ("uint8",):
        lo, hi = (0, 3) if op == "prod" else (0, 41)
    if dtype == "int8" and op == "sum":
        lo, hi = -20, 21
    return torch.randint(lo, hi, (count,), generator=g).to(getattr(torch, dtype))


def _cases():
    out = []
    for i, dtype in enumerate(DTYPES):
        for j, op in enumerate(OPS):
            if op == "avg" and dtype not in ("float32", "float64", "float16", "bfloat16"):
                continue
            out.append((dtype, op, COUNTS[(i + j) % len(COUNTS)]))
    return out


def _same(a, b, what):
    assert torch.equal(a.cpu(), b), (
        f"{what}: first differences at {(a.cpu() != b).nonzero()[:5].flatten().tolist()}"
    )


@pytest.mark.parametrize(("dtype", "op", "count"), _cases())
def test_all_reduce(grid, dtype, op, count):
    host = _data(dtype, op, count, ME)
    want = host.clone()
    grid.all_reduce(want, "data", op=op)
    dev = host.cuda()
    grid.all_reduce(dev, "data", op=op)
    torch.cuda.synchronize()
    _same(dev, want, f"all_reduce {op} {dtype} count {count}")


@pytest.mark.parametrize(("dtype", "op", "count"), _cases())
def test_reduce_scatter(grid, dtype, op, count):
    per = count // N if count >= N else count
    host = _data(dtype, op, per * N, ME)
    want = torch.empty(per, dtype=host.dtype)
    grid.reduce_scatter(want, host, "data", op=op)
    dev_in = host.cuda()
    dev_out = torch.empty(per, dtype=host.dtype, device="cuda")
    grid.reduce_scatter(dev_out, dev_in, "data", op=op)
    torch.cuda.synchronize()
    _same(dev_out, want, f"reduce_scatter {op} {dtype} count {per}")
    # In place: the output is this rank's block of the input.
    dev_in = host.cuda()
    block = dev_in[ME * per : (ME + 1) * per]
    grid.reduce_scatter(block, dev_in, "data", op=op)
    torch.cuda.synchronize()
    _same(block, want, f"in-place reduce_scatter {op} {dtype} count {per}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [0, 1, 1000, 2**18 + 1])
def test_all_gather(grid, dtype, count):
    host = _data(dtype, "sum", count, ME)
    want = torch.empty(count * N, dtype=host.dtype)
    grid.all_gather(want, host, "data")
    dev_out = torch.empty(count * N, dtype=host.dtype, device="cuda")
    grid.all_gather(dev_out, host.cuda(), "data")
    torch.cuda.synchronize()
    _same(dev_out, want, f"all_gather {dtype} count {count}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
@pytest.mark.parametrize("src", list(range(N)))
def test_broadcast(grid, dtype, src):
    host = _data(dtype, "sum", 4097, ME)
    want = host.clone()
    grid.broadcast(want, src, "data")
    dev = host.cuda()
    grid.broadcast(dev, src, "data")
    torch.cuda.synchronize()
    _same(dev, want, f"broadcast {dtype} from {src}")


def test_async_and_side_stream(grid):
    host = _data("float32", "sum", 100003, ME)
    want = host.clone()
    grid.all_reduce(want, "data")
    side = torch.cuda.Stream()
    dev = host.cuda()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dev.mul_(1)  # work on the side stream that the collective must be ordered after
        work = grid.all_reduce(dev, "data", async_op=True)
    work.wait()
    side.synchronize()
    _same(dev, want, "async all_reduce on a side stream")


def test_accumulate_fp32(grid):
    host = _data("bfloat16", "sum", 5000, ME)
    want = host.clone()
    grid.all_reduce(want, "data", accumulate_fp32=True)
    dev = host.cuda()
    grid.all_reduce(dev, "data", accumulate_fp32=True)
    torch.cuda.synchronize()
    _same(dev, want, "all_reduce bfloat16 accumulate_fp32")


@pytest.mark.parametrize("algorithm", ["flat", "ring", "rhd"])
def test_explicit_algorithms(grid, algorithm):
    host = _data("int32", "sum", 999, ME)
    want = host.clone()
    grid.all_reduce(want, "data")
    dev = host.cuda()
    if N > 1 and algorithm != "flat" and _backend_is_nccl():
        with pytest.raises(
            fourd.InvalidArgumentError, match="cannot run on CUDA buffers with NCCL"
        ):
            grid.all_reduce(dev, "data", algorithm=algorithm)
        return
    grid.all_reduce(dev, "data", algorithm=algorithm)
    torch.cuda.synchronize()
    _same(dev, want, f"all_reduce algorithm {algorithm}")


def test_device_mismatch_is_refused(grid):
    with pytest.raises(fourd.InvalidArgumentError, match="device"):
        grid.all_gather(torch.empty(N, device="cuda"), torch.ones(1), "data")
