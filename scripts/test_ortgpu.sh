#!/usr/bin/env bash
# The lowering tests again, with every standard-ONNX model run by onnxruntime-gpu's CPUExecutionProvider.
#
# That wheel is built with C++ library assertions: a node with an empty or inverted range (a Conv whose
# dilated kernel is larger than its padded input, a Slice of a negative-size dim, ...) aborts the process
# there (`std::clamp ... Assertion '!(__hi < __lo)' failed`), where a build without them may run on. Its
# CPU provider needs no GPU. onnxruntime and onnxruntime-gpu cannot share an environment (both are the
# `onnxruntime` package), so .venv-ortgpu holds onnxruntime-gpu and NumPy only; the tests themselves run
# in .venv (TensorFlow builds the models and gives the expected outputs) and hand each standard-domain
# model to a child process in .venv-ortgpu (tests/isolated_ort.py). An abort there fails the test that
# ran the model, with the model named and saved; a run in which no model went there fails too.
#
#   scripts/test_ortgpu.sh [extra pytest args]      (after scripts/setup.sh, which makes .venv)
#
#   scripts/test_ortgpu.sh [pytest args]
#   scripts/test_ortgpu.sh --list     prints the test files this stage runs (scripts/test.sh runs them here only)
set -euo pipefail
cd "$(dirname "$0")/.."
TEST_FILES="tests/test_standard_lowering.py tests/test_standard_lowering_edges.py tests/test_standard_lean.py
  tests/test_standard_safe.py tests/test_gradient_ops.py tests/test_gradient_ops_extra.py"
if [ "${1:-}" = --list ]; then
  printf '%s\n' $TEST_FILES
  exit 0
fi
PYTHON=${PYTHON:-python3}
# Pinned so that CI does not change under us; 1.31.1 is the newest for Python 3.11 as of this writing.
ORTGPU_VERSION=${ORTGPU_VERSION:-1.31.1}
if [ ! -x .venv-ortgpu/bin/python ]; then
  "$PYTHON" -m venv .venv-ortgpu
  .venv-ortgpu/bin/python -m pip install -q --upgrade pip
fi
.venv-ortgpu/bin/python -m pip install -q "onnxruntime-gpu==$ORTGPU_VERSION" numpy
# Prove it is the GPU build (its provider list names CUDA) and that its CPU provider starts without a GPU.
.venv-ortgpu/bin/python - <<'EOF'
import onnxruntime as ort
assert "CUDAExecutionProvider" in ort.get_available_providers(), ort.get_available_providers()
print(f"test_ortgpu.sh: onnxruntime-gpu {ort.__version__}, CPUExecutionProvider runs the models")
EOF
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export TFOPS_TEST_ORT_PYTHON="$PWD/.venv-ortgpu/bin/python"
export TFOPS_TEST_ORT_FAILED_DIR=${TFOPS_TEST_ORT_FAILED_DIR:-$PWD/build/ortgpu-failures}
.venv/bin/pytest -q -p no:cacheprovider $TEST_FILES "$@"
