"""The ``frontal`` kernel family on the CPU: extend-adds (:mod:`vbatch.sparse.frontal`).

An extend-add task ``(child, parent, p, u)`` adds the lower triangle of the child's ``u x u``
Schur complement (its trailing block) into the parent front at the rows and columns ``rel``
lists; the solve's tasks ``(child, parent, p, u, r)`` add the child's update rows of the
right-hand sides into the parent's (forward) or copy them from the parent's (backward).
Children of one parent may share a launch and would write the same entries from two threads, so
a launch's tasks are grouped by parent and each group goes to one thread.

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
from vbatch.kernels.jit import njit, packed, strides
from vbatch.sparse.frontal import EXTEND, RHS_ADD, RHS_GET

OP = "frontal"


def plan_defaults(dtype) -> dict:
    return {}


@dataclass
class State:
    work: dict


def prepare(backend, plan, launches) -> State:
    t = plan.tasks
    work = {}
    for lc in launches:
        sl = slice(lc.lo, lc.hi)
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
    if lc.kind in (RHS_ADD, RHS_GET):
        xb = ex.buffers["x"].batch
        x = packed(xb)
        ncol = np.asarray(xb.n, np.int64)
        for rows in tasks:
            _rhs_move(*x, ncol, *rel, rows, lc.kind == RHS_ADD)
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
def _rhs_move(data, off, ld, fcol, ncol, rdata, roff, rld, rcol, rows, add):
    """Forward (``add``): ``X_parent[rel, :] += X_child[p:, :]``; backward:
    ``X_child[p:, :] = X_parent[rel, :]``, for every row ``(parent, child, p, u)``."""
    for t in range(rows.shape[0]):
        par, q, p, u = rows[t, 0], rows[t, 1], rows[t, 2], rows[t, 3]
        rs, _ = strides(rld, rcol, q, False)
        ci, cj = strides(ld, fcol, q, False)
        pi, pj = strides(ld, fcol, par, False)
        for c in range(ncol[q]):
            for i in range(u):
                ri = np.int64(rdata[roff[q] + i * rs])
                dst = off[par] + ri * pi + c * pj
                src = off[q] + (p + i) * ci + c * cj
                if add:
                    data[dst] += data[src]
                else:
                    data[src] = data[dst]


def finish(backend, ex) -> np.ndarray:
    return ex.info
