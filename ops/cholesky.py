"""Batched Cholesky (POTRF), full and partial: the request model, its task graph, its reference.

Algorithm: blocked **left-looking** Cholesky with panel width ``nb``. Step ``s`` works on the
panel of columns ``[j, j + w)``, ``j = s * nb``, ``w = min(nb, p - j)``, rows ``[j, n)``:

* ``update``  the panel is brought up to date from the already factored columns:
  ``A[j:, j:j+w] -= L[j:, :j] @ L[j:j+w, :j]^T`` (SYRK on the diagonal block, GEMM below it);
* ``potf2``   the ``w x w`` diagonal block is factored (unblocked Cholesky);
* ``trsm``    the rows below it are solved: ``L[j+w:, j:j+w] = A[j+w:, j:j+w] L11^-T``.

**Partial Cholesky** factors only the first ``p`` columns (``npiv``) and leaves the Schur
complement ``A22 - L21 L21^T`` in the trailing ``(n - p) x (n - p)`` block: a multifrontal front
needs exactly this. Left-looking never touches the trailing block during the steps, so one final
``schur`` task (a SYRK with ``k = p``) forms it.

The graph is one of *templates*: a node is a kind of task, not a (matrix, step) pair. Edges carry
a ``lag``: ``0`` inside one step, ``1`` from step ``s`` to step ``s + 1``, ``"last"`` from the last
step to the final phase. A problem ``i`` instantiates it ``S_i = ceil(p_i / nb)`` times; that
bookkeeping is numpy arrays (see :mod:`vbatch.scheduler`).

The output of every form is lower triangular: ``L11`` and ``L21`` in the first ``p`` columns,
the lower triangle of the Schur complement in the trailing block, and zeros above the diagonal.
"""

from __future__ import annotations

import functools
from typing import Any

import networkx as nx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vbatch.ops.batch import MatrixList, PackedBatch
from vbatch.ops.errors import InputError

UPDATE, POTF2, TRSM, SCHUR = "update", "potf2", "trsm", "schur"
FUSED = "fused"  # update + potf2 + trsm of one step in one launch


@functools.cache
def task_graph() -> nx.DiGraph:
    """The left-looking POTRF template graph (see the module docstring)."""
    g = nx.DiGraph(op="potrf", algorithm="left-looking")
    g.add_node(UPDATE, phase="step", blas="syrk+gemm", reads="factored columns [0, j)")
    g.add_node(POTF2, phase="step", blas="potf2", reads="diagonal block")
    g.add_node(TRSM, phase="step", blas="trsm", reads="diagonal block, rows below")
    g.add_node(SCHUR, phase="final", blas="syrk", reads="factored columns [0, p)")
    g.add_edge(UPDATE, POTF2, lag=0)
    g.add_edge(POTF2, TRSM, lag=0)
    g.add_edge(TRSM, UPDATE, lag=1)
    g.add_edge(TRSM, SCHUR, lag="last")
    return g


def _npiv_array(v: Any, k: int) -> np.ndarray:
    """``npiv`` as k integers: one int broadcast, or one per problem. Booleans, floats and
    other non-integers are refused by name (``True`` is not "factor one column")."""
    if isinstance(v, (bool, np.bool_)):
        raise InputError([(None, f"npiv must be an int or one int per problem, got {v!r}")])
    a = np.asarray(v) if not isinstance(v, np.ndarray) else v
    if a.size and not (np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_):
        what = f"{type(v).__name__} {a.item()!r}" if a.ndim == 0 else f"dtype {a.dtype}"
        raise InputError([(None, f"npiv must hold integers, got {what}")])
    if a.ndim == 0:
        return np.full(k, int(a), dtype=np.int64)
    if a.ndim != 1 or len(a) != k:
        raise InputError(
            [(None, f"npiv must be an int or have one entry per problem ({k}), "
                    f"got shape {a.shape}")]
        )
    return a


def read_only(batch: Any) -> list[tuple[int | None, str]]:
    """The problems of ``batch`` that ``overwrite=True`` could not write (numpy arrays or a
    packed buffer marked read-only; device arrays are always writable)."""
    if isinstance(batch, PackedBatch):
        if not getattr(batch.data.flags, "writeable", True):
            return [(None, "overwrite=True, but the packed buffer is read-only")]
        return []
    return [(i, "overwrite=True, but this array is read-only")
            for i, a in enumerate(batch.mats) if not getattr(a.flags, "writeable", True)]


def npiv_steps(npiv: np.ndarray, nb: int) -> np.ndarray:
    """Number of panel steps of each problem: ``ceil(p / nb)``."""
    return -(-np.asarray(npiv, dtype=np.int64) // nb)


class CholeskyRequest(BaseModel):
    """One submission: the batch, the columns to factor per problem, whether to overwrite.

    ``batch`` is a list of square arrays or a :class:`PackedBatch`. ``npiv`` is ``None`` (factor
    everything), one int for all problems, or one int per problem. One rule for both forms: a
    single int is broadcast to every problem first, and every problem's entry must lie in
    ``[0, n_i]`` (nothing is clamped: an ``npiv`` larger than some ``n_i`` names that problem).
    ``overwrite=True`` needs writable inputs; a read-only array is named here, before any work.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    batch: Any
    npiv: Any = Field(default=None, validate_default=True)
    overwrite: bool = False

    @field_validator("batch", mode="before")
    @classmethod
    def _batch(cls, v: Any) -> PackedBatch | MatrixList:
        if isinstance(v, (PackedBatch, MatrixList)):
            return v
        if isinstance(v, (list, tuple)):
            return MatrixList(mats=v)
        raise InputError(
            [(None, "expected a list of 2-D arrays or a vbatch.PackedBatch, "
                    f"got {type(v).__name__}")]
        )

    @field_validator("npiv", mode="before")
    @classmethod
    def _npiv(cls, v: Any, info) -> np.ndarray:
        batch = info.data.get("batch")
        if batch is None:  # the batch itself was invalid; that error is the one to report
            return v
        n = batch.n
        if v is None:
            p = n
        else:
            p = _npiv_array(v, len(n))
            problems = [(int(i), f"npiv {p[i]} outside [0, n={n[i]}]")
                        for i in np.flatnonzero((p < 0) | (p > n))]
            if problems:
                raise InputError(problems)
        p = np.array(p, dtype=np.int64, copy=True)
        p.flags.writeable = False
        return p

    @model_validator(mode="after")
    def _writable(self) -> "CholeskyRequest":
        if self.overwrite:
            problems = read_only(self.batch)
            if problems:
                raise InputError(problems)
        return self

    @property
    def partial(self) -> bool:
        return bool(np.any(self.npiv < self.batch.n))


# ----------------------------------------------------------------------------- reference
def cholesky_flops(n: Any, npiv: Any = None) -> np.ndarray:
    """LAPACK's operation count for factoring ``p`` of ``n`` columns, Schur update included.

    A full factorization costs ``F(n) = n^3/3 + n^2/2 + n/6``; factoring ``p`` columns and
    updating the trailing block is everything except factoring that block: ``F(n) - F(n - p)``.
    """
    n = np.asarray(n, dtype=np.float64)
    p = n if npiv is None else np.asarray(npiv, dtype=np.float64)

    def full(m):
        return m**3 / 3 + m**2 / 2 + m / 6

    return full(n) - full(n - p)


def potrf_info(diag: np.ndarray, info: int) -> int:
    """LAPACK's ``info`` with NaN pivots counted as failures.

    Reference LAPACK (``dpotrf2``) stops at a pivot that is ``<= 0`` or NaN. OpenBLAS's ``potrf``,
    which numpy and scipy wheels call, tests only ``<= 0`` and carries NaN on with ``info = 0``.
    vbatch follows the reference everywhere: given a finished ``potrf``'s diagonal and ``info``,
    this returns the first pivot that is not ``> 0``.
    """
    if info:
        return int(info)
    bad = np.flatnonzero(~(np.asarray(diag) > 0))
    return int(bad[0]) + 1 if len(bad) else 0


def reference(a: np.ndarray, npiv: int | None = None) -> tuple[np.ndarray, int]:
    """Dense reference for one matrix: ``(factor, info)``, computed in float64 with LAPACK.

    ``factor`` holds L11, L21 and the lower triangle of the Schur complement, zeros above the
    diagonal; ``info`` is LAPACK's (0, or the order of the first leading minor that is not
    positive definite, NaN included: :func:`potrf_info`). Only the lower triangle of ``a`` is
    read. On failure the factor's first ``info - 1`` columns are those of the partial
    factorization of that many columns (what vbatch leaves there, every row included) and the
    rest is zero. Non-finite input is taken as LAPACK takes it (an infinite pivot gives
    ``L(i, i) = inf`` and zeros below it, ``info`` unchanged).
    """
    from scipy.linalg import lapack, solve_triangular

    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    p = n if npiv is None else int(npiv)
    low = np.tril(a)
    sym = low + np.tril(low, -1).T
    out = np.zeros_like(sym)
    if n == 0:
        return out, 0
    if p:
        c, info = lapack.dpotrf(np.array(sym[:p, :p], order="F"), lower=True, clean=True)
        info = potrf_info(np.diag(c), info)
        if info:
            if info > 1:
                out[:, : info - 1] = reference(a, info - 1)[0][:, : info - 1]
            return out, info
        l11 = c
        l21 = solve_triangular(l11, sym[p:, :p].T, lower=True, check_finite=False).T
    else:
        l11, l21 = np.zeros((0, 0)), np.zeros((n, 0))
    out[:p, :p] = l11
    out[p:, :p] = l21
    out[p:, p:] = np.tril(sym[p:, p:] - l21 @ l21.T)
    return out, 0


def residual(a: np.ndarray, factor: np.ndarray, npiv: int | None = None) -> float:
    """Normwise backward error ``||A - L L^T||_F / ||A||_F`` of a (partial) factor, in float64.

    For a partial factor, ``L L^T`` is taken with the trailing block's Schur complement added
    back, so the measure is the same for both. ``NaN`` in the factor gives ``NaN`` (a failure).
    """
    a = np.asarray(a, dtype=np.float64)
    f = np.asarray(factor, dtype=np.float64)
    n = a.shape[0]
    if n == 0:
        return 0.0
    p = n if npiv is None else int(npiv)
    low = np.tril(a)
    sym = low + np.tril(low, -1).T
    lk = f[:, :p]
    rebuilt = lk @ lk.T
    s = np.tril(f[p:, p:])
    rebuilt[p:, p:] += s + np.tril(s, -1).T
    den = np.linalg.norm(sym)
    num = np.linalg.norm(sym - rebuilt)
    if den == 0:
        return float(num)
    return float(num / den)
