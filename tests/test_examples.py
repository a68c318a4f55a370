"""Every example runs, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.environ.get("VBATCH_MATRICES", os.path.join(ROOT, "..", "shared", "data", "matrices"))
MATRIX = os.path.join(FOLDER, "bcsstk09.mtx")
BCSSTK16 = os.path.join(FOLDER, "bcsstk16.triplet0")
real = pytest.mark.skipif(not os.path.exists(MATRIX), reason="no real matrices")
real16 = pytest.mark.skipif(not os.path.exists(BCSSTK16), reason="no real matrices")


@pytest.mark.parametrize("args, expect", [
    (["examples/quickstart.py", "--device", "cpu"], "info:"),
    (["examples/block_jacobi.py", "--device", "cpu"], "blocks <= 512"),
    pytest.param(["examples/block_jacobi.py", "--device", "cpu", "--matrix", MATRIX],
                 "blocks <= 512", marks=real),
    pytest.param(["examples/block_jacobi.py", "--device", "cpu", "--matrix", MATRIX, "--setup",
                  "posv", "--blocks", "2"], "start ||b - A M^-1 b||", marks=real),
    # n = 2000 keeps it near 4 s on two cores (the default 3000 takes about 8).
    (["examples/hmatrix_leaves.py", "--device", "cpu", "--points", "2000"],
     "error vs dense solve"),
    # bcsstk16 from the shared matrices where they are (CI), else a 2-D Laplacian
    (["examples/multifrontal.py", "--device", "cpu"], "refactor(A + I): backward error"),
    # where they are, the example must have solved the real one (not the fallback)
    pytest.param(["examples/multifrontal.py", "--device", "cpu"],
                 "matrix: bcsstk16.triplet0, n = 4884", marks=real16),
    pytest.param(["examples/multifrontal.py", "--device", "cuda"],
                 "refactor(A + I): backward error", marks=pytest.mark.gpu),
], ids=["quickstart", "block_jacobi", "block_jacobi_real", "block_jacobi_posv", "hmatrix",
        "multifrontal", "multifrontal_real", "multifrontal_gpu"])
def test_example_runs(args, expect):
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert expect in p.stdout, p.stdout
