"""The suite's TF mode is pinned, whatever the environment and the CPU; the oneDNN child really runs oneDNN."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tf_modes import ONEDNN_ENV, call_in_mode, onednn_enabled

pytestmark = pytest.mark.tensorflow
TESTS = Path(__file__).resolve().parent


def test_this_process_runs_eigen_kernels():
    assert os.environ[ONEDNN_ENV] == "0"
    assert not onednn_enabled()


@pytest.mark.parametrize("outside", ["1", "0", None], ids=["env=1", "env=0", "unset"])
def test_conftest_pins_eigen_whatever_the_environment_says(outside):
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_ENV}
    if outside is not None:
        env[ONEDNN_ENV] = outside
    code = "import conftest, tf_modes; print(tf_modes.onednn_enabled())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=TESTS, env=dict(env, PYTHONPATH=str(TESTS)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_the_onednn_child_runs_onednn_kernels():
    assert call_in_mode("onednn", "tf_modes:onednn_enabled") is True
    assert call_in_mode("eigen", "tf_modes:onednn_enabled") is False
