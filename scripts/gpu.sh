#!/usr/bin/env bash
# The ONNX Runtime level of the GPU checks: the library's CUDA kernels run by onnxruntime-gpu's CUDA execution
# provider (tests/test_cuda_kernels.py, the TF-free suite, benchmarks/bench_cuda.py). Prints everything.
#
#   bash scripts/gpu.sh STAGE [STAGE ...]        (no stage: tests suite bench)
#     tests      tests/test_cuda_kernels.py with TFOPS_REQUIRE_CUDA=1: every golden and random case on the CUDA EP
#                against the CPU kernels, CUDA graphs, determinism. A skip (no GPU, no CUDA EP, a CPU-only
#                library) is a failure here. pytest-xdist, when installed, spreads it over GPU_XDIST processes
#                (default 4; 0: one process): most of its time is session creation. PYTEST_ARGS go to its pytest.
#     tests:K/N  the K-th of N shards of the same tests (test ids taken in turn: id i runs in shard i % N + 1),
#                so that each part fits one 10-minute command: use tests:1/3, tests:2/3, tests:3/3 (about 6,000
#                sessions in all; a third is well under 10 minutes with 4 processes on 16 cores).
#     suite      the rest of the TensorFlow-free suite (pytest -m "not tensorflow") against the CUDA-enabled
#                library: its CPU kernels must still pass everything (over 65 s on an H200 machine: give it
#                a call of its own; the tests it leaves out are named at its command below).
#     bench      benchmarks/bench_cuda.py (BENCH_ARGS are passed on: "--suite main", then "--suite mobilenet",
#                each fits one command).
#     kit        the conformance kit as a user runs it on the GPU: python -m ort_ops.conformance run --provider
#                CUDAExecutionProvider (every golden case; a node that falls back to the CPU fails its case);
#                with GPU_LOG_DIR its JSON report is gpu-kit.json there. Cheap (one session per case): add it to
#                the call of the suite stage.
#     pack [V]   HERE, not on the GPU machine: downloads onnxruntime-gpu V (default 1.31.1, Python 3.12) with pip,
#                splits it into chunks that fit one call each beside the working tree and the library, and prints
#                the device tool calls below with their exact chunk names.
# Every stage runs even if an earlier one failed; the exit status is 1 when any failed.
# GPU_LOG_DIR=dir also writes each stage's output to dir/gpu-<stage>.log; PYTHON picks the interpreter.
# Needs on the GPU machine: this tree; the library built with CUDA kernels (ORT_OPS_LIBRARY=path); onnxruntime-gpu
# importable (PYTHONPATH), with numpy, onnx, ml_dtypes and pytest (the lent machines have those); PyTorch for bench.
#
# ---------------------------------------------------------------------------------------------------------------
# FIRST, when a GPU is available: scripts/gpu_check.sh, the kernels without ONNX Runtime, in one call
#   run  command: GPU_LOG_DIR=$OUT bash scripts/gpu_check.sh    carry: none    timeout_s: 420
# This file is the second level: the same kernels inside ONNX Runtime. With the device tool (docs/cuda.md), from
# this checkout, in this order:
#
#  here 1. Build the CUDA library for the lent GPU only (H100/H200: sm_90), with the ORT headers of the CPU build:
#            export ORT_INCLUDE_DIR=$PWD/build/py3-none-linux_x86_64/ort_headers/usr/include/onnxruntime
#            cmake -S . -B build/cuda -G Ninja -DTFOPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real
#            cmake --build build/cuda          (build/ is ignored by git: the library travels only when carried)
#  here 2. bash scripts/gpu.sh pack
#          It puts the onnxruntime-gpu wheel in chunks .device-ort/c0 ... .device-ort/cL (ignored through
#          .git/info/exclude), each small enough to travel with the working tree under the tool's 64 MiB, the last
#          with build/cuda/libort_tf_ops.so too, and prints calls 3-5 with the real chunk names and L. (As of this
#          writing the tree is 37 MB and the sm_90 library 9.1 MB: chunks of about 27.8 MB, the last 18.6 MB.)
#  GPU  3. For K = 0 .. L-1, back to back (a machine left idle for 30 s is given back, and ~/ort with it):
#            run  carry: [".device-ort/cK"]
#                 command: mkdir -p ~/ort && cp .device-ort/cK/* ~/ort/
#                 timeout_s: 120
#  GPU  4. The last chunk, installed, then the first test shard:
#            run  carry: [".device-ort/cL", "build/cuda/libort_tf_ops.so"]
#                 command: mkdir -p ~/ort && cp .device-ort/cL/* ~/ort/ && cat ~/ort/part_* > ~/ort/$(cat ~/ort/WHEEL_NAME)
#                   && python3 -m pip install -q --no-index --no-deps --no-compile --target ~/site ~/ort/$(cat ~/ort/WHEEL_NAME)
#                   && PYTHONPATH=~/site ORT_OPS_LIBRARY=$PWD/build/cuda/libort_tf_ops.so GPU_LOG_DIR=$OUT bash scripts/gpu.sh tests:1/3
#                 timeout_s: 600
#  GPU  5. On the same warm machine, one call each, back to back, every one with
#            carry: ["build/cuda/libort_tf_ops.so"], timeout_s: 600, and the command
#              PYTHONPATH=~/site ORT_OPS_LIBRARY=$PWD/build/cuda/libort_tf_ops.so GPU_LOG_DIR=$OUT bash scripts/gpu.sh STAGE
#            for STAGE = tests:2/3, then tests:3/3, then "suite kit", then bench with BENCH_ARGS="--suite main" in front,
#            then bench with BENCH_ARGS="--suite mobilenet".
#          The logs come back from $OUT after each call. If the machine was given back in between (a gap of more
#          than 30 s, or its 30 minutes), ~/site is gone: start again at call 3.
# Budget: each call costs its transfer and its run; the chunks alone are L+1 calls of up to 64 MiB. A session
# with 15 minutes of device time should plan the ORT level on its own, after gpu_check.sh has passed.
# ---------------------------------------------------------------------------------------------------------------
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# ------------------------------------------------------------------------------------------------ pack (here)
if [ "${1:-}" = pack ]; then
  set -e
  version=${2:-1.31.1}
  lib=${GPU_LIBRARY:-build/cuda/libort_tf_ops.so}
  if [ ! -f "$lib" ]; then
    echo "gpu.sh pack: no $lib: build the CUDA library first (step 1 of this file's header)" >&2
    exit 2
  fi
  limit=$((64 * 1024 * 1024))
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
  libsize=$(stat -c %s "$lib")
  chunk=$((limit - tree - ${untracked:-0} - 2 * 1024 * 1024))  # 2 MiB to spare
  last_chunk=$((chunk - libsize))  # the last call carries the library too
  if [ "$last_chunk" -lt $((4 * 1024 * 1024)) ]; then
    echo "gpu.sh pack: the tree ($tree + ${untracked:-0} bytes) and $lib ($libsize) leave no room under 64 MiB" >&2
    exit 2
  fi
  grep -qxF '/.device-ort/' .git/info/exclude 2>/dev/null || echo '/.device-ort/' >> .git/info/exclude
  rm -rf .device-ort && mkdir -p .device-ort/wheel
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      -d .device-ort/wheel "onnxruntime-gpu==$version"
  wheel=$(ls .device-ort/wheel/*.whl)
  name=$(basename "$wheel")
  (
    cd .device-ort && split -b "$chunk" -d -a 2 "wheel/$name" part_ && rm -rf wheel
    tail_part=$(ls part_* | tail -1)
    size=$(stat -c %s "$tail_part")
    if [ "$size" -gt "$last_chunk" ]; then  # too large to travel with the library: cut it in two
      head -c $((size - last_chunk)) "$tail_part" > "${tail_part}a"
      tail -c "$last_chunk" "$tail_part" > "${tail_part}b"
      rm "$tail_part"
    fi
  )
  n=0
  for p in .device-ort/part_*; do
    mkdir -p ".device-ort/c$n" && mv "$p" ".device-ort/c$n/"
    n=$((n + 1))
  done
  last=$((n - 1))
  echo "$name" > ".device-ort/c$last/WHEEL_NAME"
  echo "gpu.sh pack: $name in $n chunks of at most $chunk bytes, the last at most $last_chunk (tree $tree + ${untracked:-0}, library $libsize)."
  echo "Device tool calls, back to back (scripts/gpu.sh header):"
  for k in $(seq 0 $((last - 1))); do
    echo "  run carry [\".device-ort/c$k\"] timeout_s 120: mkdir -p ~/ort && cp .device-ort/c$k/* ~/ort/"
  done
  echo "  run carry [\".device-ort/c$last\", \"$lib\"] timeout_s 600: mkdir -p ~/ort && cp .device-ort/c$last/* ~/ort/ && cat ~/ort/part_* > ~/ort/\$(cat ~/ort/WHEEL_NAME) && python3 -m pip install -q --no-index --no-deps --no-compile --target ~/site ~/ort/\$(cat ~/ort/WHEEL_NAME) && PYTHONPATH=~/site ORT_OPS_LIBRARY=\$PWD/$lib GPU_LOG_DIR=\$OUT bash scripts/gpu.sh tests:1/3"
  for stage in tests:2/3 tests:3/3 'suite kit' 'BENCH_ARGS="--suite main" bench' 'BENCH_ARGS="--suite mobilenet" bench'; do
    prefix=""; st=$stage
    case "$stage" in BENCH_ARGS=*) prefix="${stage% bench} "; st=bench ;; esac
    echo "  run carry [\"$lib\"] timeout_s 600: ${prefix}PYTHONPATH=~/site ORT_OPS_LIBRARY=\$PWD/$lib GPU_LOG_DIR=\$OUT bash scripts/gpu.sh $st"
  done
  exit 0
fi

# ------------------------------------------------------------------------------------------- stages (the GPU)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(tests suite bench)
for s in "${STAGES[@]}"; do
  case "$s" in
    tests|suite|bench|kit) ;;
    tests:*/*)
      k=${s#tests:}; n=${k#*/}; k=${k%/*}
      if ! [[ "$k" =~ ^[0-9]+$ && "$n" =~ ^[0-9]+$ ]] || [ "$k" -lt 1 ] || [ "$k" -gt "$n" ]; then
        echo "gpu.sh: bad shard '$s' (tests:K/N with 1 <= K <= N)" >&2; exit 2
      fi ;;
    *) echo "gpu.sh: unknown stage '$s' (tests, tests:K/N, suite, bench, kit; pack runs alone)" >&2; exit 2 ;;
  esac
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
    "$@" 2>&1 | tee "$GPU_LOG_DIR/gpu-${name//[:\/]/-}.log"
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

# The test ids of shard K of N of tests/test_cuda_kernels.py (id i goes to shard i % N + 1).
shard_ids() {
  "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider "${pytest_args[@]}" tests/test_cuda_kernels.py 2>/dev/null \
    | grep '::' | awk -v k="$1" -v n="$2" '(NR - 1) % n == k - 1'
}

run_tests() {  # [K N]
  local ids=(tests/test_cuda_kernels.py)
  if [ $# -eq 2 ]; then
    mapfile -t ids < <(shard_ids "$1" "$2")
    if [ ${#ids[@]} -eq 0 ]; then
      echo "gpu.sh: shard $1/$2 collected no tests (cannot import the test module?)"
      "$PYTHON" -m pytest --collect-only -q tests/test_cuda_kernels.py 2>&1 | tail -20
      return 1
    fi
    echo "gpu.sh: shard $1/$2: ${#ids[@]} tests"
  fi
  env TFOPS_REQUIRE_CUDA=1 "$PYTHON" -m pytest -q -p no:cacheprovider -rs "${xdist[@]}" "${pytest_args[@]}" "${ids[@]}"
}

stage machine machine
for s in "${STAGES[@]}"; do
  case "$s" in
    tests) stage tests run_tests ;;
    tests:*) k=${s#tests:}; stage "$s" run_tests "${k%/*}" "${k#*/}" ;;
    # Left out of suite, each run by CI instead: what needs onnxruntime-extensions (not on the lent machines),
    # the pip-installed package (the tree runs from source there) or the Azure provider (onnxruntime-gpu has
    # none; there the kit stage checks every node's provider on the CUDA EP). Seen on the first H200 run.
    suite) stage suite "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests -m "not tensorflow" \
             --ignore=tests/test_cuda_kernels.py --ignore=tests/test_gpu_check.py \
             --ignore=tests/test_conformance_extensions.py \
             --deselect tests/test_conformance.py::test_the_installed_package_carries_the_cases \
             --deselect tests/test_conformance.py::test_a_node_that_fell_back_to_the_cpu_fails_its_case ;;
    kit) stage kit "$PYTHON" -m ort_ops.conformance run --provider CUDAExecutionProvider \
           ${GPU_LOG_DIR:+--json "$GPU_LOG_DIR/gpu-kit.json"} ;;
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
