"""Seeded random TF graphs around the family, each converted, verified and judged: a campaign that finds the bugs
no hand-written model does (issue 44; docs/graphgen.md).

``python -m tools.graphgen --graphs N --seed S --jobs J [--out DIR]``. The pieces, one module each:

- ``spec``: a graph as data (``GraphSpec``: the family it is written in, the input, the layers or raw ops), the
  shape rules that say which layer is valid where, and the TF ops and attribute values a graph reaches;
- ``draw``: the seeded generator (``draw_graph(seed, index)``), valid graphs only;
- ``build``: the TF side (imports TensorFlow): the model in its family (tfmot ``quantize_model``, tf_keras, Keras 3
  with fake-quant layers or ``model.quantize``, raw ``tf.function``s of the ops with their attributes), trained a
  few steps, written as one SavedModel with its inference, training-step and saliency signatures;
- ``oracle``: one graph through the project's CLI in every lowering and signature (``--verify --verify-nodes``, the
  integer lowering's per-tensor check), plus ONNX's checker and shape inference against ONNX Runtime's shapes,
  and tf2onnx alone as the baseline; each run classed as verified, refused (a ``ConversionError``, by reason) or
  failed (by class);
- ``worker``: a child process that runs graphs (TF imported once), so that a crash or a hang is a result;
- ``campaign``: the pool of workers, the JSONL results (resumable), the progress line;
- ``minimize``: delta debugging of a failing graph (drop layers, shrink shapes) while it fails the same way;
- ``report``: the summary, the failure and refusal tables, the coverage table per op and attribute value, and the
  tf2onnx column.
"""
