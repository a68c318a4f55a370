"""Assertions shared by the tests: a factor is right, or the test says exactly how it is not."""

from __future__ import annotations

import numpy as np

from vbatch.ops.cholesky import reference, residual
from vbatch.ops.op import wide
from vbatch.runtime.cli import RESIDUAL_C


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def tolerance(n: int, dtype) -> float:
    """The stated normwise tolerance: RESIDUAL_C * n * eps of the dtype (RESIDUAL_C = 2)."""
    return RESIDUAL_C * max(n, 1) * np.finfo(dtype).eps


def check_factor(a, f, dtype, npiv=None, where: str = "") -> float:
    """``f`` is a correct (partial) Cholesky factor of ``a``; returns the residual / (n eps)."""
    a, f = to_host(a), to_host(f)
    n = a.shape[0]
    p = n if npiv is None else int(npiv)
    assert f.shape == a.shape, f"{where}: factor shape {f.shape} != {a.shape}"
    assert f.dtype == np.dtype(dtype), f"{where}: factor dtype {f.dtype} != {dtype}"
    assert np.all(np.isfinite(f)), f"{where}: NaN or inf in the factor"
    upper = np.triu(f, 1)
    assert not np.any(upper), f"{where}: non-zero above the diagonal at {np.argwhere(upper)[:3]}"
    d = np.diag(f)[:p]  # (complex: a Hermitian factor's diagonal is real)
    assert np.all(d.real > 0) and not np.any(d.imag), f"{where}: diagonal of L11 not positive"
    r = residual(a, f, p)
    tol = tolerance(n, dtype)
    assert r <= tol, f"{where}: residual {r:.3e} > tolerance {tol:.3e} (n={n}, p={p})"
    if p < n:
        # The trailing block against a dense Schur complement computed in float64.
        ref, info = reference(a, p)
        assert info == 0
        s, s_ref = wide(np.tril(f[p:, p:])), ref[p:, p:]
        scale = max(np.linalg.norm(wide(a)), 1.0)
        err = np.linalg.norm(s - s_ref) / scale
        assert err <= tol, f"{where}: Schur complement error {err:.3e} > {tol:.3e}"
    return r / (max(n, 1) * np.finfo(dtype).eps)


def check_failed(a, f, info: int, dtype, npiv=None, where: str = "", ref=None) -> None:
    """``f`` is what LAPACK's potrf leaves of a (partial) factorization of ``a`` that failed
    with ``info`` (1-based), in its leading ``info x info`` block: columns before the failing
    one are the partial factorization of that many columns, every row (vbatch's promise,
    checked as a backward error), the failing pivot holds the value LAPACK tested there
    (``a_jj`` less the squares of row ``j`` of L before it; NaN where LAPACK's is NaN), zeros
    above the diagonal; all of it within the normwise tolerance of the float64 reference
    (``ref``: ``reference(a, npiv)``, where the caller has it already)."""
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    a = to_host(a).astype(wide)
    f = to_host(f).astype(wide)
    n = a.shape[0]
    ref, want = reference(a, npiv) if ref is None else ref
    assert info == want, f"{where}: info {info}, LAPACK's {want}"
    g = info - 1
    sym = np.tril(a) + np.tril(a, -1).conj().T
    scale = max(np.linalg.norm(sym), 1.0)
    tol = tolerance(n, dtype)
    lead, lead_ref = np.tril(f[:info, :info]), ref[:info, :info].copy()
    assert not np.any(np.triu(f[:info, :info], 1)), f"{where}: non-zero above the diagonal"
    assert not lead[g, g].real > 0 and lead[g, g].imag == 0, \
        f"{where}: the failed pivot {lead[g, g]!r} is > 0 or not real"
    if np.isnan(lead_ref[g, g]):
        assert np.isnan(lead[g, g]), f"{where}: pivot {lead[g, g]}, LAPACK's is NaN"
        lead[g, g] = lead_ref[g, g] = 0.0
    lk = f[:, :g]
    assert np.all(np.isfinite(lk)), f"{where}: NaN or inf in the first {g} columns"
    err = np.linalg.norm(sym[:, :g] - lk @ lk[:g].conj().T) / scale
    assert err <= tol, f"{where} (n={n}, info={info}): columns before it, error {err:.2e}"
    err = np.linalg.norm(lead - lead_ref) / scale
    assert err <= tol, (f"{where} (n={n}, info={info}): leading block error {err:.2e}, "
                        f"pivot {lead[g, g]!r}, LAPACK's {lead_ref[g, g]!r}")


def edge_sizes(nb: int) -> list[int]:
    """The sizes every batch must contain: 0, 1, nb-1, nb, nb+1."""
    return sorted({0, 1, max(nb - 1, 0), nb, nb + 1})


def plan_npiv(plan) -> np.ndarray:
    """Columns a POTRF plan factors per problem (its panels' widths, summed)."""
    t = plan.tasks
    panel = np.array([plan.kinds[c].name == "potrf.panel" for c in range(len(plan.kinds))])[t.kind]
    return np.bincount(t.problem[panel], weights=t.width[panel], minlength=plan.k).astype(int)


def count_staged(rt, monkeypatch) -> dict:
    """``{"n": ...}``: how many of ``rt``'s calls take the staged road from here on (a replay
    does not)."""
    runs = {"n": 0}
    real = rt._execute

    def counting(*args, **kw):
        runs["n"] += 1
        return real(*args, **kw)

    monkeypatch.setattr(rt, "_execute", counting)
    return runs
