"""The ``frontal`` kernel family on the CPU: extend-adds (:mod:`vbatch.sparse.frontal`).

An extend-add task ``(child, parent, p, u)`` adds the lower triangle of the child's ``u x u``
Schur complement (its trailing block) into the parent front at the rows and columns ``rel``
lists; the solve's tasks ``(child, parent, p, u, r)`` add the child's update rows of the
right-hand sides into the parent's (forward) or copy them from the parent's (backward). Each is
one numpy fancy-indexed operation on views of the workspace. Children of one parent may share a
launch and would write the same entries from two threads, so a launch's tasks are grouped by
parent and each group goes to one thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbatch.kernels.cpu import split
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
        groups, cost = [], []
        for idx in np.split(order, cut):
            groups.append((int(par[idx[0]]), list(zip(q[idx].tolist(), p[idx].tolist(),
                                                      u[idx].tolist()))))
            cost.append(float((u[idx].astype(np.float64) ** 2).sum()) + 1.0)
        work[lc.index] = split(groups, np.asarray(cost), np.zeros(len(groups), dtype=bool),
                               backend.threads.size)
    return State(work)


def run(backend, ex, lc, whole: bool, tasks: list) -> None:
    rel = ex.buffers["rel"].batch
    if lc.kind in (RHS_ADD, RHS_GET):
        x = ex.buffers["x"].batch
        for parent, kids in tasks:
            target = x._view(parent)
            for q, p, u in kids:
                r = rel._view(q)[:, 0].astype(np.intp)
                if lc.kind == RHS_ADD:
                    target[r] += x._view(q)[p:]
                else:
                    x._view(q)[p:] = target[r]
        return
    if lc.kind != EXTEND:
        raise ValueError(f"cpu backend: the frontal family has no launch kind {lc.kind!r}")
    fronts = ex.buffers["l"].batch
    for parent, kids in tasks:
        target = fronts._view(parent)
        for q, p, u in kids:
            s = np.tril(fronts._view(q)[p:, p:])
            r = rel._view(q)[:, 0].astype(np.intp)
            target[np.ix_(r, r)] += s


def finish(backend, ex) -> np.ndarray:
    return ex.info
