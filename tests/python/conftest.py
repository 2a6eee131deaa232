"""pytest configuration of the serial suite. The multi-rank suites in mpi/ and the fault
scripts in faults/ run only under mpiexec (launched by the tests here), never collected
directly. Helpers to launch them live in mpirun.py."""

import os

collect_ignore = ["mpi", "faults"]

# Tuning in use saves what it settles on beside the machine profile, for the next run of the
# same layout (python/fourd/profile/tuning.py). Every job the suite launches inherits this: no
# test depends on what an earlier test's run saved. The tests of the saved choices set it.
os.environ.setdefault("FOURD_TUNE_CACHE", "0")
