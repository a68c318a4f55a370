"""The analysis of a sparse SPD matrix: ordering, elimination tree, supernodes, fronts, maps.

First the matrix is read (:func:`lower_triangle`): its index arrays checked, duplicates summed,
its triangles compared when both are stored, and its lower triangle made canonical (a
:class:`Lower`). The rest comes from that pattern alone (so :meth:`Factor.refactor` reuses all
of it, and matrices of one pattern in a batch share one analysis):

1. **Ordering.** By default, of METIS nested dissection (pymetis, on the pattern of
   ``A + A^T``), reverse Cuthill-McKee and the natural order, the least time in the backend's
   cost model (:func:`estimate`: flops, and panel steps on the tree's critical path, which on a
   GPU are launches waited through), or the fewest entries of L where there is no model
   (:func:`order`); or one of them by name, or an integer array taken as given.
   ``docs/decisions.md#sparse-metis-perm`` compares the fill against SuperLU's MMD. The model weighs
   time only: on CUDA a step is worth ~25 Mflop, so it may take an ordering with more fill
   (bcsstk16: ND's 740,913 entries of L against the natural order's 610,800, and the fronts'
   workspace with them); ``ordering="natural"`` (or any other) chooses for memory.
2. **Elimination tree** of the permuted matrix (Liu's algorithm with path compression), then a
   postorder, so that every subtree's columns are contiguous.
3. **Column counts** (Gilbert, Ng and Peyton's, near-linear in A's entries), and **fundamental
   supernodes**: column ``j`` joins
   ``j + 1`` when ``j + 1`` is its parent and its structure is that of ``j + 1`` plus itself.
4. **Relaxed amalgamation**: a supernode merges into its parent when their columns are
   contiguous and the result is narrow (``relax_width``) or adds few explicit zeros
   (``relax_zeros``, a fraction of the merged front's entries). Many tiny fronts cost launches
   and launch slots; a few zeros cost flops.
5. **Fronts**: each supernode's row list (its columns, then the rows below it that its columns
   or its children's update blocks reach), its parent front, and the **index maps**: where each
   of A's lower-triangle entries lands in the fronts' packed workspace, and where each row of a
   child's update block lands in its parent front.

Reading the matrix, the permuted patterns and steps 2-5 walk columns one at a time, which Python
cannot do at n = 10^6; they are compiled with numba (the ``sparse`` extra; without it the
module imports, and its functions say what to install). Measured on the 2-core VM (2026-11-23),
the elimination tree and the row-subtree column counts (the method before Gilbert-Ng-Peyton's)
of the 300^2 Laplacian (n = 90,000, ND order): 0.010 s compiled, 1.48 s as the same functions
in Python (``.py_func``); L has 15x the entries at 1000^2, so the Python walks alone would
take tens of seconds there. The maps (step 5's last
part) are vectorized numpy: a sorted key per (front, row) and one ``searchsorted``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from vbatch.core.jit import njit  # numba and pymetis are optional (jit.py)

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


# ------------------------------------------------------------------ compiled pattern work
# scipy's sparse constructors cost 20-60 us each (index-dtype checks, format checks), and the
# analysis of one small matrix took ~40 of them: 7 s for the batch of 1000 2-D Laplacians on the
# 2-core VM, against ~0.4 s of compiled walks (cProfile,
# docs/decisions.md#sparse-compiled-analysis). The pattern work below is compiled instead, on plain
# index arrays.
@njit(cache=True, nogil=True)
def _canon_lower(n, ptr, idx, val, csr, tol):
    """The canonical lower triangle (CSC: rows sorted within each column, duplicates summed)
    of the symmetric matrix that the compressed arrays ``ptr, idx, val`` stand for (CSC, or
    CSR when ``csr``). One stored triangle is read as the whole matrix (an upper one through
    its transpose); with both stored, the two must agree within ``tol * max|A|``.

    Returns ``(code, i1, i2, x1, x2, ptr, rows, vals)``; ``code`` 0 is a good matrix, else
    (the arrays empty): 1 ``len(ptr)`` is ``i1``, not n + 1; 2 ``ptr[0]`` is ``i1``; 3 ``ptr``
    decreases at ``i1``; 4 ``ptr[n]`` is ``i1``, past ``len(idx)`` or ``len(val)`` (``i2``,
    the shorter); 5 ``idx[i1]`` is ``i2``, out of range; 6 ``i1`` stored entries (after
    summing duplicates) are not finite; 7 not symmetric: ``max |A - A^T|`` is ``x1``, ``max |A|``
    is ``x2``."""
    e64 = np.zeros(0, np.int64)
    ev = np.zeros(0, val.dtype)
    if len(ptr) != n + 1:
        return 1, len(ptr), 0, 0.0, 0.0, e64, e64, ev
    if ptr[0] != 0:
        return 2, ptr[0], 0, 0.0, 0.0, e64, e64, ev
    for j in range(n):
        if ptr[j + 1] < ptr[j]:
            return 3, j + 1, 0, 0.0, 0.0, e64, e64, ev
    nz = ptr[n]
    if nz > len(idx) or nz > len(val):
        return 4, nz, min(len(idx), len(val)), 0.0, 0.0, e64, e64, ev
    for e in range(nz):
        if idx[e] < 0 or idx[e] >= n:
            return 5, e, idx[e], 0.0, 0.0, e64, e64, ev
    canonical = True
    for j in range(n):
        for e in range(ptr[j] + 1, ptr[j + 1]):
            if idx[e] <= idx[e - 1]:
                canonical = False
    if canonical:
        return _canon_sorted(n, ptr, idx, val, csr, tol)
    # Unsorted or with duplicates: made canonical in the arrays' own view (indices increasing
    # within each compressed row or column, duplicates summed in float64, then stored in the
    # values' dtype, where a float32 sum may overflow to inf and be refused as such), then read
    # as a canonical matrix is.
    major = np.empty(nz, np.int64)
    for j in range(n):
        for e in range(ptr[j], ptr[j + 1]):
            major[e] = j
    order, _ = _pair_order(n, major, idx[:nz])
    cptr = np.zeros(n + 1, np.int64)
    cidx = np.empty(nz, np.int64)
    cval = np.empty(nz, val.dtype)
    k = -1
    acc = 0.0
    for q in range(nz):
        e = order[q]
        if k >= 0 and major[e] == major[order[q - 1]] and idx[e] == cidx[k]:
            acc += np.float64(val[e])
        else:
            if k >= 0:
                cval[k] = acc
            k += 1
            cidx[k] = idx[e]
            acc = np.float64(val[e])
            cptr[major[e] + 1] += 1
    if k >= 0:
        cval[k] = acc
    for j in range(n):
        cptr[j + 1] += cptr[j]
    return _canon_sorted(n, cptr, cidx[:k + 1], cval[:k + 1], csr, tol)


@njit(cache=True, nogil=True)
def _canon_sorted(n, ptr, idx, val, csr, tol):
    """:func:`_canon_lower` for arrays already canonical (indices increasing within each
    compressed row or column, as scipy makes them): no sorting. In the arrays' own view ``M``
    (CSC; ``M = A^T`` for CSR) a column's stored rows split into a head above the diagonal and
    a tail from it; the triangle read is either the tails as they are, or the heads and the
    diagonal transposed. Both stored: each tail entry ``M(r, c)`` meets its mirror ``M(c, r)``
    in column ``r``'s head, which a pointer per column walks in increasing ``c``. 2-D
    Laplacian of 576 rows, both triangles (2-core VM): 30-48 us, and ~75 with its indices
    reversed in each row (sorted first, then read here)."""
    split = np.empty(n, np.int64)  # first entry of each column at or below the diagonal
    low_m = False
    up_m = False
    bad = 0
    big = 0.0
    for j in range(n):
        k = ptr[j]
        while k < ptr[j + 1] and idx[k] < j:
            k += 1
        split[j] = k
        if k > ptr[j]:
            up_m = True
        if ptr[j + 1] > k and idx[ptr[j + 1] - 1] > j:
            low_m = True
    for e in range(ptr[n]):
        v = np.float64(val[e])
        if not np.isfinite(v):
            bad += 1
        elif abs(v) > big:
            big = abs(v)
    e64 = np.zeros(0, np.int64)
    ev = np.zeros(0, val.dtype)
    if bad:
        return 6, bad, 0, 0.0, 0.0, e64, e64, ev
    if low_m and up_m:
        diff = 0.0
        walk = ptr[:n].copy()
        for c in range(n):
            for e in range(split[c], ptr[c + 1]):
                r = idx[e]
                if r == c:
                    continue
                while walk[r] < split[r] and idx[walk[r]] < c:
                    diff = max(diff, abs(np.float64(val[walk[r]])))
                    walk[r] += 1
                if walk[r] < split[r] and idx[walk[r]] == c:
                    diff = max(diff, abs(np.float64(val[e]) - np.float64(val[walk[r]])))
                    walk[r] += 1
                else:
                    diff = max(diff, abs(np.float64(val[e])))
        for r in range(n):
            for e in range(walk[r], split[r]):
                diff = max(diff, abs(np.float64(val[e])))
        if diff > tol * big:
            return 7, 0, 0, diff, big, e64, e64, ev
    # In A's terms (A = M, or M^T for CSR): the lower triangle is read unless only the upper
    # one is stored. It is M's tails for CSC, M's heads transposed for CSR (and the other way
    # round when the upper one is read).
    low_a, up_a = (up_m, low_m) if csr else (low_m, up_m)
    read_upper = up_a and not low_a
    optr = np.zeros(n + 1, np.int64)
    if csr == read_upper:  # the tails, as stored
        for j in range(n):
            optr[j + 1] = optr[j] + ptr[j + 1] - split[j]
        orow = np.empty(optr[n], np.int64)
        oval = np.empty(optr[n], val.dtype)
        k = 0
        for j in range(n):  # (element loops: a slice copy per column cost ~20 us in all)
            for e in range(split[j], ptr[j + 1]):
                orow[k] = idx[e]
                oval[k] = val[e]
                k += 1
        return 0, 0, 0, 0.0, 0.0, optr, orow, oval
    # the heads and diagonals, transposed: M(i, j), i <= j, becomes row j of column i
    for j in range(n):
        for e in range(ptr[j], split[j]):
            optr[idx[e] + 1] += 1
        if split[j] < ptr[j + 1] and idx[split[j]] == j:
            optr[j + 1] += 1
    for k in range(n):
        optr[k + 1] += optr[k]
    pos = optr[:n].copy()
    orow = np.empty(optr[n], np.int64)
    oval = np.empty(optr[n], val.dtype)
    for j in range(n):  # increasing j: each output column's rows come in increasing order
        last = split[j] + 1 if split[j] < ptr[j + 1] and idx[split[j]] == j else split[j]
        for e in range(ptr[j], last):
            i = idx[e]
            orow[pos[i]] = j
            oval[pos[i]] = val[e]
            pos[i] += 1
    return 0, 0, 0, 0.0, 0.0, optr, orow, oval


@njit(cache=True)
def _sym_graph(n, ptr, idx):
    """The adjacency of ``L + L^T`` without the diagonal (CSR, sorted), from the canonical
    lower triangle ``L`` (CSC): row ``r`` lists the columns ``c < r`` that hold an entry in row
    ``r`` (met in increasing ``c``), then the rows below ``r`` in column ``r``."""
    deg = np.zeros(n + 1, np.int64)
    for c in range(n):
        for p in range(ptr[c], ptr[c + 1]):
            r = idx[p]
            if r != c:
                deg[r + 1] += 1
                deg[c + 1] += 1
    for k in range(n):
        deg[k + 1] += deg[k]
    pos = deg[:n].copy()
    adj = np.empty(deg[n], np.int64)
    for upper in (False, True):  # every row's smaller neighbours first, then its larger ones
        for c in range(n):
            for p in range(ptr[c], ptr[c + 1]):
                r = idx[p]
                if r != c:
                    a, b = (c, r) if upper else (r, c)
                    adj[pos[a]] = b
                    pos[a] += 1
    return deg, adj


@njit(cache=True)
def _permuted_lower(n, ptr, idx, ipos, by_rows):
    """The pattern of the permuted matrix's lower triangle: entry ``(r, c)`` of the canonical
    ``L`` (CSC) goes to ``(max, min)`` of ``(ipos[r], ipos[c])``. By rows (CSR, columns
    increasing) when ``by_rows``, else by columns (CSC, rows increasing). Two stable counting
    sorts; the input has no duplicates, so neither has the output."""
    nz = ptr[n]
    R = np.empty(nz, np.int64)
    C = np.empty(nz, np.int64)
    for c in range(n):
        for p in range(ptr[c], ptr[c + 1]):
            a, b = ipos[idx[p]], ipos[c]
            R[p], C[p] = (a, b) if a >= b else (b, a)
    major, minor = (R, C) if by_rows else (C, R)
    order, optr = _pair_order(n, major, minor)
    return optr, minor[order]


@njit(cache=True, nogil=True)
def _pair_order(n, major, minor):
    """The entries ordered by ``(major, minor)`` (both in ``[0, n)``), equal pairs in their
    given order: a stable counting sort by ``minor``, then one by ``major``. Returns the order
    and where each ``major`` value's run starts (``n + 1`` entries)."""
    nz = len(major)
    cnt = np.zeros(n + 1, np.int64)
    for e in range(nz):
        cnt[minor[e] + 1] += 1
    for k in range(n):
        cnt[k + 1] += cnt[k]
    by_minor = np.empty(nz, np.int64)
    for e in range(nz):
        by_minor[cnt[minor[e]]] = e
        cnt[minor[e]] += 1
    start = np.zeros(n + 1, np.int64)
    for e in range(nz):
        start[major[e] + 1] += 1
    for k in range(n):
        start[k + 1] += start[k]
    pos = start[:n].copy()
    order = np.empty(nz, np.int64)
    for q in range(nz):
        e = by_minor[q]
        order[pos[major[e]]] = e
        pos[major[e]] += 1
    return order, start


@njit(cache=True)
def _shift_segments(out, lens, shift):
    """Add ``shift[s]`` to the ``s``-th run of ``lens[s]`` entries of ``out``, in place (a
    batch's stacked per-matrix arrays; ``np.repeat`` made a second array as long)."""
    k = 0
    for s in range(len(lens)):
        d = shift[s]
        for e in range(k, k + lens[s]):
            out[e] += d
        k += lens[s]


@njit(cache=True)
def _tree_height(parent):
    """Fronts on the longest leaf-to-root path of a forest whose parents come after their
    children."""
    h = np.ones(len(parent), np.int64)
    for f in range(len(parent)):
        p = parent[f]
        if p >= 0 and h[p] < h[f] + 1:
            h[p] = h[f] + 1
    return h.max() if len(h) else 0


@njit(cache=True)
def _critical_path(parent, steps):
    """The most ``steps`` summed over a leaf-to-root path of a forest whose parents come after
    their children."""
    h = steps.copy()
    best = np.zeros(len(parent), np.int64)  # the longest path below each node
    for f in range(len(parent)):
        h[f] = steps[f] + best[f]
        p = parent[f]
        if p >= 0 and best[p] < h[f]:
            best[p] = h[f]
    return h.max() if len(h) else 0


# ------------------------------------------------------------------ compiled column walks
@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _colcounts(n, ptr, idx, parent):
    """Entries of every column of L (the diagonal included), by row subtrees: row i of L holds
    the columns on the tree paths from each j with A(i, j) != 0 up to i. One step an entry of
    L: the tests' reference for :func:`_colcounts_fast`, which the analysis uses."""
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


@njit(cache=True)
def _colcounts_fast(n, cptr, cidx, parent, post):
    """:func:`_colcounts` in time near-linear in A's entries (the row-subtree walk costs one
    step an entry of L: 1.4 s a call for the natural order of the 1000^2 Laplacian, whose L
    has ~10^9 entries; "auto" counts three orders). Gilbert, Ng and Peyton's method (SIAM J.
    Matrix Anal. Appl. 15(4), 1994): row ``i``'s subtree is the union of the tree paths from
    its leaves up to ``i``; give each leaf +1, the lowest common ancestor of each two leaves
    consecutive in postorder -1, and ``parent(i)`` -1, and the count of column ``j`` is the sum
    over ``j``'s subtree. Visiting columns in postorder finds the leaves (``k`` is one when no
    earlier entry of the row lies in ``k``'s subtree, which spans postorder positions
    ``first[k]..pos[k]``) and, by union-find over the finished nodes, the ancestors.
    ``cptr, cidx``: the lower pattern by columns (rows >= column); ``post``: a postorder of
    the tree (``post[position] = node``)."""
    pos = np.empty(n, np.int64)
    for q in range(n):
        pos[post[q]] = q
    first = pos.copy()
    for q in range(n):
        j = post[q]
        p = parent[j]
        if p != -1 and first[j] < first[p]:
            first[p] = first[j]
    delta = np.zeros(n, np.int64)
    prevnbr = np.full(n, -1, np.int64)
    prevleaf = np.full(n, -1, np.int64)
    anc = np.arange(n)
    for q in range(n):
        k = post[q]
        # row k's own diagonal: the last entry of its row in postorder, a leaf if alone
        if prevnbr[k] == -1:
            delta[k] += 1
        if parent[k] != -1:
            delta[parent[k]] -= 1
        for p in range(cptr[k], cptr[k + 1]):
            i = cidx[p]
            if i <= k:
                continue
            if first[k] > prevnbr[i]:  # k is a leaf of row i's subtree
                delta[k] += 1
                leaf = prevleaf[i]
                if leaf != -1:
                    r = leaf  # the root of leaf's set: the common ancestor
                    while anc[r] != r:
                        r = anc[r]
                    while anc[leaf] != r:  # path compression
                        nxt = anc[leaf]
                        anc[leaf] = r
                        leaf = nxt
                    delta[r] -= 1
                prevleaf[i] = k
            prevnbr[i] = q
        if parent[k] != -1:
            anc[k] = parent[k]
    count = delta
    for q in range(n):
        j = post[q]
        if parent[j] != -1:
            count[parent[j]] += count[j]
    return count


@njit(cache=True)
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


@njit(cache=True, nogil=True)
def _placement(n, lptr, lidx, ipos, snode, sfirst, width, fptr, frows, fparent, offset):
    """Where everything goes in the fronts: ``amap`` (each stored entry of ``lower``, at
    ``(r, c)`` of the permuted matrix with ``r >= c``, at ``offset[f] + (c - first[f]) *
    size[f] + (r's place in front f's row list)``, ``f`` the supernode of ``c``) and ``rel``
    (each update row of a front, its place in its parent's list; 0 for pivot rows). Entries
    and children are grouped by front (counting sorts), and a front's row places are set in
    one scratch array before its entries and its children read them: O(nnz + rows). The
    numpy version (a searchsorted of every entry in the sorted (front, row) keys and the
    arrays around it) was ~11 ms of bcsstk16's 36 ms analysis on the H200 machine's host
    (2026-11-26)."""
    nsn = len(sfirst)
    nz = lptr[n]
    er = np.empty(nz, np.int64)  # (row, column) in the permuted matrix, row >= column
    ec = np.empty(nz, np.int64)
    cnt = np.zeros(nsn + 1, np.int64)
    for c in range(n):
        b = ipos[c]
        for e in range(lptr[c], lptr[c + 1]):
            a = ipos[lidx[e]]
            if a >= b:
                er[e], ec[e] = a, b
            else:
                er[e], ec[e] = b, a
            cnt[snode[ec[e]] + 1] += 1
    for f in range(nsn):
        cnt[f + 1] += cnt[f]
    order = np.empty(nz, np.int64)
    at = cnt[:nsn].copy()
    for e in range(nz):
        f = snode[ec[e]]
        order[at[f]] = e
        at[f] += 1
    kids = np.zeros(nsn + 1, np.int64)  # children by parent
    for f in range(nsn):
        if fparent[f] >= 0:
            kids[fparent[f] + 1] += 1
    for f in range(nsn):
        kids[f + 1] += kids[f]
    kid = np.empty(max(kids[nsn], 1), np.int64)
    kat = kids[:nsn].copy()
    for f in range(nsn):
        q = fparent[f]
        if q >= 0:
            kid[kat[q]] = f
            kat[q] += 1
    place = np.empty(n, np.int64)
    amap = np.empty(nz, np.int64)
    rel = np.zeros(len(frows), np.int64)
    for f in range(nsn):
        base = fptr[f]
        for k in range(base, fptr[f + 1]):
            place[frows[k]] = k - base
        size = fptr[f + 1] - base
        for q in range(cnt[f], cnt[f + 1]):
            e = order[q]
            amap[e] = offset[f] + (ec[e] - sfirst[f]) * size + place[er[e]]
        for q in range(kids[f], kids[f + 1]):
            ch = kid[q]
            for k in range(fptr[ch] + width[ch], fptr[ch + 1]):
                rel[k] = place[frows[k]]
    return amap, rel


@njit(cache=True)
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
@dataclass(frozen=True, eq=False)
class Lower:
    """A matrix's lower triangle, canonical CSC (rows increasing within each column, no
    duplicates; int64 indices): what the analysis reads and its maps index. ``data`` is the
    matrix's values in that order (``None`` where only the pattern is kept)."""

    n: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.n)

    @property
    def nnz(self) -> int:
        return len(self.indices)

    def same_pattern(self, other: "Lower") -> bool:
        return (self.n == other.n and np.array_equal(self.indptr, other.indptr)
                and np.array_equal(self.indices, other.indices))

    def pattern_key(self) -> tuple:
        """A key equal for equal patterns (the bytes themselves: a dict compares them on a
        hit, so two patterns never share an analysis by a hash collision)."""
        return (self.n, self.indptr.tobytes(), self.indices.tobytes())


def lower_triangle(A, dtype=np.float64) -> Lower:
    """The canonical lower triangle of the symmetric matrix ``A`` (scipy sparse, square; one
    stored triangle stands for the whole matrix, an upper one through its transpose; both
    stored must agree within ``1e3 eps |A|max``), its values in ``dtype``. Raises
    ``ValueError`` saying what is wrong (the caller names the matrix)."""
    n = A.shape[0]
    if A.format not in ("csr", "csc"):
        A = A.tocsc()
    for name in ("indptr", "indices"):
        dt = np.asarray(getattr(A, name)).dtype
        if dt.kind not in "iu":
            raise ValueError(f"malformed index arrays: {name} has dtype {dt}, expected integers")
    val = np.asarray(A.data)
    if val.dtype != dtype:
        val = val.astype(dtype)
    tol = 1e3 * float(np.finfo(dtype).eps)
    code, i1, i2, x1, x2, ptr, rows, vals = _canon_lower(
        n, np.asarray(A.indptr), np.asarray(A.indices), val, A.format == "csr", tol)
    if code == 0:
        return Lower(n, ptr, rows, vals)
    why = {
        1: f"indptr has {i1} entries, expected {n + 1}",
        2: f"indptr starts at {i1}, expected 0",
        3: f"indptr decreases at position {i1}",
        4: f"indptr ends at {i1}, past the {i2} stored indices or values",
        5: f"index {i2} at position {i1} is out of range [0, {n})",
    }
    if code in why:
        raise ValueError(f"malformed index arrays: {why[code]}")
    if code == 6:
        raise ValueError(f"{i1} stored entries are NaN or infinite")
    raise ValueError(f"not symmetric: max |A - A^T| = {x1:.3g} (|A|max {x2:.3g}); store one "
                     f"triangle, or both equal")


def _as_lower(lower) -> Lower:
    """A :class:`Lower` as given, or read from a scipy matrix (:func:`lower_triangle`: any
    symmetric one, or one triangle)."""
    if isinstance(lower, Lower):
        return lower
    dt = lower.dtype if np.issubdtype(lower.dtype, np.floating) else np.float64
    return lower_triangle(lower, dt)


@dataclass(frozen=True, eq=False)
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
    lower: Lower  # the pattern of A's lower triangle that the maps index (data None)

    @property
    def fronts(self) -> int:
        return len(self.first)

    @cached_property
    def update_rel(self) -> np.ndarray:
        """``rel`` of the update rows alone, front after front (what the extend-add reads)."""
        fid = np.repeat(np.arange(self.fronts), self.size)
        return self.rel[np.arange(len(self.rows)) - self.fptr[fid] >= self.width[fid]]

    @cached_property
    def nnz_l(self) -> int:
        w, s = self.width.astype(np.int64), self.size.astype(np.int64)
        return int((w * s - w * (w - 1) // 2).sum())

    @cached_property
    def flops(self) -> float:
        """Flops of the numeric factorization: each front's partial Cholesky (its pivots'
        columns and the Schur complement of its update block)."""
        w, s = self.width.astype(np.float64), self.size.astype(np.float64)
        u = s - w
        return float((w**3 / 3 + w * w * u + w * u * u).sum())


def order(lower, ordering, nd=None) -> np.ndarray:
    """The fill-reducing permutation (``perm[new] = old``) of the matrix whose lower triangle
    is ``lower`` (a :class:`Lower`, or a scipy sparse matrix). ``"auto"``: of METIS nested
    dissection, reverse Cuthill-McKee and the natural order, the one whose factor has the
    fewest entries (counted exactly, from the elimination tree, before amalgamation). ND wins
    on meshes; a banded matrix such as bcsstk16 keeps its band (natural: 610,800 entries of L,
    RCM 627,487, ND 740,913)."""
    lower = _as_lower(lower)
    n = lower.n
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
    gptr, gadj = _sym_graph(n, lower.indptr, lower.indices)
    if len(gadj) == 0:
        return np.arange(n, dtype=np.int64)
    if ordering == "rcm":
        return _rcm(n, gptr, gadj)
    if ordering == "nd":
        return _nd(gptr, gadj) if nd is None else nd.result()
    return _least(lower, lambda p: (fill(lower, p), None), nd)[0]


def _least(lower: "Lower", score, nd=None) -> tuple:
    """``(perm, aux)`` of the candidate (:func:`candidates`, in their order on ties) whose
    ``score(perm) = (key, aux)`` has the least key. METIS's order is computed in a thread
    while the others are scored: its call releases the GIL (dissect.py), so the natural and
    RCM orders' elimination trees and supernodes take no time of their own (bcsstk16: METIS
    22 of the analysis's 46 ms, 2-core VM). One candidate's ``aux`` is held at a time besides
    the best's."""
    n = lower.n
    natural = np.arange(n, dtype=np.int64)
    if n <= 2:
        return natural, score(natural)[1]
    gptr, gadj = _sym_graph(n, lower.indptr, lower.indices)
    if len(gadj) == 0:
        return natural, score(natural)[1]
    best = None
    with ThreadPoolExecutor(1) as ex:
        # (``nd``: METIS's order made elsewhere, a future: a batch's, in worker processes)
        nd = ex.submit(_nd, gptr, gadj) if nd is None else nd
        for get in (lambda: natural, lambda: _rcm(n, gptr, gadj), nd.result):
            p = get()
            key, aux = score(p)
            if best is None or key < best[0]:
                best = (key, p, aux)
            key = aux = None
    return best[1], best[2]


def candidates(lower) -> list[np.ndarray]:
    """The orderings ``"auto"`` chooses among: natural, then (where the matrix has off-diagonal
    entries) reverse Cuthill-McKee and METIS nested dissection."""
    lower = _as_lower(lower)
    n = lower.n
    natural = np.arange(n, dtype=np.int64)
    if n <= 2:
        return [natural]
    gptr, gadj = _sym_graph(n, lower.indptr, lower.indices)
    if len(gadj) == 0:
        return [natural]
    return [natural, _rcm(n, gptr, gadj), _nd(gptr, gadj)]


def _nd(gptr: np.ndarray, gadj: np.ndarray) -> np.ndarray:
    # METIS's order; a large graph's two halves ordered side by side (dissect.py). METIS's
    # first output (its "perm") is ours, new -> old: measured on the shared matrices, it gives
    # the fill of SuperLU's MMD (494_bus 1536 against 1400 entries of L, bcsstk09 47160
    # against 59920) where the second gives 3-4x more.
    from vbatch.sparse.dissect import nested_dissection

    return nested_dissection(gptr, gadj)


def _rcm(n: int, gptr: np.ndarray, gadj: np.ndarray) -> np.ndarray:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    g = sp.csr_matrix((np.ones(len(gadj), np.int8), gadj.astype(np.int32),
                       gptr.astype(np.int32)), shape=(n, n))
    return np.asarray(reverse_cuthill_mckee(g, symmetric_mode=True), dtype=np.int64)


def fill(lower, perm: np.ndarray) -> int:
    """Entries of the Cholesky factor of ``lower`` permuted by ``perm`` (diagonal included)."""
    lower = _as_lower(lower)
    n = lower.n
    ipos = _inverse(perm)
    rptr, ridx = _permuted_lower(n, lower.indptr, lower.indices, ipos, True)
    cptr, cidx = _permuted_lower(n, lower.indptr, lower.indices, ipos, False)
    parent = _etree(n, rptr, ridx)
    return int(_colcounts_fast(n, cptr, cidx, parent, _postorder(parent)).sum())


def _inverse(perm: np.ndarray) -> np.ndarray:
    ipos = np.empty(len(perm), np.int64)
    ipos[perm] = np.arange(len(perm))
    return ipos


def _supernodes(lower: "Lower", perm: np.ndarray, relax_width: int, relax_zeros: float):
    """Steps 2-4 of the analysis for the ordering ``perm``: the postordered permutation, the
    inverse, the permuted pattern by columns, the column counts, each column's supernode and
    each supernode's first and last column (after amalgamation)."""
    n = lower.n
    lptr, lidx = lower.indptr, lower.indices
    # CSR of the permuted lower pattern: row k, columns <= k
    rptr, ridx = _permuted_lower(n, lptr, lidx, _inverse(perm), True)
    parent = _etree(n, rptr, ridx)
    post = _postorder(parent)
    perm = perm[post]
    ipos = _inverse(perm)
    # A postorder is a relabelling of the same tree: the permuted matrix's parent array is the
    # old one renumbered, not a second elimination-tree pass.
    ipost = _inverse(post)
    old = parent[post]
    parent = np.where(old >= 0, ipost[np.maximum(old, 0)], -1)
    cptr, cidx = _permuted_lower(n, lptr, lidx, ipos, False)  # by columns: rows >= column
    count = _colcounts_fast(n, cptr, cidx, parent, np.arange(n))
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
    # snode is nondecreasing (supernodes are runs of columns): each one's first and last
    sfirst = np.flatnonzero(np.concatenate([[True], snode[1:] != snode[:-1]]))
    slast = np.append(sfirst[1:], n) - 1
    return perm, ipos, parent, count, cptr, cidx, snode, sfirst, slast, nsn


def estimate(lower, perm: np.ndarray, cost: dict, relax_width: int = RELAX_WIDTH,
             relax_zeros: float = RELAX_ZEROS) -> float:
    """The modelled seconds of the numeric factorization in the ordering ``perm``:
    ``cost["flop"]`` a flop, ``cost["step"]`` a panel step on the tree's critical path (a front
    of width w takes 1 + ceil(w / 32) steps, the panels and its update, on the longest
    leaf-to-root path: what a tree of dependent launches waits through), ``cost["front"]`` a
    front. The fronts come from the amalgamated supernodes without their row lists: a merged
    front holds its columns and the rows below its last column (a child's update rows lie in
    its parent's structure), ``width + count[last] - 1`` rows."""
    return _modelled(_supernodes(_as_lower(lower), perm, relax_width, relax_zeros), cost)


def _modelled(sn: tuple, cost: dict) -> float:
    """:func:`estimate` of the supernodes ``sn`` (what :func:`_supernodes` returns)."""
    _, _, parent, count, _, _, snode, sfirst, slast, nsn = sn
    width = (slast - sfirst + 1).astype(np.float64)
    size = width + count[slast] - 1
    u = size - width
    flops = float((width**3 / 3 + width * width * u + width * u * u).sum())
    sparent = np.where(parent[slast] >= 0, snode[np.maximum(parent[slast], 0)], -1)
    steps = 1 + -(-(slast - sfirst + 1) // 32)
    path = _critical_path(sparent, steps.astype(np.int64)) if nsn else 0
    return (cost.get("flop", 0.0) * flops + cost.get("step", 0.0) * path
            + cost.get("front", 0.0) * nsn)


def analyze(lower, ordering="auto", relax_width: int = RELAX_WIDTH,
            relax_zeros: float = RELAX_ZEROS, cost: dict | None = None,
            nd=None) -> Analysis:
    """The analysis of the SPD matrix whose lower triangle (diagonal included) is ``lower``
    (a :class:`Lower`, or a scipy sparse matrix, read by :func:`lower_triangle`). With
    ``cost`` (a backend's, :func:`estimate`), ``"auto"`` takes the candidate ordering of least
    modelled time; without, the one of least fill (:func:`order`). ``nd``: METIS's order of
    this matrix's graph, as a future (:func:`vbatch.sparse.dissect.orders_of`), for "auto"
    with ``cost``; made here when not given."""
    lower = _as_lower(lower)
    n = lower.n
    lptr, lidx = lower.indptr, lower.indices
    if cost is not None and isinstance(ordering, str) and ordering == "auto":
        # (the winner's supernodes are the ones the model priced: kept, not made again; one
        # candidate's at a time besides, as their arrays are the size of A's pattern)
        def priced(p):
            x = _supernodes(lower, p, relax_width, relax_zeros)
            return _modelled(x, cost), x

        sn = _least(lower, priced, nd)[1]
    else:
        sn = _supernodes(lower, order(lower, ordering, nd), relax_width, relax_zeros)
    perm, ipos, parent, count, cptr, cidx, snode, sfirst, slast, nsn = sn
    fptr, frows, fparent = _fronts(n, cptr, cidx, snode, sfirst, slast, nsn)
    size = np.diff(fptr)
    width = slast - sfirst + 1
    offset = np.zeros(nsn, np.int64)
    np.cumsum(size[:-1] ** 2, out=offset[1:])
    # A's entries (the e-th stored entry of lower, column-major data order) in the fronts, and
    # each front's update rows in its parent's list
    amap, rel = _placement(n, lptr, lidx, ipos, snode, sfirst, width, fptr, frows, fparent,
                           offset)
    return Analysis(n=n, perm=perm, first=sfirst, width=width, size=size, fptr=fptr, rows=frows,
                    parent=fparent, offset=offset, amap=amap, rel=rel,
                    lower=Lower(n, lptr, lidx))
