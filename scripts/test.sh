#!/usr/bin/env bash
# The whole test suite, in seven stages. Each test file runs once, in the stage whose environment is the most
# demanding for it:
#  1. the tests that need TensorFlow, in .venv (conformance against live TensorFlow in both of its kernel modes,
#     the converters and the example models), but for the lowering tests of stage 5;
#  2. every test that needs no TensorFlow (the golden tests, the C++ library through ONNX Runtime, the schemas),
#     in .venv-notf, an environment without TensorFlow, then the conformance kit on its three backends from the
#     installed package (scripts/test_without_tf.sh);
#  3. the C++ tests again against an AddressSanitizer + UndefinedBehaviorSanitizer build (scripts/sanitize.sh);
#  4. the C++ serving example (scripts/example.sh);
#  5. the lowering tests, with every standard model run by onnxruntime-gpu's CPU provider, an assertion-enabled
#     build (scripts/test_ortgpu.sh; the custom models run in .venv's onnxruntime, as in stage 1);
#  6. every onnxruntime minor from 1.17 to the newest running the custom models and golden cases
#     (scripts/test_ort_versions.sh);
#  7. Triton Inference Server serving every custom model through its ONNX Runtime backend (scripts/triton.sh).
# Extra arguments go to stage 1's pytest. TensorFlow's kernel mode is pinned by tests/conftest.py, so the result
# does not depend on the CPU. The library is built once (scripts/install.sh) and installed in both environments.
set -euo pipefail
cd "$(dirname "$0")/.."
# The library variant setup.sh builds (CUDA kernels where nvcc is on PATH): the tests check the build followed it.
export TFOPS_CUDA=${TFOPS_CUDA:-$(command -v "${CUDACXX:-nvcc}" >/dev/null && echo ON || echo OFF)}
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# `pytest` (not `python -m pytest`) keeps the source tree off sys.path, so the tests import the
# installed ort_ops that carries the compiled library.
stage5=$(bash scripts/test_ortgpu.sh --list | sed 's/^/--ignore=/')
# Each lane stops at its first failing stage (chained with &&: `set -e` does not hold in a function run as
# `lane || ...`).
tf_lane() {  # stages 1 and 5
  .venv/bin/pytest -q -p no:cacheprovider tests -m tensorflow $stage5 "$@" &&
  bash scripts/test_ortgpu.sh   # the lowering tests with standard models run by onnxruntime-gpu's CPU provider
}
other_lane() {  # stages 2, 3, 4, 6 and 7
  bash scripts/test_without_tf.sh &&
  bash scripts/sanitize.sh &&
  bash scripts/example.sh &&  # the C++ serving example (examples/): built, run on CPU, outputs bit-compared with Python onnxruntime
  bash scripts/test_ort_versions.sh &&  # every onnxruntime from 1.17 to the newest: custom models and golden cases bit-compared with the newest, 1.16 refused
  TRITON_SRC=${TRITON_SRC-../shared/triton/src} bash scripts/triton.sh   # every custom model served by Triton (ONNX Runtime backend, CPU), responses bit-compared with Python onnxruntime
}
# The two lanes run side by side: most of each is one Python thread, and a CI machine has two cores or more.
# The second lane's output goes to its log, printed when both are done.
mkdir -p build
log=build/test-other-lane.log
echo "test.sh: stages 2, 3, 4, 6 and 7 run beside stages 1 and 5; their output: $log"
other_lane > "$log" 2>&1 &
other=$!
tf_status=0
tf_lane "$@" || tf_status=$?
other_status=0
wait "$other" || other_status=$?
echo "======== stages 2, 3, 4, 6 and 7 ($log)"
cat "$log"
if [ "$tf_status" != 0 ] || [ "$other_status" != 0 ]; then
  echo "test.sh: FAILED (stages 1 and 5: exit $tf_status; stages 2, 3, 4, 6 and 7: exit $other_status)" >&2
  exit 1
fi
echo "test.sh: all seven stages passed"
