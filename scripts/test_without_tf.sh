#!/usr/bin/env bash
# The golden tests in an environment without TensorFlow: .venv-notf holds the project (with its extensions
# extra, onnxruntime-extensions) and pytest only.
# Every test module that needs TensorFlow is deselected by its marker (and not even imported); every golden
# test runs. Proves that the committed goldens keep the suite meaningful without TF.
#
#   scripts/test_without_tf.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-notf/bin/python ]; then
  "$PYTHON" -m venv .venv-notf
  .venv-notf/bin/python -m pip install -q --upgrade pip
fi
# The CUDA variant where nvcc is on PATH, as scripts/setup.sh builds it (made explicit, as there).
export TFOPS_CUDA=${TFOPS_CUDA:-$(command -v "${CUDACXX:-nvcc}" >/dev/null && echo ON || echo OFF)}
bash scripts/install.sh .venv-notf/bin/python extensions pytest   # the wheel setup.sh installed, if the sources are unchanged
if .venv-notf/bin/python -c "import tensorflow" 2>/dev/null; then
  echo "test_without_tf.sh: TensorFlow is importable in .venv-notf; this run would prove nothing" >&2
  exit 1
fi
.venv-notf/bin/python -m pytest -q -p no:cacheprovider tests -m "not tensorflow" "$@"
# The conformance kit as a user runs it: the installed package only (run from outside the source tree, whose
# ort_ops would otherwise be imported), on each backend; every case passes or, on extensions, is named as not
# runnable there.
KIT=$(mktemp -d)
trap 'rm -rf "$KIT"' EXIT
NOTF_PYTHON=$(pwd)/.venv-notf/bin/python
for backend in ort reference extensions; do
  (cd "$KIT" && "$NOTF_PYTHON" -m ort_ops.conformance run --backend "$backend" --show 5)
done
(cd "$KIT" && "$NOTF_PYTHON" -m ort_ops.conformance export cases >/dev/null && "$NOTF_PYTHON" -c "
from onnx.backend.test.loader import load_model_tests
print('onnx.backend.test loads', len(load_model_tests('cases', 'cases')), 'cases and',
      len(load_model_tests('cases', 'rejections')), 'rejections')")
