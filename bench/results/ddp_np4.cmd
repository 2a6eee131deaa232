.venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py bench/ddp_step.py --json bench/results/ddp_np4.json
