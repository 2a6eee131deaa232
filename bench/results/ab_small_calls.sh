#!/usr/bin/env bash
# The README's default benchmark, cut to the small sizes (1-64 KiB), of two builds in ABBA order
# on one machine (before, after, after, before) for 2 and then 4 ranks, every run tuning from
# nothing; bench/vs_mpi.py's per-size table of each run goes to OUT_DIR/compare.md (whose pooled
# table at the top is the geometric mean of each build's two runs). The builds
# are two installs of fourd: OLD_DIR a `pip install --no-deps --target OLD_DIR <checkout>` of
# the build before, put first on PYTHONPATH; the environment's own install is the build after.
#
#   bench/results/ab_small_calls.sh OLD_DIR OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=$1
OUT=$2
mkdir -p "$OUT"
export FOURD_TUNE_CACHE=0
unset PYTHONPATH
: > "$OUT/compare.md"

run() {  # build (before|after), ranks, run number
  local build=$1 n=$2 k=$3 pre="$OUT/$1$3_np$2"
  local path=""
  [ "$build" = before ] && path=$OLD
  PYTHONPATH=$path .venv/bin/mpiexec -n "$n" .venv/bin/python -m mpi4py -m fourd.bench \
    -b 1K -e 64K -R 3 --baseline mpi --json "$pre.json" > "$pre.txt" 2>&1
  gzip -f "$pre.json"
  { echo "## $build, run $k, $n ranks"; echo; .venv/bin/python bench/vs_mpi.py "$pre.json.gz" \
    | grep -E '^\|'; echo; } >> "$OUT/compare.md"
}

for n in 2 4; do
  run before "$n" 1
  run after "$n" 1
  run after "$n" 2
  run before "$n" 2
done
