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

Small subtrees (every front at most ``tree_max`` rows, a plan option) take a shorter path: each
front is one ``frontal.tree`` task, its partial Cholesky, Schur complement and extend-add in one
kernel, and a size class's tasks are one launch whose blocks wait for their children on device
counters (:func:`frontal_graph`). A chain of three launches per tree level (panel, Schur
complement, extend-add) was what bounded a batch of small matrices: the 1000 Laplacians' 86
launches, every kind latency-bound (H100, 2026-11-25).

Children of one parent may share a launch and write the same parent entries: the CUDA kernel
adds with atomics (so the sums' order, and their last bits, may vary from run to run); the CPU
kernel gives all the children of one parent to one thread.

``rel`` travels as a buffer of the working dtype (one ``u_f x 1`` column per front, order F):
an op's buffers share one dtype, and the positions are integers far below 2^24, exact in
float32 and float64 alike.

The op works in place (``overwrite=True``): the workspace is the caller's, and an extend-add
writes into a parent before that parent's own tasks read it.

``frontal_solve`` is the solve with those fronts: a forward sweep (children first) and a
backward sweep (roots first) over every front of the batch, each one launch of items that wait
for each other on device counters (:func:`sweep_items`, ``TaskKind.ordered``), not a chain of
launches as deep as the trees; with many fronts in small subtrees, those take a launch of
their own in each sweep (``SWEEP_SPLIT``). The CPU backend runs a sweep's items one after
another in the same order. Given the stacked right-hand sides ``rhs`` and each pivot row's row
in them (``rows``), the solve's graph also moves them into the fronts first (``sweep_in``) and
the solution out into ``y`` last (``sweep_out``), so a solve is one graph, no gathers beside
it. ``rows`` holds integers in the bits of its elements (:func:`index_bits`): they index rows
up to the whole system's order, past where float32 is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import model_validator

from vbatch.core.batch import PackedBatch
from vbatch.ops.blas import _Request
from vbatch.ops.cholesky import CholeskyResult, graph_options, potrf_graph
from vbatch.core.errors import InputError
from vbatch.core.kinds import TaskKind, by_rows, register, single
from vbatch.ops.op import Buffer, Op
from vbatch.ops.op import register as register_op
from vbatch.ops.operands import together
from vbatch.core.graph import TaskGraph, concat

EXTEND = "frontal.extend_add"  # the launch kinds
TREE = "frontal.tree"
SWEEP_RESET, SWEEP_FWD, SWEEP_BWD = "frontal.sweep_reset", "frontal.sweep_fwd", "frontal.sweep_bwd"
SWEEP_FWD_SMALL, SWEEP_BWD_SMALL = "frontal.sweep_fwd_small", "frontal.sweep_bwd_small"
SWEEP_IN, SWEEP_OUT = "frontal.sweep_in", "frontal.sweep_out"
# Positions travel as floats (module docstring): exact below 2^24 in float32.
MAX_FRONT = 1 << 24
# The solve's items (frontal_solve_graph): pivot rows an item solves (the diagonal block the CUDA
# kernel holds in shared memory, 64 x 64, and one row a thread in each of its four slices), and
# update rows an item takes (its rows in chunks of CHUNK, reading every pivot column).
CHUNK = 64
UPDATE_ROWS = 256
# A front of at most 64 rows is one warp's (two rows a lane: frontal.cu's sweep_small); up
# to 8 of one level share a block of 8 warps. Measured against 128 and 192 (four and six rows
# a lane; H100, 2026-11-25, submit of the solve alone, ms, 64 / 128 / 192): 1000 Laplacians
# 1.31-1.37 / 1.26-1.43 / 1.30-1.40, lap2-300 0.68-0.74 / 0.82-0.93 / 0.94-1.11, bcsstk16
# 2.58 / 2.61-2.74 / 10.1-10.4 (one warp walking a 169 x 113 front alone), lap3-40 1.73-2.07
# / 1.99 / 1.98-2.16.
SMALL_FRONT = 64
SMALL_GROUP = 8
# The fronts of small subtrees (every front of the subtree at most SMALL_FRONT rows) are the
# items of launches of their own, one a sweep (SWEEP_FWD_SMALL before the other items forward,
# SWEEP_BWD_SMALL after them backward), whose CUDA kernel runs a front a warp, each warp taking
# the next front when done. Grouped 8 a block with the other items instead, a small front took
# ~10 us (its task row, the ticket, the wait, the loads, the fence before its count: ~1.3 us a
# round trip under that load) and ~17 of the 24 warps a multiprocessor could hold ran (per-front
# globaltimer stamps, the 1000 Laplacians, H200, 2026-11-26). One block a subtree (its fronts
# level by level between block barriers, no counters inside) was slower still: the batch's
# sweeps 298/352 -> 380/440 us (subtrees of up to 64 fronts; 16, 32 and 128 no better).
# But a launch boundary costs the overlap of the small fronts' tail with the large fronts'
# start: the split pays where the small subtrees hold at least SWEEP_SPLIT fronts (or every
# front; the plan option ``sweep_split`` sets it, 0: always). GPU us of the sweeps, forward +
# backward, one launch each -> split (H200, two rounds,
# docs/decisions.md#sparse-solve-small-fronts): the 1000 Laplacians (39,841 such fronts of 40,545)
# 652 -> 550 (solve 0.74 -> 0.64-0.66 ms);
# 494_bus (52 of 52) 53 -> 51; lap2-300 (4,789 of 5,347) 510 -> 571; lap2-100 (500 of 559)
# 201 -> 238; lap3-40 (3,800 of 5,633) 1,533 -> 1,568; bcsstk16 (82 of 247) 390 -> 416. The
# crossover lies between 4,789 and 39,841 fronts; 16,384 is a point in that gap, not a
# measured one.
SWEEP_SPLIT = 16384
MAX_RHS = (1 << 15) - 1  # the CUDA launch word holds the column count in 15 bits
# The factor's small subtrees (frontal_graph): a front whose subtree holds no front of more than
# ``tree_max`` rows (a plan option, the kernel family's default) is one task of kind
# frontal.tree, and those tasks run as one launch per size class, the items waiting for their
# children on device counters: a tree of small fronts costs one launch, not a panel, a Schur
# and an extend-add launch per level. Class c holds the subtrees whose largest front has at
# most TREE_CLASSES[c] rows (on CUDA a kernel and shape per class: the front in shared memory up
# to 96 rows, in a register tile at 128; kernels/frontal_cuda.py TREE_SHAPES); a class's launch
# waits for the classes below it.
TREE_CLASSES = (32, 64, 96, 128)


def _extend_flops(args, rows, cols, width):
    u = np.asarray(rows, dtype=np.float64)
    return u * (u + 1) / 2  # one add per entry of the update block's lower triangle


def _extend_traffic(args, rows, cols, width):
    u = np.asarray(rows, dtype=np.float64)
    return 3 * u * (u + 1) / 2  # read S_f, read and write the parent's entries


EXTEND_KIND = register(TaskKind(
    name="frontal.extend_add", op="frontal", args=("parent", "p", "u"), window=by_rows,
    launches=single(EXTEND), flops=_extend_flops, traffic=_extend_traffic,
    doc="F_parent[rel, rel] += S (lower triangle): rows = width = u, the update block's order",
), (EXTEND,))


def _tree_flops(args, rows, cols, width):
    p = args[:, 1].astype(np.float64)
    u = args[:, 2].astype(np.float64)
    # p^3/3 (L11) + p^2 u (L21) + p u^2 (the Schur complement's lower triangle, 2 flops an
    # entry a pivot) + u^2 / 2 (the extend-add)
    return p**3 / 3 + p * p * u + p * u * u + u * (u + 1) / 2


def _tree_traffic(args, rows, cols, width):
    n = (args[:, 1] + args[:, 2]).astype(np.float64)
    return n * (n + 1)  # the front's lower triangle read and written (+ the extend-add)


def _tree_window(rows, options):
    """A task's size class: its subtree's largest front (``rows``) against TREE_CLASSES, or
    one class for every task where the option ``tree_split`` is off."""
    cls = np.searchsorted(np.asarray(TREE_CLASSES), np.asarray(rows, np.int64))
    if not options.get("tree_split", True):
        return np.full(len(cls), int(cls.max()) if len(cls) else 0, np.int64)
    return cls.astype(np.int64)


TREE_KIND = register(TaskKind(
    name=TREE, op="frontal", args=("parent", "p", "u", "need"), window=_tree_window,
    launches=single(TREE), flops=_tree_flops, traffic=_tree_traffic, ordered=True,
    doc="a small front's partial Cholesky, Schur complement and extend-add in one task: args "
        "(parent, p, u, need: its children that add into it); rows: its subtree's largest "
        "front, cols: p, width: n",
), (TREE,))


def _sweep_flops(args, rows, cols, width):
    # an item reads rows x cols entries of L and does a multiply-add with each, per column of X
    return 2.0 * np.asarray(rows, np.float64) * np.asarray(cols, np.float64) * width


def _sweep_traffic(args, rows, cols, width):
    return np.asarray(rows, np.float64) * np.asarray(cols, np.float64)


def _one_window(rows, options):
    return np.zeros(len(rows), np.int64)  # a sweep is one launch whatever its sizes


def _no_flops(args, rows, cols, width):
    return np.zeros(len(rows))


SWEEP_RESET_KIND = register(TaskKind(
    name=SWEEP_RESET, op="frontal", args=(), window=_one_window,
    launches=single(SWEEP_RESET), flops=_no_flops, traffic=_no_flops,
    doc="zero the sweeps' counters (the op's own scratch, one per call): one task",
), (SWEEP_RESET,))

def _sweep_kind(name: str, which: str) -> TaskKind:
    return register(TaskKind(
        name=name, op="frontal", args=("parent", "p", "u", "i0", "need"), window=_one_window,
        launches=single(name), flops=_sweep_flops, traffic=_sweep_traffic, ordered=True,
        doc=f"an item of the {which} sweep: args (parent, p, u, i0, need); rows, cols: the rows "
            "it computes and the columns of L it reads; width: r",
    ), (name,))


def _move_traffic(args, rows, cols, width):
    return 2.0 * rows * width


SWEEP_IN_KIND, SWEEP_OUT_KIND = (register(TaskKind(
    name=name, op="frontal", args=("parent", "p", "u", "i0", "need"), window=_one_window,
    launches=single(name), flops=_no_flops, traffic=_move_traffic,
    doc=f"{what}: rows [i0, i0 + {CHUNK}) of front f (args as the sweeps' items; rows: "
        "those it moves; width: r)",
), (name,)) for name, what in (
    (SWEEP_IN, "the right-hand sides from the stacked ones (pivot rows through rows, update "
               "rows zero)"),
    (SWEEP_OUT, "the solution's pivot rows into the stacked solution y")))
SWEEP_FWD_KIND = _sweep_kind(SWEEP_FWD, "forward")
SWEEP_BWD_KIND = _sweep_kind(SWEEP_BWD, "backward")
SWEEP_FWD_SMALL_KIND = _sweep_kind(SWEEP_FWD_SMALL, "forward (small subtrees')")
SWEEP_BWD_SMALL_KIND = _sweep_kind(SWEEP_BWD_SMALL, "backward (small subtrees')")


class FrontalRequest(_Request):
    """The fronts ``a`` (a square packed batch), their pivots ``npiv``, parents ``parent``
    (a front's parent comes after it: fronts in postorder) and update-row positions ``rel``
    (a packed batch of ``(n_f - p_f) x 1`` columns, order F)."""

    a: Any
    rel: Any
    parent: Any
    npiv: Any
    overwrite: bool = True
    sync: Any = None  # the op's own scratch (device counters, a new buffer each call)

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        a, rel = v.get("a"), v.get("rel")
        for name, b in (("a", a), ("rel", rel)):
            if not isinstance(b, PackedBatch):
                raise InputError([(None, f"{name}: expected a vbatch.PackedBatch, got "
                                         f"{type(b).__name__}")])
        if v.get("sync") is not None:
            raise InputError([(None, "sync is the op's own scratch: leave it unset")])
        if v.get("overwrite", True) is not True:
            raise InputError([(None, "frontal works in place: overwrite must be True")])
        together(a=a, rel=rel)
        if not a.square:
            bad = np.flatnonzero(a.m != a.n)
            raise InputError([(int(i), f"a: not square: {a.m[i]} x {a.n[i]}") for i in bad])
        k = a.k
        # (copies, read-only: a kept call's request must not see the caller reuse its arrays)
        p = np.array(v.get("npiv"), dtype=np.int64).reshape(-1)
        par = np.array(v.get("parent"), dtype=np.int64).reshape(-1)
        p.flags.writeable = par.flags.writeable = False
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


def subtree_max(n, parent, depth=None) -> np.ndarray:
    """Each front's subtree's largest front (rows over the front and its descendants), for
    fronts in postorder; one numpy pass per level of the deepest tree."""
    big = np.array(n, dtype=np.int64)
    par = np.asarray(parent, np.int64)
    if depth is None:
        depth = tree_levels(par)[1]
    has = par >= 0
    for d in range(int(depth.max()) if len(depth) else 0, 0, -1):
        sel = np.flatnonzero(has & (depth == d))
        np.maximum.at(big, par[sel], big[sel])
    return big


def frontal_graph(req: FrontalRequest, opts: dict) -> TaskGraph:
    """The fronts' tasks. A front whose subtree's fronts all have at most ``tree_max`` rows
    (the plan option) is one frontal.tree task (its partial Cholesky, Schur complement and
    extend-add in one kernel); such tasks go in leaves-first order (by height), one launch per
    size class (TREE_CLASSES), after the counters' reset. Every other front is a
    :func:`~vbatch.ops.cholesky.potrf_graph` chain (panels, block updates, its Schur task), and
    its extend-add a task of its own. Edges: a chain's Schur task before its extend-add, every
    child's extend-add (or its tree task) before its parent's first task, and one item of each
    lower class before every item of a class (so that a class's launch starts once those
    below it have ended: an item may wait for a child of a lower class, never for one of a
    later launch)."""
    n, p, par = req.a.n, req.npiv, req.parent
    k = len(n)
    u = n - p
    limit = min(int(opts.get("tree_max", 0)), TREE_CLASSES[-1])
    height, depth = tree_levels(par)
    sub = subtree_max(n, par, depth)
    tree = sub <= limit
    fac = potrf_graph(np.where(tree, 0, n), np.where(tree, 0, p), *graph_options(opts))
    has_u = (par >= 0) & (u > 0)
    child = np.flatnonzero(has_u & ~tree)
    c = len(child)
    ext = TaskGraph(kinds=(EXTEND_KIND,), kind=np.zeros(c, np.int8), problem=child,
                    args=np.stack([par[child], p[child], u[child]], axis=1).reshape(c, 3),
                    rows=u[child], cols=np.zeros(c, np.int64), width=u[child],
                    edges=np.zeros((0, 2), np.int64), k=k)
    first, cnt = fac.chains
    off = fac.size
    row = off + np.arange(c)
    # the child's Schur task (its last) before its extend-add; that before the parent's first
    edges = [np.stack([first[child] + cnt[child] - 1, row], axis=1),
             np.stack([row, first[par[child]]], axis=1)]
    parts = [fac, ext]
    tq = np.flatnonzero(tree)
    if len(tq):
        tq = tq[np.argsort(height[tq], kind="stable")]  # children before parents
        t = len(tq)
        need = np.bincount(par[has_u], minlength=k)[tq]
        tg = TaskGraph(kinds=(TREE_KIND,), kind=np.zeros(t, np.int8), problem=tq,
                       args=np.stack([par[tq], p[tq], u[tq], need], axis=1).astype(np.int64),
                       rows=sub[tq], cols=p[tq], width=n[tq],
                       edges=np.zeros((0, 2), np.int64), k=k)
        reset = TaskGraph(kinds=(SWEEP_RESET_KIND,), kind=np.zeros(1, np.int8),
                          problem=np.zeros(1, np.int64), args=np.zeros((1, 0), np.int64),
                          rows=np.array([k]), cols=np.zeros(1, np.int64),
                          width=np.zeros(1, np.int64), edges=np.zeros((0, 2), np.int64), k=k)
        t0 = off + c
        trow = np.full(k, -1, np.int64)
        trow[tq] = t0 + np.arange(t)
        up = tq[has_u[tq] & ~tree[np.maximum(par[tq], 0)]]  # tree roots under a chain front
        edges += [np.stack([trow[up], first[par[up]]], axis=1),
                  np.stack([np.full(t, t0 + t), t0 + np.arange(t)], axis=1)]
        cls = _tree_window(sub[tq], opts)
        for lower in np.unique(cls)[:-1]:
            later = np.flatnonzero(cls > lower)
            head = t0 + int(np.flatnonzero(cls == lower)[0])
            edges.append(np.stack([np.full(len(later), head), t0 + later], axis=1))
        parts += [tg, reset]
    g, _ = concat(parts, np.concatenate(edges))
    return g


def _sig(req) -> tuple:
    return (req.a.n.tobytes(), req.npiv.tobytes(), req.parent.tobytes())


@dataclass(frozen=True)
class FrontalResult:
    """``fronts``: the factored workspace (``a`` itself); ``info``: per front, LAPACK's (the
    column of that front, 1-based, whose pivot was not positive). From ``frontal_solve``:
    ``fronts`` is ``x``, and ``solution`` the stacked solution ``y``."""

    fronts: Any
    info: np.ndarray
    plan: Any
    solution: Any = None  # frontal_solve's stacked solution y (given rhs; else empty)

    ok = CholeskyResult.ok
    failed = CholeskyResult.failed


FRONTAL_OP = register_op(Op(
    name="frontal", request=FrontalRequest,
    buffers=(Buffer("a", "a"), Buffer("l", "a", output=True), Buffer("rel", "rel"),
             Buffer("sync_in", "sync"),
             # (complete: the reset task zeroes what the tree launches read, when there are any)
             Buffer("sync", "sync", output=True, shape=lambda req: _sync_shape(req), form="a",
                    complete=True)),
    graph=frontal_graph, signature=_sig,
    result=lambda outs, info, plan: FrontalResult(outs["l"], info, plan),
    returns=(("fronts", "l"),),
    # Large fronts factor in blocks, whose updates are the blas family's GEMMs.
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=("potrf", "blas", "frontal"),
    doc="the numeric multifrontal Cholesky: partial factorizations and extend-adds, one graph",
))


class FrontalSolveRequest(FrontalRequest):
    """The solve with factored fronts ``l`` (a :class:`FrontalRequest`'s ``a``, factored):
    ``x`` holds each front's right-hand sides (``n_f x r``; the pivot rows hold b's entries,
    the update rows zeros) and comes back holding the solution in its pivot rows (its update
    rows hold the parent's solution at those rows). ``sync`` is the op's own scratch (the
    sweeps' counters, a new buffer each call): leave it unset.

    ``rhs`` and ``rows`` (together, or neither): the right-hand sides of the whole system,
    stacked, ``N x r`` row-major in problem 0 of ``rhs`` (an ``N r x 1`` column; every other
    problem ``0 x 0``), and per front the row of each pivot row in them (a ``p_f x 1`` column,
    order F, integers held as :func:`index_bits` writes them: every row of ``rhs`` once;
    checked when a request is validated, not on a prepared call's later runs, which take
    them as they are). With them, ``x``'s entries are not read: the graph fills it from
    ``rhs`` (zeros in the update rows), and the solution comes back stacked as ``rhs`` is, in
    the new output ``y``."""

    x: Any
    rhs: Any = None
    rows: Any = None
    y: Any = None  # the stacked solution, a new output (with rhs)

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
        if x.order != self.a.order:
            raise InputError([(None, f"x: order {x.order}, the fronts' {self.a.order}: the "
                                     "solve reads both in one layout")])
        if len(x.n) and x.n[0] > MAX_RHS:
            raise InputError([(None, f"x: {x.n[0]} columns, at most {MAX_RHS}")])
        if self.y is not None:
            raise InputError([(None, "y is the op's output: leave it unset")])
        self._stacked()
        return self

    def _stacked(self) -> None:
        """rhs and rows: present together, shaped as the docstring says, rows a permutation
        (its values read here, once per validated call: a replay is not validated)."""
        rhs, rows = self.rhs, self.rows
        if rhs is None and rows is None:
            return
        if rhs is None or rows is None:
            raise InputError([(None, "rhs and rows come together")])
        for name, b in (("rhs", rhs), ("rows", rows)):
            if not isinstance(b, PackedBatch):
                raise InputError([(None, f"{name}: expected a vbatch.PackedBatch, got "
                                         f"{type(b).__name__}")])
        together(a=self.a, rhs=rhs, rows=rows)
        k, p = self.a.k, self.npiv
        N, r = int(p.sum()), int(self.x.n[0]) if k else 0
        problems = [(int(i), f"rows is {rows.m[i]} x {rows.n[i]}, expected {p[i]} x 1")
                    for i in np.flatnonzero((rows.m != p) | (rows.n != 1))]
        wm, wn = np.zeros(k, np.int64), np.zeros(k, np.int64)
        wm[:1], wn[:1] = N * r, 1
        problems += [(int(i), f"rhs is {rhs.m[i]} x {rhs.n[i]}, expected {wm[i]} x {wn[i]}")
                     for i in np.flatnonzero((rhs.m != wm) | (rhs.n != wn))]
        if rows.order != "F" or rhs.order != "F":
            problems.append((None, "rhs and rows must be order F"))
        if problems:
            raise InputError(problems)
        data = rows.data.get() if rows.kind == "cupy" else np.asarray(rows.data)
        at = np.repeat(rows.offset - np.cumsum(p) + p, p) + np.arange(N)
        got = bits_index(data)[at] if N else np.zeros(0, np.int64)
        if not np.array_equal(np.sort(got), np.arange(N)):
            raise InputError([(None, f"rows: not a permutation of the {N} stacked rows")])


def index_bits(idx, dtype) -> np.ndarray:
    """Non-negative integers ``idx`` as an array of ``dtype`` holding them in its elements'
    bits (the solve's ``rows``): int32 in 4-byte elements, int64 in the first 8 bytes of wider
    ones. The kernels read them back so; no arithmetic ever touches them."""
    dt = np.dtype(dtype)
    it = np.dtype(np.int32 if dt.itemsize == 4 else np.int64)
    out = np.zeros(len(idx), dt)
    out.view(it)[::dt.itemsize // it.itemsize] = idx
    return out


def bits_index(values: np.ndarray) -> np.ndarray:
    """The integers :func:`index_bits` put in ``values`` (a contiguous host array), as int64."""
    it = np.dtype(np.int32 if values.dtype.itemsize == 4 else np.int64)
    return values.view(it)[::values.dtype.itemsize // it.itemsize].astype(np.int64)


def _solution_shape(req) -> tuple:
    """``y``: ``rhs``'s sizes (empty without it)."""
    if req.rhs is None:
        k = req.a.k
        return np.zeros(k, np.int64), np.zeros(k, np.int64)
    return req.rhs.m, req.rhs.n


def _sync_shape(req) -> tuple:
    """The device counters of the factor's tree tasks and of the solve's sweeps: per front
    ``[children's extend-adds (factor) or update items (solve) added into it, pivot chunks
    solved forward, pivot chunks solved backward]``, and after front 0's the tickets (the
    solve's two sweeps at 3 and 4, its small subtrees' at 5 and 6; the factor's tree launches
    at 3 + their class), as 32-bit
    counters over 4 (front 0: 8) entries of the working dtype."""
    cache = req.a.cache()  # the fronts' own: one pair of read-only arrays (tight_layout)
    hit = cache.get("frontal.sync")
    if hit is None:
        k = req.a.k
        m = np.full(k, 4, np.int64)
        if k:
            m[0] = 8
        n = np.ones(k, np.int64)
        m.flags.writeable = n.flags.writeable = False
        hit = cache["frontal.sync"] = (m, n)
    return hit


def tree_levels(parent) -> tuple[np.ndarray, np.ndarray]:
    """Each front's height (leaves 0, a parent one above its highest child) and depth (roots
    0), for fronts in postorder; one numpy pass per level of the deepest tree."""
    par = np.asarray(parent, np.int64)
    k = len(par)
    depth = np.zeros(k, np.int64)
    anc = par.copy()
    while (live := anc >= 0).any():
        depth += live
        anc = np.where(live, par[np.maximum(anc, 0)], -1)
    height = np.zeros(k, np.int64)
    if k:
        has = par >= 0
        for d in range(int(depth.max()), 0, -1):
            sel = np.flatnonzero(has & (depth == d))
            np.maximum.at(height, par[sel], height[sel] + 1)
    return height, depth


def _expand(fronts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``fronts`` repeated its ``counts[front]`` times, and each copy's place among its
    front's (0, 1, ...): a front's items or chunks, in the order of ``fronts``."""
    c = counts[fronts]
    f = np.repeat(fronts, c)
    return f, np.arange(len(f)) - np.repeat(np.cumsum(c) - c, c)


def sweep_items(n, p, parent, split: int = SWEEP_SPLIT) -> tuple:
    """The two sweeps' items, as arrays: ``(front, i0)`` of each forward item in the order
    the forward sweep takes them, of each backward item, each front's ``need`` (forward:
    its children's items that add update rows into it; backward: its parent's pivot chunks),
    and which fronts are in small subtrees (``lone``: every front of its subtree small).

    A small front (at most ``SMALL_FRONT`` rows) is one item, a warp's, and its children wait
    for that one. A larger front of ``p`` pivots and ``u`` update rows has ``ceil(p / CHUNK)``
    pivot chunks. Forward,
    item ``i0 < p`` solves the chunk starting at row ``i0`` (after the earlier chunks), and the
    last one also takes update rows ``[p, p + UPDATE_ROWS)``; items ``i0 >= p`` take update rows
    ``[i0, i0 + UPDATE_ROWS)``. An item with update rows adds ``X[rows] - L[rows, :p] y`` into
    the parent's rows. Backward, item ``i0`` solves the chunk at ``i0`` with ``L^T`` (last chunk
    first); the front's last chunk also copies the update rows' solution from the parent.

    A small subtree's fronts are items of the small launches (``SWEEP_FWD_SMALL``, first,
    and ``SWEEP_BWD_SMALL``, last), one item each with ``i0 = -1``, where they number at
    least ``split`` or are every front (else ``lone`` is all False); the other small fronts
    share blocks in groups of one level.

    Order: fronts by height forward (every leaf of every tree first) and by depth backward
    (every root first), a front's items together; forward the small subtrees' fronts before
    the others, backward after them. Any order where each item comes after what
    it needs would do; this one puts many independent items side by side among the blocks
    running at once. In postorder instead (a tree after a tree), the 1000 Laplacians'
    backward sweep took 11.3 ms against 1.7 forward (H100, 2026-11-25): the running blocks
    held a dozen trees, each walked down its depth one item at a time."""
    n, p, par = (np.asarray(v, np.int64) for v in (n, p, parent))
    k = len(n)
    u = n - p
    small = n <= SMALL_FRONT  # one item, a warp's: every pivot and update row
    npc = np.where(small, 1, -(-p // CHUNK))  # (the items a front's children wait for, back)
    extra = np.where(small, 0, np.maximum(0, -(-(u - UPDATE_ROWS) // UPDATE_ROWS)))
    height, depth = tree_levels(par)
    lone = subtree_max(n, par, depth) <= SMALL_FRONT
    if lone.sum() < split and not lone.all():
        lone[:] = False
    f_fwd, j = _expand(np.lexsort((height, ~lone)), npc + extra)
    i0_fwd = np.where(j < npc[f_fwd], j * CHUNK, p[f_fwd] + (j - npc[f_fwd] + 1) * UPDATE_ROWS)
    has = par >= 0
    need_fwd = np.bincount(par[has], weights=-(-u[has] // UPDATE_ROWS),
                           minlength=k).astype(np.int64)
    f_bwd, jb = _expand(np.lexsort((depth, lone)), npc)
    i0_bwd = (npc[f_bwd] - 1 - jb) * CHUNK
    need_bwd = np.where(has, npc[np.maximum(par, 0)], 0)
    grouped = small & ~lone
    i0_fwd = np.where(lone[f_fwd], -1, _small_groups(f_fwd, i0_fwd, grouped, height))
    i0_bwd = np.where(lone[f_bwd], -1, _small_groups(f_bwd, i0_bwd, grouped, depth))
    return f_fwd, i0_fwd, need_fwd, f_bwd, i0_bwd, need_bwd, lone


def _small_groups(f, i0, small, level) -> np.ndarray:
    """Runs of small fronts' items (one item each) on one level, cut into groups of up to
    SMALL_GROUP: the group's first item gets ``i0 = -size``, the others ``-SMALL_GROUP - 1``
    (their rows are run by the first one's block, a warp each: the fronts of one level never
    wait for each other)."""
    i0 = i0.copy()
    sm = small[f]
    if not sm.any():  # (no small front: nothing to group)
        return i0
    lv = level[f]
    start = sm & np.r_[True, ~sm[:-1] | (lv[1:] != lv[:-1])]
    run = np.cumsum(start) - 1
    idx = np.arange(len(f))
    first = np.flatnonzero(start)
    pos = idx - first[np.maximum(run, 0)]
    length = np.diff(np.r_[first, len(f)])
    # a run ends where it starts again or where a front is not small
    end = np.r_[np.flatnonzero(~sm), len(f)]
    run_end = end[np.searchsorted(end, first)]
    length = np.minimum(length, run_end - first)
    size = np.minimum(SMALL_GROUP, length[np.maximum(run, 0)] - (pos - pos % SMALL_GROUP))
    head = sm & (pos % SMALL_GROUP == 0)
    i0[sm] = -SMALL_GROUP - 1
    i0[head] = -size[head]
    return i0


def frontal_solve_graph(req: FrontalSolveRequest, opts: dict) -> TaskGraph:
    """Forward (leaves first) then backward (roots first) substitution over every front of the
    batch, as three launches whatever the trees' depth: the counters' reset, the forward sweep
    and the backward sweep (:func:`sweep_items`); five where the small subtrees' fronts have
    launches of their own (the first forward, the last backward; then only those three if
    every front is in one). A sweep's items wait for what they need on
    device counters (``TaskKind.ordered``), so the graph orders only the launches: reset before
    every forward item, every forward item before its front's first backward item, and a front's
    last forward item before each of its backward items (so both policies put each sweep on
    one level). A chain of small launches per front, as before, walked each tree's depth
    twice: 771 launches for bcsstk16 (203 fronts), 4.8 ms (H100, 2026-11-25).
    With ``rhs``, two launches more: the moves in first (every one before the reset), the
    moves out last (every one after the first item of the last backward launch)."""
    n, p, par = req.a.n, req.npiv, req.parent
    k = len(n)
    r = int(req.x.n[0]) if k else 0
    if r == 0 or k == 0:
        return TaskGraph(kinds=(), kind=np.zeros(0, np.int8), problem=np.zeros(0, np.int64),
                         args=np.zeros((0, 0), np.int64), rows=np.zeros(0, np.int64),
                         cols=np.zeros(0, np.int64), width=np.zeros(0, np.int64),
                         edges=np.zeros((0, 2), np.int64), k=k)
    u = n - p
    f_f, i0_f, need_f, f_b, i0_b, need_b, lone = sweep_items(
        n, p, par, int(opts.get("sweep_split", SWEEP_SPLIT)))
    nf, nb_ = len(f_f), len(f_b)
    # (a small front's item is its chunk at 0: its shape, for the plan and the floor)
    i0_f, i0_b, code_f, code_b = np.maximum(i0_f, 0), np.maximum(i0_b, 0), i0_f, i0_b
    # forward rows and the columns each reads
    piv = i0_f < p[f_f]
    last = piv & (i0_f + CHUNK >= p[f_f])
    h = np.where(piv, np.minimum(CHUNK, p[f_f] - i0_f), 0)
    upd = np.where(piv, np.where(last, np.minimum(u[f_f], UPDATE_ROWS), 0),
                   np.minimum(UPDATE_ROWS, n[f_f] - i0_f))
    rows_f = h + upd
    cols_f = np.where(rows_f > 0, (h * (i0_f + h) + upd * p[f_f]) // np.maximum(rows_f, 1), 0)
    hb = np.minimum(CHUNK, p[f_b] - i0_b)
    rows_b, cols_b = n[f_b] - i0_b, hb
    # a small front's one item: its whole front
    sf, sb = code_f < 0, code_b < 0
    rows_f[sf], cols_f[sf] = n[f_f[sf]], p[f_f[sf]]
    rows_b[sb], cols_b[sb] = n[f_b[sb]], p[f_b[sb]]

    def args(f, i0, need):
        return np.stack([par[f], p[f], u[f], i0, need], axis=1).astype(np.int64)

    # kinds: 0 the reset, 1 and 4 the small subtrees' sweeps, 2 and 3 the others'
    kf, kb = np.where(lone[f_f], 1, 2), np.where(lone[f_b], 4, 3)
    kind = np.concatenate([[0], kf, kb]).astype(np.int8)
    problem = np.concatenate([[0], f_f, f_b]).astype(np.int64)
    a = np.concatenate([np.zeros((1, 5), np.int64), args(f_f, code_f, need_f[f_f]),
                        args(f_b, code_b, need_b[f_b])])
    rows = np.concatenate([[k], rows_f, rows_b]).astype(np.int64)
    cols = np.concatenate([[0], cols_f, cols_b]).astype(np.int64)
    width = np.full(1 + nf + nb_, r, np.int64)
    fwd = 1 + np.arange(nf)
    bwd = 1 + nf + np.arange(nb_)
    first_b = np.full(k, len(kind), np.int64)
    np.minimum.at(first_b, f_b, bwd)  # each front's first backward item (its last chunk)
    last_f = np.full(k, -1, np.int64)
    last_f[f_f] = fwd  # each front's last forward item (a front's items are together)
    edges = [np.stack([np.zeros(nf, np.int64), fwd], 1), np.stack([fwd, first_b[f_f]], 1),
             np.stack([last_f[f_b], bwd], 1)]
    # the launches' order: the small subtrees' forward before the others', their backward after
    # (one edge from a first item: the planner keeps an ordered kind's items on one level)
    for a_, b_ in ((fwd[kf == 1], fwd[kf == 2]), (bwd[kb == 3], bwd[kb == 4])):
        if len(a_) and len(b_):
            edges.append(np.stack([np.full(len(b_), a_[0]), b_], 1))
    kinds = (SWEEP_RESET_KIND, SWEEP_FWD_SMALL_KIND, SWEEP_FWD_KIND, SWEEP_BWD_KIND,
             SWEEP_BWD_SMALL_KIND)
    if req.rhs is not None:
        # The moves, a task per CHUNK rows of a front (a warp's each on CUDA: a front's rows in
        # one task made a chain of dependent loads as long as the front). Every move in before
        # the reset (so before every forward item, whose levels the planner pins to their
        # lowest), every move out after the first item of the last backward launch.
        fi, ci = _expand(np.arange(k), -(-n // CHUNK))  # (in: every row; out: the pivots)
        fo, co = _expand(np.arange(k), -(-p // CHUNK))
        si, so = ci * CHUNK, co * CHUNK  # (each task's first row)
        tin = len(kind) + np.arange(len(fi))
        tout = len(kind) + len(fi) + np.arange(len(fo))
        last = bwd[kb == 4][0] if (kb == 4).any() else bwd[0]
        kind = np.concatenate([kind, np.full(len(fi), 5, np.int8), np.full(len(fo), 6, np.int8)])
        problem = np.concatenate([problem, fi, fo])
        zi, zo = np.zeros(len(fi), np.int64), np.zeros(len(fo), np.int64)
        a = np.concatenate([a, args(fi, si, zi), args(fo, so, zo)])
        rows = np.concatenate([rows, np.minimum(CHUNK, n[fi] - si),
                               np.minimum(CHUNK, p[fo] - so)]).astype(np.int64)
        cols = np.concatenate([cols, zi, zo])
        width = np.full(len(kind), r, np.int64)
        edges += [np.stack([tin, np.zeros(len(tin), np.int64)], 1),
                  np.stack([np.full(len(tout), last), tout], 1)]
        kinds += (SWEEP_IN_KIND, SWEEP_OUT_KIND)
    return TaskGraph(kinds=kinds, kind=kind, problem=problem, args=a, rows=rows, cols=cols,
                     width=width, edges=np.concatenate(edges), k=k)


def _solve_sig(req) -> tuple:
    return _sig(req) + (req.x.n.tobytes(), req.rhs is not None)


FRONTAL_SOLVE_OP = register_op(Op(
    name="frontal_solve", request=FrontalSolveRequest,
    buffers=(Buffer("l", "a"), Buffer("rel", "rel"), Buffer("b", "x"),
             Buffer("x", "x", output=True), Buffer("sync_in", "sync"),
             # (complete: the reset, before every sweep, zeroes every counter they read)
             Buffer("sync", "sync", output=True, shape=_sync_shape, form="x", complete=True),
             Buffer("rhs", "rhs"), Buffer("rows", "rows", checked=True),
             # (complete: the out tasks write every row, rows being a permutation)
             Buffer("y", "y", output=True, shape=_solution_shape, form="x", complete=True)),
    graph=frontal_solve_graph, signature=_solve_sig,
    result=lambda outs, info, plan: FrontalResult(outs["x"], info, plan, outs["y"]),
    returns=(("fronts", "x"), ("solution", "y")),
    families=("frontal",),
    doc="the multifrontal solve: a forward and a backward sweep over the fronts, one graph",
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
