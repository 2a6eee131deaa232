#!/usr/bin/env bash
# The multi-rank GoogleTest binary on 8 ranks (4 per core of the 2-core VM), 20 consecutive
# runs, each timed: the record behind "ctest runs np=8" (tests/cpp/CMakeLists.txt). From the
# repository root, with the virtual environment of the README's quick start; BUILD names the
# build folder (configured and built here when it has no test binary).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")
BUILD=${BUILD:-build/gtest}
OUT=bench/results/gtest_np8.txt
if [ ! -x "$BUILD/tests/cpp/fourd_mpi_tests" ]; then
  PATH=$BIN:$PATH cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFOURD_CUDA=OFF \
    -DFOURD_BUILD_TESTS=ON -DPython_EXECUTABLE="$PY" \
    -Dpybind11_DIR="$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())')" >/dev/null
  PATH=$BIN:$PATH cmake --build "$BUILD" --target fourd_mpi_tests
fi
{
  echo "# $BIN/mpiexec -n 8 $BUILD/tests/cpp/fourd_mpi_tests, 20 runs: run, seconds, result"
  for i in $(seq 1 20); do
    t0=$(date +%s.%N)
    if timeout 120 "$BIN/mpiexec" -n 8 "$BUILD/tests/cpp/fourd_mpi_tests" >/tmp/gtest_np8.log 2>&1; then
      r=passed
    else
      r="FAILED (rc $?)"
    fi
    echo "$i $("$PY" -c "print(f'{$(date +%s.%N) - $t0:.1f}')") $r"
  done
} | tee "$OUT"
