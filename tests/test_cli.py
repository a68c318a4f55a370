"""`python -m vbatch`: the demo is the main job, so it is tested as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "vbatch", *args], capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )


@pytest.mark.parametrize("dist", ["uniform", "gauss", "skewed"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_demo_passes_and_reports(dist, dtype):
    p = run("demo", "--count", "150", "--nmax", "70", "--dist", dist, "--dtype", dtype,
            "--device", "cpu", "--nb", "16", "--repeat", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for word in ("150 SPD matrices", "sizes", "launches", "groups", "GFLOP/s", "worst", "ok"):
        assert word in out, out
    assert "FAILED" not in out


def test_demo_fails_on_a_non_spd_matrix_and_isolates_it():
    p = run("demo", "--count", "60", "--nmax", "40", "--device", "cpu", "--nonspd", "2",
            "--repeat", "1", "--policy", "ssde")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "2 not positive definite" in p.stdout and "matches the planted pivots" in p.stdout


def test_demo_rejects_bad_flags():
    p = run("demo", "--dist", "zipf")
    assert p.returncode == 2 and "invalid choice: 'zipf'" in p.stderr
    p = run("demo", "--nb", "0", "--device", "cpu")
    assert p.returncode != 0 and "nb" in p.stderr


def test_plan_prints_a_table():
    p = run("plan", "--count", "30", "--nmax", "90", "--nb", "16", "--device", "cpu",
            "--limit", "5")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("dsse plan, nb=16: 30 of 30 problems")
    assert lines[1].split()[:4] == ["#", "grp", "step", "strm"]
