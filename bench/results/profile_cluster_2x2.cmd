# Calibrated inside the emulated cluster (2 nodes x 2 ranks, 4 Gbit/s; needs root), then the
# inter level replaced by the emulated link: nic_bw = 4e9/8 B/s, nics_per_node = 1 (see the
# profile's notes). A fit of the shaped link inside the cluster over-estimates it: tbf's token
# bucket lets the small sizes burst at line rate.
bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node 2 --rate 4gbit --python .venv/bin/python -- python -m mpi4py -m fourd.plan --calibrate --ranks-per-node 2 --out bench/results/profile_cluster_2x2.json
.venv/bin/python -c "import json; p='bench/results/profile_cluster_2x2.json'; d=json.load(open(p)); d.update(name='cluster-2x2-4gbit', nic_bw=4e9/8, nics_per_node=1); json.dump(d, open(p, 'w'), indent=2, sort_keys=True)"
