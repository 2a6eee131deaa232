#!/usr/bin/env bash
# Re-runs every recorded result in this folder (as root, for the emulated cluster runs).
# Run from the repository root with the virtual environment of the README's quick start.
# Each run's exact command is also written beside its JSON as <name>.cmd.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
MPIEXEC=$(dirname "$PY")/mpiexec
OUT=bench/results
export FOURD_CALIBRATE=force   # measure the profile of `auto` on this (quiet) machine

run() {  # name, then the command
  local name=$1; shift
  echo "$*" > "$OUT/$name.cmd"
  echo "== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.txt"
}

# Every comparison between implementations measures each row in 3 rounds (-R 3): the cells in
# an order rotated from round to round, each cell its median round. The criterion runs (one
# node, and the clusters' all_reduce runs) take 11 (-R 11): on this shared 2-core machine the
# rounds of one cell spread by 10-20%, and two cells running the same code (auto's and the
# algorithm it ran) differed by up to 12-14% with 5 rounds, by up to 9% with 11; longer rounds
# do not narrow it (docs/benchmark.md, "Rounds").

# One node: all_reduce float32 and bfloat16, 1 MiB - 64 MiB, every algorithm, both baselines;
# adaptive timing (about 50 ms of calls per cell: 3 at 64 MiB, hundreds at 1 MiB).
for n in 2 4; do
  run onenode_np${n}_all_reduce "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.bench \
    --grid x=$n --ranks-per-node $n --axis world --collective all_reduce -d float,bfloat16 \
    -b 1M -e 64M -f 4 -R 11 --algorithm all --json $OUT/onenode_np${n}_all_reduce.json \
    --csv $OUT/onenode_np${n}_all_reduce.csv --plot $OUT/onenode_np${n}_all_reduce.png
done

# One node, small calls: the three collectives, float32, 1 KiB - 256 KiB, every algorithm and
# MPI, 11 rounds (auto's tuning in use below 256 KiB: docs/algorithms.md, "Small calls").
for n in 2 4; do
  run onenode_np${n}_small "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.bench \
    --grid x=$n --ranks-per-node $n --axis world --collective all_reduce,all_gather,reduce_scatter \
    -d float -b 1K -e 256K -f 4 -R 11 --algorithm all --baseline mpi \
    --json $OUT/onenode_np${n}_small.json --csv $OUT/onenode_np${n}_small.csv \
    --plot $OUT/onenode_np${n}_small.png
done

# The planner's model against measurements (median absolute error must be < 25%): a profile
# calibrated by `fourd.plan --calibrate`, a bench of every single algorithm, the comparison.
for n in 2 4; do
  run profile_onenode_np${n} "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.plan --calibrate \
    --ranks-per-node $n --out $OUT/profile_onenode_np${n}.json
  "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.bench --grid x=$n --ranks-per-node $n --axis x \
    --collective all_reduce -d float,bfloat16 -b 1M -e 64M -f 4 \
    --algorithm auto,flat,ring,rhd,shm --baseline mpi -R 3 \
    --json $OUT/validation_onenode_np${n}_bench.json --quiet
  "$PY" -m fourd.plan.validate $OUT/validation_onenode_np${n}_bench.json \
    --machine $OUT/profile_onenode_np${n}.json --out $OUT/validation_onenode_np${n}.md \
    | tee $OUT/validation_onenode_np${n}.txt \
    || echo "validation np$n: median error above the threshold (see the table)"
done

# Per-call overhead of fourd over the MPI library: 8 B and 16 MiB, flat, 2 and 4 ranks.
for n in 2 4; do
  run overhead_8B_np${n} "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.bench \
    --grid x=$n --ranks-per-node $n --axis world --collective all_reduce --algorithm flat \
    --baseline mpi -b 8 -e 8 -n 5000 -w 200 --json $OUT/overhead_8B_np${n}.json
  run overhead_16M_np${n} "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.bench \
    --grid x=$n --ranks-per-node $n --axis world --collective all_reduce --algorithm flat \
    --baseline mpi -b 16M -e 16M -n 100 -w 5 --json $OUT/overhead_16M_np${n}.json
  # The same 8 B call timed as nccl-tests does (the whole batch back to back).
  run overhead_8B_np${n}_batch "$MPIEXEC" -n $n "$PY" -m mpi4py -m fourd.bench \
    --grid x=$n --ranks-per-node $n --axis world --collective all_reduce --algorithm flat \
    --baseline mpi -b 8 -e 8 -n 20000 -w 500 --timing batch --json $OUT/overhead_8B_np${n}_batch.json
done

# The README's main command, the default sweep on 4 ranks (2 x 2 virtual nodes), in 3 rounds.
run default_np4 "$MPIEXEC" -n 4 "$PY" -m mpi4py -m fourd.bench -R 3 \
  --json $OUT/default_np4.json --plot $OUT/default_np4.png

# torch.distributed on backend fourd next to fourd, MPI and gloo: 1-64 MiB on 4 ranks, and the
# per-call overhead at 8 B on 2 ranks.
run torch_fourd_np4 "$MPIEXEC" -n 4 "$PY" -m mpi4py -m fourd.bench --grid x=4 --ranks-per-node 4 \
  --axis world --collective all_reduce -d float -b 1M -e 64M -f 2 -R 5 --algorithm auto \
  --baseline all --json $OUT/torch_fourd_np4.json --csv $OUT/torch_fourd_np4.csv \
  --plot $OUT/torch_fourd_np4.png
run torch_fourd_overhead_8B_np2 "$MPIEXEC" -n 2 "$PY" -m mpi4py -m fourd.bench --grid x=2 \
  --ranks-per-node 2 --axis world --collective all_reduce -d float -b 8 -e 8 -R 11 \
  --algorithm auto --baseline all --json $OUT/torch_fourd_overhead_8B_np2.json

# A DDP training step, backend fourd against gloo: one node, then the 2 x 2 cluster (root).
run ddp_np4 "$MPIEXEC" -n 4 "$PY" -m mpi4py bench/ddp_step.py --json $OUT/ddp_np4.json
run ddp_cluster_2x2 bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node 2 --rate 4gbit \
  --python "$PY" -- python -m mpi4py bench/ddp_step.py --json $OUT/ddp_cluster_2x2.json

# Emulated clusters (root), 4 Gbit/s per node link: 2 nodes x 2 ranks, 2 nodes x 3 ranks (and
# 4 nodes x 2 ranks last, below).
for shape in 2x2 2x3; do
  run cluster_$shape bench/cluster/run_cluster.sh --nodes ${shape%x*} --ranks-per-node ${shape#*x} \
    --rate 4gbit --python "$PY" -- --axis world --collective all_reduce,all_gather,reduce_scatter \
    -b 1M -e 64M -f 4 -R 3 --algorithm all --json $OUT/cluster_$shape.json \
    --csv $OUT/cluster_$shape.csv --plot $OUT/cluster_$shape.png
done

# The criterion runs on the clusters: all_reduce alone, float32, in 11 rounds.
for shape in 2x2 2x3; do
  run cluster_${shape}_all_reduce bench/cluster/run_cluster.sh --nodes ${shape%x*} \
    --ranks-per-node ${shape#*x} --rate 4gbit --python "$PY" -- --axis world \
    --collective all_reduce -b 1M -e 64M -f 4 -R 11 --algorithm all \
    --json $OUT/cluster_${shape}_all_reduce.json --csv $OUT/cluster_${shape}_all_reduce.csv \
    --plot $OUT/cluster_${shape}_all_reduce.png
done

# The planner's model against the 2 x 2 cluster: calibrated inside it, then the inter level set
# to the emulated link (tbf lets small sizes burst at line rate, so a fitted link reads fast).
bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node 2 --rate 4gbit --python "$PY" -- \
  python -m mpi4py -m fourd.plan --calibrate --ranks-per-node 2 --out $OUT/profile_cluster_2x2.json
"$PY" -c "import json; p='$OUT/profile_cluster_2x2.json'; d=json.load(open(p)); d.update(name='cluster-2x2-4gbit', nic_bw=4e9/8, nics_per_node=1); json.dump(d, open(p, 'w'), indent=2, sort_keys=True)"
"$PY" -m fourd.plan.validate $OUT/cluster_2x2.json --machine $OUT/profile_cluster_2x2.json \
  --out $OUT/validation_cluster_2x2.md | tee $OUT/validation_cluster_2x2.txt \
  || echo "validation cluster 2x2: median error above the threshold (see the table)"

# Last, the longest: 4 nodes x 2 ranks (8 ranks and the emulated network on 2 cores).
for shape in 4x2; do
  run cluster_$shape bench/cluster/run_cluster.sh --nodes ${shape%x*} --ranks-per-node ${shape#*x} \
    --rate 4gbit --python "$PY" -- --axis world --collective all_reduce,all_gather,reduce_scatter \
    -b 1M -e 64M -f 4 -R 3 --algorithm all --json $OUT/cluster_$shape.json \
    --csv $OUT/cluster_$shape.csv --plot $OUT/cluster_$shape.png
done

# Compressed collectives (root): bench/results/compression.sh.
bash bench/results/compression.sh

# One node: shm's direct reads and the small-call path: bench/results/onenode_shm.sh.
bash bench/results/onenode_shm.sh
