"""The GPU part must not rot on machines without a GPU: configure with FOURD_CUDA=ON (NCCL from
the nvidia-nccl-cu13 wheel of this environment), compile and link the CUDA kernels, the core
with the NCCL backend, the extension module with its CUDA bindings, and the GPU GoogleTest
binary. Nothing is run on a device here."""

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
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
    ]
    r = subprocess.run(cfg, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "GPU part ON" in r.stdout, r.stdout[-3000:]
    r = subprocess.run(
        [_tool("cmake"), "--build", str(build), "-j2"], capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert (build / "tests" / "cpp" / "gpu").exists()
