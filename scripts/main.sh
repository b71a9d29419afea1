#!/usr/bin/env bash
# The main job: convert every bundled example model, run it in ONNX Runtime with the library
# (custom lowering) and without it (standard lowering), and compare each output with TensorFlow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# TF's Eigen kernels unless asked otherwise: its default depends on the CPU (oneDNN on with AVX-512).
export TF_ENABLE_ONEDNN_OPTS=${TF_ENABLE_ONEDNN_OPTS:-0}
exec .venv/bin/python -m models.run_all "$@"
