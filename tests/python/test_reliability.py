"""Fault injection under mpiexec, every job under a timeout that kills it: a rank that skips a
collective, a rank killed mid-operation, mismatched calls with and without FOURD_DEBUG, Ctrl-C,
exit with operations in flight, a 10,000-operation soak, and every bad input."""

import os
import re
import subprocess
import sys
import time

import pytest

from mpirun import ROOT, run_mpi, run_mpi_pytest

FAULTS = "tests/python/faults"


@pytest.mark.parametrize("algorithm", ["flat", "ring"])
def test_rank_skips_a_collective(algorithm):
    deadline = 2.0
    r = run_mpi(
        4, [f"{FAULTS}/skip_collective.py", str(deadline), algorithm], timeout=60, check=False
    )
    out = r.stdout
    if "is not built into" in out:
        pytest.fail(f"algorithm {algorithm} missing: {out[-2000:]}")
    assert r.returncode == 0, out[-4000:]
    for rank in range(3):
        m = re.search(
            rf"rank {rank}: TIMEOUT-OK=(\w+) elapsed=([\d.]+) isinstance_builtin=(\w+) msg=(.*)",
            out,
        )
        assert m, out[-4000:]
        assert m.group(1) == "True" and m.group(3) == "True", m.group(0)
        assert float(m.group(2)) < deadline + 2
        assert "group of world ranks [0, 1, 2, 3]" in m.group(4)
        assert re.search(rf"rank {rank}: ABORTED-OK=True", out), out[-3000:]
    if algorithm == "ring":
        # Point-to-point algorithms know who never arrived.
        assert "peers that never arrived: world ranks [3]" in out, out[-3000:]


def test_killed_rank_ends_the_job():
    t0 = time.monotonic()
    r = run_mpi(4, [f"{FAULTS}/killed_rank.py"], timeout=90, check=False)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert elapsed < 60, elapsed
    # The message comes from the launcher (rank 1 killed), or first from a surviving rank whose
    # call failed on the dead peer and aborted the job: the MPI library's copy from rank 1's
    # memory fails at once where its large messages read the peer directly (MPICH's CMA path;
    # which algorithm `auto` runs, and so which ends the job first, depends on the tuning).
    killed = r"KILLED|BAD TERMINATION|signal 9|Killed"
    peer_failed = r"fourd\.errors\.\w+Error: fourd: .* with world rank 1 failed"
    assert re.search(killed, r.stdout) or re.search(peer_failed, r.stdout), r.stdout[-3000:]
    pids = [int(p) for p in re.findall(r"rank \d+: pid (\d+)", r.stdout)]
    assert pids
    time.sleep(0.5)
    for pid in pids:
        alive = (
            os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read()
        )
        assert not alive, f"rank process {pid} left behind"


@pytest.mark.parametrize("kind", ["count", "dtype"])
def test_mismatch_with_debug(kind):
    r = run_mpi(3, [f"{FAULTS}/mismatch.py", kind], timeout=60, env={"FOURD_DEBUG": "1"})
    lines = [line for line in r.stdout.splitlines() if "MISMATCH" in line]
    assert len(lines) == 3, r.stdout[-3000:]
    for line in lines:
        if kind == "count":
            assert "count 107" in line and "count 100" in line, line
        else:
            assert "float32" in line and "float64" in line, line


@pytest.mark.parametrize("kind", ["count", "dtype"])
def test_mismatch_without_debug_never_hangs(kind):
    # Documented: without FOURD_DEBUG a mismatch may fail in MPI, complete with wrong data, or
    # time out; it never waits past the deadline (3 s here).
    t0 = time.monotonic()
    r = run_mpi(3, [f"{FAULTS}/mismatch.py", kind], timeout=60, check=False)
    assert time.monotonic() - t0 < 40
    for line in r.stdout.splitlines():
        m = re.search(r"elapsed=([\d.]+)", line)
        if m:
            assert float(m.group(1)) < 3 + 2, line


def test_interrupt_within_100ms():
    r = run_mpi(2, [f"{FAULTS}/interrupt.py"], timeout=60)
    m = re.search(r"INTERRUPTED after ([\d.]+) ms", r.stdout)
    assert m, r.stdout[-2000:]
    assert float(m.group(1)) < 150, m.group(0)
    assert "POISONED" in r.stdout


def test_finalize_with_operations_in_flight():
    r = run_mpi(4, [f"{FAULTS}/exit_in_flight.py", "finalize"], timeout=120)
    for rank in range(4):
        m = re.search(
            rf"rank {rank}: finalize=True done=True threads_before=(\d+) "
            rf"threads_after=(\d+) correct=True",
            r.stdout,
        )
        assert m, r.stdout[-3000:]
        assert int(m.group(2)) <= int(m.group(1)) + 1  # mpi4py/MPI may own one helper thread
        assert re.search(rf"rank {rank}: AFTER-FINALIZE", r.stdout)


def test_interpreter_exit_with_operations_in_flight():
    r = run_mpi(4, [f"{FAULTS}/exit_in_flight.py", "exit"], timeout=120)
    assert r.stdout.count("exiting with operations in flight") == 4
    assert "Segmentation" not in r.stdout and "Abort" not in r.stdout


def test_interpreter_exit_with_daemon_threads_inside_fourd():
    """Python ends a daemon thread that takes the GIL back during finalization; fourd's
    bindings let it end instead of aborting the process (python/csrc/bindings.hpp, withoutGil).
    Several runs: each catches the threads at another point of their loops."""
    for _ in range(3):
        r = run_mpi(
            2,
            [f"{FAULTS}/daemon_at_exit.py"],
            timeout=120,
            check=False,
            env={"FOURD_CALIBRATE": "0"},
        )
        assert r.returncode == 0, r.stdout[-3000:]
        assert r.stdout.count("exiting with daemon threads in fourd") == 2, r.stdout[-3000:]
        assert "terminate called" not in r.stdout, r.stdout[-3000:]


def test_torch_backend_stops_its_progress_thread_before_finalize():
    r = run_mpi(2, [f"{FAULTS}/torch_exit.py"], timeout=120, env={"FOURD_CALIBRATE": "0"})
    assert r.stdout.count("running ['fourd.distributed']") == 2, r.stdout[-3000:]
    assert r.stdout.count("at exit, progress threads []") == 2, r.stdout[-3000:]


def test_soak_10000_async_operations():
    """With faults injected on grids of their own (soak.py): a rank that times out and reuses
    its buffer, Ctrl-C during a wait, threads on different axes."""
    r = run_mpi(4, [f"{FAULTS}/soak.py", "10000", "faults"], timeout=600)
    assert r.stdout.count("SOAK checked=10000") == 4, r.stdout[-3000:]
    assert r.stdout.count("faults=3") == 4, r.stdout[-3000:]


@pytest.mark.parametrize("n", [2, 4])
def test_bad_inputs(n):
    run_mpi_pytest(n, ["par_errors.py"], timeout=300)


def test_errors_doc_lists_every_error_class():
    import fourd

    doc = (ROOT / "docs" / "errors.md").read_text()
    for name in fourd.__all__:
        obj = getattr(fourd, name)
        if isinstance(obj, type) and issubclass(obj, fourd.Error):
            assert f"`fourd.{name}`" in doc, name


# ---- one MPI library for fourd and mpi4py ------------------------------------------------------

_MPICH = "MPICH Version:      5.0.2\nMPICH Release date: unreleased\nMPICH ABI:          17:2:5"
_OMPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"


def test_mpi_family_of_library_strings():
    from fourd import _C

    assert _C.mpi_family(_MPICH) == "MPICH"
    assert _C.mpi_family(_OMPI) == "Open MPI"
    assert _C.mpi_family("Intel(R) MPI Library 2021.10 for Linux* OS") == "MPICH"
    assert _C.mpi_family("MVAPICH2 Version      :\t2.3.7") == "MPICH"
    assert _C.mpi_family("some other MPI 1.0") == ""
    assert _C.mpi_family("") == ""


def test_this_build_reaches_the_mpi_of_its_header():
    """The installed fourd and the mpi4py beside it share one MPI library (CI's environment):
    the checks that init() runs find nothing to refuse."""
    from mpi4py import MPI

    from fourd import _C
    from fourd.grid import _mpi_library_problem

    assert _C.mpi_header_family() in ("MPICH", "Open MPI")
    assert _C.mpi_family(_C.mpi_library_version()) == _C.mpi_header_family()
    assert _C.mpi_abi_mismatch() == ""
    import fourd

    info = fourd.build_info()
    assert info["mpi_header_family"] == _C.mpi_header_family() and info["mpi_abi_mismatch"] == ""
    assert (
        _mpi_library_problem(
            MPI.Get_library_version(),
            bool(MPI.Is_initialized()),
            _C.mpi_library_version(),
            bool(_C.mpi_initialized()),
            "",
        )
        is None
    )


def test_two_mpi_libraries_are_refused_with_both_named():
    from fourd.grid import _mpi_library_problem

    assert _mpi_library_problem(_MPICH, True, _MPICH, True, "") is None
    # another library answers fourd (different version strings)
    msg = _mpi_library_problem(_OMPI, True, _MPICH, False, "")
    assert "two different MPI libraries" in msg
    assert "Open MPI v4.1.4" in msg and "MPICH Version:      5.0.2" in msg
    # the same version string, but fourd's copy was never initialised (two installs of one
    # release)
    assert "two different MPI libraries" in _mpi_library_problem(_MPICH, True, _MPICH, False, "")
    # fourd's calls reach a library of another ABI family: the native message wins
    assert (
        _mpi_library_problem(_OMPI, True, _OMPI, True, "fourd: compiled against")
        == "fourd: compiled against"
    )


def test_another_mpi_answering_fourd_is_refused_instead_of_crashing(tmp_path):
    """The crash the check exists for, made on purpose: a library in the global symbol scope
    (LD_PRELOAD here; mpi4py does the same with Open MPI's libmpi.so.40) answers fourd's
    MPI_Get_library_version as the other ABI family. init() must raise BackendError on every
    rank, with the reason, before any MPI call with a handle."""
    import shutil

    from fourd import _C

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler on PATH (needed to build the preloaded library)")
    other = "Open MPI" if _C.mpi_header_family() == "MPICH" else "MPICH"
    banner = (
        "Open MPI v4.1.4, package: test, ident: 4.1.4"
        if other == "Open MPI"
        else "MPICH Version:      4.2.0"
    )
    src = tmp_path / "other_mpi.c"
    src.write_text(
        "#include <string.h>\n"
        "int MPI_Get_library_version(char *v, int *n) {\n"
        f'  const char *s = "{banner}";\n'
        "  strcpy(v, s); *n = (int)strlen(s); return 0;\n}\n"
    )
    lib = tmp_path / "libother_mpi.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    # Every rank: each writes what init() raised to its own file (two ranks' tracebacks on one
    # pipe interleave character by character, so the job's output cannot show it per rank).
    per_rank = (
        "import os, fourd\n"
        "from mpi4py import MPI\n"
        "rank = MPI.COMM_WORLD.Get_rank()\n"
        "try:\n"
        "    fourd.init()\n"
        "    got = 'no error'\n"
        "except Exception as e:\n"
        "    got = f'{type(e).__module__}.{type(e).__qualname__}\\n{e}'\n"
        f"open(os.path.join({str(tmp_path)!r}, f'rank{{rank}}.txt'), 'w').write(got)\n"
    )
    r = run_mpi(2, ["-c", per_rank], timeout=120, env={"LD_PRELOAD": str(lib)}, check=False)
    for rank in range(2):
        out = tmp_path / f"rank{rank}.txt"
        assert out.exists(), f"rank {rank} wrote nothing:\n{r.stdout[-3000:]}"
        got = out.read_text()
        assert got.startswith("fourd.errors.BackendError\n"), got
        assert f"but its MPI calls reach {other}" in got, got
    assert "Segmentation fault" not in r.stdout, r.stdout[-3000:]
    # Unhandled, the error ends the job with its traceback (one rank: one clean traceback).
    r = run_mpi(
        1,
        ["-c", "import fourd; fourd.init()"],
        timeout=120,
        env={"LD_PRELOAD": str(lib)},
        check=False,
    )
    assert r.returncode != 0, r.stdout[-3000:]
    assert "fourd.errors.BackendError" in r.stdout, r.stdout[-3000:]
    assert "Segmentation fault" not in r.stdout, r.stdout[-3000:]
    # `python -m fourd` shows the mismatch next to the header family
    info = subprocess.run(
        [sys.executable, "-m", "fourd"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LD_PRELOAD": str(lib)},
    )
    assert info.returncode == 0, info.stderr
    assert f"MPI headers : {_C.mpi_header_family()}  ** fourd: it was compiled" in info.stdout
