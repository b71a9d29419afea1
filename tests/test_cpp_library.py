"""The compiled custom-op library as a whole: it loads, exports only its entry point, registers every op
of the domain for every type combination in the specs, infers output shapes, and reports a runtime
older than the C API it needs clearly."""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_ops
from backends import library_session
from ort_ops.schemas import DOMAIN, ELEM_TYPES

REQUIRED_API_VERSION = 17  # the C API the library asks for (kRequiredApiVersion, op_base.h): onnxruntime 1.17


def typed_model(spec, combo, shaped=None):
    """One node of ``spec`` whose inputs have the element types of ``combo`` (a letter -> type map).

    ``shaped``: optional list of input shapes; by default every input has an unknown shape, so that
    only the types matter.
    """
    inputs = []
    for i, p in enumerate(spec.inputs):
        elem = ELEM_TYPES[combo.get(p.type, p.type)]
        shape = None if shaped is None else shaped[i]
        inputs.append(helper.make_tensor_value_info(p.name, elem, shape))
    outputs = [helper.make_empty_tensor_value_info(p.name) for p in spec.outputs]
    node = ort_ops.make_node(spec.name, [p.name for p in spec.inputs], [p.name for p in spec.outputs], name=spec.name,
                             **required_attrs(spec))
    return ort_ops.model.finish_model(helper.make_graph([node], spec.name, inputs, outputs))


def required_attrs(spec):
    """Plausible values for required attributes (only the depthwise ops have any)."""
    values = {"strides": [1, 1, 1, 1], "padding": "VALID"}
    return {a.name: values[a.name] for a in spec.attrs if a.required}


def test_library_file_exists_where_the_package_says():
    path = ort_ops.library_path()
    assert path.endswith(".so")
    ctypes.CDLL(path)  # loads without unresolved symbols


def test_only_the_entry_point_and_the_build_isa_and_op_table_queries_are_exported():
    out = subprocess.run(["nm", "-D", "--defined-only", ort_ops.library_path()], capture_output=True, text=True,
                         check=True).stdout
    symbols = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert symbols == ["RegisterCustomOps", "TfOpsCpuIsa", "TfOpsCudaKernelCount", "TfOpsOpTable"], symbols


def test_the_library_needs_no_cuda_runtime_to_load():
    """A CUDA build links the CUDA runtime statically: the library loads, and its CPU kernels run, on a
    machine without CUDA. Only libc/libstdc++-level libraries may be needed."""
    out = subprocess.run(["ldd", ort_ops.library_path()], capture_output=True, text=True, check=True).stdout
    assert "cudart" not in out and "libcuda" not in out, out


def test_a_cuda_build_has_a_cuda_kernel_for_every_cpu_kernel():
    """0 CUDA kernels in a CPU-only build; in a CUDA build one per op and type combination."""
    count = ort_ops.cuda_kernel_count()
    total = sum(len(spec.kernels) for spec in ort_ops.OP_SPECS)
    assert count in (0, total), (count, total)
    assert ort_ops.cuda_kernels_built() == (count > 0)


def test_installed_library_is_the_build_that_was_asked_for():
    """The installed library has CUDA kernels exactly as its build was asked: TFOPS_CUDA=ON builds them, OFF
    does not, AUTO (pip's default) only once they have passed a GPU check (TFOPS_CUDA_GPU_CHECKED) and nvcc is
    found. Where the environment names the choice (scripts/test.sh passes setup.sh's, ON where nvcc is on PATH:
    CI's CUDA variant), the build must have followed it; otherwise the note the build left says what it chose.
    Checks the installed package's library, whatever ORT_OPS_LIBRARY points the tests at."""
    from ort_ops.library import _installed_copy

    installed = _installed_copy()
    assert installed is not None, "the tests run against an installed ort-tf-ops (scripts/setup.sh)"
    info = ort_ops.cuda_build_info(installed)
    assert info["tfops_cuda"] is not None, f"no build note beside {installed}"
    asked = os.environ.get("TFOPS_CUDA", "").upper()
    if asked:
        assert info["tfops_cuda"].upper() == asked, info
    choice = info["tfops_cuda"].upper()
    nvcc = shutil.which(os.environ.get("CUDACXX", "nvcc")) is not None
    wanted = choice == "ON" or (choice == "AUTO" and bool(info["gpu_checked"]) and nvcc)
    assert ort_ops.cuda_kernels_built(installed) == wanted, info


@pytest.mark.parametrize(
    "spec,combo",
    [(spec, combo) for spec in ort_ops.OP_SPECS for combo in spec.kernels],
    ids=[f"{spec.name}-{'-'.join(c.split('(')[1][:-1] for c in combo.values()) or 'float'}"
         for spec in ort_ops.OP_SPECS for combo in spec.kernels],
)
def test_every_op_and_type_combination_is_registered(spec, combo):
    model = typed_model(spec, combo)
    library_session(model, log_severity_level=4)


def test_a_type_combination_outside_the_specs_is_not_registered():
    spec = ort_ops.get_spec("QuantizeAndDequantizeV2")
    model = typed_model(spec, {"T": "tensor(float16)"})
    with pytest.raises(Exception) as info:
        library_session(model, log_severity_level=4)
    assert "QuantizeAndDequantizeV2" in str(info.value)


@pytest.mark.parametrize(
    "op,shapes,expected",
    [
        ("FakeQuantWithMinMaxArgs", [[2, "n", 3]], [[2, "n", 3]]),
        ("FakeQuantWithMinMaxVarsGradient", [[4, 5], [4, 5], [], []], [[4, 5], [], []]),
        ("FakeQuantWithMinMaxVarsPerChannelGradient", [[6, 7], [6, 7], [7], [7]], [[6, 7], [7], [7]]),
        ("QuantizeAndDequantizeV4Grad", [[3, 4], [3, 4], [4], [4]], [[3, 4], [4], [4]]),
        ("QuantizeAndDequantizeV3", [[5, 1], [], [], []], [[5, 1]]),
    ],
)
def test_output_shapes_are_inferred_at_session_creation(op, shapes, expected):
    spec = ort_ops.get_spec(op)
    combo = spec.kernels[0]
    model = typed_model(spec, combo, shaped=shapes)
    sess = library_session(model, log_severity_level=4)
    got = [o.shape for o in sess.get_outputs()]
    assert got == expected


def test_wrong_attribute_types_are_rejected_when_the_session_is_created():
    """ORT never checks custom-op attributes: the library does, naming op and attribute."""
    spec = ort_ops.get_spec("FakeQuantWithMinMaxArgs")
    x = helper.make_tensor_value_info("inputs", TensorProto.FLOAT, [3])
    y = helper.make_empty_tensor_value_info("outputs")
    for attrs, words in (({"num_bits": 8.0}, "num_bits must be an INT"), ({"min": "a"}, "min must be a FLOAT"),
                         ({"narrow_range": 2}, "narrow_range must be 0 or 1")):
        node = helper.make_node(spec.name, ["inputs"], ["outputs"], domain=DOMAIN, **attrs)
        model = ort_ops.model.finish_model(helper.make_graph([node], "g", [x], [y]))
        with pytest.raises(Exception) as info:
            library_session(model, log_severity_level=4)
        assert "FakeQuantWithMinMaxArgs" in str(info.value) and words in str(info.value), str(info.value)


def test_tf2onnx_style_string_attribute_is_read():
    """tf2onnx writes strings as STRING attributes (bytes); round_mode=HALF_UP must take effect."""
    x = np.array([0.5, 1.5, -0.5], np.float32)
    outs = []
    for mode in (b"HALF_TO_EVEN", b"HALF_UP"):
        node = helper.make_node("QuantizeAndDequantizeV2", ["input", "input_min", "input_max"], ["output"], domain=DOMAIN,
                                round_mode=mode, range_given=1, num_bits=3)
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                  for n, s in (("input", [3]), ("input_min", []), ("input_max", []))]
        model = ort_ops.model.finish_model(
            helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info("output")]))
        sess = library_session(model, log_severity_level=4)
        outs.append(sess.run(None, {"input": x, "input_min": np.array(-4, np.float32), "input_max": np.array(3, np.float32)})[0])
    assert outs[0].tolist() == [0.0, 2.0, -0.0] and outs[1].tolist() == [1.0, 2.0, 0.0], outs


def test_runtime_older_than_the_api_it_needs_gets_a_clear_error():
    """RegisterCustomOps handed an API base that lacks the API version it needs must fail loudly, not register
    nothing. (Real runtimes: scripts/test_ort_versions.sh refuses onnxruntime 1.16 through Python.)"""
    import os

    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    runtime = next(os.path.join(capi, f) for f in os.listdir(capi) if f.startswith("libonnxruntime.so"))
    ortlib = ctypes.CDLL(runtime)

    get_api_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
    version_type = ctypes.CFUNCTYPE(ctypes.c_char_p)

    class ApiBase(ctypes.Structure):
        _fields_ = [("GetApi", get_api_type), ("GetVersionString", version_type)]

    ortlib.OrtGetApiBase.restype = ctypes.POINTER(ApiBase)
    real = ortlib.OrtGetApiBase().contents
    asked = []

    def old_get_api(version):
        asked.append(version)
        return None if version >= REQUIRED_API_VERSION else real.GetApi(version)

    fake = ApiBase(get_api_type(old_get_api), version_type(lambda: b"1.16.3"))
    lib = ctypes.CDLL(ort_ops.library_path())
    lib.RegisterCustomOps.restype = ctypes.c_void_p
    lib.RegisterCustomOps.argtypes = [ctypes.c_void_p, ctypes.POINTER(ApiBase)]
    status = lib.RegisterCustomOps(None, ctypes.byref(fake))
    assert status, "no error status for a runtime older than the API the library needs"
    assert asked[0] == REQUIRED_API_VERSION, asked
    # OrtApi starts with CreateStatus, GetErrorCode, GetErrorMessage, ...
    api = ctypes.cast(real.GetApi(1), ctypes.POINTER(ctypes.c_void_p))
    get_message = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(api[2])
    message = get_message(status).decode()  # (the one small status is not released: harmless in a test)
    assert message == (f"libort_tf_ops: onnxruntime 1.16.3 is too old: the library needs ONNX Runtime's C API "
                       f"{REQUIRED_API_VERSION}, i.e. onnxruntime 1.{REQUIRED_API_VERSION} or newer"), message
