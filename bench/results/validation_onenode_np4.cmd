# 1. the profile: bench/results/profile_onenode_np4.cmd
# 2. the rows (FOURD_CALIBRATE=force: 'auto' decides with a fresh init-time profile)
FOURD_CALIBRATE=force .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m fourd.bench --grid x=4 --ranks-per-node 4 --axis x --collective all_reduce -d float,bfloat16 -b 1M -e 64M -f 4 --algorithm auto,flat,ring,rhd,shm --baseline mpi -R 3 --json bench/results/validation_onenode_np4_bench.json --quiet
# 3. predicted against measured
.venv/bin/python -m fourd.plan.validate bench/results/validation_onenode_np4_bench.json --machine bench/results/profile_onenode_np4.json --out bench/results/validation_onenode_np4.md
