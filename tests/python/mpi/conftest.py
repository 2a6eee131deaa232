"""Multi-rank pytest: only rank 0 reports, and any failure aborts the whole job at once (so a
rank that fails before a collective cannot leave the others waiting)."""

import sys

import pytest
from mpi4py import MPI


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if MPI.COMM_WORLD.Get_rank() != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid}\n{report.longreprtext}\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
