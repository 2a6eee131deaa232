#!/usr/bin/env bash
# Small all_gathers on 4 ranks over 2 cores: the C loop of MPI's own waits (wait.c) and the
# Python loop of fourd's algorithms against MPI's blocking call (loop.py); output in pairs_np4.txt.
# Which ranks share a core is the kernel's choice and changes from launch to launch.
#   bench/results/pairs_np4/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/pairs_np4
B=$(mktemp -d)
.venv/bin/mpicc -O2 -o "$B/wait" "$D/wait.c"
{
  echo "# mpiexec -n 4 ./wait 1024 [pair]: mean per-iteration max over ranks, 3 repetitions"
  .venv/bin/mpiexec -n 4 "$B/wait" 1024
  .venv/bin/mpiexec -n 4 "$B/wait" 1024 pair
  echo "# mpiexec -n 4 python -m mpi4py $D/loop.py AXIS BYTES (FOURD_CALIBRATE=0)"
  for a in "x 1024" "data 1024" "x 4096" "data 65536"; do
    FOURD_CALIBRATE=0 .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py "$D/loop.py" $a
  done
} 2>&1 | grep -v '^MPICH: freeing' | tee "$D/pairs_np4.txt"
rm -rf "$B"
