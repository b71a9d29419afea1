"""Differential fuzzing of the domain's ops: the library (through ONNX Runtime) against TensorFlow.

``python -m tools.fuzz --seed S --minutes M [--ops ...] [--asan]``. The pieces, one module each:

- ``values``, ``generate``: the seeded case generator (valid cases and one-mutation-away invalid ones);
- ``cases``: the case record and the size checks that keep a campaign from asking for gigabytes;
- ``child``, ``runner``: each side in its own child process, many cases per child, a per-case timeout;
- ``compare``, ``deviations``, ``classify``: the verdict on a case (the suite's comparison rules, the
  documented deviations by name);
- ``minimize``: shrinking a finding to a small case and printing it as a runnable reproducer;
- ``campaign``: the loop and its report (``__main__`` is the command line).
"""
