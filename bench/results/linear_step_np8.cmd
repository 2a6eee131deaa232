.venv/bin/mpiexec -n 8 .venv/bin/python -m mpi4py bench/linear_step.py --steps 25 --rounds 3 --json bench/results/linear_step_np8.json > bench/results/linear_step_np8.txt
