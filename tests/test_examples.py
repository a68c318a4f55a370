"""Every example runs, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX = os.path.join(ROOT, "..", "shared", "data", "matrices", "bcsstk09.mtx")


@pytest.mark.parametrize("args", [
    ["examples/quickstart.py", "--device", "cpu"],
    ["examples/block_jacobi.py", "--device", "cpu"],
    pytest.param(["examples/block_jacobi.py", "--device", "cpu", "--matrix", MATRIX],
                 marks=pytest.mark.skipif(not os.path.exists(MATRIX), reason="no real matrices")),
], ids=["quickstart", "block_jacobi", "block_jacobi_real"])
def test_example_runs(args):
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip()
