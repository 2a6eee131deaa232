"""The GPU part must not rot on machines without a GPU: configure with FOURD_CUDA=ON (NCCL from
the nvidia-nccl-cu13 wheel of this environment), compile and link the CUDA kernels, the core
with the NCCL backend, the extension module with its CUDA bindings, and the GPU GoogleTest
binary. Nothing is run on a device here.

One architecture (sm_90, real code only) and only the targets that hold CUDA or NCCL code: the
check is that the sources compile and link, the shipped build's architecture list is the
project's setting, and the CPU-only test binaries are built and run by test_native. Both keep
this test to about a third of a full GPU build on a 2-core machine."""

import shutil
import subprocess
import sys
from pathlib import Path

import pybind11
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name):
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else shutil.which(name)


def test_gpu_part_compiles_and_links(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no CUDA toolkit (nvcc) on this machine: the GPU part cannot be compiled here")
    build = tmp_path / "build-gpu"
    cfg = [
        _tool("cmake"),
        "-S",
        str(ROOT),
        "-B",
        str(build),
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        "-DFOURD_CUDA=ON",
        "-DFOURD_BUILD_TESTS=ON",
        "-DFOURD_BUILD_PYTHON=ON",
        "-DFOURD_DEV_COPY_MODULE=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_CUDA_ARCHITECTURES=90-real",
        "-DCMAKE_UNITY_BUILD=ON",  # as test_native's build
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
    ]
    r = subprocess.run(cfg, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "GPU part ON" in r.stdout, r.stdout[-3000:]
    r = subprocess.run(
        [
            _tool("cmake"),
            "--build",
            str(build),
            "-j2",
            "--target",
            "_C",
            "fourd_gpu_tests",
            "fourd_kernel_bench",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert (build / "tests" / "cpp" / "gpu").exists()
