"""GPU checks of fourd's CUDA kernels on torch CUDA tensors, through the private bindings.

Skipped, with the reason printed (pytest -rs), when torch is missing, torch.cuda is unavailable,
or fourd was built without its GPU part. Everything else is compared exactly with a torch CPU
oracle on integer-valued data, as the GoogleTest suite (tests/cpp/gpu) does natively.

Binding contract used here (fourd._C, GPU builds only):
    cuda_device_count() -> (count, reason_when_zero)
    nccl_version() -> int
    cuda_reduce(dst, srcs, count, dtype, op, stream=0, avg_factor=0.0)
    cuda_permute_blocks(dst, src, block_bytes, perm, stream=0)
Addresses and streams are ints (tensor.data_ptr(), stream.cuda_stream); dtype and op are the
fourd::DataType / fourd::ReduceOp codes. Collectives on CUDA tensors are checked against the CPU
path by tests/python/mpi/par_gpu.py under mpiexec on 1, 2 and 4 ranks (test_collectives_on_cuda):
NCCL with one GPU per rank, fourd's MPI backend where ranks share a GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
FLOATING = {"float32", "float64", "float16", "bfloat16"}
# avg is defined for floating dtypes only (integers: test_avg_on_integers).
CASES = [(d, o) for d in DTYPES for o in OPS if o != "avg" or d in FLOATING]


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no CUDA device: torch.cuda is unavailable (torch {torch.__version__}, {build})"
    import fourd

    if not fourd.HAVE_CUDA:
        return (
            "fourd was built without its GPU part; rebuild with FOURD_CUDA=ON pip install '.[gpu]'"
        )
    if not hasattr(fourd._C, "cuda_reduce"):
        return "this fourd build has no CUDA kernel bindings (fourd._C.cuda_reduce)"
    return None


_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def _native():
    import fourd

    return fourd._C


def _data(dtype: str, op: str, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lo, hi = (-2, 3) if op == "prod" else (-50, 51)
    if dtype == "uint8":
        lo, hi = (0, 3) if op == "prod" else (0, 101)
    return torch.randint(lo, hi, (count,), generator=g).to(getattr(torch, dtype))


def _oracle(srcs: list[torch.Tensor], dtype: str, op: str, factor: float) -> torch.Tensor:
    """The kernels' contract on the CPU: 16-bit floats accumulate in float32 and round once;
    integer sums and products wrap (int64 arithmetic, then a wrapping cast)."""
    if dtype in FLOATING:
        acc_t = torch.float64 if dtype == "float64" else torch.float32
    else:
        acc_t = torch.int64
    stacked = torch.stack([s.to(acc_t) for s in srcs])
    if op in ("sum", "avg"):
        acc = stacked.sum(0)
    elif op == "prod":
        acc = stacked.prod(0)
    elif op == "min":
        acc = stacked.min(0).values
    else:
        acc = stacked.max(0).values
    if op == "avg":
        acc = acc * torch.tensor(factor, dtype=acc_t)
    return acc.to(getattr(torch, dtype))


def test_device_count_matches_torch():
    count, reason = _native().cuda_device_count()
    assert count == torch.cuda.device_count(), reason


def test_nccl_is_linked():
    assert _native().nccl_version() >= 21000


@pytest.mark.parametrize(("dtype", "op"), CASES)
def test_reduce_matches_cpu_oracle(dtype, op):
    from fourd._C import DTYPES as DTYPE_NAMES

    n, count = 3, 10007
    host = [_data(dtype, op, count, seed) for seed in range(n)]
    dev = [h.cuda() for h in host]
    out = torch.empty_like(dev[0])
    stream = torch.cuda.current_stream().cuda_stream
    _native().cuda_reduce(
        out.data_ptr(),
        [t.data_ptr() for t in dev],
        count,
        DTYPE_NAMES.index(dtype),
        OPS.index(op),
        stream,
    )
    torch.cuda.synchronize()
    want = _oracle(host, dtype, op, 1.0 / n)
    assert torch.equal(out.cpu(), want), (
        f"{op} {dtype}: first differences {(out.cpu() != want).nonzero()[:5].flatten().tolist()}"
    )


def test_reduce_in_place_on_a_side_stream():
    from fourd._C import DTYPES as DTYPE_NAMES

    host = [_data("bfloat16", "sum", 4099, seed) for seed in range(4)]
    dev = [h.cuda() for h in host]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _native().cuda_reduce(
            dev[0].data_ptr(),
            [t.data_ptr() for t in dev],
            4099,
            DTYPE_NAMES.index("bfloat16"),
            OPS.index("sum"),
            side.cuda_stream,
        )
    side.synchronize()
    assert torch.equal(dev[0].cpu(), _oracle(host, "bfloat16", "sum", 0.25))


def test_avg_with_explicit_factor():
    from fourd._C import DTYPES as DTYPE_NAMES

    host = [_data("float16", "avg", 1000, seed) for seed in range(2)]
    dev = [h.cuda() for h in host]
    out = torch.empty_like(dev[0])
    # A sum over 2 local buffers that stands for a group of 8: the caller passes 1/8.
    _native().cuda_reduce(
        out.data_ptr(),
        [t.data_ptr() for t in dev],
        1000,
        DTYPE_NAMES.index("float16"),
        OPS.index("avg"),
        0,
        0.125,
    )
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), _oracle(host, "float16", "avg", 0.125))


def test_avg_on_integers():
    import fourd
    from fourd._C import DTYPES as DTYPE_NAMES

    t = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(fourd.InvalidArgumentError, match="avg"):
        _native().cuda_reduce(
            t.data_ptr(), [t.data_ptr()], 4, DTYPE_NAMES.index("int32"), OPS.index("avg"), 0
        )


@pytest.mark.parametrize("block_bytes", [1, 12, 4096, 1 << 20])
def test_permute_blocks(block_bytes):
    nblocks = 7
    src = torch.randint(0, 256, (nblocks * block_bytes,), dtype=torch.uint8).cuda()
    dst = torch.empty_like(src)
    perm = [6, 0, 5, 1, 4, 2, 0]  # a gather: block 0 twice, block 3 never
    _native().cuda_permute_blocks(dst.data_ptr(), src.data_ptr(), block_bytes, perm, 0)
    torch.cuda.synchronize()
    want = src.view(nblocks, block_bytes)[perm].flatten()
    assert torch.equal(dst, want)


@pytest.mark.parametrize(("n", "backend"), [(1, "auto"), (1, "mpi"), (2, "auto"), (4, "auto")])
def test_collectives_on_cuda(n, backend):
    """Every collective on CUDA tensors against the CPU path, under mpiexec on n ranks (auto:
    NCCL with one GPU per rank, MPI where ranks share a GPU; mpi: FOURD_CUDA_BACKEND=mpi)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mpirun import run_mpi_pytest

    env = {"FOURD_CUDA_BACKEND": backend}
    r = run_mpi_pytest(n, ["par_gpu.py"], timeout=900, env=env)
    print(r.stdout[-2000:])


@pytest.mark.parametrize(("n", "shape"), [(1, (1, 1, 1, 1)), (4, (1, 2, 2, 1))])
def test_gpt_example_on_cuda(n, shape, tmp_path):
    """The 4D GPT example trained on CUDA with every overlap on (fourd.nn, the tensor-parallel
    mappings and the gradient buckets on CUDA tensors) follows the unsharded model trained on the
    CPU, step by step (one rank: NCCL; four ranks on one GPU: the MPI backend)."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    from mpirun import run_mpi

    example = here.parents[1] / "examples" / "train_gpt_4d.py"
    spec = importlib.util.spec_from_file_location("train_gpt_4d", example)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    ref, _, _ = ex.run_reference(ex.parse_args(["--reference", "--steps", "20"]))
    out = tmp_path / "run.json"
    x, y, z, d = shape
    run_mpi(
        n,
        [
            str(example),
            "--x",
            str(x),
            "--y",
            str(y),
            "--z",
            str(z),
            "--data",
            str(d),
            "--steps",
            "20",
            "--overlap",
            "all",
            "--device",
            "cuda",
            "--quiet",
            "--json",
            str(out),
        ],
        timeout=300,
    )
    got = json.loads(out.read_text())["results"]["all"]["losses"]
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"{n} ranks {shape}: largest relative loss difference to the CPU reference {rel:.2e}")
    # float32 on both; the GPU sums in other orders than the CPU: rounding, not 1e-3.
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=0.0)
