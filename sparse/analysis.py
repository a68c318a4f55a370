"""The analysis of a sparse SPD matrix: ordering, elimination tree, supernodes, fronts, maps.

From the pattern alone (so :meth:`Factor.refactor` reuses all of it):

1. **Ordering.** By default the fewest entries of L among METIS nested dissection (pymetis, on
   the pattern of ``A + A^T``), reverse Cuthill-McKee and the natural order (:func:`order`);
   or one of them by name, or an integer array taken as given. ``docs/notes.md`` (2026-11-23)
   compares the fill against SuperLU's MMD.
2. **Elimination tree** of the permuted matrix (Liu's algorithm with path compression), then a
   postorder, so that every subtree's columns are contiguous.
3. **Column counts** (row-subtree traversal), and **fundamental supernodes**: column ``j`` joins
   ``j + 1`` when ``j + 1`` is its parent and its structure is that of ``j + 1`` plus itself.
4. **Relaxed amalgamation**: a supernode merges into its parent when their columns are
   contiguous and the result is narrow (``relax_width``) or adds few explicit zeros
   (``relax_zeros``, a fraction of the merged front's entries). Many tiny fronts cost launches
   and launch slots; a few zeros cost flops.
5. **Fronts**: each supernode's row list (its columns, then the rows below it that its columns
   or its children's update blocks reach), its parent front, and the **index maps**: where each
   of A's lower-triangle entries lands in the fronts' packed workspace, and where each row of a
   child's update block lands in its parent front.

Steps 2-5 walk columns one at a time, which Python cannot do at n = 10^6; they are compiled with
numba. Measured on the 2-core VM (2026-11-23), the elimination tree and column counts of the
300^2 Laplacian (n = 90,000, ND order): 0.010 s compiled, 1.48 s as the same functions in Python
(``.py_func``); L has 15x the entries at 1000^2, so the Python walks alone would take tens of
seconds there. The maps (step 5's last
part) are vectorized numpy: a sorted key per (front, row) and one ``searchsorted``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

# Amalgamation defaults. Fronts up to 32 columns wide merge regardless of zeros: on CUDA a
# panel is 32 wide (nb), so such a front is one panel task, and fewer, larger fronts mean fewer
# blocks that each do little. Measured on the H200 (benchmarks/sparse.py, 2026-11-23,
# factor ms at widths 8 / 16 / 32 / 48 / 64): the batch of 1000 2-D Laplacians 10.1 / 5.31 /
# 3.12 / 2.49 / 2.48 (cuDSS 5.15), the 300^2 Laplacian 3.63 / 2.96 / 2.94 / 2.82 / 3.27 (cuDSS
# 2.53), the 40^3 one 19.7 / 18.9 / 19.2 / - / - (cuDSS 13.0), the 20^3 one - / 2.53 / - /
# 2.86 / 3.19: 32 is near the best everywhere. Wider fronts merge when they add at most 10%
# explicit zeros.
RELAX_WIDTH = 32
RELAX_ZEROS = 0.10


# ------------------------------------------------------------------ compiled column walks
@numba.njit(cache=True)
def _etree(n, ptr, idx):
    """Parent of every column (-1: a root), from the strictly lower pattern by rows (CSR: row k
    holds the columns j < k with A(k, j) != 0)."""
    parent = np.full(n, -1, np.int64)
    anc = np.full(n, -1, np.int64)
    for k in range(n):
        for p in range(ptr[k], ptr[k + 1]):
            i = idx[p]
            while i != -1 and i < k:
                nxt = anc[i]
                anc[i] = k
                if nxt == -1:
                    parent[i] = k
                i = nxt
    return parent


@numba.njit(cache=True)
def _postorder(parent):
    """A postorder of the forest: ``post[new] = old``; children in increasing order."""
    n = len(parent)
    head = np.full(n, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    for j in range(n - 1, -1, -1):  # children lists, smallest first
        p = parent[j]
        if p != -1:
            nxt[j] = head[p]
            head[p] = j
    post = np.empty(n, np.int64)
    stack = np.empty(n, np.int64)
    k = 0
    for r in range(n):
        if parent[r] != -1:
            continue
        top = 0
        stack[0] = r
        while top >= 0:
            j = stack[top]
            c = head[j]
            if c == -1:
                top -= 1
                post[k] = j
                k += 1
            else:
                head[j] = nxt[c]
                top += 1
                stack[top] = c
    return post


@numba.njit(cache=True)
def _colcounts(n, ptr, idx, parent):
    """Entries of every column of L (the diagonal included), by row subtrees: row i of L holds
    the columns on the tree paths from each j with A(i, j) != 0 up to i."""
    count = np.ones(n, np.int64)
    mark = np.full(n, -1, np.int64)
    for i in range(n):
        mark[i] = i
        for p in range(ptr[i], ptr[i + 1]):
            j = idx[p]
            while j != -1 and mark[j] != i:
                count[j] += 1
                mark[j] = i
                j = parent[j]
    return count


@numba.njit(cache=True)
def _amalgamate(first, width, front, sparent, relax_width, relax_zeros):
    """Merge children into their parent where their columns are contiguous and the rule allows
    (module docstring). Supernodes come in postorder, so a parent's last child ends just before
    it; once merged, the child before that one does, and so on: each parent tries its children
    from the last while they merge. Returns the new supernode of each old one (a merged child
    takes its parent's)."""
    m = len(first)
    n = first[m - 1] + width[m - 1] if m else 0
    z = np.zeros(m, np.float64)  # explicit zeros held
    w = width.copy()
    nf = front.copy()
    f = first.copy()
    rep = np.arange(m)
    ends = np.full(n, -1, np.int64)  # the supernode whose last column is c
    for s in range(m):
        ends[first[s] + width[s] - 1] = s
    for p in range(m):
        while f[p] > 0:
            s = ends[f[p] - 1]
            if s == -1 or sparent[s] != p or rep[s] != s:
                break
            ws, wp = w[s], w[p]
            n_new = ws + nf[p]
            added = ws * (n_new - nf[s])
            entries = (ws + wp) * n_new - (ws + wp) * (ws + wp - 1) / 2
            if not (ws + wp <= relax_width or (z[s] + z[p] + added) <= relax_zeros * entries):
                break
            z[p] += z[s] + added
            w[p] = ws + wp
            nf[p] = n_new
            f[p] = f[s]
            rep[s] = p
    # follow chains (a child merged into a parent that merged further)
    for s in range(m - 1, -1, -1):
        r = rep[s]
        while rep[r] != r:
            r = rep[r]
        rep[s] = r
    return rep


@numba.njit(cache=True)
def _fronts(n, cptr, cidx, snode, sfirst, slast, nsn):
    """Each supernode's row list (CSR ``fptr, frows``: its columns, then the rows below it, in
    increasing order) and its parent supernode. ``cptr, cidx``: the permuted lower pattern by
    columns (rows >= column)."""
    mark = np.full(n, -1, np.int64)
    fptr = np.zeros(nsn + 1, np.int64)
    # child lists of supernodes, filled as parents are found
    head = np.full(nsn, -1, np.int64)
    nxt = np.full(nsn, -1, np.int64)
    sparent = np.full(nsn, -1, np.int64)
    cap = max(16, 4 * len(cidx))
    frows = np.empty(cap, np.int64)
    buf = np.empty(n, np.int64)
    for s in range(nsn):
        cnt = 0
        for j in range(sfirst[s], slast[s] + 1):
            mark[j] = s
            buf[cnt] = j
            cnt += 1
        for j in range(sfirst[s], slast[s] + 1):
            for p in range(cptr[j], cptr[j + 1]):
                i = cidx[p]
                if mark[i] != s:
                    mark[i] = s
                    buf[cnt] = i
                    cnt += 1
        c = head[s]
        while c != -1:
            w = slast[c] - sfirst[c] + 1
            for p in range(fptr[c] + w, fptr[c + 1]):
                i = frows[p]
                if mark[i] != s:
                    mark[i] = s
                    buf[cnt] = i
                    cnt += 1
            c = nxt[c]
        w = slast[s] - sfirst[s] + 1
        below = np.sort(buf[w:cnt])
        buf[w:cnt] = below
        if fptr[s] + cnt > cap:
            cap = max(2 * cap, fptr[s] + cnt)
            grown = np.empty(cap, np.int64)
            grown[: fptr[s]] = frows[: fptr[s]]
            frows = grown
        frows[fptr[s]: fptr[s] + cnt] = buf[:cnt]
        fptr[s + 1] = fptr[s] + cnt
        if cnt > w:
            p = snode[buf[w]]
            sparent[s] = p
            nxt[s] = head[p]
            head[p] = s
    return fptr, frows[: fptr[nsn]], sparent


# ------------------------------------------------------------------ the analysis
@dataclass(frozen=True)
class Analysis:
    """The symbolic factorization of one matrix (module docstring). Columns are numbered in the
    factor's order: column ``j`` of L is column ``perm[j]`` of A.

    Fronts (supernodes) are numbered in postorder: ``first[f]``, ``width[f]`` (its pivots),
    ``size[f]`` (its rows), ``rows[fptr[f]:fptr[f+1]]`` (L's row indices in its columns),
    ``parent[f]`` (-1: a root). ``amap[e]``: where the e-th stored entry of A's lower triangle
    (``lower``'s data order) lands in the packed fronts (column-major, each ``size x size``,
    back to back from ``offset``); ``rel[fptr[f] + width[f]:fptr[f+1]]`` the position of each
    update row of ``f`` in its parent's row list."""

    n: int
    perm: np.ndarray
    first: np.ndarray
    width: np.ndarray
    size: np.ndarray
    fptr: np.ndarray
    rows: np.ndarray
    parent: np.ndarray
    offset: np.ndarray
    amap: np.ndarray
    rel: np.ndarray
    lower: sp.csc_matrix  # A's lower triangle (the pattern the maps index)

    @property
    def fronts(self) -> int:
        return len(self.first)

    @property
    def nnz_l(self) -> int:
        w, s = self.width.astype(np.int64), self.size.astype(np.int64)
        return int((w * s - w * (w - 1) // 2).sum())

    @property
    def flops(self) -> float:
        """Flops of the numeric factorization: each front's partial Cholesky (its pivots'
        columns and the Schur complement of its update block)."""
        w, s = self.width.astype(np.float64), self.size.astype(np.float64)
        u = s - w
        return float((w**3 / 3 + w * w * u + w * u * u).sum())


def order(lower: sp.csc_matrix, ordering) -> np.ndarray:
    """The fill-reducing permutation (``perm[new] = old``). ``"auto"``: of METIS nested
    dissection, reverse Cuthill-McKee and the natural order, the one whose factor has the
    fewest entries (counted exactly, from the elimination tree, before amalgamation). ND wins
    on meshes; a banded matrix such as bcsstk16 keeps its band (natural: 610,800 entries of L,
    RCM 627,487, ND 740,913)."""
    n = lower.shape[0]
    if not isinstance(ordering, str):
        perm = np.asarray(ordering, dtype=np.int64)
        if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError(f"ordering must be a permutation of range({n})")
        return perm
    if ordering not in ("auto", "nd", "rcm", "natural"):
        raise ValueError("ordering must be 'auto', 'nd', 'rcm', 'natural' or a permutation, "
                         f"got {ordering!r}")
    if ordering == "natural" or n <= 2:
        return np.arange(n, dtype=np.int64)
    g = (lower + lower.T).tocsr()
    g.setdiag(0)
    g.eliminate_zeros()
    g.sort_indices()
    if g.nnz == 0:
        return np.arange(n, dtype=np.int64)
    if ordering == "rcm":
        return _rcm(g)
    if ordering == "nd":
        return _nd(g)
    cands = [np.arange(n, dtype=np.int64), _rcm(g), _nd(g)]
    return min(cands, key=lambda p: fill(lower, p))


def _nd(g: sp.csr_matrix) -> np.ndarray:
    import pymetis

    # pymetis gives (perm, iperm); its first is ours, new -> old: measured on the shared
    # matrices, it gives the fill of SuperLU's MMD (494_bus 1536 against 1400 entries of L,
    # bcsstk09 47160 against 59920) where the second gives 3-4x more.
    adj = pymetis.CSRAdjacency(g.indptr.astype(np.int32), g.indices.astype(np.int32))
    perm, _ = pymetis.nested_dissection(adj)
    return np.asarray(perm, dtype=np.int64)


def _rcm(g: sp.csr_matrix) -> np.ndarray:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    return np.asarray(reverse_cuthill_mckee(g, symmetric_mode=True), dtype=np.int64)


def fill(lower: sp.csc_matrix, perm: np.ndarray) -> int:
    """Entries of the Cholesky factor of ``lower`` permuted by ``perm`` (diagonal included)."""
    a = _lower_pattern(lower, perm)
    n = lower.shape[0]
    parent = _etree(n, a.indptr, a.indices)
    return int(_colcounts(n, a.indptr, a.indices, parent).sum())


def analyze(lower: sp.csc_matrix, ordering="auto", relax_width: int = RELAX_WIDTH,
            relax_zeros: float = RELAX_ZEROS) -> Analysis:
    """The analysis of the SPD matrix whose lower triangle (diagonal included) is ``lower``
    (CSC, canonical: sorted, no duplicates)."""
    n = lower.shape[0]
    perm = order(lower, ordering)
    a = _lower_pattern(lower, perm)
    parent = _etree(n, a.indptr, a.indices)  # CSR of the lower pattern: row k, columns <= k
    post = _postorder(parent)
    perm = perm[post]
    a = _lower_pattern(lower, perm)
    csr = a  # rows: the strictly lower entries of each row (and the diagonal)
    # A postorder is a relabelling of the same tree: the permuted matrix's parent array is the
    # old one renumbered, not a second elimination-tree pass.
    ipost = np.empty(n, np.int64)
    ipost[post] = np.arange(n)
    old = parent[post]
    parent = np.where(old >= 0, ipost[np.maximum(old, 0)], -1)
    count = _colcounts(n, csr.indptr, csr.indices, parent)
    # Supernodes: j joins j + 1 (its parent) when count[j] == count[j + 1] + 1, that is when
    # L's structure in column j is j's row and column j + 1's (no explicit zero; j + 1 may have
    # other children, whose update rows lie in that structure too).
    j = np.arange(n - 1)
    joins = (parent[:-1] == j + 1) & (count[:-1] == count[1:] + 1)
    start = np.concatenate([[True], ~joins])
    first = np.flatnonzero(start)
    snode = np.cumsum(start) - 1
    width = np.diff(np.append(first, n))
    front = count[first]
    last = first + width - 1
    sp_parent = np.where(parent[last] >= 0, snode[np.maximum(parent[last], 0)], -1)
    rep = _amalgamate(first, width, front, sp_parent, int(relax_width), float(relax_zeros))
    keep = rep == np.arange(len(first))
    new_id = np.cumsum(keep) - 1
    snode = new_id[rep[snode]]
    nsn = int(keep.sum())
    sfirst = np.full(nsn, n, np.int64)
    np.minimum.at(sfirst, snode, np.arange(n))
    slast = np.zeros(nsn, np.int64)
    np.maximum.at(slast, snode, np.arange(n))
    col = a.tocsc()  # by columns: rows >= column
    fptr, frows, fparent = _fronts(n, col.indptr.astype(np.int64), col.indices.astype(np.int64),
                                   snode.astype(np.int64), sfirst, slast, nsn)
    size = np.diff(fptr)
    width = slast - sfirst + 1
    offset = np.zeros(nsn, np.int64)
    np.cumsum(size[:-1] ** 2, out=offset[1:])
    # Sorted keys (front, row) of every front's row list: one searchsorted finds a row's place.
    fid = np.repeat(np.arange(nsn, dtype=np.int64), size)
    key = fid * n + frows  # increasing: fronts in order, each list increasing

    def place(f, r):
        return np.searchsorted(key, f * n + r) - fptr[f]

    # A's entries: the e-th stored entry of lower (column-major data order) at (r, c) of the
    # permuted matrix, r >= c, in front snode[c], column c - first, row place(...).
    ipos = np.empty(n, np.int64)
    ipos[perm] = np.arange(n)
    lc = lower.tocoo()
    r0, c0 = ipos[lc.row], ipos[lc.col]
    r, c = np.maximum(r0, c0), np.minimum(r0, c0)
    f = snode[c]
    amap = offset[f] + (c - sfirst[f]) * size[f] + place(f, r)
    # Update rows of each front, placed in its parent's list.
    is_upd = np.arange(len(frows)) - fptr[fid] >= width[fid]
    rel = np.zeros(len(frows), np.int64)
    child = fid[is_upd]
    rel[is_upd] = place(fparent[child], frows[is_upd])
    return Analysis(n=n, perm=perm, first=sfirst, width=width, size=size, fptr=fptr, rows=frows,
                    parent=fparent, offset=offset, amap=amap, rel=rel, lower=lower)


def _lower_pattern(lower: sp.csc_matrix, perm: np.ndarray) -> sp.csr_matrix:
    """The pattern of the permuted matrix's lower triangle, by rows (CSR, sorted)."""
    n = lower.shape[0]
    ipos = np.empty(n, np.int64)
    ipos[perm] = np.arange(n)
    c = lower.tocoo()
    r0, c0 = ipos[c.row], ipos[c.col]
    r, cc = np.maximum(r0, c0), np.minimum(r0, c0)
    m = sp.csr_matrix((np.ones(len(r), np.int8), (r, cc)), shape=(n, n))
    m.sum_duplicates()
    m.sort_indices()
    m.indptr = m.indptr.astype(np.int64)
    m.indices = m.indices.astype(np.int64)
    return m
