"""Contracts every op keeps on every backend, checked through one table of the ops.

* A parameter is part of the plan: the same shapes called again with one parameter changed, on
  one runtime, give that parameter's result (never a plan made for the other value).
* ``overwrite=True`` writes the caller's own arrays, down to 1 x 1; ``overwrite=False`` leaves
  a packed input's buffer exactly as it was, padding and gaps included.
* ``alpha = 0`` (trsm, trmm) and ``beta = 0`` (gemm, syrk, syr2k) read nothing they multiply:
  NaN there does not reach the output, in list and packed form, on sizes past every small path.
* ``Future.result(timeout=)`` raises ``TimeoutError`` while the work is held, then returns it.
* A plan's launch groups run in the documented order: levels in order, and inside a launch
  the task with the most work first.

Each op's case (``CASES``) draws square operands of the given sizes (so that every parameter
value fits the same shapes), calls the op and gives the float64 reference of each output.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from _check import to_host
from conftest import DEVICES
from vbatch import PackedBatch, Runtime
from vbatch.kernels.cpu import CpuBackend
from vbatch.ops import (
    gemm_reference,
    potrs_reference,
    reference,
    syr2k_reference,
    syrk_reference,
    trmm_reference,
    trsm_reference,
)
from vbatch.ops.generate import spd

SIZES = [0, 1, 2, 7, 31, 32, 33, 70]  # around the CUDA kernels' 32-wide tiles; 70: past them


def _xp(device):
    if device == "cuda":
        import cupy

        return cupy
    return np


def _packed(mats, order, device, dtype):
    """``mats`` as a packed batch with padding (ld > m on some) and gaps holding NaN, so that
    a write outside the matrices or a read of the padding shows."""
    m = np.array([a.shape[0] for a in mats], np.int64)
    n = np.array([a.shape[1] for a in mats], np.int64)
    lead = m if order == "F" else n
    ld = np.maximum(lead + np.arange(len(m)) % 3, 1)
    size = ld * (n if order == "F" else m)
    off = np.r_[0, np.cumsum(size + 3)[:-1]].astype(np.int64)
    data = np.full(int(off[-1] + size[-1] + 3) if len(m) else 1, np.nan, dtype)
    b = PackedBatch.from_buffer(data, n=n, m=m, offset=off, ld=ld, order=order)
    for i, a in enumerate(mats):
        if a.size:
            b.matrix(i)[...] = a
    return b.with_data(_xp(device).asarray(data)) if device == "cuda" else b


def _form(mats, form, device, dtype):
    mats = [np.array(a, dtype) for a in mats]  # (copies: the case keeps its own)
    if form == "list":
        return [_xp(device).asarray(a) for a in mats]
    return _packed(mats, form[-1], device, dtype)


def _host(a):
    if type(a).__module__.split(".")[0] == "torch":
        return a.detach().cpu().numpy()
    return to_host(a)


def _host_list(x):
    if isinstance(x, PackedBatch):
        return [_host(a) for a in x.unpack()]
    return [_host(a) for a in x]


def _tri(rng, n, lower=True):
    """A well-conditioned triangle (both halves filled: each op reads only its own)."""
    t = rng.uniform(-1, 1, (n, n)) / max(n, 1)
    np.fill_diagonal(t, rng.uniform(1, 2, n) * rng.choice([-1, 1], n))
    return t


@dataclass
class Case:
    """An op's operands (numpy, float64), what ``call`` passes, and the reference."""

    name: str  # the op's registered name
    fields: tuple  # its operands' request fields, in the order its Runtime method takes them
    operands: dict  # field -> list of numpy arrays
    outputs: Callable  # result -> list of output lists (host), in reference order
    reference: Callable  # (operands, params) -> list of lists of float64 arrays
    params: list  # parameter sets; each differs from the one before in one parameter
    written: str  # the operand that overwrite=True writes
    read: str | None = None  # an operand alpha = 0 / beta = 0 must not read
    zero: str | None = None  # the scalar that is 0 there

    def call(self, rt, operands: dict, params: dict):
        """The op through its Runtime method (the path a user takes; ``potrf``: cholesky)."""
        method = getattr(rt, "cholesky" if self.name == "potrf" else self.name)
        return method(*(operands[f] for f in self.fields), **params)

    def plan(self, rt, operands: dict, params: dict):
        return rt.plan_for(self.name, **operands, **params)


def _spd_list(rng, sizes):
    return [spd(n, np.float64, rng) for n in sizes]


def _square(rng, sizes):
    return [rng.uniform(-1, 1, (n, n)) for n in sizes]


def make_case(op: str, rng, sizes) -> Case:
    if op == "potrf":
        return Case(
            op, ("batch",), {"batch": _spd_list(rng, sizes)},
            lambda r: [_host_list(r.factors)],
            lambda o, p: [[reference(x, None if p.get("npiv") is None else p["npiv"][i])[0]
                           for i, x in enumerate(o["batch"])]],
            [{}, {"npiv": [min(5, n) for n in sizes]}, {"npiv": [n // 2 for n in sizes]}, {}],
            "batch")
    if op == "gemm":
        ops = {"a": _square(rng, sizes), "b": _square(rng, sizes), "c": _square(rng, sizes)}
        flags = ["trans_a", "trans_b"]
        return Case(
            op, ("a", "b", "c"), ops, lambda r: [_host_list(r)],
            lambda o, p: [[gemm_reference(x, y, z, **p) for x, y, z in
                           zip(o["a"], o["b"], o["c"])]],
            _flips(flags, {"alpha": 1.0, "beta": 0.5}) + [{"alpha": -2.0, "beta": 0.5}],
            "c", "c", "beta")
    if op in ("syrk", "syr2k"):
        ops = {"a": _square(rng, sizes), "c": _square(rng, sizes)}
        if op == "syr2k":
            ops["b"] = _square(rng, sizes)
        fields = ("a", "b", "c") if op == "syr2k" else ("a", "c")
        fn = syr2k_reference if op == "syr2k" else syrk_reference
        return Case(
            op, fields, ops, lambda r: [_host_list(r)],
            lambda o, p: [[fn(*xs, **p) for xs in zip(*(o[f] for f in fields))]],
            _flips(["trans", "lower"], {"alpha": 1.0, "beta": 0.5}), "c", "c", "beta")
    if op in ("trsm", "trmm"):
        ops = {"a": [_tri(rng, n) for n in sizes], "b": _square(rng, sizes)}
        fn = trsm_reference if op == "trsm" else trmm_reference
        base = {"alpha": 1.5, "side": "left"}
        params = _flips(["lower", "trans_a", "unit_diagonal"], base)
        params += [dict(params[-1], side="right")]
        return Case(
            op, ("a", "b"), ops, lambda r: [_host_list(r)],
            lambda o, p: [[fn(x, y, **p) for x, y in zip(o["a"], o["b"])]],
            params, "b", "b", "alpha")
    if op == "potrs":
        ls = [np.linalg.cholesky(x) for x in _spd_list(rng, sizes)]
        ops = {"l": ls, "b": _square(rng, sizes)}
        return Case(
            op, ("l", "b"), ops, lambda r: [_host_list(r)],
            lambda o, p: [[potrs_reference(x, y) for x, y in zip(o["l"], o["b"])]],
            [{}], "b")
    if op == "posv":
        ops = {"a": _spd_list(rng, sizes), "b": _square(rng, sizes)}
        return Case(
            op, ("a", "b"), ops,
            lambda r: [_host_list(r.factors), _host_list(r.solutions)],
            lambda o, p: [[reference(x)[0] for x in o["a"]],
                          [potrs_reference(reference(x)[0], y) for x, y in zip(o["a"], o["b"])]],
            [{}], "b")
    raise KeyError(op)


def _flips(flags, base):
    """Parameter sets that turn ``flags`` on one at a time, then off again one at a time."""
    out, cur = [dict(base, **{f: False for f in flags})], {f: False for f in flags}
    for f in flags + flags:
        cur[f] = not cur[f]
        out.append(dict(base, **cur))
    return out


OPS = ["potrf", "gemm", "syrk", "syr2k", "trsm", "trmm", "potrs", "posv"]


def _check(case, res, params, dtype, where):
    got = case.outputs(res)
    want = case.reference(case.operands, params)
    tol = 50 * max(SIZES + [1]) * np.finfo(dtype).eps
    for g_list, w_list in zip(got, want):
        assert len(g_list) == len(w_list), where
        for i, (g, w) in enumerate(zip(g_list, w_list)):
            g = np.asarray(g, np.float64)
            assert g.shape == w.shape, f"{where}, problem {i}: shape {g.shape} != {w.shape}"
            assert not np.isnan(g).any(), f"{where}, problem {i}: NaN in the output"
            err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1.0)
            assert err <= tol, f"{where}, problem {i}: error {err:.2e}"


KINDS = ["native"] + [k for k in ("torch",) if importlib.util.find_spec(k)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["list", "packedF"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", OPS)
def test_every_op_in_every_dtype_form_and_array_kind(device, kind, form, dtype, op):
    """Sizes 0, 1, tile - 1, tile, tile + 1 and past the tile in one batch, against the float64
    reference; the device's own arrays (numpy, cupy) or torch's, where installed, in and out."""
    rng = np.random.default_rng(7)
    case = make_case(op, rng, SIZES)
    operands = {k: _form(v, form, device, dtype) for k, v in case.operands.items()}
    if kind == "torch":
        import torch

        def tt(a):
            t = torch.from_numpy(np.ascontiguousarray(to_host(a)))
            return t.cuda() if device == "cuda" else t

        operands = {k: [tt(a) for a in v] if isinstance(v, list) else
                    PackedBatch.from_buffer(tt(v.data), n=v.n, m=v.m, offset=v.offset,
                                            ld=v.ld, order=v.order)
                    for k, v in operands.items()}
    res = case.call(Runtime(device), operands, case.params[0]).result()
    if kind == "torch":  # (the outputs are torch's too)
        given = res.factors if op == "potrf" else (
            res.solutions if op == "posv" else res)
        first = given[0] if form == "list" else given.buffer
        assert type(first).__module__.split(".")[0] == "torch", type(first)
    _check(case, res, case.params[0], dtype, f"{op} {kind} {form} {np.dtype(dtype).name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
@pytest.mark.parametrize("op", OPS)
def test_a_parameter_changed_on_the_same_shapes_gives_its_own_result(device, form, op):
    rng = np.random.default_rng(1)
    case = make_case(op, rng, SIZES)
    rt = Runtime(device)
    operands = {k: _form(v, form, device, np.float64) for k, v in case.operands.items()}
    for step, params in enumerate(case.params):
        res = case.call(rt, operands, params).result()
        _check(case, res, params, np.float64, f"{op} {form}, call {step} with {params}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_overwrite_writes_the_callers_arrays_down_to_one_by_one(device, op):
    """In list form, overwrite=True leaves each output in the caller's own array of the
    operand it replaces (the smallest sizes too), and gives those arrays back."""
    rng = np.random.default_rng(2)
    sizes = [1, 0, 1, 2, 3, 1]
    case = make_case(op, rng, sizes)
    for params in case.params[:2]:
        operands = {k: _form(v, "list", device, np.float64) for k, v in case.operands.items()}
        mine = list(operands[case.written])
        res = case.call(Runtime(device), operands, dict(params, overwrite=True)).result()
        want = case.reference(case.operands, params)
        # the output that replaces the written operand: the factors for cholesky, else the last
        out = want[0] if op == "potrf" else want[-1]
        if op == "posv":  # posv writes a (the factors) and b (the solutions)
            out = want[1]
        for i, (arr, w) in enumerate(zip(mine, out)):
            got = to_host(arr).astype(np.float64)
            if op == "potrf":
                got = np.tril(got)
            err = np.abs(got - w).max(initial=0.0) / max(np.abs(w).max(initial=0.0), 1.0)
            assert err <= 1e-12, f"{op} {params}, problem {i} (n {sizes[i]}): caller's array " \
                                 f"not written ({err:.2e})"
        given = res.solutions if op == "posv" else (res.factors if op == "potrf" else res)
        assert all(g is a for g, a in zip(given, mine)), f"{op}: not the caller's arrays back"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["packedF", "packedC"])
@pytest.mark.parametrize("op", OPS)
def test_overwrite_false_leaves_a_packed_input_as_it_was(device, form, op):
    rng = np.random.default_rng(3)
    case = make_case(op, rng, SIZES)
    operands = {k: _form(v, form, device, np.float64) for k, v in case.operands.items()}
    before = {k: to_host(v.data).copy() for k, v in operands.items()}
    res = case.call(Runtime(device), operands, case.params[0]).result()
    _check(case, res, case.params[0], np.float64, f"{op} {form}")
    for k, v in operands.items():
        assert np.array_equal(to_host(v.data), before[k], equal_nan=True), \
            f"{op}: operand {k} changed without overwrite"


NAN_SIZES = [0, 1, 5, 32, 33, 70, 100, 130, 200]  # past the compiled small paths (CPU and CUDA)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", ["gemm", "syrk", "syr2k", "trsm", "trmm"])
def test_a_zero_scalar_reads_nothing_it_multiplies(device, form, dtype, op):
    """alpha = 0 in trsm/trmm gives zeros without reading b; beta = 0 in gemm/syrk/syr2k does
    not read c: NaN there never reaches the output."""
    rng = np.random.default_rng(4)
    case = make_case(op, rng, NAN_SIZES)
    params = dict(case.params[1], **{case.zero: 0.0})
    nan = {k: ([np.full_like(x, np.nan) for x in v] if k == case.read else v)
           for k, v in case.operands.items()}
    operands = {k: _form(v, form, device, dtype) for k, v in nan.items()}
    res = case.call(Runtime(device), operands, params).result()
    clean = dict(case.operands, **{case.read: [np.zeros_like(x) for x in case.operands[case.read]]})
    want = case.reference(clean, params)
    tol = 50 * max(NAN_SIZES) * np.finfo(dtype).eps
    for i, (g, w) in enumerate(zip(case.outputs(res)[0], want[0])):
        g = np.asarray(g, np.float64)
        if op in ("syrk", "syr2k"):  # the other triangle is c's own: NaN, as given
            keep = np.tril(np.ones(g.shape, bool)) if params["lower"] else \
                np.triu(np.ones(g.shape, bool))
            g, w = g[keep], w[keep]
        assert not np.isnan(g).any(), f"{op} {form}, problem {i}: NaN from the unread operand"
        err = np.abs(g - w).max(initial=0.0) / max(np.abs(w).max(initial=0.0), 1.0)
        assert err <= tol, f"{op} {form}, problem {i}: error {err:.2e}"


@pytest.mark.parametrize("op", ["potrf", "gemm", "posv"])
def test_result_with_a_timeout_raises_while_the_work_is_held(monkeypatch, op):
    """On the CPU: the work held in its begin (a gate the test opens), result(timeout=) raises
    TimeoutError, and the same future gives the result once the gate is open."""
    gate = threading.Event()
    begin = CpuBackend.begin

    def held(self, *a, **kw):
        assert gate.wait(60), "liveness guard: the gate was never opened"
        return begin(self, *a, **kw)

    monkeypatch.setattr(CpuBackend, "begin", held)
    rng = np.random.default_rng(5)
    case = make_case(op, rng, [3, 9, 40])
    try:
        fut = case.call(Runtime("cpu"), case.operands, case.params[0])
        with pytest.raises(cf.TimeoutError):
            fut.result(timeout=0.05)
        assert not fut.done()
    finally:
        gate.set()
    _check(case, fut.result(timeout=60), case.params[0], np.float64, op)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_launch_groups_are_in_level_order_with_the_most_work_first(device, op):
    """The plan's order (scheduler.plan._group_order): tasks by level, then inside each launch
    group the task with the most work (its kind's flops) first."""
    rng = np.random.default_rng(6)
    sizes = [int(x) for x in rng.integers(0, 300, 60)]
    case = make_case(op, rng, sizes)
    rt = Runtime(device)
    operands = {k: _form(v, "packedF", device, np.float64) for k, v in case.operands.items()}
    plan = case.plan(rt, operands, case.params[0])
    t = plan.tasks
    assert np.all(np.diff(t.level) >= 0), "tasks not in level order"
    groups = 0
    for lc in plan.launches:
        kind = plan.kinds[int(t.kind[lc.lo])]
        if kind.ordered or lc.hi - lc.lo < 2:
            continue
        s = slice(lc.lo, lc.hi)
        work = np.asarray(kind.flops(t.args[s], t.rows[s], t.cols[s], t.width[s]), np.float64)
        assert np.all(np.diff(work) <= 0), f"launch {lc.index} ({lc.kind}): not most work first"
        groups += 1
    assert groups, "no launch of two tasks or more: the order was not checked"


def test_every_op_is_in_the_table():
    """A new op gets these contracts by a case in make_case."""
    from vbatch.ops.op import OPS as REGISTERED

    assert set(REGISTERED) - {"frontal", "frontal_solve"} <= set(OPS), "an op without a case"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_after_a_failed_future_every_op_raises_a_dependency_error(device, op, monkeypatch):
    """A call ordered after a future that failed raises DependencyError from its own result,
    whatever the op."""
    from vbatch import DependencyError

    rng = np.random.default_rng(8)
    case = make_case(op, rng, [3, 9])
    rt = Runtime(device)
    backend = type(rt.backend)
    real, calls = backend.begin, []

    def fails_once(self, *a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return real(self, *a, **kw)

    monkeypatch.setattr(backend, "begin", fails_once)
    xp = _xp(device)
    first = rt.cholesky([xp.asarray(spd(4, np.float64, rng))])
    with pytest.raises(RuntimeError, match="device lost"):
        first.result(timeout=60)
    operands = {k: _form(v, "list", device, np.float64) for k, v in case.operands.items()}
    params = dict(case.params[0], after=[first])
    with pytest.raises(DependencyError, match=r"after\[0\] failed"):
        case.call(rt, operands, params).result(timeout=60)
