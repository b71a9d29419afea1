#!/bin/sh
# Builds an AddressSanitizer + UndefinedBehaviorSanitizer variant of the custom-op library in its own
# build folder and runs the C++ parity and bad-input tests against it.
#
#   scripts/sanitize.sh [extra pytest args]
#
# Python itself is not instrumented, so the ASan runtime is preloaded; leak checking is off (the
# interpreter and onnxruntime keep allocations until exit); any UBSan report aborts the run.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/work/venv/bin/python}
BUILD="$ROOT/build/sanitize"

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTFOPS_SANITIZE=ON >/dev/null
cmake --build "$BUILD"

ASAN_RUNTIME=$(${CXX:-c++} -print-file-name=libasan.so)
UBSAN_RUNTIME=$(${CXX:-c++} -print-file-name=libubsan.so)
if [ ! -f "$ASAN_RUNTIME" ]; then
    echo "sanitize.sh: no ASan runtime found ($ASAN_RUNTIME)" >&2
    exit 1
fi

cd "$ROOT"
ORT_OPS_LIBRARY="$BUILD/libort_tf_ops.so" \
LD_PRELOAD="$ASAN_RUNTIME $UBSAN_RUNTIME" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
PYTHONPATH="$ROOT" \
TF_CPP_MIN_LOG_LEVEL=2 \
    "$PYTHON" -m pytest -q -p no:cacheprovider \
        tests/test_cpp_quantization.py tests/test_cpp_isolation.py tests/test_cpp_library.py "$@"
