"""The validation rules of each family, each rule written once, in TensorFlow's order and words.

A family's module (``fake_quant``, ``quantize_dequantize``, ...) holds every check TF's kernels make:
attribute values first (as the kernel's constructor reads them), then the inputs (as its Compute
looks at them). The checks work on partial facts -- a shape may have unknown dims or an unknown rank,
an input's value may be unknown -- and skip what those facts cannot decide. The specs' shape
functions (``ort_ops.specs``) are built from them, and everything else calls them through
:meth:`ort_ops.spec.OpSpec.validate`: the NumPy kernels (behind ``run_reference``), the schemas' shape
inference, the custom lowering's handler and the standard lowerings.
"""
