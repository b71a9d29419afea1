"""TensorFlow as the oracle: one raw op called on NumPy inputs. Imported only by TF-marked test modules."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import ort_ops


def tf_raw_op(op, inputs, attrs):
    """The outputs of ``tf.raw_ops.<op>`` called with the spec's input names, as NumPy arrays."""
    spec = ort_ops.get_spec(op)
    out = getattr(tf.raw_ops, op)(**{p.name: x for p, x in zip(spec.inputs, inputs)}, **attrs)
    return [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def batch_norm_outputs(cases):
    """TF's outputs for ``[(op, inputs, attrs), ...]`` of the FusedBatchNorm* family.

    TF's Eigen gradient in inference mode takes channels-last data only (its Python gradient transposes
    around it, and so does the project): channels-first cases run on the transpose.
    """
    results = []
    for op, inputs, attrs in cases:
        if op.startswith("FusedBatchNormGrad") and not attrs["is_training"] and attrs["data_format"].startswith("NC"):
            channels_last = [np.moveaxis(inputs[0], 1, -1), np.moveaxis(inputs[1], 1, -1)] + list(inputs[2:])
            layout = "NHWC" if inputs[1].ndim == 4 else "NDHWC"
            out = tf_raw_op(op, channels_last, dict(attrs, data_format=layout))
            out[0] = np.moveaxis(out[0], -1, 1)
        else:
            out = tf_raw_op(op, inputs, attrs)
        results.append(out)
    return results


def depthwise_outputs(cases):
    """TF's (y, dx, dw) in NHWC for ``[(x, w, dy, stride, padding, explicit_paddings_nhwc, dilations), ...]``.

    Undilated: the three raw ops (any TF build runs them in NHWC). Dilated (stride 1, SAME/VALID):
    tf.nn.depthwise_conv2d, which goes through space-to-batch, and its gradients by GradientTape.
    """
    results = []
    for x, w, dy, s, pad, ep_nhwc, dil in cases:
        if tuple(dil) == (1, 1):
            attrs = {"strides": [1, s, s, 1], "padding": pad, "explicit_paddings": list(ep_nhwc)}
            y = tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **attrs).numpy()
            dx = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                input_sizes=np.array(x.shape, np.int32), filter=w, out_backprop=dy, **attrs).numpy()
            dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                input=x, filter_sizes=np.array(w.shape, np.int32), out_backprop=dy, **attrs).numpy()
        else:
            xt, wt = tf.constant(x), tf.constant(w)
            with tf.GradientTape(persistent=True) as tape:
                tape.watch([xt, wt])
                y = tf.nn.depthwise_conv2d(xt, wt, [1, 1, 1, 1], pad, dilations=list(dil))
            dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
            y, dx, dw = y.numpy(), dx.numpy(), dw.numpy()
        results.append((y, dx, dw))
    return results


def conv2d_backprops(cases):
    """TF's (filter gradient, input gradient) for ``[(x, w, dy, attrs), ...]`` by the raw Conv2DBackprop*
    ops, in the layout ``attrs`` names; where TF's kernels reject a case, the error message instead."""
    results = []
    for x, w, dy, attrs in cases:
        try:
            dw = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=np.array(w.shape, np.int32), out_backprop=dy,
                                                 **attrs).numpy()
            dx = tf.raw_ops.Conv2DBackpropInput(input_sizes=np.array(x.shape, np.int32), filter=w, out_backprop=dy,
                                                **attrs).numpy()
            results.append((dw, dx))
        except tf.errors.OpError as e:
            results.append(e.message)
    return results
