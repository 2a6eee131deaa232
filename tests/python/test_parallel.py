"""Launches the multi-rank suites (tests/python/mpi/par_*.py) under mpiexec with 2, 4 and 8
ranks; each job runs under a timeout that kills the whole process group."""

import pytest

from conftest import run_mpi_pytest


@pytest.mark.parametrize("n", [2, 4, 8])
def test_collectives(n):
    run_mpi_pytest(n, ["par_collectives.py"], timeout=600)
