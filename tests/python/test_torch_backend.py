"""Launches the torch.distributed backend suite (tests/python/mpi/par_torch_backend.py) under
mpiexec on 2 and 4 ranks: every collective against gloo, DDP, FSDP2, DeviceMesh and DTensor,
the ways of starting the backend, bad input and a rank that skips a collective."""

import pytest

from mpirun import run_mpi_pytest


@pytest.mark.parametrize("n", [2, 4])
def test_torch_backend(n):
    run_mpi_pytest(n, ["par_torch_backend.py"], timeout=900, env={"FOURD_CALIBRATE": "0"})
