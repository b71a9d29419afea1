#!/usr/bin/env bash
# Builds the C++ serving example (examples/run_model.cc) and proves it right: it runs bundled models through
# the program on the CPU execution provider, then runs the same models through Python onnxruntime on the very
# inputs the program fed (it writes them as .npy) and requires every output to be bit-identical. It also
# checks that bad input gives a clear error and a non-zero exit status.
#
#   scripts/example.sh [LIBRARY]
#
# LIBRARY: the custom-op library (default: what `ort_ops.library_path()` finds, i.e. ORT_OPS_LIBRARY or the
# installed package's copy). Python is the repository's .venv (scripts/setup.sh) unless PYTHON names another;
# ONNX Runtime is that Python's onnxruntime wheel (its libonnxruntime.so, which the program dlopens), unless
# ORT_LIBRARY names the libonnxruntime.so of the same version (wheels before 1.19 link it into their Python
# module: scripts/test_ort_versions.sh runs this script on 1.17.3 so).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
BUILD="$ROOT/build/example"
THREADS=1   # the same intra-op thread count on both sides

if [ ! -x "$PYTHON" ]; then
    echo "example.sh: no Python at $PYTHON (run scripts/setup.sh, or set PYTHON)" >&2
    exit 1
fi
PATH="$(dirname "$PYTHON"):$PATH"
export PATH
cd "$ROOT"

LIBRARY=${1:-$("$PYTHON" -c "import ort_ops; print(ort_ops.library_path())")}
ORT_LIBRARY=${ORT_LIBRARY:-$("$PYTHON" -c "
import glob, os, onnxruntime
found = sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi', 'libonnxruntime.so*')))
print(found[0] if found else '')")}
if [ -z "$ORT_LIBRARY" ]; then
    echo "example.sh: the onnxruntime wheel of $PYTHON has no capi/libonnxruntime.so*" >&2
    exit 1
fi

# Build (ONNX Runtime headers: ORT_INCLUDE_DIR, else examples/CMakeLists.txt finds or fetches them).
if command -v ninja >/dev/null 2>&1; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$GENERATOR" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD"
fi
cmake -S examples -B "$BUILD" -G "$GENERATOR" >/dev/null
cmake --build "$BUILD" --parallel
RUN_MODEL="$BUILD/run_model"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

run() {  # run NAME MODEL [run_model options...]: run the program, its outputs into $WORK/NAME
    local name=$1 model=$2
    shift 2
    echo "== run_model $model $*"
    "$RUN_MODEL" --model "$model" --library "$LIBRARY" --ort "$ORT_LIBRARY" --threads "$THREADS" --show 4 \
        --output-dir "$WORK/$name" "$@"
    echo "$name $model" >> "$WORK/cases"
}

# Inputs from .npy files for the training step (float32 images, int32 labels); pattern inputs elsewhere.
"$PYTHON" - "$WORK" <<'EOF'
import sys, numpy as np
rng = np.random.default_rng(10)
np.save(f"{sys.argv[1]}/images.npy", rng.normal(size=(8, 16, 16, 3)).astype(np.float32))
np.save(f"{sys.argv[1]}/labels.npy", rng.integers(0, 10, size=8).astype(np.int32))
EOF
run fourbit_cnn models/fourbit_cnn/model.custom.onnx --provider cpu --free-dim 3
run fourbit_cnn_train_step models/fourbit_cnn_train_step/model.custom.onnx --provider cpu \
    --input "images=$WORK/images.npy" --input "labels=$WORK/labels.npy"
run qdq models/qdq/model.custom.onnx --provider cpu
run mobilenet_v2_qat models/mobilenet_v2_qat/model.custom.onnx --provider cpu --free-dim 2
# The provider choice a server makes (CUDA when offered): compared below only when it chose the CPU.
run auto models/fourbit_cnn/model.custom.onnx --provider auto

# The same models and inputs through Python onnxruntime on the CPU: every output bit for bit.
"$PYTHON" - "$WORK" "$LIBRARY" "$THREADS" <<'EOF'
import sys
from pathlib import Path
import numpy as np
import onnxruntime as ort

work, library, threads = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
failures = []
for line in (work / "cases").read_text().splitlines():
    name, model = line.split(" ", 1)
    rows = [r.split("\t") for r in (work / name / "manifest.tsv").read_text().splitlines()]
    provider = next(r[1] for r in rows if r[0] == "provider")
    if provider != "CPUExecutionProvider":
        print(f"example: {name}: ran on {provider}; not compared (the comparison is on the CPU)")
        continue
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(library)
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    inputs = [r for r in rows if r[0] == "input"]
    outputs = [r for r in rows if r[0] == "output"]
    assert [r[2] for r in inputs] == [i.name for i in sess.get_inputs()], f"{name}: input names differ"
    assert [r[2] for r in outputs] == [o.name for o in sess.get_outputs()], f"{name}: output names differ"
    feeds = {r[2]: np.load(work / name / r[3]) for r in inputs}
    if name == "fourbit_cnn_train_step":  # the program fed exactly the files it was given
        for k in ("images", "labels"):
            given = np.load(work / f"{k}.npy")
            assert given.dtype == feeds[k].dtype and given.tobytes() == feeds[k].tobytes(), f"{name}: input {k}"
    expected = sess.run(None, feeds)
    bad = []
    for r, want in zip(outputs, expected):
        got = np.load(work / name / r[3])
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            bad.append(f"{r[2]} ({got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}, "
                       f"max |diff| {np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0)})")
    if bad:
        failures.append(f"{name}: {len(bad)} of {len(outputs)} outputs differ: " + "; ".join(bad[:5]))
    else:
        print(f"example: {name}: {len(outputs)} output{'s' if len(outputs) != 1 else ''} bit-identical to Python onnxruntime "
              f"({', '.join(f'{k}{list(v.shape)}' for k, v in feeds.items())})")
if failures:
    sys.exit("example.sh: FAILED\n  " + "\n  ".join(failures))
EOF

# Errors: a clear message on stderr and a non-zero status.
expect_error() {  # expect_error STATUS TEXT [run_model options...]
    local want=$1 text=$2 status=0
    shift 2
    "$RUN_MODEL" "$@" > "$WORK/stdout" 2> "$WORK/stderr" || status=$?
    if [ "$status" != "$want" ] || ! grep -qF -- "$text" "$WORK/stderr"; then
        echo "example.sh: FAILED: run_model $* gave status $status (want $want), stderr:" >&2
        cat "$WORK/stderr" >&2
        exit 1
    fi
    echo "example: expected error (status $status): $(head -n 1 "$WORK/stderr")"
}
COMMON=(--model models/fourbit_cnn/model.custom.onnx --library "$LIBRARY" --ort "$ORT_LIBRARY")
expect_error 2 "unknown option '--bogus'" "${COMMON[@]}" --bogus 1
expect_error 1 "no custom-op library" --model models/fourbit_cnn/model.custom.onnx --library "$WORK/missing.so"
expect_error 1 "cannot load ONNX Runtime" "${COMMON[@]}" --ort "$WORK/missing.so"
expect_error 1 "holds '<i4' but input 'images' is float32" "${COMMON[@]}" --input "images=$WORK/labels.npy"
expect_error 1 "the model has no such input" "${COMMON[@]}" --input "pixels=$WORK/images.npy"
# A file that is not a custom-op library: ONNX Runtime's own error, passed on.
expect_error 1 "run_model: error: ONNX Runtime:" "${COMMON[@]}" --library "$ROOT/models/qdq/model.custom.onnx"
echo "example.sh: OK"
