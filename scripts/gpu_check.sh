#!/usr/bin/env bash
# The CUDA kernels checked in one command: the library's ORT-free CUDA launchers against its CPU kernels on the
# same inputs (no ONNX Runtime, no onnxruntime-gpu, nothing fetched), built on the machine for its GPU only.
# On a lent H100/H200 (nvcc, CMake, ninja, Python 3.12 with NumPy and PyTorch) it takes about 4-5 minutes,
# the build included, and stops its optional stages so as to end within GPU_CHECK_BUDGET_S (default 330 s).
#
#   bash scripts/gpu_check.sh            (GPU_LOG_DIR=dir keeps the logs, the JSON and the table there)
#
# The first thing to run when a GPU is available; with the device tool, one call from the repository root:
#   run  command: GPU_LOG_DIR=$OUT bash scripts/gpu_check.sh     carry: (none)     timeout_s: 420
# (the working tree travels as it is; nothing is built here first; the table is at the end of output_tail and
# the files come back from $OUT).
#
# Stages (docs/cuda.md, "The GPU check"):
#   1. cases   tools/gpu_check/export_cases.py: ort_ops/conformance/goldens/*.npz -> build/gpu_check/cases (NumPy only)
#   2. build   cpp_ops/gpu_check (its own CMake project): the library's CPU kernels, and with a GPU its CUDA
#              kernels for that GPU's architecture, with the library's exactness flags
#   3. check   gpu_check: every golden case and the seeded random cases of every op, type and layout (large ones
#              included: grids past 65,535 block rows or channels, over 2^24 and 2^26 elements; empty tensors;
#              sizes that are not multiples of the vector width), CPU against TF's goldens; with a GPU each case
#              three times on a non-default stream (two output poisons, then misaligned buffers) against the CPU
#              kernels (quantization and fused ops bit for bit, NaN payloads included; float ops to the suite's
#              tolerances) and, per op and type, a CUDA graph captured and replayed on new inputs, and a timing
#              (CUDA events, L2 flushed) against a device-to-device copy of the same bytes
#   4. memcheck  (GPU) compute-sanitizer --tool memcheck over one case per op, type and layout
#   5. torch     (GPU) tools/gpu_check/torch_times.py: PyTorch's equivalents on the same timing cases
#   6. report    tools/gpu_check/report.py: one table, GPU_LOG_DIR/gpu_check_report.json; exit 1 on any mismatch,
#              CUDA error, coverage gap or memcheck error
# GPU_LOG_DIR gets at most 7 files (the device tool brings back 8): build.log, gpu_check.log, gpu_check.json,
# memcheck.log, memcheck.json, torch.log, gpu_check_report.json (the table, the problems and all results).
# Without a GPU (CI: tests/test_gpu_check.py, or GPU_CHECK_MODE=cpu) stages 1-3 and 6 run the CPU half: no CUDA
# is compiled, and the check runs the goldens against the CPU kernels, the random cases (large ones left out
# unless GPU_CHECK_ARGS says otherwise) on the CPU, the coverage of every type combination and layout, and the
# judge's self-test, so that none of it rots.
#
# Environment: GPU_CHECK_MODE=auto|gpu|cpu (auto: gpu when nvidia-smi lists a GPU and nvcc is on PATH),
# GPU_LOG_DIR (default build/gpu_check/logs), GPU_CHECK_BUILD (default build/gpu_check), GPU_CHECK_ARGS (more
# arguments for gpu_check, e.g. "--ops FakeQuantWithMinMaxVars"), GPU_CHECK_BUDGET_S, PYTHON (default python3),
# GPU_CHECK_CASES (an exported case folder to use instead of exporting, e.g. one made with --corrupt).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
BUILD=${GPU_CHECK_BUILD:-$ROOT/build/gpu_check}
LOG=${GPU_LOG_DIR:-$BUILD/logs}
BUDGET=${GPU_CHECK_BUDGET_S:-330}
mkdir -p "$BUILD" "$LOG"
LOG=$(cd "$LOG" && pwd)
export PYTHONUNBUFFERED=1
start=$SECONDS
say() { echo "gpu_check.sh [$((SECONDS - start)) s]: $*"; }

mode=${GPU_CHECK_MODE:-auto}
if [ "$mode" = auto ]; then
  mode=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU" \
     && command -v "${CUDACXX:-nvcc}" >/dev/null 2>&1; then
    mode=gpu
  fi
fi
case "$mode" in gpu|cpu) ;; *) echo "gpu_check.sh: GPU_CHECK_MODE must be auto, gpu or cpu" >&2; exit 2 ;; esac
say "mode $mode; logs in $LOG"
if [ "$mode" = gpu ]; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/  GPU: /'
  "${CUDACXX:-nvcc}" --version | tail -1 | sed 's/^/  nvcc: /'
fi

# 1. cases
CASES=${GPU_CHECK_CASES:-}
if [ -z "$CASES" ]; then
  CASES=$BUILD/cases
  "$PYTHON" tools/gpu_check/export_cases.py --out "$CASES" || { say "the case export failed"; exit 1; }
fi

# 2. build
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
if [ "$mode" = gpu ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  cmake_args+=(-DGPU_CHECK_CUDA=ON)
  [ -n "$cap" ] && cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=${cap}-real")
else
  cmake_args+=(-DGPU_CHECK_CUDA=OFF)
fi
OBJ=$BUILD/$mode
# A folder configured with another generator cannot be reused.
if [ -f "$OBJ/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}$" "$OBJ/CMakeCache.txt"; then
  rm -rf "$OBJ"
fi
say "building cpp_ops/gpu_check ($mode${cap:+, sm_$cap})"
{ cmake -S cpp_ops/gpu_check -B "$OBJ" "${generator[@]}" "${cmake_args[@]}" >/dev/null &&
  cmake --build "$OBJ" --parallel "$(nproc 2>/dev/null || echo 4)"; } > "$LOG/build.log" 2>&1
if [ $? -ne 0 ]; then
  tail -40 "$LOG/build.log"
  say "the build failed (log: $LOG/build.log)"
  exit 1
fi
say "built"

# 3. check
check_args=(--cases "$CASES" --out "$LOG/gpu_check.json")
[ "$mode" = cpu ] && check_args+=(--cpu-only --no-large)
# shellcheck disable=SC2206  (GPU_CHECK_ARGS is a list of words)
check_args+=(${GPU_CHECK_ARGS:-})
left=$((BUDGET - (SECONDS - start) + 30))  # the check itself is never cut short before the budget's end
[ "$left" -lt 120 ] && left=120
timeout "$left" "$OBJ/gpu_check" "${check_args[@]}" 2>&1 | tee "$LOG/gpu_check.log"
check_rc=${PIPESTATUS[0]}
[ "$check_rc" -eq 124 ] && say "the check did not finish in $left s"
say "check exit $check_rc"

# 4. memcheck and 5. torch, in the time left (a rerun can skip them: GPU_CHECK_BUDGET_S=0)
memcheck_status="not run"
torch_status="not run"
if [ "$mode" = gpu ] && [ "$check_rc" -le 1 ]; then
  sanitizer=$(command -v compute-sanitizer)  # else beside nvcc, in the toolkit's bin folder
  nvcc_dir=$(dirname "$(readlink -f "$(command -v "${CUDACXX:-nvcc}")")")
  [ -z "$sanitizer" ] && [ -x "$nvcc_dir/compute-sanitizer" ] && sanitizer=$nvcc_dir/compute-sanitizer
  left=$((BUDGET - (SECONDS - start) - 45))  # keep 45 s for PyTorch and the report
  if [ -z "$sanitizer" ]; then
    memcheck_status="not run (no compute-sanitizer)"
  elif [ "$left" -lt 30 ]; then
    memcheck_status="not run (no time left)"
  else
    say "memcheck (at most $left s)"
    timeout "$left" "$sanitizer" --tool memcheck --error-exitcode 3 --print-limit 20 \
      "$OBJ/gpu_check" --cases "$CASES" --memcheck --out "$LOG/memcheck.json" > "$LOG/memcheck.log" 2>&1
    rc=$?
    case $rc in
      0) memcheck_status=ok ;;
      124) memcheck_status="not finished in $left s" ;;
      3) memcheck_status="errors (memcheck.log)"; grep -m 20 -E "Invalid|Error|=========" "$LOG/memcheck.log" | head -20 ;;
      *) memcheck_status="exit $rc (memcheck.log)"; tail -5 "$LOG/memcheck.log" ;;
    esac
    say "memcheck: $memcheck_status"
  fi
  left=$((BUDGET - (SECONDS - start) - 10))
  if [ "$left" -ge 20 ] && [ -f "$LOG/gpu_check.json" ]; then
    say "PyTorch timings (at most $left s)"
    timeout "$left" "$PYTHON" tools/gpu_check/torch_times.py "$LOG/gpu_check.json" > "$LOG/torch.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then torch_status=ok; else torch_status="failed, exit $rc (torch.log)"; tail -3 "$LOG/torch.log"; fi
  else
    torch_status="not run (no time left)"
  fi
fi

# 6. report
"$PYTHON" tools/gpu_check/report.py "$LOG/gpu_check.json" --memcheck "$LOG/memcheck.json" \
  --memcheck-status "$memcheck_status" --torch-status "$torch_status" \
  --json-out "$LOG/gpu_check_report.json"
report_rc=$?
say "done"
[ "$check_rc" -eq 0 ] && [ "$report_rc" -eq 0 ] && exit 0
exit 1
