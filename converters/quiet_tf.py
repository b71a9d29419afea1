"""TensorFlow imported without its start-up lines on stderr, for the command line.

Importing TF 2.21 prints, whatever TF_CPP_MIN_LOG_LEVEL says (absl logs them before its flags are read):
"All log messages before absl::InitializeLog() ...", the oneDNN and "Could not find cuda drivers" notes,
and at the first device query "failed call to cuInit". None of them is about the conversion, and a user
should not have to learn to ignore them, so the CLI imports TF with file descriptor 2 pointed at a
temporary file and replays that file only if the import fails. Library users import TF themselves.
"""
from __future__ import annotations

import os
import sys
import tempfile


def import_tensorflow_quietly():
    """Import TensorFlow (and initialise its devices) with C-level stderr captured; returns the module."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # the device scan that logs cuInit's failure on a machine without GPU
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
    return tf
