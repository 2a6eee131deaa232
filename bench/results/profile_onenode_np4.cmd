.venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m fourd.plan --calibrate --ranks-per-node 4 --out bench/results/profile_onenode_np4.json
