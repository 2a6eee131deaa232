FOURD_TUNE=0 FOURD_ALGORITHM=flat mpiexec -n 4 python -m mpi4py bench/ddp_step.py --no-compute --steps 8 --blocks 3 --settle 0 --json bench/results/ddp_np4_forced_flat.json
