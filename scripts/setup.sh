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
# The CUDA kernels: a plain `pip install .` (TFOPS_CUDA=AUTO, CMakeLists.txt) builds them where a CUDA
# compiler is found. Here the choice is made explicit, ON wherever nvcc is on PATH (so that CI always compiles
# them and runs the CPU suite against that library, and fails if it cannot), else OFF. TFOPS_CUDA set by the
# caller wins.
if [ -z "${TFOPS_CUDA:-}" ]; then
  if command -v "${CUDACXX:-nvcc}" >/dev/null 2>&1; then TFOPS_CUDA=ON; else TFOPS_CUDA=OFF; fi
fi
export TFOPS_CUDA
echo "setup.sh: TFOPS_CUDA=$TFOPS_CUDA"
# The project with its test extra, from the wheel of the tree as it is (built here unless these sources were
# built before: scripts/install.sh). cmake and ninja from PyPI: scripts/sanitize.sh builds the library itself
# and must not depend on what the machine has installed (pip's own build of the project gets them in its build
# env).
bash scripts/install.sh .venv/bin/python test cmake ninja
