.venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py bench/torch_layers.py --bytes 524288 --iters 300 --json bench/results/torch_layers_512K_np2.json
