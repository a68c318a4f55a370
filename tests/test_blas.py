"""Conformance of gemm, syrk, trsm, trmm, potrs and posv: the same tests on every backend.

Sizes include 0 in each dimension, 1, tile - 1, tile and tile + 1 of the CUDA kernels (the
triangular base 32, the GEMM tiles 32 and 64), and mixed shapes in one batch; hypothesis draws
the rest. Accuracy:

* GEMM/SYRK: entrywise, MAGMA's tester bound ``|C - C_ref| <= 3 (gamma_{k+2} |alpha| |A||B| +
  gamma_2 |beta| |C|)``, gamma_n = n u / (1 - n u), per problem;
* TRSM: ``||op(A) X - alpha B|| / (||A|| ||X|| + |alpha| ||B||) <= c n eps``; TRMM: the error
  against the float64 product over ``|alpha| ||A|| ||B||``;
* POTRS/POSV: the backward error ``||A X - B|| / (||A|| ||X|| + ||B||)``.

NaN anywhere in an output fails. A triangular operand's other triangle (and, for a unit
diagonal, its diagonal) holds NaN: reading it would show. Inputs are compared before and after.
"""

from __future__ import annotations

import numpy as np
import pytest
from _check import count_staged
from conftest import DEVICES
from hypothesis import given
from hypothesis import strategies as st

import vbatch
from vbatch.core.batch import Views
from vbatch import InputError
from vbatch.ops import (
    gemm_reference,
    potrs_reference,
    syr2k_reference,
    syrk_reference,
    trmm_reference,
)

EDGE = [0, 1, 31, 32, 33, 63, 64, 65]
C_TOL = 4.0  # the c of "c n eps"


def _to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _xp(device):
    if device == "cuda":
        import cupy

        return cupy
    return np


def _form(mats, form, device, dtype):
    """``mats`` (numpy) as a list or a packed batch (order F or C) on ``device``."""
    xp = _xp(device)
    mats = [np.asarray(m, dtype=dtype) for m in mats]
    if form == "list":
        return [xp.asarray(m) for m in mats]
    order = form[-1]
    m = np.array([a.shape[0] for a in mats])
    n = np.array([a.shape[1] for a in mats])
    from vbatch.core.batch import tight_layout

    off, ld, total = tight_layout(m, n, order)
    data = np.zeros(total, dtype)
    for i, a in enumerate(mats):
        if a.size:
            flat = data[off[i]: off[i] + a.size]
            flat[...] = (a if order == "C" else a.T).reshape(-1)
    return vbatch.PackedBatch.from_buffer(xp.asarray(data), n=n, m=m, offset=off, ld=ld,
                                          order=order)


def _mats(x):
    """An output (list or packed) as a list of host arrays."""
    if isinstance(x, vbatch.PackedBatch):
        return [_to_host(m) for m in x.unpack()]
    return [_to_host(m) for m in x]


def _gamma(n, u):
    return n * u / (1 - n * u)


def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _snapshot(x):
    if isinstance(x, vbatch.PackedBatch):
        return _to_host(x.data).copy()
    return [_to_host(m).copy() for m in x]


def _same(a, b):
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def _tri(rng, n, lower, unit, dtype):
    """A well-conditioned triangle, NaN in the half that must not be read."""
    t = rng.uniform(-1, 1, (n, n)) / max(n, 1)
    np.fill_diagonal(t, rng.uniform(1, 2, n) * rng.choice([-1, 1], n))
    keep = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
    if unit:
        np.fill_diagonal(keep, False)
    out = np.where(keep, t, np.nan)
    if unit:
        np.fill_diagonal(out, np.nan)
    return out.astype(dtype)


FORMS = ["list", "packedF", "packedC"]


# ----------------------------------------------------------------------------- gemm
def _check_gemm(A, B, C, out, alpha, beta, ta, tb, dtype, where=""):
    u = _eps(dtype) / 2
    for i, (a, b, o) in enumerate(zip(A, B, out)):
        c = None if C is None else C[i]
        ref = gemm_reference(a, b, c, alpha, beta, ta, tb)
        assert o.shape == ref.shape, f"{where} problem {i}: shape {o.shape} != {ref.shape}"
        assert o.dtype == np.dtype(dtype)
        assert np.all(np.isfinite(o)), f"{where} problem {i}: NaN or inf"
        k = (a.shape[0] if ta else a.shape[1])
        aa = np.abs(a.T if ta else a).astype(np.float64)
        bb = np.abs(b.T if tb else b).astype(np.float64)
        bound = 3 * (_gamma(k + 2, u) * abs(alpha) * (aa @ bb))
        if c is not None:
            bound = bound + 3 * _gamma(2, u) * abs(beta) * np.abs(c.astype(np.float64))
        err = np.abs(o.astype(np.float64) - ref)
        assert np.all(err <= bound + 1e-300), \
            f"{where} problem {i}: error {err.max():.3e} over the bound at {np.argmax(err - bound)}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_edge_sizes(device, dtype, form, ta, tb):
    rng = np.random.default_rng(1)
    shapes = [(m, n, k) for m in EDGE for n in (0, 1, 33, 64) for k in (0, 1, 32, 65)]
    shapes = shapes[:: 3] + [(100, 70, 130), (7, 129, 3)]
    A = [rng.standard_normal((k, m) if ta else (m, k)) for m, n, k in shapes]
    B = [rng.standard_normal((n, k) if tb else (k, n)) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)) for m, n, k in shapes]
    a, b, c = (_form(x, form, device, dtype) for x in (A, B, C))
    before = [_snapshot(x) for x in (a, b, c)]
    rt = vbatch.Runtime(device)
    out = _mats(rt.gemm(a, b, c, alpha=-1.5, beta=0.5, trans_a=ta, trans_b=tb).result())
    A, B, C = ([np.asarray(m, dtype) for m in x] for x in (A, B, C))
    _check_gemm(A, B, C, out, -1.5, 0.5, ta, tb, dtype, f"{device} {form}")
    assert all(_same(s, _snapshot(x)) for s, x in zip(before, (a, b, c))), "an input changed"
    # Without c: a new output in the form of a.
    out2 = rt.gemm(a, b, alpha=2.0, trans_a=ta, trans_b=tb).result()
    assert isinstance(out2, Views) == (form == "list")  # a list's outputs: list-like views
    assert isinstance(out2, vbatch.PackedBatch) == (form != "list")
    _check_gemm(A, B, None, _mats(out2), 2.0, 0.0, ta, tb, dtype, f"{device} {form} no c")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["mma", "fma"])
@pytest.mark.parametrize("form", ["packedF", "packedC"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_float64_kernels_and_tiles_on_cuda(kernel, form, ta, tb):
    """Both float64 GEMM kernels (FP64 tensor cores and FMA) in every orientation of A and B,
    with tasks large enough for the large DMMA tile (every dimension >= 256) beside small ones
    and a triangle (SYRK) in the same run."""
    rng = np.random.default_rng(7)
    shapes = [(256, 300, 37), (257, 255, 129), (300, 290, 16), (5, 400, 3), (129, 1, 65),
              (0, 12, 5), (33, 31, 1)]
    A = [rng.standard_normal((k, m) if ta else (m, k)) for m, n, k in shapes]
    B = [rng.standard_normal((n, k) if tb else (k, n)) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)) for m, n, k in shapes]
    a, b, c = (_form(x, form, "cuda", np.float64) for x in (A, B, C))
    rt = vbatch.Runtime("cuda", fp64_gemm=kernel)
    out = _mats(rt.gemm(a, b, c, alpha=0.75, beta=-1.0, trans_a=ta, trans_b=tb).result())
    _check_gemm(A, B, C, out, 0.75, -1.0, ta, tb, np.float64, f"{kernel} {form}")
    sq = [rng.standard_normal((n, k)) for n, k in ((300, 40), (256, 257), (7, 3), (0, 4))]
    cs = [rng.standard_normal((x.shape[0],) * 2) for x in sq]
    got = _mats(rt.syrk(_form(sq, form, "cuda", np.float64), _form(cs, form, "cuda", np.float64),
                        alpha=1.0, beta=1.0, lower=not ta).result())
    for i, (x, c0, o) in enumerate(zip(sq, cs, got)):
        ref = syrk_reference(x, c0, 1.0, 1.0, trans=False, lower=not ta)
        assert np.all(np.isfinite(o)) and o.shape == ref.shape
        err = np.abs(o - ref).max() if o.size else 0.0
        scale = (np.abs(x) @ np.abs(x).T + np.abs(c0)).max() if o.size else 0.0
        assert err <= 3 * _gamma(x.shape[1] + 2, _eps(np.float64)) * scale + 1e-300, \
            f"syrk {kernel} {form} problem {i}: error {err:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("form", ["packedF", "packedC"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_within_32_on_cuda(dtype, form, ta, tb):
    """A batch whose every task is within 32 x 32 (K beyond it too): one launch of the
    one-warp DMMA tile in float64, of the small FMA tile in float32."""
    rng = np.random.default_rng(12)
    shapes = [(0, 3, 2), (1, 1, 1), (31, 32, 33), (32, 17, 40), (5, 32, 0), (32, 32, 32),
              (16, 1, 70), (2, 31, 1)]
    A = [rng.standard_normal((k, m) if ta else (m, k)) for m, n, k in shapes]
    B = [rng.standard_normal((n, k) if tb else (k, n)) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)) for m, n, k in shapes]
    a, b, c = (_form(x, form, "cuda", dtype) for x in (A, B, C))
    rt = vbatch.Runtime("cuda")
    plan = rt.plan_for("gemm", a=a, b=b, c=c, trans_a=ta, trans_b=tb)
    assert len(plan.launches) == 1
    out = _mats(rt.gemm(a, b, c, alpha=-1.5, beta=0.5, trans_a=ta, trans_b=tb).result())
    _check_gemm(A, B, C, out, -1.5, 0.5, ta, tb, dtype, f"within 32 {form}")


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["packedF", "packedC"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_float32_tiles_on_cuda(form, ta, tb):
    """float32 GEMM on both SIMT tiles (tasks of 128 and up each way beside 33-127, with edges
    past every tile) and the small FMA tile, in every orientation of A and B, alpha and beta
    both applied; and a SYRK, whose triangle takes the element-wise epilogue."""
    rng = np.random.default_rng(11)
    shapes = [(256, 300, 37), (257, 255, 129), (130, 129, 16), (5, 400, 3), (129, 1, 65),
              (0, 12, 5), (33, 31, 1), (64, 64, 64), (65, 63, 0), (31, 32, 33)]
    A = [rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32) for m, n, k in shapes]
    B = [rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)).astype(np.float32) for m, n, k in shapes]
    a, b, c = (_form(x, form, "cuda", np.float32) for x in (A, B, C))
    rt = vbatch.Runtime("cuda")
    out = _mats(rt.gemm(a, b, c, alpha=0.75, beta=-1.0, trans_a=ta, trans_b=tb).result())
    _check_gemm(A, B, C, out, 0.75, -1.0, ta, tb, np.float32, f"simt {form}")
    sq = [rng.standard_normal((n, k)).astype(np.float32) for n, k in ((300, 40), (130, 129))]
    cs = [rng.standard_normal((x.shape[0],) * 2).astype(np.float32) for x in sq]
    got = _mats(rt.syrk(_form(sq, form, "cuda", np.float32), _form(cs, form, "cuda", np.float32),
                        alpha=1.0, beta=1.0, lower=not ta).result())
    for i, (x, c0, o) in enumerate(zip(sq, cs, got)):
        ref = syrk_reference(x.astype(np.float64), c0, 1.0, 1.0, trans=False, lower=not ta)
        assert np.all(np.isfinite(o)) and o.shape == ref.shape
        err = np.abs(o - ref).max()
        scale = (np.abs(x) @ np.abs(x).T + np.abs(c0)).max()
        assert err <= 3 * _gamma(x.shape[1] + 2, _eps(np.float32)) * scale, \
            f"syrk simt {form} problem {i}: error {err:.3e}"


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_beta_zero_does_not_read_c_and_overwrite_writes_c(device):
    rng = np.random.default_rng(2)
    A = [rng.standard_normal((m, 5)) for m in (3, 40)]
    B = [rng.standard_normal((5, n)) for n in (4, 70)]
    C = [np.full((3, 4), np.nan), np.full((40, 70), np.nan)]
    rt = vbatch.Runtime(device)
    a, b, c = (_form(x, "packedF", device, np.float64) for x in (A, B, C))
    out = _mats(rt.gemm(a, b, c, beta=0.0).result())
    _check_gemm(A, B, None, out, 1.0, 0.0, False, False, np.float64)
    res = rt.gemm(a, b, c, beta=0.0, overwrite=True).result()
    assert res is c
    _check_gemm(A, B, None, _mats(c), 1.0, 0.0, False, False, np.float64)


# ----------------------------------------------------------------------------- syrk
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("trans,lower", [(False, True), (True, True), (False, False)])
def test_syrk(device, dtype, trans, lower):
    rng = np.random.default_rng(3)
    shapes = [(n, k) for n in EDGE for k in (0, 1, 33)] + [(100, 20)]
    A = [rng.standard_normal((k, n) if trans else (n, k)).astype(dtype) for n, k in shapes]
    C = [rng.standard_normal((n, n)).astype(dtype) for n, _ in shapes]
    rt = vbatch.Runtime(device)
    for form in ("list", "packedC"):
        a, c = _form(A, form, device, dtype), _form(C, form, device, dtype)
        out = _mats(rt.syrk(a, c, alpha=0.5, beta=2.0, trans=trans, lower=lower).result())
        u = _eps(dtype) / 2
        for i, (x, cc, o) in enumerate(zip(A, C, out)):
            ref = syrk_reference(x, cc, 0.5, 2.0, trans, lower)
            xx = np.abs(x.T if trans else x).astype(np.float64)
            k = xx.shape[1]
            bound = 3 * (_gamma(k + 2, u) * 0.5 * (xx @ xx.T) + _gamma(2, u) * 2 * np.abs(cc))
            assert np.all(np.isfinite(o))
            assert np.all(np.abs(o - ref) <= bound + 1e-300), f"{device} {form} problem {i}"
        out0 = _mats(rt.syrk(a, trans=trans, lower=lower).result())
        for x, o in zip(A, out0):
            ref = syrk_reference(x, None, 1.0, 0.0, trans, lower)
            assert np.allclose(o, ref, rtol=1e-4, atol=1e-4)  # the other triangle: zeros
            other = np.triu(o, 1) if lower else np.tril(o, -1)
            assert not np.any(other)


# ----------------------------------------------------------------------------- syr2k
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("trans,lower", [(False, True), (True, True), (False, False),
                                         (True, False)])
def test_syr2k(device, dtype, trans, lower):
    rng = np.random.default_rng(4)
    shapes = [(n, k) for n in EDGE for k in (0, 1, 33)] + [(100, 20), (70, 130)]
    A = [rng.standard_normal((k, n) if trans else (n, k)).astype(dtype) for n, k in shapes]
    B = [rng.standard_normal((k, n) if trans else (n, k)).astype(dtype) for n, k in shapes]
    C = [rng.standard_normal((n, n)).astype(dtype) for n, _ in shapes]
    rt = vbatch.Runtime(device)
    u = _eps(dtype) / 2
    for form in ("list", "packedF", "packedC"):
        a, b, c = (_form(x, form, device, dtype) for x in (A, B, C))
        before = [_snapshot(x) for x in (a, b, c)]
        out = _mats(rt.syr2k(a, b, c, alpha=-0.5, beta=2.0, trans=trans, lower=lower).result())
        for i, (x, y, cc, o) in enumerate(zip(A, B, C, out)):
            ref = syr2k_reference(x, y, cc, -0.5, 2.0, trans, lower)
            xx = np.abs(x.T if trans else x).astype(np.float64)
            yy = np.abs(y.T if trans else y).astype(np.float64)
            k = xx.shape[1]
            # Two products summed into one triangle: each within MAGMA's GEMM bound, plus
            # the rounding of adding the second into the first.
            bound = 3 * (_gamma(k + 3, u) * 0.5 * (xx @ yy.T + yy @ xx.T)
                         + _gamma(3, u) * 2 * np.abs(cc))
            assert o.shape == ref.shape and np.all(np.isfinite(o))
            err = np.abs(o - ref)
            assert np.all(err <= bound + 1e-300), \
                f"{device} {form} problem {i}: error {err.max():.2e}"
        assert all(_same(s_, _snapshot(x)) for s_, x in zip(before, (a, b, c)))
        out0 = _mats(rt.syr2k(a, b, trans=trans, lower=lower).result())
        for x, y, o in zip(A, B, out0):
            ref = syr2k_reference(x, y, None, 1.0, 0.0, trans, lower)
            assert np.allclose(o, ref, rtol=1e-4, atol=1e-4)
            other = np.triu(o, 1) if lower else np.tril(o, -1)
            assert not np.any(other)  # a new output: zeros in the other triangle
    with pytest.raises(InputError, match=r"problem 1: op\(a\) is 3 x 2 but op\(b\) is 3 x 1"):
        rt.syr2k([np.zeros((2, 2)), np.zeros((3, 2))], [np.zeros((2, 2)), np.zeros((3, 1))])


# ----------------------------------------------------------------------------- trsm / trmm
def _tri_case(rng, dtype, side, lower, unit, shapes):
    T, B = [], []
    for m, n in shapes:
        order = m if side == "left" else n
        T.append(_tri(rng, order, lower, unit, dtype))
        B.append(rng.standard_normal((m, n)).astype(dtype))
    return T, B


def _check_trsm(T, B, X, alpha, side, lower, ta, unit, dtype, where):
    for i, (t, b, x) in enumerate(zip(T, B, X)):
        assert x.shape == b.shape, f"{where} problem {i}: shape"
        assert np.all(np.isfinite(x)), f"{where} problem {i}: NaN or inf"
        tt = np.nan_to_num(t.astype(np.float64), nan=0.0)
        if unit:
            np.fill_diagonal(tt, 1.0)
        tt = np.tril(tt) if lower else np.triu(tt)
        op = tt.T if ta else tt
        x64 = x.astype(np.float64)
        res = (op @ x64 if side == "left" else x64 @ op) - alpha * b.astype(np.float64)
        den = np.linalg.norm(tt) * np.linalg.norm(x64) + abs(alpha) * np.linalg.norm(b)
        n = max(t.shape[0], 1)
        r = np.linalg.norm(res) / den if den else np.linalg.norm(res)
        assert r <= C_TOL * n * _eps(dtype), f"{where} problem {i}: residual {r:.3e}"


TRI_FLAGS = [(s, lo, ta, u) for s in ("left", "right") for lo in (True, False)
             for ta in (False, True) for u in (False, True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("side,lower,ta,unit", TRI_FLAGS)
def test_trsm_every_side_uplo_trans_diag(device, side, lower, ta, unit):
    rng = np.random.default_rng(4)
    shapes = [(m, n) for m in EDGE for n in (0, 1, 40)][::2] + [(130, 17), (3, 200), (97, 97)]
    rt = vbatch.Runtime(device)
    for dtype, form in ((np.float64, "list"), (np.float32, "packedF"), (np.float64, "packedC")):
        T, B = _tri_case(rng, dtype, side, lower, unit, shapes)
        a, b = _form(T, form, device, dtype), _form(B, form, device, dtype)
        before = (_snapshot(a), _snapshot(b))
        X = _mats(rt.trsm(a, b, alpha=1.5, side=side, lower=lower, trans_a=ta,
                          unit_diagonal=unit).result())
        _check_trsm(T, B, X, 1.5, side, lower, ta, unit, dtype, f"{device} {form} {dtype}")
        assert _same(before[0], _snapshot(a)) and _same(before[1], _snapshot(b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("side,lower,ta,unit", TRI_FLAGS)
def test_trmm_every_side_uplo_trans_diag(device, side, lower, ta, unit):
    rng = np.random.default_rng(5)
    shapes = [(m, n) for m in EDGE for n in (0, 1, 40)][::2] + [(130, 17), (97, 97)]
    rt = vbatch.Runtime(device)
    for dtype, form in ((np.float64, "packedF"), (np.float32, "list")):
        T, B = _tri_case(rng, dtype, side, lower, unit, shapes)
        a, b = _form(T, form, device, dtype), _form(B, form, device, dtype)
        X = _mats(rt.trmm(a, b, alpha=-0.5, side=side, lower=lower, trans_a=ta,
                          unit_diagonal=unit).result())
        for i, (t, bb, x) in enumerate(zip(T, B, X)):
            ref = trmm_reference(np.nan_to_num(t, nan=0.0), bb, -0.5, side, lower, ta, unit)
            assert np.all(np.isfinite(x)), f"problem {i}: NaN"
            den = 0.5 * np.linalg.norm(np.nan_to_num(t.astype(np.float64))) * np.linalg.norm(bb)
            err = np.linalg.norm(x - ref) / den if den else np.linalg.norm(x - ref)
            n = max(t.shape[0], 1)
            assert err <= C_TOL * n * _eps(dtype), f"{device} {form} problem {i}: {err:.3e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lower,ta,unit", [(lo, ta, u) for lo in (True, False)
                                           for ta in (False, True) for u in (False, True)])
def test_diagonal_blocks_of_every_width(device, lower, ta, unit):
    # Triangles at the edges of the diagonal kernel's widths (8, 16, 24, 32) in one batch, with
    # right-hand sides within one column group and past it (32), both sides and pack orders;
    # and batches whose widest block is 8, 16 or 24 rows (the kernel's code unrolled for them).
    rng = np.random.default_rng(11)
    rt = vbatch.Runtime(device)
    runs = [(ms, side, dtype, form, cap)
            for ms in ([1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32], [1, 2, 7, 8, 3],
                       [16, 9, 1, 15, 4], [17, 24, 20, 3, 1])
            for side in ("left", "right") for dtype in (np.float64, np.float32)
            for form in ("packedF", "packedC")
            for cap in (32, 70)]  # (at most 32 columns: one group of them)
    for ms, side, dtype, form, cap in runs:
        shapes = [(m, min(n, cap)) if side == "left" else (min(n, cap), m) for m, n in
                  zip(ms, [3, 33, 70, 1, 16, 32, 65, 5, 31, 64, 2, 40, 7])]
        T, B = _tri_case(rng, dtype, side, lower, unit, shapes)
        a, b = _form(T, form, device, dtype), _form(B, form, device, dtype)
        X = _mats(rt.trsm(a, b, alpha=1.5, side=side, lower=lower, trans_a=ta,
                          unit_diagonal=unit).result())
        _check_trsm(T, B, X, 1.5, side, lower, ta, unit, dtype, f"{device} {form} {side}")
        Y = _mats(rt.trmm(a, b, alpha=-0.5, side=side, lower=lower, trans_a=ta,
                          unit_diagonal=unit).result())
        for i, (t, bb, y) in enumerate(zip(T, B, Y)):
            t = np.nan_to_num(t.astype(np.float64), nan=0.0)  # (NaN where nothing is read)
            ref = trmm_reference(t, bb, -0.5, side, lower, ta, unit)
            den = 0.5 * (np.linalg.norm(t) + unit) * np.linalg.norm(bb)
            err = np.linalg.norm(y - ref) / den
            assert np.all(np.isfinite(y)) and err <= C_TOL * t.shape[0] * _eps(dtype), \
                f"{device} {form} {side} trmm problem {i}: {err:.3e}"


@pytest.mark.parametrize("device", DEVICES)
def test_trsm_overwrite_and_alpha_zero(device):
    rng = np.random.default_rng(6)
    T, B = _tri_case(rng, np.float64, "left", True, False, [(5, 3), (40, 2)])
    a, b = _form(T, "packedF", device, np.float64), _form(B, "packedF", device, np.float64)
    res = vbatch.Runtime(device).trsm(a, b, overwrite=True).result()
    assert res is b
    _check_trsm(T, B, _mats(b), 1.0, "left", True, False, False, np.float64, "overwrite")
    z = _mats(vbatch.Runtime(device).trsm(a, b, alpha=0.0).result())
    assert all(not np.any(x) for x in z)


# ----------------------------------------------------------------------------- potrs / posv
def _spd(rng, n, dtype):
    g = rng.standard_normal((n, n))
    return (g @ g.T / max(n, 1) + np.eye(n) * 2).astype(dtype)


def _backward(a, x, b):
    a, x, b = (np.asarray(v, np.float64) for v in (a, x, b))
    r = np.linalg.norm(a @ x - b)
    den = np.linalg.norm(a) * np.linalg.norm(x) + np.linalg.norm(b)
    return r / den if den else r


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
def test_potrs_each_problem_its_own_right_hand_sides(device, dtype, form):
    rng = np.random.default_rng(7)
    shapes = [(n, r) for n in EDGE for r in (0, 1, 16)][::2] + [(150, 3), (65, 130)]
    A = [_spd(rng, n, dtype) for n, _ in shapes]
    L = []
    for a in A:
        f = np.linalg.cholesky(a.astype(np.float64)).astype(dtype) if len(a) else a
        f = f + np.triu(np.full_like(f, np.nan), 1)  # the upper triangle is not read
        L.append(f)
    B = [rng.standard_normal((n, r)).astype(dtype) for n, r in shapes]
    ll, b = _form(L, form, device, dtype), _form(B, form, device, dtype)
    X = _mats(vbatch.Runtime(device).potrs(ll, b).result())
    for i, (a, f, bb, x) in enumerate(zip(A, L, B, X)):
        assert x.shape == bb.shape and np.all(np.isfinite(x)), f"problem {i}"
        assert _backward(a, x, bb) <= C_TOL * max(len(a), 1) * _eps(dtype), f"problem {i}"
        ref = potrs_reference(np.nan_to_num(f), bb)
        scale = max(np.abs(ref).max(initial=0.0), 1.0)
        assert np.abs(x - ref).max(initial=0.0) <= 1e3 * _eps(dtype) * scale, f"problem {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("form", ["packedF", "packedC"])
def test_whole_triangle_solves_on_cuda(dtype, form, monkeypatch):
    """Every problem with few right-hand sides solved whole (blas_trsv): one and four columns a
    block, more columns than a block takes (several blocks a problem), X in shared memory
    (float64) and in global memory (the shared-memory budget set to zero); both triangles
    (POTRS's forward and backward phases, an upper triangle read as is and transposed), both
    layouts."""
    from vbatch.kernels import blas_cuda

    monkeypatch.setattr(blas_cuda, "WHOLE_RHS", 40)
    rng = np.random.default_rng(17)
    shapes = [(1, 1), (31, 4), (32, 16), (33, 5), (100, 17), (64, 40), (129, 2), (300, 3),
              (0, 3), (7, 0)]
    A = [_spd(rng, n, dtype) for n, _ in shapes]
    L = [np.linalg.cholesky(a.astype(np.float64)).astype(dtype) if len(a) else a for a in A]
    L = [f + np.triu(np.full_like(f, np.nan), 1) for f in L]
    B = [rng.standard_normal((n, r)).astype(dtype) for n, r in shapes]
    T, Bt = _tri_case(rng, dtype, "left", False, False, shapes)
    for budget in (blas_cuda.TRSV_SMEM, 0):
        monkeypatch.setattr(blas_cuda, "TRSV_SMEM", budget)
        rt = vbatch.Runtime("cuda")
        ll, b = _form(L, form, "cuda", dtype), _form(B, form, "cuda", dtype)
        plan = rt.plan_for("potrs", l=ll, b=b)
        assert all(lc.kind == "blas.trsm" for lc in plan.launches if lc.kind != "blas.copy")
        X = _mats(rt.potrs(ll, b).result())
        for i, (a, bb, x) in enumerate(zip(A, B, X)):
            assert x.shape == bb.shape and np.all(np.isfinite(x)), f"{budget} problem {i}"
            assert _backward(a, x, bb) <= C_TOL * max(len(a), 1) * _eps(dtype), \
                f"{budget} problem {i}"
        for ta in (False, True):
            Xt = _mats(rt.trsm(_form(T, form, "cuda", dtype), _form(Bt, form, "cuda", dtype),
                               alpha=0.5, lower=False, trans_a=ta).result())
            _check_trsm(T, Bt, Xt, 0.5, "left", False, ta, False, dtype,
                        f"{form} ta={ta} budget {budget}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_posv_failed_problem_keeps_its_right_hand_side(device, dtype):
    rng = np.random.default_rng(8)
    ns = [0, 1, 31, 32, 33, 65, 200, 17, 40, 70]
    A = [_spd(rng, n, dtype) for n in ns]
    A[7][5, 5] = -100.0  # not SPD: fails at column 6 (few right-hand sides: a whole solve)
    A[9][40, 40] = -100.0  # fails at column 41 (six: the recursion, its joins read b first)
    B = [rng.standard_normal((n, r)).astype(dtype) for n, r in zip(ns, (2, 1, 3, 0, 5, 4, 2,
                                                                          3, 1, 6))]
    rt = vbatch.Runtime(device)
    for form in ("list", "packedF"):
        a, b = _form(A, form, device, dtype), _form(B, form, device, dtype)
        res = rt.posv(a, b).result()
        assert isinstance(res, vbatch.PosvResult)
        assert res.info.tolist() == [0] * 7 + [6, 0, 41]
        X = _mats(res.solutions)
        for i, (aa, bb, x) in enumerate(zip(A, B, X)):
            if i in (7, 9):
                assert np.array_equal(x, bb), "a failed problem's solution is its b"
                continue
            assert np.all(np.isfinite(x))
            assert _backward(aa, x, bb) <= C_TOL * max(len(aa), 1) * _eps(dtype), \
                f"{device} {form} problem {i}"
        F = _mats(res.factors)
        assert np.allclose(F[2] @ F[2].T, A[2], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_potrs_after_cholesky_reads_its_factors(device):
    rng = np.random.default_rng(9)
    A = [_spd(rng, n, np.float64) for n in (3, 50, 90)]
    B = [rng.standard_normal((n, 2)) for n in (3, 50, 90)]
    rt = vbatch.Runtime(device)
    a, b = _form(A, "packedF", device, np.float64), _form(B, "packedF", device, np.float64)
    f = rt.cholesky(a, overwrite=True)
    s = rt.potrs(a, b, after=[f])
    X = _mats(s.result())
    assert f.result().ok
    for aa, bb, x in zip(A, B, X):
        assert _backward(aa, x, bb) <= C_TOL * len(aa) * _eps(np.float64)


# ----------------------------------------------------------------------------- mixed draws
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_hypothesis_mixed_shapes(device, data):
    k = data.draw(st.integers(1, 6))
    dims = st.integers(0, 70)
    shapes = [(data.draw(dims), data.draw(dims), data.draw(dims)) for _ in range(k)]
    ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    A = [rng.standard_normal((k_, m) if ta else (m, k_)) for m, n, k_ in shapes]
    B = [rng.standard_normal((n, k_) if tb else (k_, n)) for m, n, k_ in shapes]
    rt = vbatch.Runtime(device)
    out = _mats(rt.gemm(_form(A, "list", device, np.float64), _form(B, "packedC", device,
                                                                    np.float64),
                        trans_a=ta, trans_b=tb).result())
    _check_gemm(A, B, None, out, 1.0, 0.0, ta, tb, np.float64, "hypothesis")
    side = data.draw(st.sampled_from(["left", "right"]))
    lower, tr = data.draw(st.booleans()), data.draw(st.booleans())
    T, Bt = _tri_case(rng, np.float64, side, lower, False, [(m, n) for m, n, _ in shapes])
    X = _mats(rt.trsm(_form(T, "list", device, np.float64), _form(Bt, "list", device,
                                                                  np.float64),
                      side=side, lower=lower, trans_a=tr).result())
    _check_trsm(T, Bt, X, 1.0, side, lower, tr, False, np.float64, "hypothesis")


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_problem_and_the_operand(device):
    rt = vbatch.Runtime(device)
    xp = _xp(device)
    a = [xp.zeros((3, 4)), xp.zeros((2, 2))]
    b = [xp.zeros((4, 5)), xp.zeros((3, 2))]
    with pytest.raises(InputError, match=r"problem 1: inner dimensions differ"):
        rt.gemm(a, b)
    with pytest.raises(InputError, match=r"problem 1: c is 2 x 3"):
        rt.gemm(a, [xp.zeros((4, 5)), xp.zeros((2, 2))], [xp.zeros((3, 5)), xp.zeros((2, 3))])
    with pytest.raises(InputError, match=r"b is float32 but a is float64"):
        rt.gemm(a, [m.astype(np.float32) for m in b])
    with pytest.raises(InputError, match=r"b has 1 problems but a has 2"):
        rt.gemm(a, b[:1])
    with pytest.raises(InputError, match=r"b: expected a list"):
        rt.gemm(a, None)
    with pytest.raises(InputError, match=r"alpha must be finite"):
        rt.gemm(a, a, alpha=float("nan"))
    with pytest.raises(InputError, match=r"beta must be finite"):
        rt.gemm([xp.zeros((2, 2))], [xp.zeros((2, 2))], [xp.zeros((2, 2))], beta=float("inf"))
    with pytest.raises(InputError, match=r"side must be one of"):
        rt.trsm([xp.eye(2)], [xp.zeros((2, 1))], side="middle")
    with pytest.raises(InputError, match=r"lower must be True or False"):
        rt.trsm([xp.eye(2)], [xp.zeros((2, 1))], lower="L")
    with pytest.raises(InputError, match=r"problem 0: a: not square"):
        rt.trsm([xp.zeros((2, 3))], [xp.zeros((2, 1))])
    with pytest.raises(InputError, match=r"problem 0: a is 2 x 2 but b is 3 x 1"):
        rt.trsm([xp.eye(2)], [xp.zeros((3, 1))])
    with pytest.raises(InputError, match=r"problem 0: l is 2 x 2 but b has 3 rows"):
        rt.potrs([xp.eye(2)], [xp.zeros((3, 1))])
    with pytest.raises(InputError, match=r"beta = 2.0 needs c"):
        rt.gemm(a[:1], b[:1], beta=2.0)
    with pytest.raises(InputError, match=r"unknown operation"):
        rt.submit("geqrf", a=a)


def test_the_first_step_into_each_row_block_reads_the_right_hand_sides():
    from vbatch.ops.blas import _recursion

    # A solve of 128 rows in blocks of 32, forward: the first diagonal block and the joins on
    # the path of first halves are the first to write their rows; a product's diagonal blocks
    # all are (its joins add to them).
    steps = _recursion(128, 32, True, True)
    fresh = [(step[0], step[1], step[2]) for step in steps if step[5]]
    assert fresh == [(0, 0, 32), (1, 32, 32), (1, 64, 64)], steps
    for fwd in (True, False):
        steps = _recursion(100, 32, fwd, True)
        rows = np.zeros(100, int)
        for step in steps:
            if step[5]:
                rows[step[1]:step[1] + step[2]] += 1
        assert (rows == 1).all(), steps  # every row brought in once, by its first step
        prod = _recursion(100, 32, fwd, False)
        assert all(step[5] == (step[0] == 0) for step in prod), prod


def test_plan_for_shows_the_plan_of_any_op():
    rt = vbatch.Runtime("cpu")
    plan = rt.plan_for("posv", a=[np.eye(40), np.eye(3)], b=[np.ones((40, 2)), np.ones((3, 0))])
    assert plan.families == ("potrf", "blas")
    # Problem 0 solves forward then backward, its first solve reading b (no copy); problem 1
    # has no right-hand side: no tasks.
    assert plan.counts().get("blas.trsm") == 2 and "blas.copy" not in plan.counts()
    with pytest.raises(InputError, match="unknown operation"):
        rt.plan_for("geqrf", a=[np.eye(2)])


# ----------------------------------------------------------------------------- repeated calls
@pytest.mark.parametrize("device", DEVICES)
def test_a_repeated_packed_call_validates_and_plans_nothing_again(device, monkeypatch):
    """The known-call path: the same packed batches again, or another batch of an equal
    layout, skip validation and planning (and the latter's own values are read); a different
    scalar or flag, another layout of the same sizes, a buffer made read-only, or a value the
    request refuses is still seen to; no entry keeps a batch alive."""
    import gc
    import weakref

    import vbatch.runtime.runtime as rtmod

    rng = np.random.default_rng(12)
    shapes = [(0, 3, 2), (1, 1, 1), (33, 31, 32), (64, 65, 63)]
    A = [rng.standard_normal((m, k)) for m, n, k in shapes]
    B = [rng.standard_normal((k, n)) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)) for m, n, k in shapes]
    a, b, c = (_form(x, "packedF", device, np.float64) for x in (A, B, C))
    rt = vbatch.Runtime(device)
    counts = {"validate": 0, "plan": 0}
    real_validated, real_plan = rtmod.validated, rt._plan

    def counting_validated(*args, **kw):
        counts["validate"] += 1
        return real_validated(*args, **kw)

    def counting_plan(*args, **kw):
        counts["plan"] += 1
        return real_plan(*args, **kw)

    monkeypatch.setattr(rtmod, "validated", counting_validated)
    monkeypatch.setattr(rt, "_plan", counting_plan)
    for alpha, beta in ((2.0, -1.0), (2.0, -1.0), (0.5, 3.0), (2.0, -1.0)):
        out = rt.gemm(a, b, c, alpha=alpha, beta=beta).result()
        _check_gemm(A, B, C, _mats(out), alpha, beta, False, False, np.float64, f"{alpha}")
    assert counts == {"validate": 2, "plan": 2}  # one per distinct (alpha, beta)
    A2 = [rng.standard_normal(x.shape) for x in A]
    a2 = _form(A2, "packedF", device, np.float64)  # another batch of a's layout: a's call
    out = rt.gemm(a2, b, c, alpha=2.0, beta=-1.0).result()
    _check_gemm(A2, B, C, _mats(out), 2.0, -1.0, False, False, np.float64, "a2")
    assert counts == {"validate": 2, "plan": 2}
    a3 = _form(A2, "packedC", device, np.float64)  # the same sizes, another layout: validated
    out = rt.gemm(a3, b, c, alpha=2.0, beta=-1.0).result()
    _check_gemm(A2, B, C, _mats(out), 2.0, -1.0, False, False, np.float64, "a3")
    assert counts["validate"] == 3
    with pytest.raises(InputError, match="alpha must be a number"):
        rt.gemm(a, b, c, alpha=True, beta=-1.0)  # True == 1, but it is not a number here
    rt.gemm(a, b, c, alpha=1, beta=-1.0).result()
    with pytest.raises(InputError, match="alpha must be a number"):
        rt.gemm(a, b, c, alpha=True, beta=-1.0)
    rt.gemm(a, b, c, overwrite=True, beta=1.0).result()
    if device == "cpu":
        c.data.flags.writeable = False
        with pytest.raises(InputError, match="read-only"):
            rt.gemm(a, b, c, overwrite=True, beta=1.0)
    ref = weakref.ref(a2)
    del a2
    gc.collect()
    assert ref() is None, "the known-call path kept a batch alive"


@pytest.mark.parametrize("device", DEVICES)
def test_a_known_call_replays_with_fresh_outputs(device, monkeypatch):
    """From its second run on, a known call skips the request, the checks and the staging
    (Prepared._replay; on the CPU, a call small enough to run in the caller's thread): each
    call still gets its own output (earlier results stay as they were), reads its operands'
    current contents, and keeps the output's form (a new output, an out-of-place one, one
    written in place, the Views of an earlier list result)."""
    rng = np.random.default_rng(21)
    last = (64, 65, 63) if device == "cuda" else (20, 21, 19)  # (CPU: small enough)
    shapes = [(0, 3, 2), (1, 1, 1), (33, 31, 32), last]
    A = [rng.standard_normal((m, k)) for m, n, k in shapes]
    B = [rng.standard_normal((k, n)) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)) for m, n, k in shapes]
    a, b, c = (_form(x, "packedC", device, np.float64) for x in (A, B, C))
    rt = vbatch.Runtime(device)
    runs = count_staged(rt, monkeypatch)

    def ptr(x):
        return x.data.ptr if device == "cuda" else x.ctypes.data

    outs, cs = [], []
    for step in range(4):
        cs.append([x * (step + 1) for x in C])
        c.data[...] = _form(cs[-1], "packedC", device, np.float64).data
        outs.append(rt.gemm(a, b, c, alpha=2.0, beta=-1.0).result())
    assert runs["n"] == 1
    assert len({ptr(o.data) for o in outs}) == 4 and all(o.order == "C" for o in outs)
    for o, cc in zip(outs, cs):  # (each as computed: a later call wrote elsewhere)
        _check_gemm(A, B, cc, _mats(o), 2.0, -1.0, False, False, np.float64, "replayed")
    news = [rt.gemm(a, b).result() for _ in range(3)]  # a new output, from the sizes
    assert runs["n"] == 2 and len({ptr(o.data) for o in news}) == 3
    for o in news:
        _check_gemm(A, B, [np.zeros_like(x) for x in C], _mats(o), 1.0, 0.0, False, False,
                    np.float64, "new output")
    for _ in range(3):  # in place: the result is c itself
        c.data[...] = _form(C, "packedC", device, np.float64).data
        assert rt.gemm(a, b, c, beta=1.0, overwrite=True).result() is c
        _check_gemm(A, B, C, _mats(c), 1.0, 1.0, False, False, np.float64, "in place")
    assert runs["n"] == 3
    # The Views of an earlier list result: a list-like result again.
    xp = _xp(device)
    v = rt.gemm([xp.asarray(x) for x in A], [xp.asarray(x) for x in B]).result()
    for _ in range(3):
        got = rt.gemm(v, v, trans_b=True).result()
        assert type(got) is type(v) and len(got) == len(shapes)
        for i, x in enumerate(A):
            p = x @ B[i]
            assert np.allclose(_to_host(got[i]), p @ p.T, rtol=1e-12, atol=1e-12 * (1 + len(x)))


@pytest.mark.parametrize("device", DEVICES)
def test_a_known_list_call_replays(device, monkeypatch):
    """A list of a known call's signature takes the replay road too (gathered into a buffer of
    its staged layout, no request, no staging): every call reads its own arrays, gives a list
    of new arrays back (earlier results stay as they were), leaves the caller's arrays alone,
    and keeps each problem's info (a failing matrix, its LAPACK leading block, never its
    neighbours; nothing above the diagonal, as on the staged road). A list written in place,
    and one of other sizes, are staged as before."""
    xp = _xp(device)
    rng = np.random.default_rng(23)
    ns = [0, 1, 7, 8, 9, 16, 3]
    rt = vbatch.Runtime(device)
    runs = count_staged(rt, monkeypatch)
    eps = np.finfo(np.float64).eps
    outs, As, Bs = [], [], []
    for _ in range(4):
        A = [rng.standard_normal((n, n)) for n in ns]
        B = [rng.standard_normal((n, 2)) for n in ns]
        As.append(A)
        Bs.append(B)
        a, b = [xp.asarray(x) for x in A], [xp.asarray(x) for x in B]
        outs.append((rt.gemm(a, b, alpha=-0.5).result(), a, b))
    assert runs["n"] == 2  # (a list's call is kept the second time its sizes come)
    for (got, a, _), A, B in zip(outs, As, Bs):
        assert type(got) is Views and len(got) == len(ns)
        for i in range(len(ns)):
            assert _to_host(a[i]).tobytes() == A[i].tobytes()  # (the caller's, unchanged)
            want = -0.5 * A[i] @ B[i]
            err = np.abs(_to_host(got[i]) - want).max(initial=0.0)
            assert err <= 10 * ns[i] * eps * (1 + np.abs(want).max(initial=0.0)), (i, err)
    # Cholesky: problem 3 not positive definite in the second call (staged) and the fourth
    # (replayed), the others unaffected.
    spd = [x @ x.T + n * np.eye(n) for x, n in zip(As[0], ns)]
    for step in range(4):
        A = [x.copy() for x in spd]
        if step % 2:
            A[3][5, 5] = -100.0
        a = [xp.asarray(x) for x in A]
        res = rt.cholesky(a).result()
        want_info = [0, 0, 0, 6, 0, 0, 0] if step % 2 else [0] * len(ns)
        assert list(res.info) == want_info
        for i, n in enumerate(ns):
            assert _to_host(a[i]).tobytes() == A[i].tobytes()
            lo = _to_host(res.factors[i])
            if device == "cpu" or not want_info[i]:  # (a failed problem's rest: unspecified;
                # on the CPU both roads leave zeros above the diagonal, a new output's)
                assert not np.triu(lo, 1).any(), (step, i)
            k = n if not want_info[i] else want_info[i] - 1
            want = np.linalg.cholesky(A[i][:k, :k]) if k else np.zeros((0, 0))
            assert np.all(np.isfinite(lo[:k, :k]))
            assert np.abs(lo[:k, :k] - want).max(initial=0.0) <= 10 * max(n, 1) * eps * (
                1 + np.abs(A[i]).max(initial=0.0))
    assert runs["n"] == 4
    # In place: the caller's own arrays hold the factors (staged each time).
    for _ in range(2):
        a = [xp.asarray(x.copy()) for x in spd]
        res = rt.cholesky(a, overwrite=True).result()
        assert all(f is x for f, x in zip(res.factors, a))
        for i in range(len(ns)):
            assert np.allclose(np.tril(_to_host(a[i])), np.linalg.cholesky(spd[i]))
    assert runs["n"] == 6
    rt.gemm([xp.asarray(x) for x in As[0][:3]], [xp.asarray(x) for x in Bs[0][:3]]).result()
    assert runs["n"] == 7  # (another signature: a call of its own)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [2, 9, 60])
@pytest.mark.parametrize("form", ["list", "packedF", "packedC"])
def test_trsm_exactly_singular_triangle_stays_in_its_problem(form, n, device):
    """A zero on T's diagonal gives infinities or NaNs in that problem's X, as the BLAS's
    trsm does, whether the compiled loop or the BLAS runs it on the CPU (n = 60 with 60
    right-hand sides is a loop's task) or a triangular kernel on the GPU: never an exception
    that fails the batch, never another problem's X. The third call of one runtime is the
    replay."""
    rng = np.random.default_rng(41)
    T = np.tril(rng.standard_normal((n, n))) + 3 * np.eye(n)
    T[0, 0] = 0.0
    good = np.tril(rng.standard_normal((5, 5))) + 3 * np.eye(5)
    B = [rng.standard_normal((n, n)), rng.standard_normal((5, 3))]
    rt = vbatch.Runtime(device)
    for _ in range(3):
        x = _mats(rt.trsm(_form([T, good], form, device, np.float64),
                          _form(B, form, device, np.float64)).result())
        assert not np.isfinite(x[0]).all()
        want = np.linalg.solve(good, B[1])
        assert np.abs(x[1] - want).max() <= 100 * np.finfo(np.float64).eps * np.abs(want).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_new_outputs_are_written_whole_on_cuda(dtype):
    """GEMM, SYRK and SYR2K without ``c`` get a new output that is not zeroed first (ops/blas.py
    marks it complete): every element must come from the kernels, and a packed output's
    padding (the space of an empty matrix of a nonzero other dimension) must still be zeros.
    The memory pool is emptied, then handed NaN-filled blocks before each call, so an element
    left unwritten, at any tile, size (0, k = 0, the 32- and 64-wide tiles' edges), layout or
    triangle, shows as NaN; each op runs twice (the second call is the known-call replay,
    which allocates its own way)."""
    import cupy

    rng = np.random.default_rng(31)
    shapes = [(0, 3, 2), (1, 1, 1), (5, 7, 0), (31, 32, 33), (32, 32, 32), (33, 65, 64),
              (64, 1, 129), (130, 129, 40)]
    A = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in shapes]
    B = [rng.standard_normal((k, n)).astype(dtype) for m, n, k in shapes]
    Bt = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in shapes]
    pool = cupy.get_default_memory_pool()
    tol = 1e-10 if dtype == np.float64 else 2e-3
    # an upper bound of every output's elements, padding included
    size = sum(max(m, 1) * max(n, m, 1) for m, n, _ in shapes)

    def poison():
        # Nothing else free in the pool, then NaN-filled blocks freed: what comes next is one.
        pool.free_all_blocks()
        blocks = [cupy.full(size + s, np.nan, dtype=dtype) for s in range(0, 4096, 512)]
        del blocks
        probe = cupy.ndarray((size,), dtype)
        assert bool(cupy.isnan(probe).all())
        del probe

    def whole(out):
        if isinstance(out, vbatch.PackedBatch):
            assert not np.isnan(_to_host(out.data)).any(), "padding left unwritten"
        return _mats(out)

    rt = vbatch.Runtime("cuda")
    for form in ("packedF", "packedC", "list"):
        a, b, bt = (_form(x, form, "cuda", dtype) for x in (A, B, Bt))
        for _ in range(2):
            poison()
            got = whole(rt.gemm(a, b).result())
            for x, y, o in zip(A, B, got):
                assert not np.isnan(o).any(), f"gemm {form}: unwritten elements"
                assert np.allclose(o, x.astype(np.float64) @ y, rtol=tol, atol=tol * (1 + len(y)))
            for lower in (True, False):
                poison()
                got = whole(rt.syrk(a, lower=lower).result())
                for x, o in zip(A, got):
                    assert not np.isnan(o).any(), f"syrk {form} lower={lower}: unwritten"
                    ref = syrk_reference(x, None, 1.0, 0.0, False, lower)
                    assert np.allclose(o, ref, rtol=tol, atol=tol * (1 + x.shape[1]))
                poison()
                got = whole(rt.syr2k(a, bt, lower=lower).result())
                for x, y, o in zip(A, Bt, got):
                    assert not np.isnan(o).any(), f"syr2k {form} lower={lower}: unwritten"
                    ref = syr2k_reference(x, y, None, 1.0, 0.0, False, lower)
                    assert np.allclose(o, ref, rtol=tol, atol=tol * (1 + x.shape[1]))
    pool.free_all_blocks()


# ----------------------------------------------------------------------------- CPU small tasks
@pytest.mark.parametrize("form", ["packedF", "packedC"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_cpu_small_tasks_compiled_equal_blas(monkeypatch, form, dtype):
    """The CPU backend runs tasks of at most SMALL_FLOPS as compiled loops (numba): every op
    and flag, on mixed sizes, gives what the BLAS calls give (SMALL_FLOPS = -1), and the loops
    did run. Complex: the conjugate transposes, HERK, HER2K and HEMM too."""
    import vbatch.kernels.blas_cpu as bc

    if not bc.jit.AVAILABLE:
        pytest.skip("numba is not installed: the CPU backend keeps to its BLAS calls")
    rng = np.random.default_rng(8)
    cplx = np.dtype(dtype).kind == "c"

    def normal(shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if cplx else x

    sizes = [0, 1, 2, 5, 17, 31, 32, 33, 40]
    sq = [normal((n, n)) + (n + 1) * np.eye(n) for n in sizes]
    rect = [normal((n, (n * 7) % 11 + 1)) for n in sizes]
    rect_t = [r.T.copy() for r in rect]
    cases = [
        ("gemm", lambda rt, f: rt.gemm(f(rect), f(rect_t), f(sq), alpha=0.7, beta=-1.5)),
        ("gemm_t", lambda rt, f: rt.gemm(f(rect), f(rect), alpha=1.2, trans_a=True)),
        ("syrk", lambda rt, f: rt.syrk(f(rect), f(sq), alpha=0.5, beta=2.0, lower=False)),
        ("syr2k", lambda rt, f: rt.syr2k(f(rect), f(rect), f(sq), alpha=0.3, beta=1.0)),
        ("potrs", lambda rt, f: rt.potrs(f([np.linalg.cholesky(s @ s.conj().T) for s in sq]),
                                         f(rect))),
    ]
    if cplx:
        cases += [
            ("gemm_c", lambda rt, f: rt.gemm(f(rect_t), f(rect_t), f(sq), alpha=0.7 - 1j,
                                             beta=2j, trans_a="C")),
            ("gemm_cc", lambda rt, f: rt.gemm(f(rect_t), f(rect), alpha=1j, trans_a="C",
                                              trans_b="C")),
            ("herk", lambda rt, f: rt.herk(f(rect), f(sq), alpha=0.5, beta=2.0, lower=False)),
            ("herk_t", lambda rt, f: rt.herk(f(rect_t), f(sq), alpha=-1.0, beta=1.0,
                                             trans=True)),
            ("her2k", lambda rt, f: rt.her2k(f(rect), f(rect), f(sq), alpha=0.3 + 1j,
                                             beta=1.0)),
            ("hemm", lambda rt, f: rt.hemm(f(sq), f(rect), f(rect), alpha=1 - 1j, beta=0.5,
                                           lower=False)),
        ]
    flags = [("left", True, False, False), ("left", False, True, True),
             ("right", True, True, False), ("right", False, False, True)]
    if cplx:
        flags += [("left", True, "C", False), ("right", False, "C", True)]
    for side, lower, trans, unit in flags:
        for op in ("trsm", "trmm"):
            b = rect if side == "left" else rect_t
            cases.append((f"{op}-{side}-{lower}-{trans}-{unit}",
                          lambda rt, f, op=op, b=b, side=side, lower=lower, trans=trans,
                          unit=unit: getattr(rt, op)(f(sq), f(b), alpha=0.9, side=side,
                                                     lower=lower, trans_a=trans,
                                                     unit_diagonal=unit)))
    calls = []
    def counting(name):
        fn = getattr(bc, name)

        def counted(*a):
            calls.append(name)
            return fn(*a)
        return counted

    for name in ("_gemm_small", "_diag_small", "_copy_small"):
        monkeypatch.setattr(bc, name, counting(name))

    def f(mats):
        return _form(mats, form, "cpu", dtype)

    tol = 50 * _eps(dtype) * 64
    default = bc.SMALL_FLOPS
    for name, call in cases:
        outs = []
        for small in (default, -1):
            monkeypatch.setattr(bc, "SMALL_FLOPS", small)
            res = call(vbatch.Runtime("cpu"), f).result()
            res = getattr(res, "solutions", res)
            outs.append(_mats(res))
        for i, (x, y) in enumerate(zip(*outs)):
            scale = max(np.abs(y).max(initial=0.0), 1.0)
            assert np.all(np.isfinite(x)), f"{name} problem {i}"
            assert np.abs(x - y).max(initial=0.0) <= tol * scale, f"{name} problem {i}"
    assert {"_gemm_small", "_diag_small"} <= set(calls), set(calls)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("coalesce", [False, True], ids=["direct", "coalesced"])
def test_one_dimensional_right_hand_sides_as_scipy_takes_them(device, coalesce):
    """potrs, posv, trsm and trmm take a 1-D right-hand side as SciPy's cho_solve and
    solve_triangular do (a column; with side="right", a row) and give 1-D solutions back,
    mixed with 2-D ones in one list; in place, the caller's own 1-D arrays hold them."""
    from scipy.linalg import cho_solve, solve_triangular

    xp = _xp(device)
    rng = np.random.default_rng(31)
    ns = [0, 1, 5, 33, 40]
    A = [rng.standard_normal((n, n)) for n in ns]
    A = [a @ a.T / max(n, 1) + 2 * np.eye(n) for a, n in zip(A, ns)]
    L = [np.linalg.cholesky(a) for a in A]
    B = [rng.standard_normal(n) for n in ns]
    B[3] = rng.standard_normal((ns[3], 2))  # a 2-D one among them
    opts = {"coalesce_us": 60_000_000} if coalesce else {}
    rt = vbatch.Runtime(device, **opts)

    def call(fn):
        if not coalesce:
            return fn(list(range(len(ns)))).result()
        futs = [fn([i]) for i in range(len(ns))]
        rt.wait()
        return [f.result() for f in futs]

    def outputs(res, pick=lambda r: r):
        return [_to_host(x) for x in pick(res)] if not coalesce else \
            [_to_host(pick(r)[0]) for r in res]

    dev = {k: [xp.asarray(x) for x in v] for k, v in (("a", A), ("l", L), ("b", B))}
    tol = 1e-10
    got = outputs(call(lambda ix: rt.potrs([dev["l"][i] for i in ix], [dev["b"][i] for i in ix])))
    got_posv = outputs(call(lambda ix: rt.posv([dev["a"][i] for i in ix],
                                               [dev["b"][i] for i in ix])),
                       lambda r: r.solutions)
    got_trsm = outputs(call(lambda ix: rt.trsm([dev["l"][i] for i in ix],
                                               [dev["b"][i] for i in ix])))
    got_trmm = outputs(call(lambda ix: rt.trmm([dev["l"][i] for i in ix],
                                               [dev["b"][i] for i in ix])))
    for i, b in enumerate(B):
        want = cho_solve((L[i], True), b) if ns[i] else b.copy()
        for what, g in (("potrs", got[i]), ("posv", got_posv[i])):
            assert g.shape == b.shape, f"{what} problem {i}: shape {g.shape}, b's {b.shape}"
            assert np.allclose(g, want, rtol=tol, atol=tol), f"{what} problem {i}"
        assert got_trsm[i].shape == b.shape and np.allclose(
            got_trsm[i], solve_triangular(L[i], b, lower=True) if ns[i] else b,
            rtol=tol, atol=tol), f"trsm problem {i}"
        assert got_trmm[i].shape == b.shape and np.allclose(got_trmm[i], L[i] @ b,
                                                            rtol=tol, atol=tol), f"trmm {i}"
    # side="right": a 1-D b is one row, x L = b
    rows = [rng.standard_normal(n) for n in ns]
    xr = outputs(call(lambda ix: rt.trsm([dev["l"][i] for i in ix],
                                         [xp.asarray(rows[i]) for i in ix], side="right")))
    for i, (x, r) in enumerate(zip(xr, rows)):
        assert x.shape == r.shape and np.allclose(x @ L[i], r, rtol=tol, atol=tol), f"row {i}"
    # a list's outputs given to a later call keep their 1-D problems 1-D: L^T (L y = b), twice
    # (the second through the known-call path)
    if not coalesce:
        for _ in range(2):
            y = rt.trsm(dev["l"], dev["b"]).result()
            x = rt.trsm(dev["l"], y, trans_a=True).result()
            for i, b in enumerate(B):
                assert x[i].shape == b.shape, f"chained problem {i}: {x[i].shape}"
                assert np.allclose(_to_host(x[i]), got[i], rtol=tol, atol=tol), f"chained {i}"
    # in place: the caller's own 1-D arrays hold the solutions
    mine = [xp.asarray(b.copy()) for b in B]
    res = call(lambda ix: rt.potrs([dev["l"][i] for i in ix], [mine[i] for i in ix],
                                   overwrite=True))
    back = list(res) if not coalesce else [r[0] for r in res]
    assert all(x is m for x, m in zip(back, mine))
    for i, m in enumerate(mine):
        assert m.shape == B[i].shape and np.allclose(_to_host(m), got[i], rtol=tol, atol=tol)


@pytest.mark.parametrize("orders", ["CCC", "CCF", "FFF", "CFC"])
def test_a_mostly_row_major_gemm_is_planned_as_its_transpose(orders):
    """Where two or more of A, B and the output are read row-wise, the GEMM is planned as
    O^T = op(B)^T op(A)^T over the same buffers (every view the other way round), and still
    computes O = op(A) op(B) + C."""
    rng = np.random.default_rng(3)
    shapes = [(3, 5, 4), (0, 2, 2), (33, 31, 32)]
    A = [rng.standard_normal((m, k)) for m, n, k in shapes]
    B = [rng.standard_normal((k, n)) for m, n, k in shapes]
    C = [rng.standard_normal((m, n)) for m, n, k in shapes]
    a, b, c = (vbatch.pack(x, order=o) for x, o in zip((A, B, C), orders))
    rt = vbatch.Runtime("cpu")
    (kd,) = rt.plan_for("gemm", a=a, b=b, c=c).kinds
    swapped = orders.count("C") >= 2
    assert (kd.param["a"], kd.param["tc"]) == (("b", 1) if swapped else ("a", 0))
    out = rt.gemm(a, b, c, beta=1.0).result()
    for i, (x, y, z) in enumerate(zip(A, B, C)):
        np.testing.assert_allclose(out.matrix(i), x @ y + z, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("orders", ["CC", "FC", "CF", "FF"])
def test_a_row_major_solve_runs_its_joins_transposed(orders, side):
    """Where X (laid out as B) is read row-wise, a triangular chain's joins are planned as
    X^T -= X1^T T21^T over the same buffers (a and b exchanged, every view flipped, the
    block's rows and columns exchanged in its args), while the plan's groups stay those of
    the untransposed chain; the solve and the product still compute T^-1 B and T B. Sizes
    cross the 16-column diagonal blocks asked for, so there are joins."""
    rng = np.random.default_rng(4)
    ns, r = [0, 1, 33, 70, 31], 5
    T = [np.tril(rng.standard_normal((n, n))) / max(n, 1) + 2 * np.eye(n) for n in ns]
    B = [rng.standard_normal((n, r) if side == "left" else (r, n)) for n in ns]
    t, b = vbatch.pack(T, order=orders[0]), vbatch.pack(B, order=orders[1])
    rt = vbatch.Runtime("cpu", kernel_options={"blas_nb": 16})
    plan = rt.plan_for("trsm", a=t, b=b, side=side)
    join = next(kd for kd in plan.kinds if kd.name.startswith("blas.gemm"))
    rows = (orders[1] == "C") != (side == "right")  # X's view is B^T for a right side
    assert join.param["a"] == ("x" if rows else "a")
    task = plan.tasks
    j = np.flatnonzero(np.array([plan.kinds[c] is join for c in task.kind]))
    assert len(j), "no join: the sizes did not cross a diagonal block"
    # (the block of rows [r0, r0 + mm), of the right-hand sides' nn columns)
    assert (task.args[j, 1] == (r if rows else task.rows[j])).all()
    assert (task.args[j, 4] == (task.rows[j] if rows else r)).all()
    for op, want in (("trsm", np.linalg.solve), ("trmm", np.matmul)):
        out = getattr(rt, op)(t, b, side=side).result()
        for i, (tt, bb) in enumerate(zip(T, B)):
            ref = want(tt, bb) if side == "left" else want(tt.T, bb.T).T
            np.testing.assert_allclose(out.matrix(i), ref, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{op} problem {i}")
