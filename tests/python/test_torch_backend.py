"""Launches the torch.distributed backend suite (tests/python/mpi/par_torch_backend.py) under
mpiexec on 2 and 4 ranks: every collective against gloo, DDP, FSDP2, DeviceMesh and DTensor,
the ways of starting the backend, bad input and a rank that skips a collective; and the
per-layer timing of the torch path (bench/torch_layers.py)."""

import json

import pytest

from mpirun import run_mpi, run_mpi_pytest


@pytest.mark.parametrize("n", [2, 4])
def test_torch_backend(n):
    run_mpi_pytest(n, ["par_torch_backend.py"], timeout=900, env={"FOURD_CALIBRATE": "0"})


def test_torch_layers_bench_on_two_ranks(tmp_path):
    """bench/torch_layers.py, a short real run: every collective's five layers timed, in order,
    each with its step over the one below, and the JSON with every round of each."""
    jp = tmp_path / "layers.json"
    argv = ["bench/torch_layers.py", "--bytes", "1024", "--iters", "20", "--rounds", "3"]
    r = run_mpi(2, argv + ["--json", str(jp)], timeout=300, env={"FOURD_CALIBRATE": "0"})
    lines = [line.split() for line in r.stdout.splitlines() if " median " in line]
    colls = ["all_reduce", "all_gather", "reduce_scatter"]
    layers = ["fourd", "fourd-t", "native", "method", "torch"]
    assert [(w[0], w[1]) for w in lines] == [(c, k) for c in colls for k in layers], r.stdout
    assert all(("over" in w) == (w[1] != "fourd") for w in lines), r.stdout
    doc = json.loads(jp.read_text())
    assert doc["bytes"] == 1024 and doc["ranks"] == 2
    for c in colls:
        assert sorted(doc["times_s"][c]) == sorted(layers)
        assert all(len(v) == 3 and min(v) > 0 for v in doc["times_s"][c].values())
