"""GETRF on the CPU: what each launch kind of a batched LU does to one problem.

Buffers: ``a`` (input), ``lu`` (output; ``a`` itself in place) and ``ipiv`` (int32, ``r x 1``
per problem). A panel task is ``(q, j, w, m, n)``; the trailing GEMMs are the ``blas``
family's.

* ``getrf.factor``: the first step of a problem out of place copies the whole input into the
  output (every later step reads the output). A problem that is one panel (``r <= nb``, the
  default panel being 512 wide) is factored whole here by one LAPACK ``getrf``, every column
  at once; otherwise the panel's ``(m - j) x w`` block is. A row-major block goes through a
  column-major copy (LAPACK has no row-major LU). The pivots go to ``ipiv`` (0-based, global
  rows), the first zero pivot to ``info``;
* ``getrf.rows``: the step's row swaps on the columns left and right of the panel, then
  ``U12 = L11^-1 A12`` (``trsm``). Nothing for a problem factored whole;
* ``getrf.swap`` (a solve's, :mod:`vbatch.ops.getrs`): a task ``(q, r, nrhs)`` copies its
  source's rows into X where its kind names one, then applies the ``r`` interchanges (``P X``,
  or ``P^T X`` backward): where numba is installed a chunk in one compiled loop
  (``_swap_small``, bound for the replay too), else as one permutation of X's rows in numpy.

``pivot=False`` factors with the diagonal as pivot, in a compiled loop (numba) where it is
installed, else column by column in numpy; a zero pivot's column is left unscaled, as
LAPACK's ``getf2`` leaves a zero column.

Where numba is installed, small whole problems (``SMALL_FLOPS``) run instead as one compiled
loop a chunk (``_getrf_small``, either pivoting): 10 problems of 8 x 8 took 400-460 us a call
through LAPACK (list or packed), 23 packed and 49 as a list with the loop, against 96-98 for a
``scipy.linalg.lu_factor`` loop (2-core VM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbatch.core import jit
from vbatch.core.jit import njit, strides
from vbatch.kernels.cpu import INFO, Data, split
from vbatch.ops.getrf import FACTOR, ROWS, SWAP, lu_nopivot, permutation

OP = "getrf"
# Whole problems of at most this many flops run as one compiled loop per chunk where numba is
# installed: through LAPACK a problem costs a view, a ctypes call and its pivots' copy, ~20-30
# us of Python (a tiny call of 10 problems of 8 x 8 is then all of it).
SMALL_FLOPS = 1 << 17


def plan_defaults(dtype) -> dict:
    # As POTRF's: a problem up to 512 columns is one LAPACK call, which blocks for the caches
    # itself; larger ones are blocked, their GEMMs getting the BLAS's threads.
    return {"nb": 512, "streams": 1}


@dataclass
class State:
    work: dict


def _whole(j, w, m, n):
    """Tasks that factor their whole problem (its one panel)."""
    return (j == 0) & (w == np.minimum(m, n))


def prepare(backend, plan, launches) -> State:
    t = plan.tasks
    work = {}
    for lc in launches:
        sl = slice(lc.lo, lc.hi)
        q = t.problem[sl]
        if lc.kind == SWAP:  # (q, pivots, right-hand sides): the blas family's single tasks
            r, nrhs = t.args[sl, 1], t.args[sl, 4]
            small = np.full(len(q), jit.AVAILABLE)
            work[lc.index] = split(list(zip(q.tolist(), r.tolist(), nrhs.tolist())),
                                   (r * nrhs + 1).astype(np.float64),
                                   np.zeros(len(q), dtype=bool), backend.threads.size, small,
                                   _swap_tabled)
            continue
        j, w, m, n = (t.args[sl, i] for i in range(4))
        whole = _whole(j, w, m, n)
        if lc.kind == ROWS:  # (done by the factor task)
            keep = ~whole
            q, j, w, m, n, whole = q[keep], j[keep], w[keep], m[keep], n[keep], whole[keep]
            cost = w.astype(np.float64) ** 2 * np.maximum(n - j - w, 0) + m * n + 1.0
        else:
            mm, ww = (m - j).astype(np.float64), w.astype(np.float64)
            cost = np.where(whole, mm * ww * n - ww**3 / 3, mm * ww * ww) + 1.0
        tasks = list(zip(q.tolist(), j.tolist(), w.tolist(), m.tolist(), n.tolist()))
        small = (whole & (cost <= SMALL_FLOPS)) if jit.AVAILABLE and lc.kind == FACTOR else None
        work[lc.index] = split(tasks, cost, np.zeros(len(tasks), dtype=bool),
                               backend.threads.size, small, _tabled)
    return State(work)


@dataclass
class Small:
    """A chunk of small whole problems, as the compiled loop takes them: ``(q, m, n)`` rows."""

    table: np.ndarray


@dataclass
class Swaps:
    """A chunk of swap tasks, as the compiled loop takes them: ``(q, r, nrhs)`` rows."""

    table: np.ndarray


def _swap_tabled(tasks: list) -> list:
    return [Swaps(np.array(tasks, np.int64).reshape(-1, 3))]


def _swap_args(ex, p) -> tuple:
    """The compiled swap loop's buffers (X, the source or X again, ipiv) and flags."""
    x = ex.buffers[p["x"]]
    src = ex.buffers[p["src"]] if p["src"] else x
    return x, src, ex.buffers["ipiv"], (bool(p["src"]), bool(p["forward"]),
                                         bool(p["skip_failed"]))


def _tabled(tasks: list) -> list:
    return [Small(np.array([(q, m, n) for q, _, _, m, n in tasks], np.int64).reshape(-1, 3))]


def run(backend, ex, lc, whole: bool, tasks: list) -> None:
    if lc.kind == SWAP:
        p = next(k for k in ex.plan.kinds if k.name == lc.task_kind).param
        if tasks and isinstance(tasks[0], Swaps):
            x, src, piv, flags = _swap_args(ex, p)
            _swap_small(tasks[0].table, ex.info, *jit.packed(x.batch), *jit.packed(src.batch),
                        *jit.packed(piv.batch), *flags)
            return
        for task in tasks:
            _swap(ex, p, *task)
        return
    pivot = next(k for k in ex.plan.kinds if k.name == lc.task_kind).param["pivot"]
    a, out, piv = ex.buffers["a"], ex.buffers["lu"], ex.buffers["ipiv"]
    if tasks and isinstance(tasks[0], Small):
        _getrf_small(tasks[0].table, ex.info, *jit.packed(a.batch), *jit.packed(out.batch),
                     *jit.packed(piv.batch), a is out, pivot)
        return
    c = backend.calls(out.dtype, "F")
    fn = _factor if lc.kind == FACTOR else _rows
    for task in tasks:
        fn(backend, ex, c, a, out, piv, pivot, *task)


def calls(backend, ex, lc, whole: bool, tasks: list, names: list) -> list | None:
    """A chunk of small whole problems as the compiled loop's call, bound once for a prepared
    call's replay (CpuBackend.replayer); None for any other chunk."""
    if len(tasks) == 1 and isinstance(tasks[0], Swaps):
        p = next(k for k in ex.plan.kinds if k.name == lc.task_kind).param
        x, src, piv, flags = _swap_args(ex, p)
        bufs = []
        for name, b in ((p["x"], x), (p["src"] or p["x"], src), ("ipiv", piv)):
            bufs += [Data(names.index(name)), *jit.packed(b.batch)[1:]]
        return [(_swap_small, (tasks[0].table, INFO, *bufs, *flags))]
    if len(tasks) != 1 or not isinstance(tasks[0], Small):
        return None
    pivot = next(k for k in ex.plan.kinds if k.name == lc.task_kind).param["pivot"]
    a, out, piv = ex.buffers["a"], ex.buffers["lu"], ex.buffers["ipiv"]
    return [(_getrf_small, (tasks[0].table, INFO, Data(names.index("a")),
                            *jit.packed(a.batch)[1:], Data(names.index("lu")),
                            *jit.packed(out.batch)[1:], Data(names.index("ipiv")),
                            *jit.packed(piv.batch)[1:], a is out, pivot))]


@njit(cache=True, nogil=True, error_model="numpy")
def _getrf_small(rows, info, A, ao, al, acol, L, lo, ll, lcol, P, po, pl, pcol, inplace,
                 pivot):
    """Whole problems ``(q, m, n)``: ``P A = L U`` in the output, as LAPACK's ``getf2`` does it
    (right-looking, a column at a time): the pivot is the first entry of largest magnitude at
    or below the diagonal (``pivot``; else the diagonal; a complex entry's magnitude is
    LAPACK's ``|re| + |im|``), whole rows are swapped, a zero
    pivot's column is left unscaled and sets ``info`` (the first), the rest goes on. The
    0-based pivots go to ``P`` (an ``r x 1`` int32 batch). Out of place the input is copied
    first."""
    for t in range(rows.shape[0]):
        q, m, n = rows[t, 0], rows[t, 1], rows[t, 2]
        lr, lc = strides(ll, lcol, q, False)
        l0 = lo[q]
        if not inplace:
            ar, ac = strides(al, acol, q, False)
            a0 = ao[q]
            for j in range(n):
                for i in range(m):
                    L[l0 + i * lr + j * lc] = A[a0 + i * ar + j * ac]
        p0, ps = po[q], strides(pl, pcol, q, False)[0]
        for c in range(min(m, n)):
            cc = l0 + c * lc  # column c
            p = c
            if pivot:
                best = _cabs1(L[cc + c * lr])
                for i in range(c + 1, m):
                    v = _cabs1(L[cc + i * lr])
                    if v > best:
                        best = v
                        p = i
            P[p0 + c * ps] = p
            if p != c:
                for j in range(n):
                    x, y = l0 + c * lr + j * lc, l0 + p * lr + j * lc
                    L[x], L[y] = L[y], L[x]
            d = L[cc + c * lr]
            if d == 0.0:
                if info[q] == 0:
                    info[q] = c + 1
            else:
                for i in range(c + 1, m):
                    L[cc + i * lr] = L[cc + i * lr] / d
            for j in range(c + 1, n):
                cj = l0 + j * lc
                f = L[cj + c * lr]
                if f != 0.0:
                    for i in range(c + 1, m):
                        L[cj + i * lr] -= L[cc + i * lr] * f


@njit(cache=True, nogil=True, inline="always")
def _cabs1(v):
    """LAPACK's magnitude for a pivot search (izamax): ``|re| + |im|``; ``|v|`` when real."""
    return abs(v.real) + abs(v.imag)


def _factor(backend, ex, c, a, out, piv, pivot, q, j, w, m, n) -> None:
    x = out.batch._view(q)
    if a is not out and j == 0:
        np.copyto(x, a.batch._view(q))
    cols = n if _whole(j, w, m, n) else w
    p = x[j:, j:j + cols]
    if pivot:
        loc = backend.scratch(w, np.int32)
        isz = p.itemsize
        if p.strides[0] == isz:  # column-major: LAPACK works where it lies
            ld = p.strides[1] // isz if cols > 1 else m - j  # (one column: any ld will do)
            info = c.getrf(p.ctypes.data, m - j, cols, ld, loc.ctypes.data)
        else:  # (a column-major copy in this thread's scratch, and back)
            f = backend.scratch((m - j) * cols, p.dtype)[:(m - j) * cols]
            f = f.reshape(cols, m - j).T
            np.copyto(f, p)
            info = c.getrf(f.ctypes.data, m - j, cols, m - j, loc.ctypes.data)
            np.copyto(p, f)
        piv.batch._view(q)[j:j + w, 0] = loc[:w] + (j - 1)
    else:
        info = _nopivot(p)
        piv.batch._view(q)[j:j + w, 0] = np.arange(j, j + w, dtype=np.int32)
    if info and not ex.info[q]:
        ex.info[q] = j + info


def _rows(backend, ex, c, a, out, piv, pivot, q, j, w, m, n) -> None:
    x = out.batch._view(q)
    if pivot:
        # The step's swaps as one permutation of rows [j, m), applied to the columns outside
        # the panel (getrf swapped the panel's own).
        perm = np.arange(m - j)
        for i, p in enumerate((piv.batch._view(q)[j:j + w, 0] - j).tolist()):
            perm[i], perm[p] = perm[p], perm[i]
        moved = np.flatnonzero(perm != np.arange(m - j))
        if len(moved):
            rows = moved + j
            src = perm[moved] + j
            x[rows, :j] = x[src, :j]
            x[rows, j + w:] = x[src, j + w:]
    if j + w < n:
        cc = backend.calls(out.dtype, out.order)
        ld, base = out.ld[q], out.base + out.off[q]
        cc.trsm_left_lower_unit(cc.at(base, ld, j, j + w), cc.at(base, ld, j, j), w, n - j - w, ld)


@njit(cache=True, nogil=True, error_model="numpy")
def _swap_small(rows, info, X, xo, xl, xcol, S, so, sl, scol, P, po, pl, pcol, src, forward,
                skip):
    """Swap tasks ``(q, r, nrhs)`` as :func:`_swap` does them, X's elements exchanged in
    place (``S``: the source, read first where ``src``)."""
    for t in range(rows.shape[0]):
        q, r, nrhs = rows[t, 0], rows[t, 1], rows[t, 2]
        xr, xc = strides(xl, xcol, q, False)
        x0 = xo[q]
        if src:
            sr, sc = strides(sl, scol, q, False)
            s0 = so[q]
            for j in range(nrhs):
                for i in range(r):
                    X[x0 + i * xr + j * xc] = S[s0 + i * sr + j * sc]
        if skip and info[q] != 0:
            continue
        p0, ps = po[q], strides(pl, pcol, q, False)[0]
        for u in range(r):
            i = u if forward else r - 1 - u
            p = P[p0 + i * ps]
            if p != i and 0 <= p < r:  # (a kept call's pivots are not checked again)
                for j in range(nrhs):
                    a, b = x0 + i * xr + j * xc, x0 + p * xr + j * xc
                    X[a], X[b] = X[b], X[a]


def _swap(ex, p, q, r, nrhs) -> None:
    x = ex.buffers[p["x"]].batch._view(q)
    if p["src"]:  # (also for a problem skipped below: GESV's singular ones keep B)
        np.copyto(x, ex.buffers[p["src"]].batch._view(q))
    if p["skip_failed"] and ex.info[q]:
        return
    piv = ex.buffers["ipiv"].batch._view(q)[:, 0]
    perm = permutation(np.where((piv >= 0) & (piv < r), piv, np.arange(r)), r)
    if p["forward"]:
        x[...] = x[perm]
    else:
        x[perm] = x.copy()


def _nopivot(p: np.ndarray) -> int:
    if jit.AVAILABLE:
        return int(_getf2_nopivot(p))
    f, info = lu_nopivot(p)
    np.copyto(p, f)
    return info


@njit(cache=True, nogil=True, error_model="numpy")
def _getf2_nopivot(p):
    """LU without pivoting of ``p`` in place (right-looking, a column at a time): the first
    exactly-zero pivot's column + 1, or 0. A zero pivot's column is left unscaled."""
    m, n = p.shape
    info = 0
    for c in range(min(m, n)):
        d = p[c, c]
        if d == 0.0:
            if info == 0:
                info = c + 1
        else:
            for i in range(c + 1, m):
                p[i, c] = p[i, c] / d
        for jj in range(c + 1, n):
            f = p[c, jj]
            for i in range(c + 1, m):
                p[i, jj] -= p[i, c] * f
    return info


def finish(backend, ex) -> np.ndarray:
    return ex.info
