"""The ``frontal`` kernel family on the CPU: extend-adds (:mod:`vbatch.ops.frontal`).

An extend-add task ``(child, parent, p, u)`` adds the lower triangle of the child's ``u x u``
Schur complement (its trailing block) into the parent front at the rows and columns ``rel``
lists. Children of one parent may share a launch and would write the same entries from two
threads, so a launch's tasks are grouped by parent and each group goes to one thread.

The solve's sweeps (:func:`vbatch.ops.frontal.sweep_items`) run their items one after
another in the launch's order, which is an order where each needs only earlier ones: the
CUDA kernel's device counters are not needed here, and the reset has nothing to do. The moves
of the stacked right-hand sides in and of the solution out run a task after another too.

Each thread's share of a launch is one call of a compiled loop over its tasks' entries (numba,
releasing the GIL), reading the workspace through each front's offset and leading dimension.
A numpy fancy-indexed add per task (``target[np.ix_(r, r)] += np.tril(S)``) held the GIL and
was a third of the CPU factorization of the 1000 2-D Laplacians (py-spy, 2-core VM, 2026-11-25).
So the ``frontal`` ops need numba on the CPU, as the rest of ``vbatch.sparse`` does (the
``sparse`` extra); without it they raise an ``ImportError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbatch.kernels.cpu import Work, split
from vbatch.core.jit import njit, packed, strides
from vbatch.ops.frontal import (CHUNK, EXTEND, SWEEP_BWD, SWEEP_BWD_SMALL, SWEEP_FWD,
                                   SWEEP_FWD_SMALL, SWEEP_IN, SWEEP_OUT, SWEEP_RESET,
                                   SWEEP_SPLIT, TREE, UPDATE_ROWS)

_FWD = (SWEEP_FWD, SWEEP_FWD_SMALL)  # the small subtrees' sweeps: the same items, a warp's on CUDA
_SWEEPS = _FWD + (SWEEP_BWD, SWEEP_BWD_SMALL)
_MOVES = (SWEEP_IN, SWEEP_OUT)  # the stacked right-hand sides in, the solution out

OP = "frontal"


def plan_defaults(dtype) -> dict:
    # The small subtrees as frontal.tree tasks (vbatch.ops.frontal.frontal_graph), as on
    # CUDA: a front's whole step is one compiled call, not a LAPACK call per panel and Schur
    # task. The solve's small-subtree launches run the same loops here; the option is kept so
    # that a plan has the same launches on both backends.
    return {"tree_max": 96, "tree_split": True, "sweep_split": SWEEP_SPLIT}


def _tree_groups(q, par) -> list:
    """A tree launch's items (fronts ``q``, parents ``par``; children before parents) in
    groups that one thread may run alone, in order: the items under one topmost item, and the
    topmost items whose parent (outside the launch) is one front together, since their
    extend-adds write its entries."""
    k = int(max(q.max(), par.max())) + 1 if len(q) else 0
    at = np.full(k + 1, -1, np.int64)  # front -> its item in this launch (index k: -1's)
    at[q] = np.arange(len(q))
    up = at[np.where(par >= 0, par, k)]
    up = np.where(up >= 0, up, np.arange(len(q)))  # an item's parent item, or itself
    while True:  # pointer jumping to each item's topmost item
        nxt = up[up]
        if (nxt == up).all():
            break
        up = nxt
    top_par = par[up]
    key = np.where(top_par >= 0, top_par, -1 - up)  # the outside parent, or the top item alone
    order = np.argsort(key, kind="stable")  # stable: launch order (children first) in a group
    cut = np.flatnonzero(np.diff(key[order])) + 1
    return np.split(order, cut)


@dataclass
class State:
    work: dict


def prepare(backend, plan, launches) -> State:
    t = plan.tasks
    work = {}
    for lc in launches:
        sl = slice(lc.lo, lc.hi)
        if lc.kind in _SWEEPS + _MOVES:  # one table, in order, on one thread
            rows = np.concatenate([t.problem[sl, None], t.args[sl]], axis=1).astype(np.int64)
            work[lc.index] = Work([rows], [])
            continue
        if lc.kind == SWEEP_RESET:
            work[lc.index] = Work([], [])
            continue
        if lc.kind == TREE:
            q, par = t.problem[sl], t.args[sl, 0]
            groups = _tree_groups(q, par)
            rows = np.stack([q, par, t.args[sl, 1], t.args[sl, 2]], axis=1).astype(np.int64)
            pf, uf = rows[:, 2].astype(np.float64), rows[:, 3].astype(np.float64)
            each = pf * (pf + uf) ** 2 + 1.0
            cost = np.array([float(each[g].sum()) for g in groups])
            w = split(groups, cost, np.zeros(len(groups), dtype=bool), backend.threads.size)

            def ttable(gs, rows=rows):  # a group's rows in launch order
                return rows[np.concatenate(gs)] if gs else rows[:0]

            # (no "wide" part: _tree gains nothing from the BLAS's threads, so every group is
            # a chunk of its own thread's)
            chunks = [(False, [ttable(gs)]) for _, gs in w.chunks]
            work[lc.index] = Work([], ([(False, [ttable(w.wide)])] if w.wide else []) + chunks)
            continue
        q, par = t.problem[sl], t.args[sl, 0]
        p, u = t.args[sl, 1], t.args[sl, 2]
        order = np.argsort(par, kind="stable")
        cut = np.flatnonzero(np.diff(par[order])) + 1
        groups = np.split(order, cut)
        cost = np.array([float((u[g].astype(np.float64) ** 2).sum()) + 1.0 for g in groups])
        w = split(groups, cost, np.zeros(len(groups), dtype=bool), backend.threads.size)
        rows = np.stack([par, q, p, u], axis=1).astype(np.int64)

        def table(gs, rows=rows):  # one (parent, child, p, u) row a task, a group's together
            return rows[np.concatenate(gs)] if gs else rows[:0]

        work[lc.index] = Work([table(w.wide)] if w.wide else [],
                              [(wh, [table(gs)]) for wh, gs in w.chunks])
    return State(work)


def run(backend, ex, lc, whole: bool, tasks: list) -> None:
    rel = packed(ex.buffers["rel"].batch)
    if lc.kind in _SWEEPS:
        fronts = packed(ex.buffers["l"].batch)
        xb = ex.buffers["x"].batch
        x = packed(xb)
        r = int(xb.n[0]) if xb.k else 0
        for rows in tasks:
            (_forward if lc.kind in _FWD else _backward)(*fronts, *x, *rel, rows, r,
                                                         CHUNK, UPDATE_ROWS)
        return
    if lc.kind in _MOVES:
        x = packed(ex.buffers["x"].batch)
        into = lc.kind == SWEEP_IN
        v = ex.buffers["rhs" if into else "y"].batch
        rows_b = ex.buffers["rows"].batch
        # (rows' integers in its elements' bits: ops.frontal.index_bits)
        it = np.int32 if rows_b.data.dtype.itemsize == 4 else np.int64
        bits = rows_b.data.view(it)
        step = rows_b.data.dtype.itemsize // np.dtype(it).itemsize
        r = int(ex.buffers["x"].batch.n[0])
        move = _move_in if into else _move_out
        for rows in tasks:
            move(*x, v.data, int(v.offset[0]), bits, np.asarray(rows_b.offset, np.int64), step,
                 rows, r, CHUNK)
        return
    if lc.kind == SWEEP_RESET:
        return
    if lc.kind == TREE:
        fronts = packed(ex.buffers["l"].batch)
        for rows in tasks:
            _tree(*fronts, *rel, rows, ex.info)
        return
    if lc.kind != EXTEND:
        raise ValueError(f"cpu backend: the frontal family has no launch kind {lc.kind!r}")
    fronts = packed(ex.buffers["l"].batch)
    for rows in tasks:
        _extend_add(*fronts, *rel, rows)


@njit(cache=True, nogil=True)
def _extend_add(data, off, ld, fcol, rdata, roff, rld, rcol, rows):
    """``F_parent[rel, rel] += tril(S_child)`` for every row ``(parent, child, p, u)``."""
    for t in range(rows.shape[0]):
        par, q, p, u = rows[t, 0], rows[t, 1], rows[t, 2], rows[t, 3]
        rs, _ = strides(rld, rcol, q, False)  # rel is one column of u entries
        ci, cj = strides(ld, fcol, q, False)
        pi, pj = strides(ld, fcol, par, False)
        cbase = off[q] + p * ci + p * cj
        for j in range(u):
            rj = np.int64(rdata[roff[q] + j * rs])
            for i in range(j, u):
                ri = np.int64(rdata[roff[q] + i * rs])
                data[off[par] + ri * pi + rj * pj] += data[cbase + i * ci + j * cj]


@njit(cache=True, nogil=True)
def _tree(data, off, ld, fcol, rdata, roff, rld, rcol, rows, info):
    """Tree items ``(front, parent, p, u)`` in order: the front's ``p`` pivot columns factored
    in place (right-looking: each column scaled, then the trailing lower triangle updated by
    it, so that the trailing block ends as the Schur complement), then that complement added
    into the parent at the rows ``rel`` lists. A pivot that is not > 0 (NaN included) stops
    the front with ``info`` at its column; such a front adds nothing into its parent."""
    for t in range(rows.shape[0]):
        q, par, p, u = rows[t, 0], rows[t, 1], rows[t, 2], rows[t, 3]
        n = p + u
        ri, ci = strides(ld, fcol, q, False)
        b = off[q]
        failed = False
        # (unsigned indices: a signed one is checked for wrapping around on every access,
        # which keeps LLVM from vectorizing the update; blas_cpu._gemm_block)
        ub, uri, uci, un = np.uint64(b), np.uint64(ri), np.uint64(ci), np.uint64(n)
        for jj in range(p):
            j = np.uint64(jj)
            cj = ub + j * uci
            d = data[cj + j * uri]
            if not d > 0.0:
                info[q] = jj + 1
                failed = True
                break
            piv = np.sqrt(d)
            data[cj + j * uri] = piv
            for i in range(j + np.uint64(1), un):
                data[cj + i * uri] /= piv
            for c in range(j + np.uint64(1), un):
                lc = data[cj + c * uri]
                if lc != 0.0:
                    cc = ub + c * uci
                    for i in range(c, un):
                        data[cc + i * uri] -= data[cj + i * uri] * lc
        if failed or par < 0 or u == 0:
            continue
        rs, _ = strides(rld, rcol, q, False)
        pi, pj = strides(ld, fcol, par, False)
        for j in range(u):
            rj = np.int64(rdata[roff[q] + j * rs])
            for i in range(j, u):
                r_ = np.int64(rdata[roff[q] + i * rs])
                data[off[par] + r_ * pi + rj * pj] += data[b + (p + i) * ri + (p + j) * ci]


@njit(cache=True, nogil=True, inline="always")
def _item(rows, t, lld, lcol, xld, xcol):
    """Item ``t`` of a sweep: its front, parent, pivots, update rows and first row, whether it
    is a small front's one item (``i0 < 0`` in sweep_items: every row; its ``i0`` then 0), and
    the strides of the front's L and X."""
    q, par, p, u, i0 = rows[t, 0], rows[t, 1], rows[t, 2], rows[t, 3], rows[t, 4]
    li, lj = strides(lld, lcol, q, False)
    xi, xj = strides(xld, xcol, q, False)
    return q, par, p, u, max(i0, 0), i0 < 0, li, lj, xi, xj


@njit(cache=True, nogil=True)
def _move_in(x, xoff, xld, xcol, v, voff, bits, ioff, step, rows, r, ch):
    """Each task ``(front, parent, p, u, i0, ...)``: rows ``[i0, i0 + ch)`` of the front's X
    from the stacked ``v`` (N x r row-major from ``voff``; only read, so the caller's array
    may be read-only): pivot row i from stacked row ``bits[step * (ioff[q] + i)]``, an update
    row zero."""
    for t in range(rows.shape[0]):
        q, p, u, i0 = rows[t, 0], rows[t, 2], rows[t, 3], rows[t, 4]
        xi, xj = strides(xld, xcol, q, False)
        xb = xoff[q]
        for i in range(i0, min(i0 + ch, p + u)):
            if i < p:
                g = voff + np.int64(bits[step * (ioff[q] + i)]) * r
                for c in range(r):
                    x[xb + i * xi + c * xj] = v[g + c]
            else:
                for c in range(r):
                    x[xb + i * xi + c * xj] = 0


@njit(cache=True, nogil=True)
def _move_out(x, xoff, xld, xcol, v, voff, bits, ioff, step, rows, r, ch):
    """Each task: the front's pivot rows among ``[i0, i0 + ch)`` into the stacked ``v``."""
    for t in range(rows.shape[0]):
        q, p, i0 = rows[t, 0], rows[t, 2], rows[t, 4]
        xi, xj = strides(xld, xcol, q, False)
        xb = xoff[q]
        for i in range(i0, min(i0 + ch, p)):
            g = voff + np.int64(bits[step * (ioff[q] + i)]) * r
            for c in range(r):
                v[g + c] = x[xb + i * xi + c * xj]


@njit(cache=True, nogil=True)
def _forward(fl, loff, lld, lcol, x, xoff, xld, xcol, rdata, roff, rld, rcol, rows, r, ch, ur):
    """The forward sweep's items ``(front, parent, p, u, i0, need)`` in order: the pivot
    chunk at ``i0`` solved with L (row by row, the solved rows in place), then its update rows
    (the last chunk's first ``ur``, or an update item's) added into the parent as
    ``X[i] - L[i, :p] X[:p]``."""
    for t in range(rows.shape[0]):
        q, par, p, u, i0, whole, li, lj, xi, xj = _item(rows, t, lld, lcol, xld, xcol)
        n = p + u
        lb, xb = loff[q], xoff[q]
        if i0 < p:
            h = p if whole else min(ch, p - i0)
            for c in range(r):
                for i in range(i0, i0 + h):
                    s = x[xb + i * xi + c * xj]
                    for j in range(i):
                        s -= fl[lb + i * li + j * lj] * x[xb + j * xi + c * xj]
                    x[xb + i * xi + c * xj] = s / fl[lb + i * li + i * lj]
            ua, ub = (p, n) if whole else (p, min(n, p + ur)) if i0 + ch >= p else (p, p)
        else:
            ua, ub = i0, min(n, i0 + ur)
        if ub > ua:
            rs, _ = strides(rld, rcol, q, False)
            pi, pj = strides(xld, xcol, par, False)
            for c in range(r):
                for i in range(ua, ub):
                    s = x[xb + i * xi + c * xj]
                    for j in range(p):
                        s -= fl[lb + i * li + j * lj] * x[xb + j * xi + c * xj]
                    ri = np.int64(rdata[roff[q] + (i - p) * rs])
                    x[xoff[par] + ri * pi + c * pj] += s


@njit(cache=True, nogil=True)
def _backward(fl, loff, lld, lcol, x, xoff, xld, xcol, rdata, roff, rld, rcol, rows, r, ch, ur):
    """The backward sweep's items in order: a front's first (its last chunk) copies its update
    rows' solution from the parent; each solves its chunk with ``L^T``, last row first."""
    for t in range(rows.shape[0]):
        q, par, p, u, i0, whole, li, lj, xi, xj = _item(rows, t, lld, lcol, xld, xcol)
        n = p + u
        lb, xb = loff[q], xoff[q]
        h = p if whole else min(ch, p - i0)
        if (whole or i0 + ch >= p) and u > 0:
            rs, _ = strides(rld, rcol, q, False)
            pi, pj = strides(xld, xcol, par, False)
            for c in range(r):
                for i in range(u):
                    ri = np.int64(rdata[roff[q] + i * rs])
                    x[xb + (p + i) * xi + c * xj] = x[xoff[par] + ri * pi + c * pj]
        for c in range(r):
            for j in range(i0 + h - 1, i0 - 1, -1):
                s = x[xb + j * xi + c * xj]
                for i in range(j + 1, n):
                    s -= fl[lb + i * li + j * lj] * x[xb + i * xi + c * xj]
                x[xb + j * xi + c * xj] = s / fl[lb + j * li + j * lj]


def finish(backend, ex) -> np.ndarray:
    return ex.info
