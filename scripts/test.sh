#!/usr/bin/env bash
# The whole test suite, in seven stages:
#  1. everything in .venv (conformance against goldens and live TensorFlow in both of its kernel modes, the C++
#     library through ONNX Runtime, the converters and the example models);
#  2. the golden tests again in .venv-notf, an environment without TensorFlow (scripts/test_without_tf.sh);
#  3. the C++ tests against an AddressSanitizer + UndefinedBehaviorSanitizer build (scripts/sanitize.sh);
#  4. the C++ serving example (scripts/example.sh);
#  5. the lowering tests with every standard model run by onnxruntime-gpu's CPU provider (scripts/test_ortgpu.sh);
#  6. every onnxruntime minor from 1.17 to the newest running the custom models and golden cases
#     (scripts/test_ort_versions.sh);
#  7. Triton Inference Server serving every custom model through its ONNX Runtime backend (scripts/triton.sh).
# TensorFlow's kernel mode is pinned by tests/conftest.py, so the result does not depend on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# The library variant setup.sh builds (CUDA kernels where nvcc is on PATH): the tests check the build followed it.
export TFOPS_CUDA=${TFOPS_CUDA:-$(command -v "${CUDACXX:-nvcc}" >/dev/null && echo ON || echo OFF)}
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# `pytest` (not `python -m pytest`) keeps the source tree off sys.path, so the tests import the
# installed ort_ops that carries the compiled library.
.venv/bin/pytest -q -p no:cacheprovider tests "$@"
bash scripts/test_without_tf.sh
bash scripts/sanitize.sh
bash scripts/example.sh   # the C++ serving example (examples/): built, run on CPU, outputs bit-compared with Python onnxruntime
bash scripts/test_ortgpu.sh   # the lowering tests with standard models run by onnxruntime-gpu's CPU provider
bash scripts/test_ort_versions.sh   # every onnxruntime from 1.17 to the newest: custom models and golden cases bit-compared with the newest, 1.16 refused
TRITON_SRC=${TRITON_SRC-../shared/triton/src} bash scripts/triton.sh   # every custom model served by Triton (ONNX Runtime backend, CPU), responses bit-compared with Python onnxruntime
