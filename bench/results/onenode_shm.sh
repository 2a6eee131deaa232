#!/usr/bin/env bash
# One-node recordings of shm's direct reads and of the small-call path (bench/README.md, "One
# node: shm's direct reads"; docs/algorithms.md, shm): as root, from the repository root, with
# the virtual environment of the README's quick start. run_all.sh runs this file; it also runs
# alone. Each run's exact command is written beside its output as <name>.cmd.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
MPIEXEC=$(dirname "$PY")/mpiexec
OUT=bench/results

run() {  # name, then the command
  local name=$1; shift
  echo "$*" > "$OUT/$name.cmd"
  echo "== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.txt"
}

# 1. The three collectives on one node of 4 ranks (one group, the 2-core VM oversubscribed 2x),
#    16 KiB-64 MiB, 3 rounds: auto, shm and flat next to MPI's own collective, with the direct
#    reads (the default) and without them (FOURD_SHM_CMA=off: copies through the window only).
ONE="--ranks-per-node 4 --grid x=4 --axis x -b 16K -e 64M -R 3 --algorithm auto,shm,flat --baseline mpi"
run onenode_np4_shm $MPIEXEC -n 4 $PY -m mpi4py -m fourd.bench $ONE \
  --json $OUT/onenode_np4_shm.json --csv $OUT/onenode_np4_shm.csv
run onenode_np4_shm_copies env FOURD_SHM_CMA=off $MPIEXEC -n 4 $PY -m mpi4py -m fourd.bench $ONE \
  --json $OUT/onenode_np4_shm_copies.json --csv $OUT/onenode_np4_shm_copies.csv
# 2. The same on 2 ranks (a core each).
run onenode_np2_shm $MPIEXEC -n 2 $PY -m mpi4py -m fourd.bench \
  --ranks-per-node 2 --grid x=2 --axis x -b 16K -e 64M -R 3 --algorithm auto,shm,flat --baseline mpi \
  --json $OUT/onenode_np2_shm.json --csv $OUT/onenode_np2_shm.csv
# 3. Small calls: 1 KiB all_gather and all_reduce on 2 ranks, 11 rounds, fourd's whole Python
#    call (numpy arrays) next to mpi4py's call of the same collective.
run onenode_np2_1k $MPIEXEC -n 2 $PY -m mpi4py -m fourd.bench \
  --ranks-per-node 2 --grid x=2 --axis x -b 1K -e 1K -R 11 --collective all_gather,all_reduce \
  --algorithm auto,flat --baseline mpi --json $OUT/onenode_np2_1k.json
# The per-iteration times make these files large: kept compressed (bench/results/tables.py and
# Python's gzip module read them).
gzip -f $OUT/onenode_np4_shm.json $OUT/onenode_np4_shm_copies.json $OUT/onenode_np2_shm.json \
  $OUT/onenode_np2_1k.json
