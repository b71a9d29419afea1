"""tools/probe_applications.py (docs/applications.md) on its smallest network: tfmot's quantized MobileNet
(alpha 0.25, 64x64) converts in both lowerings and its outputs are TF's bit for bit; the tool exits 0."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.tensorflow


def test_quantized_mobilenet_converts_bit_exactly(capsys):
    from tools.probe_applications import main

    assert main(["--models", "MobileNet", "--quantized-only"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "inference" in line]
    assert len(lines) == 2, lines
    for line in lines:
        assert "ok: 0 outputs differ, max |err| 0" in line, line
