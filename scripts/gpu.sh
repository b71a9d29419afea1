#!/usr/bin/env bash
# The GPU checks of the CUDA kernels in one command, on a machine with an NVIDIA GPU. Prints everything.
#
#   bash scripts/gpu.sh [tests] [suite] [bench]        (no argument: all three, in this order)
#
# Needs there, and no package registry: this repository's tree; the library built with CUDA kernels
# (ORT_OPS_LIBRARY=path/to/libort_tf_ops.so, or the installed ort-tf-ops package); onnxruntime-gpu importable
# (PYTHONPATH may point at it), with numpy, onnx, ml_dtypes and pytest; PyTorch with CUDA for the benchmark.
#   tests  tests/test_cuda_kernels.py with TFOPS_REQUIRE_CUDA=1: every golden and random case on the CUDA EP
#          against the CPU kernels, CUDA graphs, determinism. A skip (no GPU, no CUDA EP, a CPU-only library)
#          is a failure here.
#          pytest-xdist, when installed, spreads it over GPU_XDIST processes (default 4; 0: one process):
#          most of its time is session creation. PYTEST_ARGS go to this stage's pytest (e.g. '-k goldens' and
#          then '-k "not goldens"' to split it over two calls).
#   suite  the rest of the TensorFlow-free suite (pytest -m "not tensorflow") against the CUDA-enabled
#          library: its CPU kernels must still pass everything (about a minute on one core).
#   bench  benchmarks/bench_cuda.py (BENCH_ARGS, e.g. "--suite main", are passed on).
# Every stage runs even if an earlier one failed; the exit status is 1 when any failed.
# GPU_LOG_DIR=dir also writes each stage's output to dir/gpu-<stage>.log; PYTHON picks the interpreter.
#
# With the device tool, from the lead's checkout on the machine without a GPU (the tool sends that checkout):
#   1. Build the CUDA library here (nvcc compiles without a GPU), for the lent GPU only (H100/H200: sm_90):
#        export ORT_INCLUDE_DIR=<ORT headers, as for the CPU build>
#        cmake -S . -B build/cuda -G Ninja -DTFOPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real
#        cmake --build build/cuda
#      build/ is ignored by git: name build/cuda/libort_tf_ops.so in the run call's `carry`.
#   2. bash ../shared/tools/ort-gpu-on-device.sh packs onnxruntime-gpu (Python 3.12 wheel) into
#      .device-ort/c0 ... cN and prints one command per chunk. Send each chunk but the last in its own run
#      call (carry [".device-ort/cK"]), with the command it prints.
#   3. The last call: carry [".device-ort/cN", "build/cuda/libort_tf_ops.so"], command (N: the last chunk):
#        mkdir -p ~/ort && cp .device-ort/cN/* ~/ort/ && cat ~/ort/part_* > ~/ort/$(cat ~/ort/WHEEL_NAME) &&
#        python3 -m pip install -q --no-index --no-deps --no-compile --target ~/site ~/ort/*.whl &&
#        PYTHONPATH=~/site ORT_OPS_LIBRARY=$PWD/build/cuda/libort_tf_ops.so GPU_LOG_DIR=$OUT bash scripts/gpu.sh
#      The logs come back from $OUT. A run call has 10 minutes: if all three stages do not fit, run them in
#      separate calls while the machine is warm (`... bash scripts/gpu.sh tests`, then `suite`, then `bench`);
#      later calls on the same machine need only PYTHONPATH=~/site and the carried .so.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(tests suite bench)
for s in "${STAGES[@]}"; do
  case "$s" in tests|suite|bench) ;; *) echo "gpu.sh: unknown stage '$s' (tests, suite, bench)" >&2; exit 2 ;; esac
done
[ -n "${GPU_LOG_DIR:-}" ] && mkdir -p "$GPU_LOG_DIR"

# Runs one stage, tee'd to its log when GPU_LOG_DIR is set; records a failure.
failed=()
stage() {
  local name=$1; shift
  echo
  echo "=============================== gpu.sh: $name ==============================="
  local start=$SECONDS rc
  if [ -n "${GPU_LOG_DIR:-}" ]; then
    "$@" 2>&1 | tee "$GPU_LOG_DIR/gpu-$name.log"
  else
    "$@" 2>&1
  fi
  rc=${PIPESTATUS[0]}
  echo "=== gpu.sh: $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -ne 0 ] && failed+=("$name")
  return 0
}

machine() {
  if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "(no nvidia-smi)"; fi
  "$PYTHON" - <<'EOF'
import platform
import onnxruntime as ort
if hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
import ort_ops
print(f"Python {platform.python_version()}, onnxruntime {ort.__version__} from {ort.__file__}")
print(f"providers: {ort.get_available_providers()}")
print(f"library: {ort_ops.library_path()}: {ort_ops.cuda_kernel_count()} CUDA kernels")
try:
    import torch
    print(f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}, GPU: "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none visible'}")
except ImportError:
    print("PyTorch: not installed (the benchmark needs it)")
import sys
sys.path.insert(0, "tests")
import cuda_support
print(f"CUDA tests: {cuda_support.unavailable_reason() or 'can run'}")
EOF
}

xdist=()
if [ "${GPU_XDIST:-4}" != 0 ] && "$PYTHON" -c "import xdist" 2>/dev/null; then
  xdist=(-n "${GPU_XDIST:-4}")
fi
eval "pytest_args=(${PYTEST_ARGS:-})"  # (eval: quoted words stay one argument)

stage machine machine
for s in "${STAGES[@]}"; do
  case "$s" in
    tests) stage tests env TFOPS_REQUIRE_CUDA=1 "$PYTHON" -m pytest -q -p no:cacheprovider -rs "${xdist[@]}" \
             "${pytest_args[@]}" tests/test_cuda_kernels.py ;;
    suite) stage suite "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests -m "not tensorflow" \
             --ignore=tests/test_cuda_kernels.py ;;
    bench) # shellcheck disable=SC2086  (BENCH_ARGS is a list of words)
           stage bench "$PYTHON" benchmarks/bench_cuda.py ${BENCH_ARGS:-} ;;
  esac
done
echo
if [ ${#failed[@]} -ne 0 ]; then
  echo "gpu.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu.sh: all stages passed (${STAGES[*]})"
