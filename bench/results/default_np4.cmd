.venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m fourd.bench -R 5 --json bench/results/default_np4.json --plot bench/results/default_np4.png
