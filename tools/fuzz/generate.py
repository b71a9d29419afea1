"""The seeded case generator: a valid case for each op of the domain, then (often) one mutation into an
input class the kernels must survive.

Valid cases come from the op's family builder (shapes that fit together, attributes in range, values with
special values mixed in). Mutations: a dimension changed (0, 1, one more, huge), a rank added or dropped, an
input of the wrong element type or all inputs of another allowed type, a shape input's values made
negative, INT32_MAX or over the library's size cap, an attribute out of its range, and special values
(subnormals, +-0, NaN, Inf) placed where they matter most (ranges, epsilon, variance, filter taps).
Every case is checked by ``cases.is_safe`` (no legitimate multi-gigabyte output), else drawn again.
"""
from __future__ import annotations

import numpy as np

import ort_ops
from ort_ops.spec import numpy_dtype
from tools.fuzz import values as V
from tools.fuzz.cases import MAX_INPUT_ELEMENTS, Case, is_safe

F32 = np.dtype(np.float32)
QDQ_OPS = ("QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4")


def _special_rate(rng):
    return float(rng.choice([0.0, 0.0, 0.05, 0.3]))


def _bound_pair(rng):
    """A [min, max] range: ordinary, degenerate, inverted, subnormal, or with specials."""
    r = rng.random()
    if r < 0.55:
        lo = float(np.float32(-abs(rng.normal()) * 4 * rng.random()))
        return lo, float(np.float32(lo + abs(rng.normal()) * 6 + 1e-3))
    if r < 0.65:
        return 0.0, 0.0
    if r < 0.75:
        return 1.0, -1.0
    if r < 0.87:
        s = float(rng.choice([1e-38, 1e-40, 1e-45]))
        return -s, s
    pool = V.specials(F32)
    return float(rng.choice(pool)), float(rng.choice(pool))


def _fake_quant(rng, op):
    spec = ort_ops.get_spec(op)
    rate = _special_rate(rng)
    per_channel = "PerChannel" in op
    x_shape = V.shape(rng, int(rng.integers(1 if per_channel else 0, 5)), vector_axis=-1)
    x = V.floats(rng, x_shape, F32, rate)
    attrs = {"num_bits": int(rng.integers(2, 17)), "narrow_range": bool(rng.random() < 0.3)}
    inputs = []
    for p in spec.inputs:
        if p.name == "inputs":
            inputs.append(x)
        elif p.name == "gradients":
            inputs.append(V.floats(rng, x_shape, F32, rate))
    if "Args" in op:
        attrs["min"], attrs["max"] = _bound_pair(rng)
    else:
        d = x_shape[-1] if per_channel else None
        pairs = [_bound_pair(rng) for _ in range(d if per_channel else 1)]
        lo = np.array([p[0] for p in pairs], np.float32)
        hi = np.array([p[1] for p in pairs], np.float32)
        inputs += [lo, hi] if per_channel else [lo.reshape(()), hi.reshape(())]
    return Case(op, inputs, attrs, "valid")


def _qdq(rng, op):
    dtype = np.dtype(rng.choice([np.float32, np.float64]))
    rank = int(rng.integers(0, 5))
    axis = int(rng.integers(0, rank)) if rank and rng.random() < 0.3 else -1
    shape = V.shape(rng, rank, vector_axis=axis if axis >= 0 else None)
    rate = _special_rate(rng)
    x = V.floats(rng, shape, dtype, rate)
    range_given = bool(rng.random() < 0.5)
    count = shape[axis] if axis >= 0 else None
    pairs = [_bound_pair(rng) for _ in range(max(count or 1, 1))]
    lo = np.array([p[0] for p in pairs], dtype)
    hi = np.array([p[1] for p in pairs], dtype)
    if count is None or (not range_given and rng.random() < 0.5):
        lo, hi = lo[0].reshape(()), hi[0].reshape(())
    else:
        lo, hi = lo[:count], hi[:count]
    attrs = {"signed_input": bool(rng.random() < 0.6), "narrow_range": bool(rng.random() < 0.3), "axis": axis}
    if op == "QuantizeAndDequantizeV4Grad":
        return Case(op, [V.floats(rng, shape, dtype, rate), x, lo, hi], {"axis": axis}, "valid")
    attrs["range_given"] = range_given
    num_bits = int(rng.choice([1, 2, 4, 8, 8, 16, 31, 32, 61]))
    if op == "QuantizeAndDequantizeV3":
        return Case(op, [x, lo, hi, np.array(num_bits, np.int32)], attrs, "valid")
    attrs["num_bits"] = num_bits
    attrs["round_mode"] = str(rng.choice(["HALF_TO_EVEN", "HALF_UP"]))
    return Case(op, [x, lo, hi], attrs, "valid")


def _batch_norm(rng, op):
    spec = ort_ops.get_spec(op)
    kernel = spec.kernels[int(rng.integers(len(spec.kernels)))]
    t = numpy_dtype(kernel["T"])
    u = numpy_dtype(kernel.get("U", kernel["T"]))
    formats = spec.attr("data_format").choices
    fmt = str(rng.choice(formats))
    rank = 5 if fmt in ("NDHWC", "NCDHW") else 4
    shape = V.shape(rng, rank, small=4, vector_axis=1 if fmt.startswith("NC") else -1)
    c = shape[1] if fmt.startswith("NC") else shape[-1]
    rate = _special_rate(rng)
    attrs = {"data_format": fmt, "is_training": bool(rng.random() < 0.6),
             "epsilon": float(rng.choice([1e-4, 1e-3, 0.0, 1e-45, 0.5]))}
    stats = {
        "scale": V.floats(rng, (c,), u, rate, 1.0),
        "offset": V.floats(rng, (c,), u, rate, 1.0),
        "mean": V.floats(rng, (c,), u, rate, 1.0),
        "variance": np.abs(V.floats(rng, (c,), u, rate, 1.0)),
    }
    if "Grad" in op:
        stats["reserve_space_1"] = stats["mean"]
        stats["reserve_space_2"] = stats["variance"]
        stats["reserve_space_3"] = V.floats(rng, (int(rng.integers(0, 3)),), u)
    else:
        attrs["exponential_avg_factor"] = float(rng.choice([1.0, 1.0, 0.25, 0.0]))
    inputs = []
    for p in spec.inputs:
        dtype = numpy_dtype(kernel[p.type]) if p.type in kernel else numpy_dtype(p.type)
        value = V.floats(rng, shape, t, rate, 2.0) if p.name in ("x", "y_backprop") else stats[p.name]
        inputs.append(value.astype(dtype))
    return Case(op, inputs, attrs, "valid")


def _depthwise_attrs(rng, fmt):
    s = int(rng.choice([1, 1, 2, 3]))
    d = int(rng.choice([1, 1, 1, 2]))
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    attrs = {"strides": [1, 1, s, s] if fmt == "NCHW" else [1, s, s, 1], "padding": padding, "data_format": fmt,
             "dilations": [1, 1, d, d] if fmt == "NCHW" else [1, d, d, 1]}
    if padding == "EXPLICIT":
        p = [int(v) for v in rng.integers(0, 3, 4)]
        attrs["explicit_paddings"] = [0, 0, 0, 0] + p if fmt == "NCHW" else [0, 0, p[0], p[1], p[2], p[3], 0, 0]
    return attrs


def _depthwise(rng, op):
    t = np.dtype(rng.choice(V.FLOAT_DTYPES, p=[0.55, 0.15, 0.15, 0.15]))
    fmt = "NCHW" if rng.random() < 0.15 else "NHWC"
    attrs = _depthwise_attrs(rng, fmt)
    n, h, w, c = V.dim(rng, 2), V.dim(rng, 7), V.dim(rng, 7), V.dim(rng, 3)
    kh, kw, m = V.dim(rng, 3), V.dim(rng, 3), V.dim(rng, 2)
    x_shape = (n, c, h, w) if fmt == "NCHW" else (n, h, w, c)
    f_shape = (kh, kw, c, m)
    rate = _special_rate(rng)
    x = V.floats(rng, x_shape, t, rate, 1.0)
    f = V.floats(rng, f_shape, t, rate, 1.0)
    forward = ort_ops.get_spec("DepthwiseConv2dNative")
    try:
        (y_shape,) = forward.shape_fn([x_shape, f_shape], [None, None], forward.with_defaults(attrs))
    except ort_ops.OpError:  # the window does not fit: keep the case, with a made-up out_backprop
        y_shape = x_shape
    dy = V.floats(rng, y_shape, t, rate, 1.0)
    if op == "DepthwiseConv2dNative":
        inputs = [x, f]
    elif op == "DepthwiseConv2dNativeBackpropInput":
        inputs = [np.array(x_shape, np.int32), f, dy]
    else:
        inputs = [x, np.array(f_shape, np.int32), dy]
    return Case(op, inputs, attrs, "valid")


def _fused(rng, op):
    """FusedBatchNormClipFakeQuant: a float32 inference batch norm's inputs, a clip and a quantizer's range."""
    bn = _batch_norm(rng, "FusedBatchNormV3")
    fmt = bn.attrs["data_format"]
    axis = 1 if fmt.startswith("NC") else -1
    # At most 7 channels: from 8 on TF's batch norm takes its RSQRTPS path (a documented deviation of the
    # batch-norm ops), and its last bit moves a quantized value now and then.
    x = np.take(bn.inputs[0], range(min(7, bn.inputs[0].shape[axis])), axis=axis).astype(np.float32)
    stats = [v[:7].astype(np.float32) for v in bn.inputs[1:5]]
    lo, hi = _bound_pair(rng)
    clip = (float(rng.choice([0.0, -np.inf])), float(np.inf))
    if rng.random() < 0.7:  # clip bounds are never NaN: the op's own rule, TF's Maximum/Minimum have none
        pair = _bound_pair(rng)
        clip = tuple(sorted(pair)) if not np.isnan(pair).any() else (0.0, 6.0)
    attrs = {"data_format": fmt, "epsilon": bn.attrs["epsilon"], "clip_min": clip[0], "clip_max": clip[1],
             "fake_quant": str(rng.choice(["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"])),
             "num_bits": int(rng.integers(2, 17)), "narrow_range": bool(rng.random() < 0.3)}
    return Case(op, [x] + stats + [np.array(lo, np.float32), np.array(hi, np.float32)], attrs, "valid")


BUILDERS = {"fake_quant": _fake_quant, "quantize_dequantize": _qdq, "batch_norm": _batch_norm, "depthwise": _depthwise,
            "fused": _fused}


# ----------------------------------------------------------------------------------------------- mutations

def _mutate_dim(rng, case):
    i = int(rng.integers(len(case.inputs)))
    x = np.asarray(case.inputs[i])
    if x.dtype == np.int32 and x.ndim == 1:
        return _mutate_shape_input(rng, case)
    if x.ndim == 0 or rng.random() < 0.25:  # a rank more or less
        if x.ndim == 0 or rng.random() < 0.5:
            new = x.reshape(x.shape + (1,))
        else:
            if not x.shape[-1] and int(np.prod(x.shape[:-1], dtype=object)) > MAX_INPUT_ELEMENTS:
                return case  # (dropping the zero dim would leave a huge one)
            new = x[..., 0] if x.shape[-1] else np.zeros(x.shape[:-1], x.dtype)
        note = f"input {i} rank {x.ndim} -> {new.ndim}"
    else:
        axis = int(rng.integers(x.ndim))
        size = int(rng.choice([0, 1, x.shape[axis] + 1, 2 * x.shape[axis] + 3]))
        shape = list(x.shape)
        shape[axis] = size
        if int(np.prod(shape, dtype=object)) > MAX_INPUT_ELEMENTS:  # (a huge dim whose zero partner grew)
            return case
        new = np.resize(x, shape) if x.size and size else np.zeros(shape, x.dtype)
        note = f"input {i} dim {axis} -> {size}"
    inputs = list(case.inputs)
    inputs[i] = new
    return case.replace(inputs=inputs, note=note)


def _mutate_dtype(rng, case):
    spec = ort_ops.get_spec(case.op)
    inputs = list(case.inputs)
    if rng.random() < 0.5 and spec.type_constraints:  # every input of one type letter to another allowed type
        letter = str(rng.choice(sorted(spec.type_constraints)))
        dtype = numpy_dtype(str(rng.choice(spec.type_constraints[letter])))
        for k, p in enumerate(spec.inputs):
            if p.type == letter:
                inputs[k] = V.cast(rng, inputs[k], dtype)
        return case.replace(inputs=inputs, note=f"all {letter} inputs as {dtype}")
    i = int(rng.integers(len(inputs)))
    dtype = np.dtype(rng.choice(V.WRONG_DTYPES))
    inputs[i] = V.cast(rng, inputs[i], dtype)
    return case.replace(inputs=inputs, note=f"input {i} as {dtype}")


def _mutate_shape_input(rng, case):
    """A shape-like int32 input (input_sizes, filter_sizes, V3's num_bits) with out-of-range values."""
    spec = ort_ops.get_spec(case.op)
    index = [k for k, p in enumerate(spec.inputs) if p.type == "tensor(int32)"]
    if not index:
        return _mutate_attr(rng, case)
    k = index[0]
    v = np.array(case.inputs[k], np.int64)
    choice = rng.random()
    if choice < 0.2:  # one rank more, or a vector where a scalar belongs
        v = v.reshape(v.shape + (1,)) if v.ndim else np.array([v, v])
    elif v.ndim == 0:
        v = np.array(int(rng.choice([-1, 0, 1, 62, 63, V.INT32_MAX, -(2**31)])))
    elif choice < 0.5 and v.size:
        v[int(rng.integers(v.size))] = int(rng.choice([-1, -(2**31), V.INT32_MAX, 0]))
    elif choice < 0.75:  # over the library's cap: 2^31-1 rows times the rest
        v = np.array([V.INT32_MAX, 1, 1, 8] if rng.random() < 0.5 else [V.INT32_MAX] * 4)
    else:
        v = np.concatenate([v, [1]]) if rng.random() < 0.5 else v[:-1]
    inputs = list(case.inputs)
    inputs[k] = v.astype(np.int32)
    return case.replace(inputs=inputs, note=f"shape input {spec.inputs[k].name} = {v.tolist()}")


_OUT_OF_RANGE = {
    "num_bits": [-1, 0, 1, 17, 62, 63, 64, 2**31 - 1],
    "axis": [-2, -5, 4, 7, 2**31 - 1],
    "epsilon": [-1.0, float("nan"), float("inf"), -0.0, 1e-45],
    "exponential_avg_factor": [float("nan"), -1.0, 2.0, float("inf"), 1e-45],
    "min": [float("nan"), float("inf"), -float("inf"), 1e-38, 7.0],
    "max": [float("nan"), -float("inf"), float("inf"), -1e-38, -7.0],
    "data_format": ["NDHWC", "NCDHW", "HWCN", ""],
    "round_mode": ["HALF_AWAY", ""],
    "padding": ["FULL", ""],
}


def _mutate_attr(rng, case):
    spec = ort_ops.get_spec(case.op)
    attr = spec.attrs[int(rng.integers(len(spec.attrs)))]
    attrs = dict(case.attrs)
    if attr.name in _OUT_OF_RANGE:
        value = rng.choice(_OUT_OF_RANGE[attr.name])
        value = int(value) if attr.kind == "int" else float(value) if attr.kind == "float" else str(value)
    elif attr.kind == "ints":
        default = [1, 1, 1, 1] if attr.required else attr.default
        current = list(attrs.get(attr.name, default))
        if attr.name == "explicit_paddings" and not current:
            current = [0] * 8
        if current and rng.random() < 0.8:
            current[int(rng.integers(len(current)))] = int(rng.choice([0, -1, 2, 2**31 - 1, 2**30]))
        else:
            current = current + [1] if rng.random() < 0.5 else current[:-1]
        value = current
    elif attr.kind == "bool":
        value = not attrs.get(attr.name, attr.default)
    else:
        return _mutate_values(rng, case)
    attrs[attr.name] = value
    return case.replace(attrs=attrs, note=f"attribute {attr.name} = {value!r}")


def _mutate_values(rng, case):
    """Special values all over one float input (ranges, variance, filter taps, gradients ...)."""
    floats = [k for k, x in enumerate(case.inputs) if np.asarray(x).dtype in V.FLOAT_DTYPES and np.size(x)]
    if not floats:
        return _mutate_attr(rng, case)
    k = int(rng.choice(floats))
    x = np.array(case.inputs[k])
    pool = V.specials(x.dtype)
    flat = x.reshape(-1)
    pick = rng.random(flat.size) < 0.6
    flat[pick] = pool[rng.integers(0, len(pool), int(pick.sum()))]
    inputs = list(case.inputs)
    inputs[k] = flat.reshape(x.shape)
    return case.replace(inputs=inputs, note=f"special values in input {k}")


MUTATIONS = (_mutate_dim, _mutate_dtype, _mutate_shape_input, _mutate_attr, _mutate_values)


def generate(rng: np.random.Generator, op: str, mutate_rate: float = 0.5) -> Case:
    """One safe case of ``op``: valid, or (with ``mutate_rate``) one mutation away from valid."""
    builder = BUILDERS[ort_ops.get_spec(op).family]
    while True:
        case = builder(rng, op)
        if rng.random() < mutate_rate:
            mutation = MUTATIONS[int(rng.integers(len(MUTATIONS)))]
            case = mutation(rng, case)
        if is_safe(case):
            return case


def cases(seed: int, ops=None, mutate_rate: float = 0.5):
    """An endless seeded stream of cases, cycling through ``ops`` (default: every op of the domain)."""
    ops = tuple(ops or ort_ops.OP_NAMES)
    rng = np.random.default_rng(seed)
    while True:
        for op in ops:
            yield generate(rng, op, mutate_rate)
