.venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py -m fourd.plan --calibrate --ranks-per-node 2 --out bench/results/profile_onenode_np2.json
