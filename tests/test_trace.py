"""``vbatch trace``: one event per launch of the plan, on every backend, as valid trace JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DEVICES

import vbatch
from vbatch.ops.generate import spd_list
from vbatch.runtime.cli import main
from vbatch.runtime.trace import trace


def _dev(mats, device):
    if device == "cuda":
        import cupy

        return [cupy.asarray(m) for m in mats]
    return mats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["potrf", "posv", "gemm"])
def test_a_trace_has_one_event_per_launch(device, op):
    rng = np.random.default_rng(1)
    ns = [0, 1, 31, 32, 33, 90, 300]
    A = spd_list(ns, np.float64, rng)
    rt = vbatch.Runtime(device, nb=32) if device == "cuda" else vbatch.Runtime(device)
    if op == "potrf":
        fields = dict(batch=_dev(A, device))
    elif op == "posv":
        fields = dict(a=_dev(A, device), b=_dev([rng.standard_normal((n, 2)) for n in ns],
                                                device))
    else:
        fields = dict(a=_dev(A, device), b=_dev(A, device))
    tr = trace(rt, op, **fields)
    plan = tr.plan
    assert len(plan.launches) > 0
    assert sorted(e["launch"] for e in tr.events) == list(range(len(plan.launches)))
    for e in tr.events:
        lc = plan.launches[e["launch"]]
        assert e["kind"] == lc.kind and e["stream"] == lc.stream and e["count"] == lc.count
        assert e["dur_us"] >= 0 and e["start_us"] >= 0 and np.isfinite(e["start_us"])
    # Launches on one stream run in plan order, one after another.
    for s in {e["stream"] for e in tr.events}:
        mine = sorted((e for e in tr.events if e["stream"] == s), key=lambda e: e["launch"])
        for a, b in zip(mine, mine[1:]):
            assert b["start_us"] >= a["start_us"] + a["dur_us"] - 1.0  # (event resolution)
    doc = json.loads(json.dumps(tr.chrome({"op": op})))
    dev_events = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert len(dev_events) == len(plan.launches)
    assert doc["otherData"]["launches"] == len(plan.launches)
    # The traced call computed the right thing.
    host = [f.get() if hasattr(f, "get") else np.asarray(f) for f in
            (tr.result.factors if op != "gemm" else tr.result)]
    if op != "gemm":
        assert tr.result.ok
        for a, f in zip(A, host):
            assert np.allclose(f @ f.T, a, atol=1e-10 * max(1, len(a)))
    if op == "posv":
        B = [b.get() if hasattr(b, "get") else b for b in fields["b"]]
        for a, b, x in zip(A, B, tr.result.solutions):
            x = x.get() if hasattr(x, "get") else x
            assert np.allclose(a @ x, b, atol=1e-10 * max(1, len(a)))
    if op == "gemm":
        for a, c in zip(A, host):
            assert np.allclose(c, a @ a, atol=1e-10 * max(1, len(a)) ** 2)


@pytest.mark.parametrize("device", DEVICES)
def test_the_trace_command_writes_json_and_a_chart(device, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trace", "--device", device, "--count", "40", "--nmax", "80", "--op", "potrs",
                 "--nrhs", "2", "--out", str(out)]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    n = doc["otherData"]["launches"]
    assert n > 0
    assert len([e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]) == n
    png = (tmp_path / "t.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert "launches" in capsys.readouterr().out


# Ceilings chosen so that one term of the floor decides it: every event's floor is then known.
SLOW_PEAK = {"bw": 8e9, "peak": {"float64": 1e9, "float32": 2e9}}  # flops decide
SLOW_BW = {"bw": 8e9, "peak": {"float64": 1e30, "float32": 1e30}}  # traffic decides


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_floor_is_the_work_of_each_launch(device, dtype):
    rng = np.random.default_rng(2)
    ns = [0, 1, 10, 31, 32, 33, 70]
    A = [rng.standard_normal((n, n)).astype(dtype) for n in ns]
    rt = vbatch.Runtime(device)
    isz = np.dtype(dtype).itemsize
    # A GEMM of order n: 2 n^3 flops; A (or B) and O: 2 n^2 elements at least.
    tr = trace(rt, "gemm", ceil=SLOW_PEAK, a=_dev(A, device), b=_dev(A, device))
    peak = SLOW_PEAK["peak"][np.dtype(dtype).name]
    want = sum(2.0 * n**3 for n in ns) / peak * 1e6
    assert sum(e["floor_us"] for e in tr.events) == pytest.approx(want, rel=1e-12)
    tr = trace(rt, "gemm", ceil=SLOW_BW, a=_dev(A, device), b=_dev(A, device))
    want = sum(2.0 * n * n for n in ns) * isz / SLOW_BW["bw"] * 1e6
    assert sum(e["floor_us"] for e in tr.events) == pytest.approx(want, rel=1e-12)
    rows = tr.by_kind()
    assert sum(k["launches"] for k in rows) == len(tr.events)
    assert sum(k["floor_us"] for k in rows) == pytest.approx(want, rel=1e-12)
    assert tr.chrome()["otherData"]["by_kind"] == rows


@pytest.mark.parametrize("device", DEVICES)
def test_a_cholesky_trace_counts_its_work_once(device):
    # The panels' flops add up to the factorization's (n^3 / 3 and lower-order terms); what
    # they move is at least the lower triangle read and written once.
    rng = np.random.default_rng(3)
    ns = [0, 1, 31, 32, 33, 90, 300]
    A = spd_list(ns, np.float64, rng)
    rt = vbatch.Runtime(device, nb=32, block=64, block_above=64)
    tr = trace(rt, "potrf", ceil=SLOW_BW, batch=_dev(A, device))
    kinds = {e["kind"] for e in tr.events}
    assert "blas.gemm" in kinds  # the blocked path's block updates are counted too
    # A group of several launches (update, trsm) has its work counted once.
    rows = tr.by_kind()
    assert sum(k["tasks"] for k in rows) == len(tr.plan.tasks.kind)
    flops = sum(k["gflop"] for k in rows) * 1e9
    want = float(vbatch.ops.cholesky_flops(np.array(ns)).sum())
    assert want * 0.99 <= flops <= want * 1.05
    moved = sum(e["floor_us"] for e in tr.events) * 1e-6 * SLOW_BW["bw"]
    once = sum(e["mbyte"] for e in tr.events if e["first_of_group"]) * 1e6
    assert moved == pytest.approx(once, rel=1e-12)
    assert moved >= 8 * sum(n * (n + 1) for n in ns)


def test_a_triangle_gemm_counts_its_triangle():
    from vbatch.ops.blas import _tri_entries

    for mm in range(1, 9):
        for nn in range(1, 9):
            lo = sum(1 for i in range(mm) for j in range(nn) if i >= j)
            up = sum(1 for i in range(mm) for j in range(nn) if i <= j)
            assert _tri_entries(np.float64(mm), np.float64(nn), False) == lo, (mm, nn)
            assert _tri_entries(np.float64(mm), np.float64(nn), True) == up, (mm, nn)


def test_the_floor_takes_the_data_type_not_an_integer_argument():
    rng = np.random.default_rng(5)
    A = spd_list([20, 7], np.float32, rng)
    rt = vbatch.Runtime("cpu")
    # npiv (integers) comes first: the data are float32 all the same
    def moved(tr):
        return sum(e["mbyte"] for e in tr.events if e["first_of_group"]) * 1e6

    first = trace(rt, "potrf", ceil=SLOW_BW, npiv=np.array([20, 7]), batch=A)
    last = trace(rt, "potrf", ceil=SLOW_BW, batch=A, npiv=np.array([20, 7]))
    assert moved(first) == pytest.approx(moved(last), rel=1e-12)  # float64 would be twice
    assert moved(first) == pytest.approx(
        sum(e["floor_us"] for e in first.events) * 1e-6 * SLOW_BW["bw"])
    assert moved(first) >= 4 * (20 * 21 + 7 * 8)
