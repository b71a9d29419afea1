#!/usr/bin/env bash
# Installs the project, with the extras named, into PYTHON's environment from a wheel of the working tree as it
# is now, which it builds only when no wheel of these sources exists yet. scripts/setup.sh (.venv) and
# scripts/test_without_tf.sh (.venv-notf) install this one wheel, so the library (its CUDA kernels take minutes
# to compile) is built once per change of its sources, not once per environment and run.
#
#   scripts/install.sh PYTHON EXTRAS [PACKAGE...]     e.g. scripts/install.sh .venv/bin/python test cmake ninja
#
# The key is a hash of every file that goes into the wheel or its build (the packages, cpp_ops, CMakeLists.txt,
# pyproject.toml, README.md: every tracked or unignored file outside the folders that are not packaged) and of
# the build's settings from the environment (TFOPS_CUDA, CUDACXX, CMAKE_ARGS, the compiler's version). Outside a
# git checkout nothing is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:?usage: scripts/install.sh PYTHON EXTRAS [PACKAGE...]}
EXTRAS=${2:?usage: scripts/install.sh PYTHON EXTRAS [PACKAGE...]}
shift 2
DIST=build/wheel

settings="TFOPS_CUDA=${TFOPS_CUDA:-} CUDACXX=${CUDACXX:-} CMAKE_ARGS=${CMAKE_ARGS:-} CXX=${CXX:-}
$(${CXX:-c++} --version 2>/dev/null | head -1)
$(command -v "${CUDACXX:-nvcc}" >/dev/null 2>&1 && "${CUDACXX:-nvcc}" --version | tail -1)"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # (a tracked file deleted from the tree is left out of the sums, which its absence changes)
  key=$({ echo "$settings"
          git ls-files -z -co --exclude-standard -- . ':!tests' ':!docs' ':!benchmarks' ':!models' ':!examples' \
              ':!tools' ':!scripts' ':!.ci' | sort -z | xargs -0 sha256sum 2>/dev/null || true; } |
        sha256sum | cut -c1-16)
else
  key=unkeyed-$$
fi
dir=$DIST/$key
wheel=$(ls "$dir"/*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  rm -rf "$DIST"   # one wheel kept: the sources' latest
  echo "install.sh: building the wheel (key $key)" >&2
  "$PYTHON" -m pip wheel -q --no-deps --disable-pip-version-check -w "$dir.tmp" . >&2
  mv "$dir.tmp" "$dir"
  wheel=$(ls "$dir"/*.whl | head -1)
fi
"$PYTHON" -m pip install -q --disable-pip-version-check "$wheel[$EXTRAS]" "$@"
# pip counts an installed ort-tf-ops of the same version as satisfied, whatever it was built from: the key decides.
marker=$("$PYTHON" -c "import sys; print(sys.prefix)")/ort-tf-ops-wheel-key
if [ "$(cat "$marker" 2>/dev/null)" != "$key" ]; then
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
  echo "$key" > "$marker"
fi
