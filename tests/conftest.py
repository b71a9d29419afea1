import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from backends import BACKENDS  # noqa: E402


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Each test using it runs once on the NumPy kernels and once through ONNX Runtime with the library."""
    return request.param
