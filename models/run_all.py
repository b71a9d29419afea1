"""The main job: convert every example model, run it in ONNX Runtime, and compare it with TensorFlow.

    # from the repository root:
    PYTHONPATH=. python -m models.run_all [--models NAME ...] [--lowerings custom standard]
                                          [--seed N] [--repeat N] [--no-write]

For each SavedModel under models/<name>/saved_model (made by ``python -m models.make_models``) and
each lowering:
  1. convert it (converters.from_saved_model) and write models/<name>/model.<lowering>.onnx;
  2. run it in ONNX Runtime's CPU provider: the custom lowering with the project's custom-op library
     (ort_ops.session_options()), the standard lowering in plain ONNX Runtime without it;
  3. run the SavedModel's signature in TensorFlow on the same seeded inputs and compare every output;
  4. judge every converted op per node (converters.node_verification, on TF's own input values);
  5. for a classifier, run its inference graph on the 360 held-out digits (models/data.py) in TF, in TF with
     oneDNN (a child process: TF's own spread), in each lowering and in tf2onnx's model, and print each one's
     accuracy and its share of predictions identical to TF's; a lowering must reach HELD_OUT_AGREEMENT, predict
     more than one class and give distinct images distinct logits.
The inputs are real (models/data.py): for an inference or saliency graph, held-out digits and crops of the sample
photographs, half each (seeded picks); for a training step, a batch of training digits with their labels.
It prints one table per model and exits with status 1 if any output is outside its tolerance or any
step failed.

Each model also runs through tf2onnx alone (its own loader and handlers, plain ONNX Runtime): the row
"tf2onnx" gives its conversion time and, where it converts, its error against TF (--no-tf2onnx skips it).

Tolerances (the column "tolerance" shows the one applied to each output):
  * bit-exact: outputs of quantization ops fed straight from the model inputs (the qdq model).
    FakeQuant*/QuantizeAndDequantize* must reproduce TF bit for bit.
  * normwise, ||ort - tf|| <= c * ||tf|| per output, for models with quantized activations (the tfmot
    models): c = 0.05 for inference, 0.1 for training steps and saliency. Quantization flips: when an
    activation quantizer's input is computed a few ulps differently (ORT's Conv versus TF's, a batch norm
    summed in another order) and lies that close to a rounding boundary, the activation moves by a whole
    grid step (1/255 of its range). Later layers carry that move on; in a training step the batch
    statistics spread it over the whole channel, the next quantizers flip more elements, and the
    gradients, sums that cancel strongly, move by up to ~10% of their largest element. Elementwise
    agreement is therefore not a property these graphs can have (against TF or any other implementation
    that rounds differently); where no flip happens the outputs are bit-exact (the tables show it). The
    control model cnn_train_step_float has no activation quantizer and holds every float op of a
    training step to rtol 1e-5 (atol 1e-3 * max|tf| for cancelling sums).
  * normwise 0.1 for the float control mobilenet_v2_float_train_step. ReLU flips: the forward pass of
    ORT and TF differs by ~1e-5 relative after 50 layers (convolutions summed in other orders, each
    training-mode batch norm renormalizing), and where a ReLU6 input lies that close to 0 the mask flips.
    Measured on the earlier, untrained network: one of the 92,160 elements of the last ReLU6 (TF 0, ORT
    8e-6); its gradient (7.8e-4) then reaches every channel through the batch norm's mean terms, so every
    earlier gradient moves by 0.5-0.8% of its norm (elementwise, by up to its largest element). Relu6Grad
    itself is bit-exact on its inputs. Worst measured there: 0.008 (custom lowering), 0.032 (standard: its
    batch norm sums in ReduceSum's order, more flips); on the trained network (seed 0): 2.7e-3 and 1.9e-2. The number of flips depends on the CPU's convolution kernels, hence the headroom; a wrong
    handler (a zeroed, negated or misrouted gradient) moves an output by its whole norm.
    Rounding noise: the moving-mean updates of channels whose batch mean is 0 in exact arithmetic (a 1x1
    convolution of a batch norm's zero-mean output) are ~1e-11 in both runs, so a normwise output is judged
    against max(its norm, 1e-6 * sqrt(n)). Gradients that vanish in exact arithmetic (each project batch
    norm's beta, see VANISHING_ATOL) are judged by their size: both runs within 1e-4.
  * judged per node: the quantized MobileNetV2 training step's loss, its gradients and the statistics and
    ranges of its deeper layers. End to end they cannot be judged: ORT's Conv and TF's differ by ~1 ulp (7e-7) in 218k
    of the 295k outputs of the first convolution; that moves 1 of 295k elements of the first ReLU6 quantizer
    by a grid step, the training-mode batch norms spread each such move over a whole channel, and after 52
    layers the gradients of the two runs are uncorrelated (normwise error ~1, printed in the table). This is
    a property of the graph (any two implementations that sum in different orders diverge so), not of a
    handler. So each of these outputs is judged by per-node verification (converters.node_verification): the op
    that computes it runs on TF's own values of its inputs and must match TF's output by the verifier's rules
    (bit for bit for a quantized gradient's mask and every quantizer; the sum bound for gradients). Every
    example also gets the per-node check of every node ("per node" lines): a model passes only if it passes.
  * the Keras 3 example (keras3_qat, models/keras3_qat.py). The numbers of this item (30 seeds) were measured on
    the earlier network (20 steps on random data, 2x2 pool); on the trained one (seed 0) its logits are
    bit-exact in both lowerings and every training-step output is within normwise 3.7e-5. ORT sums in other
    orders than TF in its convolutions (ORT's Conv differs from TF's by 1 ulp in 72% of the first convolution's outputs, in both
    lowerings; so does the standard lowering's depthwise Conv, the custom DepthwiseConv2dNative is exact) and,
    in training mode, in the batch statistics of Keras 3's batch norm, which is not fused (moments by Mean,
    ReduceMean in ONNX: on an [8, 32, 32, 16] input every channel's mean and variance differ by a few ulps,
    and 97% of the normalized outputs). Inference folds the batch norm into constants at conversion.
    - logits (inference, and the saliency graph's): at most 2 of the 40 may differ at all, and normwise
      0.01 (KERAS3_LOGITS). In inference those ulps move about 1 in 10^5 activation-quantizer inputs across
      a rounding boundary (seed 0: 1 of the first quantizer's 131k elements, then 1 and 5 in the next two;
      seed 1: none), which moves the head's outputs by <= 2e-5, far below the logits quantizer's grid step
      (4.09/255 = 0.016): measured bit-exact in 20 seeds (and in 30 of the saliency graph), both lowerings.
      A logit that flips is off by one grid step, normwise 0.003 (||logits|| = 5.2); a wrong handler moves
      them all. tf2onnx alone converts this graph but is off in all 40 logits by up to a grid step
      (normwise 6.9e-3): the count of differing logits, not the norm, rejects it.
    - the saliency map: the float rule below (rtol 1e-5, atol 1e-5 * max|tf|). Given its masks (FakeQuant's
      range masks, Relu6's, MaxPool's argmax) the backward pass is linear, and no mask changed: measured
      max |err| 1.9e-7 * max|tf| (normwise 7.8e-8) in 30 seeds, both lowerings.
    - the training step: normwise 0.1 (TRAIN_STEP_NORMWISE) on gradients and on the weights', ranges' and
      momentum slots' updates. Training-mode batch norm normalizes with the batch's own statistics, and in
      every seed 1 to 8 of the first quantizer's 131k inputs, then up to ~100 of the later ones', move by a
      grid step (seed 0: 10, 16, 113). Measured over 30 seeds, both lowerings, the same: median seed 2.5e-4
      (largest output), five seeds above 5e-3, worst 3.9e-2 (grad_dw_kernel_min: a per-channel range's
      gradient sums the few kernel elements beyond it) and 4.0e-2 for its momentum slot; a momentum update
      m' = 0.9 m - lr * g whose two terms nearly cancel magnifies the gradient's error (conv1_quant/
      range_max, seed 0: update 1.5e-5, error 4.8e-7 = lr * the gradient's 2.4e-5: 3.1e-2). The loss and the
      moving statistics normwise 1e-3 (KERAS3_STEP_TIGHT): the loss bit-exact in 26 seeds, 1 ulp in 3, and
      1.6e-5 in the one seed (21) where a logit flips; the moving statistics <= 9.1e-5. The iteration count
      (int64) is exact, and so are the ranges whose gradient is 0 (a ReLU's range minimum, the images'
      [0, 1]: no element beyond them). Their momentum slots stay 0 but come out -0.0 where TF has +0.0 (the
      converter folds m * 0.9 - g * lr with the frozen m = +0 into Neg(g * lr)); the table notes it.
  * variable-update outputs (the moving statistics and ranges a training step assigns) are judged by the
    rule of their model applied to the update (new value - old value), see compare_update.
  * rtol/atol: every other float output, |ort - tf| <= rtol*|tf| + atol with rtol 1e-5 (a few float32
    ulps: batch norm and convolutions are sums whose order differs between TF's kernels and ours) and
    atol = rtol * max|tf| of that output (gradients are sums whose terms cancel, so an element near zero
    carries the rounding error of its large terms). See converters.verify.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from converters.verification import compare_output, normwise_error, same_bits, session  # noqa: E402
from models import data  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent
LOWERINGS = ("custom", "standard")
FLOAT_RTOL = 1e-5
# cnn_train_step_float: batch-norm training gradients (d gamma = sum of dy * x_hat over the batch) are
# sums whose total is far smaller than their terms, so their rounding error scales with the terms, not
# with the result: atol = 1e-3 * max|tf|. Observed for d gamma of the first batch norm: 8.4e-5 * max|tf|
# (custom lowering) and 1.4e-4 * max|tf| (standard lowering, ReduceSum's order); every other output is
# within rtol 1e-5 alone or nearly so. A wrong op moves outputs by O(max|tf|).
CANCELLING_SUM_ATOL = 1e-3
# Quantized training steps and saliency: see "quantization flips" in the module docstring.
TRAIN_STEP_NORMWISE = 0.1
# mobilenet_v2_float_train_step: see "ReLU flips" in the module docstring.
FLOAT_STEP_NORMWISE = 0.1
# Normwise judging: the root-mean-square size below which an output is rounding noise (see the docstring).
NOISE_FLOOR = 1e-6
# Gradients that vanish in exact arithmetic: MobileNetV2's project batch norms feed a 1x1 convolution into a
# training-mode batch norm (or the head's), which removes any constant per-channel shift, so d(beta) = 0.
# Measured: at most 3.1e-6 in either run (the early layers sum the most terms); any gradient of this
# network that does not vanish is above 1e-3 somewhere, so a handler error cannot hide under 1e-4.
VANISHING_ATOL = 1e-4
MOBILENET_VANISHING = r"^grad_(expanded_conv|block_\d+)_project_BN_beta$"
# Inference graphs with quantized activations: a flip (see above) in an early layer moves later
# activations by whole grid steps, so the logits are judged normwise too (the trained MobileNetV2, seed 0: 5 of
# its 40 logits off by up to 0.24, normwise 1.3e-2, in both lowerings).
MOBILENET_INFERENCE_NORMWISE = 0.05
# The quantized MobileNetV2 training step: its loss, gradients, deep moving statistics and activation ranges
# are judged per node (see "judged per node" in the module docstring); the input and weight ranges and the first
# layers' statistics end to end too. (The trained network's loss is small, 0.03 on a training batch, and a
# flip's share of it large: 14-15% end to end, both lowerings.)
MOBILENET_STEP_PER_NODE = r"^loss$|^grad_|^(?!bn_Conv1/).*moving_|/output_m|post_activation_m"


# Classifiers on the held-out digits: the share of the 360 predictions each lowering must give as TF does (all 360
# measured, in both lowerings and in TF with oneDNN against Eigen; 0.99 leaves 3 near-ties to another CPU).
HELD_OUT_AGREEMENT = 0.99


@dataclasses.dataclass(frozen=True)
class OutputRule:
    """Judges the outputs whose names match ``pattern`` (re.search) by its own tolerance instead of the
    example's: normwise when ``normwise`` is set, else element-wise with ``atol_factor``; with
    ``max_differing``, also at most that many elements may differ from TF's at all."""

    pattern: str
    normwise: Optional[float] = None
    atol_factor: float = FLOAT_RTOL
    max_differing: Optional[int] = None


# The Keras 3 example (keras3_qat): see "the Keras 3 example" in the module docstring. Its logits (inference
# and saliency): at most 2 elements off (each by one grid step of the logits quantizer), and its training
# step's loss and moving statistics, which no flip moves far.
KERAS3_LOGITS = OutputRule("^logits$", normwise=0.01, max_differing=2)
KERAS3_STEP_TIGHT = OutputRule(r"^loss$|/moving_(mean|variance)$", normwise=1e-3)


# ----------------------------------------------------------------------------------------------
# The example models: where they are, what inputs they get, how each output is judged.


def _images(rng, batch, size):
    """Real images: held-out digits (seeded picks, never trained on) and crops of the sample photographs, about
    half each (models/data.py)."""
    split = data.digits(size)
    photos = batch // 2
    picks = rng.choice(len(split.test_labels), batch - photos, replace=False)
    crops = data.photographs(photos, size, seed=int(rng.integers(1 << 31)))
    return {"images": np.concatenate([split.test_images[picks], crops]).astype(np.float32)}


def _labelled(rng, batch, size):
    """A training batch: digits of the training split with their labels."""
    split = data.digits(size)
    picks = rng.choice(len(split.train_labels), batch, replace=False)
    return {"images": split.train_images[picks], "labels": split.train_labels[picks]}


def _qdq_inputs(rng):
    """Values on a 1/128 grid (exact rounding ties for the power-of-two scales the model uses), random
    values, the range ends themselves, values just beyond them, and both zeros."""
    shape = (2, 6, 6, 4)
    grid = rng.integers(-290, 290, shape).astype(np.float32) / np.float32(128)
    noise = rng.standard_normal(shape).astype(np.float32)
    x = np.where(rng.random(shape) < 0.6, grid, noise).astype(np.float32)
    flat = x.reshape(-1)
    specials = [-2.0, 127.0 / 64.0, np.nextafter(np.float32(-2.0), np.float32(-3.0)), np.nextafter(np.float32(127.0 / 64.0), np.float32(3.0)), 0.0, -0.0, 1.0, -1.0, 1.5]
    flat[: len(specials)] = np.array(specials, dtype=np.float32)
    # The data-derived ranges then equal the given one ([-2, 127/64]) except for the two values just beyond.
    return {"x": np.clip(x, -2.5, 2.5).astype(np.float32)}


@dataclasses.dataclass(frozen=True)
class ExampleModel:
    name: str
    description: str
    make_inputs: Callable  # numpy Generator -> {input name: array}
    # True when every output is computed by a quantization op from the model inputs with no float op
    # (Conv, MatMul, batch norm) on the way, so each must match bit for bit.
    all_outputs_exact: bool
    # The SavedModel (models/<source>/saved_model, default: the example's name) and its signature.
    source: str = ""
    signature: str = "serving_default"
    # converters' variable_updates: "outputs" adds each variable the step assigns as an output, compared
    # with the variable's value in TF after the same step.
    variable_updates: str = "warn"
    # Outputs matching this pattern are zero in exact arithmetic: judged by their size (VANISHING_ATOL).
    vanishing: str = ""
    # Outputs matching this pattern are printed with their end-to-end errors but judged per node (see "judged per
    # node" in the module docstring); the rest are judged end to end (and per node too).
    judged_per_node: str = ""
    # The lowerings whose ONNX files are committed (the MobileNetV2 standard-lowering files, 8-20 MB each,
    # are written locally by the main job but kept out of the repository, models/.gitignore).
    committed_lowerings: tuple = LOWERINGS
    # Float outputs: atol = atol_factor * max|tf| of the output (see the module docstring).
    atol_factor: float = FLOAT_RTOL
    # When set, float outputs are judged normwise: ||ort - tf||_2 <= normwise * ||tf||_2.
    normwise: Optional[float] = None
    # Per-output exceptions to atol_factor/normwise: the first OutputRule whose pattern matches decides.
    output_rules: tuple = ()
    # A classifier (an inference signature with ``logits``): its held-out accuracy on the digits is measured in TF
    # and each lowering, and each lowering's predictions must equal TF's on at least this share of them.
    min_agreement: Optional[float] = None
    # A QAT inference graph that is also converted in the integer lowering (check_integer).
    integer: bool = False

    @property
    def saved_model(self) -> Path:
        return MODELS_DIR / (self.source or self.name) / "saved_model"

    def onnx_path(self, lowering: str) -> Path:
        return MODELS_DIR / self.name / f"model.{lowering}.onnx"


EXAMPLES = (
    ExampleModel(
        "mobilenet_v2_qat",
        "tfmot quantize_model(MobileNetV2 alpha 0.35, 96x96), inference (FakeQuant*, FusedBatchNormV3, "
        "DepthwiseConv2dNative)",
        lambda rng: _images(rng, 4, 96),
        all_outputs_exact=False,
        normwise=MOBILENET_INFERENCE_NORMWISE,
        min_agreement=HELD_OUT_AGREEMENT,
        integer=True,
    ),
    ExampleModel(
        "mobilenet_v2_qat_train_step",
        "its training step: loss, the gradient of every trainable variable, and the moving statistics and "
        "ranges it assigns (FakeQuant*Gradient, FusedBatchNormGradV3, DepthwiseConv2dNativeBackprop*, ...)",
        lambda rng: _labelled(rng, 8, 96),
        all_outputs_exact=False,
        normwise=TRAIN_STEP_NORMWISE,
        source="mobilenet_v2_qat",
        signature="train_step",
        variable_updates="outputs",
        judged_per_node=MOBILENET_STEP_PER_NODE,
        committed_lowerings=("custom",),
    ),
    ExampleModel(
        "mobilenet_v2_qat_saliency",
        "its saliency map: d(top class score)/d(images), training=False",
        lambda rng: _images(rng, 4, 96),
        all_outputs_exact=False,
        normwise=TRAIN_STEP_NORMWISE,
        source="mobilenet_v2_qat",
        signature="saliency",
    ),
    ExampleModel(
        "mobilenet_v2_float_train_step",
        "control: the same MobileNetV2 without quantization, its training step (loss, every gradient, the moving "
        "statistics it assigns): the gradient ops of a real network held to the float tolerance",
        lambda rng: _labelled(rng, 8, 96),
        all_outputs_exact=False,
        atol_factor=CANCELLING_SUM_ATOL,
        source="mobilenet_v2_float",
        signature="train_step",
        variable_updates="outputs",
        normwise=FLOAT_STEP_NORMWISE,
        vanishing=MOBILENET_VANISHING,
    ),
    ExampleModel(
        "fourbit_cnn",
        "tfmot with a custom QuantizeConfig: 4-bit weights, 8-bit activations, inference",
        lambda rng: _images(rng, 4, 16),
        all_outputs_exact=False,
        normwise=MOBILENET_INFERENCE_NORMWISE,
        min_agreement=HELD_OUT_AGREEMENT,
        integer=True,
    ),
    ExampleModel(
        "fourbit_cnn_train_step",
        "its training step, with the ranges it assigns",
        lambda rng: _labelled(rng, 8, 16),
        all_outputs_exact=False,
        normwise=TRAIN_STEP_NORMWISE,
        source="fourbit_cnn",
        signature="train_step",
        variable_updates="outputs",
    ),
    ExampleModel(
        "cnn_train_step_float",
        "control: a hand-made CNN's training step without activation quantizers (float ops and weight "
        "FakeQuant*Gradient held tight; depthwise multiplier 2), with the moving statistics it assigns",
        lambda rng: _labelled(rng, 8, 16),
        all_outputs_exact=False,
        atol_factor=CANCELLING_SUM_ATOL,
        variable_updates="outputs",
    ),
    ExampleModel(
        "keras3_qat",
        "Keras 3 (keras.quantizers) QAT CNN, 32x32: 8-bit activations, 4-bit per-channel weights, inference",
        lambda rng: _images(rng, 4, 32),
        all_outputs_exact=False,
        output_rules=(KERAS3_LOGITS,),
        min_agreement=HELD_OUT_AGREEMENT,
        integer=True,
    ),
    ExampleModel(
        "keras3_qat_train_step",
        "its training step with a Keras 3 SGD optimizer: loss, every gradient, and the weights, ranges, "
        "momentum slots and moving statistics it assigns",
        lambda rng: _labelled(rng, 8, 32),
        all_outputs_exact=False,
        normwise=TRAIN_STEP_NORMWISE,
        output_rules=(KERAS3_STEP_TIGHT,),
        source="keras3_qat",
        signature="train_step",
        variable_updates="outputs",
    ),
    ExampleModel(
        "keras3_qat_saliency",
        "its saliency map: d(top class score)/d(images), training=False",
        lambda rng: _images(rng, 4, 32),
        all_outputs_exact=False,
        output_rules=(KERAS3_LOGITS,),
        source="keras3_qat",
        signature="saliency",
    ),
    ExampleModel(
        "qdq",
        "quantize_and_dequantize: both rounding modes, per tensor and per axis, given and data ranges, V2/V3/V4 "
        "and V4Grad",
        _qdq_inputs,
        all_outputs_exact=True,
    ),
)
EXAMPLES_BY_NAME = {e.name: e for e in EXAMPLES}


# ----------------------------------------------------------------------------------------------
# Running and comparing.


@dataclasses.dataclass
class OutputResult:
    name: str
    shape: tuple
    max_abs_err: float
    max_rel_err: float
    n_differing: int
    n_elements: int
    tolerance: str
    ok: bool
    note: str = ""


@dataclasses.dataclass
class LoweringResult:
    model: str
    lowering: str
    outputs: list = dataclasses.field(default_factory=list)
    convert_s: float = float("nan")
    tf_run_s: float = float("nan")
    ort_run_s: float = float("nan")
    onnx_path: Optional[Path] = None
    node_summary: str = ""
    error: str = ""
    per_node: object = None  # converters.node_verification.NodeReport
    held_out: Optional["HeldOut"] = None  # a classifier's predictions on the held-out digits
    per_tensor: object = None  # an integer model's converters.integer.per_tensor.TensorReport
    summary: tuple = ()  # an integer model's conversion summary and ONNX Runtime's fusion counts

    @property
    def ok(self) -> bool:
        per_node_ok = self.per_node is None or self.per_node.ok
        held_out_ok = self.held_out is None or self.held_out.ok
        per_tensor_ok = self.per_tensor is None or self.per_tensor.ok
        return (not self.error and bool(self.outputs) and all(o.ok for o in self.outputs) and per_node_ok
                and held_out_ok and per_tensor_ok)


@dataclasses.dataclass
class HeldOut:
    """A classifier's logits on the held-out digits (models/data.py), judged against TF's predictions."""

    logits: np.ndarray
    labels: np.ndarray
    tf_predictions: np.ndarray
    min_agreement: float
    tf_logits: Optional[np.ndarray] = None  # TF's (Eigen) logits, for the element-wise comparison

    @property
    def predictions(self) -> np.ndarray:
        return self.logits.argmax(axis=-1)

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.predictions == self.labels))

    @property
    def agreement(self) -> float:
        return float(np.mean(self.predictions == self.tf_predictions))

    @property
    def classes(self) -> int:
        return len(np.unique(self.predictions))

    @property
    def distinct_rows(self) -> int:
        return len(np.unique(self.logits, axis=0))

    @property
    def ok(self) -> bool:
        # The outputs must depend on the input (a constant classifier matches TF trivially) and agree with TF's.
        return self.agreement >= self.min_agreement and self.classes > 1 and self.distinct_rows > 1

    def describe(self) -> str:
        n = len(self.labels)
        text = (f"accuracy {self.accuracy:.1%}, predictions identical to TF's {self.agreement:.1%} "
                f"({int(np.sum(self.predictions == self.tf_predictions))}/{n}; at least {self.min_agreement:.1%} "
                f"required), {self.classes} classes predicted, {self.distinct_rows} distinct logit rows")
        if self.tf_logits is not None:
            same = same_bits(self.tf_logits, self.logits)
            text += (f"; logits bit-identical to TF's: {same.mean():.1%}, max |err| "
                     f"{float(np.abs(self.tf_logits - self.logits).max()):.3g}")
        return text


def held_out_logits(run, size: int) -> tuple:
    """(logits of ``run`` (images -> logits) over the held-out digits at ``size``, their labels)."""
    split = data.digits(size)
    return data.in_batches(run, split.test_images), split.test_labels


def median_time(fn, repeat: int) -> float:
    """Median wall time of ``repeat`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


class TensorFlowRun:
    """The SavedModel's signature run on the inputs: the oracle; with every variable's value before and
    after that one run (for the variable-update outputs)."""

    def __init__(self, example: ExampleModel, inputs: dict, repeat: int):
        import tensorflow as tf

        self.loaded = tf.saved_model.load(str(example.saved_model))
        fn = self.loaded.signatures[example.signature]
        feed = {k: tf.constant(v) for k, v in inputs.items()}
        variables = {v.name.split(":")[0]: v for v in fn.graph.variables}
        self.variables_before = {k: v.numpy() for k, v in variables.items()}
        self.outputs = {k: np.asarray(v) for k, v in fn(**feed).items()}
        self.variables_after = {k: v.numpy() for k, v in variables.items()}
        # Timed runs assign the variables again; the outputs above are from the first run.
        self.run_s = median_time(lambda: fn(**feed), repeat)
        self.held_out = None  # a classifier's HeldOut of TF itself
        if example.min_agreement is not None:
            self.image_size = inputs["images"].shape[1]
            logits, labels = held_out_logits(lambda x: fn(images=tf.constant(x))["logits"], self.image_size)
            self.held_out = HeldOut(logits, labels, logits.argmax(axis=-1), 1.0)

    def onednn_held_out(self, example: ExampleModel) -> Optional[HeldOut]:
        """TF's own spread: the held-out logits of TF with its oneDNN kernels (a child process; the main job pins
        Eigen) judged against Eigen's predictions; None for a non-classifier."""
        if self.held_out is None:
            return None
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "logits.npy")
            code = ("import sys, numpy as np, tensorflow as tf; from models.run_all import held_out_logits; "
                    "fn = tf.saved_model.load(sys.argv[1]).signatures[sys.argv[2]]; "
                    "np.save(sys.argv[4], held_out_logits(lambda x: fn(images=tf.constant(x))['logits'], "
                    "int(sys.argv[3]))[0])")
            env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2",
                       PYTHONPATH=str(MODELS_DIR.parent))
            subprocess.run([sys.executable, "-c", code, str(example.saved_model), example.signature,
                            str(self.image_size), out], env=env, check=True, capture_output=True)
            logits = np.load(out)
        return HeldOut(logits, self.held_out.labels, self.held_out.predictions, example.min_agreement,
                       self.held_out.logits)

    def judge_held_out(self, example: ExampleModel, run) -> Optional[HeldOut]:
        """``run`` (images -> logits) on the held-out digits, against TF's predictions; None for a non-classifier."""
        if self.held_out is None:
            return None
        logits, labels = held_out_logits(run, self.image_size)
        return HeldOut(logits, labels, self.held_out.predictions, example.min_agreement, self.held_out.logits)


def convert(example: ExampleModel, lowering: str, write: bool = True):
    """Convert the SavedModel; returns (onnx model, seconds)."""
    import converters

    if write:
        example.onnx_path(lowering).parent.mkdir(exist_ok=True)
    out = str(example.onnx_path(lowering)) if write else None
    t = time.perf_counter()
    model = converters.from_saved_model(
        str(example.saved_model), signature_key=example.signature, lowering=lowering, output_path=out,
        variable_updates=example.variable_updates,
    )
    return model, time.perf_counter() - t


def compare(example: ExampleModel, name, expected, actual) -> OutputResult:
    """One output judged by the example's rule (converters.verification does the comparing)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    rule = next((r for r in example.output_rules if re.search(r.pattern, name)), example)
    check = compare_output(name, expected, actual, exact=example.all_outputs_exact, rtol=FLOAT_RTOL,
                           atol_factor=rule.atol_factor, normwise=rule.normwise, noise_floor=NOISE_FLOOR)
    if not check.same_type:
        return OutputResult(name, expected.shape, np.inf, np.inf, expected.size, expected.size, "-", False, check.note)
    if check.exact:
        tolerance = "bit-exact"
    elif check.normwise is not None:
        tolerance = f"normwise {check.normwise:g} (got {check.normwise_err:.1e})"
    else:
        tolerance = f"rtol {check.rtol:.0e} atol {check.atol:.1e}"
    ok, note = check.ok, ""
    if getattr(rule, "max_differing", None) is not None:
        tolerance += f", at most {rule.max_differing} differing"
        ok = ok and check.n_differing <= rule.max_differing
    if example.vanishing and re.search(example.vanishing, name):
        largest = max(float(np.abs(expected).max(initial=0.0)), float(np.abs(actual).max(initial=0.0)))
        tolerance, ok = f"vanishing: both within {VANISHING_ATOL:g}", bool(np.isfinite(largest)) and largest <= VANISHING_ATOL
    elif example.judged_per_node and re.search(example.judged_per_node, name):
        # check_lowering replaces the verdict by the per-node check's
        tolerance, ok, note = "judged per node", True, f"(end to end: normwise {normwise_error(expected, actual):.1e})"
    elif check.n_differing and check.max_abs_err == 0 and check.nonfinite_match:
        note = "(differs only in the sign of zero)"
    return OutputResult(name, expected.shape, check.max_abs_err, check.max_rel_err, check.n_differing, expected.size,
                        tolerance, ok, note)


def node_summary(onnx_model) -> str:
    from ort_ops.schemas import DOMAIN

    custom = sum(1 for n in onnx_model.graph.node if n.domain == DOMAIN)
    return f"{len(onnx_model.graph.node)} nodes, {custom} in {DOMAIN}"


def _convert_and_run(example, lowering, tf_run, inputs, onnx_model, write, repeat, result):
    """(the model, its outputs on ``inputs``): converted unless given; ``result`` gets the conversion time, file,
    node summary, ORT run time and held-out judgment. Shared by check_lowering and check_integer."""
    if onnx_model is None:
        onnx_model, result.convert_s = convert(example, lowering, write)
        result.onnx_path = example.onnx_path(lowering) if write else None
    result.node_summary = node_summary(onnx_model)
    sess = session(onnx_model, log_severity_level=3)  # the library exactly for the custom lowering
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    actual = dict(zip(names, sess.run(names, feed)))
    result.ort_run_s = median_time(lambda: sess.run(names, feed), repeat)
    result.held_out = tf_run.judge_held_out(example, _ort_classifier(sess))
    return onnx_model, actual


def check_lowering(example: ExampleModel, lowering: str, tf_run: TensorFlowRun, inputs: dict, onnx_model=None,
                   write: bool = True, repeat: int = 5) -> LoweringResult:
    """Convert (unless ``onnx_model`` is given), run in ORT, compare every output with ``tf_run``."""
    result = LoweringResult(example.name, lowering, tf_run_s=tf_run.run_s)
    try:
        onnx_model, actual = _convert_and_run(example, lowering, tf_run, inputs, onnx_model, write, repeat, result)
    except Exception as e:  # any failure is reported in the table, not hidden
        result.error = f"{type(e).__name__}: {e}"
        if os.environ.get("RUN_ALL_TRACEBACK"):
            traceback.print_exc()
        return result
    try:
        result.per_node = verify_per_node(example, onnx_model, inputs)
    except Exception as e:  # reported in the table
        result.error = f"per-node verification failed to run: {type(e).__name__}: {e}"
        if os.environ.get("RUN_ALL_TRACEBACK"):
            traceback.print_exc()
    expected = dict(tf_run.outputs)
    if example.variable_updates == "outputs":
        expected.update(variable_update_expectations(onnx_model, tf_run, result))
    missing = sorted(set(expected) - set(actual))
    if missing:
        result.error = (result.error + "; " if result.error else "") + f"ONNX model lacks outputs {missing}"
    for name in sorted(expected):
        if name not in actual:
            continue
        if name in tf_run.outputs:
            output = compare(example, name, expected[name], actual[name])
        else:
            output = compare_update(example, name, tf_run.variables_before[name], expected[name], actual[name])
        if output.tolerance.startswith("judged per node"):
            # The op that computes it, on TF's own inputs (converters.node_verification).
            check = None if result.per_node is None else result.per_node.check_of(name)
            output.tolerance = "per node: " + ("not checked" if check is None else
                                               "bit-exact" if check.check.exact else check.check.kind)
            output.ok = check is not None and check.ok
        result.outputs.append(output)
    return result


INTEGER = "integer"


def check_integer(example: ExampleModel, tf_run: TensorFlowRun, inputs: dict, onnx_model=None, write: bool = True,
                  repeat: int = 5) -> LoweringResult:
    """The integer lowering of a QAT classifier (converters.integer): its logits judged in TF's quantization steps on
    the example inputs and on the held-out digits (DEFAULT_STEP_BOUND), every quantized tensor on TF's values of the
    ones before it (within one step), and its held-out predictions against TF's (HELD_OUT_AGREEMENT)."""
    from converters.frontends import load_signature
    from converters.integer import read_summary
    from converters.integer.fusion import fusion_lines
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.integer.steps import judge_steps

    result = LoweringResult(example.name, INTEGER, tf_run_s=tf_run.run_s)
    try:
        onnx_model, actual = _convert_and_run(example, INTEGER, tf_run, inputs, onnx_model, write, repeat, result)
        lines, steps = read_summary(onnx_model)
        result.summary = tuple(lines) + tuple(fusion_lines(onnx_model))
        for name in sorted(tf_run.outputs):
            check = judge_steps(name, tf_run.outputs[name], actual[name], steps[name])
            result.outputs.append(_step_result(check, "example inputs"))
        if result.held_out is not None:
            check = judge_steps("logits", result.held_out.tf_logits, result.held_out.logits, steps["logits"])
            result.outputs.append(_step_result(check, f"{len(result.held_out.labels)} held-out digits"))
        loaded, fn = load_signature(str(example.saved_model), example.signature)
        result.per_tensor = verify_quantized_tensors(onnx_model, fn, inputs)
        del loaded
    except Exception as e:  # any failure is reported in the table, not hidden
        result.error = f"{type(e).__name__}: {e}"
        if os.environ.get("RUN_ALL_TRACEBACK"):
            traceback.print_exc()
    return result


def _step_result(check, where: str) -> OutputResult:
    """An end-to-end step judgment (converters.integer.steps) as a row of the example's output table."""
    top1 = "" if check.top1 is None else f", top-1 as TF {check.top1:.1%}"
    return OutputResult(f"{check.name} ({where})", (check.size,), check.max_steps * check.step, float("nan"),
                        int(round((1 - check.identical) * check.size)), check.size,
                        f"in steps of {check.step:.3g}: max {check.max_steps:g} (bound {check.bound:g}), within one "
                        f"{check.within_one:.1%}{top1}", check.ok)


def _ort_classifier(sess):
    """images -> logits by an ORT session of a classifier's inference graph."""
    name = sess.get_inputs()[0].name
    return lambda images: sess.run(["logits"], {name: images})[0]


def verify_per_node(example: ExampleModel, onnx_model, inputs: dict):
    """Every converted op of the model judged on TF's own input values (converters.node_verification), from a fresh
    load of the SavedModel (a training step assigns its variables)."""
    from converters.frontends import load_signature
    from converters.node_verification import verify_nodes

    loaded, fn = load_signature(str(example.saved_model), example.signature)
    try:
        return verify_nodes(onnx_model, fn, inputs=inputs, print_table=False)
    finally:
        del loaded


def compare_update(example: ExampleModel, name, before, expected, actual) -> OutputResult:
    """A variable-update output is judged on the update it makes (new - old, in float64, so the subtraction
    adds no rounding): a moving average moves by a small fraction of its value, and a tolerance relative to
    the value would accept the old value itself."""
    before, expected, actual = (np.asarray(a) for a in (before, expected, actual))
    if expected.dtype.kind != "f" or expected.shape != actual.shape or expected.dtype != actual.dtype:
        return compare(example, name, expected, actual)
    result = compare(example, name, expected.astype(np.float64) - before, actual.astype(np.float64) - before)
    result.n_differing = int(np.count_nonzero(~same_bits(expected, actual)))
    result.tolerance += " on the update"
    return result


def variable_update_expectations(onnx_model, tf_run: TensorFlowRun, result: LoweringResult) -> dict:
    """{update output: the variable's value in TF after the step}. Every variable the TF run changed must
    be among the model's recorded update outputs (an update left out is an error in ``result``)."""
    from converters.variable_state import VARIABLE_UPDATES_KEY

    props = {p.key: p.value for p in onnx_model.metadata_props}
    names = [n for n in props.get(VARIABLE_UPDATES_KEY, "").split(",") if n]
    changed = {k for k, after in tf_run.variables_after.items()
               if not same_bits(tf_run.variables_before[k], after).all()}
    left_out = sorted(changed - set(names))
    if left_out:
        result.error = f"variables TF updated but the model has no output for: {left_out}"
    unknown = sorted(set(names) - set(tf_run.variables_after))
    if unknown:
        result.error = f"update outputs {unknown} name no variable of the function"
    return {n: tf_run.variables_after[n] for n in names if n in tf_run.variables_after}


TF2ONNX = "tf2onnx"


def tf2onnx_baseline(example: ExampleModel, tf_run: TensorFlowRun, inputs: dict, repeat: int = 5) -> LoweringResult:
    """tf2onnx 1.17 alone (its own SavedModel loader and handlers, opset 17) on the same signature: conversion
    time and, where it converts, each function output's error against TF. Plain ONNX Runtime runs it."""
    import tf2onnx
    from tf2onnx import tf_loader

    result = LoweringResult(example.name, TF2ONNX, tf_run_s=tf_run.run_s)
    try:
        t = time.perf_counter()
        graph_def, in_names, out_names, renames = tf_loader.from_saved_model(
            str(example.saved_model), None, None, "serve", [example.signature], return_tensors_to_rename=True
        )
        onnx_model, _ = tf2onnx.convert.from_graph_def(
            graph_def, input_names=in_names, output_names=out_names, opset=17, tensors_to_rename=renames
        )
        result.convert_s = time.perf_counter() - t
        result.node_summary = f"{len(onnx_model.graph.node)} nodes"
        sess = session(onnx_model, log_severity_level=3)  # no custom domain: plain ONNX Runtime
        feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        actual = dict(zip(names, sess.run(names, feed)))
        result.ort_run_s = median_time(lambda: sess.run(names, feed), repeat)
        if "logits" in names:
            result.held_out = tf_run.judge_held_out(example, _ort_classifier(sess))
    except Exception as e:  # tf2onnx's failure is the finding
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return result
    for name in sorted(tf_run.outputs):
        if name in actual:
            result.outputs.append(compare(example, name, tf_run.outputs[name], actual[name]))
    return result


def run_example(example: ExampleModel, lowerings=LOWERINGS, seed: int = 0, write: bool = True, repeat: int = 5,
                baseline: bool = True):
    inputs = example.make_inputs(np.random.default_rng(seed))
    tf_run = TensorFlowRun(example, inputs, repeat)
    results = [check_lowering(example, lowering, tf_run, inputs, write=write, repeat=repeat)
               for lowering in lowerings if lowering != INTEGER]
    if INTEGER in lowerings and example.integer:
        results.append(check_integer(example, tf_run, inputs, write=write, repeat=repeat))
    if baseline:
        results.append(tf2onnx_baseline(example, tf_run, inputs, repeat))
    return inputs, results, tf_run.held_out, tf_run.onednn_held_out(example)


# ----------------------------------------------------------------------------------------------
# Printing.


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join("  " + line for line in lines)


def _ms(seconds):
    return "-" if np.isnan(seconds) else f"{seconds * 1e3:.2f}"


def format_example(example: ExampleModel, inputs: dict, results, tf_held_out: Optional[HeldOut] = None,
                   onednn_held_out: Optional[HeldOut] = None) -> str:
    shapes = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in inputs.items())
    lines = [f"== {example.name}: {example.description}", f"   inputs: {shapes}", ""]
    timing_rows = []
    for r in results:
        where = str(r.onnx_path.relative_to(MODELS_DIR.parent)) if r.onnx_path else "(not written)"
        status = "ok" if r.ok else "FAIL"
        if r.lowering == TF2ONNX:
            status = ("converts, " + ("matches" if r.ok else "outside tolerance")) if not r.error else "cannot convert"
        timing_rows.append(
            (r.lowering, "-" if np.isnan(r.convert_s) else f"{r.convert_s:.2f}", _ms(r.tf_run_s), _ms(r.ort_run_s),
             r.node_summary or "-", where, status)
        )
    lines.append(_table(("lowering", "convert s", "TF run ms", "ORT run ms", "ONNX graph", "file", "result"), timing_rows))
    lines.append("")
    rows = []
    for r in results:
        if r.error:
            lines.append(f"  {r.lowering}: {'fails' if r.lowering == TF2ONNX else 'ERROR'}: {r.error}")
        for o in r.outputs:
            rows.append(
                (r.lowering, o.name, "x".join(map(str, o.shape)) or "scalar", f"{o.max_abs_err:.3g}", f"{o.max_rel_err:.3g}",
                 f"{o.n_differing}/{o.n_elements}", o.tolerance, ("ok" if o.ok else "FAIL") + (f" {o.note}" if o.note else ""))
            )
    if rows:
        lines.append(_table(("lowering", "output", "shape", "max abs err", "max rel err", "#differing", "tolerance", "ok"), rows))
    if tf_held_out is not None:
        lines.append(f"  held-out digits ({len(tf_held_out.labels)} images): TF (Eigen) accuracy {tf_held_out.accuracy:.1%}, "
                     f"{tf_held_out.classes} classes predicted, {tf_held_out.distinct_rows} distinct logit rows")
        if onednn_held_out is not None:
            lines.append(f"    TF oneDNN: {onednn_held_out.describe()}")
    for r in results:
        if r.held_out is not None:
            verdict = "" if r.lowering == TF2ONNX else (" ok" if r.held_out.ok else " FAIL")
            lines.append(f"    {r.lowering}: {r.held_out.describe()}{verdict}")
    for r in results:
        if r.per_tensor is not None:
            lines += [f"  {r.lowering}: {line}" for line in r.summary]
            lines += [f"  {r.lowering}: {line}" for line in r.per_tensor.table().splitlines()]
    for r in results:
        report = getattr(r, "per_node", None)
        if report is None:
            continue
        exact = sum(1 for c in report.checks if c.check.exact)
        lines.append(f"  per node ({r.lowering}): {len(report.checks)} values of {report.nodes} nodes checked on TF's "
                     f"inputs, {exact} bit for bit, {len(report.failures)} failed ({report.seconds.get('total', 0):.1f} s)")
        if report.first_failure is not None:
            lines += ["  " + line for line in report.describe(report.first_failure)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(EXAMPLES_BY_NAME), default=[e.name for e in EXAMPLES])
    parser.add_argument("--lowerings", nargs="+", choices=LOWERINGS + (INTEGER,), default=list(LOWERINGS) + [INTEGER],
                        help="the integer lowering runs for the QAT classifiers (ExampleModel.integer)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per measurement (median is shown)")
    parser.add_argument("--no-write", action="store_true", help="do not overwrite the committed ONNX files")
    parser.add_argument("--no-tf2onnx", action="store_true", help="skip the tf2onnx-alone baseline row")
    parser.add_argument("--verbose", action="store_true", help="keep tf2onnx's log (its tracebacks for ops it could not convert)")
    args = parser.parse_args(argv)
    if not args.verbose:
        # Conversion failures are reported in the tables; tf2onnx would also log a traceback per node.
        import logging

        logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)

    summary = []
    for name in args.models:
        example = EXAMPLES_BY_NAME[name]
        inputs, results, *held_out = run_example(example, args.lowerings, args.seed, not args.no_write, args.repeat,
                                                 not args.no_tf2onnx)
        print(format_example(example, inputs, results, *held_out), "\n", flush=True)
        tf_held_out = held_out[0]
        summary += [(r.model, r.lowering, "ok" if r.ok else "FAIL",
                     "-" if r.held_out is None else f"{r.held_out.accuracy:.1%} (TF {tf_held_out.accuracy:.1%}), "
                                                    f"{r.held_out.agreement:.1%} as TF")
                    for r in results if r.lowering != TF2ONNX]
    print("== summary")
    print(_table(("model", "lowering", "result", "held-out accuracy"), summary))
    failed = [s for s in summary if s[2] != "ok"]
    print(f"\n{len(summary) - len(failed)} of {len(summary)} model conversions match TensorFlow" +
          ("" if not failed else f"; FAILED: {', '.join(f'{m}/{l}' for m, l, *_ in failed)}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
