"""Helpers: run a multi-rank job under mpiexec with a timeout that kills the whole job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPI_DIR = Path(__file__).resolve().parent / "mpi"


def mpiexec() -> str:
    """FOURD_MPIEXEC when set (a cluster MPI's launcher), else the mpiexec beside this Python
    (the mpich wheel's), never another one on PATH."""
    named = os.environ.get("FOURD_MPIEXEC")
    if named:
        return named
    exe = Path(sys.executable).parent / "mpiexec"
    if not exe.exists():
        pytest.fail(
            f"mpiexec not found next to {sys.executable}: install fourd with its mpich dependency"
        )
    return str(exe)


def run_mpi(
    n: int, args: list[str], timeout: float = 300, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Runs `python -m mpi4py <args>` on n ranks. On timeout the whole process group is killed
    and the test fails with the output so far. `python -m mpi4py` aborts the job when a rank
    raises, so one failing rank never leaves the others waiting."""
    # -X faulthandler: a rank that crashes prints its Python stack (pytest does this by itself,
    # scripts such as the GPT example do not).
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-X", "faulthandler", "-m", "mpi4py", *args]
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(ROOT),
        env=full_env,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"mpiexec -n {n} {' '.join(args)} timed out after {timeout} s and was killed:\n"
            f"{out[-6000:]}"
        )
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if check and proc.returncode != 0:
        pytest.fail(
            f"mpiexec -n {n} {' '.join(args)} failed with rc={proc.returncode}:\n{out[-8000:]}"
        )
    return result


def pytest_args(files: list[str], extra: list[str] | None = None) -> list[str]:
    """The interpreter arguments that run multi-rank pytest files (tests/python/mpi/par_*.py)
    on every rank, after `python -m mpi4py`."""
    return [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "python_files=par_*.py",
        "--rootdir",
        str(MPI_DIR),
        *(extra or []),
        *[str(MPI_DIR / f) for f in files],
    ]


def run_mpi_pytest(
    n: int,
    files: list[str],
    timeout: float = 600,
    env: dict | None = None,
    extra: list[str] | None = None,
):
    """Runs multi-rank pytest files (tests/python/mpi/par_*.py) on n ranks."""
    r = run_mpi(n, pytest_args(files, extra), timeout=timeout, env=env)
    assert " passed" in r.stdout, r.stdout[-4000:]
    assert " failed" not in r.stdout and " error" not in r.stdout.lower().split("passed")[-1], (
        r.stdout[-4000:]
    )
    return r
