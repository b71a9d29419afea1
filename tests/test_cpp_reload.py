"""The library across loads: ONNX Runtime unloads it (dlclose) once every session and session options that
registered it are gone, and a server that creates sessions now and then registers it again each time. Nothing
may stay allocated per register/unload cycle (the custom-op domain is released with the library, register.cc),
and a process that exits with sessions still open must exit cleanly.

Each measurement runs in a child process (the test process's own allocations would blur it) that counts the
bytes malloc holds (glibc's mallinfo2, or AddressSanitizer's count under scripts/sanitize.sh) before and after
thousands of cycles, against the same count for bare dlopen/dlclose cycles of the library (0 bytes with glibc,
the sanitizer runtime's own ~1.8 KB under ASan). Before the fix every cycle kept the domain: 640 bytes in a
CPU-only build, about 1.2 KB with the CUDA kernels."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from onnx import TensorProto, helper

import ort_ops

# The child: CYCLES cycles of MODE after WARMUP, printing {"bytes_per_cycle", "loaded_after"} as JSON.
#   bare:     dlopen and dlclose of the library, no ONNX Runtime (the loader's own cost: 0 bytes with glibc's
#             malloc, ~1.8 KB under AddressSanitizer, whose runtime keeps metadata of each instrumented load);
#   register: session options that register the library, then dropped (the library unloads each time);
#   session:  the same plus a session of the one-node model, run once, then both dropped;
#   kept:     as session, but another session options object keeps the library loaded throughout
#             (ONNX Runtime's own growth per session, the baseline for "session").
CHILD = textwrap.dedent(r"""
    import ctypes, gc, json, sys
    import numpy as np
    import onnxruntime as ort

    library, model_path, mode, cycles, warmup = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    model = open(model_path, "rb").read()
    ort.set_default_logger_severity(3)

    def allocated_counter():
        # Under AddressSanitizer (preloaded by scripts/sanitize.sh) malloc is ASan's: ask it.
        try:
            asan = ctypes.CDLL(None).__sanitizer_get_current_allocated_bytes
            asan.restype = ctypes.c_size_t
            return asan
        except AttributeError:
            pass
        libc = ctypes.CDLL("libc.so.6")
        fields = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        class MallInfo2(ctypes.Structure):
            _fields_ = [(f, ctypes.c_size_t) for f in fields]
        libc.mallinfo2.restype = MallInfo2
        return lambda: libc.mallinfo2().uordblks + libc.mallinfo2().hblkhd

    def loaded():
        with open("/proc/self/maps") as maps:
            return any(library in line for line in maps)

    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    keep = None
    if mode == "kept":
        keep = ort.SessionOptions()
        keep.register_custom_ops_library(library)

    libc = ctypes.CDLL(None)
    libc.dlopen.restype = ctypes.c_void_p
    libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.dlclose.argtypes = [ctypes.c_void_p]

    def cycle():
        if mode == "bare":
            handle = libc.dlopen(library.encode(), 2)  # RTLD_NOW
            assert handle, library
            libc.dlclose(handle)
            return
        so = ort.SessionOptions()
        so.register_custom_ops_library(library)
        if mode != "register":
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            out = sess.run(None, {"inputs": x})[0]
            assert out.shape == x.shape
            del sess
        del so

    allocated = allocated_counter()
    for _ in range(warmup):
        cycle()
    gc.collect()
    before = allocated()
    for _ in range(cycles):
        cycle()
    gc.collect()
    after = allocated()
    print(json.dumps({"bytes_per_cycle": (after - before) / cycles, "loaded_after": loaded()}))
""")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    x = helper.make_tensor_value_info("inputs", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_empty_tensor_value_info("outputs")
    node = ort_ops.make_node("FakeQuantWithMinMaxArgs", ["inputs"], ["outputs"], name="fq", min=-2.0, max=2.0)
    model = ort_ops.model.finish_model(helper.make_graph([node], "g", [x], [y]))
    path = tmp_path_factory.mktemp("reload") / "fake_quant.onnx"
    path.write_bytes(model.SerializeToString())
    return path


# Under scripts/sanitize.sh (AddressSanitizer preloaded) every load costs more: fewer cycles still show a leak.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")


def run_child(model_file, mode, cycles, warmup=200):
    if SANITIZED:
        cycles, warmup = max(cycles // 5, 200), min(warmup, 50)
    library = os.path.realpath(ort_ops.library_path())
    proc = subprocess.run([sys.executable, "-c", CHILD, library, str(model_file), mode, str(cycles), str(warmup)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bare(model_file):
    """What a plain dlopen/dlclose of the library keeps per cycle (the baseline for the unloading cycles)."""
    return run_child(model_file, "bare", 2000)["bytes_per_cycle"]


def test_register_unload_cycles_keep_no_memory(model_file, bare):
    """5,000 registrations, each unloaded again: malloc holds no more bytes after them than after as many bare
    dlopen/dlclose cycles (measured 0 and 0; the leaked domain was 640 bytes a cycle, CPU-only)."""
    result = run_child(model_file, "register", 5000)
    assert not result["loaded_after"], "the library stayed loaded: the cycles measured nothing"
    assert result["bytes_per_cycle"] - bare < 32, (result, bare)


def test_session_cycles_with_unloads_grow_no_more_than_with_the_library_kept(model_file, bare):
    """A session per cycle, the library unloaded after each, against the same cycles with the library kept
    loaded: ONNX Runtime itself keeps some 50-90 bytes a session either way; the unloads add nothing but the
    loader's own cost (the leaked domain added 600)."""
    unloaded = run_child(model_file, "session", 1000, warmup=100)
    kept = run_child(model_file, "kept", 1000, warmup=100)
    assert not unloaded["loaded_after"] and kept["loaded_after"], (unloaded, kept)
    assert unloaded["bytes_per_cycle"] - bare - kept["bytes_per_cycle"] < 256, (unloaded, kept, bare)


def test_a_process_exits_cleanly_with_sessions_open(model_file):
    """The domain is released when the library's statics are destroyed, at dlclose or at exit: a process that
    exits with its sessions (and so the library) still alive must not crash there."""
    code = textwrap.dedent("""
        import sys, numpy as np, onnxruntime as ort
        so = ort.SessionOptions()
        so.register_custom_ops_library(sys.argv[1])
        sess = ort.InferenceSession(sys.argv[2], so, providers=["CPUExecutionProvider"])
        sess.run(None, {"inputs": np.ones((2, 3, 4), np.float32)})
        sessions = [sess]   # alive at exit
        print("ran")
    """)
    proc = subprocess.run([sys.executable, "-c", code, os.path.realpath(ort_ops.library_path()), str(model_file)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", (proc.returncode, proc.stderr[-3000:])
