"""Batched Cholesky (POTRF), full and partial: the request, its tasks, its reference.

Algorithm: blocked **left-looking** Cholesky with panel width ``nb``. Problem ``i`` has
``S_i = ceil(p_i / nb)`` panel tasks; panel ``s`` works on columns ``[j, j + w)``,
``j = s * nb``, ``w = min(nb, p - j)``, rows ``[j, n)``:

* ``update``  the panel is brought up to date from the already factored columns,
  ``A[j:, j:j+w] -= L[j:, :j] @ L[j:j+w, :j]^T`` (SYRK on the diagonal block, GEMM below it;
  the first panel is copied), and its ``w x w`` diagonal block is factored (unblocked Cholesky);
* ``trsm``    the rows below it are solved: ``L[j+w:, j:j+w] = A[j+w:, j:j+w] L11^-T``.

These are the *launch kinds* of one task kind, ``potrf.panel``: a launch group of panels runs as
one ``fused`` launch (both in one) when its tallest panel has at most ``fused_max_rows`` rows (the
crossover a backend measures), else as the two separated launches in that order (a trsm with no
rows below left out). The diagonal block's factorization was a launch of its own between them;
on CUDA it cost every separated panel a launch of one warp a task (~10 us each, on the critical
path of a sparse factorization's large fronts), so the update's kernels do it.

**Blocked** (``block`` = W > 0, a multiple of ``nb``): a problem with more than
``block_above`` (at least W) columns to factor takes them W at a time (and so does one with
more than ``block_few_above`` where at most ``block_few`` problems have half that many: a few
large problems' panel steps cannot fill the device). Before the panels of block column
``[J, J + W)``, one GEMM (the ``blas`` family's, a SYRK on the diagonal block) brings the
whole block column up to date:
``L[J:, J:J+W] = A[J:, J:J+W] - L[J:, :J] L[J:J+W, :J]^T``; its panels then read it from L and
update only from the columns ``[J, j)`` of their own block column (the panel's third argument
is J). Left-looking at nb = 32 re-reads every factored column at every panel, ~8 flops a byte,
bandwidth-bound on SIMT cores (docs/decisions.md#potrf-blocked); the block update runs at GEMM rate
(float64 on FP64 tensor cores with the default ``fp64_gemm``, float32 on the SIMT GEMM tiles),
and the panels' updates shrink to at most W - nb columns.

**Partial Cholesky** factors only the first ``p`` columns (``npiv``) and leaves the Schur
complement ``A22 - L21 L21^T`` in the trailing ``(n - p) x (n - p)`` block: a multifrontal front
needs exactly this. Left-looking never touches the trailing block during the panels, so one
``potrf.schur`` task (a SYRK with ``k = p``) after the last panel forms it.

The task graph (:func:`potrf_graph`) is arrays: one row per task, each problem's tasks in order
and joined by edges (panel ``s`` before panel ``s + 1``, a block update between the block
columns' panels, the last panel before the schur task).

The output of every form is lower triangular: ``L11`` and ``L21`` in the first ``p`` columns,
the lower triangle of the Schur complement in the trailing block, and zeros above the diagonal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vbatch.core.batch import MatrixList, PackedBatch, Views
from vbatch.ops.blas import ARGS as BLAS_ARGS, gemm_kind
from vbatch.core.errors import InputError
from vbatch.core.kinds import Group, TaskKind, by_rows, register, single
from vbatch.ops.generate import spd_list, unread_diagonal
from vbatch.ops.op import Buffer, Example, Op, wide
from vbatch.ops.op import register as register_op
from vbatch.core.graph import TaskGraph, chain_edges

# Launch kinds (what backends implement).
UPDATE, TRSM, SCHUR = "update", "trsm", "schur"
FUSED = "fused"  # update (with the diagonal block's factorization) + trsm of one panel


def _panel_launches(group: Group, options: dict) -> list[tuple[str, str]]:
    if group.rows.max() <= options["fused_max_rows"]:
        return [(FUSED, "fused")]
    out = [(UPDATE, "separated")]
    if (group.rows - group.width).max() > 0:  # rows below the diagonal block
        out.append((TRSM, "separated"))
    return out


def _panel_flops(args, rows, cols, width):
    m, j, w = (np.asarray(x, dtype=np.float64) for x in (rows, cols, width))
    return (2.0 * m * w * (j - np.asarray(args[:, 2], np.float64)) + w**3 / 3
            + w * w * np.maximum(m - w, 0))


def _panel_traffic(args, rows, cols, width):
    # the factored columns [b, j) of its rows read; the panel (its diagonal block's lower
    # triangle) read and written
    m, j, w = (np.asarray(x, dtype=np.float64) for x in (rows, cols, width))
    return m * (j - np.asarray(args[:, 2], np.float64)) + 2 * (m * w - w * (w - 1) / 2)


PANEL = register(TaskKind(
    name="potrf.panel", op="potrf", args=("j", "w", "b"), window=by_rows,
    launches=_panel_launches, flops=_panel_flops, traffic=_panel_traffic,
    doc="one panel of a left-looking Cholesky: rows = n - j, cols = j (first column), width = w; "
        "b: its block column (the update reads columns [b, j))",
), (FUSED, UPDATE, TRSM))

# A blocked factorization's block update: L[J:, J:J+W] = A[J:, J:J+W] - L[J:, :J] L[J:J+W, :J]^H
# (blas args r0 = J, mm = n - J, k0 = 0, kk = J, nn = W, c0 = J; real operands read ^H as ^T),
# the lower triangle of the diagonal block (what lies above it the panels overwrite with zeros).
# A failed problem is left alone: its later columns are unspecified, and no work is spent on them.
BLOCK_UPDATE = gemm_kind("l", "l", "a", "l", 0, 3, 0, "minus", "one", "lower", skip_failed=1)

SCHUR_KIND = register(TaskKind(
    name="potrf.schur", op="potrf", args=("p", "tr"), window=by_rows, launches=single(SCHUR),
    flops=lambda args, rows, cols, width: np.asarray(rows, np.float64) ** 2 * cols,
    # L21 read; A22's lower triangle read and written
    traffic=lambda args, rows, cols, width: (np.asarray(rows, np.float64)
                                             * (np.asarray(cols) + np.asarray(rows) + 1)),
    doc="the trailing A22 - L21 L21^T of a partial Cholesky: rows = width = n - p, cols = p",
), (SCHUR,))


def potrf_graph(n: Any, npiv: Any = None, nb: int = 32, block: int = 0,
                block_above: int = 0, block_few: int = 0, block_few_above: int = 0) -> TaskGraph:
    """The tasks of a batched (partial) Cholesky, from the sizes alone (module docstring):
    each problem's panels in order, its block updates among them where it factors more than
    ``max(block, block_above)`` columns (``block`` 0: never), then its schur task. A batch in
    which at most ``block_few`` problems (> 0) factor more than half of ``t = max(block,
    block_few_above)`` columns blocks those that factor more than t, where ``block_above`` is
    larger than t: their late panel steps run nearly alone, too few blocks to fill the device,
    where a block update spreads each over many tiles."""
    if block % nb:  # the block updates' positions count whole panels (check_block says so)
        raise ValueError(f"block {block} is not a multiple of nb = {nb}")
    n = np.asarray(n, dtype=np.int64)
    p = n if npiv is None else np.asarray(npiv, dtype=np.int64)
    k = len(n)
    live = n > 0
    steps = np.where(live, -(-p // nb), 0)
    above = max(block, block_above)
    few = max(block, block_few_above)
    if block > 0 and block_few > 0 and few < above \
            and int(np.count_nonzero(live & (p > few // 2))) <= block_few:
        above = few
    blocked = live & (block > 0) & (p > above)
    gemms = np.where(blocked, -(-p // max(block, 1)) - 1, 0)
    schur = live & (p < n)
    cnt = steps + gemms + schur
    first = np.cumsum(cnt) - cnt
    T = int(cnt.sum())
    qs = np.arange(k, dtype=np.int64)
    kind = np.zeros(T, np.int8)
    problem = np.repeat(qs, cnt)
    args = np.zeros((T, len(BLAS_ARGS) if gemms.any() else 3), np.int64)
    rows, cols, width = (np.zeros(T, np.int64) for _ in range(3))
    # Panels: panel s of problem q is its task s + (block updates before it), in block column
    # b = (j // block) * block of a blocked problem.
    pq = np.repeat(qs, steps)
    s = np.arange(len(pq), dtype=np.int64) - np.repeat(np.cumsum(steps) - steps, steps)
    j = s * nb
    bcol = np.where(blocked[pq], j // max(block, 1), 0)
    at = first[pq] + s + bcol
    args[at, 0], args[at, 1], args[at, 2] = j, np.minimum(nb, p[pq] - j), bcol * block
    rows[at], cols[at], width[at] = n[pq] - j, j, args[at, 1]
    # Block updates: the g-th (g >= 1) comes before the first panel of block column g.
    gq = np.repeat(qs, gemms)
    g = 1 + np.arange(len(gq), dtype=np.int64) - np.repeat(np.cumsum(gemms) - gemms, gemms)
    if len(gq):
        at = first[gq] + g * (block // nb) + g - 1
        J = g * block
        kind[at] = 2
        args[at, 0], args[at, 1], args[at, 3] = J, n[gq] - J, J
        args[at, 4], args[at, 5] = np.minimum(block, p[gq] - J), J
        rows[at], cols[at], width[at] = n[gq] - J, J, args[at, 4]
    # Schur tasks: each problem's last.
    sq = np.flatnonzero(schur)
    at = first[sq] + cnt[sq] - 1
    kind[at] = 1
    args[at, 0], args[at, 1] = p[sq], n[sq] - p[sq]
    rows[at], cols[at], width[at] = n[sq] - p[sq], p[sq], n[sq] - p[sq]
    return TaskGraph(
        kinds=(PANEL, SCHUR_KIND, BLOCK_UPDATE) if gemms.any() else (PANEL, SCHUR_KIND),
        kind=kind,
        problem=problem,
        args=args,
        rows=rows,
        cols=cols,
        width=width,
        edges=chain_edges(first, cnt),
        k=k,
        chains=(first, cnt),
    )


def graph_options(opts: dict) -> tuple[int, ...]:
    """``nb``, ``block``, ``block_above``, ``block_few`` and ``block_few_above`` of a plan's
    options (all but nb 0 when unset)."""
    return (int(opts["nb"]), *(int(opts.get(k, 0)) for k in ("block", "block_above",
                                                               "block_few", "block_few_above")))


def check_block(nb: int, block: int) -> None:
    """``block`` is 0 (off) or a multiple of ``nb`` of at least two panels."""
    if block and (block < 2 * nb or block % nb):
        raise InputError([(None, f"block must be 0 or a multiple of nb = {nb} of at least "
                                 f"{2 * nb}, got {block}")], what="runtime options")


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
    """The problems of ``batch`` that ``overwrite=True`` could not write (operands.writable)."""
    from vbatch.ops.operands import writable

    return writable(batch)


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
        if isinstance(v, Views):  # a list an earlier call gave back: its packed batch
            v = v.batch
        if isinstance(v, PackedBatch):
            if not v.square:
                bad = np.flatnonzero(v.m != v.n)
                raise InputError([(int(i), f"not square: {v.m[i]} x {v.n[i]}") for i in bad])
            return v
        if isinstance(v, MatrixList):
            return v
        if isinstance(v, (list, tuple)):
            return MatrixList(mats=v, square=True)
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
            if not n.flags.writeable:  # (a batch's sizes, frozen: no copy of 10^5 entries)
                return n
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
    bad = np.flatnonzero(~(np.asarray(diag).real > 0))
    return int(bad[0]) + 1 if len(bad) else 0


def reference(a: np.ndarray, npiv: int | None = None) -> tuple[np.ndarray, int]:
    """Dense reference for one matrix: ``(factor, info)``, computed in double precision with
    LAPACK (``A = L L^H`` for a complex ``a``, the Hermitian matrix its lower triangle gives).

    ``factor`` holds L11, L21 and the lower triangle of the Schur complement, zeros above the
    diagonal; ``info`` is LAPACK's (0, or the order of the first leading minor that is not
    positive definite, NaN included: :func:`potrf_info`). Only the lower triangle of ``a`` is
    read. On failure the factor's first ``info - 1`` columns are those of the partial
    factorization of that many columns (what vbatch leaves there, every row included), the
    failing pivot ``(info, info)`` (1-based) holds the value LAPACK tested, ``a_jj`` less the
    squares of row ``j`` of L before it, and the rest is zero: the leading ``info x info``
    block is LAPACK's. Non-finite input is taken as LAPACK takes it (an infinite pivot gives
    ``L(i, i) = inf`` and zeros below it, ``info`` unchanged).
    """
    from scipy.linalg import lapack, solve_triangular

    a = wide(a)
    n = a.shape[0]
    p = n if npiv is None else int(npiv)
    sym = hermitian(a)
    out = np.zeros_like(sym)
    if n == 0:
        return out, 0
    potrf = lapack.zpotrf if a.dtype.kind == "c" else lapack.dpotrf

    def columns(k):  # the first k columns of the partial factorization of k columns
        c, info = potrf(np.array(sym[:k, :k], order="F"), lower=True, clean=True)
        info = potrf_info(np.diag(c), info)
        if not info:
            out[:k, :k] = c
            # L21 = A21 L11^-H: L11 L21^H = A21^H = A12
            out[k:, :k] = solve_triangular(c, sym[:k, k:], lower=True,
                                           check_finite=False).conj().T
        return info

    info = columns(p) if p else 0
    if info:
        g = info - 1
        out[:] = 0.0
        columns(g)
        out[g, g] = (sym[g, g] - out[g, :g] @ out[g, :g].conj()).real
        return out, info
    l21 = out[p:, :p]
    out[p:, p:] = np.tril(sym[p:, p:] - l21 @ l21.conj().T)
    return out, 0


def hermitian(a: np.ndarray) -> np.ndarray:
    """The symmetric (complex: Hermitian) matrix whose lower triangle is ``a``'s; a Hermitian
    matrix's diagonal is real, so the imaginary parts there are not read (LAPACK's ZPOTRF)."""
    low = np.tril(a)
    out = low + np.tril(low, -1).conj().T
    if out.dtype.kind == "c":
        out[np.diag_indices(a.shape[0])] = out.diagonal().real
    return out


def residual(a: np.ndarray, factor: np.ndarray, npiv: int | None = None) -> float:
    """Normwise backward error ``||A - L L^H||_F / ||A||_F`` of a (partial) factor, in double
    precision.

    For a partial factor, ``L L^H`` is taken with the trailing block's Schur complement added
    back, so the measure is the same for both. ``NaN`` in the factor gives ``NaN`` (a failure).
    """
    a = wide(a)
    f = wide(factor)
    n = a.shape[0]
    if n == 0:
        return 0.0
    p = n if npiv is None else int(npiv)
    sym = hermitian(a)
    lk = f[:, :p]
    rebuilt = lk @ lk.conj().T
    rebuilt[p:, p:] += hermitian(f[p:, p:])
    den = np.linalg.norm(sym)
    num = np.linalg.norm(sym - rebuilt)
    if den == 0:
        return float(num)
    return float(num / den)


@dataclass(frozen=True)
class CholeskyResult:
    """``factors``: a list (same array kind as the input list) or a :class:`PackedBatch`.
    ``info``: int32 per problem, LAPACK convention (0 = success, j > 0 = leading minor of
    order j not positive definite: columns before j hold the factor, L(j, j) the pivot LAPACK
    tested there, the rest is unspecified; the others are unaffected)."""

    factors: Any
    info: np.ndarray
    plan: Any

    @property
    def ok(self) -> bool:
        return not np.any(self.info)

    def failed(self) -> np.ndarray:
        """Indices of the problems whose factorization failed."""
        return np.flatnonzero(self.info)


def cholesky(mats: Any, npiv: Any = None):
    """Factor a batch, ``A = L L^H`` per problem (``L L^T`` for real ``A``; a complex ``A`` is
    Hermitian, its diagonal's imaginary parts not read): ``mats`` is a list of square arrays or a
    :class:`~vbatch.PackedBatch`. ``npiv`` factors only the first ``npiv[i]`` columns of
    problem ``i`` and leaves the Schur complement in the trailing block. ``result()``: a
    :class:`~vbatch.CholeskyResult`; a problem whose factorization fails at column j gets
    ``info = j`` and LAPACK's leading j x j block, and does not disturb the others."""


def cholesky_example(rng, sizes, dtype=np.float64) -> Example:
    def ref(o, p):
        npiv = p.get("npiv")
        return [[reference(x, None if npiv is None else npiv[i])[0]
                 for i, x in enumerate(o["batch"])]]

    return Example({"batch": unread_diagonal(rng, spd_list(sizes, dtype, rng))},
                   [{}, {"npiv": [min(5, n) for n in sizes]}, {"npiv": [n // 2 for n in sizes]},
                    {}], ref, lambda r: [r.factors], "batch", mask=np.tril)


POTRF = register_op(Op(
    name="potrf", api=cholesky, fields=(("mats", "batch"),), example=cholesky_example,
    request=CholeskyRequest,
    # Kernels read A and write L (the same buffer when the caller overwrites).
    buffers=(Buffer("a", "batch"), Buffer("l", "batch", output=True)),
    graph=lambda req, opts: potrf_graph(req.batch.n, req.npiv, *graph_options(opts)),
    signature=lambda req: (req.batch.n.tobytes(), req.npiv.tobytes()),
    result=lambda outs, info, plan: CholeskyResult(outs["l"], info, plan),
    returns=(("factors", "l"),),
    # A blocked plan's block updates are the blas family's GEMMs (their alpha and beta are
    # fixed by the kind; the table's slots are filled all the same).
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=("potrf", "blas"),
    doc="batched (partial) Cholesky",
))
