#!/usr/bin/env bash
# Serves every bundled custom-lowering model (models/*/model.custom.onnx), and the QAT MobileNetV2's integer model
# (models/mobilenet_v2_qat/model.integer.onnx: standard QDQ, no library), through Triton Inference Server's
# ONNX Runtime backend on the CPU, with docs/serving.md's config.pbtxt (model_operations naming the installed
# libort_tf_ops.so), sends each model requests from several concurrent clients (tritonclient[http]) and
# requires every response to be bit-identical to Python onnxruntime with the library on the same inputs. A
# repository entry without model_operations must fail to load, the server's load error naming the op.
#
#   scripts/triton.sh            (TRITON_SRC=DIR: the Triton sources, see below)
#
# What it puts together, cached under .triton/ (ignored by git) so that a rerun only serves and compares:
#  - the server: Triton 2.51.0's `tritonserver` binary and core library, unzipped (not installed: installing
#    it pins numpy<2) from the nvidia-pytriton==0.7.0 wheel, which `pip download` fetches;
#  - the backend: Triton's onnxruntime_backend, built here from source against the ONNX Runtime of .venv
#    (the wheel's libonnxruntime.so, with the C headers the library's build fetched). The sources
#    (onnxruntime_backend, backend, common and core at the release branch r24.10, matching that server) come
#    from TRITON_SRC; with TRITON_SRC unset or empty the four repositories are cloned with git (from
#    TRITON_GIT/<name>.git, by default Triton's GitHub organization) into .triton/. The build
#    needs Debian's rapidjson-dev and googletest: when missing they are installed with apt-get
#    (non-interactively; this needs root);
#  - the client: a venv (.triton/client-venv) with tritonclient[http] and NumPy.
# Python is the repository's .venv (scripts/setup.sh) unless PYTHON names another; it must have ort_ops and
# onnxruntime installed. The intra-op thread count is 1 on both sides (ORT's own Conv filter gradient changes
# its last bits with the thread count). Exit status 0 only when every response matched and the entry without
# model_operations failed to load for the right reason.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
CACHE="$ROOT/.triton"
TRITON_BRANCH=r24.10          # Triton 2.51.0, the server inside nvidia-pytriton 0.7.0
PYTRITON_VERSION=0.7.0
TRITONCLIENT_VERSION=2.73.0
TRITON_GIT=${TRITON_GIT:-https://github.com/triton-inference-server}   # where the four repositories are cloned from
CLIENTS=${TRITON_CLIENTS:-4}  # concurrent clients per model
PORT=${TRITON_HTTP_PORT:-}

say() { echo "triton.sh: $*"; }
die() { echo "triton.sh: error: $*" >&2; exit 1; }

[ -x "$PYTHON" ] || die "no Python at $PYTHON (run scripts/setup.sh, or set PYTHON)"
cd "$ROOT"
mkdir -p "$CACHE"
START=$SECONDS

# ---- onnxruntime: the runtime library of PYTHON's wheel, and C headers ----------------------------------
read -r ORT_VERSION ORT_LIBRARY LIBRARY < <("$PYTHON" -c "
import glob, os, onnxruntime, ort_ops
found = sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi', 'libonnxruntime.so.*')))
print(onnxruntime.__version__, found[0] if found else '-', os.path.abspath(ort_ops.library_path()))")
[ -f "$ORT_LIBRARY" ] || die "the onnxruntime wheel of $PYTHON has no capi/libonnxruntime.so.*"
[ -f "$LIBRARY" ] || die "the custom-op library $LIBRARY does not exist"
# The headers `pip install .` fetched into its build folder (as scripts/sanitize.sh finds them), else
# ORT_INCLUDE_DIR, else fetched here the way the library's build does (tools/fetch_ort_headers.sh).
if [ -z "${ORT_INCLUDE_DIR:-}" ]; then
    for dir in "$ROOT"/build/*/ort_headers/usr/include/onnxruntime; do
        if [ -f "$dir/onnxruntime_c_api.h" ]; then ORT_INCLUDE_DIR=$dir; break; fi
    done
fi
if [ -z "${ORT_INCLUDE_DIR:-}" ]; then
    sh tools/fetch_ort_headers.sh "$CACHE/ort_headers"
    ORT_INCLUDE_DIR="$CACHE/ort_headers/usr/include/onnxruntime"
fi
[ -f "$ORT_INCLUDE_DIR/onnxruntime_c_api.h" ] || die "no onnxruntime_c_api.h in $ORT_INCLUDE_DIR"
ORT_HEADERS_VERSION=$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/1.\1/p' "$ORT_INCLUDE_DIR/onnxruntime_c_api.h")

# ---- the server: unzipped from the nvidia-pytriton wheel --------------------------------------------------
SERVER_DIR="$CACHE/server-$PYTRITON_VERSION"
TRITONSERVER="$SERVER_DIR/pytriton/tritonserver/bin/tritonserver"
if [ ! -x "$TRITONSERVER" ]; then
    say "downloading nvidia-pytriton==$PYTRITON_VERSION (the server binary and its core library)"
    rm -rf "$SERVER_DIR" "$CACHE/wheel"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_35_x86_64 \
        "nvidia-pytriton==$PYTRITON_VERSION" -d "$CACHE/wheel"
    mkdir -p "$SERVER_DIR.tmp"
    "$PYTHON" -m zipfile -e "$CACHE"/wheel/nvidia_pytriton-*.whl "$SERVER_DIR.tmp"
    chmod +x "$SERVER_DIR.tmp/pytriton/tritonserver/bin/tritonserver"
    mv "$SERVER_DIR.tmp" "$SERVER_DIR"
    rm -rf "$CACHE/wheel"
fi
CORE_LIBRARY=$(ls "$SERVER_DIR"/nvidia_pytriton.libs/libtritonserver-*.so | head -n 1)
[ -f "$CORE_LIBRARY" ] || die "no libtritonserver-*.so in the nvidia-pytriton wheel"

# ---- the backend: onnxruntime_backend built from source --------------------------------------------------
BACKENDS="$CACHE/backends-$ORT_VERSION"
BACKEND_SO="$BACKENDS/onnxruntime/libtriton_onnxruntime.so"
if [ ! -f "$BACKEND_SO" ]; then
    if [ -z "${TRITON_SRC:-}" ]; then
        TRITON_SRC="$CACHE/src-$TRITON_BRANCH"
        for repo in onnxruntime_backend backend common core; do
            if [ ! -d "$TRITON_SRC/$repo" ]; then
                say "cloning Triton's $repo at $TRITON_BRANCH (TRITON_SRC not given)"
                rm -rf "$TRITON_SRC/$repo.tmp"
                git clone -q --depth 1 --branch "$TRITON_BRANCH" "$TRITON_GIT/$repo.git" "$TRITON_SRC/$repo.tmp"
                mv "$TRITON_SRC/$repo.tmp" "$TRITON_SRC/$repo"
            fi
        done
    fi
    case "$TRITON_SRC" in /*) ;; *) TRITON_SRC="$ROOT/$TRITON_SRC" ;; esac
    for repo in onnxruntime_backend backend common core; do
        [ -f "$TRITON_SRC/$repo/CMakeLists.txt" ] || die "TRITON_SRC=$TRITON_SRC has no $repo/CMakeLists.txt"
    done
    # Debian packages the build reads: rapidjson (backend, common) and googletest (common's CMake adds its
    # test folder unconditionally; configured, never built).
    debian_has() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
    if ! debian_has rapidjson-dev || ! debian_has googletest; then
        say "installing Debian's rapidjson-dev and googletest with apt-get (needed by the backend's build)"
        command -v apt-get >/dev/null || die "rapidjson-dev and googletest are missing and there is no apt-get"
        SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q rapidjson-dev googletest >/dev/null ||
            { $SUDO apt-get update -q >/dev/null &&
              $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q rapidjson-dev googletest >/dev/null; }
    fi
    # googletest's source tree, where Debian put it: the folder of the shortest CMakeLists.txt it installed.
    GOOGLETEST_SRC=$(dpkg -L googletest | grep 'CMakeLists.txt$' | awk '{ print length, $0 }' | sort -n | head -n 1 |
                     cut -d' ' -f2-)
    [ -n "$GOOGLETEST_SRC" ] || die "the googletest package lists no CMakeLists.txt"
    GOOGLETEST_SRC=$(dirname "$GOOGLETEST_SRC")
    # A folder with libonnxruntime.so for the link: the wheel's runtime library under the unversioned name.
    ORT_LIB_DIR="$CACHE/ort-lib-$ORT_VERSION"
    mkdir -p "$ORT_LIB_DIR"
    ln -sf "$ORT_LIBRARY" "$ORT_LIB_DIR/libonnxruntime.so"
    BUILD="$CACHE/backend-build-$ORT_VERSION"
    if command -v ninja >/dev/null 2>&1 || [ -x "$(dirname "$PYTHON")/ninja" ]; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
    say "building Triton's onnxruntime_backend ($TRITON_BRANCH) against onnxruntime $ORT_VERSION (headers $ORT_HEADERS_VERSION)"
    PATH="$(dirname "$PYTHON"):$PATH" cmake -S "$TRITON_SRC/onnxruntime_backend" -B "$BUILD" -G "$GENERATOR" \
        -DCMAKE_BUILD_TYPE=Release \
        -DTRITON_ENABLE_GPU=OFF -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF \
        -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$ORT_INCLUDE_DIR" -DTRITON_ONNXRUNTIME_LIB_PATHS="$ORT_LIB_DIR" \
        -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
        -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$TRITON_SRC/common" \
        -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$TRITON_SRC/core" \
        -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$TRITON_SRC/backend" \
        -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST="$GOOGLETEST_SRC" >"$CACHE/backend-configure.log" 2>&1 ||
        { tail -n 30 "$CACHE/backend-configure.log" >&2; die "configuring the backend failed (log: $CACHE/backend-configure.log)"; }
    PATH="$(dirname "$PYTHON"):$PATH" cmake --build "$BUILD" --target triton-onnxruntime-backend --parallel \
        >"$CACHE/backend-build.log" 2>&1 ||
        { tail -n 30 "$CACHE/backend-build.log" >&2; die "building the backend failed (log: $CACHE/backend-build.log)"; }
    # The backend folder: the backend, the runtime it loads (RUNPATH $ORIGIN) and the core library under the
    # name the backend asks for.
    rm -rf "$BACKENDS.tmp"
    mkdir -p "$BACKENDS.tmp/onnxruntime"
    cp "$BUILD/libtriton_onnxruntime.so" "$BACKENDS.tmp/onnxruntime/"
    cp "$ORT_LIBRARY" "$BACKENDS.tmp/onnxruntime/"
    ORT_SONAME=$(basename "$ORT_LIBRARY")
    for name in libonnxruntime.so libonnxruntime.so.1; do
        [ "$name" = "$ORT_SONAME" ] || ln -sf "$ORT_SONAME" "$BACKENDS.tmp/onnxruntime/$name"
    done
    rm -rf "$BACKENDS"
    mv "$BACKENDS.tmp" "$BACKENDS"
fi
ln -sf "$CORE_LIBRARY" "$BACKENDS/onnxruntime/libtritonserver.so"

# ---- the client ---------------------------------------------------------------------------------------------
CLIENT_VENV="$CACHE/client-venv"
if ! "$CLIENT_VENV/bin/python" -c "import tritonclient.http, numpy" >/dev/null 2>&1; then
    say "creating $CLIENT_VENV with tritonclient[http]==$TRITONCLIENT_VERSION"
    rm -rf "$CLIENT_VENV"
    "$(command -v python3 || echo "$PYTHON")" -m venv "$CLIENT_VENV"
    "$CLIENT_VENV/bin/python" -m pip install -q "tritonclient[http]==$TRITONCLIENT_VERSION" numpy
fi
TRITONCLIENT_INSTALLED=$("$CLIENT_VENV/bin/python" -c "import importlib.metadata as m; print(m.version('tritonclient'))")
say "ready in $((SECONDS - START)) s: tritonserver from nvidia-pytriton $PYTRITON_VERSION, onnxruntime_backend $TRITON_BRANCH on onnxruntime $ORT_VERSION (headers $ORT_HEADERS_VERSION), tritonclient $TRITONCLIENT_INSTALLED"

# ---- the model repository, the inputs and Python onnxruntime's outputs --------------------------------------
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
"$PYTHON" tools/triton/make_repository.py --library "$LIBRARY" --repository "$WORK/repository" \
    --cases "$WORK/cases" --clients "$CLIENTS" models/*/model.custom.onnx models/mobilenet_v2_qat/model.integer.onnx

# ---- the server -----------------------------------------------------------------------------------------------
if [ -z "$PORT" ]; then
    PORT=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
fi
# Explicit model control: the client loads each entry and reads the load error of the one that must fail.
"$TRITONSERVER" --model-repository="$WORK/repository" --backend-directory="$BACKENDS" \
    --model-control-mode=explicit --allow-grpc=false --allow-metrics=false --allow-gpu-metrics=false \
    --http-address=127.0.0.1 --http-port="$PORT" --log-verbose=0 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
status=0
"$CLIENT_VENV/bin/python" tools/triton/client.py --url "127.0.0.1:$PORT" --cases "$WORK/cases" \
    --server-pid "$SERVER_PID" || status=$?
if [ "$status" != 0 ]; then
    echo "triton.sh: the server's log (last 40 lines):" >&2
    tail -n 40 "$WORK/server.log" >&2
    die "FAILED (client exit status $status)"
fi
say "OK in $((SECONDS - START)) s"
