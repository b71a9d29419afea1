#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with its test dependencies into it.
# `pip install .` builds cpp_ops (the ONNX Runtime custom-op library) through CMake and ships it
# inside the ort_ops package; the build fetches the ONNX Runtime headers itself when needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
# cmake and ninja from PyPI: scripts/sanitize.sh builds the library itself and must not depend on
# what the machine has installed (pip's own build of the project gets them in its build env).
.venv/bin/python -m pip install -q ".[test]" cmake ninja
