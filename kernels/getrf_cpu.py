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
  ``U12 = L11^-1 A12`` (``trsm``). Nothing for a problem factored whole.

``pivot=False`` factors with the diagonal as pivot, in a compiled loop (numba) where it is
installed, else column by column in numpy; a zero pivot's column is left unscaled, as
LAPACK's ``getf2`` leaves a zero column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbatch.core import jit
from vbatch.core.jit import njit
from vbatch.kernels.cpu import split
from vbatch.ops.getrf import FACTOR, ROWS, lu_nopivot

OP = "getrf"


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
        work[lc.index] = split(tasks, cost, np.zeros(len(tasks), dtype=bool),
                               backend.threads.size)
    return State(work)


def run(backend, ex, lc, whole: bool, tasks: list) -> None:
    pivot = next(k for k in ex.plan.kinds if k.name == lc.task_kind).param["pivot"]
    a, out, piv = ex.buffers["a"], ex.buffers["lu"], ex.buffers["ipiv"]
    c = backend.calls(out.dtype, "F")
    fn = _factor if lc.kind == FACTOR else _rows
    for task in tasks:
        fn(backend, ex, c, a, out, piv, pivot, *task)


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
