#!/usr/bin/env bash
# The README's default benchmark on 4 ranks (2 cores here), launched N times (default 3) one
# after another, each from nothing: a fresh cache directory (so no saved machine profile and no
# saved tuning), calibrated at start. Which ranks share a core is the kernel's choice and changes
# from launch to launch; this shows what that does to `auto` against MPI. Per launch: the bench's
# output (launchK.txt), its JSON (launchK.json.gz) and bench/vs_mpi.py's reading of it, gathered
# in summary.md.
#   bench/results/default_np4_launches/run.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/default_np4_launches
N=${1:-3}
: > "$D/summary.md"
for k in $(seq 1 "$N"); do
  cache=$(mktemp -d)
  XDG_CACHE_HOME=$cache FOURD_CALIBRATE=force .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py \
    -m fourd.bench -R 5 --json "$D/launch$k.json" 2>&1 | sed "s|$cache|\$XDG_CACHE_HOME|g" \
    > "$D/launch$k.txt"
  rm -rf "$cache"
  gzip -f "$D/launch$k.json"
  { echo "## launch $k"; echo; echo '```'; .venv/bin/python bench/vs_mpi.py "$D/launch$k.json.gz"
    echo '```'; echo; } >> "$D/summary.md"
done
