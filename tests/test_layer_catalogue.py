"""Issue 9's layer catalogue: the training step of a small model around each tf_keras layer converts in
both lowerings, with a static and with a None batch, and matches TensorFlow.

The models, losses and inputs are in tests/layer_catalogue.py. Each step returns the loss and the
gradient wrt every trainable variable; TF runs it once per entry and batch mode, and both lowerings are
compared with that. The custom lowering runs in ONNX Runtime with the custom-op library, the standard
one without it (verification.run_onnx loads the library only for a model importing the domain).

Tolerance, per output (verification.compare_output): ``|ort - tf| <= RTOL*|tf| + RTOL*max|tf|`` with
RTOL = 1e-5. The outputs are float32 sums of products (Dense, the convolutions, BiasAddGrad, batch-norm
statistics) behind exp/log/erfc: ONNX Runtime adds in another order than TF's Eigen kernels and its
exp/log/erfc differ by ulps (TF's own float erfc is up to 4e-6 off), which moves each gradient element
by a few ulps of the largest terms it sums. The absolute floor scales with the output's largest
element because gradient elements near zero are differences of large terms. Measured over the whole
catalogue the worst error is 1.6e-6 of the output's max|tf|; 1e-5 (about 80 ulps at that scale) leaves
headroom for other CPUs, and the tests at the end prove it still catches a zeroed gradient and a
single element off by 1e-4.
"""
from __future__ import annotations

import collections
import functools

import numpy as np
import pytest

import converters
from converters.verification import compare_output, run_onnx
from ort_ops.schemas import DOMAIN
from layer_catalogue import DYNAMIC_BATCH, ENTRIES, LOSSES, STATIC_BATCH, step_inputs, training_step

pytestmark = pytest.mark.tensorflow

LOWERINGS = ("custom", "standard")
BATCHES = ("static", "none")
RTOL = 1e-5


@functools.lru_cache(maxsize=None)
def _traced(name: str, batch: str):
    """(step, signature, inputs, TF outputs) of one entry; TF runs once and serves both lowerings."""
    entry = ENTRIES[name]
    step, signature, _ = training_step(entry, static_batch=batch == "static")
    inputs = step_inputs(entry, STATIC_BATCH if batch == "static" else DYNAMIC_BATCH)
    expected = [np.asarray(v) for v in step(*inputs)]
    return step, signature, inputs, expected


def _convert(name: str, batch: str, lowering: str):
    step, signature, _, _ = _traced(name, batch)
    return converters.from_function(step, signature, lowering=lowering)


def _run(model, inputs):
    feed = dict(zip([i.name for i in model.graph.input], inputs))
    out = run_onnx(model, feed, threads=2)
    return [out[o.name] for o in model.graph.output]


def _checks(expected, actual):
    return [compare_output(f"output {i}", e, a, rtol=RTOL) for i, (e, a) in enumerate(zip(expected, actual))]


def _table(name, checks):
    return name + ":\n" + "\n".join(
        f"  {c.name} {c.shape}: max abs err {c.max_abs_err:.3e}, {c.n_outside} outside {c.tolerance}"
        + (f" ({c.note})" if c.note else "")
        for c in checks
    )


def test_losses_rotate_over_the_catalogue():
    uses = collections.Counter(entry.loss for entry in ENTRIES.values())
    assert set(uses) == set(LOSSES)
    assert min(uses.values()) >= 4, uses


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", list(ENTRIES))
def test_training_step_matches_tf(name, batch, lowering):
    _, _, inputs, expected = _traced(name, batch)
    model = _convert(name, batch, lowering)
    x_dims = model.graph.input[0].type.tensor_type.shape.dim
    assert x_dims[0].HasField("dim_value") == (batch == "static")
    # run_onnx loads the custom-op library exactly for models that import the domain.
    assert any(imp.domain == DOMAIN for imp in model.opset_import) == (lowering == "custom")
    actual = _run(model, inputs)
    # The loss and one gradient per trainable variable, each shaped as TF's.
    assert len(actual) == len(expected)
    checks = _checks(expected, actual)
    assert all(c.ok for c in checks), _table(f"{name} ({batch} batch, {lowering})", checks)


@pytest.fixture(scope="module")
def dense_step():
    """A converted step and its TF outputs to tamper with."""
    _, _, inputs, expected = _traced("dense", "static")
    return _run(_convert("dense", "static", "standard"), inputs), expected


def test_a_zeroed_gradient_fails(dense_step):
    actual, expected = dense_step
    assert all(c.ok for c in _checks(expected, actual))
    for i in range(1, len(actual)):
        tampered = list(actual)
        tampered[i] = np.zeros_like(actual[i])
        checks = _checks(expected, tampered)
        assert [c.ok for c in checks] == [j != i for j in range(len(actual))], _table("zeroed", checks)


def test_one_element_off_by_1e_4_fails(dense_step):
    actual, expected = dense_step
    for i in range(len(actual)):
        tampered = [a.copy() for a in actual]
        flat = tampered[i].reshape(-1)
        k = int(np.argmax(np.abs(expected[i]).reshape(-1)))
        flat[k] = expected[i].reshape(-1)[k] * (1 + 1e-4)
        checks = _checks(expected, tampered)
        assert not checks[i].ok and checks[i].n_outside == 1, _table("perturbed", checks)
