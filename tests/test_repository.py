"""The repository names no location of a developer's machine.

A path such as the absolute path of one engineer's virtual environment or home folder in a script,
test or config works on one machine only: everywhere else the command fails with "No such file or directory" before it does
anything useful. Every tracked text file is scanned for absolute paths under the top-level
directories of a Unix or macOS file system (and Windows user folders). A few system paths that mean
the same thing on every machine are allowed explicitly (``ALLOWED``).

Files come from ``git ls-files``; outside a git checkout (an unpacked sdist) the file tree is walked
instead, leaving out build outputs and environments. TensorFlow is not needed.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Top-level directories of Unix/macOS file systems. A path under one of them is specific to a
# machine unless ALLOWED says otherwise.
ROOTS = (
    "bin", "boot", "dev", "etc", "home", "lib", "lib64", "media", "mnt", "opt", "proc", "root", "run", "sbin",
    "srv", "sys", "tmp", "usr", "var", "work", "workspace", "scratch", "Users", "Volumes", "private",
)
# An absolute path starts a token: not after a word character, a dot, another slash, a `$VAR` or
# `${VAR}` (a path relative to a variable), `]` or `~`, so relative paths ("build/tmp"), URLs
# ("https://host/home/x") and "$ROOT/var" do not count. "file:///x" and "${VAR:-/x}" do.
UNIX_PATH = re.compile(
    r"(?:(?<=file://)|(?<![\w.$}\]/~]))/(?:" + "|".join(ROOTS) + r")(?![\w.-])(?:/[^\s'\"`)\]},;:]*)?"
)
WINDOWS_PATH = re.compile(r"\b[A-Za-z]:[\\/]+(?:Users|Documents and Settings)(?:[\\/][^\s'\"`)\]},;]*)?", re.I)

# System paths that are the same on every machine, as prefixes (a path equal to one or below it).
ALLOWED = (
    "/usr/bin/env",  # shebangs
    "/bin/sh",
    "/bin/bash",
    "/dev/null",
    "/dev/stdin",
    "/dev/stdout",
    "/dev/stderr",
    "/proc/",  # kernel interfaces (e.g. /proc/cpuinfo)
    "/sys/devices/system/cpu/",
    "/etc/apt/",  # Debian's own package sources (tools/fetch_ort_headers.sh reads them)
    "/usr/share/keyrings/",  # Debian's archive keys
)

# Walked trees outside git: what `git ls-files` would not list (see .gitignore).
UNTRACKED_DIRS = {".git", ".venv", "build", "dist", "_skbuild", "__pycache__", ".pytest_cache", "third_party"}
MAX_BYTES = 2_000_000  # larger files are data (ONNX models, goldens), checked for binary content anyway


def is_allowed(path: str) -> bool:
    return any(path == prefix.rstrip("/") or path.startswith(prefix.rstrip("/") + "/") for prefix in ALLOWED)


def machine_paths(text: str):
    """(line number, path) of every machine-specific absolute path in ``text``."""
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in UNIX_PATH.finditer(line):
            path = match.group(0).rstrip(".")
            if not is_allowed(path):
                hits.append((number, path))
        hits.extend((number, match.group(0)) for match in WINDOWS_PATH.finditer(line))
    return hits


def tracked_files(root: Path):
    """Relative paths of the repository's files: git's list, or the walked tree outside a checkout."""
    if (root / ".git").exists():
        git = shutil.which("git")
        assert git, f"{root} is a git checkout but no `git` command is on PATH to list its files"
        result = subprocess.run([git, "-C", str(root), "ls-files", "-z"], capture_output=True, check=False)
        assert result.returncode == 0, f"git ls-files failed: {result.stderr.decode(errors='replace')}"
        return [name for name in result.stdout.decode().split("\0") if name]
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in UNTRACKED_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and not path.name.endswith((".pyc", ".so")):
            files.append(rel.as_posix())
    return files


def read_text(path: Path):
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()[:MAX_BYTES]
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def scan(root: Path):
    """``file:line: path`` for every hit in the repository's text files."""
    report = []
    for name in tracked_files(root):
        path = root / name
        if not path.is_file():  # deleted in the work tree but still in git's index
            continue
        text = read_text(path)
        if text is None:
            continue
        report.extend(f"{name}:{line}: {hit}" for line, hit in machine_paths(text))
    return report


def test_no_tracked_file_names_a_path_of_a_developer_machine():
    files = tracked_files(ROOT)
    assert len(files) > 20, f"found only {len(files)} files under {ROOT}: the listing is broken"
    hits = scan(ROOT)
    assert not hits, "absolute paths of one machine (use paths relative to the repository):\n" + "\n".join(hits)


def plant(line: str) -> str:
    """A bad line for the detector tests. They are written with ``^`` for the slash that starts the
    machine path, so that this file itself stays clean for the repository scan."""
    return line.replace("^", "/")


@pytest.mark.parametrize(
    "line",
    [
        "PYTHON=${PYTHON:-^work/venv/bin/python}",
        "    cd ^work/main && PYTHONPATH=. python -m models.run_all",
        'data = np.load("^home/alice/goldens/x.npz")',
        "export PATH=^root/.local/bin:$PATH",
        'open("^tmp/out.onnx", "wb")',
        "see ^Users/bob/src/tf-ort-ops",
        "ORT_INCLUDE_DIR=^opt/onnxruntime/include cmake ..",
        "url = 'file://^mnt/share/model.onnx'",
        "PYTHON=^usr/local/bin/python3.11",
        'r"C:' + '\\Users\\carol\\models\\m.onnx"',
        "C:^Users/carol/models",
        "cache under ^var/tmp",
    ],
)
def test_detector_catches_a_planted_path(line):
    assert machine_paths(plant(line)), f"not caught: {plant(line)!r}"


@pytest.mark.parametrize(
    "line",
    [
        "#!/usr/bin/env bash",
        "#!/bin/sh",
        "command -v ninja >/dev/null 2>&1",
        "grep flags /proc/cpuinfo",
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg",
        'BUILD="$ROOT/build/sanitize"',
        "see https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/kernels/x.cc",
        "build/tmp/objects and tests/golden/",
        "ratio = a / b  # NHWC/NCHW",
        '"${HOME}/work" and $TMPDIR/tmp',
    ],
)
def test_detector_leaves_legitimate_text_alone(line):
    assert not machine_paths(line), machine_paths(line)


def test_scan_reports_file_and_line_of_a_planted_file(tmp_path):
    """The whole scan (listing, binary skip, report) on a small tree outside git: a planted line is reported
    with its file and line, a binary file with the same bytes is skipped."""
    (tmp_path / "scripts").mkdir()
    venv_python = plant("^work/venv/bin/python")
    (tmp_path / "scripts" / "run.sh").write_text(f"#!/usr/bin/env bash\nset -eu\nPYTHON={venv_python}\n")
    (tmp_path / "model.onnx").write_bytes(b"\0\x01" + venv_python.encode() + b"\0")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY={plant('^work/main')}\n")  # not tracked
    assert scan(tmp_path) == [f"scripts/run.sh:3: {venv_python}"]


# ---------------------------------------------------------------- import cycles


def _import_edges(packages=("converters", "ort_ops")) -> dict:
    """module -> modules of ``packages`` it imports, at module level or inside a function (a lazy import is
    still a dependency). An import of a package's own parent is not an edge."""
    import ast

    modules = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    edges = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            edges[module] |= {t for t in targets if t in modules and t != module and not module.startswith(t + ".")}
    return edges


def _cycles(edges: dict) -> list:
    """Every simple cycle, each listed once from its smallest module name."""
    found = []

    def walk(start, node, path):
        for nxt in sorted(edges[node]):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return found


def test_no_import_cycles():
    """The conversion core must not depend on the QA module that checks it (issue 14's cycle
    frontends -> pipeline -> verification -> frontends), nor any module on itself through others."""
    cycles = _cycles(_import_edges())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
