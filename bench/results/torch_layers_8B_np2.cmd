.venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py bench/torch_layers.py --bytes 8 --json bench/results/torch_layers_8B_np2.json
