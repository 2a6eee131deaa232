"""Builds the C++ GoogleTest suites with CMake and runs them under ctest (unit tests without MPI,
multi-rank tests under mpiexec with 1, 2, 3, 4 and 8 ranks, each with a ctest TIMEOUT).

Where a CUDA toolkit is installed the same build also has the GPU part, so that it cannot rot on
machines without a GPU: FOURD_CUDA=ON (NCCL from the nvidia-nccl-cu13 wheel of this
environment) compiles and links the CUDA kernels, the core with its device backends, the
extension module with its CUDA bindings, the GPU GoogleTest binary and the kernel benchmark.
ctest then runs the CPU suites on that core (the device code present, no device) and the GPU
binary's host checks; its device tests report "no CUDA device" and ctest lists them as skipped.
One architecture (sm_90, real code only): the check is that the sources compile and link; the
shipped build's architecture list is the project's setting. The core is compiled once for both
checks, and one translation unit per batch of sources (unity build) takes about a quarter off a
2-core build; the shipped build (pip install) stays one unit per file, so each file compiles
alone there. The CPU-only configuration (FOURD_CUDA=OFF) is the one pip builds here, under the
whole Python suite."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pybind11

ROOT = Path(__file__).resolve().parents[2]


def _tool(name):
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else shutil.which(name)


def _configure(build: Path, gpu: bool) -> str:
    cfg = [
        _tool("cmake"),
        "-S",
        str(ROOT),
        "-B",
        str(build),
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        "-DFOURD_BUILD_TESTS=ON",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_UNITY_BUILD=ON",
    ]
    if gpu:
        cfg += [
            "-DFOURD_CUDA=ON",
            "-DFOURD_BUILD_PYTHON=ON",
            "-DFOURD_DEV_COPY_MODULE=OFF",
            "-DCMAKE_CUDA_ARCHITECTURES=90-real",
        ]
    else:
        cfg += ["-DFOURD_CUDA=OFF", "-DFOURD_BUILD_PYTHON=OFF"]
    if _tool("ninja"):
        cfg += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"]
    r = subprocess.run(cfg, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout


def test_ctest(tmp_path):
    build = Path(os.environ.get("FOURD_NATIVE_BUILD_DIR", tmp_path / "build"))
    gpu = shutil.which("nvcc") is not None
    if not gpu:
        print("no CUDA toolkit (nvcc) on this machine: the GPU part is not compiled here")
    out = _configure(build, gpu)
    if gpu:
        assert "GPU part ON" in out, out[-3000:]
    targets = ["all"] + (["fourd_kernel_bench"] if gpu else [])
    r = subprocess.run(
        [_tool("cmake"), "--build", str(build), "-j2", "--target", *targets],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    r = subprocess.run(
        [_tool("ctest"), "--test-dir", str(build), "--output-on-failure", "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(r.stdout[-5000:])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert re.search(r"100% tests passed|tests passed, 0 tests failed", r.stdout), r.stdout[-3000:]
    for name in ["unit"] + [f"mpi_np{n}" for n in (1, 2, 3, 4, 8)]:
        assert re.search(rf"{name} \.+\s+Passed", r.stdout), (name, r.stdout[-3000:])
    if gpu:
        assert re.search(r"fourd_gpu_host_checks \.+\s+Passed", r.stdout), r.stdout[-3000:]
        assert re.search(r"fourd_gpu_kernels \.+\s*\**(Passed|Skipped)", r.stdout), r.stdout[-3000:]
