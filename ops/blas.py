"""Batched BLAS-3 and the Cholesky solve: ``gemm``, ``syrk``, ``syr2k``, ``trsm``, ``trmm``,
``potrs``.

Every problem is its own size (``m_i``, ``n_i``, ``k_i``; zero allowed). All of them run on four
launch kinds of the ``blas`` kernel family, whose kernels address a problem's operands through
*views*: a buffer (one of the op's) read as is or transposed. Transposing a view costs nothing (it
swaps the strides), so every case is reduced to a few:

* ``blas.gemm``: ``O[r0:r0+mm, c0:c0+nn] = alpha A[r0:r0+mm, k0:k0+kk] B[k0:k0+kk, c0:c0+nn]
  + beta C[...]``, on views A, B, C, O of the op's buffers; an ``uplo`` restricts it to one
  triangle of O (SYRK; such a task's block starts on the diagonal, ``r0 = c0``). ``c0`` is 0
  but in a blocked Cholesky's block updates (:mod:`vbatch.ops.cholesky`).
  GEMM is one such task per problem (``r0 = k0 = 0``); a TRSM join is one with ``alpha = -1``,
  ``beta = 1`` and ``C = O`` the right-hand sides, or, the first to write its rows (``src``),
  ``C = B`` and ``beta = alpha``; a TRMM join adds ``alpha T12 B2`` to rows already written;
* ``blas.trsm`` / ``blas.trmm``: one diagonal block ``X[o:o+w] := T[o:o+w, o:o+w]^{-1} X[o:o+w]``
  (or ``T X``), ``w <= nb``, all right-hand sides: what a register/shared-memory kernel finishes;
  the first to write its rows (``src``) reads them as ``alpha B[o:o+w]``;
* ``blas.copy``: ``X := alpha B`` (SYMM's symmetric operand made whole).

**Triangular ops** (KBLAS's recursive formulation, Charara, Keyes and Ltaief): every ``side``,
``lower``, ``trans_a`` becomes a left-side solve with a lower or upper triangle, by transposing
views: ``X op(A) = alpha B`` is ``op(A)^T X^T = alpha B^T``. A triangle of order m is split at
``m1`` (half, rounded up to a multiple of ``nb``); the two halves are solved and joined by one
GEMM, recursing down to ``nb``. Each problem's tasks form a chain: (lower, forward)
``T11 -> GEMM -> T22``, or (upper) the reverse; B is read by the first step into each row
block, so X needs no copy of B first. The GEMMs are large (half the triangle), so the speed
follows the GEMM kernel's.

Only the named triangle of a triangular operand is read (and for ``unit_diagonal`` not its
diagonal); inputs are never written unless ``overwrite=True`` names the output's input.
"""

from __future__ import annotations

import functools
from dataclasses import replace as dc_replace
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from vbatch.core.batch import MatrixList, PackedBatch, staged_order
from vbatch.core.errors import InputError
from vbatch.core.kinds import LAUNCH_KINDS, TaskKind, by_log2, by_log2_past_32, kind, single
from vbatch.ops.generate import flips, spd_list, square, triangular
from vbatch.ops.op import Buffer, Example, Op, wide
from vbatch.ops.op import register as register_op
from vbatch.ops.operands import (
    choice,
    finite_scalar,
    fit_scalars,
    fit_trans,
    flag,
    operand,
    shape_rule,
    together,
    transpose,
    view_flag,
    writable,
)
from vbatch.core.graph import TaskGraph, chain_edges

FAMILY = "blas"
# Launch kinds (what the blas kernel modules implement).
COPY, GEMM, TRSM, TRMM = "blas.copy", "blas.gemm", "blas.trsm", "blas.trmm"
# A blas task's arguments: its row block [r0, r0 + mm), its inner range [k0, k0 + kk) (GEMM),
# its columns [c0, c0 + nn), and src: 1 where the task is the first to write its rows of a
# triangular op's X, so that it reads their values from its kind's source (B, scaled) instead
# of X (chain_graph: no copy of B into X runs first). A diagonal block is (o, w, 0, 0, nn, 0,
# src); a copy (0, m, 0, 0, n, 0, 0). Every blas graph's args have these seven columns.
ARGS = ("r0", "mm", "k0", "kk", "nn", "c0", "src")


def _gemm_flops(args, rows, cols, width):
    return 2.0 * np.asarray(rows, np.float64) * cols * width


def _diag_flops(args, rows, cols, width):
    return np.asarray(rows, np.float64) ** 2 * width


def _copy_flops(args, rows, cols, width):
    return np.asarray(rows, np.float64) * width


# Elements a task must read and write at least (the trace's floor). A GEMM's operands may alias
# (a blocked Cholesky's B is rows of its A), so it counts the larger of A and B, and O once:
# loose where they do not (up to 1.5x for a square GEMM bound by bandwidth).
def _gemm_traffic(args, rows, cols, width):
    mm, kk, nn = (np.asarray(x, np.float64) for x in (rows, cols, width))
    return np.maximum(mm, nn) * kk + mm * nn


def _tri_entries(mm, nn, upper):
    # entries of one triangle of an mm x nn block that starts on the diagonal (r0 = c0: SYRK's
    # square blocks, a blocked Cholesky's block column, mm >= nn, lower)
    if upper:
        return np.where(nn >= mm, mm * nn - mm * (mm - 1) / 2, nn * (nn + 1) / 2)
    return np.where(mm >= nn, mm * nn - nn * (nn - 1) / 2, mm * (mm + 1) / 2)


def _tri_gemm(upper: bool):
    # flops and traffic of a GEMM on one triangle: that triangle's entries, and the operand
    # rows it needs (lower: all mm rows of A; upper: the nn columns of B; A and B may alias)
    def flops(args, rows, cols, width):
        mm, kk, nn = (np.asarray(x, np.float64) for x in (rows, cols, width))
        return 2.0 * kk * _tri_entries(mm, nn, upper)

    def traffic(args, rows, cols, width):
        mm, kk, nn = (np.asarray(x, np.float64) for x in (rows, cols, width))
        return (nn if upper else mm) * kk + _tri_entries(mm, nn, upper)

    return flops, traffic


def _diag_traffic(args, rows, cols, width):
    w, nn = np.asarray(rows, np.float64), np.asarray(width, np.float64)
    return w * (w + 1) / 2 + 2 * w * nn  # the triangle; the right-hand sides read and written


def _copy_traffic(args, rows, cols, width):
    return 2.0 * np.asarray(rows, np.float64) * width


_BASE = {
    COPY: TaskKind(name=COPY, op=FAMILY, args=ARGS, window=by_log2, launches=single(COPY),
                   flops=_copy_flops, traffic=_copy_traffic,
                   doc="X := alpha B on views (rows = m, width = n)"),
    GEMM: TaskKind(name=GEMM, op=FAMILY, args=ARGS, window=by_log2_past_32, launches=single(GEMM),
                   flops=_gemm_flops, traffic=_gemm_traffic,
                   doc="O := alpha A B + beta C on a row block (rows = mm, cols = kk, "
                       "width = nn)"),
    # Diagonal blocks of at most 32 rows (the recursion's base) share one window: one kernel
    # takes any of them at the same cost, and windows of 1, 2, 3-4, ... 17-32 rows made up to
    # six launches a step of a solve's chain.
    TRSM: TaskKind(name=TRSM, op=FAMILY, args=ARGS, window=by_log2_past_32,
                   launches=single(TRSM),
                   flops=_diag_flops, traffic=_diag_traffic,
                   doc="a diagonal block's solve (rows = w, width = nn)"),
    TRMM: TaskKind(name=TRMM, op=FAMILY, args=ARGS, window=by_log2_past_32,
                   launches=single(TRMM),
                   flops=_diag_flops, traffic=_diag_traffic,
                   doc="a diagonal block's product (rows = w, width = nn)"),
}


# A GEMM on one triangle of its output (``uplo``) counts that triangle's work only.
_TRI_GEMM = {u: dc_replace(_BASE[GEMM], **dict(zip(("flops", "traffic"), _tri_gemm(u == "upper"))))
             for u in ("lower", "upper")}


def copy_kind(src: str, dst: str, t: int, alpha: str, sym: str = "") -> TaskKind:
    """``dst := alpha src`` on views transposed when ``t``; ``alpha`` is ``"alpha"`` (the
    call's) or ``"one"``. ``sym`` ("lower"/"upper"): src is symmetric, only that triangle
    read; dst gets the whole matrix (SYMM's operand, for a GEMM); with ``t``'s conjugate bit
    and no transpose (``t = 2``), Hermitian (HEMM's): the mirrored half conjugated, the
    diagonal's imaginary parts taken as 0."""
    return kind(_BASE[COPY], (COPY,), src=src, dst=dst, t=int(t), alpha=alpha, sym=sym)


def gemm_kind(a: str, b: str, c: str, o: str, ta: int, tb: int, tc: int, alpha: str, beta: str,
              uplo: str = "", skip_failed: int = 0, src: str = "", scale: str = "one"
              ) -> TaskKind:
    """``o := alpha op(a) op(b) + beta c`` (views: ``ta``/``tb``/``tc`` transpose; ``tc``
    applies to ``c`` and ``o``). ``c`` is ``""`` when absent. ``alpha`` in alpha/minus/one,
    ``beta`` in beta/zero/one. ``uplo`` ("lower"/"upper") writes one triangle of ``o``.
    ``skip_failed``: leave problems whose ``info`` is set alone (a solve after a failed
    factorization). ``src``: the buffer a task whose ``src`` arg is set reads as C, with
    ``scale`` (alpha/one) as beta (a solve's first join into rows of X: ``alpha B``); such a
    task still writes its C when its problem is skipped."""
    return kind(_TRI_GEMM[uplo] if uplo else _BASE[GEMM], (GEMM,), a=a, b=b, c=c, o=o, ta=int(ta),
                tb=int(tb), tc=int(tc), alpha=alpha, beta=beta, uplo=uplo,
                skip_failed=int(skip_failed), src=src, scale=scale)


def transposed(kd: TaskKind) -> TaskKind:
    """A GEMM kind ``o := alpha op(a) op(b) + beta c`` (no triangle) as ``o^T := alpha
    op(b)^T op(a)^T + beta c^T`` over the same buffers (a and b exchanged, every view's
    transposition flipped; its tasks' rows and columns exchange too): a row-major buffer is the
    column-major buffer of its transpose, so row-major operands are then read by the
    column-major kernels (docs/decisions.md#row-major-gemm, #row-major-joins)."""
    p = kd.param
    if p["uplo"]:
        raise ValueError("a GEMM that writes one triangle is not transposed")
    return gemm_kind(p["b"], p["a"], p["c"], p["o"], p["tb"] ^ 1, p["ta"] ^ 1, p["tc"] ^ 1,
                     p["alpha"], p["beta"], skip_failed=p["skip_failed"], src=p["src"],
                     scale=p["scale"])


def rows_wise(x, t: int) -> bool:
    """Whether operand ``x`` (a packed batch or list as staged) seen transposed when ``t`` is
    read row by row: its storage is row-major and its view not transposed, or the reverse."""
    return (staged_order(x) == "C") != bool(t & 1)


def diag_kind(which: str, t: str, x: str, tt: int, tx: int, lower: int, unit: int,
              skip_failed: int = 0, src: str = "", scale: str = "one") -> TaskKind:
    """A diagonal block's solve (``which = TRSM``) or product (``TRMM``): triangle view
    ``t`` (transposed when ``tt``; ``lower``: the lower triangle of the view), right-hand sides
    ``x`` (transposed when ``tx``). ``skip_failed`` as :func:`gemm_kind`'s: only a plan in which
    an earlier task can fail sets it (POSV), since reading ``info`` costs every block a read of
    host memory (5-8% of a TRSM or POTRS of Nmax 512, H100, 2026-11-25). ``src``: the buffer
    (same view as ``x``) a task whose ``src`` arg is set reads its rows from, times ``scale``,
    instead of ``x``; such a task still writes them when its problem is skipped."""
    return kind(_BASE[which], (which,), t=t, x=x, tt=int(tt), tx=int(tx), lower=int(lower),
                unit=int(unit), skip_failed=int(skip_failed), src=src, scale=scale)


for _lk in _BASE:  # the launch kinds belong to the family from import on
    LAUNCH_KINDS.setdefault(_lk, FAMILY)


# ----------------------------------------------------------------------------- the chains
@functools.lru_cache(maxsize=4096)
def _recursion(m: int, nb: int, forward: bool, solve: bool) -> tuple:
    """The steps of one triangular solve (``solve``) or product of order ``m``, in the order
    they must run: ``(0, o, w, 0, 0, fresh)`` a diagonal block, ``(1, r0, mm, k0, kk, fresh)``
    a join into rows ``[r0, r0 + mm)``; ``fresh``: 1 for the first step to write its rows."""
    out: list[tuple] = []

    def rec(o: int, n: int) -> None:
        if n <= nb:
            out.append((0, o, n, 0, 0))
            return
        n1 = -(-(n // 2) // nb) * nb
        n1 = min(max(n1, nb), n - 1)
        n2 = n - n1
        top, bot = (o, n1), (o + n1, n2)
        # Forward (lower): X1 first, then X2 -= T21 X1; backward (upper): X2 first, then
        # X1 -= T12 X2. A product runs the other way round (it must read the other half
        # before that half is overwritten): lower computes X2 first, upper X1.
        first, second = (top, bot) if forward == solve else (bot, top)
        if solve:
            rec(*first)
            out.append((1, second[0], second[1], first[0], first[1]))
            rec(*second)
        else:
            rec(*first)
            out.append((1, first[0], first[1], second[0], second[1]))
            rec(*second)

    rec(0, m)
    # A step's rows are fresh when no earlier step wrote any of them (a solve: the first
    # diagonal block and the joins on the path of first halves; a product: every diagonal
    # block, which its joins then add to).
    written = np.zeros(m, bool)
    marked = []
    for st in out:
        lo, n = st[1], st[2]
        marked.append(st + (int(not written[lo:lo + n].any()),))
        written[lo:lo + n] = True
    return tuple(marked)


def chain_graph(m: np.ndarray, n: np.ndarray, phases: list[tuple], nb: int,
                whole_rhs: int = 0, swap: bool = False) -> TaskGraph:
    """Per problem (``m`` the triangle's order, ``n`` the right-hand sides; nothing for an empty
    problem): each phase's recursion, as one chain. A phase is ``(diag kind, gemm kind,
    forward, solve)``; the first phase's kinds carry the source (``src``: B) and its first
    step into each row block reads it (the task's ``src`` arg), so no copy of B into X runs
    first: a copy made a launch per size window and level of its own, six of the seven
    launches of a TRSM of 2,000 problems of at most 32 rows (H200, 2026-11-27). Where every
    phase is a solve, a problem with at most ``whole_rhs`` right-hand sides takes each phase as
    one diagonal task over its whole triangle (a backend's kernel for few right-hand sides:
    memory-bound, better done in one pass than in a chain of small launches). ``swap``: the
    joins run transposed (:func:`transposed`; the callers swap where X is read row by
    row): their args then hold the block's columns as rows and its rows as columns, while the
    graph's ``rows``, ``cols`` and ``width`` stay the join's own, so the plan's groups are
    those of the untransposed chain."""
    m = np.asarray(m, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    k = len(m)
    kinds: list[TaskKind] = []
    for d, g, _, _ in phases:
        kinds += [d, transposed(g) if swap else g]
    live = (m > 0) & (n > 0)
    whole = live & (n <= whole_rhs) if all(p[3] for p in phases) else np.zeros(k, bool)
    # Problems with the same chain: the same order, and whole or recursive.
    key = m * 2 + whole
    parts_p, parts_k, parts_a = [], [], []
    for kv in np.unique(key[live]).tolist():
        mv, w = kv // 2, bool(kv % 2)
        probs = np.flatnonzero(live & (key == kv))
        codes, rows = [], []
        for ph, (_, _, fwd, solve) in enumerate(phases):
            for st in _recursion(mv, max(mv, nb) if w else nb, fwd, solve):
                codes.append(2 * ph + st[0])
                rows.append(st[1:5] + (st[5] if ph == 0 else 0,))
        L = len(codes)
        parts_p.append(np.repeat(probs, L))
        parts_k.append(np.tile(np.asarray(codes, dtype=np.int8), len(probs)))
        a = np.zeros((len(probs), L, len(ARGS)), dtype=np.int64)
        r = np.asarray(rows, dtype=np.int64)
        a[:, :, :4] = r[None, :, :4]
        a[:, :, 4] = n[probs][:, None]
        a[:, :, 6] = r[None, :, 4]
        parts_a.append(a.reshape(-1, len(ARGS)))
    if parts_p:
        problem = np.concatenate(parts_p)
        order = np.argsort(problem, kind="stable")
        problem = problem[order]
        kcode = np.concatenate(parts_k)[order]
        args = np.concatenate(parts_a)[order]
    else:
        problem = np.zeros(0, np.int64)
        kcode = np.zeros(0, np.int8)
        args = np.zeros((0, len(ARGS)), np.int64)
    cnt = np.bincount(problem, minlength=k).astype(np.int64)
    first = np.cumsum(cnt) - cnt
    rows, cols, width = args[:, 1].copy(), args[:, 3].copy(), args[:, 4].copy()
    if swap:  # (the joins' codes are odd: 2 * phase + 1)
        j = (kcode % 2) == 1
        args[np.ix_(j, [0, 1, 4, 5])] = args[np.ix_(j, [5, 4, 1, 0])]
    return TaskGraph(kinds=tuple(kinds), kind=kcode, problem=problem, args=args,
                     rows=rows, cols=cols, width=width,
                     edges=chain_edges(first, cnt), k=k, chains=(first, cnt))


def single_graph(kd: TaskKind, m: np.ndarray, n: np.ndarray, kk: np.ndarray) -> TaskGraph:
    """One task per non-empty problem: ``(0, m, 0, kk, n)`` (a GEMM or SYRK)."""
    m, n, kk = (np.asarray(x, dtype=np.int64) for x in (m, n, kk))
    q = np.flatnonzero((m > 0) & (n > 0))
    args = np.zeros((len(q), len(ARGS)), dtype=np.int64)
    args[:, 1], args[:, 3], args[:, 4] = m[q], kk[q], n[q]
    return TaskGraph(kinds=(kd,), kind=np.zeros(len(q), np.int8), problem=q, args=args,
                     rows=m[q], cols=kk[q], width=n[q], edges=np.zeros((0, 2), np.int64),
                     k=len(m), chains=(np.arange(len(q), dtype=np.int64),
                                       np.ones(len(q), np.int64)))


def pair_graph(k1: TaskKind, k2: TaskKind, m: np.ndarray, n: np.ndarray,
               kk: np.ndarray, first: tuple | None = None) -> TaskGraph:
    """Two tasks per non-empty problem, ``(0, m, 0, kk, n)`` of ``k1`` then of ``k2``, the
    second after the first (SYR2K's two products into one triangle). ``first``: the first
    task's own ``(m, n, kk)`` (SYMM's symmetric copy, then its GEMM)."""
    m, n, kk = (np.asarray(x, dtype=np.int64) for x in (m, n, kk))
    q = np.flatnonzero((m > 0) & (n > 0))
    args = np.zeros((2 * len(q), len(ARGS)), dtype=np.int64)
    args[:, 1], args[:, 3], args[:, 4] = np.repeat(m[q], 2), np.repeat(kk[q], 2), \
        np.repeat(n[q], 2)
    if first is not None:
        args[0::2, 1], args[0::2, 4], args[0::2, 3] = (np.asarray(x, np.int64)[q] for x in first)
    first = np.arange(0, 2 * len(q), 2, dtype=np.int64)
    cnt = np.full(len(q), 2, np.int64)
    return TaskGraph(kinds=(k1, k2), kind=np.tile(np.array([0, 1], np.int8), len(q)),
                     problem=np.repeat(q, 2), args=args, rows=args[:, 1].copy(),
                     cols=args[:, 3].copy(), width=args[:, 4].copy(),
                     edges=np.stack([first, first + 1], axis=1), k=len(m),
                     chains=(first, cnt))


# ----------------------------------------------------------------------------- requests
class _Request(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")


# alpha, beta: a float, or a complex for complex operands (checked by the request's validator)
Number = Any


def _shape(b: Any, trans: bool | str = False) -> tuple[np.ndarray, np.ndarray]:
    return (b.n, b.m) if trans else (b.m, b.n)


def _written(overwrite: bool, **targets) -> None:
    if overwrite:
        problems = []
        for name, b in targets.items():
            problems += writable(b, name)
        if problems:
            raise InputError(problems)


def _parsed(cls, v: dict, scalars: tuple[str, ...] = (), flags: tuple[str, ...] = (),
            trans: tuple[str, ...] = ()) -> dict:
    """A request's fields with its scalars checked finite, its flags checked bool and its
    ``trans`` fields read as False, True or "C" (:func:`~vbatch.ops.operands.transpose`), in that
    order (a field not given takes the request's default)."""
    v = dict(v)
    for name in scalars:
        v[name] = finite_scalar(v.get(name, cls.model_fields[name].default), name)
    for name in flags:
        v[name] = flag(v.get(name, cls.model_fields[name].default), name)
    for name in trans:
        v[name] = transpose(v.get(name, cls.model_fields[name].default), name)
    return v


def _typed(v: dict, dtype, scalars: tuple[str, ...] = (), trans: tuple[str, ...] = (),
           real: tuple[str, ...] = ()) -> None:
    """Once the operands' dtype is known: complex scalars only for complex operands (and
    never those named ``real``), and "C" is "T" for real ones."""
    fit_scalars(v, dtype, scalars, real)
    fit_trans(v, dtype, trans)


def _output_into(v: dict, c: Any) -> None:
    """The rules of an op whose output replaces ``c`` or, without it, is new: beta needs c,
    overwrite needs c, and a c to overwrite must be writable."""
    if c is None:
        if v["beta"] != 0.0:
            raise InputError([(None, f"beta = {v['beta']} needs c (c is None)")])
        if v["overwrite"]:
            raise InputError([(None, "overwrite=True needs c: the output is written into c")])
    _written(v["overwrite"], c=c)


class GemmRequest(_Request):
    """``C := alpha op(A) op(B) + beta C``; ``c=None``: a new ``m x n`` output (``beta``
    must then be 0)."""

    a: Any
    b: Any
    c: Any = None
    alpha: Number = 1.0
    beta: Number = 0.0
    trans_a: bool | str = False
    trans_b: bool | str = False
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, ("alpha", "beta"), ("overwrite",), ("trans_a", "trans_b"))
        a, b = operand(v.get("a"), "a"), operand(v.get("b"), "b")
        c = None if v.get("c") is None else operand(v["c"], "c")
        together(a=a, b=b, c=c)
        _typed(v, a.dtype, ("alpha", "beta"), ("trans_a", "trans_b"))
        ma, ka = _shape(a, v["trans_a"])
        kb, nb_ = _shape(b, v["trans_b"])
        checks = [(ka != kb, lambda i: f"inner dimensions differ: op(a) is {ma[i]} x {ka[i]}, "
                                       f"op(b) is {kb[i]} x {nb_[i]}")]
        if c is not None:
            checks.append(((c.m != ma) | (c.n != nb_),
                           lambda i: f"c is {c.m[i]} x {c.n[i]} but op(a) op(b) is "
                                     f"{ma[i]} x {nb_[i]}"))
        shape_rule(checks)
        _output_into(v, c)
        v.update(a=a, b=b, c=c)
        return v

    def sizes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, k = _shape(self.a, self.trans_a)
        return m, _shape(self.b, self.trans_b)[1], k


class SyrkRequest(_Request):
    """``C := alpha op(A) op(A)^T + beta C`` on one triangle of C (``lower``); op(A) is
    ``A`` (n x k) or, with ``trans``, ``A^T``. ``c=None``: a new output, zero in the other
    triangle. HERK (:class:`HerkRequest`): ``^H`` for ``^T``, alpha and beta real."""

    # The conjugate bit of the views HERK and HER2K transpose (ops/operands.py view_flag).
    conj: ClassVar[int] = 0
    a: Any
    c: Any = None
    alpha: Number = 1.0
    beta: Number = 0.0
    trans: bool = False
    lower: bool = True
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, ("alpha", "beta"), ("trans", "lower", "overwrite"))
        a = operand(v.get("a"), "a")
        c = None if v.get("c") is None else operand(v["c"], "c", square=True)
        together(a=a, c=c)
        _typed(v, a.dtype, ("alpha", "beta"), real=("alpha", "beta") if cls.conj else ())
        n, _ = _shape(a, v["trans"])
        if c is not None:
            shape_rule([(c.n != n, lambda i: f"c is {c.m[i]} x {c.n[i]} but op(a) has "
                                             f"{n[i]} rows")])
        _output_into(v, c)
        v.update(a=a, c=c)
        return v


class Syr2kRequest(_Request):
    """``C := alpha (op(A) op(B)^T + op(B) op(A)^T) + beta C`` on one triangle of C
    (``lower``); op(X) is ``X`` (n x k) or, with ``trans``, ``X^T``. ``c=None``: a new output,
    zero in the other triangle. HER2K (:class:`Her2kRequest`): ``alpha op(A) op(B)^H +
    conj(alpha) op(B) op(A)^H + beta C``, beta real."""

    conj: ClassVar[int] = 0
    a: Any
    b: Any
    c: Any = None
    alpha: Number = 1.0
    beta: Number = 0.0
    trans: bool = False
    lower: bool = True
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, ("alpha", "beta"), ("trans", "lower", "overwrite"))
        a, b = operand(v.get("a"), "a"), operand(v.get("b"), "b")
        c = None if v.get("c") is None else operand(v["c"], "c", square=True)
        together(a=a, b=b, c=c)
        _typed(v, a.dtype, ("alpha", "beta"), real=("beta",) if cls.conj else ())
        n, k = _shape(a, v["trans"])
        nb_, kb = _shape(b, v["trans"])
        checks = [((nb_ != n) | (kb != k),
                   lambda i: f"op(a) is {n[i]} x {k[i]} but op(b) is {nb_[i]} x {kb[i]} "
                             "(they must match)")]
        if c is not None:
            checks.append((c.n != n, lambda i: f"c is {c.m[i]} x {c.n[i]} but op(a) has "
                                               f"{n[i]} rows"))
        shape_rule(checks)
        _output_into(v, c)
        v.update(a=a, b=b, c=c)
        return v


class HerkRequest(SyrkRequest):
    conj: ClassVar[int] = 2


class Her2kRequest(Syr2kRequest):
    conj: ClassVar[int] = 2


class TriangularRequest(_Request):
    """``trsm``: ``op(A) X = alpha B`` (``side="left"``) or ``X op(A) = alpha B``; ``trmm``:
    ``X = alpha op(A) B`` or ``alpha B op(A)``. A is triangular (``lower`` or upper), read in
    that triangle only; ``unit_diagonal``: its diagonal is taken as ones, not read."""

    a: Any
    b: Any
    alpha: Number = 1.0
    side: str = "left"
    lower: bool = True
    trans_a: bool | str = False
    unit_diagonal: bool = False
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, ("alpha",))
        v["side"] = choice(v.get("side", "left"), "side", ("left", "right"))
        v = _parsed(cls, v, (), ("lower", "unit_diagonal", "overwrite"), ("trans_a",))
        a = operand(v.get("a"), "a", square=True)
        left = v["side"] == "left"
        b = operand(v.get("b"), "b", vectors="column" if left else "row")
        together(a=a, b=b)
        _typed(v, a.dtype, ("alpha",), ("trans_a",))
        need = b.m if left else b.n
        shape_rule([(a.n != need, lambda i: f"a is {a.n[i]} x {a.n[i]} but b is {b.m[i]} x "
                                            f"{b.n[i]} (side={v['side']!r} needs a of order "
                                            f"{need[i]})")])
        _written(v["overwrite"], b=b)
        v.update(a=a, b=b)
        return v

    def views(self) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """``(m, n, tt, tx, lower)`` of the left-side form: the triangle's order, the
        right-hand sides, and the triangle's and the right-hand sides' views (transposed,
        conjugated: ops/operands.py view_flag); ``lower``: the view's triangle. ``X op(A) = B`` is
        ``op(A)^T X^T = B^T``: op(A)^T is A's view transposed once more."""
        left = self.side == "left"
        tt = view_flag(self.trans_a) ^ (0 if left else 1)
        lower = int(self.lower != bool(tt & 1))
        if left:
            return self.b.m, self.b.n, tt, 0, lower
        return self.b.n, self.b.m, tt, 1, lower


def _system(v: dict, t: str, written: tuple[str, ...]) -> tuple:
    """A solve's operands: square ``v[t]`` and right-hand sides ``v["b"]`` of as many rows (a
    1-D array is one column), checked together; under ``overwrite`` the fields ``written``
    must be writable."""
    a = operand(v.get(t), t, square=True)
    b = operand(v.get("b"), "b", vectors="column")
    together(**{t: a, "b": b})
    shape_rule([(a.n != b.m, lambda i: f"{t} is {a.n[i]} x {a.n[i]} but b has {b.m[i]} rows")])
    _written(v["overwrite"], **{n: x for n, x in ((t, a), ("b", b)) if n in written})
    return a, b


class PotrsRequest(_Request):
    """``A X = B`` with ``A = L L^H`` given by its Cholesky factor ``l`` (lower triangle read);
    each problem has its own number of right-hand sides (0 allowed)."""

    l: Any  # noqa: E741 - LAPACK's name
    b: Any
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, (), ("overwrite",))
        v["l"], v["b"] = _system(v, "l", ("b",))
        return v


# ----------------------------------------------------------------------------- graphs
def gemm_graph(req: GemmRequest, opts: dict) -> TaskGraph:
    m, n, k = req.sizes()
    has_c = req.c is not None
    c, beta = ("c", "beta") if has_c else ("", "zero")
    ta, tb = view_flag(req.trans_a), view_flag(req.trans_b)
    out = staged_order(req.c) if has_c else (req.a.order if isinstance(req.a, PackedBatch)
                                             else "C")  # (a new output: Runtime._new_buffer)
    kd = gemm_kind("a", "b", c, "out", ta, tb, 0, "alpha", beta)
    if rows_wise(req.a, ta) + rows_wise(req.b, tb) + (out == "C") >= 2:
        # O^T = op(B)^T op(A)^T over the same buffers reads each view the other way round: a
        # row-major call runs the column-major kernels (docs/decisions.md#row-major-gemm).
        return single_graph(transposed(kd), n, m, k)
    return single_graph(kd, m, n, k)


def _rank_k_views(req) -> tuple[int, int]:
    """The views of op(A) and op(A)^T (HERK, HER2K: ^H) on A's buffer."""
    t = int(req.trans)
    return t | (type(req).conj if t else 0), (1 - t) | (0 if t else type(req).conj)


def syrk_graph(req: SyrkRequest, opts: dict) -> TaskGraph:
    n, k = _shape(req.a, req.trans)
    ta, tb = _rank_k_views(req)
    kd = gemm_kind("a", "a", "c" if req.c is not None else "", "out", ta, tb, 0, "alpha",
                   "beta" if req.c is not None else "zero", uplo="lower" if req.lower else "upper")
    return single_graph(kd, n, n, k)


def syr2k_graph(req: Syr2kRequest, opts: dict) -> TaskGraph:
    """Two GEMM tasks per problem on the named triangle of the output: ``alpha A B^T + beta C``,
    then ``alpha B A^T`` added in place."""
    n, k = _shape(req.a, req.trans)
    has_c = req.c is not None
    uplo = "lower" if req.lower else "upper"
    ta, tb = _rank_k_views(req)
    first = gemm_kind("a", "b", "c" if has_c else "", "out", ta, tb, 0, "alpha",
                      "beta" if has_c else "zero", uplo=uplo)
    # (HER2K's second product takes conj(alpha); the same for real operands)
    second = gemm_kind("b", "a", "out", "out", ta, tb, 0,
                       "conj_alpha" if type(req).conj and req.a.dtype.kind == "c" else "alpha",
                       "one", uplo=uplo)
    return pair_graph(first, second, n, n, k)


def triangular_graph(req: TriangularRequest, opts: dict, solve: bool) -> TaskGraph:
    m, n, tt, tx, lower = req.views()
    which = TRSM if solve else TRMM
    d = diag_kind(which, "a", "x", tt, tx, lower, req.unit_diagonal, src="b", scale="alpha")
    if solve:  # X2 := alpha B2 - T21 X1 where X2 is fresh (the task's src), else X2 - T21 X1
        g = gemm_kind("a", "x", "x", "x", tt, tx, tx, "minus", "one", src="b", scale="alpha")
    else:  # X1 += alpha T12 B2: a product's join reads the half no step has written yet
        g = gemm_kind("a", "b", "x", "x", tt, tx, tx, "alpha", "one")
    # (X, the output, is laid out as B: it replaces B, or is a new buffer of B's layout)
    return chain_graph(m, n, [(d, g, bool(lower), solve)], int(opts["blas_nb"]),
                       int(opts.get("blas_whole_rhs", 0)), swap=rows_wise(req.b, tx))


def potrs_phases(t: str, x: str, src: str, skip_failed: int = 0) -> list[tuple]:
    """``L Y = B`` forward, then ``L^H X = Y`` backward (the lower triangle of ``t`` read
    both times: ``L^H``'s upper triangle is L's lower one, through a view transposed and
    conjugated, which real operands read as ``L^T``); the
    forward solve reads B from ``src``. ``skip_failed``: the solve leaves alone the problems
    whose factorization failed earlier in the same plan (POSV), which keep B as X."""
    sf = int(skip_failed)
    fwd = (diag_kind(TRSM, t, x, 0, 0, 1, 0, sf, src=src),
           gemm_kind(t, x, x, x, 0, 0, 0, "minus", "one", skip_failed=sf, src=src), True, True)
    bwd = (diag_kind(TRSM, t, x, 3, 0, 0, 0, sf), gemm_kind(t, x, x, x, 3, 0, 0, "minus", "one",
                                                            skip_failed=sf), False, True)
    return [fwd, bwd]


def potrs_graph(req: PotrsRequest, opts: dict) -> TaskGraph:
    return chain_graph(req.b.m, req.b.n, potrs_phases("l", "x", "b"), int(opts["blas_nb"]),
                       int(opts.get("blas_whole_rhs", 0)), swap=rows_wise(req.b, 0))


# ----------------------------------------------------------------------------- references
def view(x: np.ndarray, t: Any) -> np.ndarray:
    """``x`` as a view flag (:func:`~vbatch.ops.operands.view_flag`) or a trans-like value
    says: as is, transposed, conjugate transposed."""
    t = t if type(t) is int else view_flag(transpose(t, "trans"))
    x = x.T if t & 1 else x
    return x.conj() if t & 2 else x


def gemm_reference(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False):
    out = alpha * (view(wide(a), trans_a) @ view(wide(b), trans_b))
    if c is not None and beta != 0.0:
        out = out + beta * wide(c)
    return out


def _in_triangle(full, c, beta, lower, herm=False):
    """``full + beta C`` in one triangle, C's (zeros without C) in the other; ``herm``: the
    diagonal's imaginary parts 0 (BLAS's HERK and HER2K)."""
    n = full.shape[0]
    cc = np.zeros((n, n), full.dtype) if c is None else wide(c)
    full = full + (beta * cc if beta != 0.0 else 0.0)
    if herm and full.dtype.kind == "c":
        full[np.diag_indices(n)] = full.diagonal().real
    tri = np.tril if lower else np.triu
    other = np.triu(cc, 1) if lower else np.tril(cc, -1)
    return tri(full) + other


def syrk_reference(a, c=None, alpha=1.0, beta=0.0, trans=False, lower=True, herm=False):
    """The whole output: the named triangle updated, the other one C's (zeros without C);
    ``herm``: HERK's (``^H`` for ``^T``)."""
    h = 2 if herm else 0
    A = view(wide(a), int(trans) * (1 | h))
    return _in_triangle(alpha * (A @ view(A, 1 | h)), c, beta, lower, herm)


def syr2k_reference(a, b, c=None, alpha=1.0, beta=0.0, trans=False, lower=True, herm=False):
    """The whole output: the named triangle updated, the other one C's (zeros without C);
    ``herm``: HER2K's."""
    h = 2 if herm else 0
    A, B = (view(wide(x), int(trans) * (1 | h)) for x in (a, b))
    other = np.conj(alpha) if herm else alpha
    return _in_triangle(alpha * (A @ view(B, 1 | h)) + other * (B @ view(A, 1 | h)), c, beta,
                        lower, herm)


def triangle(a, lower=True, unit=False):
    """The triangle a triangular op reads, as a dense double-precision matrix."""
    a = wide(a)
    t = np.tril(a) if lower else np.triu(a)
    if unit:
        np.fill_diagonal(t, 1.0)
    return t


def trsm_reference(a, b, alpha=1.0, side="left", lower=True, trans_a=False,
                   unit_diagonal=False):
    from scipy.linalg import solve_triangular

    t = triangle(a, lower, unit_diagonal)
    b = alpha * wide(b)
    if t.shape[0] == 0 or b.size == 0:
        return b
    ta = view_flag(transpose(trans_a, "trans_a"))
    if side == "left":
        return solve_triangular(t, b, lower=lower, trans=ta - ta // 3,
                                unit_diagonal=unit_diagonal, check_finite=False)
    # X op(T) = B  <=>  op(T)^T X^T = B^T, op(T)^T = view(T, ta ^ 1)
    return solve_triangular(view(t, ta ^ 1), b.T, lower=lower == bool(ta & 1),
                            unit_diagonal=unit_diagonal, check_finite=False).T


def trmm_reference(a, b, alpha=1.0, side="left", lower=True, trans_a=False,
                   unit_diagonal=False):
    op = view(triangle(a, lower, unit_diagonal), trans_a)
    b = alpha * wide(b)
    return op @ b if side == "left" else b @ op


def potrs_reference(l, b):  # noqa: E741 - LAPACK's name
    from scipy.linalg import solve_triangular

    t = np.tril(wide(l))
    b = wide(b)
    if t.shape[0] == 0 or b.size == 0:
        return b.copy()
    y = solve_triangular(t, b, lower=True, check_finite=False)
    return solve_triangular(t, y, lower=True, trans=2, check_finite=False)


def _sig(*fields):
    def sig(req) -> tuple:
        out = []
        for f in fields:
            v = getattr(req, f)
            if isinstance(v, (PackedBatch, MatrixList)):
                out += [v.m.tobytes(), v.n.tobytes()]
            elif v is None:
                out.append(None)
            else:
                out.append(v)
        return tuple(out)

    return sig


def _first(outs: dict, info, plan):
    (value,) = outs.values()
    return value


def _scalars(req) -> dict:
    return {"alpha": getattr(req, "alpha", 1.0), "beta": getattr(req, "beta", 0.0)}


# ----------------------------------------------------------------------------- examples
# Each op's problems for the conformance suite (vbatch.ops.op.Example): square operands, so
# that every parameter value fits the same shapes.
def _each(fn, *fields):
    """The reference of a one-output op: ``fn`` per problem over ``fields``' operands."""
    return lambda o, p: [[fn(*xs, **p) for xs in zip(*(o[f] for f in fields))]]


def _one(result):
    return [result]


def _complex(dtype) -> bool:
    return np.dtype(dtype).kind == "c"


def gemm_example(rng, sizes, dtype=np.float64) -> Example:
    ops = {f: square(rng, sizes, dtype) for f in ("a", "b", "c")}
    params = flips(["trans_a", "trans_b"], {"alpha": 1.0, "beta": 0.5}) + \
        [{"alpha": -2.0, "beta": 0.5}]
    if _complex(dtype):  # the conjugate transposes, complex scalars
        params += [{"alpha": 1 - 2j, "beta": 0.5j, "trans_a": "C"},
                   {"alpha": 1.0, "beta": 0.5, "trans_a": "C", "trans_b": "C"},
                   {"alpha": 2j, "beta": 0.5, "trans_a": True, "trans_b": "C"}]
    return Example(ops, params, _each(gemm_reference, "a", "b", "c"), _one, "c", "c", "beta")


def _rank_k_example(fn, two: bool, herm: bool = False):
    fields = ("a", "b", "c") if two else ("a", "c")

    def example(rng, sizes, dtype=np.float64) -> Example:
        ops = {f: square(rng, sizes, dtype) for f in fields}
        params = flips(["trans", "lower"], {"alpha": 1.0, "beta": 0.5})
        if _complex(dtype):  # complex scalars where the op takes them
            params.append(dict(params[-1], alpha=0.5 - 1j if two or not herm else -0.5,
                               beta=-0.5 if herm else 0.5 + 0.5j))
        ref = _each(fn, *fields)
        if herm:
            ref = _each(lambda *xs, **p: fn(*xs, **p, herm=True), *fields)
        return Example(ops, params, ref, _one, "c", "c", "beta")

    return example


def _triangular_example(fn):
    def example(rng, sizes, dtype=np.float64) -> Example:
        ops = {"a": triangular(rng, sizes, dtype), "b": square(rng, sizes, dtype)}
        params = flips(["lower", "trans_a", "unit_diagonal"], {"alpha": 1.5, "side": "left"})
        params.append(dict(params[-1], side="right"))
        if _complex(dtype):  # the conjugate transpose, either side; a complex alpha
            params += [dict(params[-1], trans_a="C", alpha=1 + 1j),
                       dict(params[-1], trans_a="C", side="left", lower=False)]
        return Example(ops, params, _each(fn, "a", "b"), _one, "b", "b", "alpha")

    return example


def potrs_example(rng, sizes, dtype=np.float64) -> Example:
    ops = {"l": [np.linalg.cholesky(x) for x in spd_list(sizes, dtype, rng)],
           "b": square(rng, sizes, dtype)}
    return Example(ops, [{}], _each(potrs_reference, "l", "b"), _one, "b")


# ----------------------------------------------------------------------------- the public calls
# Signatures and docstrings only: Runtime methods and module functions are made from them
# (vbatch.ops.op.caller). Keyword names as scipy.linalg.blas / lapack.
def gemm(a: Any, b: Any, c: Any = None, *, alpha: float | complex = 1.0,
         beta: float | complex = 0.0, trans_a: bool | str = False, trans_b: bool | str = False):
    """``C := alpha op(A) op(B) + beta C`` per problem; ``op``: as is (False, "N"),
    transposed (True, "T") or conjugate transposed ("C"). ``c=None``: a new output (``beta``
    must be 0). ``result()``: the outputs, in the form of ``c`` (or ``a``)."""


def syrk(a: Any, c: Any = None, *, alpha: float | complex = 1.0, beta: float | complex = 0.0,
         trans: bool = False,
         lower: bool = True):
    """``C := alpha op(A) op(A)^T + beta C`` in one triangle of C (the other is C's, or zeros
    for a new output); op(A) is A (n x k) or, with ``trans``, A^T."""


def syr2k(a: Any, b: Any, c: Any = None, *, alpha: float | complex = 1.0,
          beta: float | complex = 0.0, trans: bool = False, lower: bool = True):
    """``C := alpha (op(A) op(B)^T + op(B) op(A)^T) + beta C`` in one triangle of C (the
    other is C's, or zeros for a new output)."""


def herk(a: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0, trans: bool = False,
         lower: bool = True):
    """``C := alpha op(A) op(A)^H + beta C`` in one triangle of C (the other is C's, or zeros
    for a new output), alpha and beta real, the diagonal's imaginary parts set to 0 (as BLAS's
    ``zherk``); op(A) is A (n x k) or, with ``trans``, A^H. Real operands: :func:`syrk`."""


def her2k(a: Any, b: Any, c: Any = None, *, alpha: float | complex = 1.0, beta: float = 0.0,
          trans: bool = False, lower: bool = True):
    """``C := alpha op(A) op(B)^H + conj(alpha) op(B) op(A)^H + beta C`` in one triangle of
    C, beta real, the diagonal's imaginary parts set to 0 (as BLAS's ``zher2k``); op(X) is X
    or, with ``trans``, X^H. Real operands: :func:`syr2k`."""


def trsm(a: Any, b: Any, *, alpha: float | complex = 1.0, side: str = "left",
         lower: bool = True, trans_a: bool | str = False, unit_diagonal: bool = False):
    """Solve ``op(A) X = alpha B`` (``side="left"``) or ``X op(A) = alpha B`` for X, A
    triangular (``lower`` or upper, that triangle read; ``unit_diagonal``: ones taken, not
    read; ``op`` as :func:`gemm`'s). A 1-D right-hand side is a column (left) or a row
    (right). ``result()``: X, in the form of ``b``."""


def trmm(a: Any, b: Any, *, alpha: float | complex = 1.0, side: str = "left",
         lower: bool = True, trans_a: bool | str = False, unit_diagonal: bool = False):
    """``X = alpha op(A) B`` (``side="left"``) or ``alpha B op(A)``, A triangular as for
    :func:`trsm`. ``result()``: X, in the form of ``b``."""


def potrs(l: Any, b: Any):  # noqa: E741 - LAPACK's name
    """Solve ``A X = B`` given the Cholesky factors ``l`` of A (lower triangles read), each
    problem with its own number of right-hand sides (a 1-D ``b`` is one). ``result()``: X, in
    the form of ``b``."""


GEMM_OP = register_op(Op(
    name="gemm", api=gemm, example=gemm_example, request=GemmRequest,
    buffers=(Buffer("a", "a"), Buffer("b", "b"), Buffer("c", "c"),
             Buffer("out", "c", output=True, shape=lambda r: r.sizes()[:2], form="a",
                    complete=True)),
    graph=gemm_graph, signature=_sig("a", "b", "c", "trans_a", "trans_b"), result=_first,
    scalars=_scalars, families=(FAMILY,), doc="C := alpha op(A) op(B) + beta C",
))
SYRK_OP = register_op(Op(
    name="syrk", api=syrk, example=_rank_k_example(syrk_reference, False), request=SyrkRequest,
    buffers=(Buffer("a", "a"), Buffer("c", "c"),
             Buffer("out", "c", output=True, shape=lambda r: (_shape(r.a, r.trans)[0],) * 2,
                    form="a", complete=True)),
    graph=syrk_graph, signature=_sig("a", "c", "trans", "lower"), result=_first,
    scalars=_scalars, families=(FAMILY,), doc="C := alpha op(A) op(A)^T + beta C, one triangle",
))
SYR2K_OP = register_op(Op(
    name="syr2k", api=syr2k, example=_rank_k_example(syr2k_reference, True), request=Syr2kRequest,
    buffers=(Buffer("a", "a"), Buffer("b", "b"), Buffer("c", "c"),
             Buffer("out", "c", output=True, shape=lambda r: (_shape(r.a, r.trans)[0],) * 2,
                    form="a", complete=True)),
    graph=syr2k_graph, signature=_sig("a", "b", "c", "trans", "lower"), result=_first,
    scalars=_scalars, families=(FAMILY,),
    doc="C := alpha (op(A) op(B)^T + op(B) op(A)^T) + beta C, one triangle",
))
HERK_OP = register_op(Op(
    name="herk", api=herk, example=_rank_k_example(syrk_reference, False, True),
    request=HerkRequest, buffers=SYRK_OP.buffers, graph=syrk_graph,
    signature=SYRK_OP.signature, result=_first, scalars=_scalars, families=(FAMILY,),
    doc="C := alpha op(A) op(A)^H + beta C, one triangle",
))
HER2K_OP = register_op(Op(
    name="her2k", api=her2k, example=_rank_k_example(syr2k_reference, True, True),
    request=Her2kRequest, buffers=SYR2K_OP.buffers, graph=syr2k_graph,
    signature=SYR2K_OP.signature, result=_first, scalars=_scalars, families=(FAMILY,),
    doc="C := alpha op(A) op(B)^H + conj(alpha) op(B) op(A)^H + beta C, one triangle",
))
TRSM_OP = register_op(Op(
    name="trsm", api=trsm, example=_triangular_example(trsm_reference), request=TriangularRequest,
    buffers=(Buffer("a", "a"), Buffer("b", "b"), Buffer("x", "b", output=True)),
    graph=lambda r, o: triangular_graph(r, o, True),
    signature=_sig("a", "b", "side", "lower", "trans_a", "unit_diagonal"), result=_first,
    scalars=_scalars, families=(FAMILY,), doc="op(A) X = alpha B or X op(A) = alpha B",
))
TRMM_OP = register_op(Op(
    name="trmm", api=trmm, example=_triangular_example(trmm_reference), request=TriangularRequest,
    buffers=(Buffer("a", "a"), Buffer("b", "b"), Buffer("x", "b", output=True)),
    graph=lambda r, o: triangular_graph(r, o, False),
    signature=_sig("a", "b", "side", "lower", "trans_a", "unit_diagonal"), result=_first,
    scalars=_scalars, families=(FAMILY,), doc="X = alpha op(A) B or alpha B op(A)",
))
POTRS_OP = register_op(Op(
    name="potrs", api=potrs, example=potrs_example, request=PotrsRequest,
    buffers=(Buffer("l", "l"), Buffer("b", "b"), Buffer("x", "b", output=True)),
    graph=potrs_graph, signature=_sig("l", "b"), result=_first, scalars=_scalars,
    families=(FAMILY,), doc="A X = B from the Cholesky factor L of A",
))


# ----------------------------------------------------------------------------- symm
class SymmRequest(_Request):
    """``C := alpha A B + beta C`` (``side="left"``) or ``alpha B A + beta C``, A symmetric,
    only its ``lower`` (or upper) triangle read. ``c=None``: a new output of B's shape
    (``beta`` must then be 0)."""

    conj: ClassVar[int] = 0  # HEMM (HemmRequest): A Hermitian
    a: Any
    b: Any
    c: Any = None
    alpha: Number = 1.0
    beta: Number = 0.0
    side: str = "left"
    lower: bool = True
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, ("alpha", "beta"))
        v["side"] = choice(v.get("side", "left"), "side", ("left", "right"))
        v = _parsed(cls, v, (), ("lower", "overwrite"))
        a = operand(v.get("a"), "a", square=True)
        b = operand(v.get("b"), "b")
        c = None if v.get("c") is None else operand(v["c"], "c")
        together(a=a, b=b, c=c)
        _typed(v, a.dtype, ("alpha", "beta"))
        need = b.m if v["side"] == "left" else b.n
        checks = [(a.n != need, lambda i: f"a is {a.n[i]} x {a.n[i]} but b is {b.m[i]} x "
                                          f"{b.n[i]} (side={v['side']!r} needs a of order "
                                          f"{need[i]})")]
        if c is not None:
            checks.append(((c.m != b.m) | (c.n != b.n),
                           lambda i: f"c is {c.m[i]} x {c.n[i]} but b is {b.m[i]} x {b.n[i]}"))
        shape_rule(checks)
        _output_into(v, c)
        v.update(a=a, b=b, c=c)
        return v


def symm_graph(req: SymmRequest, opts: dict) -> TaskGraph:
    """Per problem: A's triangle mirrored into a scratch buffer (a copy, memory-bound), then
    one GEMM on it, which takes the GEMM kernels' speed (docs/decisions.md#symm)."""
    has_c = req.c is not None
    m, n = req.b.m, req.b.n
    order = req.a.n
    full = copy_kind("a", "s", type(req).conj, "one", sym="lower" if req.lower else "upper")
    x, y = ("s", "b") if req.side == "left" else ("b", "s")
    g = gemm_kind(x, y, "c" if has_c else "", "out", 0, 0, 0, "alpha",
                  "beta" if has_c else "zero")
    return pair_graph(full, g, m, n, order, first=(order, order, order))


def symm_reference(a, b, c=None, alpha=1.0, beta=0.0, side="left", lower=True, herm=False):
    """``herm``: HEMM's (A Hermitian: the mirrored half conjugated, the diagonal real)."""
    a = wide(a)
    tri = np.tril if lower else np.triu
    full = tri(a) + view(tri(a, -1 if lower else 1), 3 if herm else 1)
    if herm and a.dtype.kind == "c":
        full[np.diag_indices(a.shape[0])] = full.diagonal().real
    b = wide(b)
    out = alpha * (full @ b if side == "left" else b @ full)
    if c is not None and beta != 0.0:
        out = out + beta * wide(c)
    return out


def symm(a: Any, b: Any, c: Any = None, *, alpha: float | complex = 1.0,
         beta: float | complex = 0.0, side: str = "left", lower: bool = True):
    """``C := alpha A B + beta C`` (``side="left"``) or ``alpha B A + beta C`` per problem,
    A symmetric with only its ``lower`` (or upper) triangle read, as SciPy's ``dsymm``.
    ``c=None``: a new output (``beta`` must be 0). ``result()``: the outputs, in the form of
    ``c`` (or ``b``)."""


def hemm(a: Any, b: Any, c: Any = None, *, alpha: float | complex = 1.0,
         beta: float | complex = 0.0, side: str = "left", lower: bool = True):
    """:func:`symm` with A Hermitian: its ``lower`` (or upper) triangle read, the other one
    its conjugate transpose, the diagonal's imaginary parts taken as 0 (as BLAS's ``zhemm``).
    Real operands: :func:`symm`."""


class HemmRequest(SymmRequest):
    conj: ClassVar[int] = 2


def _symm_example(herm: bool):
    def example(rng, sizes, dtype=np.float64) -> Example:
        ops = {f: square(rng, sizes, dtype) for f in ("a", "b", "c")}
        params = flips(["lower"], {"alpha": 1.5, "beta": 0.5, "side": "left"})
        params.append(dict(params[-1], side="right"))
        if _complex(dtype):
            params.append(dict(params[-1], alpha=1 - 1j, beta=0.5j))
        return Example(ops, params, _each(lambda *xs, **p: symm_reference(*xs, **p, herm=herm),
                                          "a", "b", "c"), _one, "c", "c", "beta")

    return example


SYMM_OP = register_op(Op(
    name="symm", api=symm, example=_symm_example(False), request=SymmRequest,
    buffers=(Buffer("a", "a"), Buffer("b", "b"), Buffer("c", "c"),
             Buffer("s", None, output=True, scratch=True, form="a", complete=True,
                    shape=lambda r: (r.a.n, r.a.n)),
             Buffer("out", "c", output=True, shape=lambda r: (r.b.m, r.b.n), form="b",
                    complete=True)),
    graph=symm_graph, signature=_sig("a", "b", "c", "side", "lower"), result=_first,
    scalars=_scalars, families=(FAMILY,), doc="C := alpha A B + beta C, A symmetric",
))
HEMM_OP = register_op(Op(
    name="hemm", api=hemm, example=_symm_example(True), request=HemmRequest,
    buffers=SYMM_OP.buffers, graph=symm_graph, signature=SYMM_OP.signature, result=_first,
    scalars=_scalars, families=(FAMILY,), doc="C := alpha A B + beta C, A Hermitian",
))
