"""The conformance kit: TensorFlow's outputs for the domain's ops as ONNX node tests, and a runner.

- ``goldens``: the cases as shipped (one compressed ``.npz`` per op, written by ``tools/goldens``).
- ``rules``: how each output is judged (bits, a sum's bound, a float tolerance, a placeholder) and what a
  rejection must say.
- ``nodetest``: ``export(DIR)`` writes them as node-test directories with a manifest; ``load(DIR)`` reads them.
- ``backends`` / ``extensions``: ONNX Runtime with the library, the reference evaluator, onnxruntime-extensions.
- ``runner``: runs cases on a backend and reports one row per op.

Command line: ``python -m ort_ops.conformance export DIR`` and ``python -m ort_ops.conformance run``.
"""
