#!/usr/bin/env bash
# bench/explore_vs_loop.py on 4 ranks, launched N times (default 3), each from an empty cache
# (no saved profile or tuning), into launchK.txt.
#   bench/results/explore_vs_loop_np4/run.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/explore_vs_loop_np4
for k in $(seq 1 "${1:-3}"); do
  cache=$(mktemp -d)
  XDG_CACHE_HOME=$cache .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py bench/explore_vs_loop.py \
    2>&1 | sed "s|$cache|\$XDG_CACHE_HOME|g" > "$D/launch$k.txt"
  rm -rf "$cache"
done
