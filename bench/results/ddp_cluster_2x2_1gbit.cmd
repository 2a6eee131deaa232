bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node 2 --rate 1gbit --python .venv/bin/python -- python -m mpi4py bench/ddp_step.py --json bench/results/ddp_cluster_2x2_1gbit.json
