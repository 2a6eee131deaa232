.venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py -m fourd.bench -R 5 --json bench/results/default_np2.json --plot bench/results/default_np2.png
