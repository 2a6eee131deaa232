"""Regression tests of the failure cases found by trying to break fourd (docs/errors.md): no
buffer written after its operation failed, no results crossed, nothing stuck, bad persistent
state that heals. Multi-rank cases run under mpiexec with a timeout that kills the whole job."""

import json
import os
import re

import pytest

from mpirun import run_mpi, run_mpi_pytest

FAULTS = "tests/python/faults"
QUIET = {"FOURD_CALIBRATE": "0"}


def test_a_timed_out_operation_never_writes_a_reused_buffer():
    r = run_mpi(2, [f"{FAULTS}/reuse_after_timeout.py", "1.0"], timeout=240, env=QUIET)
    cases = re.findall(r"CASE (\S+) rank 0: timeout reused-buffer-intact=(\w+)", r.stdout)
    assert len(cases) == 5, r.stdout[-4000:]
    assert all(intact == "True" for _, intact in cases), cases
    # The MPI library's own collective (flat) completes once the late peer arrives, while rank 0
    # polls for its message: the library did write, into the quarantined old storage.
    late = re.findall(r"CASE (flat-\S+) rank 1: late call completed", r.stdout)
    assert len(late) == 3, r.stdout[-4000:]
    assert r.stdout.count("DONE") == 2


def _lifecycle(case, timeout=120):
    return run_mpi(2, [f"{FAULTS}/lifecycle.py", case], timeout=timeout, env=QUIET).stdout


def test_interrupt_of_a_queued_call_cancels_it():
    out = _lifecycle("queued-interrupt")
    assert "rank 0: queued-interrupt INTERRUPTED" in out, out[-3000:]
    assert "rank 0: queued-interrupt untouched=True" in out, out[-3000:]
    assert "rank 0: queued-interrupt POISONED" in out, out[-3000:]


def test_interrupt_in_work_wait_poisons_the_axis():
    out = _lifecycle("wait-interrupt")
    assert "rank 0: wait-interrupt INTERRUPTED" in out, out[-3000:]
    m = re.search(r"rank 0: wait-interrupt POISONED after ([\d.]+) s", out)
    assert m and float(m.group(1)) < 1.0, out[-3000:]


def test_fork_after_async_work_child_exits():
    out = _lifecycle("fork")
    for rank in (0, 1):
        m = re.search(rf"rank {rank}: fork child exit=(-?\d+) after ([\d.]+) s", out)
        assert m and m.group(1) == "0" and float(m.group(2)) < 10, out[-3000:]
        assert f"rank {rank}: fork released=True" in out, out[-3000:]


def test_dropping_a_grid_with_work_in_flight_returns_when_it_is_done():
    out = _lifecycle("drop-grid")
    m = re.search(r"rank 0: drop-grid dropped after ([\d.]+) s", out)
    assert m and float(m.group(1)) < 10, out[-3000:]


def test_finalize_honours_its_deadline_after_mismatched_shm_counts():
    out = _lifecycle("shm-counts")
    for rank in (0, 1):
        m = re.search(rf"rank {rank}: shm-counts finalize=\w+ after ([\d.]+) s", out)
        assert m and float(m.group(1)) < 6, out[-3000:]


def test_infinite_timeouts():
    out = _lifecycle("inf-timeout")
    assert out.count("inf-timeout result=4.0 finalize=True") == 2, out[-3000:]


def test_a_communicator_kept_past_finalize_raises():
    out = _lifecycle("after-finalize")
    assert out.count("after-finalize size=2 raised AbortedError") == 2, out[-3000:]


@pytest.mark.parametrize("n", [2, 4])
def test_failure_cases_under_mpiexec(n):
    run_mpi_pytest(n, ["par_reliability.py"], timeout=600)


# ---- bad persistent state heals -------------------------------------------------------------


class _OneNodeGrid:
    world_size, num_nodes, virtual_topology = 2, 1, False

    def node_of(self, rank):
        return 0


@pytest.mark.parametrize(
    "profile",
    [
        {"intra_bw": -1.0},
        {"intra_bw": float("nan")},
        {"hierarchical_chunks": 0},
        {"intra_bw": "fast"},
    ],
)
def test_a_cache_file_with_bad_values_is_measured_again_with_a_warning(
    tmp_path, monkeypatch, profile
):
    from fourd.profile import policy, store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("FOURD_PROFILE", raising=False)
    monkeypatch.delenv("FOURD_CALIBRATE", raising=False)
    monkeypatch.setattr(policy, "_memo", {})
    grid = _OneNodeGrid()
    path = store.cache_path(grid)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"fourd_calibration": {"version": store.VERSION}, "profile": profile}, f)
    with pytest.warns(RuntimeWarning, match=re.escape(path)) as w:
        assert policy._decide(grid) == ("measure", None, path)
    assert "FOURD_CALIBRATE=force" in str(w[0].message)


def test_a_deeply_nested_cache_file_is_an_error_broadcast_not_a_crash(tmp_path, monkeypatch):
    from fourd.profile import policy

    bad = tmp_path / "deep.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv("FOURD_PROFILE", str(bad))
    kind, message, _ = policy._decide(None)  # rank 0 decides, and never raises
    assert kind == "error" and "deep.json" in message, message


def test_a_cache_path_that_is_a_directory_warns_and_leaves_nothing(tmp_path, monkeypatch):
    from fourd.profile import store

    target = tmp_path / "profile.json"
    target.mkdir()
    with pytest.raises(OSError):
        store.save({"intra_bw": 1e9}, str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json"]


def test_the_cache_never_follows_a_planted_link(tmp_path):
    from fourd.profile import store

    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "profile.json"
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")
    with pytest.raises(OSError):
        store.save({"intra_bw": 1e9}, str(path))
    assert victim.read_text() == "keep"


def test_the_torch_store_listens_on_loopback_only():
    r = run_mpi(2, [f"{FAULTS}/torch_store.py"], timeout=180, env=QUIET)
    addrs = re.findall(r"rank 0: store listens on (\S+)", r.stdout)
    assert addrs == ["127.0.0.1"], r.stdout[-3000:]
