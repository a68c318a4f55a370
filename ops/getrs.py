"""Solves with LU factors: ``getrs`` (given getrf's factors and pivots) and ``gesv`` (factor and
solve in one task graph).

``P A = L U`` (:mod:`vbatch.ops.getrf`). ``A X = B`` is ``L U X = P B``: the row interchanges
of ``ipiv`` applied to B (a ``getrf.swap`` task, which also brings B into X), then the unit
lower solve by L and the upper one by U, both chains of the ``blas`` family's triangular
recursion (:func:`~vbatch.ops.blas.chain_graph`) on views of the one factor buffer: L's
strict lower triangle with a unit diagonal, U's upper triangle. ``A^T X = B`` is
``U^T L^T P X = B``: the solves by ``U^T`` (reading B) and ``L^T`` (transposed views), then
the interchanges in reverse order; ``A^H X = B`` the same with conjugated views (real
matrices have ``A^H = A^T``, so for them ``trans="C"`` is ``"T"``).

``gesv``'s graph is getrf's, then the solve's, one after the other per problem
(:func:`~vbatch.core.graph.sequence`): a small problem's solve runs while a large one still
factors. A problem whose ``U`` has an exactly zero diagonal entry (``info > 0``, LAPACK's
``dgesv``) keeps ``B`` as its solution: the solve's tasks skip it (``skip_failed``) but for
the interchange task's copy of ``B`` into X.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import model_validator

from vbatch.core.graph import TaskGraph, sequence
from vbatch.ops.blas import (
    TRSM,
    _parsed,
    _Request,
    _system,
    _sig,
    chain_graph,
    diag_kind,
    gemm_kind,
    rows_wise,
    single_graph,
)
from vbatch.ops.generate import signs, square, uniform
from vbatch.ops.getrf import (
    GetrfResult,
    getrf_graph,
    lu_matrices,
    pivot_operand,
    permutation,
    pivots,
    reference,
    swap_kind,
)
from vbatch.ops.op import Buffer, Example, Op, wide
from vbatch.ops.op import register as register_op
from vbatch.ops.operands import fit_trans, transpose, view_flag

def solve_graph(n: np.ndarray, nrhs: np.ndarray, trans: int, x_rows: bool, opts: dict,
                skip_failed: int = 0) -> TaskGraph:
    """``op(A) X = B`` from the factors ``lu`` and pivots ``ipiv``, B read from ``b``, X
    written to ``x`` (``x_rows``: X is read row by row, :func:`~vbatch.ops.blas.rows_wise`);
    ``trans``: False, True or "C" (:func:`~vbatch.ops.operands.transpose`)."""
    sf = int(skip_failed)
    nb, whole = int(opts["blas_nb"]), int(opts.get("blas_whole_rhs", 0))
    if not trans:  # X := P B, then L Y = X forward (unit diagonal), U X = Y backward
        swap = single_graph(swap_kind("x", "b", True, sf), n, nrhs, nrhs)
        phases = [(diag_kind(TRSM, "lu", "x", 0, 0, 1, 1, sf),
                   gemm_kind("lu", "x", "x", "x", 0, 0, 0, "minus", "one", skip_failed=sf),
                   True, True),
                  (diag_kind(TRSM, "lu", "x", 0, 0, 0, 0, sf),
                   gemm_kind("lu", "x", "x", "x", 0, 0, 0, "minus", "one", skip_failed=sf),
                   False, True)]
        return sequence([swap, chain_graph(n, nrhs, phases, nb, whole, swap=x_rows)])
    # U^T Y = B forward (reading B), L^T Z = Y backward (unit diagonal), then X := P^T Z
    t = view_flag(trans)
    phases = [(diag_kind(TRSM, "lu", "x", t, 0, 1, 0, sf, src="b"),
               gemm_kind("lu", "x", "x", "x", t, 0, 0, "minus", "one", skip_failed=sf,
                         src="b"), True, True),
              (diag_kind(TRSM, "lu", "x", t, 0, 0, 1, sf),
               gemm_kind("lu", "x", "x", "x", t, 0, 0, "minus", "one", skip_failed=sf),
               False, True)]
    return sequence([chain_graph(n, nrhs, phases, nb, whole, swap=x_rows),
                     single_graph(swap_kind("x", "", False, sf), n, nrhs, nrhs)])


def _pivots_for(ipiv: Any, operands: dict):
    """``ipiv`` checked and packed for the factors ``operands["lu"]`` (the request's check,
    and its Buffer's ``convert``: a known call's list of pivots, again)."""
    return pivot_operand(ipiv, operands["lu"].n, operands["lu"].kind)


class GetrsRequest(_Request):
    """``op(A) X = B`` with ``P A = L U`` given by getrf's ``lu`` (square) and ``ipiv``."""

    lu: Any
    ipiv: Any
    b: Any
    trans: bool | str = False
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, (), ("overwrite",), ("trans",))
        v["lu"], v["b"] = _system(v, "lu", ("b",))
        fit_trans(v, v["lu"].dtype, ("trans",))
        v["ipiv"] = _pivots_for(v.get("ipiv"), v)
        return v


def getrs_graph(req: GetrsRequest, opts: dict) -> TaskGraph:
    return solve_graph(req.b.m, req.b.n, req.trans, rows_wise(req.b, 0), opts)


def getrs_reference(lu, ipiv, b, trans=False):
    """``op(A) X = B`` in double precision from LU factors and 0-based pivots, as SciPy's
    ``lu_solve``."""
    from scipy.linalg import solve_triangular

    f, b = wide(lu), wide(b)
    n = f.shape[0]
    if n == 0 or b.size == 0:
        return b.copy()
    perm = permutation(ipiv, n)
    t = view_flag(transpose(trans, "trans"))
    if not t:
        y = solve_triangular(f, b[perm], lower=True, unit_diagonal=True, check_finite=False)
        return solve_triangular(f, y, lower=False, check_finite=False)
    y = solve_triangular(f, b, lower=False, trans=t - t // 3, check_finite=False)
    z = solve_triangular(f, y, lower=True, unit_diagonal=True, trans=t - t // 3,
                         check_finite=False)
    x = np.empty_like(z)
    x[perm] = z
    return x


def getrs(lu: Any, ipiv: Any, b: Any, *, trans: Any = False):
    """Solve ``op(A) X = B`` per problem, given getrf's ``factors`` (``lu``, square) and
    ``ipiv`` (its result's, or a list of 1-D integer arrays of 0-based pivots, as SciPy's
    ``lu_solve`` takes them), each problem with its own number of right-hand sides (a 1-D
    ``b`` is one). ``trans``: False or "N" (``A X = B``), True or "T" (``A^T X = B``), "C"
    (``A^H X = B``).
    ``result()``: X, in the form of ``b``."""


def lu_factors(rng, sizes, dtype=np.float64) -> list[np.ndarray]:
    """Factors as getrf stores them, well conditioned: L unit lower with entries below the
    diagonal of at most 0.5 / n, U with a diagonal of magnitude 1-2."""
    out = []
    for n in sizes:
        f = np.tril(uniform(rng, (n, n), dtype) * 0.5, -1) / max(n, 1)
        f += np.triu(uniform(rng, (n, n), dtype), 1) / max(n, 1)
        f[np.arange(n), np.arange(n)] = signs(rng, n, dtype) * rng.uniform(1, 2, n)
        out.append(f)
    return out


def example_pivots(sizes) -> list[np.ndarray]:
    """Valid pivots that depend on the sizes alone (so that a prepared call's rebound
    operands of the same sizes share them): row ``i`` with a row at or below it."""
    out = []
    for n in sizes:
        i = np.arange(n)
        out.append((i + (5 * i + 3) % np.maximum(n - i, 1)).astype(np.int32))
    return out


def getrs_example(rng, sizes, dtype=np.float64) -> Example:
    # The pivots as getrf's result gives them, host memory: the suite passes such an operand
    # as it is in every form (host pivots go with factors of every array kind).
    piv = pivots(pivot_operand(example_pivots(sizes), np.asarray(sizes, np.int64), "numpy"))
    params = [{"trans": t} for t in (False, True, "C")]

    def ref(o, p):
        return [[getrs_reference(f, q, x, p["trans"]) for f, q, x in zip(o["lu"], o["ipiv"],
                                                                           o["b"])]]

    return Example({"lu": lu_factors(rng, sizes, dtype), "ipiv": piv,
                    "b": square(rng, sizes, dtype)},
                   params, ref, lambda r: [r], "b")


GETRS_OP = register_op(Op(
    name="getrs", api=getrs, example=getrs_example, request=GetrsRequest,
    buffers=(Buffer("lu", "lu"),
             Buffer("ipiv", "ipiv", convert=_pivots_for),
             Buffer("b", "b"), Buffer("x", "b", output=True)),
    graph=getrs_graph, signature=_sig("lu", "ipiv", "b", "trans"),
    result=lambda outs, info, plan: outs["x"],
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=("getrf", "blas"),
    doc="op(A) X = B from getrf's factors and pivots",
))


# ----------------------------------------------------------------------------- gesv
class GesvRequest(_Request):
    """``A X = B``, ``A`` square: getrf, then getrs, in one graph."""

    a: Any
    b: Any
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, (), ("overwrite",))
        v["a"], v["b"] = _system(v, "a", ("a", "b"))
        return v

    def steps(self) -> np.ndarray:
        return self.a.n


def gesv_graph(req: GesvRequest, opts: dict) -> TaskGraph:
    n = req.a.n
    return sequence([getrf_graph(n, n, True, int(opts["nb"])),
                     solve_graph(req.b.m, req.b.n, False, rows_wise(req.b, 0), opts, 1)])


@dataclass(frozen=True)
class GesvResult:
    """``factors`` and ``ipiv`` (as :class:`~vbatch.GetrfResult`'s), ``solutions`` (the
    form of ``b``), ``info`` (LAPACK's: ``i > 0``, ``U[i-1, i-1]`` is exactly zero, and that
    problem's solution is its ``b``, unchanged)."""

    factors: Any
    ipiv: Any
    solutions: Any
    info: np.ndarray
    plan: Any

    ok = GetrfResult.ok
    failed = GetrfResult.failed


def gesv(a: Any, b: Any):
    """Factor ``P A = L U`` with partial pivoting and solve ``A X = B``, in one task graph;
    each problem square, with its own number of right-hand sides (a 1-D ``b`` is one).
    ``result()``: a :class:`~vbatch.GesvResult` (factors, ipiv, solutions, info; a singular
    problem keeps ``B`` as its solution and gets its ``info``)."""


def gesv_reference(a, b):
    """``(factors, ipiv, x)`` in double precision: LAPACK's getrf and, unless a pivot is zero,
    the solve; else ``x`` is ``b``."""
    f, piv, info = reference(a)
    b = wide(b)
    return f, piv, (b.copy() if info else getrs_reference(f, piv, b))


def gesv_example(rng, sizes, dtype=np.float64) -> Example:
    def ref(o, p):
        refs = [gesv_reference(x, y) for x, y in zip(o["a"], o["b"])]
        return [[r[1].astype(np.float64) for r in refs], [r[0] for r in refs],
                [r[2] for r in refs]]

    return Example({"a": lu_matrices(rng, [(s, s) for s in sizes], dtype),
                    "b": square(rng, sizes, dtype)},
                   [{}], ref, lambda r: [r.ipiv, r.factors, r.solutions], "b")


GESV_OP = register_op(Op(
    name="gesv", api=gesv, example=gesv_example, request=GesvRequest,
    buffers=(Buffer("a", "a"), Buffer("lu", "a", output=True),
             Buffer("ipiv", None, output=True, form="a", complete=True, dtype="int32",
                    shape=lambda r: (r.steps(), np.ones(r.a.k, np.int64))),
             Buffer("b", "b"), Buffer("x", "b", output=True)),
    graph=gesv_graph, signature=_sig("a", "b"),
    result=lambda outs, info, plan: GesvResult(outs["lu"], pivots(outs["ipiv"]), outs["x"],
                                               info, plan),
    returns=(("solutions", "x"), ("factors", "lu"), ("ipiv", "ipiv")),
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=("getrf", "blas"),
    doc="A X = B: LU with partial pivoting and the solve, one graph",
))
