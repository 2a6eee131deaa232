#!/usr/bin/env bash
# The one-node all_reduce criterion runs (the commands of onenode_np{2,4}_all_reduce.cmd) of two
# builds in ABBA order on one machine: before, after, after, before, for 2 and then 4 ranks. A
# drift of the machine that is linear in time cancels in the pooled comparison, and each build's
# two runs of a cell give that cell's own cross-run noise (bench/compare_runs.py, pooled mode).
#
#   bench/results/ab_abba.sh OLD_PYTHON NEW_PYTHON OUT_DIR
#
# OUT_DIR receives {before,after}{1,2}_np{2,4}.json.gz and .txt, and compare.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=$1
NEW=$2
OUT=$3
mkdir -p "$OUT"
export FOURD_CALIBRATE=force
# Every run tunes from nothing: a tuning saved by the first run of a build would let its second
# start settled, which the build before saved tuning cannot do.
export FOURD_TUNE_CACHE=0
unset PYTHONPATH

onenode() {  # python, ranks, output prefix
  local py=$1 n=$2 pre=$3
  "$(dirname "$py")/mpiexec" -n "$n" "$py" -m mpi4py -m fourd.bench --grid x=$n \
    --ranks-per-node $n --axis world --collective all_reduce -d float,bfloat16 -b 1M -e 64M \
    -f 4 -R 11 --algorithm all --json "$pre.json" 2>&1 | tee "$pre.txt"
  gzip -f "$pre.json"
}

for n in 2 4; do
  echo "== np$n: before, after, after, before"
  onenode "$OLD" "$n" "$OUT/before1_np$n"
  onenode "$NEW" "$n" "$OUT/after1_np$n"
  onenode "$NEW" "$n" "$OUT/after2_np$n"
  onenode "$OLD" "$n" "$OUT/before2_np$n"
  "$NEW" bench/compare_runs.py "$OUT/before1_np$n.json.gz,$OUT/before2_np$n.json.gz" \
    "$OUT/after1_np$n.json.gz,$OUT/after2_np$n.json.gz" --label "onenode_np${n}_all_reduce (ABBA)" \
    --md "$OUT/compare.md"
done
