"""``frontal``: the numeric phase of a multifrontal Cholesky, as one task graph.

A problem is a front ``F_f`` (``n_f x n_f``, lower triangle, already holding its entries of A)
with ``p_f`` pivots and a parent front (``-1``: a root). Its tasks are a partial Cholesky
(:func:`vbatch.ops.cholesky.potrf_graph`: ``L11``, ``L21`` and the Schur complement
``S_f = F22 - L21 L21^T`` in its trailing block) and, for a front with a parent, one
``frontal.extend_add`` task: ``F_parent[rel_f, rel_f] += S_f`` (the lower triangle), where
``rel_f`` lists the position of each of its update rows in the parent's row list.

Edges: a front's Schur complement before its extend-add, and every child's extend-add before
its parent's first panel. Fronts of different matrices are problems of one batch, so everything
ready at once (the leaves of every matrix first) shares launch groups, and the scheduler, not a
Python loop over tree levels, orders the rest: no host round trip between levels.

Children of one parent may share a launch and write the same parent entries: the CUDA kernel
adds with atomics (so the sums' order, and their last bits, may vary from run to run); the CPU
kernel gives all the children of one parent to one thread.

``rel`` travels as a buffer of the working dtype (one ``u_f x 1`` column per front, order F):
an op's buffers share one dtype, and the positions are integers far below 2^24, exact in
float32 and float64 alike.

The op works in place (``overwrite=True``): the workspace is the caller's, and an extend-add
writes into a parent before that parent's own tasks read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import model_validator

from vbatch.ops.batch import PackedBatch
from vbatch.ops.blas import _Request
from vbatch.ops.cholesky import CholeskyResult, potrf_graph
from vbatch.ops.errors import InputError
from vbatch.ops.kinds import TaskKind, by_log2, by_rows, register, single
from vbatch.ops.op import Buffer, Op
from vbatch.ops.op import register as register_op
from vbatch.ops.operands import together
from vbatch.scheduler.graph import TaskGraph, concat

EXTEND = "frontal.extend_add"  # the launch kinds
RHS_ADD, RHS_GET = "frontal.rhs_add", "frontal.rhs_get"
# Positions travel as floats (module docstring): exact below 2^24 in float32.
MAX_FRONT = 1 << 24


def _extend_flops(args, rows, cols, width):
    u = np.asarray(rows, dtype=np.float64)
    return u * (u + 1) / 2  # one add per entry of the update block's lower triangle


def _extend_bytes(args, rows, cols, width):
    u = np.asarray(rows, dtype=np.float64)
    return 3 * 8 * u * (u + 1) / 2  # read S_f, read and write the parent's entries


EXTEND_KIND = register(TaskKind(
    name="frontal.extend_add", op="frontal", args=("parent", "p", "u"), window=by_rows,
    launches=single(EXTEND), flops=_extend_flops, bytes=_extend_bytes,
    doc="F_parent[rel, rel] += S (lower triangle): rows = width = u, the update block's order",
), (EXTEND,))


def _rhs_flops(args, rows, cols, width):
    return np.asarray(rows, dtype=np.float64) * width


RHS_ADD_KIND = register(TaskKind(
    name=RHS_ADD, op="frontal", args=("parent", "p", "u", "r"), window=by_log2,
    launches=single(RHS_ADD), flops=_rhs_flops,
    doc="X_parent[rel, :] += X[p:, :] (the forward solve's update rows): rows = u, width = r",
), (RHS_ADD,))

RHS_GET_KIND = register(TaskKind(
    name=RHS_GET, op="frontal", args=("parent", "p", "u", "r"), window=by_log2,
    launches=single(RHS_GET), flops=_rhs_flops,
    doc="X[p:, :] = X_parent[rel, :] (the backward solve's known rows): rows = u, width = r",
), (RHS_GET,))


class FrontalRequest(_Request):
    """The fronts ``a`` (a square packed batch), their pivots ``npiv``, parents ``parent``
    (a front's parent comes after it: fronts in postorder) and update-row positions ``rel``
    (a packed batch of ``(n_f - p_f) x 1`` columns, order F)."""

    a: Any
    rel: Any
    parent: Any
    npiv: Any
    overwrite: bool = True

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        a, rel = v.get("a"), v.get("rel")
        for name, b in (("a", a), ("rel", rel)):
            if not isinstance(b, PackedBatch):
                raise InputError([(None, f"{name}: expected a vbatch.PackedBatch, got "
                                         f"{type(b).__name__}")])
        if v.get("overwrite", True) is not True:
            raise InputError([(None, "frontal works in place: overwrite must be True")])
        together(a=a, rel=rel)
        if not a.square:
            bad = np.flatnonzero(a.m != a.n)
            raise InputError([(int(i), f"a: not square: {a.m[i]} x {a.n[i]}") for i in bad])
        k = a.k
        p = np.asarray(v.get("npiv"), dtype=np.int64).reshape(-1)
        par = np.asarray(v.get("parent"), dtype=np.int64).reshape(-1)
        if p.shape != (k,) or par.shape != (k,):
            raise InputError([(None, f"npiv and parent need one entry per front ({k}), got "
                                     f"{p.shape} and {par.shape}")])
        u = a.n - p
        idx = np.arange(k)
        problems = [(int(i), f"npiv {p[i]} outside [1, n={a.n[i]}]")
                    for i in np.flatnonzero((p < 1) | (u < 0))]
        problems += [(int(i), f"parent {par[i]} is not a later front (fronts in postorder)")
                     for i in np.flatnonzero((par != -1) & ((par <= idx) | (par >= k)))]
        problems += [(int(i), f"{u[i]} update rows but no parent")
                     for i in np.flatnonzero((par == -1) & (u > 0))]
        problems += [(int(i), f"rel is {rel.m[i]} x {rel.n[i]}, expected {u[i]} x 1")
                     for i in np.flatnonzero((rel.m != np.maximum(u, 0)) | (rel.n != 1))]
        problems += [(int(i), f"a front of order {a.n[i]} (at most {MAX_FRONT - 1})")
                     for i in np.flatnonzero(a.n >= MAX_FRONT)]
        if rel.order != "F":
            problems.append((None, "rel must be order F"))
        if problems:
            raise InputError(problems)
        v.update(a=a, rel=rel, parent=par, npiv=p, overwrite=True)
        return v


def frontal_graph(req: FrontalRequest, opts: dict) -> TaskGraph:
    n, p, par = req.a.n, req.npiv, req.parent
    k = len(n)
    fac = potrf_graph(n, p, int(opts["nb"]))
    u = n - p
    child = np.flatnonzero((par >= 0) & (u > 0))
    c = len(child)
    ext = TaskGraph(kinds=(EXTEND_KIND,), kind=np.zeros(c, np.int8), problem=child,
                    args=np.stack([par[child], p[child], u[child]], axis=1).reshape(c, 3),
                    rows=u[child], cols=np.zeros(c, np.int64), width=u[child],
                    edges=np.zeros((0, 2), np.int64), k=k)
    first, cnt = fac.chains
    off = fac.size
    row = off + np.arange(c)
    # the child's Schur task (its last) before its extend-add; that before the parent's first
    edges = np.concatenate([np.stack([first[child] + cnt[child] - 1, row], axis=1),
                            np.stack([row, first[par[child]]], axis=1)])
    g, _ = concat([fac, ext], edges)
    return g


def _sig(req) -> tuple:
    return (req.a.n.tobytes(), req.npiv.tobytes(), req.parent.tobytes())


@dataclass(frozen=True)
class FrontalResult:
    """``fronts``: the factored workspace (``a`` itself); ``info``: per front, LAPACK's (the
    column of that front, 1-based, whose pivot was not positive)."""

    fronts: Any
    info: np.ndarray
    plan: Any

    ok = CholeskyResult.ok
    failed = CholeskyResult.failed


FRONTAL_OP = register_op(Op(
    name="frontal", request=FrontalRequest,
    buffers=(Buffer("a", "a"), Buffer("l", "a", output=True), Buffer("rel", "rel")),
    graph=frontal_graph, signature=_sig,
    result=lambda outs, info, plan: FrontalResult(outs["l"], info, plan),
    families=("potrf", "frontal"),
    doc="the numeric multifrontal Cholesky: partial factorizations and extend-adds, one graph",
))


class FrontalSolveRequest(FrontalRequest):
    """The solve with factored fronts ``l`` (a :class:`FrontalRequest`'s ``a``, factored):
    ``x`` holds each front's right-hand sides (``n_f x r``; the pivot rows hold b's entries,
    the update rows zeros) and comes back holding the solution in its pivot rows."""

    x: Any

    @model_validator(mode="after")
    def _rhs(self) -> "FrontalSolveRequest":
        x = self.x
        if not isinstance(x, PackedBatch):
            raise InputError([(None, f"x: expected a vbatch.PackedBatch, got "
                                     f"{type(x).__name__}")])
        together(a=self.a, x=x)
        bad = np.flatnonzero(x.m != self.a.n)
        if len(bad):
            raise InputError([(int(i), f"x has {x.m[i]} rows, the front {self.a.n[i]}")
                              for i in bad])
        if len(x.n) and (x.n != x.n[0]).any():
            raise InputError([(None, "x: every front needs the same number of columns")])
        return self


def frontal_solve_graph(req: FrontalSolveRequest, opts: dict) -> TaskGraph:
    """Forward (leaves first) then backward (roots first) substitution, front by front, as
    one graph. Per front: the forward recursion on its ``p x p`` triangle (POTRS's kinds), the
    join ``X[p:] -= L21 X[:p]`` (a GEMM task of the same kind), the add of ``X[p:]`` into the
    parent; later the get of ``X[p:]`` from the parent's solved rows, the join
    ``X[:p] -= L21^T X[p:]`` and the backward recursion. Edges: a child's add before its
    parent's forward; a parent's backward before its children's get."""
    from vbatch.ops.blas import chain_graph, potrs_phases

    n, p, par = req.a.n, req.npiv, req.parent
    k = len(n)
    r = int(req.x.n[0]) if k else 0
    u = n - p
    nb, whole = int(opts["blas_nb"]), int(opts.get("blas_whole_rhs", 0))
    fwd_ph, bwd_ph = potrs_phases("l", "x")
    rr = np.full(k, r, np.int64)
    fwd = chain_graph(p, rr, [fwd_ph], None, nb, whole)
    bwd = chain_graph(p, rr, [bwd_ph], None, nb, whole)
    up = np.flatnonzero((u > 0) & (r > 0))
    c = len(up)

    def part(kd, args, rows, cols, width):
        args = np.asarray(args, np.int64)
        return TaskGraph(kinds=(kd,), kind=np.zeros(c, np.int8), problem=up,
                         args=args.reshape(c, args.shape[1] if args.ndim == 2 else 0),
                         rows=rows, cols=cols,
                         width=width, edges=np.zeros((0, 2), np.int64), k=k)

    z = np.zeros(c, np.int64)
    pu, uu, rc, pa = p[up], u[up], np.full(c, r, np.int64), par[up]
    join_f = part(fwd_ph[1], np.stack([pu, uu, z, pu, rc], 1), uu, pu, rc)
    add = part(RHS_ADD_KIND, np.stack([pa, pu, uu, rc], 1), uu, z, rc)
    get = part(RHS_GET_KIND, np.stack([pa, pu, uu, rc], 1), uu, z, rc)
    join_b = part(bwd_ph[1], np.stack([z, pu, pu, uu, rc], 1), pu, uu, rc)
    graphs = [fwd, join_f, add, get, join_b, bwd]
    sizes = np.array([g.size for g in graphs])
    o = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ff, fc = fwd.chains
    bf, bc = bwd.chains
    live = fc > 0
    last_f, first_f = o[0] + ff + fc - 1, o[0] + ff
    first_b, last_b = o[5] + bf, o[5] + bf + bc - 1
    jf, ad, gt, jb = (o[i] + np.arange(c) for i in (1, 2, 3, 4))
    end_f = last_f.copy()
    end_f[up] = ad
    start_b = first_b.copy()
    start_b[up] = gt
    q = np.flatnonzero(live)
    e = [np.stack([last_f[up], jf], 1), np.stack([jf, ad], 1), np.stack([ad, first_f[pa]], 1),
         np.stack([end_f[q], start_b[q]], 1), np.stack([last_b[pa], gt], 1),
         np.stack([gt, jb], 1), np.stack([jb, first_b[up]], 1)]
    g, _ = concat(graphs, np.concatenate(e))
    return g


def _solve_sig(req) -> tuple:
    return _sig(req) + (req.x.n.tobytes(),)


FRONTAL_SOLVE_OP = register_op(Op(
    name="frontal_solve", request=FrontalSolveRequest,
    buffers=(Buffer("l", "a"), Buffer("rel", "rel"), Buffer("b", "x"),
             Buffer("x", "x", output=True)),
    graph=frontal_solve_graph, signature=_solve_sig,
    result=lambda outs, info, plan: FrontalResult(outs["x"], info, plan),
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=("blas", "frontal"),
    doc="the multifrontal solve: forward and backward substitution over the fronts, one graph",
))


def reference(fronts: list[np.ndarray], npiv, parent, rel: list[np.ndarray]) -> list[np.ndarray]:
    """The numpy reference: the same computation front by front, in postorder (lower
    triangles in, factored fronts out, inputs untouched)."""
    out = [np.tril(np.array(f, dtype=np.float64)) for f in fronts]
    for f, F in enumerate(out):
        p = int(npiv[f])
        L11 = np.linalg.cholesky(F[:p, :p])
        L21 = np.linalg.solve(L11, F[p:, :p].T).T
        F[:p, :p], F[p:, :p] = L11, L21
        S = np.tril(F[p:, p:] - L21 @ L21.T)
        F[p:, p:] = S
        if parent[f] >= 0 and len(S):
            r = np.asarray(rel[f], dtype=np.intp).reshape(-1)
            out[int(parent[f])][np.ix_(r, r)] += S
    return out


def solve_reference(factored: list[np.ndarray], npiv, parent, rel, x: list[np.ndarray]
                    ) -> list[np.ndarray]:
    """The numpy reference of ``frontal_solve``: forward in postorder, backward in reverse,
    on copies of the fronts' right-hand sides ``x``."""
    out = [np.array(v, dtype=np.float64) for v in x]
    k = len(out)
    for f in range(k):
        p, L = int(npiv[f]), factored[f]
        out[f][:p] = np.linalg.solve(np.tril(L[:p, :p]), out[f][:p])
        out[f][p:] -= L[p:, :p] @ out[f][:p]
        if parent[f] >= 0 and len(out[f]) > p:
            out[int(parent[f])][np.asarray(rel[f], dtype=np.intp)] += out[f][p:]
    for f in range(k - 1, -1, -1):
        p, L = int(npiv[f]), factored[f]
        if parent[f] >= 0 and len(out[f]) > p:
            out[f][p:] = out[int(parent[f])][np.asarray(rel[f], dtype=np.intp)]
        out[f][:p] = np.linalg.solve(np.tril(L[:p, :p]).T, out[f][:p] - L[p:, :p].T @ out[f][p:])
    return out
