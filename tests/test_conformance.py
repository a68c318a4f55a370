"""The conformance suite: every registered operation on every backend, from the registry.

Each public op's ``example`` (vbatch.ops.op.Example, in its op module) gives float64 operands
of given sizes, the parameter sets to try and the reference of every output; this module runs
it through the op's Runtime method, the path a user takes. A new op gets all of it by
registering. Checked:

* every dtype, form (list, column-major and row-major pack) and array kind (the device's own,
  torch's where installed), sizes 0, 1, tile - 1, tile, tile + 1 and past it in one batch,
  against the float64 reference;
* a parameter is part of the plan: the same shapes called again with one parameter changed, on
  one runtime, give that parameter's result (never a plan made for the other value);
* ``overwrite=True`` writes the caller's own arrays, down to 1 x 1; ``overwrite=False`` leaves
  a packed input's buffer exactly as it was, padding and gaps included;
* a zero ``alpha``/``beta`` reads nothing it multiplies: NaN there does not reach the output;
* ``Future.result(timeout=)`` raises ``TimeoutError`` while the work is held, then returns it;
* a plan's launch groups run in the documented order (levels, then most work first);
* a call ordered after a failed future raises DependencyError;
* bad input is named (problem and operand) before any work;
* a prepared call runs, rebinds operands of the same sizes, and names other sizes.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import importlib.util
import threading
from dataclasses import dataclass

import numpy as np
import pytest

from _check import to_host
from conftest import DEVICES
from vbatch import InputError, PackedBatch, Runtime
from vbatch.core.batch import Views
from vbatch.kernels.cpu import CpuBackend
from vbatch.ops.generate import spd
from vbatch.ops.op import OPS as REGISTERED
from vbatch.ops.op import Example, public

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
    if _fixed(mats):
        return mats
    mats = [np.array(a, dtype) for a in mats]  # (copies: the case keeps its own)
    if form == "list":
        return [_xp(device).asarray(a) for a in mats]
    return _packed(mats, form[-1], device, dtype)


def _fixed(operand) -> bool:
    """An operand that is no batch of matrices (getrs's pivots, as getrf gives them): passed
    as it is in every form, dtype and array kind."""
    return isinstance(operand, Views)


def _host(a):
    if type(a).__module__.split(".")[0] == "torch":
        return a.detach().cpu().numpy()
    return to_host(a)


def _host_list(x):
    if isinstance(x, PackedBatch):
        return [_host(a) for a in x.unpack()]
    return [_host(a) for a in x]


OPS = [op.name for op in public()]


@dataclass
class Case:
    """An op's example and how its Runtime method names the operands."""

    name: str
    ex: Example

    def __getattr__(self, name):
        return getattr(self.ex, name)

    def call(self, rt, operands: dict, params: dict):
        """The op through its Runtime method (the path a user takes; ``potrf``: cholesky)."""
        op = REGISTERED[self.name]
        param = {f: p for p, f in op.fields}  # request field -> the method's parameter
        return getattr(rt, op.api.__name__)(
            **{param.get(f, f): v for f, v in operands.items()}, **params)

    def plan(self, rt, operands: dict, params: dict):
        return rt.plan_for(self.name, **operands, **params)


def make_case(op: str, rng, sizes, dtype=np.float64) -> Case:
    """The op's example; for a complex ``dtype``, of complex operands (with the parameters
    only they take: "C", complex scalars)."""
    return Case(op, REGISTERED[op].example(rng, list(sizes), dtype))


COMPLEX = [np.complex64, np.complex128]


def _check(case, res, params, dtype, where):
    got = [_host_list(x) for x in case.outputs(res)]
    want = case.reference(case.operands, params)
    tol = 50 * max(SIZES + [1]) * np.finfo(dtype).eps
    for g_list, w_list in zip(got, want):
        assert len(g_list) == len(w_list), where
        for i, (g, w) in enumerate(zip(g_list, w_list)):
            g = np.asarray(g)
            g = g.astype(np.result_type(g.dtype, np.float64))
            assert g.shape == w.shape, f"{where}, problem {i}: shape {g.shape} != {w.shape}"
            assert not np.isnan(g).any(), f"{where}, problem {i}: NaN in the output"
            err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1.0)
            assert err <= tol, f"{where}, problem {i}: error {err:.2e}"


KINDS = ["native"] + [k for k in ("torch",) if importlib.util.find_spec(k)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64] + COMPLEX)
@pytest.mark.parametrize("op", OPS)
def test_every_op_in_every_dtype_form_and_array_kind(device, kind, form, dtype, op):
    """Sizes 0, 1, tile - 1, tile, tile + 1 and past the tile in one batch, against the
    double-precision reference; the device's own arrays (numpy, cupy) or torch's, where
    installed, in and out."""
    rng = np.random.default_rng(7)
    case = make_case(op, rng, SIZES, dtype)
    operands = {k: _form(v, form, device, dtype) for k, v in case.operands.items()}
    if kind == "torch":
        import torch

        def tt(a):
            t = torch.from_numpy(np.ascontiguousarray(to_host(a)))
            return t.cuda() if device == "cuda" else t

        operands = {k: v if _fixed(v) else [tt(a) for a in v] if isinstance(v, list) else
                    PackedBatch.from_buffer(tt(v.data), n=v.n, m=v.m, offset=v.offset,
                                            ld=v.ld, order=v.order)
                    for k, v in operands.items()}
    res = case.call(Runtime(device), operands, case.params[0]).result()
    # (the op's ``returns`` names its result's output fields: vbatch.distributed reads them)
    returns = REGISTERED[op].returns
    assert dataclasses.is_dataclass(res) == bool(returns), (op, type(res))
    for field, _ in returns:
        assert getattr(res, field) is not None, (op, field)
    if kind == "torch":  # (the outputs are torch's too)
        given = case.outputs(res)[-1]
        first = given[0] if form == "list" else given.buffer
        assert type(first).__module__.split(".")[0] == "torch", type(first)
    _check(case, res, case.params[0], dtype, f"{op} {kind} {form} {np.dtype(dtype).name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("op", OPS)
def test_a_parameter_changed_on_the_same_shapes_gives_its_own_result(device, form, dtype, op):
    """Complex operands add their own parameters: "C" where the op takes a trans, and complex
    alpha and beta (real ones where the op takes only those, HERK's)."""
    rng = np.random.default_rng(1)
    case = make_case(op, rng, SIZES, dtype)
    rt = Runtime(device)
    operands = {k: _form(v, form, device, dtype) for k, v in case.operands.items()}
    for step, params in enumerate(case.params):
        res = case.call(rt, operands, params).result()
        _check(case, res, params, dtype, f"{op} {form}, call {step} with {params}")


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
        out = case.reference(case.operands, params)[-1]  # what replaces the written operand
        for i, (arr, w) in enumerate(zip(mine, out)):
            got = to_host(arr).astype(np.float64)
            if case.mask is not None:
                got = case.mask(got)
            err = np.abs(got - w).max(initial=0.0) / max(np.abs(w).max(initial=0.0), 1.0)
            assert err <= 1e-12, f"{op} {params}, problem {i} (n {sizes[i]}): caller's array " \
                                 f"not written ({err:.2e})"
        given = case.outputs(res)[-1]
        assert all(g is a for g, a in zip(given, mine)), f"{op}: not the caller's arrays back"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["packedF", "packedC"])
@pytest.mark.parametrize("op", OPS)
def test_overwrite_false_leaves_a_packed_input_as_it_was(device, form, op):
    rng = np.random.default_rng(3)
    case = make_case(op, rng, SIZES)
    operands = {k: _form(v, form, device, np.float64) for k, v in case.operands.items()}
    data = {k: (v.batch if _fixed(v) else v).data for k, v in operands.items()}
    before = {k: to_host(v).copy() for k, v in data.items()}
    res = case.call(Runtime(device), operands, case.params[0]).result()
    _check(case, res, case.params[0], np.float64, f"{op} {form}")
    for k, v in data.items():
        assert np.array_equal(to_host(v), before[k], equal_nan=True), \
            f"{op}: operand {k} changed without overwrite"


NAN_SIZES = [0, 1, 5, 32, 33, 70, 100, 130, 200]  # past the compiled small paths (CPU and CUDA)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("op", [o.name for o in public()
                                if o.example(np.random.default_rng(0), [1]).zero])
def test_a_zero_scalar_reads_nothing_it_multiplies(device, form, dtype, op):
    """alpha = 0 in trsm/trmm gives zeros without reading b; beta = 0 in gemm/syrk/syr2k does
    not read c: NaN there never reaches the output."""
    rng = np.random.default_rng(4)
    case = make_case(op, rng, NAN_SIZES, dtype)
    params = dict(case.params[1], **{case.zero: 0.0})
    nan = {k: ([np.full_like(x, np.nan) for x in v] if k == case.read else v)
           for k, v in case.operands.items()}
    operands = {k: _form(v, form, device, dtype) for k, v in nan.items()}
    res = case.call(Runtime(device), operands, params).result()
    clean = dict(case.operands, **{case.read: [np.zeros_like(x) for x in case.operands[case.read]]})
    want = case.reference(clean, params)
    tol = 50 * max(NAN_SIZES) * np.finfo(dtype).eps
    for i, (g, w) in enumerate(zip(_host_list(case.outputs(res)[0]), want[0])):
        g = np.asarray(g).astype(w.dtype)
        if case.zero == "beta" and "lower" in params:  # the other triangle: c's own, NaN
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
    monkeypatch.setattr(Runtime, "INLINE_FLOPS", -1)  # (every call on the worker)
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_bad_input_is_named_before_any_work(device, op, monkeypatch):
    """A problem of the wrong shape or dtype raises InputError naming the problem (and the
    operand, where the op has several), and nothing reaches the backend."""
    from vbatch import InputError

    rt = Runtime(device)
    began = []
    real = type(rt.backend).begin
    monkeypatch.setattr(type(rt.backend), "begin",
                        lambda self, *a, **kw: began.append(1) or real(self, *a, **kw))
    case = make_case(op, np.random.default_rng(11), [3, 4, 5])
    first = next(iter(case.operands))
    for how in ("dtype",) if case.any_shape else ("shape", "dtype"):
        operands = {k: [_xp(device).asarray(a) for a in v] for k, v in case.operands.items()}
        x = case.operands[first][1]
        operands[first][1] = _xp(device).asarray(
            np.zeros((x.shape[0] + 1, x.shape[1])) if how == "shape" else x.astype(np.int64))
        with pytest.raises(InputError, match="problem 1") as err:
            case.call(rt, operands, case.params[0])
        if len(case.operands) > 1 and how == "dtype":
            assert f"{first}:" in str(err.value), str(err.value)
    assert not began


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_real_and_complex_do_not_mix_and_complex_parameters_need_complex_operands(
        device, op, monkeypatch):
    """A complex problem among real ones, a complex operand beside real ones, a complex
    scalar for real operands (or for one the op takes real), an unknown ``trans``: each an
    InputError naming the problem or the operand, and nothing reaches the backend. (A backend
    that takes no complex type for an op refuses it by name: test_runtime's
    test_a_dtype_the_backend_does_not_take_is_refused_before_any_work.)"""
    from vbatch import InputError

    rt = Runtime(device)
    began = []
    real = type(rt.backend).begin
    monkeypatch.setattr(type(rt.backend), "begin",
                        lambda self, *a, **kw: began.append(1) or real(self, *a, **kw))
    xp = _xp(device)
    case = make_case(op, np.random.default_rng(12), [3, 4, 5])
    names = [k for k, v in case.operands.items() if not _fixed(v)]
    first = names[0]

    def given(dtype, mixed=None):
        out = {k: v if _fixed(v) else [xp.asarray(a.astype(dtype)) for a in v]
               for k, v in case.operands.items()}
        if mixed is not None:
            out[first][1] = xp.asarray(case.operands[first][1].astype(mixed))
        return out

    # (one operand: its name is not needed)
    named = f"{first}: " if len(case.operands) > 1 else f"({first}: )?"
    with pytest.raises(InputError, match=rf"problem 1: {named}dtype complex128 differs"):
        case.call(rt, given(np.float64, np.complex128), case.params[0])
    if len(names) > 1:
        ops = given(np.float64)
        ops[names[1]] = [xp.asarray(a.astype(np.complex128)) for a in case.operands[names[1]]]
        with pytest.raises(InputError, match=rf"{names[1]} is complex128 but {first} is float64"):
            case.call(rt, ops, case.params[0])
    params = case.params[0]
    for scalar in [s for s in ("alpha", "beta") if s in params]:
        with pytest.raises(InputError, match=rf"{scalar} = \(?1\+1j\)? is complex, but (the "
                                             rf"operands are float64|{scalar} is real for this "
                                             "op)"):
            case.call(rt, given(np.float64), dict(params, **{scalar: 1 + 1j}))
        if op in ("herk",) or (op == "her2k" and scalar == "beta"):
            with pytest.raises(InputError, match=rf"{scalar} .* is complex, but {scalar} is "
                                                 "real for this op"):
                case.call(rt, given(np.complex128), dict(params, **{scalar: 1 + 1j}))
    for t in [t for t in ("trans", "trans_a", "trans_b") if t in params]:
        # (a rank-k update's trans is a flag: op(A) is A^T, or A^H for HERK and HER2K)
        with pytest.raises(InputError, match=rf"{t} must be (True or False|False, True, 'N', "
                                             "'T' or 'C'), got 'H'"):
            case.call(rt, given(np.complex128), dict(params, **{t: "H"}))
    assert not began


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
@pytest.mark.parametrize("op", OPS)
def test_a_prepared_call_runs_again_and_names_other_sizes(device, form, op):
    """rt.prepare plans once; run() repeats the call (the replay road on the GPU, packed), on
    the operands it was prepared with or on new ones of the same sizes in any form; operands
    of other sizes are named problem by problem, never planned again; overwrite is per run."""
    from vbatch import InputError

    sizes = [0, 1, 31, 33, 5]
    case = make_case(op, np.random.default_rng(9), sizes)
    params = case.params[-1]
    rt = Runtime(device)
    operands = {k: _form(v, form, device, np.float64) for k, v in case.operands.items()}
    p = rt.prepare(op, **operands, **params)
    assert p.plan is rt.plan_for(op, **operands, **params)
    for run in range(3):
        _check(case, p.run().result(), params, np.float64, f"{op} {form}, run {run}")
    other = "packedF" if form == "list" else "list"
    case2 = make_case(op, np.random.default_rng(10), sizes)
    for f in (form, other):
        new = {k: _form(v, f, device, np.float64) for k, v in case2.operands.items()}
        _check(case2, p.run(**new).result(), params, np.float64, f"{op} {form}, rebound {f}")
    bigger = make_case(op, np.random.default_rng(12), [0, 1, 31, 34, 5])
    new = {k: _form(v, form, device, np.float64) for k, v in bigger.operands.items()}
    first = next(iter(new))
    with pytest.raises(InputError, match=rf"problem 3: {first} is 34 x 34; prepared for 33 x 33"):
        p.run(**new)
    with pytest.raises(InputError, match="not an operand"):
        p.run(alpha=2.0)
    if form == "list":  # overwrite per run: the caller's arrays of the written operand
        mine = {k: _form(v, "list", device, np.float64) for k, v in case2.operands.items()}
        res = p.run(**mine, overwrite=True).result()
        given = case.outputs(res)[-1]
        assert all(g is a for g, a in zip(given, mine[case.written]))
        _check(case2, res, params, np.float64, f"{op}, overwrite=True")


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("op", OPS)
def test_a_device_list_in_place_is_written_where_it_lies(op, order, monkeypatch):
    """overwrite=True on CuPy views into one buffer, either order, a NaN gap after each: every
    output is in its own view, nothing between them is written, and from the second call on
    these arrays nothing is copied (no write-back); the memory check passes with no free memory
    (a list that large is written in place at once). A list whose views overlap is copied and
    written back, as before."""
    import cupy

    from vbatch.core.batch import MatrixList

    case = make_case(op, np.random.default_rng(5), SIZES)
    params = case.params[-1]
    mats = [np.asarray(a, np.float64) for a in case.operands[case.written]]
    buf = cupy.full(sum(a.size + 3 for a in mats), np.nan)
    views, at, gap = [], 0, np.ones(buf.size, bool)
    for a in mats:
        v = buf[at:at + a.size].reshape(a.shape, order=order)
        v[...] = cupy.asarray(a)
        views.append(v)
        gap[at:at + a.size] = False
        at += a.size + 3
    rt = Runtime("cuda")
    written = MatrixList(mats=views)
    monkeypatch.setattr(rt.backend, "memory_total", lambda: 2 * buf.nbytes)
    monkeypatch.setattr(rt.backend, "memory_free", lambda: 0)
    rt._check_memory(written, True, True)  # (no copy: nothing to find room for)
    with pytest.raises(InputError, match="of GPU memory to run"):
        rt._check_memory(written, False, True)
    monkeypatch.undo()
    operands = {k: _form(v, "list", "cuda", np.float64) for k, v in case.operands.items()}
    operands[case.written] = views
    for run in range(3):  # (a small list's first call at new addresses is copied: run 0)
        if run == 1:
            monkeypatch.setattr(rt.backend, "scatter", None)  # (a write-back would call it)
        buf[cupy.asarray(gap)] = np.nan
        # (every operand's values again, at the same addresses: posv writes its matrices too)
        for k, v in case.operands.items():
            for x, a in zip(operands[k], [] if _fixed(v) else v):
                x[...] = cupy.asarray(np.asarray(a, np.float64))
        res = case.call(rt, operands, {**params, "overwrite": True}).result()
        assert all(g is v for g, v in zip(case.outputs(res)[-1], views))
        _check(case, res, params, np.float64, f"{op} {order}, in place, run {run}")
        assert cupy.isnan(buf[cupy.asarray(gap)]).all(), f"{op} {order}: wrote between views"
    # Another operand over the same memory (posv(A, A)) would be read while written: copied.
    ml = MatrixList(mats=views)
    assert rt.backend._in_place(ml, (ml,)) is None
    other = MatrixList(mats=[cupy.zeros((2, 2))] * len(views))
    assert rt.backend._in_place(ml, (other,)) is not None
    if op == "potrf":
        monkeypatch.undo()
        views[2][...] = cupy.asarray(mats[2])
        twice = [views[2], views[2]]  # (one matrix twice: copied, factored, written back)
        res = rt.cholesky(twice, overwrite=True).result()
        assert res.info.tolist() == [0, 0] and res.factors[0] is views[2]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_a_list_of_known_sizes_runs_the_kept_call(device, op, monkeypatch):
    """A call on a list of the same array type, dtype and shapes as earlier calls' (kept the
    second time those sizes came) runs the kept (validated, planned) call on the new arrays,
    validating nothing: the result is the new arrays'. In place, the outputs are the caller's
    new arrays. A list of other sizes or dtype is a call of its own; read-only arrays to
    overwrite are named."""
    import vbatch.runtime.runtime as runtime_mod
    from vbatch import InputError

    sizes = [0, 1, 31, 33, 5]
    rt = Runtime(device)
    case = make_case(op, np.random.default_rng(9), sizes)
    params = case.params[-1]

    def lists(c, dtype=np.float64):
        return {k: _form(v, "list", device, dtype) for k, v in c.operands.items()}

    for ow in (False, True, False, True):  # (each its own call, kept the second time)
        case.call(rt, lists(case), {**params, "overwrite": ow}).result()
    validations = []
    real = runtime_mod.validated
    monkeypatch.setattr(runtime_mod, "validated",
                        lambda *a, **kw: validations.append(a[0]) or real(*a, **kw))
    for seed in (10, 11):
        again = make_case(op, np.random.default_rng(seed), sizes)
        _check(again, case.call(rt, lists(again), params).result(), params, np.float64,
               f"{op}, list of known sizes, seed {seed}")
        mine = lists(again)
        res = case.call(rt, mine, {**params, "overwrite": True}).result()
        assert all(g is a for g, a in zip(case.outputs(res)[-1], mine[case.written]))
        _check(again, res, params, np.float64, f"{op}, in place, seed {seed}")
    assert not validations, validations
    for new_sizes, dtype in (([0, 1, 31, 34, 5], np.float64), (sizes, np.float32)):
        other = make_case(op, np.random.default_rng(12), new_sizes)
        _check(other, case.call(rt, lists(other, dtype), params).result(), params, dtype,
               f"{op}, sizes {new_sizes}, {np.dtype(dtype).name}")
    if device == "cpu":  # (device arrays are always writable)
        mine = lists(case)
        mine[case.written][3].flags.writeable = False
        with pytest.raises(InputError, match=r"problem 3: .*read-only"):
            case.call(rt, mine, {**params, "overwrite": True})


def test_every_ops_methods_and_functions_come_from_its_registration():
    """Runtime methods, module functions and vbatch.distributed.Runtime methods carry each
    op's own signature (then after=, overwrite=) and docstring."""
    import inspect

    import vbatch

    owners = [Runtime, vbatch]
    if importlib.util.find_spec("distributed"):
        import vbatch.distributed

        owners.append(vbatch.distributed.Runtime)
    for op in public():
        want = list(inspect.signature(op.api).parameters) + ["after", "overwrite"]
        for owner in owners:
            fn = getattr(owner, op.api.__name__)
            got = [p for p in inspect.signature(fn).parameters if p != "self"]
            assert got == want, (owner, op.name, got)
            assert inspect.cleandoc(op.api.__doc__) in fn.__doc__
    assert set(vbatch.API) == {op.api.__name__ for op in public()}
