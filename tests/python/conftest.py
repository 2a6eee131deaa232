"""pytest configuration of the serial suite. The multi-rank suites in mpi/ and the fault
scripts in faults/ run only under mpiexec (launched by the tests here), never collected
directly. Helpers to launch them live in mpirun.py."""

collect_ignore = ["mpi", "faults"]
