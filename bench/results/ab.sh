#!/usr/bin/env bash
# The criterion runs (one node on 2 and 4 ranks, the emulated 2 x 2 and 2 x 3 clusters'
# all_reduce; run_all.sh has the same commands) of two builds, alternating, on one machine:
# for each scenario the build BEFORE a change, then the build AFTER it, with the same command.
# The AFTER runs are the recordings kept here (<name>.json/.csv/.png/.txt/.cmd); the BEFORE
# runs go to BEFORE_DIR; bench/compare_runs.py compares them cell by cell.
#
#   bench/results/ab.sh OLD_PYTHON NEW_PYTHON BEFORE_DIR      (as root, for the clusters)
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=$1
NEW=$2
BEFORE=$3
OUT=bench/results
mkdir -p "$BEFORE"
export FOURD_CALIBRATE=force

onenode() {  # python, ranks, output prefix
  local py=$1 n=$2 pre=$3
  "$(dirname "$py")/mpiexec" -n "$n" "$py" -m mpi4py -m fourd.bench --grid x=$n \
    --ranks-per-node $n --axis world --collective all_reduce -d float,bfloat16 -b 1M -e 64M \
    -f 4 -R 11 --algorithm all --json "$pre.json" --csv "$pre.csv" --plot "$pre.png"
}

cluster() {  # python, ranks per node, output prefix
  local py=$1 k=$2 pre=$3
  bench/cluster/run_cluster.sh --nodes 2 --ranks-per-node "$k" --rate 4gbit --python "$py" -- \
    --axis world --collective all_reduce -b 1M -e 64M -f 4 -R 11 --algorithm all \
    --json "$pre.json" --csv "$pre.csv" --plot "$pre.png"
}

run() {  # kind, size, name
  local kind=$1 size=$2 name=$3
  echo "== $name: before ($OLD)"
  "$kind" "$OLD" "$size" "$BEFORE/$name" 2>&1 | tee "$BEFORE/$name.txt"
  echo "== $name: after ($NEW)"
  "$kind" "$NEW" "$size" "$OUT/$name" 2>&1 | tee "$OUT/$name.txt"
}

run onenode 2 onenode_np2_all_reduce
run onenode 4 onenode_np4_all_reduce
run cluster 2 cluster_2x2_all_reduce
run cluster 3 cluster_2x3_all_reduce
for name in onenode_np2_all_reduce onenode_np4_all_reduce cluster_2x2_all_reduce \
            cluster_2x3_all_reduce; do
  "$NEW" bench/compare_runs.py "$BEFORE/$name.json" "$OUT/$name.json" --label "$name" \
    --md "$BEFORE/compare.md"
done
