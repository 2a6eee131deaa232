/tmp/ci/.venv/bin/python -m fourd.plan.validate bench/results/onenode_np4_all_reduce.json --machine bench/results/profile_onenode_np4.json --out bench/results/validation_onenode_np4.md
