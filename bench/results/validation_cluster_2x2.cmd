# rows: bench/results/cluster_2x2.cmd; profile: bench/results/profile_cluster_2x2.cmd
.venv/bin/python -m fourd.plan.validate bench/results/cluster_2x2.json --machine bench/results/profile_cluster_2x2.json --out bench/results/validation_cluster_2x2.md
