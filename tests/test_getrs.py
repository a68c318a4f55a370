"""Solves with LU factors (getrs, gesv) against SciPy's ``lu_solve`` / LAPACK's ``dgesv``, on
every backend.

Solutions are compared through ``||X - X_ref||_F / max(||X_ref||_F, 1) <= C n eps`` on well
conditioned matrices (NaN fails). Sizes 0, 1, tile - 1, tile, tile + 1 and past it in one batch,
each with its own number of right-hand sides (0, 1, several, past a tile), a 1-D right-hand
side among them; the factors and right-hand sides in every form and order; pivots as getrf's
result gives them and as lists.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import lu_factor, lu_solve

from _check import to_host
from conftest import DEVICES
from vbatch import InputError, PackedBatch, Runtime
from vbatch.ops.getrs import solve_graph

SIZES = [0, 1, 31, 32, 33, 70, 5, 40]
NRHS = [3, 1, 2, 0, 33, 5, 1, 40]
C = 50


def _xp(device):
    if device == "cuda":
        import cupy

        return cupy
    return np


def _form(mats, form, device):
    if form == "list":
        return [_xp(device).array(a) for a in mats]  # (copies: the tests keep their own)
    from vbatch import pack

    b = pack([np.atleast_2d(a.T).T if a.ndim == 1 else a for a in mats], order=form)
    return b.with_data(_xp(device).asarray(b.data)) if device == "cuda" else b


def _matrices(seed=0):
    """Gaussian plus a diagonal of n: well conditioned, and pivoting still swaps rows."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, n)) + n * np.eye(n) * rng.choice([-1, 1])
            for n in SIZES]


def _rhs(seed=1, vector=1):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((n, r)) for n, r in zip(SIZES, NRHS)]
    out[vector] = out[vector][:, 0] if NRHS[vector] == 1 else out[vector]
    return out


def _solutions(x) -> list:
    return [to_host(a) for a in (x.unpack() if isinstance(x, PackedBatch) else x)]


def _check(got, mats, rhs, trans=0, where=""):
    got = _solutions(got)
    assert len(got) == len(mats), where
    for i, (a, b) in enumerate(zip(mats, rhs)):
        want = lu_solve(lu_factor(a), b, trans=trans) if a.size and b.size else b
        g = np.asarray(got[i], np.float64)
        at = f"{where}, problem {i}"
        if np.ndim(b) == 1 and g.shape == (len(b), 1):  # (a packed batch has no 1-D problem)
            g = g[:, 0]
        assert g.shape == np.shape(b), f"{at}: shape {g.shape} != {np.shape(b)}"
        assert not np.isnan(g).any(), f"{at}: NaN"
        err = np.linalg.norm(g - want) / max(np.linalg.norm(want), 1.0)
        assert err <= C * max(a.shape[0], 1) * np.finfo(np.float64).eps, f"{at}: {err:.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "F", "C"])
@pytest.mark.parametrize("trans", [False, True, "N", "T", "C"])
def test_getrs_after_getrf_is_lu_solve(device, form, trans):
    mats, rhs = _matrices(), _rhs()
    rt = Runtime(device, nb=8)  # (every size past 8 in several panels)
    f = rt.getrf(_form(mats, form, device)).result()
    x = rt.getrs(f.factors, f.ipiv, _form(rhs, form, device), trans=trans).result()
    t = 0 if trans in (False, "N") else 1
    _check(x, mats, rhs, t, f"{device} {form} trans={trans}")
    if form == "list":  # (a 1-D right-hand side comes back 1-D)
        assert np.ndim(x[1]) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["F", "C"])
def test_pivots_as_lists_and_factors_of_another_order(device, order):
    """Pivots given as a list (host or device arrays), the factors in one order and the
    right-hand sides in the other."""
    mats, rhs = _matrices(2), _rhs(3)
    other = "C" if order == "F" else "F"
    rt = Runtime(device)
    f = rt.getrf(_form(mats, order, device)).result()
    for piv in ([to_host(p) for p in f.ipiv], [_xp(device).asarray(p).astype(np.int64)
                                               for p in f.ipiv]):
        x = rt.getrs(f.factors, piv, _form(rhs, other, device), trans="T").result()
        _check(x, mats, rhs, 1, f"{device} {order}")


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_call_checks_and_packs_its_list_of_pivots_on_every_call(device):
    """Pivots given as a list are part of a kept call's key by their lengths only: later calls
    with other pivots of those lengths replay it, each list checked and packed again (a bad
    one named before any work, as on the first call)."""
    mats = _matrices(2)
    rhs = [x if x.ndim == 2 else x[:, None] for x in _rhs(3)]  # (all 2-D: one signature)
    xp = _xp(device)
    facs = [lu_factor(a) if a.size else (a, np.zeros(0, np.int32)) for a in mats]
    lus, b = [xp.asarray(f) for f, _ in facs], [xp.asarray(x) for x in rhs]
    rt = Runtime(device)
    for _ in range(3):  # (a list's sizes are kept the second time they come)
        x = rt.getrs(lus, [xp.asarray(p) for _, p in facs], b).result()
        _check(x, mats, rhs, 0, device)
    assert [key[0] for key in rt._calls] == ["getrs"]
    assert next(iter(rt._calls.values()))._replay  # (the replay road)
    other = [p.copy() for _, p in facs]
    other[5][0] = SIZES[5] - 1  # (another valid swap: another system)
    got = _solutions(rt.getrs(lus, [xp.asarray(p) for p in other], b).result())
    want = lu_solve((facs[5][0], other[5]), rhs[5])
    assert np.linalg.norm(np.asarray(got[5]) - want) <= C * SIZES[5] * np.finfo(float).eps * (
        np.linalg.norm(want))
    other[5][3] = SIZES[5]
    with pytest.raises(InputError, match=r"problem 5: ipiv: a pivot outside \[0, 70\)"):
        rt.getrs(lus, [xp.asarray(p) for p in other], b)
    assert len(rt._calls) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "F", "C"])
def test_gesv_is_lapacks_and_a_singular_problem_keeps_b(device, form):
    mats, rhs = _matrices(4), _rhs(5)
    mats[3] = mats[3].copy()
    mats[3][:, 7] = 0.0  # U[7, 7] is exactly zero: info 8
    rt = Runtime(device, nb=8)
    res = rt.gesv(_form(mats, form, device), _form(rhs, form, device)).result()
    assert res.info.tolist() == [8 if i == 3 else 0 for i in range(len(mats))]
    assert res.failed().tolist() == [3] and not res.ok
    got = _solutions(res.solutions)
    assert np.array_equal(np.asarray(got[3]), rhs[3]), "the singular problem's b changed"
    keep = [i for i in range(len(mats)) if i != 3]
    _check([got[i] for i in keep], [mats[i] for i in keep], [rhs[i] for i in keep], 0,
           f"{device} {form}")
    for i in keep:  # the factors and pivots are getrf's
        lu, piv = lu_factor(mats[i]) if mats[i].size else (mats[i], np.zeros(0, int))
        assert to_host(res.ipiv[i]).tolist() == piv.tolist(), i
        f = to_host(res.factors.matrix(i) if isinstance(res.factors, PackedBatch)
                    else res.factors[i])
        assert np.linalg.norm(f - lu) <= C * max(SIZES) * np.finfo(float).eps * max(
            np.linalg.norm(lu), 1), i


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_writes_the_solutions_into_b_and_nothing_else(device):
    mats, rhs = _matrices(6), _rhs(7)
    rt = Runtime(device)
    f = rt.getrf(_form(mats, "list", device)).result()
    lu0 = [to_host(a).copy() for a in f.factors]
    b = _form(rhs, "list", device)
    x = rt.getrs(f.factors, f.ipiv, b, overwrite=True).result()
    assert all(g is a for g, a in zip(x, b))
    _check(b, mats, rhs, 0, device)
    assert all(np.array_equal(to_host(a), c) for a, c in zip(f.factors, lu0))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_is_named_before_any_work(device, monkeypatch):
    xp = _xp(device)
    rt = Runtime(device)
    mats = [np.eye(3), np.eye(2)]
    f = rt.getrf([xp.asarray(a) for a in mats]).result()
    b = [xp.ones((3, 1)), xp.ones((2, 1))]
    changed = rt.getrf([xp.asarray(a) for a in mats]).result().ipiv
    changed[1][0] = 2  # (a getrf result's pivots, changed by the caller: checked too)
    began = []
    real = type(rt.backend).begin
    monkeypatch.setattr(type(rt.backend), "begin",
                        lambda self, *a, **kw: began.append(1) or real(self, *a, **kw))
    cases = [
        ([np.array([0, 1]), np.array([0, 1])], "problem 0: ipiv: 2 pivots for 3 rows"),
        ([np.array([0, 1, 3]), np.array([0, 1])], r"problem 0: ipiv: a pivot outside \[0, 3\)"),
        ([np.array([0, 1, 2]), np.array([-1, 1])], r"problem 1: ipiv: a pivot outside \[0, 2\)"),
        ([np.array([0.0, 1, 2]), np.array([0, 1])], "problem 0: ipiv: expected a 1-D integer"),
        ([np.array([0, 1, 2])], "ipiv has 1 problems but the factors have 2"),
        (f.ipiv.part(0, 1), "ipiv has 1 problems but the factors have 2"),
        # (a wide entry that would wrap into range as int32)
        ([np.array([2**32 + 2, 1, 2]), np.array([0, 1])],
         r"problem 0: ipiv: a pivot outside \[0, 3\)"),
    ]
    for piv, msg in cases:
        with pytest.raises(InputError, match=msg):
            rt.getrs(f.factors, piv, b)
    with pytest.raises(InputError, match=r"problem 1: ipiv: a pivot outside \[0, 2\)"):
        rt.getrs(f.factors, changed, b)
    with pytest.raises(InputError, match="trans must be"):
        rt.getrs(f.factors, f.ipiv, b, trans="X")
    with pytest.raises(InputError, match="problem 1: lu is 2 x 2 but b has 3 rows"):
        rt.getrs(f.factors, f.ipiv, [xp.ones((3, 1)), xp.ones((3, 1))])
    with pytest.raises(InputError, match="problem 1: a: unsupported dtype"):
        rt.gesv([xp.eye(3), xp.eye(2, dtype=np.float16)], b)
    with pytest.raises(InputError, match="b is float32 but a is float64"):
        rt.gesv([xp.eye(3), xp.eye(2)], [x.astype(np.float32) for x in b])
    if device == "cuda":  # device pivots with host factors
        with pytest.raises(InputError, match="device pivots go with device factors"):
            Runtime("cpu").getrs([np.eye(3)], [xp.arange(3)], [np.ones((3, 1))])
    assert not began


def test_the_solve_graph_swaps_first_or_last():
    n, r = np.array([0, 3, 40]), np.array([2, 0, 5])
    opts = {"blas_nb": 8}
    g = solve_graph(n, r, False, False, opts)
    first = [g.kinds[g.kind[t]].name.split("[")[0] for t in np.flatnonzero(g.problem == 2)]
    assert first[0] == "getrf.swap" and first.count("getrf.swap") == 1
    assert set(g.problem.tolist()) == {2}  # (no work for an empty problem or no rhs)
    g = solve_graph(n, r, True, False, opts)
    last = [g.kinds[g.kind[t]].name.split("[")[0] for t in np.flatnonzero(g.problem == 2)]
    assert last[-1] == "getrf.swap" and last.count("getrf.swap") == 1


def test_the_cpu_swap_without_numba_agrees(monkeypatch):
    """The interchanges in numpy (no numba installed) give the compiled loop's solutions."""
    from vbatch.core import jit

    mats, rhs = _matrices(8), _rhs(9)
    want = Runtime("cpu").gesv(mats, rhs).result().solutions
    monkeypatch.setattr(jit, "AVAILABLE", False)
    rt = Runtime("cpu", nb=8)  # (another plan: its launches prepared without numba)
    for trans in (False, True):
        f = rt.getrf(_form(mats, "C", "cpu")).result()
        x = rt.getrs(f.factors, f.ipiv, _form(rhs, "F", "cpu"), trans=trans).result()
        _check(x, mats, rhs, int(trans), f"trans={trans}")
    got = rt.gesv(mats, rhs).result().solutions
    assert all(np.allclose(g, w, rtol=1e-13, atol=1e-13) for g, w in zip(got, want))
