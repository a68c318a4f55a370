"""Batched LU factorization with partial pivoting (GETRF): the request, its tasks, its reference.

Each problem is its own ``m x n`` (rectangular allowed, zero allowed), ``r = min(m, n)``.
Algorithm: blocked **right-looking** LU with panel width ``nb``, as LAPACK's ``dgetrf``. Step
``s`` works on columns ``[j, j + w)``, ``j = s * nb``, ``w = min(nb, r - j)``:

* ``getrf.panel`` (one task, issued as two launches): ``factor`` finds each column's pivot
  (the first entry of largest magnitude at or below the diagonal, as ``idamax``), swaps it into
  place within the panel, scales the column below it and updates the rest of the panel; it
  writes the step's pivots and ``info``. ``rows`` then applies the step's row swaps to every
  column outside the panel and solves the block right of it, ``U12 = L11^-1 A12`` (L11 unit
  lower). A problem that is one panel (``r <= nb``) may be factored whole by ``factor``
  (the CPU: one LAPACK ``getrf``); ``rows`` then has nothing left to do for it;
* the trailing update ``A22 -= L21 U12``: a GEMM of the ``blas`` family
  (:func:`~vbatch.ops.blas.gemm_kind`, as a blocked Cholesky's block update), on the output
  buffer alone: rows and columns ``[j + w, ...)``, inner range ``[j, j + w)``.

Each problem's tasks form a chain: panel, GEMM, panel, ... (the last step has no GEMM: it
reaches the last row or column).

``ipiv`` is an output of its own: an ``r x 1`` int32 matrix per problem, laid out from the
sizes like any new output (``Buffer.dtype``), which the panel tasks write with global 0-based
rows (docs/decisions.md#getrf-ipiv). ``info`` is LAPACK's: ``i > 0`` when ``U[i-1, i-1]`` is
exactly zero; the factorization still completes (a zero pivot column is left unscaled, as
``dgetf2`` does). ``pivot=False`` takes the diagonal as pivot (``ipiv`` is then ``0..r-1``):
after a zero pivot the rest of that problem is not meaningful (its column is left unscaled,
so later entries stay finite unless a later pivot is tiny), and nothing of it reaches another
problem. A NaN entry never wins a pivot search (it compares greater than nothing), so a column
with NaN below its diagonal may pivot differently from a LAPACK build (OpenBLAS's blocked and
unblocked codes differ from each other there); the NaN stays in its own problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import model_validator

from vbatch.core.batch import PackedBatch, Views, array_kind, array_module, tight_template
from vbatch.core.errors import InputError
from vbatch.core.graph import TaskGraph, chain_edges
from vbatch.core.kinds import Group, TaskKind, by_log2, by_rows, kind, register, single
from vbatch.ops.blas import ARGS as BLAS_ARGS
from vbatch.ops.blas import _parsed, _Request, _sig, _written, gemm_kind
from vbatch.ops.cholesky import CholeskyResult
from vbatch.ops.generate import signs, uniform
from vbatch.ops.op import Buffer, Example, Op, wide
from vbatch.ops.op import register as register_op
from vbatch.ops.operands import operand

OP = "getrf"
# Launch kinds (what backends implement).
FACTOR, ROWS, SWAP = "getrf.factor", "getrf.rows", "getrf.swap"
# A panel task's args: its first column j, width w, and the problem's m and n (the CUDA tables
# carry one n per problem; the rectangular sizes travel with the task).
PANEL_ARGS = ("j", "w", "m", "n")


def _panel_launches(group: Group, options: dict) -> list[tuple[str, str]]:
    # (cols: the columns outside the panel, which `rows` swaps and solves)
    if group.cols.max() > 0:
        return [(FACTOR, "panel"), (ROWS, "rows")]
    return [(FACTOR, "panel")]


def _panel_flops(args, rows, cols, width):
    mm, w = np.asarray(rows, np.float64), np.asarray(width, np.float64)
    right = np.asarray(args[:, 3], np.float64) - np.asarray(args[:, 0], np.float64) - w
    return mm * w * w - w**3 / 3 + w * w * np.maximum(right, 0.0)


def _panel_traffic(args, rows, cols, width):
    # the panel read and written; the w rows of every other column read and written
    mm, c, w = (np.asarray(x, np.float64) for x in (rows, cols, width))
    return 2.0 * (mm * w + w * c)


_PANEL = TaskKind(
    name="getrf.panel", op=OP, args=PANEL_ARGS, window=by_rows, launches=_panel_launches,
    flops=_panel_flops, traffic=_panel_traffic,
    doc="one step of a right-looking LU: rows = m - j (the panel's height), cols = n - w (the "
        "columns outside it), width = w",
)
register(_PANEL, (FACTOR, ROWS))


def panel_kind(pivot: bool) -> TaskKind:
    """The panel kind with partial pivoting or without (kernels read ``pivot``)."""
    return kind(_PANEL, (FACTOR, ROWS), pivot=int(pivot))


def _swap_flops(args, rows, cols, width):
    return np.zeros(len(args))


def _swap_traffic(args, rows, cols, width):
    return 2.0 * np.asarray(rows, np.float64) * np.asarray(cols, np.float64)


_SWAP = TaskKind(
    name="getrf.swap", op=OP, args=BLAS_ARGS, window=by_log2, launches=single(SWAP),
    flops=_swap_flops, traffic=_swap_traffic,
    doc="a solve's row interchanges (a task as the blas family's single ones: mm = the "
        "pivots, nn = the right-hand sides): rows = pivots, cols = width = right-hand sides",
)
register(_SWAP, (SWAP,))


def swap_kind(x: str, src: str = "", forward: bool = True, skip_failed: int = 0) -> TaskKind:
    """The interchanges ``ipiv`` records applied to the rows of buffer ``x``: ``forward``,
    ``X := P X`` (``ipiv[0]`` first, as LAPACK's ``laswp`` with a positive increment),
    else ``X := P^T X`` (the last first). ``src``: ``X := P B`` from buffer ``src`` (the
    copy, then the interchanges). ``skip_failed``: a problem whose ``info`` is set gets the
    copy only (GESV's singular problems keep ``B``)."""
    return kind(_SWAP, (SWAP,), x=x, src=src, forward=int(forward),
                skip_failed=int(skip_failed))


# A22 -= L21 U12 on the output buffer: args r0 = J, mm = m - J, k0 = j, kk = w, nn = n - J,
# c0 = J (J = j + w).
TRAILING = gemm_kind("lu", "lu", "lu", "lu", 0, 0, 0, "minus", "one")


def getrf_graph(m: Any, n: Any, pivot: bool = True, nb: int = 32) -> TaskGraph:
    """The tasks of a batched LU, from the sizes alone (module docstring)."""
    m = np.asarray(m, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    r = np.minimum(m, n)
    k = len(m)
    steps = -(-r // nb)
    cnt = np.where(steps > 0, 2 * steps - 1, 0)
    first = np.cumsum(cnt) - cnt
    T = int(cnt.sum())
    qs = np.arange(k, dtype=np.int64)
    kinds = np.zeros(T, np.int8)
    problem = np.repeat(qs, cnt)
    args = np.zeros((T, len(BLAS_ARGS)), np.int64)
    rows, cols, width = (np.zeros(T, np.int64) for _ in range(3))
    # Panels: step s of problem q is its task 2 s.
    pq = np.repeat(qs, steps)
    s = np.arange(len(pq), dtype=np.int64) - np.repeat(np.cumsum(steps) - steps, steps)
    j = s * nb
    w = np.minimum(nb, r[pq] - j)
    at = first[pq] + 2 * s
    args[at, 0], args[at, 1], args[at, 2], args[at, 3] = j, w, m[pq], n[pq]
    rows[at], cols[at], width[at] = m[pq] - j, n[pq] - w, w
    # Trailing updates: after every panel but the last, task 2 s + 1.
    g = steps - 1
    gq = np.repeat(qs, np.maximum(g, 0))
    s = np.arange(len(gq), dtype=np.int64) - np.repeat(np.cumsum(np.maximum(g, 0))
                                                         - np.maximum(g, 0), np.maximum(g, 0))
    at = first[gq] + 2 * s + 1
    J = (s + 1) * nb
    kinds[at] = 1
    args[at, 0], args[at, 1], args[at, 2], args[at, 3] = J, m[gq] - J, s * nb, nb
    args[at, 4], args[at, 5] = n[gq] - J, J
    rows[at], cols[at], width[at] = m[gq] - J, nb, n[gq] - J
    return TaskGraph(kinds=(panel_kind(pivot), TRAILING), kind=kinds, problem=problem,
                     args=args, rows=rows, cols=cols, width=width,
                     edges=chain_edges(first, cnt), k=k, chains=(first, cnt))


class GetrfRequest(_Request):
    """``P A = L U`` per problem, ``a`` any ``m x n``; ``pivot``: partial pivoting (else
    the diagonal is every pivot)."""

    a: Any
    pivot: bool = True
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, (), ("pivot", "overwrite"))
        a = operand(v.get("a"), "a")
        _written(v["overwrite"], a=a)
        v["a"] = a
        return v

    def steps(self) -> np.ndarray:
        """``r = min(m, n)`` per problem: the pivots each has."""
        return np.minimum(self.a.m, self.a.n)


# ----------------------------------------------------------------------------- reference
def lu_nopivot(a: np.ndarray) -> tuple[np.ndarray, int]:
    """LU without pivoting in float64, as the kernels do it: ``(factors, info)``; a zero
    pivot sets ``info`` (the first) and leaves its column unscaled."""
    f = wide(a)
    m, n = f.shape
    info = 0
    for c in range(min(m, n)):
        d = f[c, c]
        if d == 0.0:
            info = info or c + 1
        else:
            f[c + 1:, c] /= d
        f[c + 1:, c + 1:] -= np.outer(f[c + 1:, c], f[c, c + 1:])
    return f, info


def reference(a: np.ndarray, pivot: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """Dense reference for one matrix: ``(factors, ipiv, info)``, computed in double precision
    with LAPACK's ``dgetrf`` or ``zgetrf`` (0-based pivots, as SciPy gives them), or without
    pivoting (:func:`lu_nopivot`)."""
    from scipy.linalg import lapack

    a = wide(a)
    r = min(a.shape)
    if r == 0:
        return a.copy(), np.zeros(0, np.int32), 0
    if not pivot:
        f, info = lu_nopivot(a)
        return f, np.arange(r, dtype=np.int32), info
    lu, piv, info = (lapack.zgetrf if a.dtype.kind == "c" else lapack.dgetrf)(a)
    return lu, piv.astype(np.int32), int(info)


def permutation(ipiv: np.ndarray, m: int) -> np.ndarray:
    """The rows of ``A`` in the order of ``P A`` (``L U = A[perm]``), from 0-based ``ipiv``."""
    perm = np.arange(m)
    for i, p in enumerate(np.asarray(ipiv).tolist()):
        perm[i], perm[p] = perm[p], perm[i]
    return perm


def residual(a: np.ndarray, factors: np.ndarray, ipiv: np.ndarray) -> float:
    """Normwise backward error ``||P A - L U||_F / ||A||_F`` in double precision (NaN: a
    failure)."""
    a, f = wide(a), wide(factors)
    m, n = a.shape
    r = min(m, n)
    if r == 0:
        return 0.0
    lo = np.tril(f[:, :r], -1) + np.eye(m, r)
    up = np.triu(f[:r, :])
    num = np.linalg.norm(a[permutation(ipiv, m)] - lo @ up)
    den = np.linalg.norm(a)
    return float(num / den) if den else float(num)


@dataclass(frozen=True)
class GetrfResult:
    """``factors``: L (unit diagonal not stored) and U in one array per problem, as
    ``scipy.linalg.lu_factor`` gives them, in the form of ``a``. ``ipiv``: per problem a 1-D
    int32 array of ``min(m, n)`` 0-based pivots (row ``i`` was swapped with row ``ipiv[i]``),
    as a list-like over one packed buffer of the caller's array kind. ``info``: int32 per
    problem, LAPACK's (``i > 0``: ``U[i-1, i-1]`` is exactly zero; the factorization is still
    complete)."""

    factors: Any
    ipiv: Any
    info: np.ndarray
    plan: Any

    ok = CholeskyResult.ok
    failed = CholeskyResult.failed


def pivots(x: Any) -> Views:
    """The ipiv output (an ``r x 1`` int32 batch, packed or its views) as 1-D arrays. The
    mask saying so is kept in the layout's cache, which every ipiv of that layout shares: a
    new one per call cost ~1.3 us of a ~35 us small call."""
    b = x.batch if type(x) is Views else x
    cache = b.cache()
    every = cache.get("pivots")
    if every is None:
        every = cache["pivots"] = np.ones(b.k, dtype=bool)
        every.flags.writeable = False
    return Views(b, every)


def pivot_operand(v: Any, rows: np.ndarray, like: str, name: str = "ipiv") -> PackedBatch:
    """Pivots for a solve with ``k`` factors of ``rows[i]`` rows each, held in arrays of kind
    ``like`` (numpy or cupy): a getrf result's ``ipiv`` (read where it lies; or the batch this
    function packed, as a prepared call binds it again), or a list of 1-D integer arrays of one
    kind, packed here into one int32 buffer of ``r x 1`` columns. Either way problem ``i``'s
    has ``rows[i]`` entries, each in ``[0, rows[i])``, checked before any work (on the device
    by one reduction). Host pivots go with device factors (copied in, as any host input);
    device pivots with host factors are refused."""
    k = len(rows)
    b = v.batch if isinstance(v, Views) else v
    if isinstance(b, PackedBatch) and b.data is not None and np.dtype(b.dtype) == np.int32:
        if b.k != k:
            raise InputError([(None, f"{name} has {b.k} problems but the factors have {k}")])
        bad = np.flatnonzero((b.m != rows) | (b.n != 1))
        if len(bad):
            raise InputError([(int(i), f"{name}: {b.m[i]} pivots for {rows[i]} rows")
                              for i in bad])
        _kinds(name, b.kind, like)
        xp = array_module(b.kind)
        r = np.asarray(rows, np.int64)
        total = int(r.sum())
        off = np.asarray(b.offset, np.int64)
        if k and off[0] == 0 and np.array_equal(off[1:], np.cumsum(r)[:-1]):
            flat = b.data[:total]  # (back to back, as getrf lays them out: no gather)
        else:  # (an r x 1 column's entries are contiguous in either order)
            flat = b.data[xp.asarray(np.repeat(off, r) + np.arange(total)
                                     - np.repeat(np.cumsum(r) - r, r))]
        _in_range(flat, r, xp, name)
        return b
    if not isinstance(v, (list, tuple)):
        raise InputError([(None, f"{name}: expected a getrf result's ipiv or a list of 1-D "
                                 f"integer arrays, got {type(v).__name__}")])
    if len(v) != k:
        raise InputError([(None, f"{name} has {len(v)} problems but the factors have {k}")])
    problems: list[tuple[int | None, str]] = []
    kinds = set()
    for i, p in enumerate(v):
        kind_i = array_kind(p)
        if kind_i is None:
            problems.append((i, f"{name}: expected a 1-D integer array, got "
                                f"{type(p).__name__}"))
        elif p.ndim != 1 or not np.issubdtype(np.dtype(p.dtype), np.integer):
            problems.append((i, f"{name}: expected a 1-D integer array, got a {p.ndim}-D "
                                f"{p.dtype} array"))
        elif p.shape[0] != rows[i]:
            problems.append((i, f"{name}: {p.shape[0]} pivots for {rows[i]} rows"))
        kinds.add(kind_i)
    if problems:
        raise InputError(problems)
    if len(kinds) > 1:
        raise InputError([(None, f"{name} mixes numpy and cupy arrays")])
    kind_v = kinds.pop() if kinds else like
    _kinds(name, kind_v, like)
    xp = array_module(kind_v)
    r = np.asarray(rows, np.int64)
    # (checked before the int32 cast: a wider entry must not wrap into range)
    wide = xp.concatenate([xp.asarray(p).astype(np.int64, copy=False) for p in v]) if k \
        else xp.zeros(0, np.int64)
    _in_range(wide, r, xp, name)
    flat = wide.astype(np.int32)
    t, total = _pivot_layout(r)
    if total == flat.size:
        return t.with_data(flat)
    # (an empty problem still takes one element of the layout)
    data = xp.zeros(max(total, 1), np.int32)
    data[xp.asarray(np.repeat(t.offset, r) + np.arange(flat.size) - np.repeat(
        np.cumsum(r) - r, r))] = flat
    return t.with_data(data)


def _in_range(flat, r: np.ndarray, xp, name: str) -> None:
    """Every problem's pivots (``r[i]`` of them, back to back in ``flat``) in ``[0, r[i])``;
    on the device one reduction and one read of its answer."""
    bad = (flat < 0) | (flat >= xp.asarray(np.repeat(r.astype(np.int32), r)))
    if bool(bad.any()):
        at = np.flatnonzero(np.asarray(bad.get() if hasattr(bad, "get") else bad))
        first = np.searchsorted(np.cumsum(r), at, side="right")
        raise InputError([(int(i), f"{name}: a pivot outside [0, {r[i]})")
                          for i in np.unique(first)])


_PIVOT_LAYOUTS: dict = {}  # the sizes' bytes -> (template, total): pivots packed from lists


def _pivot_layout(r: np.ndarray) -> tuple[PackedBatch, int]:
    """The layout of ``r x 1`` int32 columns back to back, one per set of sizes (kept for
    the last few), so that pivots packed again for the same sizes share it and what backends
    derived from it (a prepared call's layout, device metadata)."""
    key = r.tobytes()
    hit = _PIVOT_LAYOUTS.get(key)
    if hit is None:
        m, n = r.copy(), np.ones(len(r), np.int64)
        m.flags.writeable = n.flags.writeable = False
        hit = tight_template(m, n, "F")
        if len(_PIVOT_LAYOUTS) >= 16:
            _PIVOT_LAYOUTS.clear()
        _PIVOT_LAYOUTS[key] = hit
    return hit


def _kinds(name: str, kind_v: str, like: str) -> None:
    if kind_v == "cupy" and like != "cupy":
        raise InputError([(None, f"{name} holds cupy arrays but the factors hold {like} "
                                 "arrays (device pivots go with device factors)")])


def getrf(a: Any, *, pivot: bool = True):
    """Factor ``P A = L U`` per problem, ``a`` a list of ``m x n`` arrays (rectangular allowed)
    or a :class:`~vbatch.PackedBatch`, with partial pivoting as LAPACK's ``dgetrf``
    (``pivot=False``: no pivoting, for diagonally dominant matrices). ``result()``: a
    :class:`GetrfResult` (``factors``, ``ipiv`` 0-based as SciPy's ``lu_factor``, ``info``); a
    problem with an exactly zero pivot gets ``info`` and does not disturb the others."""


def lu_matrices(rng, shapes, dtype=np.float64) -> list[np.ndarray]:
    """``A = L U`` for each ``(m, n)``, whose pivots partial pivoting finds with a margin: L
    is unit lower with 1.5 below every other diagonal entry (the rows of each 2 x 2 block
    change places), its rows past ``min(m, n)`` at most 0.25; U has a diagonal of magnitude 1-2
    and small entries above it. Without pivoting the same matrices factor stably into that L
    and U, so both settings are exact on them up to rounding."""
    out = []
    for m, n in shapes:
        r = min(m, n)
        lo = np.eye(m, r)
        idx = np.arange(0, r - 1, 2)
        lo[idx + 1, idx] = 1.5
        lo = lo.astype(np.result_type(dtype, np.float64))
        lo[r:, :] = uniform(rng, (m - r, r), dtype) * 0.25
        up = np.triu(uniform(rng, (r, n), dtype) / max(r, 1), 1)
        up[np.arange(r), np.arange(r)] = signs(rng, r, dtype) * rng.uniform(1, 2, r)
        out.append(lo @ up)
    return out


def example_shapes(sizes) -> list[tuple[int, int]]:
    """Square ``s x s`` for each size first (as every op's example), then tall ``(s + 5) x s``
    and wide ``s x (s + 5)`` ones."""
    return ([(s, s) for s in sizes] + [(s + 5, s) for s in sizes]
            + [(s, s + 5) for s in sizes])


def getrf_example(rng, sizes, dtype=np.float64) -> Example:
    def ref(o, p):
        refs = [reference(x, p.get("pivot", True)) for x in o["a"]]
        return [[f[1].astype(np.float64) for f in refs], [f[0] for f in refs]]

    return Example({"a": lu_matrices(rng, example_shapes(sizes), dtype)},
                   [{}, {"pivot": False}], ref, lambda r: [r.ipiv, r.factors], "a",
                   any_shape=True)


GETRF_OP = register_op(Op(
    name="getrf", api=getrf, example=getrf_example, request=GetrfRequest,
    # ipiv: a new int32 output of r x 1 per problem, laid out from the sizes (no operand)
    buffers=(Buffer("a", "a"), Buffer("lu", "a", output=True),
             Buffer("ipiv", None, output=True, form="a", complete=True, dtype="int32",
                    shape=lambda r: (r.steps(), np.ones(r.a.k, np.int64)))),
    graph=lambda req, opts: getrf_graph(req.a.m, req.a.n, req.pivot, int(opts["nb"])),
    signature=_sig("a", "pivot"),
    result=lambda outs, info, plan: GetrfResult(outs["lu"], pivots(outs["ipiv"]), info, plan),
    returns=(("factors", "lu"), ("ipiv", "ipiv")),
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=(OP, "blas"),
    doc="P A = L U with partial pivoting (or none)",
))
