#!/bin/sh
# Puts ONNX Runtime's C/C++ headers under DEST/usr/include/onnxruntime without installing anything:
# downloads Debian's libonnxruntime-dev (suite trixie, ORT 1.21) with apt-get from the archive this
# machine already uses, and unpacks it with dpkg -x.
#
#   tools/fetch_ort_headers.sh DEST
#
# The archive URI is read from this machine's own Debian source entry, so no host name is written
# anywhere. apt works on a temporary sources list and list directory only (the system's apt state
# is not touched).
set -eu

DEST=${1:?usage: fetch_ort_headers.sh DEST}
PACKAGE=libonnxruntime-dev
SUITE=trixie
HEADER="$DEST/usr/include/onnxruntime/onnxruntime_c_api.h"

if [ -f "$HEADER" ]; then
    exit 0
fi
for tool in apt-get dpkg; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "fetch_ort_headers: $tool not found; install ONNX Runtime headers and pass -DORT_INCLUDE_DIR=<dir> (or set ORT_INCLUDE_DIR)" >&2
        exit 1
    fi
done

# The first main (non-security) Debian archive URI of this machine's apt configuration.
archive_uri() {
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
            /etc/apt/sources.list.d/debian.sources
    fi
    if [ -f /etc/apt/sources.list ]; then
        # "deb [options] URI suite components": the URI is the first field after the options.
        sed -e 's/\[[^]]*\]//' /etc/apt/sources.list |
            awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }'
    fi
}
URI=$(archive_uri | head -n 1)
if [ -z "$URI" ]; then
    echo "fetch_ort_headers: no Debian archive URI in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list;" \
         "pass -DORT_INCLUDE_DIR=<dir with onnxruntime_c_api.h>" >&2
    exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/lists/partial" "$WORK/cache/archives/partial" "$WORK/deb"
cat >"$WORK/$SUITE.sources" <<SOURCES
Types: deb
URIs: $URI
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES

APT_OPTS="-o Dir::Etc::SourceList=$WORK/$SUITE.sources -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists=$WORK/lists -o Dir::Cache=$WORK/cache -o Debug::NoLocking=1
          -o Acquire::Languages=none"
# shellcheck disable=SC2086
apt-get $APT_OPTS -qq update
# shellcheck disable=SC2086
(cd "$WORK/deb" && apt-get $APT_OPTS -qq download "$PACKAGE")
DEB=$(ls "$WORK/deb"/"$PACKAGE"_*.deb)
mkdir -p "$DEST"
dpkg -x "$DEB" "$DEST"
if [ ! -f "$HEADER" ]; then
    echo "fetch_ort_headers: $DEB did not contain $HEADER" >&2
    exit 1
fi
echo "fetch_ort_headers: ONNX Runtime headers from $(basename "$DEB") in $DEST/usr/include/onnxruntime"
