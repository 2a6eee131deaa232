"""Launches the multi-rank suites (tests/python/mpi/par_*.py) under mpiexec with 2, 4 and 8
ranks; each job runs under a timeout that kills the whole process group."""

import pytest

from mpirun import run_mpi_pytest


@pytest.mark.parametrize("n", [2, 4, 8])
def test_collectives(n):
    run_mpi_pytest(n, ["par_collectives.py"], timeout=600)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_algorithms(n):
    """Every algorithm (flat, ring, rhd, hierarchical, shm, auto) against closed forms."""
    run_mpi_pytest(n, ["par_algorithms.py"], timeout=600)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_profile(n):
    """The machine profile: measured at init, cached, reloaded; measured corrections; the
    calibration's axes and timed calls."""
    run_mpi_pytest(n, ["par_profile.py"], timeout=600)
