"""The numeric factorization of a batch of sparse matrices and its solves: :func:`cholesky`
gives a :class:`Factor` (fronts on the runtime's device, the analyses kept for ``refactor``),
whose ``solve`` gives :class:`Solutions`."""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import scipy.sparse as sp

from vbatch.core.batch import ListLike, PackedBatch, array_kind
from vbatch.core.errors import InputError
from vbatch.sparse.analysis import (
    RELAX_WIDTH,
    RELAX_ZEROS,
    Lower,
    _shift_segments,
    _sym_graph,
    _tree_height,
    analyze,
    lower_triangle,
)
from vbatch.ops.frontal import FRONTAL_OP, FRONTAL_SOLVE_OP, index_bits


def _lower(A: Any, i: int, dtype) -> Lower:
    """Matrix ``i``'s lower triangle (canonical CSC), or an ``InputError`` naming it."""
    def bad(why: str) -> InputError:
        return InputError([(None, f"matrix {i}: {why}")], what="sparse matrices")

    if not sp.issparse(A):
        raise bad(f"expected a scipy sparse matrix, got {type(A).__name__}")
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise bad(f"not square: shape {A.shape}")
    if A.shape[0] == 0:
        raise bad("empty (0 x 0)")
    if not (np.issubdtype(A.dtype, np.floating) or np.issubdtype(A.dtype, np.integer)):
        raise bad(f"unsupported dtype {A.dtype} (real matrices only)")
    try:
        return lower_triangle(A, dtype)
    except ValueError as exc:
        raise bad(str(exc)) from None


@dataclass
class Stats:
    """What the factorization holds and what it took (seconds)."""

    matrices: int
    n: list
    fronts: int
    nnz_l: int
    flops: float
    largest_front: int
    analysis_s: float = 0.0
    factor_s: float = 0.0
    solve_s: float = 0.0
    levels: int = 0  # the height of the tallest assembly tree (fronts on its longest path)
    per_matrix: list = field(default_factory=list)


_SHAPE = attrgetter("shape")
_STRIDES = attrgetter("strides")
_DTYPE = attrgetter("dtype")
_PTR = attrgetter("data.ptr")


class Solutions(ListLike):
    """A batch's solutions (:meth:`Factor.solve` given a list) as a read-only sequence: each
    is a view of one stacked array, made when first touched, in its right-hand side's shape
    and kind; so a solve of 1,000 matrices makes no Python object per matrix until one is
    read. Indexing, slicing, ``len``, iteration and ``list(...)`` work as on a list."""

    __slots__ = ("_sol", "_row0", "_shapes", "_kinds", "_xp")
    _items = "solutions"

    def __init__(self, sol, row0: np.ndarray, shapes: list, kinds: list | None, xp):
        self._sol, self._row0, self._shapes, self._kinds, self._xp = sol, row0, shapes, kinds, xp

    def __len__(self) -> int:
        return len(self._shapes)

    def _one(self, i: int):
        x = self._sol[int(self._row0[i]): int(self._row0[i + 1])].reshape(self._shapes[i])
        return x if self._kinds is None else Factor._as_kind(x, self._kinds[i], self._xp)

    def __repr__(self) -> str:
        return f"Solutions({len(self)} of {type(self._sol).__module__.split('.')[0]} arrays)"


class Factor:
    """The factors of one matrix or a batch of them (:func:`cholesky`)."""

    def __init__(self, mats: list, batched: bool, runtime, dtype, ordering, relax_width,
                 relax_zeros):
        t0 = time.perf_counter()
        self._rt = runtime
        self._batched = batched
        self.dtype = np.dtype(dtype)
        lowers = _read(mats, self.dtype)
        # "auto" orders by the backend's cost model (its frontal kernels' ORDER_COST), where
        # it has one: on a GPU a tall tree of small fronts costs its launches, not its flops.
        cost = getattr(runtime.backend._op("frontal"), "ORDER_COST", None)
        self.analyses = _analyses(lowers, ordering, relax_width, relax_zeros, cost)
        self._assemble_layout()
        t1 = time.perf_counter()
        self.stats = Stats(
            matrices=len(mats), n=[a.n for a in self.analyses], fronts=len(self._size),
            nnz_l=sum(a.nnz_l for a in self.analyses),
            flops=sum(a.flops for a in self.analyses),
            largest_front=int(self._size.max()), analysis_s=t1 - t0, levels=self._height(),
            per_matrix=[{"n": a.n, "fronts": a.fronts, "nnz_l": a.nnz_l, "flops": a.flops}
                        for a in self.analyses])
        self._values = [lw.data for lw in lowers]  # each matrix's, in its analysis' order
        self._factor(self._values)

    # ------------------------------------------------------------------ layout
    def _assemble_layout(self) -> None:
        # Vectorized over the batch: each array is the analyses' arrays stacked, shifted by
        # their matrix's first row, front or workspace offset (_stack). One array op per
        # matrix was 58 ms for the 1000 Laplacians (2-core VM); matrices of one pattern
        # share an analysis, and with it the per-analysis arrays below.
        an = self.analyses
        xp = self._xp()
        nf = np.array([a.fronts for a in an], dtype=np.int64)
        self._front0 = np.concatenate([[0], np.cumsum(nf)])
        self._row0 = np.concatenate([[0], np.cumsum([a.n for a in an])]).astype(np.int64)
        size = np.concatenate([a.size for a in an]).astype(np.int64)
        width = np.concatenate([a.width for a in an]).astype(np.int64)
        first = _stack([a.first for a in an], self._row0[:-1])
        parent = _stack([a.parent for a in an], self._front0[:-1])
        parent[parent < np.repeat(self._front0[:-1], nf)] = -1  # roots: -1 + f0 < f0
        offset = np.zeros(len(size), np.int64)
        np.cumsum(size[:-1] ** 2, out=offset[1:])
        moff = offset[self._front0[:-1]]
        self._amap = xp.asarray(_stack([a.amap for a in an], moff).astype(np.int64))
        total = int((size**2).sum())
        self._size, self._width, self._first, self._parent = size, width, first, parent
        self._offset = offset
        self._work = PackedBatch(data=xp.zeros(total, dtype=self.dtype), m=size, n=size,
                                 offset=offset, ld=size, order="F")
        # Update rows of each front, positions in the parent, and global rows (front rows).
        u = size - width
        self._rows = _stack([a.rows for a in an], self._row0[:-1])
        self._fptr = np.concatenate([[0], np.cumsum(size)])
        rel = np.concatenate([a.update_rel for a in an])
        roff = np.zeros(len(size), np.int64)
        np.cumsum(u[:-1], out=roff[1:])
        self._rel = PackedBatch(data=xp.asarray(rel.astype(self.dtype)), m=u,
                                n=np.ones(len(u), np.int64), offset=roff,
                                ld=np.maximum(u, 1), order="F")
        self._layouts: dict = {}  # the solve's right-hand-side layouts, per column count
        self._prepared: dict = {}  # (op, right-hand-side columns) -> its prepared call
        # global permuted row -> its row in the matrices' stacked original numbering (the
        # solve's maps are made from it, once per column count: _layout)
        self._gperm = _stack([a.perm for a in an], self._row0[:-1])

    def _xp(self):
        xp = self.__dict__.get("_xpm")  # (found once: an import statement a solve costs ~1 us)
        if xp is None:
            if self._rt.backend.kind == "cupy":
                import cupy as xp
            else:
                xp = np
            self._xpm = xp
        return xp

    # ------------------------------------------------------------------ numeric
    def _factor(self, values) -> None:
        """The numeric phase: ``values`` (each matrix's lower-triangle data, as analysed; or
        all of them in one array, already on the device) scattered into the zeroed fronts,
        then one submission."""
        t0 = time.perf_counter()
        xp = self._xp()
        if isinstance(values, list):
            values = np.concatenate(values)
        self._rt.backend.assemble(self._work.data, self._amap,
                                  xp.asarray(values).astype(self.dtype, copy=False))
        res = self._run(FRONTAL_OP).result()
        self.info = self._matrix_info(res.info)
        # the rows every solve sets to NaN (a failed matrix's), or None: found once here, not
        # on each solve's path (numpy's any() is ~3 us of a small solve's host time)
        self._nan_rows = (np.repeat(self.info != 0, np.diff(self._row0))
                          if self.info.any() else None)
        self.stats.factor_s = time.perf_counter() - t0

    def _run(self, op, r: int | None = None, **operands):
        """Run ``op`` over this factor's fronts as a prepared call, made on the first run from
        this factor's own operands (the solve's, for ``r`` columns, from the templates of
        :meth:`_layout`: a caller's array is never kept); ``operands``: the solve's ``x`` and
        ``rhs`` for this run, twins (``with_data``) of those templates, so a later run replays
        it (no validation, no staging). Validating a request of 40,000 fronts costs
        milliseconds, and a small matrix's whole factorization is a fraction of one on the
        GPU."""
        key = (op.name, r)
        p = self._prepared.get(key)
        if p is None:
            fields = dict(a=self._work, rel=self._rel, parent=self._parent, npiv=self._width,
                          overwrite=True)
            if r is not None:
                tmpl, stacked = self._layout(r, self._xp())
                fields.update(x=tmpl, rhs=stacked, rows=self._pivot_rows)
            p = self._prepared[key] = self._rt.prepare(op, **fields)
        return p.run(**operands)

    def _matrix_info(self, finfo: np.ndarray) -> np.ndarray:
        info = np.zeros(len(self.analyses), np.int64)
        bad = np.flatnonzero(finfo > 0)
        if len(bad):
            col = self._first[bad] + finfo[bad] - 1  # global permuted column
            mat = np.searchsorted(self._row0, col, side="right") - 1
            for m in np.unique(mat):
                c = int(col[mat == m].min()) - int(self._row0[m])
                info[m] = int(self.analyses[m].perm[c]) + 1
        return info

    def refactor(self, A_new: Any) -> "Factor":
        """Factor matrices with the same patterns again, reusing the analysis (in place;
        returns ``self``). ``A_new``: a matrix, or a list as given to :func:`cholesky`."""
        mats = list(A_new) if self._batched else [A_new]
        if len(mats) != len(self.analyses):
            raise InputError([(None, f"expected {len(self.analyses)} matrices, got "
                                     f"{len(mats)}")], what="sparse matrices")
        vals = []
        for i, (lw, an) in enumerate(zip(_read(mats, self.dtype), self.analyses)):
            if not lw.same_pattern(an.lower):
                raise InputError([(None, f"matrix {i}: its pattern differs from the analysed "
                                         "one (refactor needs the same pattern)")],
                                 what="sparse matrices")
            vals.append(lw.data)
        self._values = vals
        self._factor(vals)
        return self

    def factor(self, i: int = 0) -> tuple[sp.csc_matrix, np.ndarray]:
        """Matrix ``i``'s factor as scipy CSC ``L`` and its permutation ``perm``:
        ``L @ L.T == A[perm][:, perm]`` (copied to the host)."""
        an = self.analyses[i]
        f0, f1 = int(self._front0[i]), int(self._front0[i + 1])
        data = self._work.data
        data = data.get() if hasattr(data, "get") else data
        rows, cols, vals = [], [], []
        r0 = int(self._row0[i])
        for f in range(f0, f1):
            s, w, o = int(self._size[f]), int(self._width[f]), int(self._offset[f])
            block = data[o: o + s * w].reshape(w, s).T  # column-major s x w
            rr = self._rows[self._fptr[f]: self._fptr[f + 1]] - r0
            cc = np.arange(self._first[f], self._first[f] + w) - r0
            rg, cg = np.meshgrid(rr, cc, indexing="ij")
            keep = rg >= cg
            rows.append(rg[keep])
            cols.append(cg[keep])
            vals.append(block[keep])
        L = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(an.n, an.n))
        return L, an.perm.copy()

    # ------------------------------------------------------------------ solve
    def solve(self, b: Any) -> Any:
        """``A x = b``: ``b`` of shape (n,) or (n, r), numpy or cupy; the solution comes back
        in the same form and kind. For a batch, a list of them (one a matrix; back comes a
        list-like :class:`Solutions`, each in its right-hand side's shape and kind), or
        one array of shape (N,) or (N, r) holding every matrix's rows one after another
        (N = the sum of their orders; one array back, in the same form). Matrices whose
        ``info`` is set get NaN."""
        t0 = time.perf_counter()
        N = int(self._row0[-1])
        kind = array_kind(b)
        if not self._batched or kind is not None:  # one array: a matrix's, or stacked rows
            if kind is None or b.ndim not in (1, 2) or b.shape[0] != N:
                who = "stacked right-hand sides" if self._batched else "right-hand side 0"
                raise InputError([(None, f"{who}: expected an array of shape ({N},) or ({N}, r), "
                                         f"got {getattr(b, 'shape', type(b).__name__)}")],
                                 what="right-hand sides")
            xp = self._xp()
            r = 1 if b.ndim == 1 else b.shape[1]
            if (xp is np) != (kind == "numpy") or b.dtype != self.dtype:
                b = xp.asarray(b.get() if xp is np and kind == "cupy" else b, dtype=self.dtype)
            # (a 1-D b in and out as it is: a cupy reshape is ~2 us of a small solve's host path)
            flat = self._solved(b if b.ndim == 1 else b.reshape(-1), r, xp)
            out = self._as_kind(flat if b.ndim == 1 else flat.reshape(b.shape), kind, xp)
            self.stats.solve_s = time.perf_counter() - t0
            return out
        bs = list(b)
        if len(bs) != len(self.analyses):
            raise InputError([(None, f"expected {len(self.analyses)} right-hand sides, "
                                     f"got {len(bs)}")], what="right-hand sides")
        kinds, shapes = self._describe(bs)
        ndims = set(map(len, shapes))  # (one pass per attribute: no Python step per array)
        if ndims == {1}:
            r = {1}
        elif ndims == {2}:
            r = set(map(itemgetter(1), shapes))
        else:
            r = {1 if len(s) == 1 else s[1] for s in shapes}
        if len(r) != 1:
            raise InputError([(None, "every right-hand side needs the same number of columns")],
                             what="right-hand sides")
        r = r.pop()
        xp = self._xp()
        one = kinds[0] if len(set(kinds)) == 1 else None  # the kind of them all, if one
        if r and one == "cupy" and xp is not np and len(set(map(_DTYPE, bs))) == 1:
            # one gather kernel (as a list of dense operands is), each b an n x r matrix
            # of the stacked (N, r) rows: cupy.concatenate and a reshape per array were
            # most of a 1000-matrix solve
            isz = np.dtype(self.dtype).itemsize
            if bs[0].dtype != self.dtype:
                bs = [x.astype(self.dtype) for x in bs]
            addr = np.empty((3, len(bs)), np.int64)
            addr[0] = np.fromiter(map(_PTR, bs), np.int64, len(bs))
            strides = list(map(_STRIDES, bs))
            addr[1] = np.fromiter(map(itemgetter(0), strides), np.int64, len(bs)) // isz
            addr[2] = 1 if r == 1 else np.fromiter(
                map(itemgetter(-1), strides), np.int64, len(bs)) // isz
            rows = np.diff(self._row0)
            src = xp.empty(N * r, dtype=self.dtype)
            self._rt.backend.copy_in(bs, src, rows, np.full(len(bs), r, np.int64),
                                     self._row0[:-1] * r, np.full(len(bs), r, np.int64),
                                     addr)
        elif r:
            # host right-hand sides go over in one copy, not one per matrix; device ones
            # come to the host for the CPU backend
            host = one == "numpy" or xp is np
            parts = [(x.get() if kd == "cupy" else np.asarray(x)) if host else xp.asarray(x)
                     for x, kd in zip(bs, kinds)]
            mod = np if host else xp
            if len(ndims) == 1:  # one ndim: no reshape per array
                stack = mod.concatenate(parts)
            else:
                stack = mod.concatenate([p.reshape(an.n, r)
                                         for p, an in zip(parts, self.analyses)])
            src = xp.asarray(stack, dtype=self.dtype).reshape(-1)
        else:
            src = None
        sol = self._solved(src, r, xp).reshape(N, r)
        if one is not None:
            sol = self._as_kind(sol, one, xp)  # one copy for them all, where one is needed
        out = Solutions(sol, self._row0, shapes, None if one is not None else kinds, xp)
        self.stats.solve_s = time.perf_counter() - t0
        return out

    def _solved(self, src, r: int, xp):
        """The solution (``N * r`` entries, row by row, on this factor's device) of the stacked
        right-hand sides ``src`` (as many, of the factor's dtype and device); the rows of
        failed matrices NaN."""
        N = int(self._row0[-1])
        if r:
            # (the solve's graph moves src into the fronts and the solution out: no gathers
            # beside it, each a launch and ~5 us of the host's time)
            tmpl, stacked = self._layout(r, xp)
            x = tmpl.with_data(xp.empty(tmpl.data.size, dtype=self.dtype))
            if not src.flags.c_contiguous:
                src = xp.ascontiguousarray(src)
            res = self._run(FRONTAL_SOLVE_OP, r, x=x, rhs=stacked.with_data(src)).result()
            sol = res.solution.data  # (problem 0 holds it all: no padding)
        else:
            sol = xp.zeros(0, dtype=self.dtype)
        if self._nan_rows is not None:  # one assignment: the rows of every failed matrix
            sol.reshape(N, r)[xp.asarray(self._nan_rows)] = np.nan
        return sol

    def _describe(self, bs: list) -> tuple[list, list]:
        """Each right-hand side's kind and shape, checked against its matrix's order: by one
        pass per attribute over the list where every array is of one numpy or cupy type (a
        Python step per array cost ~3 us of each matrix of a batch's solve); else, or for any
        problem, array by array (naming the first bad one)."""
        orders = np.diff(self._row0)
        if len(bs) > 1 and len(set(map(type, bs))) == 1:
            kind = array_kind(bs[0])
            if kind is not None:
                shapes = list(map(_SHAPE, bs))
                if set(map(len, shapes)) <= {1, 2} and np.array_equal(
                        np.fromiter(map(itemgetter(0), shapes), np.int64, len(bs)), orders):
                    return [kind] * len(bs), shapes
        kinds = [array_kind(x) for x in bs]
        shapes = []
        for i, (x, kd, an) in enumerate(zip(bs, kinds, self.analyses)):
            if kd is None or x.ndim not in (1, 2) or x.shape[0] != an.n:
                raise InputError([(None, f"right-hand side {i}: expected an array of shape "
                                         f"({an.n},) or ({an.n}, r), got "
                                         f"{getattr(x, 'shape', type(x).__name__)}")],
                                 what="right-hand sides")
            shapes.append(x.shape)
        return kinds, shapes

    @staticmethod
    def _as_kind(a, kind: str, xp):
        if kind == "numpy" and xp is not np:
            return a.get()
        if kind == "cupy" and xp is np:
            import cupy

            return cupy.asarray(a)
        return a

    def _layout(self, r: int, xp):
        """The solve's operands for ``r`` columns (made once per column count, and reused
        through with_data, so that its plan, device tables and CUDA graph are found again):
        the fronts' workspace ``x`` (each front's ``n_f x r`` block, column-major, back to
        back) and the stacked right-hand sides (``N x r`` row-major, all in problem 0); their
        ``rows``, one for every column count, is :attr:`_pivot_rows`."""
        hit = self._layouts.get(r)
        if hit is None:
            size, k = self._size, len(self._size)
            off = np.zeros(k, np.int64)
            np.cumsum(size[:-1] * r, out=off[1:])
            tmpl = PackedBatch(data=xp.zeros(int(size.sum()) * r, dtype=self.dtype), m=size,
                               n=np.full(k, r, np.int64), offset=off, ld=size, order="F")
            N = len(self._gperm)
            m, c = np.zeros(k, np.int64), np.zeros(k, np.int64)
            m[:1], c[:1] = N * r, 1  # (the other problems 0 x 0: no padding)
            stacked = PackedBatch(data=xp.zeros(N * r, dtype=self.dtype), m=m, n=c,
                                  offset=np.zeros(k, np.int64), ld=np.maximum(m, 1), order="F")
            hit = self._layouts[r] = (tmpl, stacked)
        return hit

    @functools.cached_property
    def _pivot_rows(self) -> PackedBatch:
        """The solve's ``rows``, one for every column count: front f's pivot rows are the
        global permuted rows from ``_first[f]``, and ``_gperm`` maps those to stacked rows."""
        return PackedBatch(data=self._xp().asarray(index_bits(self._gperm, self.dtype)),
                           m=self._width, n=np.ones(len(self._width), np.int64),
                           offset=np.asarray(self._first, np.int64),
                           ld=np.maximum(self._width, 1), order="F")

    def _height(self) -> int:
        return int(_tree_height(self._parent))


def _read(mats: list, dtype) -> list:
    """Every matrix's lower triangle (:func:`_lower`), in threads for a large batch: the
    compiled reading releases the GIL, and takes ~30-50 us a small matrix (2-core VM), most of
    the batch's analysis once its patterns repeat. The first bad matrix in the list raises."""
    workers = min(os.cpu_count() or 1, 8)
    if len(mats) < 256 or workers < 2:
        return [_lower(A, i, dtype) for i, A in enumerate(mats)]
    step = -(-len(mats) // (4 * workers))
    chunks = [range(s, min(s + step, len(mats))) for s in range(0, len(mats), step)]
    with ThreadPoolExecutor(workers) as ex:
        parts = ex.map(lambda r: [_lower(mats[i], i, dtype) for i in r], chunks)
        return [lw for part in parts for lw in part]


def _stack(arrays: list, shift: np.ndarray) -> np.ndarray:
    """``arrays`` end to end (int64), each plus its ``shift``."""
    out = np.concatenate(arrays).astype(np.int64, copy=False)
    _shift_segments(out, np.array([len(x) for x in arrays], np.int64),
                    np.asarray(shift, np.int64))
    return out


def _analyses(lowers: list, ordering, relax_width, relax_zeros, cost=None) -> list:
    """One analysis per matrix; matrices of one pattern share one (a batch of many similar
    problems, a mesh's blocks, often repeats its patterns: the 1000 Laplacians of the cuDSS
    anchor have 33). The pattern alone decides an analysis, so sharing changes nothing else.
    Not with an ordering given as an array: that is one matrix's."""
    if not isinstance(ordering, str):
        return [analyze(lw, ordering, relax_width, relax_zeros) for lw in lowers]
    keys = [lw.pattern_key() for lw in lowers]
    first: dict = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    # METIS's orders of the distinct patterns, in worker processes where there are many
    # (dissect.orders_of), while this thread scores the other candidates: one METIS call at a
    # time was ~70% of the 1000 Laplacians' analysis (2-core VM, 2026-11-25).
    nds: dict = {}
    if ordering in ("auto", "nd") and len(first) >= 2:
        want = []
        for key, i in first.items():
            lw = lowers[i]
            if lw.n > 2:
                g = _sym_graph(lw.n, lw.indptr, lw.indices)
                if len(g[1]):
                    want.append((key, g))
        if want:
            from vbatch.sparse.dissect import orders_of

            nds = dict(zip((k for k, _ in want), orders_of([g for _, g in want])))
    seen: dict = {}
    out = []
    for lw, key in zip(lowers, keys):
        an = seen.get(key)
        if an is None:
            an = seen[key] = analyze(lw, ordering, relax_width, relax_zeros, cost,
                                     nds.get(key))
        out.append(an)
    return out


def cholesky(A: Any, *, runtime=None, dtype=np.float64, ordering="auto",
             relax_width: int = RELAX_WIDTH, relax_zeros: float = RELAX_ZEROS) -> Factor:
    """Factor a sparse SPD matrix, or a list of them at once (module docstring).

    ``runtime``: the :class:`vbatch.Runtime` to run on (default: vbatch's default runtime);
    ``ordering``: ``"auto"`` (of the next three, the least time in the backend's cost model,
    :func:`vbatch.sparse.analysis.estimate`), ``"nd"`` (METIS nested
    dissection), ``"rcm"``, ``"natural"``, or a permutation (``perm[new] = old``);
    ``relax_width``, ``relax_zeros``: the amalgamation's rule (:mod:`vbatch.sparse.analysis`)."""
    from vbatch import default_runtime

    batched = isinstance(A, (list, tuple))
    mats = list(A) if batched else [A]
    if batched and not mats:
        raise InputError([(None, "no matrices")], what="sparse matrices")
    if np.dtype(dtype) not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise InputError([(None, f"dtype must be float32 or float64, got {np.dtype(dtype)}")],
                         what="sparse matrices")
    rt = default_runtime() if runtime is None else runtime
    return Factor(mats, batched, rt, dtype, ordering, relax_width, relax_zeros)
