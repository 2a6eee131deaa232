"""python -m fourd.bench (run it under MPI: mpiexec -n 4 python -m mpi4py -m fourd.bench)."""

import sys

from fourd.bench.cli import main

sys.exit(main())
