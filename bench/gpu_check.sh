#!/usr/bin/env bash
# One-shot GPU check of fourd: build with CUDA, run the GPU tests, benchmark the kernels against
# the device's own copy and PyTorch's add, and write a short report. Made for a fresh machine with
# one NVIDIA GPU, nvcc and PyTorch, possibly without network access; it ends within
# --time-limit seconds whatever happens, and a failing step never loses the report.
#
#   bench/gpu_check.sh [--results DIR] [--python PY | --venv DIR] [--wheels DIR]
#                      [--time-limit SECONDS] [--cap-scale N] [--quick] [--only STEP,STEP]
#   bench/gpu_check.sh --download-wheels DIR [--target-python 3.12]
#
# Environments:
#   default       use PY's environment (default: the python3 on PATH, i.e. the one with torch):
#                 wheels from --wheels are installed into it, then fourd is built with
#                 pip install --no-build-isolation (works offline: scikit-build-core, pybind11,
#                 cmake, ninja, numpy, mpi4py and nvidia-nccl-cu13 must already be there).
#   --venv DIR    create a fresh venv from PY and FOURD_CUDA=ON pip install ".[gpu,test]" into it
#                 (needs the package index).
# Offline machines: run --download-wheels DIR first on a machine with network (it fetches the
# mpich, mpi4py and ros-gtest-vendor wheels for --target-python), copy DIR along, pass
# --wheels DIR (installed with --force-reinstall, so mpi4py matches the mpich wheel's MPI).
#
# --only runs the named steps alone (a rerun after a first full run: the build folders under
# build/gpu-check and the installed package are reused).
# Each step has its own limit (sized for a 16-core machine; --cap-scale N multiplies them for a
# slower one), never past the overall deadline.
# Steps: env, setup, build_kernels (cuda/ on its own: needs neither MPI nor the core), gtest,
# kernel_bench, torch_baseline, install (the Python package with FOURD_CUDA=ON), diagnose
# (fourd.init on one rank with and without torch, CUDA and MPI settings; a native backtrace on
# a crash), pytest_gpu,
# mpi_gpu_2 / mpi_gpu_4 (par_gpu.py alone on 2 and 4 ranks; with --only) and mpi_gpu_bench
# (python -m fourd.bench --device cuda on 1, 2 and 4 ranks).
# Output in --results (default bench/results/gpu): report.txt, report.json, log.txt,
# kernel_bench.json, torch_baseline.json, gtest.json, bench_cuda_np{1,2,4}.json.
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
REPO="$(cd "$(dirname "$SELF")/.." && pwd)"

# ---- one step, run as a child of this script (under its own timeout) --------------------------
# A step exits 0 (ok), 3 (skipped: its last line says why) or anything else (failed).
if [[ "${1:-}" == "__step" ]]; then
  step="$2"
  cd "$REPO"
  PATH="$(dirname "$PY"):$PATH"
  export PATH
  NPROC="$(nproc 2>/dev/null || echo 4)"
  # Prefer the environment's cmake (the PyPI cmake package), else the one on PATH.
  CMAKE="$(dirname "$PY")/cmake"
  [[ -x "$CMAKE" ]] || CMAKE="$(command -v cmake || echo cmake)"
  skip() { echo "$1"; exit 3; }
  case "$step" in
    env)
      rc=0
      nvidia-smi || rc=1
      nvidia-smi --format=csv \
        --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem || true
      nvcc --version || rc=1
      "$CMAKE" --version | head -1 || true
      "$BASE_PY" - <<'EOF' || rc=1
import importlib.metadata as m, sys
print("python", sys.version.split()[0], sys.executable)
for d in ("torch", "nvidia-nccl-cu13", "mpich", "mpi4py", "numpy", "scikit-build-core",
          "pybind11", "cmake", "ninja", "pytest", "pytest-timeout", "ros-gtest-vendor"):
    try:
        print(f"  {d} {m.version(d)}")
    except m.PackageNotFoundError:
        print(f"  {d} MISSING")
import torch
print("torch.cuda.is_available():", torch.cuda.is_available(), "torch.version.cuda:",
      torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device 0:", p.name, f"{p.total_memory / 2**30:.0f} GiB", p.multi_processor_count, "SMs")
EOF
      exit $rc
      ;;
    setup)
      if [[ -n "$VENV" ]]; then
        "$BASE_PY" -m venv "$VENV"
        "$PY" -m pip install -q --upgrade pip || true
        FOURD_CUDA=ON CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
          "$PY" -m pip install --config-settings=build-dir="$REPO/build/gpu-check/wheel" \
          ".[gpu,test]"
        exit 0
      fi
      if [[ -n "$WHEELS" ]]; then
        shopt -s nullglob
        whl=("$WHEELS"/*.whl)
        ((${#whl[@]})) || { echo "no wheels in $WHEELS"; exit 1; }
        # --force-reinstall: an mpi4py of the same version already there may be built against
        # another MPI than the mpich wheel's, which fourd is built against.
        "$PY" -m pip install --no-index --no-deps --no-cache-dir --no-compile --force-reinstall \
          "${whl[@]}"
      fi
      # What the native build, the package build and the tests need from the environment.
      missing="$("$PY" - <<'EOF'
import importlib.metadata as m
need = ["mpich", "ros-gtest-vendor", "nvidia-nccl-cu13", "scikit-build-core", "pybind11",
        "numpy", "mpi4py", "pytest"]
miss = []
for d in need:
    try:
        m.version(d)
    except m.PackageNotFoundError:
        miss.append(d)
print(" ".join(miss))
EOF
)"
      if [[ -n "$missing" ]]; then
        echo "missing from $PY's environment: $missing; trying the package index"
        reqs=()
        for d in $missing; do
          if [[ $d == mpich ]]; then reqs+=("mpich>=5,<6"); else reqs+=("$d"); fi
        done
        "$PY" -m pip install --retries 0 --timeout 15 "${reqs[@]}" ||
          { echo "could not install: $missing (offline? pass --wheels)"; exit 1; }
      fi
      exit 0
      ;;
    build_kernels)
      # cuda/ configured on its own: the kernels, their tests and the benchmark build even where
      # MPI or the core library does not.
      bdir="$REPO/build/gpu-check/cuda"
      common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY"
              -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DFOURD_CUDA=ON)
      if ! "$CMAKE" -S cuda -B "$bdir" "${common[@]}" -DFOURD_BUILD_TESTS=ON; then
        echo "configure with the GPU tests failed (GoogleTest missing?); building without them"
        rm -rf "$bdir"
        "$CMAKE" -S cuda -B "$bdir" "${common[@]}" -DFOURD_BUILD_TESTS=OFF
      fi
      "$CMAKE" --build "$bdir" -j "$NPROC"
      ;;
    gtest)
      exe="$REPO/build/gpu-check/cuda/tests_gpu/fourd_gpu_tests"
      [[ -x "$exe" ]] || { echo "fourd_gpu_tests was not built"; exit 1; }
      "$exe" --gtest_output="json:$RESULTS/gtest.json"
      ;;
    kernel_bench)
      exe="$REPO/build/gpu-check/cuda/fourd_kernel_bench"
      [[ -x "$exe" ]] || { echo "fourd_kernel_bench was not built"; exit 1; }
      "$exe" --mib "$BENCH_MIB" --iters "$BENCH_ITERS" --json "$RESULTS/kernel_bench.json"
      ;;
    torch_baseline)
      "$PY" "$REPO/bench/gpu_torch_baseline.py" --mib "$BENCH_MIB" --iters "$BENCH_ITERS" \
        --json "$RESULTS/torch_baseline.json"
      ;;
    install)
      [[ -z "$VENV" ]] || skip "done by the setup step (pip install '.[gpu,test]' into $VENV)"
      # A build folder of its own, so a developer's build/<wheel tag> is never reused or changed.
      FOURD_CUDA=ON CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
        "$PY" -m pip install --no-build-isolation --no-deps -v \
        --config-settings=build-dir="$REPO/build/gpu-check/wheel" "$REPO"
      cd /
      "$PY" -c "import fourd; print('fourd', fourd.__version__, fourd.__file__)"
      ;;
    diagnose)
      # fourd.init on one rank in small variants, each in its own process under a timeout: which
      # combination of torch, CUDA initialisation and MPI settings (if any) crashes it. On the
      # first crash, a native backtrace from cuda-gdb (or gdb) when one is installed.
      mpiexec="$(dirname "$PY")/mpiexec"
      [[ -x "$mpiexec" ]] || mpiexec="$(command -v mpiexec || true)"
      cd /
      declare -A code=(
        [mpi4py_only]="from mpi4py import MPI; c = MPI.COMM_WORLD.Dup(); s = c.Split_type(MPI.COMM_TYPE_SHARED); print(s.Get_size())"
        [fourd]="from mpi4py import MPI; import fourd; print(fourd.init())"
        [torch_then_fourd]="from mpi4py import MPI; import torch, fourd; print(fourd.init())"
        [mpi4py_after_cuda]="from mpi4py import MPI; import torch; torch.zeros(1, device='cuda'); c = MPI.COMM_WORLD.Dup(); s = c.Split_type(MPI.COMM_TYPE_SHARED); print(s.Get_size())"
        [cuda_then_fourd]="from mpi4py import MPI; import torch; torch.zeros(1, device='cuda'); import fourd; print(fourd.init())"
        [fourd_then_cuda]="from mpi4py import MPI; import fourd, torch; g = fourd.init(); t = torch.ones(8, device='cuda'); g.all_reduce(t, 'data'); print(g, t.sum().item())"
      )
      order=(mpi4py_only fourd torch_then_fourd mpi4py_after_cuda cuda_then_fourd fourd_then_cuda)
      envs=("" "MPIR_CVAR_CH4_NETMOD=ofi" "UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no" "FOURD_POLL=yield")
      # Which MPI, NCCL and CUDA libraries the process maps, and which MPI mpi4py reports.
      timeout -k 5 60 "$mpiexec" -n 1 "$PY" -c "
from mpi4py import MPI
import torch, fourd
print('mpi4py:', MPI.Get_library_version().splitlines()[0])
print('fourd:', fourd._C.build_info() if hasattr(fourd._C, 'build_info') else fourd.__file__)
libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if any(
    k in l for k in ('libmpi', 'libnccl', 'libcuda', 'libucp', 'libfabric', 'libstdc++'))})
print('mapped:', *libs, sep='\n  ')
" 2>&1 | tail -n 20 || true
      first=""
      for name in "${order[@]}"; do
        for e in "${envs[@]}"; do
          [[ -z "$e" || $name == cuda_then_fourd || $name == fourd_then_cuda ]] || continue
          rc=0
          out="$(env $e timeout -k 5 60 "$mpiexec" -n 1 "$PY" -X faulthandler -c "${code[$name]}" 2>&1)" || rc=$?
          printf 'diagnose %-18s %-45s rc=%s  %s\n' "$name" "${e:-(default env)}" "$rc" \
            "$(tail -n 1 <<<"$out" | cut -c1-120)"
          if [[ $rc -ne 0 && -z "$first" ]]; then first="$name"; echo "$out" | tail -n 40; fi
        done
      done
      if [[ -n "$first" ]]; then
        dbg="$(command -v cuda-gdb || command -v gdb || true)"
        if [[ -n "$dbg" ]]; then
          echo "== native backtrace of $first ($dbg, singleton MPI)"
          timeout -k 5 120 "$dbg" -q -batch -ex "set pagination off" -ex run -ex bt \
            -ex "info sharedlibrary" --args "$PY" -c "${code[$first]}" 2>&1 | tail -n 150 || true
        else
          echo "no cuda-gdb or gdb for a native backtrace"
        fi
        exit 1
      fi
      ;;
    pytest_gpu)
      # The serial GPU test files only (test_*gpu*.py, test_*cuda*.py), named explicitly so that
      # a collection problem elsewhere in the suite cannot hide them.
      shopt -s nullglob
      files=(tests/python/test_*gpu*.py tests/python/test_*cuda*.py)
      ((${#files[@]})) || skip "no GPU test files (tests/python/test_*gpu*.py)"
      "$PY" -m pytest -v -rs -p no:cacheprovider --durations=10 "${files[@]}"
      ;;
    mpi_gpu_2 | mpi_gpu_4)
      n="${step##*_}"
      shopt -s nullglob
      files=(tests/python/mpi/par_*gpu*.py tests/python/mpi/par_*cuda*.py)
      ((${#files[@]})) || skip "no multi-rank GPU tests (tests/python/mpi/par_*gpu*.py) yet"
      mpiexec="$(dirname "$PY")/mpiexec"
      [[ -x "$mpiexec" ]] || mpiexec="$(command -v mpiexec || true)"
      [[ -n "$mpiexec" ]] || { echo "no mpiexec"; exit 1; }
      # As tests/python/conftest.py runs them: python -m mpi4py aborts the job when a rank
      # raises, and tests/python/mpi/conftest.py reports from rank 0 only.
      "$mpiexec" -n "$n" "$PY" -m mpi4py -m pytest -q -p no:cacheprovider \
        -o "python_files=par_*.py" --rootdir tests/python/mpi "${files[@]}"
      ;;
    mpi_gpu_bench)
      mpiexec="$(dirname "$PY")/mpiexec"
      [[ -x "$mpiexec" ]] || mpiexec="$(command -v mpiexec || true)"
      help="$(cd / && "$PY" -m fourd.bench --help 2>&1)" ||
        skip "python -m fourd.bench is not available"
      grep -q -- "--device" <<<"$help" || skip "python -m fourd.bench has no --device option yet"
      for n in 1 2 4; do
        echo "== $n rank(s) on one GPU"
        (cd / && "$mpiexec" -n "$n" "$PY" -m mpi4py -m fourd.bench --device cuda --axis world \
          -d float,bfloat16 -b 4K -e 256M -f 8 --json "$RESULTS/bench_cuda_np$n.json")
      done
      ;;
    *)
      echo "unknown step $step"
      exit 1
      ;;
  esac
  exit 0
fi

# ---- arguments ----------------------------------------------------------------------------------
RESULTS="$REPO/bench/results/gpu"
PY_ARG="${PYTHON:-python3}"
VENV=""
WHEELS=""
LIMIT=480
QUICK=0
DOWNLOAD=""
TARGET_PY="3.12"
CAP_SCALE=1
ONLY=""
ARGS="$*"
ORIG_ARGS=("$@")
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) RESULTS="$2"; shift 2 ;;
    --python) PY_ARG="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --time-limit) LIMIT="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --cap-scale) CAP_SCALE="$2"; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --download-wheels) DOWNLOAD="$2"; shift 2 ;;
    --target-python) TARGET_PY="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

if [[ -n "$DOWNLOAD" ]]; then
  # The wheels a machine without network needs beyond what a CUDA + PyTorch image has.
  mkdir -p "$DOWNLOAD"
  "$PY_ARG" -m pip download --no-deps --only-binary=:all: --python-version "$TARGET_PY" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DOWNLOAD" "mpich>=5,<6" "mpi4py>=4" ros-gtest-vendor
  ls -l "$DOWNLOAD"
  exit 0
fi

# Backstop: the whole script runs under a timeout a little past the limit. The per-step limits
# below are computed from the same deadline, so this only fires if something ignores them.
if [[ -z "${FOURD_GPU_CHECK_GUARDED:-}" ]] && command -v timeout >/dev/null; then
  export FOURD_GPU_CHECK_GUARDED=1
  exec timeout -k 5 "$((LIMIT + 20))" bash "$SELF" "${ORIG_ARGS[@]}"
fi

START="$(date +%s)"
DEADLINE=$((START + LIMIT))
RESERVE=15  # seconds kept for the report
mkdir -p "$RESULTS"
RESULTS="$(cd "$RESULTS" && pwd)"
rm -f "$RESULTS"/{report.txt,report.json,log.txt,kernel_bench.json,torch_baseline.json,gtest.json}
rm -f "$RESULTS"/bench_cuda_np*.json
WORK="$(mktemp -d "${TMPDIR:-/tmp}/fourd-gpu-check.XXXXXX")"
: >"$WORK/steps.tsv"

BASE_PY="$(command -v "$PY_ARG" || echo "$PY_ARG")"
if [[ -n "$VENV" ]]; then
  mkdir -p "$(dirname "$VENV")"
  VENV="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
  PY="$VENV/bin/python"
else
  PY="$BASE_PY"
fi
# nvcc is often installed but not on PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# Build for this GPU only (faster than the default 80;90), e.g. compute capability 9.0 -> 90.
ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 |
        tr -d ' .' || true)"
[[ "$ARCH" =~ ^[0-9]+$ ]] || ARCH=90
if [[ $QUICK -eq 1 ]]; then BENCH_MIB=64; BENCH_ITERS=10; else BENCH_MIB=256; BENCH_ITERS=20; fi
export REPO RESULTS WORK PY BASE_PY VENV WHEELS ARCH BENCH_MIB BENCH_ITERS PYTHONUNBUFFERED=1

{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
              head -1 || echo none)"
  echo "nvcc=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo none)"
  echo "python=$PY"
  echo "commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "args=$ARGS"
  echo "arch=$ARCH"
} >"$WORK/meta.txt"

STEP_PID=""
REPORTED=0
write_report() {
  [[ $REPORTED -eq 1 ]] && return
  REPORTED=1
  # Every step's log, in order, each cut to its last 400 KB.
  : >"$RESULTS/log.txt"
  while IFS=$'\t' read -r name _; do
    { echo "===== $name"; tail -c 400000 "$WORK/$name.log" 2>/dev/null || true; echo; } \
      >>"$RESULTS/log.txt"
  done <"$WORK/steps.tsv"
  local report=("$REPO/bench/gpu_report.py" --work "$WORK" --results "$RESULTS")
  if ! python3 "${report[@]}" 2>>"$RESULTS/log.txt" && ! "$PY" "${report[@]}" 2>>"$RESULTS/log.txt"
  then
    { echo "fourd GPU check (the report script failed; raw step table):"; cat "$WORK/steps.tsv"; } \
      | tee "$RESULTS/report.txt"
  fi
  echo "results in $RESULTS"
}
# shellcheck disable=SC2317  # called through trap
on_signal() {
  if [[ -n "$STEP_PID" ]]; then
    kill -TERM -- "-$STEP_PID" 2>/dev/null || kill -TERM "$STEP_PID" 2>/dev/null || true
    printf '%s\t%s\t%s\t%s\n' "${CURRENT:-?}" interrupted "$(( $(date +%s) - STEP_START ))" \
      "the whole check hit its time limit" >>"$WORK/steps.tsv"
  fi
  write_report
  exit 124
}
trap on_signal TERM INT
trap write_report EXIT

FAILED=0
# run_step NAME CAP_SECONDS: runs "gpu_check.sh __step NAME" under min(CAP, time left).
run_step() {
  local name="$1" cap="$2" left t rc=0 status note=""
  if [[ -n "$ONLY" && "$ONLY" != *",$name,"* ]]; then
    return 0
  fi
  cap=$((cap * CAP_SCALE))
  left=$((DEADLINE - $(date +%s) - RESERVE))
  if ((left < 10)); then
    printf '%s\tskipped\t0\tno time left\n' "$name" >>"$WORK/steps.tsv"
    echo "== $name: skipped, no time left"
    return 0
  fi
  t=$((cap < left ? cap : left))
  echo "== $name (limit ${t} s)"
  CURRENT="$name"
  STEP_START="$(date +%s)"
  # timeout runs the step in its own process group and kills all of it at the limit; the step
  # runs in the background so that a signal to this script is handled at once.
  timeout -k 5 "$t" bash "$SELF" __step "$name" >"$WORK/$name.log" 2>&1 </dev/null &
  STEP_PID=$!
  wait "$STEP_PID" || rc=$?
  STEP_PID=""
  local secs=$(( $(date +%s) - STEP_START ))
  case $rc in
    0) status=ok ;;
    3) status=skipped; note="$(tail -n 1 "$WORK/$name.log")" ;;
    124 | 137) status=timeout; note="killed at ${t} s"; FAILED=1 ;;
    *) status=failed; note="exit $rc"; FAILED=1 ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "${note//$'\t'/ }" >>"$WORK/steps.tsv"
  echo "   $status after ${secs} s${note:+: $note}"
  [[ $status == ok || $status == skipped ]] || tail -n 8 "$WORK/$name.log" | sed 's/^/   | /'
  return 0
}

echo "fourd GPU check: limit ${LIMIT} s, results in $RESULTS, python $PY, CUDA arch $ARCH"
run_step env 60
run_step setup 240
run_step build_kernels 300
run_step gtest 240
run_step kernel_bench 150
run_step torch_baseline 150
run_step install 300
run_step diagnose 240
run_step pytest_gpu 300
# mpi_gpu_2 and mpi_gpu_4 (par_gpu.py alone) only with --only: pytest_gpu's
# test_collectives_on_cuda already runs par_gpu.py on 1, 2 and 4 ranks.
[[ -z "$ONLY" ]] || { run_step mpi_gpu_2 120; run_step mpi_gpu_4 150; }
run_step mpi_gpu_bench 150
write_report
exit $FAILED
