"""A DDP training step on torch.distributed's backend fourd against gloo, in one run: the
script form of ``python -m fourd.bench.ddp`` (python/fourd/bench/ddp.py says what it measures),
for launchers that take a script.

    mpiexec -n 4 python -m mpi4py bench/ddp_step.py --json ddp.json
    bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node 2 --rate 4gbit -- \
        python -m mpi4py bench/ddp_step.py --json ddp.json
"""

import sys

from fourd.bench.ddp import main

if __name__ == "__main__":
    sys.exit(main())
