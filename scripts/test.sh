#!/usr/bin/env bash
# The whole test suite: conformance (goldens + live TensorFlow comparisons), the C++ library
# through ONNX Runtime, the converters and the example models; then the parity and bad-input
# tests again against an AddressSanitizer + UndefinedBehaviorSanitizer build of the library.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# `pytest` (not `python -m pytest`) keeps the source tree off sys.path, so the tests import the
# installed ort_ops that carries the compiled library.
.venv/bin/pytest -q -p no:cacheprovider tests "$@"
bash scripts/sanitize.sh
