"""Builds the C++ GoogleTest suites with CMake and runs them under ctest (unit tests without MPI,
multi-rank tests under mpiexec with 1, 2, 3, 4 and 8 ranks, each with a ctest TIMEOUT)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pybind11

ROOT = Path(__file__).resolve().parents[2]


def _tool(name):
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else shutil.which(name)


def test_ctest(tmp_path):
    build = Path(os.environ.get("FOURD_NATIVE_BUILD_DIR", tmp_path / "build"))
    cmake = _tool("cmake")
    ninja = _tool("ninja")
    cfg = [
        cmake,
        "-S",
        str(ROOT),
        "-B",
        str(build),
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        "-DFOURD_BUILD_TESTS=ON",
        "-DFOURD_BUILD_PYTHON=OFF",
        "-DFOURD_CUDA=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
        # One translation unit per batch of sources: about a quarter off a 2-core build. The
        # shipped build (pip install) stays one unit per file, so each file compiles alone.
        "-DCMAKE_UNITY_BUILD=ON",
    ]
    if ninja:
        cfg += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    subprocess.run(cfg, check=True, timeout=300)
    subprocess.run([cmake, "--build", str(build), "-j2"], check=True, timeout=900)
    r = subprocess.run(
        [_tool("ctest"), "--test-dir", str(build), "--output-on-failure", "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(r.stdout[-5000:])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert "100% tests passed" in r.stdout
