"""``vbatch.sparse``: a multifrontal sparse Cholesky on vbatch.

    >>> import numpy as np, scipy.sparse as sp, vbatch.sparse
    >>> A = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(6, 6), format="csr")
    >>> F = vbatch.sparse.cholesky(A)
    >>> x = F.solve(np.ones(6))
    >>> bool(np.allclose(A @ x, 1.0)), F.info.tolist()
    (True, [0])

:func:`cholesky` takes one scipy sparse SPD matrix, or a list of them. Only the **lower
triangle** (diagonal included) is read; a matrix that stores one triangle only may store either
(an upper one is read as its transpose), and one that stores both must be symmetric (checked).

* Analysis (:mod:`vbatch.sparse.analysis`): ordering, elimination tree, supernodes, fronts and
  their index maps, per matrix, from the pattern alone.
* Numeric factorization: every front of every matrix lives in one packed workspace on the
  runtime's device; A's entries are scattered into it (one vectorized scatter), and the fronts'
  partial Cholesky factorizations and extend-adds run as one task graph
  (:mod:`vbatch.sparse.frontal`): one submission, whatever the depth of the trees.
* Solve: forward and backward substitution over the fronts, level by level (a level: the fronts
  whose subtrees have one height), every front of a level in one vbatched ``trsm`` and one
  ``gemm``; many right-hand sides at once.

A matrix that is not positive definite gets ``info[i] > 0``: 1 + the index (in the matrix's own
numbering) of the column whose pivot was not positive, the first in the elimination order, as
CHOLMOD reports it. The other matrices of the batch are factored as if alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from vbatch.ops.batch import PackedBatch, array_kind
from vbatch.ops.errors import InputError
from vbatch.sparse.analysis import RELAX_WIDTH, RELAX_ZEROS, Analysis, analyze
from vbatch.sparse.frontal import FRONTAL_OP, reference  # noqa: F401 - registers the op

__all__ = ["cholesky", "Factor", "Analysis", "analyze"]


def _lower(A: Any, i: int, dtype) -> sp.csc_matrix:
    """Matrix ``i``'s lower triangle (CSC, canonical), or an ``InputError`` naming it."""
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
    A = A.tocsc() if A.format not in ("csr", "csc") else A
    try:
        A.check_format(full_check=True)
    except ValueError as exc:
        raise bad(f"malformed index arrays: {exc}") from None
    A = sp.csc_matrix(A, dtype=dtype, copy=True)
    A.sum_duplicates()
    if not np.isfinite(A.data).all():
        raise bad(f"{int((~np.isfinite(A.data)).sum())} stored entries are NaN or infinite")
    low, up = sp.tril(A, -1), sp.triu(A, 1)
    if up.nnz and low.nnz:
        d = abs(A - A.T)
        scale = abs(A).max()
        if d.nnz and d.max() > 1e3 * np.finfo(dtype).eps * scale:
            raise bad(f"not symmetric: max |A - A^T| = {d.max():.3g} (|A|max {scale:.3g}); "
                      "store one triangle, or both equal")
        out = sp.tril(A)
    elif up.nnz:
        out = sp.tril(A.T)
    else:
        out = sp.tril(A)
    out = sp.csc_matrix(out)
    out.sum_duplicates()
    out.sort_indices()
    return out


@dataclass
class _Level:
    """The fronts of one level of the solve and the vbatch batches over the workspace."""

    fronts: np.ndarray
    l11: PackedBatch
    l21: PackedBatch
    piv_rows: np.ndarray  # global rows of the fronts' pivots, front after front
    upd_rows: np.ndarray  # global rows of the fronts' update rows
    w: np.ndarray
    u: np.ndarray


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
    levels: int = 0
    per_matrix: list = field(default_factory=list)


class Factor:
    """The factors of one matrix or a batch of them (:func:`cholesky`)."""

    def __init__(self, mats: list, batched: bool, runtime, dtype, ordering, relax_width,
                 relax_zeros):
        t0 = time.perf_counter()
        self._rt = runtime
        self._batched = batched
        self.dtype = np.dtype(dtype)
        lowers = [_lower(A, i, self.dtype) for i, A in enumerate(mats)]
        self.analyses = [analyze(lw, ordering, relax_width, relax_zeros) for lw in lowers]
        self._assemble_layout()
        t1 = time.perf_counter()
        self.stats = Stats(
            matrices=len(mats), n=[a.n for a in self.analyses], fronts=len(self._size),
            nnz_l=sum(a.nnz_l for a in self.analyses),
            flops=sum(a.flops for a in self.analyses),
            largest_front=int(self._size.max()), analysis_s=t1 - t0, levels=len(self._levels),
            per_matrix=[{"n": a.n, "fronts": a.fronts, "nnz_l": a.nnz_l, "flops": a.flops}
                        for a in self.analyses])
        self._factor([lw.data for lw in lowers])

    # ------------------------------------------------------------------ layout
    def _assemble_layout(self) -> None:
        an = self.analyses
        xp = self._xp()
        nf = np.array([a.fronts for a in an], dtype=np.int64)
        self._front0 = np.concatenate([[0], np.cumsum(nf)])
        self._row0 = np.concatenate([[0], np.cumsum([a.n for a in an])]).astype(np.int64)
        size = np.concatenate([a.size for a in an]).astype(np.int64)
        width = np.concatenate([a.width for a in an]).astype(np.int64)
        first = np.concatenate([a.first + r0 for a, r0 in zip(an, self._row0)])
        parent = np.concatenate([np.where(a.parent >= 0, a.parent + f0, -1)
                                 for a, f0 in zip(an, self._front0)])
        offset = np.zeros(len(size), np.int64)
        np.cumsum(size[:-1] ** 2, out=offset[1:])
        moff = offset[self._front0[:-1]]
        self._amap = xp.asarray(np.concatenate([a.amap + o for a, o in zip(an, moff)]))
        total = int((size**2).sum())
        self._size, self._width, self._first, self._parent = size, width, first, parent
        self._offset = offset
        self._work = PackedBatch(data=xp.zeros(total, dtype=self.dtype), m=size, n=size, offset=offset,
                                 ld=size, order="F")
        # Update rows of each front, positions in the parent, and global rows (front rows).
        u = size - width
        self._rows = np.concatenate([a.rows + r0 for a, r0 in zip(an, self._row0)])
        self._fptr = np.concatenate([[0], np.cumsum(size)])
        fid = np.repeat(np.arange(len(size)), size)
        is_upd = np.arange(len(self._rows)) - self._fptr[fid] >= width[fid]
        rel = np.concatenate([a.rel for a in an])[is_upd]
        roff = np.zeros(len(size), np.int64)
        np.cumsum(u[:-1], out=roff[1:])
        self._rel = PackedBatch(data=xp.asarray(rel.astype(self.dtype)), m=u,
                                n=np.ones(len(u), np.int64), offset=roff,
                                ld=np.maximum(u, 1), order="F")
        self._levels = self._solve_levels()
        self._layouts: dict = {}  # the solve's right-hand-side layouts (_substitute)

    def _xp(self):
        if self._rt.backend.kind == "cupy":
            import cupy

            return cupy
        return np

    def _solve_levels(self) -> list[_Level]:
        size, width, parent = self._size, self._width, self._parent
        height = np.zeros(len(size), np.int64)
        for f in range(len(size)):  # parents come after children (postorder per matrix)
            p = parent[f]
            if p >= 0 and height[p] < height[f] + 1:
                height[p] = height[f] + 1
        levels = []
        for h in range(int(height.max()) + 1 if len(height) else 0):
            fr = np.flatnonzero(height == h)
            w, s = width[fr], size[fr]
            off = self._offset[fr]
            l11 = PackedBatch(data=self._work.data, m=w, n=w, offset=off, ld=s, order="F")
            l21 = PackedBatch(data=self._work.data, m=s - w, n=w, offset=off + w, ld=s,
                              order="F")
            starts = self._fptr[fr]
            piv = np.concatenate([self._rows[a: a + b] for a, b in zip(starts, w)])
            upd = np.concatenate([self._rows[a + b: a + c] for a, b, c in zip(starts, w, s)])
            levels.append(_Level(fr, l11, l21, piv, upd, w, s - w))
        return levels

    # ------------------------------------------------------------------ numeric
    def _factor(self, values) -> None:
        """The numeric phase: ``values`` (each matrix's lower-triangle data, as analysed; or
        all of them in one array, already on the device) scattered into the zeroed fronts,
        then one submission."""
        t0 = time.perf_counter()
        xp = self._xp()
        if isinstance(values, list):
            values = np.concatenate(values)
        work = self._work.data
        work.fill(0)
        work[self._amap] = xp.asarray(values).astype(self.dtype, copy=False)
        res = self._rt.submit(FRONTAL_OP, a=self._work, rel=self._rel, parent=self._parent,
                              npiv=self._width, overwrite=True).result()
        self.front_info = res.info
        self.info = self._matrix_info(res.info)
        self.stats.factor_s = time.perf_counter() - t0

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
        for i, (A, an) in enumerate(zip(mats, self.analyses)):
            lw = _lower(A, i, self.dtype)
            old = an.lower
            if lw.shape != old.shape or not (np.array_equal(lw.indptr, old.indptr)
                                             and np.array_equal(lw.indices, old.indices)):
                raise InputError([(None, f"matrix {i}: its pattern differs from the analysed "
                                         "one (refactor needs the same pattern)")],
                                 what="sparse matrices")
            vals.append(lw.data)
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
        """``A x = b``: ``b`` of shape (n,) or (n, r), numpy or cupy (a list of them for a
        batch); the solution comes back in the same form and kind. Matrices whose ``info`` is
        set get NaN."""
        t0 = time.perf_counter()
        bs = list(b) if self._batched else [b]
        if len(bs) != len(self.analyses):
            raise InputError([(None, f"expected {len(self.analyses)} right-hand sides, got "
                                     f"{len(bs)}")], what="right-hand sides")
        kinds = [array_kind(x) for x in bs]
        shapes = []
        for i, (x, kd, an) in enumerate(zip(bs, kinds, self.analyses)):
            if kd is None or x.ndim not in (1, 2) or x.shape[0] != an.n:
                raise InputError([(None, f"right-hand side {i}: expected an array of shape "
                                         f"({an.n},) or ({an.n}, r), got "
                                         f"{getattr(x, 'shape', type(x).__name__)}")],
                                 what="right-hand sides")
            shapes.append(x.shape)
        r = {1 if len(s) == 1 else s[1] for s in shapes}
        if len(r) != 1:
            raise InputError([(None, "every right-hand side needs the same number of columns")],
                             what="right-hand sides")
        r = r.pop()
        xp = self._xp()
        y = xp.zeros((int(self._row0[-1]), r), dtype=self.dtype)
        for an, r0, x in zip(self.analyses, self._row0, bs):
            y[r0: r0 + an.n] = xp.asarray(x).reshape(an.n, r)[an.perm]
        if r:
            self._substitute(y, r, xp)
        out = []
        for i, (an, r0, x, kd) in enumerate(zip(self.analyses, self._row0, bs, kinds)):
            sol = xp.empty((an.n, r), dtype=self.dtype)
            sol[an.perm] = y[r0: r0 + an.n]
            if self.info[i]:
                sol[:] = np.nan
            sol = sol.reshape(shapes[i])
            if kd == "numpy" and xp is not np:
                sol = sol.get()
            elif kd == "cupy" and xp is np:
                import cupy

                sol = cupy.asarray(sol)
            out.append(sol)
        self.stats.solve_s = time.perf_counter() - t0
        return out if self._batched else out[0]

    def _substitute(self, y, r: int, xp) -> None:
        rt = self._rt

        def packed(rows, counts, zero: bool = False) -> PackedBatch:
            # the rows' right-hand sides, front after front, each block row-major (order C);
            # the layout is made once per (rows, r) and reused through with_data, so the
            # plans, device tables and CUDA graphs made for it are found again by every solve
            key = (id(rows), r)
            tmpl = self._layouts.get(key)
            if tmpl is None:
                off = np.zeros(len(counts), np.int64)
                np.cumsum(counts[:-1] * r, out=off[1:])
                tmpl = self._layouts[key] = PackedBatch(
                    data=xp.zeros(len(rows) * r, dtype=self.dtype), m=counts,
                    n=np.full(len(counts), r, np.int64), offset=off,
                    ld=np.full(len(counts), r, np.int64), order="C")
            data = (xp.zeros(len(rows) * r, dtype=self.dtype) if zero
                    else xp.ascontiguousarray(y[rows]).reshape(-1))
            return tmpl.with_data(data)

        def scatter_sub(rows, vals) -> None:
            if xp is np:
                np.subtract.at(y, rows, vals)
            else:
                import cupyx

                cupyx.scatter_add(y, rows, -vals)

        for lv in self._levels:  # forward: L y = b, leaves first
            x1 = rt.trsm(lv.l11, packed(lv.piv_rows, lv.w), lower=True).result()
            y[lv.piv_rows] = x1.data.reshape(-1, r)
            if lv.u.any():
                # into a row-major zero batch (c's form is the output's)
                x2 = rt.gemm(lv.l21, x1, packed(lv.upd_rows, lv.u, zero=True)).result()
                scatter_sub(lv.upd_rows, x2.data.reshape(-1, r))
        for lv in reversed(self._levels):  # backward: L^T x = y, roots first
            x1 = packed(lv.piv_rows, lv.w)
            if lv.u.any():
                x1 = rt.gemm(lv.l21, packed(lv.upd_rows, lv.u), x1, alpha=-1.0, beta=1.0,
                             trans_a=True).result()
            x1 = rt.trsm(lv.l11, x1, lower=True, trans_a=True).result()
            y[lv.piv_rows] = x1.data.reshape(-1, r)


def cholesky(A: Any, *, runtime=None, dtype=np.float64, ordering="auto",
             relax_width: int = RELAX_WIDTH, relax_zeros: float = RELAX_ZEROS) -> Factor:
    """Factor a sparse SPD matrix, or a list of them at once (module docstring).

    ``runtime``: the :class:`vbatch.Runtime` to run on (default: vbatch's default runtime);
    ``ordering``: ``"auto"`` (the least fill of the next three), ``"nd"`` (METIS nested
    dissection), ``"rcm"``, ``"natural"``, or a permutation (``perm[new] = old``);
    ``relax_width``, ``relax_zeros``: the amalgamation's rule (:mod:`vbatch.sparse.analysis`)."""
    from vbatch.runtime.runtime import default_runtime

    batched = isinstance(A, (list, tuple))
    mats = list(A) if batched else [A]
    if batched and not mats:
        raise InputError([(None, "no matrices")], what="sparse matrices")
    if np.dtype(dtype) not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise InputError([(None, f"dtype must be float32 or float64, got {np.dtype(dtype)}")],
                         what="sparse matrices")
    rt = default_runtime() if runtime is None else runtime
    return Factor(mats, batched, rt, dtype, ordering, relax_width, relax_zeros)
