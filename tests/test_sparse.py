"""vbatch.sparse: the multifrontal Cholesky, on every backend.

Checks, per matrix: the symbolic structure covers every entry of the dense factor (analysis);
``||L L^T - P A P^T|| / ||A|| <= c n eps`` (the numeric factorization); the solve's backward
error ``||A x - b|| / (||A|| ||x|| + ||b||) <= c n eps``; NaN fails every check. Matrices: the
real ones of ../shared/data/matrices (or $VBATCH_MATRICES), 2-D and 3-D Laplacians, alone and
in one batch, with a matrix that is not positive definite among them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import DEVICES
from vbatch import InputError, PackedBatch, Runtime

sparse = pytest.importorskip("vbatch.sparse")  # numba and pymetis: the test extra has them

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.environ.get(
    "VBATCH_MATRICES", os.path.join(HERE, "..", "..", "shared", "data", "matrices")
)
REAL = ["494_bus.mtx", "1138_bus.mtx", "bcsstk09.mtx", "gr_900_900_crg.mtx",
        "bcsstk16.triplet0"]


def load(name: str) -> sp.csc_matrix:
    path = os.path.join(FOLDER, name)
    if not os.path.exists(path):
        pytest.skip(f"real matrices not found at {FOLDER} (set VBATCH_MATRICES)")
    return sp.csc_matrix(sparse.read(path))


def lap(side: int, dim: int) -> sp.csr_matrix:
    return sparse.laplacian(side, dim)


def full(A) -> sp.csc_matrix:
    """The symmetric matrix a (possibly one-triangle) input stands for."""
    low = sp.tril(A)
    if not sp.tril(A, -1).nnz and sp.triu(A, 1).nnz:
        low = sp.tril(A.T)
    return sp.csc_matrix(low + sp.tril(low, -1).T)


def runtime(device: str) -> Runtime:
    return Runtime(device)


def check(F, i: int, A, eps: float, c: float = 30.0) -> None:
    Af = full(A).astype(np.float64)
    n = Af.shape[0]
    L, perm = F.factor(i)
    L = L.astype(np.float64)
    assert np.isfinite(L.data).all(), f"matrix {i}: NaN in the factor"
    ref = Af[perm][:, perm]
    scale = max(abs(Af).max(), 1e-300)
    err = abs(L @ L.T - ref).max() / scale if n else 0.0
    assert err <= c * n * eps, f"matrix {i} (n={n}): |LL^T - PAP^T|/|A| = {err:.3g}"


def backward(A, x, b) -> float:
    Af = full(A).astype(np.float64)
    x = np.asarray(x, np.float64).reshape(Af.shape[0], -1)
    b = np.asarray(b, np.float64).reshape(Af.shape[0], -1)
    r = np.abs(Af @ x - b).max()
    return float(r / (abs(Af).sum(axis=1).max() * np.abs(x).max() + np.abs(b).max()))


def host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


# ------------------------------------------------------------------ analysis (no backend)
@pytest.mark.parametrize("ordering", ["auto", "nd", "rcm", "natural"])
@pytest.mark.parametrize("side,dim", [(1, 2), (2, 2), (7, 2), (12, 2), (4, 3)])
def test_structure_covers_the_factor(side, dim, ordering):
    from vbatch.sparse.analysis import analyze

    A = lap(side, dim)
    low = sp.csc_matrix(sp.tril(A))
    low.sort_indices()
    an = analyze(low, ordering)
    n = A.shape[0]
    P = A.toarray()[an.perm][:, an.perm]
    L = np.linalg.cholesky(P)
    assert np.array_equal(np.sort(an.perm), np.arange(n))
    covered = np.zeros((n, n), bool)
    for f in range(an.fronts):
        rows = an.rows[an.fptr[f]: an.fptr[f + 1]]
        w = an.width[f]
        assert np.array_equal(rows[:w], np.arange(an.first[f], an.first[f] + w))
        assert np.all(np.diff(rows) > 0)
        if an.parent[f] >= 0:
            p = an.parent[f]
            assert p > f
            prow = an.rows[an.fptr[p]: an.fptr[p + 1]]
            rel = an.rel[an.fptr[f] + w: an.fptr[f + 1]]
            assert np.array_equal(prow[rel], rows[w:])
        else:
            assert len(rows) == w
        covered[np.ix_(rows, np.arange(an.first[f], an.first[f] + w))] = True
    assert np.array_equal(np.sort(np.concatenate([np.arange(an.first[f], an.first[f]
                                                            + an.width[f])
                                                  for f in range(an.fronts)])), np.arange(n))
    assert not (np.abs(L) > 1e-14)[~covered].any(), "an entry of L outside every front"


def test_auto_ordering_fill_against_superlu_mmd():
    """The chosen ordering's fill, against SuperLU's MMD on A^T + A: no worse than 1.25x on
    the shared matrices (measured 0.79-1.10x, docs/decisions.md#sparse-metis-perm)."""
    import scipy.sparse.linalg as sla

    from vbatch.sparse.analysis import fill, order

    for name in REAL:
        A = full(load(name))
        low = sp.csc_matrix(sp.tril(A))
        low.sort_indices()
        ours = fill(low, order(low, "auto"))
        lu = sla.splu(A, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                      options=dict(SymmetricMode=True))
        assert ours <= 1.25 * lu.L.nnz, f"{name}: nnz(L) {ours} against MMD's {lu.L.nnz}"


def _band(n: int, half: int, seed: int) -> sp.csc_matrix:
    """A random SPD band matrix (diagonally dominant): least fill in its natural order, whose
    elimination tree is a chain."""
    rng = np.random.default_rng(seed)
    diags = [rng.uniform(-1, 0, n - d) for d in range(1, half + 1)]
    low = sp.diags(diags, [-d for d in range(1, half + 1)], shape=(n, n))
    A = low + low.T + sp.diags(np.full(n, 2.0 * half + 1.0))
    return sp.csc_matrix(A)


@pytest.mark.parametrize("name", ["band", "lap2", "bcsstk09.mtx"])
def test_cost_estimate_matches_the_analysis(name):
    """estimate() models the fronts without building them: its flops equal the analysis's, and
    its critical path (1 + ceil(w / 32) steps a front) equals the one walked over the built
    fronts, in every candidate ordering."""
    from vbatch.sparse.analysis import analyze, candidates, estimate, lower_triangle

    A = {"band": lambda: _band(700, 5, 1), "lap2": lambda: lap(17, 2)}.get(
        name, lambda: load(name))()
    low = lower_triangle(A)
    for perm in candidates(low):
        an = analyze(low, perm)
        assert estimate(low, perm, {"flop": 1.0}) == pytest.approx(an.flops, rel=1e-12)
        assert estimate(low, perm, {"front": 1.0}) == an.fronts
        steps = 1 + -(-an.width // 32)
        below = np.zeros(an.fronts, np.int64)
        longest = 0
        for f in range(an.fronts):  # postorder: children first
            here = steps[f] + below[f]
            longest = max(longest, here)
            if an.parent[f] >= 0:
                below[an.parent[f]] = max(below[an.parent[f]], here)
        assert estimate(low, perm, {"step": 1.0}) == longest


def test_auto_ordering_by_the_backend_cost_model():
    """A band matrix has the least fill in its natural order, a chain of fronts. Without a
    cost model "auto" keeps that order; with the CUDA backend's (launch steps weigh) it takes
    the candidate of least modelled time, whose tree is far shorter; the CPU backend has no
    model and keeps the least fill."""
    from vbatch.kernels.frontal_cuda import ORDER_COST
    from vbatch.sparse.analysis import analyze, candidates, estimate, fill, lower_triangle

    low = lower_triangle(_band(3000, 4, 2))
    cands = candidates(low)
    by_fill = analyze(low, "auto")
    fills = [fill(low, p) for p in cands]
    assert fill(low, by_fill.perm) == min(fills)
    by_cost = analyze(low, "auto", cost=ORDER_COST)
    costs = [estimate(low, p, ORDER_COST) for p in cands]
    assert estimate(low, by_cost.perm, ORDER_COST) == pytest.approx(min(costs))
    steps = {"step": 1.0}
    assert estimate(low, by_cost.perm, steps) * 4 < estimate(low, by_fill.perm, steps)
    F = sparse.cholesky(_band(3000, 4, 2), runtime=Runtime("cpu"))
    assert fill(low, F.analyses[0].perm) == min(fills)


def _tril_reference(B, dtype=np.float64) -> sp.csc_matrix:
    """What the analysis must read, through scipy: the lower triangle of the duplicates-summed
    matrix, or the transposed upper one where only that is stored."""
    A = sp.csc_matrix(B, dtype=dtype, copy=True)
    A.sum_duplicates()
    only_upper = sp.triu(A, 1).nnz and not sp.tril(A, -1).nnz
    out = sp.csc_matrix(sp.tril(A.T) if only_upper else sp.tril(A))
    out.sum_duplicates()
    out.sort_indices()
    return out


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_lower_triangle_equals_scipy_in_every_form(fmt):
    """The compiled reading of a matrix (sorted and unsorted indices, duplicates, one triangle
    either way, both, the diagonal alone) gives scipy's lower triangle exactly; both triangles
    that disagree are refused."""
    from vbatch.sparse.analysis import lower_triangle

    rng = np.random.default_rng(7)
    refused = 0
    for t in range(400):
        n = int(rng.integers(1, 13))
        M = sp.random(n, n, density=rng.uniform(0, 0.8), random_state=rng, format="coo")
        M = M + sp.diags(rng.uniform(1, 2, n))
        kind = t % 4
        B = sp.coo_matrix([M + M.T, sp.tril(M), sp.triu(M), M][kind])
        if t % 3 == 0 and B.nnz:  # a duplicate of one entry, split in two halves
            k = int(rng.integers(0, B.nnz))
            B = sp.coo_matrix((np.r_[B.data, -0.5 * B.data[k], 0.5 * B.data[k]],
                               (np.r_[B.row, B.row[k], B.row[k]],
                                np.r_[B.col, B.col[k], B.col[k]])), shape=B.shape)
        C = B.asformat(fmt)
        if fmt != "coo" and t % 2:  # unsorted indices within rows/columns
            C = C.copy()
            for j in range(n):
                a, b = C.indptr[j], C.indptr[j + 1]
                perm = rng.permutation(b - a)
                C.indices[a:b] = C.indices[a:b][perm]
                C.data[a:b] = C.data[a:b][perm]
            C.has_sorted_indices = False
        for dtype in (np.float64, np.float32):
            full_b = sp.csc_matrix(B, dtype=np.float64)
            gap = abs(full_b - full_b.T)
            asym = gap.nnz and gap.max() > 1e3 * np.finfo(dtype).eps * abs(full_b).max()
            if asym and sp.tril(B, -1).nnz and sp.triu(B, 1).nnz:
                with pytest.raises(ValueError, match="not symmetric"):
                    lower_triangle(C, dtype)
                refused += 1
                continue
            got = lower_triangle(C, dtype)
            ref = _tril_reference(B, dtype)
            assert got.data.dtype == dtype
            assert np.array_equal(got.indptr, ref.indptr), (t, fmt)
            assert np.array_equal(got.indices, ref.indices), (t, fmt)
            tol = 4 * np.finfo(dtype).eps * max(abs(ref.data).max(initial=0), 1)
            assert np.allclose(got.data, ref.data, rtol=0, atol=tol), (t, fmt)
    assert refused > 0  # the draw holds unsymmetric matrices with both triangles


def test_fast_column_counts_equal_the_row_subtree_walk():
    """Gilbert-Ng-Peyton's column counts against the walk over every row subtree, on random
    symmetric patterns in random orders (forests included: empty rows)."""
    from vbatch.sparse import analysis as an

    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 50))
        M = sp.random(n, n, density=rng.uniform(0, 0.25), random_state=rng)
        low = an.lower_triangle(sp.csr_matrix(M + M.T + sp.eye(n)))
        ipos = an._inverse(rng.permutation(n))
        rptr, ridx = an._permuted_lower(n, low.indptr, low.indices, ipos, True)
        cptr, cidx = an._permuted_lower(n, low.indptr, low.indices, ipos, False)
        parent = an._etree(n, rptr, ridx)
        want = an._colcounts(n, rptr, ridx, parent)
        got = an._colcounts_fast(n, cptr, cidx, parent, an._postorder(parent))
        assert np.array_equal(got, want)


def test_malformed_index_arrays_are_named():
    from vbatch.sparse.analysis import lower_triangle

    good = sp.csr_matrix(lap(3, 2))
    cases = {
        "indptr decreases at position 2": lambda m: m.indptr.__setitem__(2, 0),
        r"index 9 at position 0 is out of range \[0, 9\)": lambda m: m.indices.__setitem__(0, 9),
        "index -1 at position 4": lambda m: m.indices.__setitem__(4, -1),
        "indptr ends at 40, past the 33": lambda m: m.indptr.__setitem__(9, 40),
        "indptr starts at 1": lambda m: m.indptr.__setitem__(0, 1),
    }
    for msg, spoil in cases.items():
        m = good.copy()
        spoil(m)
        with pytest.raises(ValueError, match=msg):
            lower_triangle(m)
        with pytest.raises(InputError, match="matrix 1: malformed index arrays: " + msg):
            sparse.cholesky([good, m])
    m = good.copy()
    m.indices = m.indices.astype(np.float64)
    with pytest.raises(InputError, match="matrix 1: malformed index arrays: indices has dtype"):
        sparse.cholesky([good, m])


def test_duplicates_that_overflow_the_dtype_are_refused():
    """Duplicates are summed in float64; a sum past float32's range is infinite as stored."""
    A = sp.csc_matrix((np.array([2e38, 2e38, 1.0, 1.0]), np.array([0, 0, 1, 1], np.int32),
                       np.array([0, 3, 4])), shape=(2, 2))
    with pytest.raises(InputError, match="matrix 0: 1 stored entries are NaN or infinite"):
        sparse.cholesky([A], dtype=np.float32)
    assert sparse.cholesky([A], dtype=np.float64).info.tolist() == [0]


def test_a_large_batch_is_read_in_threads_in_order():
    """A batch of 256 matrices or more is read in threads: the same triangles, in order, and
    the first bad matrix of the list is the one named."""
    rng = np.random.default_rng(2)
    mats = [sp.csr_matrix(lap(int(rng.integers(1, 5)), 2) * float(i + 1)) for i in range(300)]
    got = sparse.factor._read(mats, np.dtype(np.float64))
    for i, (A, lw) in enumerate(zip(mats, got)):
        ref = _tril_reference(A)
        assert np.array_equal(lw.indptr, ref.indptr) and np.array_equal(lw.data, ref.data), i
    bad = list(mats)
    bad[290] = sp.csr_matrix(np.ones((2, 3)))
    bad[150] = sp.csr_matrix(2 * np.triu(np.ones((3, 3)), 1) + 5 * np.eye(3)
                             + np.tril(np.ones((3, 3)), -1))
    with pytest.raises(InputError, match="matrix 150: not symmetric"):
        sparse.factor._read(bad, np.dtype(np.float64))


def test_a_batch_shares_the_analysis_of_one_pattern():
    """Matrices of one pattern share one analysis (and values of their own): the factors and
    solutions equal those of each matrix factored alone."""
    rng = np.random.default_rng(5)
    base = [lap(6, 2), lap(4, 3), lap(6, 2), lap(7, 2), lap(4, 3), lap(6, 2)]
    mats = [sp.csr_matrix(A + sp.diags(rng.uniform(0, 1, A.shape[0]))) for A in base]
    F = sparse.cholesky(mats)
    assert F.analyses[0] is F.analyses[2] is F.analyses[5]
    assert F.analyses[1] is F.analyses[4] and F.analyses[0] is not F.analyses[3]
    bs = [rng.standard_normal(A.shape[0]) for A in mats]
    xs = F.solve(bs)
    for i, (A, b) in enumerate(zip(mats, bs)):
        alone = sparse.cholesky(A)
        assert np.allclose(xs[i], alone.solve(b), rtol=1e-12, atol=0), f"matrix {i}"
        La, pa = alone.factor()
        Lb, pb = F.factor(i)
        assert np.array_equal(pa, pb)
        assert abs(La - Lb).max() <= 1e-12 * abs(La).max(), f"matrix {i}"
    # a pattern's values are the matrix's own: refactor one, the others keep theirs
    mats2 = list(mats)
    mats2[2] = sp.csr_matrix(mats[2] * 2.0)
    F.refactor(mats2)
    assert np.allclose(F.solve(bs)[2], xs[2] / 2.0, rtol=1e-12, atol=0)
    assert np.allclose(F.solve(bs)[0], xs[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("ordering", ["nd", "rcm"])
def test_factor_entries_match_superlu_for_the_same_ordering(ordering):
    """The exact count of L's entries (the elimination tree's column counts) equals SuperLU's
    nnz(L) on the same permuted matrix without pivoting; the analysis's fronts hold at least
    that many (amalgamation adds zeros, never drops an entry)."""
    import scipy.sparse.linalg as sla

    from vbatch.sparse.analysis import analyze, fill, order

    mats = [lap(20, 2), lap(6, 3)] + [full(load(n)) for n in ("bcsstk09.mtx", "1138_bus.mtx")
                                      if os.path.exists(os.path.join(FOLDER, n))]
    for A in mats:
        low = sp.csc_matrix(sp.tril(A))
        low.sort_indices()
        perm = order(low, ordering)
        lu = sla.splu(sp.csc_matrix(A[perm][:, perm]), permc_spec="NATURAL",
                      diag_pivot_thresh=0.0, options=dict(SymmetricMode=True))
        assert np.array_equal(lu.perm_r, np.arange(A.shape[0]))  # no pivoting happened
        assert fill(low, perm) == lu.L.nnz
        assert analyze(low, perm).nnz_l >= lu.L.nnz
        assert analyze(low, perm, relax_width=1, relax_zeros=0.0).nnz_l == lu.L.nnz


def _graph(A):
    from vbatch.sparse.analysis import _sym_graph, lower_triangle

    lw = lower_triangle(A)
    return lw, _sym_graph(lw.n, lw.indptr, lw.indices)


def test_metis_through_ctypes_is_pymetis_order():
    """dissect.node_nd calls the METIS that pymetis carries: the same order as pymetis."""
    import pymetis

    from vbatch.sparse.dissect import node_nd

    for A in (lap(9, 2), lap(5, 3), lap(1, 2)):
        _, (gptr, gadj) = _graph(A)
        got = node_nd(gptr, gadj)
        if len(gadj):
            want, _ = pymetis.nested_dissection(pymetis.CSRAdjacency(gptr.astype(np.int32),
                                                                     gadj.astype(np.int32)))
            assert np.array_equal(got, np.asarray(want))
        assert np.array_equal(np.sort(got), np.arange(A.shape[0]))


def test_vertex_cover_of_the_cut_is_least():
    """Konig: the cover touches every edge and has as many vertices as a maximum matching."""
    from scipy.sparse.csgraph import maximum_bipartite_matching

    from vbatch.sparse.dissect import _cover

    rng = np.random.default_rng(4)
    for na, nb, m in ((1, 1, 1), (5, 7, 12), (30, 20, 80), (40, 40, 40)):
        a, b = rng.integers(0, na, m), rng.integers(0, nb, m)
        ca, cb = _cover(a, b, na, nb)
        ina, inb = np.isin(a, ca), np.isin(b, cb)
        assert np.all(ina | inb), "an edge without a covered end"
        g = sp.csr_matrix((np.ones(m), (a, b)), shape=(na, nb))
        matching = int((maximum_bipartite_matching(g, perm_type="column") >= 0).sum())
        assert len(ca) + len(cb) == matching


def _separates(gptr, gadj, where) -> bool:
    src = np.repeat(np.arange(len(gptr) - 1), np.diff(gptr))
    return not np.any((where[src] < 2) & (where[gadj] < 2) & (where[src] != where[gadj]))


def test_a_batchs_metis_orders_in_workers_equal_one_process(monkeypatch):
    """Many small graphs' METIS orders, made in worker processes (dissect.orders_of), are the
    orders METIS gives each in this process: where the workers run, where one fails, and where
    none can start. And a batch's analyses are the same either way."""
    import vbatch.sparse as S
    from vbatch.sparse import dissect

    graphs = [_graph(lap(s, d))[1] for s, d in ((5, 2), (9, 2), (12, 2), (4, 3), (6, 3),
                                                   (15, 2), (7, 2), (3, 3), (10, 2), (5, 3))]
    want = [dissect.node_nd(*g) for g in graphs]
    monkeypatch.setattr(dissect, "MANY_MIN_VERTICES", 10)
    monkeypatch.setattr(dissect, "_cores", lambda: 4)
    here, real = [], dissect.node_nd  # the orders made in this process

    def counted(*a, **kw):
        here.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(dissect, "node_nd", counted)
    for case in ("workers", "a worker fails", "no workers"):
        if case == "a worker fails":
            bad = "import sys; sys.stdout.buffer.write(b'x' * 12)"
            monkeypatch.setattr(dissect, "_WORKER", bad)
        if case == "no workers":
            monkeypatch.setattr(dissect, "_workers_possible", lambda: False)
        here.clear()
        got = [f.result(timeout=120) for f in dissect.orders_of(graphs)]
        for i, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(g, w), f"{case}: graph {i}"
        # the workers made every order, or (failing, absent) this process made some
        assert (len(here) == 0) == (case == "workers"), f"{case}: {len(here)} made here"
    monkeypatch.undo()
    mats = [lap(s, 2) for s in (4, 5, 6, 7, 8, 9, 10, 11, 12, 13)]
    lowers = S.factor._read(mats, np.dtype(np.float64))
    monkeypatch.setattr(dissect, "MANY_MIN_VERTICES", 10)
    monkeypatch.setattr(dissect, "_cores", lambda: 4)
    from vbatch.kernels.frontal_cuda import ORDER_COST
    from vbatch.sparse.analysis import analyze

    for cost in (None, ORDER_COST):  # (least fill, the CPU's; least modelled time, CUDA's)
        many = S.factor._analyses(lowers, "auto", S.factor.RELAX_WIDTH,
                                  S.factor.RELAX_ZEROS, cost)
        for lw, an in zip(lowers, many):
            one = analyze(lw, "auto", cost=cost)
            assert np.array_equal(an.perm, one.perm) and an.nnz_l == one.nnz_l


def test_a_batchs_metis_orders_take_workers_only_where_two_can_run(monkeypatch):
    """One worker process would be METIS's calls one after another plus its start: with fewer
    than two cores to spare, a batch's orders are made in this process, and still equal
    METIS's own."""
    from vbatch.sparse import dissect

    graphs = [_graph(lap(s, 2))[1] for s in (5, 9, 12, 15)]
    want = [dissect.node_nd(*g) for g in graphs]
    monkeypatch.setattr(dissect, "MANY_MIN_GRAPHS", 2)
    monkeypatch.setattr(dissect, "MANY_MIN_VERTICES", 10)
    started = []
    real = dissect._start

    def counted():
        started.append(real())
        return started[-1]

    monkeypatch.setattr(dissect, "_start", counted)
    for cores, workers in ((2, 0), (4, 3)):
        monkeypatch.setattr(dissect, "_cores", lambda c=cores: c)
        assert dissect.batch_workers() == workers
        got = [f.result(timeout=120) for f in dissect.orders_of(graphs)]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        assert len(started) == min(workers, len(graphs) // 2)  # (2 of 3 for 4 graphs)


def test_separator_refinement_shrinks_and_still_separates():
    """FM on a vertex separator: a thick band across a grid (three diagonals, 118 vertices)
    comes down to about one line's worth; every start keeps separating, never grows, keeps the
    sides within the balance allowed, and gives the same separator on every run."""
    from vbatch.sparse import dissect

    side = 40
    A = lap(side, 2)
    _, (gptr, gadj) = _graph(A)
    i, j = np.divmod(np.arange(side * side), side)
    d = i + j
    where = np.where(d < side - 2, 0, np.where(d > side, 1, 2)).astype(np.int8)
    assert _separates(gptr, gadj, where)
    start = int((where == 2).sum())
    dissect._refine(gptr, gadj, where, 16, 1024, 0.55)
    assert _separates(gptr, gadj, where)
    assert (where == 2).sum() <= side + 2 < start
    rng = np.random.default_rng(7)
    for trial in range(4):
        B = sp.random(300, 300, density=0.02, random_state=trial, format="csr")
        G = ((B + B.T) != 0).astype(np.int8).tolil()
        G.setdiag(0)
        G = G.tocsr()
        G.eliminate_zeros()
        gptr, gadj = G.indptr.astype(np.int64), G.indices.astype(np.int64)
        part = rng.integers(0, 2, 300)
        src = np.repeat(np.arange(300), np.diff(gptr))
        cut = part[src] != part[gadj]
        where = part.astype(np.int8)
        where[src[cut & (part[src] == 0)]] = 2  # one end of every cut edge: a separator
        first = where.copy()
        before = int((where == 2).sum())
        dissect._refine(gptr, gadj, where, 16, 1024, 0.55)
        again = first.copy()
        dissect._refine(gptr, gadj, again, 16, 1024, 0.55)
        assert np.array_equal(where, again)
        assert _separates(gptr, gadj, where)
        assert (where == 2).sum() <= before
        cap = max(int(0.55 * 300), (first == 0).sum(), (first == 1).sum())
        assert (where == 0).sum() <= cap and (where == 1).sum() <= cap


@pytest.mark.parametrize("side,dim", [(30, 2), (9, 3)])
def test_split_dissection_orders_each_half_in_a_worker(side, dim, monkeypatch):
    """A graph past the threshold (lowered here) is split by a separator and its halves are
    ordered in worker processes: a permutation, the same on every run, where no worker can
    start and where a worker fails (the halves are then ordered here), the separator last and
    separating, and a fill within reach of one METIS call's."""
    from scipy.sparse.csgraph import connected_components

    from vbatch.sparse import dissect
    from vbatch.sparse.analysis import analyze, fill

    A = lap(side, dim)
    lw, (gptr, gadj) = _graph(A)
    n = A.shape[0]
    monkeypatch.setattr(dissect, "_cores", lambda: 4)  # (workers may start on a 2-core VM)
    here, real = [], dissect.node_nd

    def counted(*a, **kw):
        here.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(dissect, "node_nd", counted)
    perm = dissect.nested_dissection(gptr, gadj, parallel_min=16)
    assert not here, f"{len(here)} halves ordered in this process, not in the workers"
    monkeypatch.setattr(dissect, "node_nd", real)
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert np.array_equal(perm, dissect.nested_dissection(gptr, gadj, parallel_min=16))
    got = dissect._split(gptr, gadj)
    assert got is not None
    sep, halves = got
    assert np.array_equal(perm[n - len(sep):], sep)  # the top separator is numbered last
    keep = np.ones(n, bool)
    keep[sep] = False
    G = sp.csr_matrix((np.ones(len(gadj)), gadj, gptr), shape=(n, n))
    idx = np.flatnonzero(keep)
    ncomp, label = connected_components(G[idx][:, idx], directed=False)
    side_of = np.zeros(n, np.int64)
    side_of[halves[1][2]] = 1
    for c in range(ncomp):  # no component of the rest reaches both halves
        assert len(np.unique(side_of[idx[label == c]])) == 1
    one = dissect.node_nd(gptr, gadj)
    assert fill(lw, perm) <= 1.5 * fill(lw, one)
    # The same order where no worker can run (one core, no interpreter) or a worker fails:
    # the halves are then ordered here.
    monkeypatch.setattr(dissect.sys, "executable", os.path.join(HERE, "no-such-python"))
    assert not dissect._workers_possible()
    assert np.array_equal(perm, dissect.nested_dissection(gptr, gadj, parallel_min=16))
    monkeypatch.undo()
    monkeypatch.setattr(dissect, "_WORKER", "import sys; sys.stdout.buffer.write(b'no')")
    assert np.array_equal(perm, dissect.nested_dissection(gptr, gadj, parallel_min=16))
    an = analyze(lw, perm)
    P = A.toarray()[an.perm][:, an.perm]
    assert np.isfinite(np.linalg.cholesky(P)).all()


def test_analyses_in_threads_keep_their_orders():
    """METIS's calls release the GIL and share one random state: analyses run from several
    threads at once give the orders they give one at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from vbatch.sparse.analysis import analyze, lower_triangle

    lows = [lower_triangle(A) for A in (lap(24, 2), lap(7, 3), lap(30, 2), lap(6, 3))] * 3
    want = [analyze(lw, "nd").perm for lw in lows]
    with ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda lw: analyze(lw, "auto", cost={"flop": 1e-12, "step": 1e-5})
                          .perm, lows))
        nd = list(ex.map(lambda lw: analyze(lw, "nd").perm, lows))
    assert all(np.array_equal(a, b) for a, b in zip(nd, want))
    assert all(np.array_equal(a, analyze(lw, "auto", cost={"flop": 1e-12, "step": 1e-5}).perm)
               for a, lw in zip(got, lows))


# ------------------------------------------------------------------ numeric, every backend
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_an_ill_conditioned_front_keeps_the_solves_backward_error(device, dtype):
    """A dense SPD matrix of order 150 (one front of three 64-row pivot chunks, past the small
    sweeps) with eigenvalues from 1 down to 1e-12 (float32: 1e-6): the solve's backward error
    stays within the suite's bound, for a random b and for b = A x (CUDA solves each chunk
    with its diagonal block's inverse, whose error grows with that block's condition)."""
    rng = np.random.default_rng(11)
    n = 150
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    low = 1e-12 if dtype == np.float64 else 1e-6
    dense = (q * np.logspace(0, np.log10(low), n)) @ q.T
    A = sp.csc_matrix((dense + dense.T) / 2)
    F = sparse.cholesky(A, runtime=runtime(device), dtype=dtype)
    assert F.info.tolist() == [0]
    eps = np.finfo(dtype).eps
    for b in (rng.standard_normal(n), A @ rng.standard_normal(n)):
        b = b.astype(dtype)
        x = host(F.solve(b))
        assert np.isfinite(x).all()
        assert backward(A, x, b) <= 30 * n * eps, "solve's backward error"


@pytest.mark.parametrize("device", DEVICES)
def test_a_band_matrix_in_the_backends_order(device):
    """The factor takes the ordering its backend's cost model chooses (the least fill where
    it has none), and is right in it."""
    from vbatch.sparse.analysis import analyze, lower_triangle

    A = _band(3000, 4, 2)
    rt = runtime(device)
    F = sparse.cholesky(A, runtime=rt)
    cost = getattr(rt.backend._op("frontal"), "ORDER_COST", None)
    assert np.array_equal(F.analyses[0].perm, analyze(lower_triangle(A), "auto", cost=cost).perm)
    assert F.info.tolist() == [0]
    check(F, 0, A, np.finfo(np.float64).eps)
    b = np.random.default_rng(3).standard_normal(A.shape[0])
    x = F.solve(b)
    x = x.get() if hasattr(x, "get") else x
    eps = np.finfo(np.float64).eps
    scale = sp.linalg.norm(A, 1) * np.linalg.norm(x) + np.linalg.norm(b)
    assert np.linalg.norm(A @ x - b) <= 30 * A.shape[0] * eps * scale, "solve's backward error"


@pytest.mark.parametrize("device", DEVICES)
def test_real_matrices_in_one_batch_and_a_3d_laplacian_alone(device):
    """Every shared real matrix there is, and 3-D Laplacians, factored together in one call
    (their fronts share launch groups) and solved; a 3-D Laplacian alone."""
    mats = [load(n) for n in REAL if os.path.exists(os.path.join(FOLDER, n))]
    if not mats:
        pytest.skip(f"real matrices not found at {FOLDER} (set VBATCH_MATRICES)")
    mats += [lap(7, 3), lap(4, 3)]
    eps = np.finfo(np.float64).eps
    F = sparse.cholesky(mats, runtime=runtime(device))
    assert F.info.tolist() == [0] * len(mats)
    rng = np.random.default_rng(4)
    bs = [rng.standard_normal(A.shape[0]) for A in mats]
    xs = F.solve(bs)
    for i, (A, b, x) in enumerate(zip(mats, bs, xs)):
        check(F, i, A, eps)
        assert backward(A, host(x), b) <= 30 * A.shape[0] * eps, f"matrix {i}"
    A = lap(9, 3)
    G = sparse.cholesky(A, runtime=runtime(device))
    assert G.info.tolist() == [0]
    check(G, 0, A, eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", REAL)
def test_real_matrices(device, name):
    A = load(name)
    F = sparse.cholesky(A, runtime=runtime(device))
    assert F.info.tolist() == [0]
    check(F, 0, A, np.finfo(np.float64).eps)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((A.shape[0], 3))
    if device == "cuda":
        import cupy

        b = cupy.asarray(b)
    x = F.solve(b)
    assert type(x) is type(b) and x.shape == b.shape
    assert backward(A, host(x), host(b)) <= 30 * A.shape[0] * np.finfo(np.float64).eps
    if device == "cuda":  # the other backend's arrays in, the same kind out
        xc = sparse.cholesky(A, runtime=runtime("cpu")).solve(b)
        assert type(xc) is type(b)
        assert backward(A, host(xc), host(b)) <= 30 * A.shape[0] * np.finfo(np.float64).eps
        xg = F.solve(host(b))
        assert type(xg) is np.ndarray
        assert backward(A, xg, host(b)) <= 30 * A.shape[0] * np.finfo(np.float64).eps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_laplacians_alone_and_batched_with_a_failure(device, dtype):
    """Every size class, one batch; a matrix that is not positive definite in the middle gets
    its info (the first failing column, in its own numbering) and the others never notice."""
    rt = runtime(device)
    eps = np.finfo(dtype).eps
    mats = [lap(s, 2) for s in (1, 2, 5, 17, 31)] + [lap(s, 3) for s in (2, 6, 9)]
    bad = lap(6, 2).tolil()
    bad[20, 20] = -50.0  # indefinite: fails at or after column 20 of the ordering
    mats.insert(4, sp.csr_matrix(bad))
    F = sparse.cholesky(mats, runtime=rt, dtype=dtype)
    assert F.info[4] > 0 and not np.delete(F.info, 4).any(), F.info
    # The failing column, 1-based, in the matrix's own numbering: row 20's pivot is the first
    # that is not positive whatever the ordering (every other leading block of the permuted
    # matrix is a principal block of the SPD Laplacian), so the column is 21.
    assert F.info[4] == 21
    for i, A in enumerate(mats):
        if i != 4:
            check(F, i, A, eps)
    rng = np.random.default_rng(2)
    bs = [rng.standard_normal(A.shape[0]) for A in mats]
    xs = F.solve(bs)
    for i, (A, b, x) in enumerate(zip(mats, bs, xs)):
        x = host(x)
        assert x.shape == b.shape
        if i == 4:
            assert np.isnan(x).all()  # no solution for a failed matrix
        else:
            assert backward(A, x, b) <= 50 * A.shape[0] * eps, f"matrix {i}"
    alone = sparse.cholesky(mats[5], runtime=rt, dtype=dtype)
    assert backward(mats[5], host(alone.solve(bs[5])), bs[5]) <= 50 * mats[5].shape[0] * eps
    # lists of the backend's arrays (float64 whatever the factor's dtype): 1-D, n x 2
    # row-major, column-major and a strided view, and 1-D mixed with n x 1; each solution in
    # its right-hand side's shape and kind, the failed matrix's NaN
    if device == "cuda":
        import cupy as xp
    else:
        xp = np
    forms = {
        "1-D": lambda n: xp.asarray(rng.standard_normal(n)),
        "C": lambda n: xp.asarray(rng.standard_normal((n, 2))),
        "F": lambda n: xp.asfortranarray(xp.asarray(rng.standard_normal((n, 2)))),
        "strided": lambda n: xp.asarray(rng.standard_normal((2 * n, 3)))[::2, 1:],
    }
    for form, make in [*forms.items(), ("mixed", None)]:
        if make is None:
            bl = [xp.asarray(rng.standard_normal((A.shape[0],) + ((1,) if i % 2 else ())))
                  for i, A in enumerate(mats)]
        else:
            bl = [make(A.shape[0]) for A in mats]
        xl = F.solve(bl)
        assert len(xl) == len(mats)
        for i, (A, b, x) in enumerate(zip(mats, bl, xl)):
            assert type(x) is type(b) and x.shape == b.shape, f"{form}, matrix {i}"
            x, b = host(x), host(b)
            if i == 4:
                assert np.isnan(x).all()
            else:
                assert backward(A, x, b) <= 50 * A.shape[0] * eps, f"{form}, matrix {i}"
    # the stacked form: one array of every matrix's rows, the same solutions back in one array
    # (of the input's kind), the failed matrix's rows NaN; with 2 columns too
    N = sum(A.shape[0] for A in mats)
    row0 = np.cumsum([0] + [A.shape[0] for A in mats])
    for cols in ((), (2,)):
        B = rng.standard_normal((N,) + cols)
        if device == "cuda":
            import cupy

            B = cupy.asarray(B)
        X = F.solve(B)
        assert type(X) is type(B) and X.shape == B.shape
        X, Bh = host(X), host(B)
        for i, A in enumerate(mats):
            xi, bi = X[row0[i]: row0[i + 1]], Bh[row0[i]: row0[i + 1]]
            if i == 4:
                assert np.isnan(xi).all()
            else:
                assert backward(A, xi, bi) <= 50 * A.shape[0] * eps, f"stacked, matrix {i}"
    with pytest.raises(InputError, match=rf"expected an array of shape \({N},\)"):
        F.solve(np.ones(N + 1))


@pytest.mark.parametrize("device", DEVICES)
def test_stats_refactor_and_many_rhs(device):
    rt = runtime(device)
    A = lap(20, 2)
    F = sparse.cholesky(A, runtime=rt)
    s = F.stats
    assert s.fronts == len(F._size) and s.nnz_l >= A.nnz // 2 and s.flops > 0
    assert s.analysis_s > 0 and s.factor_s > 0 and s.largest_front >= 20
    b = np.random.default_rng(3).standard_normal((400, 5))
    assert backward(A, host(F.solve(b)), b) < 1e-13
    A2 = sp.csr_matrix(A + 3.0 * sp.eye(400))
    assert F.refactor(A2) is F
    check(F, 0, A2, np.finfo(np.float64).eps)
    fresh, _ = sparse.cholesky(A2, runtime=rt).factor()
    again, _ = F.factor()
    # the same analysis and the same kernels: equal up to the order of the atomic adds (CUDA)
    assert abs(fresh - again).max() <= 10 * np.finfo(np.float64).eps * abs(fresh).max()
    assert backward(A2, host(F.solve(b)), b) < 1e-13
    assert host(F.solve(np.zeros((400, 0)))).shape == (400, 0)
    with pytest.raises(InputError, match="pattern differs"):
        F.refactor(lap(20, 2) + sp.csr_matrix(([0.5, 0.5], ([399, 0], [0, 399])),
                                               shape=(400, 400)))


@pytest.mark.parametrize("device", DEVICES)
def test_one_triangle_either_way_and_1x1(device):
    rt = runtime(device)
    A = lap(9, 2)
    b = np.arange(81.0)
    for given in (sp.tril(A, format="csr"), sp.triu(A, format="csc"), A):
        x = host(sparse.cholesky(given, runtime=rt).solve(b))
        assert backward(A, x, b) < 1e-13
    one = sp.csr_matrix(np.array([[4.0]]))
    assert host(sparse.cholesky(one, runtime=rt).solve(np.array([2.0]))).tolist() == [0.5]


@pytest.mark.parametrize("device", DEVICES)
def test_one_matrix_takes_any_array_form(device):
    """One matrix's right-hand sides as a strided 1-D view, a column-major n x 2, another
    dtype than the factor's, the other backend's kind and a read-only array: each solution in
    its right-hand side's shape and kind, each b unchanged; a matrix that fails gets NaN in
    every form."""
    rt = runtime(device)
    xp = np
    if device == "cuda":
        import cupy as xp
    A = lap(13, 2)
    n = A.shape[0]
    rng = np.random.default_rng(5)
    F = sparse.cholesky(A, runtime=rt)
    forms = [xp.asarray(rng.standard_normal(2 * n))[::2],
             xp.asfortranarray(xp.asarray(rng.standard_normal((n, 2)))),
             xp.asarray(rng.standard_normal(n)).astype(np.float32),
             rng.standard_normal(n), rng.standard_normal(n)]
    forms[-1].flags.writeable = False  # (the CPU reads b where it lies: never written)
    kept = [host(b).copy() for b in forms]
    for j, b in enumerate(forms):
        x = F.solve(b)
        assert type(x) is type(b) and x.shape == b.shape, f"form {j}"
        assert backward(A, host(x), host(b).astype(np.float64)) <= 30 * n * np.finfo(
            np.float64).eps, f"form {j}"
        assert np.array_equal(host(b), kept[j]), f"form {j}: b changed"
    bad = A.tolil()
    bad[7, 7] = -50.0
    G = sparse.cholesky(sp.csr_matrix(bad), runtime=rt)
    assert G.info[0] > 0
    for b in forms:
        x = G.solve(b)
        assert x.shape == b.shape and np.isnan(host(x)).all()


def test_bad_input_names_the_matrix():
    good = lap(3, 2)
    nan = good.copy()
    nan.data[3] = np.nan
    unsym = sp.csr_matrix(good.toarray() + np.triu(np.ones((9, 9)), 1))
    broken = sp.csr_matrix(good.copy())
    broken.indices = broken.indices.copy()
    broken.indices[0] = 99
    cases = [
        (sp.csr_matrix(np.ones((2, 3))), "matrix 1: not square"),
        (unsym, "matrix 1: not symmetric"),
        (nan, "matrix 1: 1 stored entries are NaN"),
        (broken, "matrix 1: malformed index arrays"),
        (sp.csr_matrix((0, 0)), r"matrix 1: empty \(0 x 0\)"),
        (np.eye(3), "matrix 1: expected a scipy sparse matrix"),
    ]
    for bad, msg in cases:
        with pytest.raises(InputError, match=msg):
            sparse.cholesky([good, bad])
    with pytest.raises(InputError, match="no matrices"):
        sparse.cholesky([])
    F = sparse.cholesky(good)
    with pytest.raises(InputError, match=r"expected an array of shape \(9,\)"):
        F.solve(np.ones(8))


def sweep_tree(rng, dtype):
    """Fronts that reach every edge of the sweeps' items (CHUNK = 64 pivot rows, UPDATE_ROWS =
    256 update rows an item, SMALL_FRONT = 64 rows a warp): pivots 1, 63, 64, 65, 129, 300;
    update rows 0, 1, 255, 256, 257, 300; several children of one parent (their adds meet in
    one launch), three trees and a lone 1 x 1 root. Factored fronts are made directly (a
    well-conditioned L), since the solve reads only L."""
    # (p, u, parent), in postorder
    # (fronts of n <= 64 are small: a warp each; those of small subtrees (every front under
    # them small too: 3, 6, 10-12, 14, 16-18) in the small launches, the others (15, 21-23,
    # above a large front) up to 8 of a level to a block; 16-18 (at most 32 rows) end their
    # pivots at the end of a chunk of L that the warp loads at once, 8 and 16 columns or rows,
    # and 12 and 14 (64 rows; 64 and 40 pivots) at 4 and 8 for larger ones)
    spec = [(65, 257, 2), (1, 300, 2), (130, 256, 5), (63, 1, 4), (64, 255, 5), (300, 0, -1),
            (1, 0, -1), (64, 64, 9), (129, 1, 9), (65, 0, -1),
            (30, 20, 14), (2, 5, 14), (64, 0, -1), (100, 10, 15), (40, 24, 15), (30, 0, -1),
            (16, 8, 17), (8, 0, -1), (32, 0, -1),
            (70, 10, 21), (70, 12, 22), (10, 5, 23), (12, 6, 23), (20, 0, -1)]
    p = np.array([s[0] for s in spec])
    n = p + np.array([s[1] for s in spec])
    parent = np.array([s[2] for s in spec])
    fronts, rel = [], []
    for f, (pf, uf, par) in enumerate(spec):
        m = np.tril(rng.standard_normal((n[f], n[f]))) / np.sqrt(n[f])
        m[np.arange(pf), np.arange(pf)] = 1.0 + rng.random(pf)
        fronts.append(m.astype(dtype))
        rel.append(np.sort(rng.choice(n[par], uf, replace=False)) if par >= 0 else np.zeros(0))
    return n, p, parent, fronts, rel


def stacked_operands(rng, p, piv) -> tuple[dict, np.ndarray]:
    """frontal_solve's ``rhs`` and ``rows`` for the fronts' pivot rows ``piv`` (``N x r``, in
    front order), stacked in a shuffled order, and that order: pivot row j is stacked row
    ``order[j]``."""
    from vbatch.ops.frontal import index_bits

    N, r = piv.shape
    k = len(p)
    order = rng.permutation(N)  # pivot row j of the fronts is stacked row order[j]
    b = np.empty_like(piv)
    b[order] = piv
    m, c = np.zeros(k, np.int64), np.zeros(k, np.int64)
    m[0], c[0] = N * r, 1
    one = np.ones(k, np.int64)
    rhs = PackedBatch(data=b.reshape(-1), m=m, n=c, offset=np.zeros(k, np.int64),
                      ld=np.maximum(m, 1), order="F")
    # (rows laid out back to front with a gap after each front: offsets that are not the
    # running sum of p)
    start = np.cumsum(p) - p
    off = np.cumsum((p + 1)[::-1])[::-1] - (p + 1)
    data = np.zeros(int((p + 1).sum()), piv.dtype)
    for f in range(k):
        data[off[f]: off[f] + p[f]] = index_bits(order[start[f]: start[f] + p[f]], piv.dtype)
    rows = PackedBatch(data=data, m=np.asarray(p, np.int64), n=one, offset=off,
                       ld=np.maximum(p, 1), order="F")
    return {"rhs": rhs, "rows": rows}, order


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r", [1, 5])
@pytest.mark.parametrize("split", [None, 0])
@pytest.mark.parametrize("stacked", [False, True])
def test_frontal_solve_sweeps(device, order, dtype, r, split, stacked):
    """The solve's sweeps against the numpy reference on fronts that split into several items
    (sweep_tree), with one and with five right-hand sides (two passes of four); with the
    small subtrees' fronts in the other items' launches (the default, for so few) and in
    launches of their own (``sweep_split`` 0); ``stacked``: the right-hand sides given as the
    stacked rows ``rhs`` in a shuffled order (``rows``), moved in and out by the solve's graph
    (x holds NaN, which it must not read), the solution read from ``y``."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import solve_reference

    rng = np.random.default_rng(11)
    n, p, parent, fronts, rel = sweep_tree(rng, dtype)
    rhs = [np.zeros((k, r), dtype) for k in n]
    for f in range(len(n)):
        rhs[f][: p[f]] = rng.standard_normal((p[f], r))
    want = solve_reference([f.astype(np.float64) for f in fronts], p, parent, rel, rhs)
    a = pack([f.copy() for f in fronts], order=order)
    rr = pack([x.reshape(-1, 1).astype(dtype) for x in rel], order="F")
    x = pack([v.copy() for v in rhs], order=order)
    more = {}
    w = np.concatenate([want[f][: p[f]] for f in range(len(n))])
    if stacked:
        x = x.with_data(np.full(x.data.shape, np.nan, dtype))
        more, order = stacked_operands(rng, p, np.concatenate([v[: p[f]]
                                                               for f, v in enumerate(rhs)]))
    if device == "cuda":
        import cupy

        a, rr, x = (b.with_data(cupy.asarray(b.data)) for b in (a, rr, x))
        more = {k: b.with_data(cupy.asarray(b.data)) for k, b in more.items()}
    rt = Runtime(device, kernel_options={} if split is None else {"sweep_split": split})
    plan = rt.plan_for("frontal_solve", a=a, rel=rr, parent=parent, npiv=p, x=x,
                       overwrite=True, **more)
    assert len(plan.launches) == (3 if split is None else 5) + 2 * stacked
    res = rt.submit("frontal_solve", a=a, rel=rr, parent=parent, npiv=p, x=x,
                    overwrite=True, **more).result()
    eps = float(np.finfo(dtype).eps)
    if stacked:  # (y's rows in rhs's order: back to the fronts' through rows)
        g = host(res.solution.data).reshape(-1, r)[order].astype(np.float64)
    else:
        got = res.fronts
        g = np.concatenate([host(got.matrix(f))[: p[f]].astype(np.float64)
                            for f in range(len(n))])
    assert np.isfinite(g).all()
    err = np.linalg.norm(g - w) / np.linalg.norm(w)
    assert err <= 10 * n.max() * eps, f"{err:.3g}"


@pytest.mark.parametrize("policy", ["dsse", "ssde"])
@pytest.mark.parametrize("split", [None, 0])
def test_frontal_solve_moves_are_a_launch_each_way(policy, split):
    """Given rhs and rows, the solve's graph adds one launch of moves in, first, and one of
    moves out, last (a task per 64 rows of a front: 54 in, 37 out on sweep_tree), under
    either policy, the small subtrees' fronts in launches of their own or not; the solution
    in y is the reference's."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import solve_reference

    rng = np.random.default_rng(11)
    n, p, parent, fronts, rel = sweep_tree(rng, np.float64)
    a = pack(fronts)
    rr = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    x = pack([np.zeros((k, 3)) for k in n])
    more, _ = stacked_operands(rng, p, np.zeros((int(p.sum()), 3)))
    rt = Runtime("cpu", policy=policy, kernel_options={} if split is None else
                 {"sweep_split": split})
    plan = rt.plan_for("frontal_solve", a=a, rel=rr, parent=parent, npiv=p, x=x,
                       overwrite=True, **more)
    sweeps = ["frontal.sweep_fwd", "frontal.sweep_bwd"] if split is None else [
        "frontal.sweep_fwd_small", "frontal.sweep_fwd", "frontal.sweep_bwd",
        "frontal.sweep_bwd_small"]
    assert [lc.kind for lc in plan.launches] == [
        "frontal.sweep_in", "frontal.sweep_reset", *sweeps, "frontal.sweep_out"]
    assert plan.launches[0].count == (-(-n // 64)).sum() == 54
    assert plan.launches[-1].count == (-(-p // 64)).sum() == 37
    piv = np.concatenate([rng.standard_normal((pf, 3)) for pf in p])
    more, order = stacked_operands(rng, p, piv)
    rhs = [np.zeros((k, 3)) for k in n]
    start = np.cumsum(p) - p
    for f in range(len(n)):
        rhs[f][: p[f]] = piv[start[f]: start[f] + p[f]]
    want = np.concatenate([w[: p[f]] for f, w in enumerate(solve_reference(fronts, p, parent,
                                                                           rel, rhs))])
    got = rt.submit("frontal_solve", a=a, rel=rr, parent=parent, npiv=p, x=x, overwrite=True,
                    **more).result().solution.data.reshape(-1, 3)[order]
    assert np.linalg.norm(got - want) <= 1e3 * np.finfo(float).eps * np.linalg.norm(want)


def test_a_kept_solve_checks_the_rows_of_a_batch_it_was_not_made_with():
    """rows is read by validation (a permutation): a kept call is found for the batch it was
    made with, never for another of an equal layout (Buffer.checked), whose rows are checked
    as on a first call, before any work: a row index out of range would read past the
    stacked rows."""
    from vbatch.core.batch import layout_token, pack
    from vbatch.ops.frontal import index_bits

    rng = np.random.default_rng(3)
    n, p, parent, fronts, rel = sweep_tree(rng, np.float64)
    a = pack(fronts)
    rr = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    rt = Runtime("cpu")
    for _ in range(3):
        more, _ = stacked_operands(rng, p, rng.standard_normal((int(p.sum()), 2)))
        rt.submit("frontal_solve", a=a, rel=rr, parent=parent, npiv=p,
                  x=pack([np.zeros((k, 2)) for k in n]), overwrite=True, **more).result()
    rows = more["rows"]
    for bad in (np.zeros(rows.data.size, np.int64), np.full(rows.data.size, 10**9, np.int64)):
        other = PackedBatch(data=index_bits(bad, np.float64), m=rows.m, n=rows.n,
                            offset=rows.offset, ld=rows.ld, order="F")
        assert layout_token(other) is layout_token(rows)  # (an equal layout)
        with pytest.raises(InputError, match="not a permutation"):
            rt.submit("frontal_solve", a=a, rel=rr, parent=parent, npiv=p,
                      x=pack([np.zeros((k, 2)) for k in n]), overwrite=True,
                      rhs=more["rhs"], rows=other)


def test_frontal_solve_stacked_operands_are_checked():
    """rhs and rows: together or not at all, shaped as the fronts need, rows a permutation of
    the stacked rows; y is the op's own output."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import index_bits

    rng = np.random.default_rng(3)
    n, p, parent, fronts, rel = sweep_tree(rng, np.float64)
    base = dict(a=pack(fronts), rel=pack([x.reshape(-1, 1).astype(np.float64) for x in rel],
                                         order="F"),
                parent=parent, npiv=p, x=pack([np.zeros((k, 2)) for k in n]), overwrite=True)
    more, _ = stacked_operands(rng, p, np.zeros((int(p.sum()), 2)))
    rt = Runtime("cpu")
    with pytest.raises(InputError, match="rhs and rows come together"):
        rt.plan_for("frontal_solve", **base, rhs=more["rhs"])
    with pytest.raises(InputError, match="leave it unset"):
        rt.plan_for("frontal_solve", **base, **more, y=more["rhs"])
    rows = more["rows"]
    twice = rows.with_data(index_bits(np.zeros(rows.data.size, np.int64), np.float64))
    with pytest.raises(InputError, match="not a permutation"):
        rt.plan_for("frontal_solve", **base, rhs=more["rhs"], rows=twice)
    N, k = int(p.sum()), len(p)
    m, c = np.zeros(k, np.int64), np.zeros(k, np.int64)
    m[0], c[0] = N, 1  # (N entries, where two columns need 2 N)
    short = PackedBatch(data=np.zeros(N), m=m, n=c,
                        offset=np.zeros(k, np.int64), ld=np.maximum(m, 1), order="F")
    with pytest.raises(InputError, match="rhs is"):
        rt.plan_for("frontal_solve", **base, rhs=short, rows=rows)
    rowwise = more["rhs"]
    rowwise = PackedBatch(data=rowwise.data, m=rowwise.m, n=rowwise.n, offset=rowwise.offset,
                          ld=np.ones(k, np.int64), order="C")
    with pytest.raises(InputError, match="must be order F"):
        rt.plan_for("frontal_solve", **base, rhs=rowwise, rows=rows)


@pytest.mark.parametrize("device", DEVICES)
def test_frontal_solve_with_no_small_front(device):
    """Every front larger than a warp's (one dense front of order 100, and a two-front tree):
    no group of small fronts to make."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import solve_reference

    rng = np.random.default_rng(5)
    for n, p, parent, rel in (([100], [100], [-1], [np.zeros(0)]),
                              ([90, 80], [20, 80], [1, -1], [np.arange(70), np.zeros(0)])):
        fronts = []
        for k, pk in zip(n, p):
            m = np.tril(rng.standard_normal((k, k))) / np.sqrt(k)
            m[np.arange(pk), np.arange(pk)] = 1.0 + rng.random(pk)
            fronts.append(m)
        rhs = [np.zeros((k, 1)) for k in n]
        for f, pk in enumerate(p):
            rhs[f][:pk] = rng.standard_normal((pk, 1))
        want = solve_reference(fronts, p, parent, rel, rhs)
        a, x = pack([f.copy() for f in fronts]), pack([v.copy() for v in rhs])
        rr = pack([v.reshape(-1, 1).astype(np.float64) for v in rel], order="F")
        if device == "cuda":
            import cupy

            a, rr, x = (b.with_data(cupy.asarray(b.data)) for b in (a, rr, x))
        got = Runtime(device).submit("frontal_solve", a=a, rel=rr, parent=parent, npiv=p, x=x,
                                     overwrite=True).result().fronts
        g = np.concatenate([host(got.matrix(f))[: p[f]] for f in range(len(n))])
        w = np.concatenate([want[f][: p[f]] for f in range(len(n))])
        assert np.linalg.norm(g - w) <= 10 * max(n) * np.finfo(float).eps * np.linalg.norm(w)


def test_frontal_solve_plan_is_five_launches():
    """However deep the trees, the solve is the reset and one launch a sweep, or two (the
    small subtrees' fronts, and the others) with sweep_split at most their count; its items
    keep the sweep order (children's forward items before their parent's, roots first
    backward)."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import sweep_items

    rng = np.random.default_rng(2)
    n, p, parent, fronts, rel = sweep_tree(rng, np.float64)
    a = pack(fronts)
    rr = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    x = pack([np.zeros((k, 2)) for k in n])
    # (9 fronts in small subtrees: their own launches only with sweep_split at most 9)
    rt = Runtime("cpu")
    assert [lc.kind for lc in rt.plan_for("frontal_solve", a=a, rel=rr, parent=parent, npiv=p,
                                          x=x, overwrite=True).launches] == [
        "frontal.sweep_reset", "frontal.sweep_fwd", "frontal.sweep_bwd"]
    for policy in ("dsse", "ssde"):
        rt = Runtime("cpu", policy=policy, kernel_options={"sweep_split": 9})
        plan = rt.plan_for("frontal_solve", a=a, rel=rr, parent=parent, npiv=p, x=x,
                           overwrite=True)
        assert [lc.kind for lc in plan.launches] == [
            "frontal.sweep_reset", "frontal.sweep_fwd_small", "frontal.sweep_fwd",
            "frontal.sweep_bwd", "frontal.sweep_bwd_small"]
    assert not sweep_items(n, p, parent, 10)[-1].any()
    f_f, i0_f, _, f_b, i0_b, _, lone = sweep_items(n, p, parent, 9)
    assert (np.flatnonzero(lone) == [3, 6, 10, 11, 12, 14, 16, 17, 18]).all()
    fs, fw, bw, bs = plan.launches[1:]
    assert fs.hi == fw.lo and bw.hi == bs.lo
    assert (plan.tasks.problem[fs.lo:fw.hi] == f_f).all()
    assert (plan.tasks.args[fs.lo:fw.hi, 3] == i0_f).all()
    assert (plan.tasks.problem[bw.lo:bs.hi] == f_b).all()
    assert (plan.tasks.args[bw.lo:bs.hi, 3] == i0_b).all()
    assert lone[f_f[: fs.count]].all() and not lone[f_f[fs.count:]].any()
    assert not lone[f_b[: bw.count]].any() and lone[f_b[bw.count:]].all()
    # forward, every item of a child before any of its parent's, backward the other way; a
    # front's items together, chunks in order forward (then update items), reversed backward
    for f, par in enumerate(parent):
        mine_f, mine_b = np.flatnonzero(f_f == f), np.flatnonzero(f_b == f)
        assert (np.diff(mine_f) == 1).all() and (np.diff(mine_b) == 1).all()
        # (a small front has a single item)
        assert (np.diff(i0_f[mine_f]) > 0).all() and (np.diff(i0_b[mine_b]) < 0).all()
        if par >= 0:
            assert mine_f.max() < np.flatnonzero(f_f == par).min()
            assert mine_b.min() > np.flatnonzero(f_b == par).max()
    # by level in each launch: every leaf's items first forward, every root's first backward
    for sel in (lone, ~lone):
        ff, fb = f_f[sel[f_f]], f_b[sel[f_b]]
        leaves = np.setdiff1d(np.flatnonzero(sel), parent)
        assert set(ff[: np.isin(ff, leaves).sum()]) == set(leaves)
        roots = np.flatnonzero(sel & (parent < 0))
        assert set(fb[: np.isin(fb, roots).sum()]) == set(roots)
    assert len(f_f) == 39 and len(f_b) == 37  # counted by hand from sweep_tree
    # small fronts (n <= 64): one item each; a small subtree's marked -1, the others in groups
    # of one level led by the first item (-size), the others marked -9; the rest are not
    for f_, i0_ in ((f_f, i0_f), (f_b, i0_b)):
        sm = n[f_] <= 64
        assert (i0_[~sm] >= 0).all() and (i0_[sm] < 0).all()
        assert (i0_[lone[f_]] == -1).all()
        grouped = sm & ~lone[f_]
        heads = np.flatnonzero(grouped & (i0_ != -9))
        assert sum(-i0_[heads]) == grouped.sum()
        for h in heads:
            assert grouped[h: h - i0_[h]].all() and (i0_[h + 1: h - i0_[h]] == -9).all()
        assert (i0_[grouped] == -2).sum() == 2  # (15 and 23 one group, 21 and 22 the other)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["F", "C"])
def test_frontal_op_against_its_reference(device, order):
    """The op alone, in both layouts: a hand-made tree of four fronts (two children sharing
    parent rows, so they may add into one entry in one launch) against the numpy
    reference."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import reference, solve_reference

    rng = np.random.default_rng(4)
    n, p, parent = [40, 3, 37, 45], [2, 1, 3, 45], [3, 3, 3, -1]
    rel = [np.sort(rng.choice(45, 38, replace=False)), np.array([2, 3]),
           np.sort(rng.choice(45, 34, replace=False)), np.zeros(0)]
    fronts = []
    for k in n:
        m = rng.standard_normal((k, k))
        fronts.append(np.tril(m @ m.T + 2 * k * np.eye(k)))
    want = reference(fronts, p, parent, rel)
    a = pack([f.copy() for f in fronts], order=order)
    r = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    if device == "cuda":
        import cupy

        a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
    res = Runtime(device).submit("frontal", a=a, rel=r, parent=parent, npiv=p,
                                 overwrite=True).result()
    assert not res.info.any()
    for f in range(4):
        got = host(res.fronts.matrix(f))
        err = np.abs(got - want[f]).max() / np.abs(want[f]).max()
        assert err <= 100 * np.finfo(np.float64).eps, f"front {f}: {err:.3g}"
    # the solve with those fronts: 3 right-hand sides, pivot rows set, update rows zero
    rhs = [np.zeros((k, 3)) for k in n]
    for f in range(4):
        rhs[f][: p[f]] = rng.standard_normal((p[f], 3))
    want_x = solve_reference(want, p, parent, rel, rhs)
    x = pack([v.copy() for v in rhs], order=order)
    if device == "cuda":
        x = x.with_data(cupy.asarray(x.data))
    got = Runtime(device).submit("frontal_solve", a=res.fronts, rel=r, parent=parent, npiv=p,
                                 x=x, overwrite=True).result().fronts
    for f in range(4):
        g = host(got.matrix(f))[: p[f]]
        err = np.abs(g - want_x[f][: p[f]]).max() / np.abs(want_x[f][: p[f]]).max()
        assert err <= 1000 * np.finfo(np.float64).eps, f"solve, front {f}: {err:.3g}"
    with pytest.raises(InputError, match="parent 0 is not a later front"):
        Runtime("cpu").submit("frontal", a=a, rel=r, parent=[3, 0, 3, -1], npiv=p)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_fronts_factor_in_blocks(device, dtype):
    """Fronts of more than ``block_above`` pivots factor a block column at a time (a GEMM
    updates each later block column in place in the workspace, partial factorizations and
    extend-adds around it), here with blocks of 32 so that small Laplacians have such fronts;
    a matrix that is not positive definite gets its info, the others never notice, and the
    factors equal the unblocked ones to rounding."""
    rt = Runtime(device, nb=16, block=32, block_above=0)
    eps = np.finfo(dtype).eps
    mats = [lap(9, 3), lap(17, 2), lap(6, 3)]
    bad = lap(6, 3).tolil()
    bad[200, 200] = -50.0
    mats.append(sp.csr_matrix(bad))
    F = sparse.cholesky(mats, runtime=rt, dtype=dtype)
    plan = F._prepared[("frontal", None)].plan
    assert plan.counts().get("blas.gemm"), "no front was blocked"
    assert F.info[3] > 0 and not F.info[:3].any(), F.info
    plain = sparse.cholesky(mats[:3], runtime=Runtime(device), dtype=dtype)
    rng = np.random.default_rng(4)
    for i, A in enumerate(mats[:3]):
        check(F, i, A, eps)
        b = rng.standard_normal(A.shape[0])
        x = host(F.solve([b if j == i else np.zeros(M.shape[0]) for j, M in enumerate(mats)])[i])
        assert backward(A, x, b) <= 50 * A.shape[0] * eps, f"matrix {i}"
        L1, _ = F.factor(i)
        L0, _ = plain.factor(i)
        assert abs(L1 - L0).max() <= 1e3 * eps * abs(L0).max(), f"matrix {i}"


def test_solutions_behave_as_a_list():
    """A batch's solve given a list returns ``Solutions``: indexing (negative, numpy
    integers), slicing, iteration, ``len``, ``==`` and ``+`` as a list's; a float or numpy
    bool index is refused as a list refuses it."""
    mats = [lap(s, 2) for s in (3, 4, 5)]
    F = sparse.cholesky(mats, runtime=Runtime("cpu"))
    bs = [np.arange(1.0, A.shape[0] + 1) for A in mats]
    xs = F.solve(bs)
    assert isinstance(xs, sparse.Solutions) and len(xs) == 3
    want = [np.linalg.solve(full(A).toarray(), b) for A, b in zip(mats, bs)]
    for i in range(3):
        assert np.allclose(xs[i], want[i], rtol=1e-12, atol=0)
    assert np.allclose(xs[-1], want[2]) and np.allclose(xs[np.int64(1)], want[1])
    assert [x.shape for x in xs[1:]] == [(16,), (25,)]
    assert [x.shape for x in xs] == [(9,), (16,), (25,)]
    assert len(xs + [0]) == 4 and len([0] + xs) == 4
    one = F.solve([b[:, None] for b in bs])  # n x 1 each: solutions of that shape
    assert [x.shape for x in one] == [(9, 1), (16, 1), (25, 1)]
    for bad in (1.0, np.float32(1.0), np.True_, "a"):
        with pytest.raises(TypeError, match="indices must be integers"):
            xs[bad]
    with pytest.raises(IndexError):
        xs[3]


# Hand-made front trees (postorder) for the tree launches: fronts of 1, 15, 16, 17, 31, 32, 33,
# 47, 64, 65, 96, 97, 128, 129 and 200 rows, about the CUDA kernel's 16-row tiles and the size
# classes' bounds (TREE_CLASSES); (n, p, parent) each.
_TREES = [
    # a class-32 tree
    (16, 4, 2), (17, 5, 2), (32, 32, -1),
    # one front alone; a class-64 chain below a root of 47
    (1, 1, -1), (15, 3, 5), (33, 10, 6), (64, 20, 7), (47, 47, -1),
    # a class-128 chain
    (31, 7, 9), (65, 30, 10), (97, 40, 11), (128, 128, -1),
    # small subtrees under fronts past every class
    (20, 5, 13), (129, 60, 15), (96, 10, 15), (200, 200, -1),
    # a child with no update rows (nothing to add, nothing to wait for)
    (6, 6, 17), (10, 10, -1),
    # a front alone (given a subnormal pivot below)
    (3, 3, -1),
]


def _packed_fronts(fronts, rel, dtype, order, device):
    """Fronts and their update-row positions as the frontal op takes them (packed, on the
    device's memory)."""
    from vbatch.core.batch import pack

    a = pack([f.astype(dtype) for f in fronts], order=order)
    r = pack([x.reshape(-1, 1).astype(dtype) for x in rel], order="F")
    if device == "cuda":
        import cupy

        a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
    return a, r


def _tree_fronts(rng, dtype):
    n = np.array([t[0] for t in _TREES])
    p = np.array([t[1] for t in _TREES])
    parent = np.array([t[2] for t in _TREES])
    rel = [np.sort(rng.choice(n[parent[f]], n[f] - p[f], replace=False)) if parent[f] >= 0
           else np.zeros(0, np.int64) for f in range(len(n))]
    fronts = []
    for k in n:
        m = rng.standard_normal((k, k))
        fronts.append(np.tril(m @ m.T / k + 2 * np.eye(k)).astype(dtype))
    return n, p, parent, rel, fronts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("tree_max", [0, 32, 40, 64, 96, 128])
def test_tree_launches_equal_the_reference(device, dtype, order, tree_max):
    """Small subtrees factor in frontal.tree launches, one per size class present (none with
    tree_max 0), the rest as before: every front equals the numpy reference whatever the
    split, in both layouts; a front that fails gets its info at its own column, and the fronts
    of the other trees (and the failed front's children) are as if it had not. (A failed
    front's parents are unspecified: a tree front adds nothing into its parent, a chain
    front its partial Schur complement.) An infinite pivot is LAPACK's: L = inf, info 0; a
    subnormal one is a pivot like any other (its reciprocal, inf, must not reach the update)."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import TREE_CLASSES, reference, subtree_max

    rng = np.random.default_rng(11)
    n, p, parent, rel, fronts = _tree_fronts(rng, dtype)
    want = reference([f.astype(np.float64) for f in fronts], p, parent, rel)
    eps = np.finfo(dtype).eps

    def run(fr):
        a = pack([f.copy() for f in fr], order=order)
        r = pack([x.reshape(-1, 1).astype(dtype) for x in rel], order="F")
        if device == "cuda":
            import cupy

            a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
        rt = Runtime(device, tree_max=tree_max)
        plan = rt.plan_for("frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True)
        res = rt.submit("frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True).result()
        return plan, res

    plan, res = run(fronts)
    sub = subtree_max(n, parent)
    classes = {int(np.searchsorted(TREE_CLASSES, s)) for s in sub[sub <= tree_max]}
    assert plan.counts().get("frontal.tree", 0) == len(classes)
    assert not res.info.any(), res.info
    for f in range(len(n)):
        got = host(res.fronts.matrix(f)).astype(np.float64)
        err = np.abs(np.tril(got) - want[f]).max() / np.abs(want[f]).max()
        assert err <= 30 * n[f] * eps, f"front {f} (n {n[f]}): {err:.3g}"
    # front 5 (33 rows, 10 pivots) fails at its column 5
    bad = [f.copy() for f in fronts]
    bad[5][4, 4] = -1000.0
    bad[3][0, 0] = np.inf  # front 3: one row, alone
    # (float64 only: in float32 the GPU's 1 / sqrt flushes a subnormal to zero, on every path)
    tiny = np.finfo(np.float64).tiny / 8
    if dtype == np.float64:
        bad[18] = np.diag([tiny, 1.0, 1.0])
    _, res = run(bad)
    assert res.info[5] == 5 and not np.delete(res.info, [5, 6, 7]).any(), res.info
    assert host(res.fronts.matrix(3))[0, 0] == np.inf
    if dtype == np.float64:
        got = host(res.fronts.matrix(18))
        assert np.isclose(got[0, 0], np.sqrt(tiny), rtol=1e-12), got
        assert np.array_equal(np.tril(got)[1:], np.diag([0.0, 1.0, 1.0])[1:]), got
    for f in [0, 1, 2, 4] + list(range(8, len(n) - 1)):
        got = host(res.fronts.matrix(f)).astype(np.float64)
        err = np.abs(np.tril(got) - want[f]).max() / np.abs(want[f]).max()
        assert err <= 30 * n[f] * eps, f"front {f} (n {n[f]}): {err:.3g}"


@pytest.mark.parametrize("policy", ["dsse", "ssde"])
def test_tree_plan_pins_each_class_to_one_launch(policy):
    """Under either policy a class's tree tasks share one level (one launch), each class's
    launch comes after those of the classes below it, the reset first; the chain fronts'
    tasks after the tree roots under them."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import TREE_CLASSES

    rng = np.random.default_rng(2)
    n, p, parent, rel, fronts = _tree_fronts(rng, np.float64)
    a = pack(fronts)
    r = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    plan = Runtime("cpu", tree_max=128, policy=policy).plan_for(
        "frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True)
    tree = [lc for lc in plan.launches if lc.kind == "frontal.tree"]
    assert len(tree) == len(TREE_CLASSES)  # the trees reach every class
    lv = plan.tasks.level
    levels = [int(lv[lc.lo]) for lc in tree]
    assert all((lv[lc.lo:lc.hi] == lv[lc.lo]).all() for lc in tree)
    reset = next(lc for lc in plan.launches if lc.kind == "frontal.sweep_reset")
    assert int(lv[reset.lo]) < min(levels)
    rows = [int(plan.tasks.rows[lc.lo:lc.hi].max()) for lc in tree]
    by_class = [lvl for _, lvl in sorted(zip(rows, levels))]
    assert all(a < b for a, b in zip(by_class, by_class[1:])), (rows, levels)
    # the chain fronts (13: 129 rows, 15: 200) start after the tree tasks under them
    first = {int(q): int(lv[t]) for t, q in reversed(list(enumerate(plan.tasks.problem)))}
    assert first[13] > levels[rows.index(32)] and first[15] > levels[rows.index(96)]


@pytest.mark.parametrize("device", DEVICES)
def test_tree_launches_as_one_without_the_split(device):
    """With the plan option tree_split off, every small subtree is one launch (the largest
    class's kernel), with the same fronts as the reference."""
    from vbatch.core.batch import pack
    from vbatch.ops.frontal import reference

    rng = np.random.default_rng(5)
    n, p, parent, rel, fronts = _tree_fronts(rng, np.float64)
    want = reference(fronts, p, parent, rel)
    a = pack([f.copy() for f in fronts])
    r = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    if device == "cuda":
        import cupy

        a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
    rt = Runtime(device, tree_max=96, kernel_options={"tree_split": False})
    plan = rt.plan_for("frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True)
    assert plan.counts()["frontal.tree"] == 1
    res = rt.submit("frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True).result()
    assert not res.info.any()
    for f in range(len(n)):
        got = np.tril(host(res.fronts.matrix(f)))
        err = np.abs(got - want[f]).max() / np.abs(want[f]).max()
        assert err <= 30 * n[f] * np.finfo(np.float64).eps, f"front {f}: {err:.3g}"


_OTHER_SHAPES = [
    # frontal_tree: one warp for the 32-row class, 16 x 8 threads for 64 and 96 rows
    {32: (8, 4, 4, 8, 20), 64: (16, 8, 4, 8, 5), 96: (16, 8, 6, 12, 3), 128: (16, 16, 8, 8, 1)},
    # frontal_tree_smem with one warp for 32 rows and two for 64 (a column a panel)
    {32: ("smem", 32, 16), 64: ("smem", 64, 6), 96: (16, 16, 6, 6, 2), 128: (16, 16, 8, 8, 1)},
    # frontal_tree_smem for every class (96 and 128 rows: 74 and 132 KB of shared memory)
    {32: ("smem", 64, 16, 4), 64: ("smem", 128, 6, 4), 96: ("smem", 128, 3, 4),
     128: ("smem", 128, 1, 4)},
    # frontal_tree (square grids) for 32 and 64 rows
    {32: (8, 8, 4, 4, 16), 64: (16, 16, 4, 4, 4), 96: (16, 16, 6, 6, 2), 128: (16, 16, 8, 8, 1)},
]


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("shapes", range(len(_OTHER_SHAPES)))
def test_tree_shapes_equal_the_reference(order, shapes):
    """The tree kernels' other shapes (the plan option tree_shapes) give the reference's
    fronts, in both layouts, with a failing front as in
    test_tree_launches_equal_the_reference."""
    import cupy

    from vbatch.core.batch import pack
    from vbatch.ops.frontal import reference

    rng = np.random.default_rng(8)
    n, p, parent, rel, fronts = _tree_fronts(rng, np.float64)
    want = reference(fronts, p, parent, rel)
    fronts[5][4, 4] = -1000.0
    shapes = _OTHER_SHAPES[shapes]
    rt = Runtime("cuda", tree_max=128,
                 kernel_options={"tree_shapes": tuple(sorted(shapes.items()))})
    a = pack([f.copy() for f in fronts], order=order)
    r = pack([x.reshape(-1, 1).astype(np.float64) for x in rel], order="F")
    a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
    plan = rt.plan_for("frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True)
    assert plan.opts["tree_shapes"] == tuple(sorted(shapes.items()))
    res = rt.submit("frontal", a=a, rel=r, parent=parent, npiv=p, overwrite=True).result()
    assert res.info[5] == 5 and not np.delete(res.info, [5, 6, 7]).any(), res.info
    for f in [0, 1, 2, 3, 4] + list(range(8, len(n))):
        got = np.tril(host(res.fronts.matrix(f)))
        err = np.abs(got - want[f]).max() / np.abs(want[f]).max()
        assert err <= 30 * n[f] * np.finfo(np.float64).eps, f"front {f}: {err:.3g}"


# The panel widths of frontal_tree_smem's pivot columns (the fourth entry of an "smem" shape;
# 1: a column at a time) and its warps (one: the look-ahead warp also updates the rest), for
# the test below.
_PANEL_SHAPES = [
    {32: ("smem", 64, 16, 1), 64: ("smem", 128, 6, 1), 96: ("smem", 192, 2, 1)},
    {32: ("smem", 64, 16, 4), 64: ("smem", 128, 6, 8), 96: ("smem", 192, 2, 4)},
    {32: ("smem", 64, 16, 8), 64: ("smem", 128, 6, 4), 96: ("smem", 128, 3, 2)},
    {32: ("smem", 32, 16, 4), 64: ("smem", 64, 6, 2), 96: ("smem", 96, 2, 8)},
]


@pytest.mark.parametrize("device,shapes", [("cpu", None)] + [
    pytest.param("cuda", s, marks=pytest.mark.gpu) for s in range(len(_PANEL_SHAPES))])
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tree_fronts_failing_at_every_panel_bound(device, shapes, order, dtype):
    """Fronts of the three shared-memory classes failing at columns about the panels' bounds (0,
    1, 3-5, 7-9, 16, 17, the last pivot) and one that does not, under a root of their class, in
    one batch, in both dtypes: each failed front gets info at its column, its columns before it
    are the reference's L, and the rest of its lower triangle (the failed column, the later
    pivots, S) is A updated by those columns only, as a column-at-a-time factorization leaves
    it; the good front equals the reference."""
    from vbatch.ops.frontal import reference

    rng = np.random.default_rng(21)
    cols = [0, 1, 3, 4, 5, 7, 8, 9, 16, 17, None]
    fronts, npiv, fail, parent, rel = [], [], [], [], []
    # per class: its children (n rows, p pivots), then their root (a front of the class's size)
    for n, p, root in [(30, 20, 32), (60, 40, 64), (90, 60, 96)]:
        for c in cols + [p - 1]:
            m = rng.standard_normal((n, n))
            fronts.append(np.tril(m @ m.T / n + 2 * np.eye(n)))
            npiv.append(p)
            fail.append(c)
            rel.append(np.sort(rng.choice(root, n - p, replace=False)))
        parent += [len(fronts)] * (len(cols) + 1)
        fronts.append(np.tril(np.eye(root) * 4 * root))
        npiv.append(root)
        fail.append(None)
        rel.append(np.zeros(0, np.int64))
        parent.append(-1)
    parent = np.array(parent)
    good = reference(fronts, npiv, parent, rel)
    bad = [f.copy() for f in fronts]
    for f, c in enumerate(fail):
        if c is not None:
            bad[f][c, c] = -1000.0
    a, r = _packed_fronts(bad, rel, dtype, order, device)
    shaped = {} if shapes is None else {  # (the CPU has no shapes)
        "tree_shapes": tuple(sorted({128: (16, 16, 8, 8, 1), **_PANEL_SHAPES[shapes]}.items()))}
    rt = Runtime(device, tree_max=96, kernel_options=shaped)
    plan = rt.plan_for("frontal", a=a, rel=r, parent=parent, npiv=np.array(npiv),
                       overwrite=True)
    assert plan.counts()["frontal.tree"] == 3
    res = rt.submit("frontal", a=a, rel=r, parent=parent, npiv=np.array(npiv),
                    overwrite=True).result()
    eps = np.finfo(dtype).eps
    for f, c in enumerate(fail):
        n = fronts[f].shape[0]
        got = np.tril(host(res.fronts.matrix(f))).astype(np.float64)
        if parent[f] < 0:  # a root: what its children added depends on which failed
            assert res.info[f] == 0
            continue
        if c is None:
            assert res.info[f] == 0
            want = good[f]
        else:
            assert res.info[f] == c + 1, (f, res.info[f], c)
            L = good[f][:, :c]
            A = fronts[f] + np.tril(fronts[f], -1).T
            A[c, c] = -1000.0
            want = np.tril(A - L @ L.T)
            want[:, :c] = L
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= 30 * n * eps, f"front {f} (n {n}, fails at {c}): {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tree_max", [0, 128])
def test_a_failed_front_leaves_lapacks_leading_block(device, order, dtype, tree_max):
    """A front whose partial factorization fails at pivot j leaves LAPACK's leading j x j
    block (_check.check_failed: the columns before j factored, the pivot as tested), whether
    it runs as a chain front (tree_max 0: the panels, block updates and the trsm of the dense
    Cholesky, from 256 columns blocked) or in a tree launch; failures in the first column,
    either side of a 32-column panel's boundary, mid-front and at the last pivot, on fronts
    either side of the tree classes and the blocking; the fronts that do not fail as the
    reference."""
    from _check import check_failed

    from vbatch.ops.frontal import reference

    rng = np.random.default_rng(23)
    fronts, npiv, fail, parent, rel = [], [], [], [], []
    for n, p in [(20, 12), (33, 30), (64, 40), (100, 97), (129, 64), (300, 280)]:
        for c in sorted({0, 31, 32, p // 2, p - 1} - {q for q in (31, 32) if q >= p}) + [None]:
            m = rng.standard_normal((n, n))
            fronts.append(np.tril(m @ m.T / n + 2 * np.eye(n)))
            npiv.append(p)
            fail.append(c)
            rel.append(np.sort(rng.choice(300, n - p, replace=False)))
            parent.append(-2)  # the root, below
    parent = np.where(np.array(parent) == -2, len(fronts), -1)
    fronts.append(np.tril(np.eye(300) * 1200.0))
    npiv.append(300)
    fail.append(None)
    rel.append(np.zeros(0, np.int64))
    parent = np.r_[parent, -1]
    good = reference(fronts, npiv, parent, rel)  # (the root's: as if none failed)
    for f, c in enumerate(fail):
        if c is not None:
            fronts[f][c, c] = -1000.0
    a, r = _packed_fronts(fronts, rel, dtype, order, device)
    res = Runtime(device, tree_max=tree_max).submit(
        "frontal", a=a, rel=r, parent=parent, npiv=np.array(npiv), overwrite=True).result()
    eps = np.finfo(dtype).eps
    for f, c in enumerate(fail[:-1]):
        got = host(res.fronts.matrix(f))
        where = f"front {f} (n {fronts[f].shape[0]}, npiv {npiv[f]}, fails at {c})"
        if c is None:
            assert res.info[f] == 0, where
            err = np.abs(np.tril(got) - good[f]).max() / np.abs(good[f]).max()
            assert err <= 30 * fronts[f].shape[0] * eps, f"{where}: {err:.3g}"
        else:
            check_failed(fronts[f], got, int(res.info[f]), dtype, npiv[f], where=where)
