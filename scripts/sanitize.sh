#!/bin/sh
# Builds an AddressSanitizer + UndefinedBehaviorSanitizer variant of the custom-op library in its own
# build folder and runs every C++ test file (tests/test_cpp_*.py: parity with the NumPy kernels and
# bad input, for every op family) and every golden case (the conformance kit) against it.
#
#   scripts/sanitize.sh [extra pytest args]
#
# Python is the repository's .venv (made by scripts/setup.sh) unless PYTHON names another one. CMake
# and Ninja are taken from .venv/bin first (setup.sh installs both from PyPI), so a machine needs
# only a C++ compiler with the sanitizer runtimes. Python itself is not instrumented, so the ASan
# runtime is preloaded; leak checking is off (the interpreter and onnxruntime keep allocations until
# exit); any UBSan report aborts the run.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
BUILD="$ROOT/build/sanitize"

if [ ! -x "$PYTHON" ]; then
    echo "sanitize.sh: no Python at $PYTHON (run scripts/setup.sh, or set PYTHON)" >&2
    exit 1
fi
PATH="$ROOT/.venv/bin:$PATH"
export PATH
if command -v ninja >/dev/null 2>&1; then
    GENERATOR=Ninja
else
    GENERATOR="Unix Makefiles"
fi
# A build folder configured with another generator cannot be reused.
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$GENERATOR" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD"
fi

# The ONNX Runtime headers that `pip install .` already fetched into its build folder, if any (else
# CMake finds or fetches them itself, see CMakeLists.txt).
if [ -z "${ORT_INCLUDE_DIR:-}" ]; then
    for dir in "$ROOT"/build/*/ort_headers/usr/include/onnxruntime; do
        if [ -f "$dir/onnxruntime_c_api.h" ]; then
            ORT_INCLUDE_DIR=$dir
            export ORT_INCLUDE_DIR
            break
        fi
    done
fi

# CPU kernels only: the sanitizers instrument host code (the CUDA kernels are built and tested elsewhere).
cmake -S "$ROOT" -B "$BUILD" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTFOPS_SANITIZE=ON -DTFOPS_CUDA=OFF >/dev/null
cmake --build "$BUILD" --parallel

ASAN_RUNTIME=$(${CXX:-c++} -print-file-name=libasan.so)
UBSAN_RUNTIME=$(${CXX:-c++} -print-file-name=libubsan.so)
for runtime in "$ASAN_RUNTIME" "$UBSAN_RUNTIME"; do
    if [ ! -f "$runtime" ]; then
        echo "sanitize.sh: sanitizer runtime not found ($runtime)" >&2
        exit 1
    fi
done

cd "$ROOT"
export ORT_OPS_LIBRARY="$BUILD/libort_tf_ops.so"
export LD_PRELOAD="$ASAN_RUNTIME $UBSAN_RUNTIME"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH="$ROOT"
export TF_CPP_MIN_LOG_LEVEL=2
export TF_ENABLE_ONEDNN_OPTS=0
"$PYTHON" -m pytest -q -p no:cacheprovider tests/test_cpp_*.py "$@"
# Every golden case (TF's rejections included) through the conformance kit, on the instrumented library.
"$PYTHON" -m ort_ops.conformance run --library "$BUILD/libort_tf_ops.so"
