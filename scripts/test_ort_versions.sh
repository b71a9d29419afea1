#!/usr/bin/env bash
# The library on every onnxruntime it supports: one environment per minor version from 1.17 to the newest (the
# last patch of each; onnxruntime and NumPy only), each running every bundled model (both lowerings, the shipped
# files as they are) and a sample of the golden cases through the library, compared bit for bit with the newest
# version's results; and onnxruntime 1.16, which the library must refuse with a Python error naming both
# versions (no crash).
#
#   scripts/test_ort_versions.sh [LIBRARY]        (after scripts/setup.sh, which makes .venv)
#
# LIBRARY: the custom-op library (default: what `ort_ops.library_path()` finds in .venv, i.e. ORT_OPS_LIBRARY or
# the installed package's copy). The environments live in .venv-ort/<minor> and are reused when they hold the
# wanted version (pip's cache makes a new one quick); the cases and results go to build/ort-versions/.
#
#  1. .venv writes the cases (tools/ort_versions/prepare.py): the models on models/run_all.py's seeded inputs, the
#     golden cases as the golden tests' one-node models.
#  2. The newest version runs them and writes the reference (tools/ort_versions/run_cases.py --write); every
#     other version runs them and compares (--compare): the outputs of each golden case and the output shapes
#     the library's shape inference declares for it, the library's error where there is one; each model's
#     outputs, and where onnxruntime's own ops changed bits between versions, every domain node whose inputs are
#     still the newest's (see run_cases.py). Any "Shape mismatch" or "Error merging shape info" line in
#     onnxruntime's log (sessions at log severity 2: a declared shape is wrong) fails the stage too.
#  3. onnxruntime 1.16 must refuse the library.
#  4. The C++ serving example (scripts/example.sh: examples/run_model.cc against the shipped models, outputs bit
#     for bit against Python onnxruntime of the same version) on the oldest version and the newest. The oldest's
#     Python wheel links libonnxruntime into its module (wheels ship the .so from 1.19), so its .so comes from
#     onnxruntime's Node.js package of the same version (`npm pack onnxruntime-node@V`, kept in .venv-ort/;
#     npm is installed with apt-get where missing).
#
# ORT_VERSIONS (space-separated) replaces the list below; its last entry is the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}              # makes the environments
MAIN_PYTHON=${MAIN_PYTHON:-.venv/bin/python}
# The last patch of every minor version from 1.17, newest last (pinned so that CI does not change under us).
ORT_VERSIONS=${ORT_VERSIONS:-"1.17.3 1.18.1 1.19.2 1.20.1 1.21.1 1.22.1 1.23.2 1.24.4 1.25.1 1.26.0 1.27.0 1.28.0 1.29.0 1.30.0 1.31.1 1.32.0"}
REFUSED_VERSION=${REFUSED_VERSION:-1.16.3}
VENVS=.venv-ort
WORK=build/ort-versions
started=$SECONDS

if [ ! -x "$MAIN_PYTHON" ]; then
    echo "test_ort_versions.sh: no Python at $MAIN_PYTHON (run scripts/setup.sh, or set MAIN_PYTHON)" >&2
    exit 1
fi
LIBRARY=${1:-$("$MAIN_PYTHON" -c "import ort_ops; print(ort_ops.library_path())")}
LIBRARY=$(cd "$(dirname "$LIBRARY")" && pwd)/$(basename "$LIBRARY")

# The environment of onnxruntime VERSION: .venv-ort/<major.minor>, made or remade unless it holds VERSION. It
# holds onnxruntime and NumPy and nothing else (onnxruntime's other requirements serve its tools, not sessions),
# installed by .venv's pip (`pip --python`), so that a new one takes seconds: no pip of its own, pip's cache.
# NumPy: onnxruntime before 1.19 was built against NumPy 1.x.
environment() {
    local version=$1 dir=$VENVS/${1%.*} numpy=numpy
    case $version in 1.1[0-8].*) numpy="numpy<2" ;; esac
    if [ -x "$dir/bin/python" ] &&
        "$dir/bin/python" -c "import sys, importlib.metadata as m; sys.exit(m.version('onnxruntime') != '$version' or not m.version('numpy'))" 2>/dev/null; then
        return 0
    fi
    rm -rf "$dir"
    "$PYTHON" -m venv --without-pip "$dir"
    "$MAIN_PYTHON" -m pip --python "$dir/bin/python" install -q --disable-pip-version-check --no-deps \
        "onnxruntime==$version" "$numpy"
}

# Up to JOBS at a time (the environments, then the versions' runs: each session has one intra-op thread).
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
in_parallel() {  # in_parallel FUNCTION ARG...: FUNCTION ARG for each ARG, JOBS at a time; fails if any failed
    local arg failed=0 running=0
    for arg in "${@:2}"; do
        "$1" "$arg" &
        running=$((running + 1))
        if [ "$running" -ge "$JOBS" ]; then wait -n || failed=1; running=$((running - 1)); fi
    done
    while [ "$running" -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
    return $failed
}

mkdir -p "$VENVS"
in_parallel environment $ORT_VERSIONS $REFUSED_VERSION
echo "test_ort_versions.sh: environments ready ($((SECONDS - started)) s): onnxruntime $ORT_VERSIONS, and $REFUSED_VERSION"

rm -rf "$WORK"
"$MAIN_PYTHON" tools/ort_versions/prepare.py "$WORK/cases"

set -- $ORT_VERSIONS
NEWEST=${!#}
status=0
"$VENVS/${NEWEST%.*}/bin/python" tools/ort_versions/run_cases.py "$WORK/cases" "$LIBRARY" --write "$WORK/reference" || status=1
compare() {  # each version's report goes to its log, printed below in the versions' order
    "$VENVS/${1%.*}/bin/python" tools/ort_versions/run_cases.py "$WORK/cases" "$LIBRARY" \
        --compare "$WORK/reference" > "$WORK/compare-$1.log" 2>&1
}
older=$(for version in $ORT_VERSIONS; do [ "$version" = "$NEWEST" ] || echo "$version"; done)
in_parallel compare $older || status=1
for version in $older; do cat "$WORK/compare-$version.log"; done
# The refusal: a Python exception naming both versions, and the process ends normally (a crash would not).
"$VENVS/${REFUSED_VERSION%.*}/bin/python" tools/ort_versions/run_cases.py - "$LIBRARY" --expect-refused 2>/dev/null || status=1


# 4. The C++ example on the oldest and the newest version.
OLDEST=$1
oldest_ort_library() {  # prints the path of onnxruntime $OLDEST's libonnxruntime.so for linux-x64
    local dir=$VENVS/node-$OLDEST so
    so=$dir/package/bin/napi-v3/linux/x64/libonnxruntime.so.$OLDEST
    if [ ! -f "$so" ]; then
        if ! command -v npm >/dev/null; then
            echo "test_ort_versions.sh: installing npm with apt-get (to fetch onnxruntime $OLDEST's libonnxruntime.so)" >&2
            command -v apt-get >/dev/null || { echo "test_ort_versions.sh: no npm and no apt-get" >&2; return 1; }
            local sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
            $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm >/dev/null ||
                { $sudo apt-get update -q >/dev/null &&
                  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm >/dev/null; } || return 1
        fi
        rm -rf "$dir" && mkdir -p "$dir"
        (cd "$dir" && npm pack --silent "onnxruntime-node@$OLDEST" >/dev/null &&
            tar xzf "onnxruntime-node-$OLDEST.tgz" package/bin/napi-v3/linux/x64 && rm "onnxruntime-node-$OLDEST.tgz") >&2 ||
            return 1
    fi
    echo "$(cd "$(dirname "$so")" && pwd)/$(basename "$so")"
}
if so=$(oldest_ort_library); then
    PATH="$PWD/.venv/bin:$PATH" PYTHON="$VENVS/${OLDEST%.*}/bin/python" ORT_LIBRARY="$so" \
        bash scripts/example.sh "$LIBRARY" > "$WORK/example-$OLDEST.log" 2>&1 ||
        { echo "test_ort_versions.sh: the C++ example failed on onnxruntime $OLDEST:" >&2; tail -20 "$WORK/example-$OLDEST.log" >&2; status=1; }
else
    echo "test_ort_versions.sh: could not get onnxruntime $OLDEST's libonnxruntime.so" >&2
    status=1
fi
PATH="$PWD/.venv/bin:$PATH" PYTHON="$VENVS/${NEWEST%.*}/bin/python" bash scripts/example.sh "$LIBRARY" \
    > "$WORK/example-$NEWEST.log" 2>&1 ||
    { echo "test_ort_versions.sh: the C++ example failed on onnxruntime $NEWEST:" >&2; tail -20 "$WORK/example-$NEWEST.log" >&2; status=1; }
[ "$status" = 0 ] && echo "test_ort_versions.sh: the C++ example runs on onnxruntime $OLDEST and $NEWEST, bit-identical to Python's"
if [ "$status" != 0 ]; then
    echo "test_ort_versions.sh: FAILED ($((SECONDS - started)) s)" >&2
    exit 1
fi
echo "test_ort_versions.sh: OK, onnxruntime ${1} to $NEWEST ($# versions), the refusal of $REFUSED_VERSION and the C++ example ($((SECONDS - started)) s)"
