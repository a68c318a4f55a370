"""Conformance: every backend factors batches right, isolates failures, does partial Cholesky.

Each test runs on the CPU and, where a GPU is usable, on CUDA (``DEVICES`` in conftest.py).
Tolerance: ||A - L L^T||_F / ||A||_F <= 2 n eps of the dtype (_check.tolerance); NaN fails.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _check import check_factor, check_failed, edge_sizes, to_host, tolerance
from conftest import DEVICES
from vbatch import PackedBatch, Runtime, reference
from vbatch.ops.generate import make_indefinite, spd, spd_list

_runtimes: dict = {}


def runtime(device: str, **opts) -> Runtime:
    """One runtime per configuration for the whole session (each owns a worker thread)."""
    key = (device, tuple(sorted(opts.items())))
    if key not in _runtimes:
        _runtimes[key] = Runtime(device, **opts)
    return _runtimes[key]


def as_device(mats, device):
    if device == "cuda":
        import cupy

        return [cupy.asarray(m) for m in mats]
    return mats


def packed_from(mats, order, device):
    """A packed batch with gaps (ld > n, holes between matrices), to exercise ld and offsets."""
    n = np.array([m.shape[0] for m in mats], dtype=np.int64)
    ld = n + (np.arange(len(n)) % 3)  # some ld = n, some larger
    ld = np.maximum(ld, 1)
    off = np.r_[0, np.cumsum(ld * n + 5)[:-1]].astype(np.int64)
    dtype = mats[0].dtype
    data = np.full(int(off[-1] + ld[-1] * n[-1] + 5), np.nan, dtype=dtype)
    b = PackedBatch.from_buffer(data, n, off, ld, order=order)
    for i, m in enumerate(mats):
        if n[i]:
            b.matrix(i)[...] = m
    if device == "cuda":
        import cupy

        b = PackedBatch.from_buffer(cupy.asarray(data), n, off, ld, order=order)
    return b


NBS = {"cpu": [4, 8, 16, 32], "cuda": [8, 16, 32]}  # the CUDA kernels support nb <= 32, not 4


@st.composite
def cases(draw, device):
    nb = draw(st.sampled_from(NBS[device]))
    extra = draw(st.lists(st.integers(0, 3 * nb + 3), max_size=8))
    ns = edge_sizes(nb) + extra
    ns = [ns[i] for i in draw(st.permutations(range(len(ns))))]
    return dict(
        ns=ns,
        nb=nb,
        dtype=draw(st.sampled_from([np.float32, np.float64])),
        policy=draw(st.sampled_from(["dsse", "ssde"])),
        fused_max_rows=draw(st.sampled_from([0, 2 * nb, 10**6])),
        form=draw(st.sampled_from(["list", "F", "C"])),
        seed=draw(st.integers(0, 2**31)),
        partial=draw(st.booleans()),
        block=draw(st.sampled_from([0, 2 * nb, 3 * nb])),
    )


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_factors_match_numpy(device, data):
    c = data.draw(cases(device))
    rng = np.random.default_rng(c["seed"])
    mats = spd_list(c["ns"], c["dtype"], rng)
    npiv = [int(rng.integers(0, n + 1)) for n in c["ns"]] if c["partial"] else None
    rt = runtime(device, nb=c["nb"], policy=c["policy"], fused_max_rows=c["fused_max_rows"],
                 block=c["block"], block_above=0)
    if c["form"] == "list":
        res = rt.cholesky(as_device(mats, device), npiv).result()
        factors = res.factors
        assert len(factors) == len(mats)
    else:
        b = packed_from(mats, c["form"], device)
        res = rt.cholesky(b, npiv).result()
        assert isinstance(res.factors, PackedBatch) and res.factors.order == c["form"]
        factors = res.factors.unpack()
    assert res.info.dtype == np.int32 and not res.info.any(), res.info
    for i, (a, f) in enumerate(zip(mats, factors)):
        assert type(f).__module__.split(".")[0] == ("cupy" if device == "cuda" else "numpy")
        check_factor(a, f, c["dtype"], None if npiv is None else npiv[i], where=f"problem {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused_max_rows", [0, 10**6], ids=["separated", "fused"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ill_conditioned_matrices(device, fused_max_rows, dtype):
    """Cholesky is backward stable whatever the conditioning: cond up to 1/(100 eps)."""
    rng = np.random.default_rng(3)
    cond = 1e-2 / np.finfo(dtype).eps
    ns = edge_sizes(16) + [40, 47, 3]
    mats = [spd(n, dtype, rng, cond=cond) for n in ns]
    rt = runtime(device, nb=16, fused_max_rows=fused_max_rows)
    res = rt.cholesky(as_device(mats, device)).result()
    assert not res.info.any()
    for i, (a, f) in enumerate(zip(mats, res.factors)):
        check_factor(a, f, dtype, where=f"problem {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused_max_rows", [0, 10**6], ids=["separated", "fused"])
@pytest.mark.parametrize("policy", ["dsse", "ssde"])
def test_a_failed_matrix_gets_its_info_and_disturbs_no_other(device, fused_max_rows, policy):
    nb = 8
    rng = np.random.default_rng(11)
    ns = [0, 1, 7, 8, 9, 20, 17, 25, 16, 12, 30, 5]
    good = spd_list(ns, np.float64, rng)
    # Failing pivots at the first column, the last column of a panel, the first of the next,
    # the middle, the last column of the matrix; plus a NaN and an inf in the lower triangle.
    plant = {1: 0, 3: 7, 4: 8, 5: 13, 7: 24, 10: 29}
    bad = [m.copy() for m in good]
    for i, col in plant.items():
        bad[i] = make_indefinite(good[i], col)
    bad[6][9, 4] = np.nan
    bad[9][11, 2] = np.inf
    rt = runtime(device, nb=nb, policy=policy, fused_max_rows=fused_max_rows)
    res_bad = rt.cholesky(as_device(bad, device)).result()
    res_good = rt.cholesky(as_device(good, device)).result()

    expected = np.array([reference(m)[1] for m in bad], dtype=np.int32)
    # NaN at (9, 4) makes pivot 9 NaN; inf at (11, 2) makes pivot 11 -inf or NaN.
    assert expected[6] == 10 and expected[9] == 12
    assert res_bad.info.tolist() == expected.tolist()
    for i, col in plant.items():
        assert res_bad.info[i] == col + 1
    assert not res_good.info.any()
    for i in np.flatnonzero(expected == 0):
        a, b = to_host(res_bad.factors[i]), to_host(res_good.factors[i])
        assert np.array_equal(a, b), f"problem {i} changed because another matrix failed"
    assert set(res_bad.failed().tolist()) == set(plant) | {6, 9}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["dsse", "ssde"])
def test_partial_cholesky_matches_a_dense_schur_complement(device, policy):
    """A multifrontal front: factor p of n columns, leave A22 - L21 L21^T in the trailing block."""
    rng = np.random.default_rng(5)
    nb = 16
    ns = edge_sizes(nb) + [40, 64, 33, 100, 50, 2]
    npiv = [0, 0, 7, 16, 9, 40, 20, 32, 1, 50, 0]
    mats = spd_list(ns, np.float64, rng)
    res = runtime(device, nb=nb, policy=policy, fused_max_rows=32).cholesky(
        as_device(mats, device), npiv
    ).result()
    assert not res.info.any()
    kinds = res.plan.counts()
    assert kinds.get("schur") and kinds.get("fused") and kinds.get("update") and kinds.get("trsm")
    for i, (a, f) in enumerate(zip(mats, res.factors)):
        check_factor(a, f, np.float64, npiv[i], where=f"problem {i} (npiv {npiv[i]})")


BLOCK_NB, BLOCK = 16, 48  # three panels a block column


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused_max_rows", [0, 10**6], ids=["separated", "fused"])
@pytest.mark.parametrize("form", ["F", "C", "list", "overwrite"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocked_factorization(device, fused_max_rows, form, dtype):
    """Blocked (``block``): sizes on both sides of one, two and three block columns, partial
    factorizations ending inside and on the edge of a block column, pivots that fail in the
    first, second and third block column (the columns before them still the factor, the other
    problems untouched), and NaN above the diagonal of every input (never read into a result)."""
    rng = np.random.default_rng(21)
    B = BLOCK
    ns = edge_sizes(BLOCK_NB) + [B - 1, B, B + 1, 2 * B - 1, 2 * B, 2 * B + 1, 3 * B + 5, 150,
                                 150, 150, 120, 120, 130]
    npiv = [None] * (len(ns) - 3) + [B, B + 1, 2 * B + 3]
    fail = {len(ns) - 6: 10, len(ns) - 5: B + 7, len(ns) - 4: 2 * B}  # column that fails
    mats = spd_list(ns, dtype, rng)
    for i, col in fail.items():
        mats[i] = make_indefinite(mats[i].astype(np.float64), col).astype(dtype)
    junk = [m + np.triu(np.full_like(m, np.nan), 1) for m in mats]
    p = [n if v is None else v for n, v in zip(ns, npiv)]
    rt = runtime(device, nb=BLOCK_NB, fused_max_rows=fused_max_rows, block=B, block_above=0)
    if form == "list":
        res = rt.cholesky(as_device(junk, device), p).result()
        factors = list(res.factors)
    else:
        b = packed_from(junk, "C" if form == "C" else "F", device)
        res = rt.cholesky(b, p, overwrite=form == "overwrite").result()
        factors = res.factors.unpack()
    assert res.plan.counts().get("blas.gemm"), "no block update was planned"
    want = [reference(a, v)[1] for a, v in zip(mats, p)]
    assert res.info.tolist() == want and [want[i] for i in fail] == [c + 1 for c in fail.values()]
    for i, (a, f) in enumerate(zip(mats, factors)):
        if i in fail:
            check_failed(a, f, fail[i] + 1, dtype, p[i], where=f"problem {i}")
        else:
            check_factor(a, f, dtype, p[i], where=f"problem {i} (n {ns[i]}, npiv {p[i]})")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_batch_with_few_large_problems_blocks_them(device, dtype):
    """block_few: with at most that many problems past ``block`` columns, they are blocked
    whatever ``block_above`` says; with more, block_above decides. Both factor correctly."""
    rng = np.random.default_rng(22)
    ns = edge_sizes(BLOCK_NB) + [BLOCK + 1, 2 * BLOCK + 5, 3 * BLOCK] + [5, 9, 14] * 6
    mats = spd_list(ns, dtype, rng)
    for few, blocked in ((3, True), (2, False)):
        rt = runtime(device, nb=BLOCK_NB, block=BLOCK, block_above=10**6, block_few=few,
                     block_few_above=0)
        res = rt.cholesky(as_device(mats, device)).result()
        assert bool(res.plan.counts().get("blas.gemm")) == blocked, few
        assert res.info.tolist() == [0] * len(ns)
        for i, (a, f) in enumerate(zip(mats, res.factors)):
            check_factor(a, f, dtype, where=f"block_few {few}, problem {i} (n {ns[i]})")


@pytest.mark.parametrize("device", DEVICES)
def test_npiv_as_one_int_applies_to_all(device):
    rng = np.random.default_rng(2)
    mats = spd_list([10, 5, 25, 7], np.float64, rng)
    res = runtime(device, nb=8).cholesky(as_device(mats, device), 5).result()
    for a, f in zip(mats, res.factors):
        check_factor(a, f, np.float64, 5)


# Sizes either side of every tile and crossover of both backends' kernels: CUDA's panel width
# and small_step's rows (32), its update tiles (64, 128), float64's block (96) and float32's
# (64), the trsm tile (128), float64's block_few_above (224), the fused kernel's tallest panel
# and float64's block_above (256), float32's block_few_above (384) and block_above (512); the
# CPU's compiled loop (n^3 / 3 up to SMALL_FLOPS in place, SMALL_FLOPS_COPY out of place: 116
# and 73) and its panel (512); and rocSOLVER's singular cases' 10 and 640.
FAIL_SIZES = [1, 2, 10, 31, 32, 33, 63, 64, 65, 73, 74, 95, 96, 97, 116, 117, 127, 128, 129,
              224, 225, 255, 256, 257, 384, 385, 511, 512, 513, 640]


def fail_columns(n: int) -> list[int]:
    """Where a pivot fails: the first column, mid-panel, either side of a 32-column panel's and
    a 96-column block's boundary, the middle, the last column."""
    return sorted(c for c in {0, 13, 31, 32, 95, 96, n // 2, n - 1} if c < n)


FAIL_CASES = {  # form, runtime options, partial
    "packed": ("F", {}, False),
    "packed-C": ("C", {}, False),
    "overwrite": ("overwrite", {}, False),
    "list": ("list", {}, False),
    "panels": ("F", {"nb": 32}, False),
    "separated": ("F", {"nb": 32, "fused_max_rows": 0}, False),
    "separated-C": ("C", {"nb": 32, "fused_max_rows": 0}, False),
    "blocked": ("F", {"nb": 32, "block": 64, "block_above": 0}, False),
    "blocked-C": ("C", {"nb": 32, "block": 64, "block_above": 0}, False),
    "partial": ("F", {}, True),
    "partial-overwrite": ("overwrite", {"nb": 32}, True),
}


@functools.cache
def _failing_batch(dtype) -> tuple[list, list, list]:
    """The matrices, their failing columns (None: SPD) and their references (the leading
    block is the same for every npiv past the failing column)."""
    rng = np.random.default_rng(12)
    mats, cols = [], []
    for n in FAIL_SIZES:
        for col in fail_columns(n):
            mats.append(make_indefinite(spd(n, np.float64, rng), col).astype(dtype))
            cols.append(col)
    for n in (0, 1, 33, 300):  # ones that do not fail
        mats.append(spd(n, dtype, rng))
        cols.append(None)
    refs = [None if c is None else reference(a) for a, c in zip(mats, cols)]
    return mats, cols, refs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(FAIL_CASES))
def test_a_failed_factor_leaves_lapacks_leading_block(device, dtype, case):
    """For info = j, the leading j x j block is LAPACK's: the first j - 1 columns (every row)
    the partial factorization of that many columns, L(j, j) the pivot LAPACK tested there (a_jj
    less the squares of row j of L before it), zeros above the diagonal (_check.check_failed).
    Failures in the first column, mid-panel, at panel and block boundaries and in the last
    column, on sizes around every tile and crossover, in one batch with matrices that do not
    fail (their factors exact); every kernel path: one panel, several, fused, separated,
    blocked, the small kernels, a partial factorization; out of place, in place, a list."""
    form, opts, partial = FAIL_CASES[case]
    mats, cols, refs = _failing_batch(dtype)
    rng = np.random.default_rng(13)
    ns = [m.shape[0] for m in mats]
    # partial: between the failing column and n, or (every fifth) before it: then no failure
    npiv = ([n if c is None else (int(rng.integers(c + 1, n + 1)) if i % 5 else c)
             for i, (n, c) in enumerate(zip(ns, cols))] if partial else None)
    rt = runtime(device, **opts)
    if form == "list":
        res = rt.cholesky(as_device(mats, device), npiv).result()
        factors = list(res.factors)
    else:
        b = packed_from(mats, "C" if form == "C" else "F", device)
        res = rt.cholesky(b, npiv, overwrite=form == "overwrite").result()
        assert (res.factors is b) == (form == "overwrite")
        factors = res.factors.unpack()
    if "block" in opts:
        assert res.plan.counts().get("blas.gemm"), "no block update was planned"
    p = ns if npiv is None else npiv
    want = [0 if c is None or c >= q else c + 1 for c, q in zip(cols, p)]
    assert res.info.tolist() == want
    for i, (a, f) in enumerate(zip(mats, factors)):
        where = f"problem {i} (n {ns[i]}, npiv {p[i]})"
        if want[i]:
            check_failed(a, f, want[i], dtype, p[i], where=where, ref=refs[i])
        else:
            check_factor(a, f, dtype, p[i], where=where)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.complex64])
@pytest.mark.parametrize("nmax", [8, 16, 24, 32])
def test_batches_of_small_problems_at_every_register_width(device, order, dtype, nmax):
    """A batch whose problems are all at most 8, 16, 24 or 32 rows, panels 32 wide (complex
    types too, whose default is 16): on CUDA one small_step launch whose register code is the
    narrowest that holds them, or the type's widths from SMALL_NBMIN up
    (potrf_cuda.small_widths). Every size up to nmax, one failing in its first and one in its
    last column, and one failing mid-way, with the failed factors' leading blocks LAPACK's."""
    rng = np.random.default_rng(nmax)
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    mats = [spd(n, wide, rng) for n in range(nmax + 1)]
    fails = [(nmax, 0), (nmax, nmax - 1), (max(nmax - 3, 1), nmax // 3)]
    mats += [make_indefinite(spd(n, wide, rng), c) for n, c in fails]
    mats = [m.astype(dtype) for m in mats]
    res = runtime(device, nb=32).cholesky(packed_from(mats, order, device)).result()
    if device == "cuda":
        from vbatch.kernels import potrf_cuda
        from vbatch.kernels.cuda_build import ctype

        T, lo = ctype(dtype), potrf_cuda.SMALL_NBMIN[ctype(dtype)]
        ran = {potrf_cuda.small_widths(T, lc.width) for lc in res.plan.launches}
        assert ((nmax, nmax) if nmax <= lo else (lo, 32)) in ran, ran
    want = [0] * (nmax + 1) + [c + 1 for _, c in fails]
    assert res.info.tolist() == want
    for i, (a, f) in enumerate(zip(mats, res.factors.unpack())):
        if want[i]:
            check_failed(a, f, want[i], dtype, where=f"problem {i}")
        else:
            check_factor(a, f, dtype, where=f"problem {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [0, 128], ids=["unblocked", "blocked"])
def test_failures_in_a_batch_larger_than_the_gpu_holds_at_once(device, block):
    """Separated panels of many problems: on the GPU a launch's blocks then start over time,
    and the blocks of a failing panel that start after its diagonal block has set ``info``
    must still bring their rows up to date (the columns before the failing one are the
    partial factor). 240 problems of 640 are ~2,400 blocks an update launch on CUDA, more than
    an H100 holds at once; the CPU takes a few."""
    rng = np.random.default_rng(31)
    count = 240 if device == "cuda" else 6
    base = spd(640, np.float64, rng)
    fail_at = [None, 37, 300, 639, None, 129]
    mats = [base if c is None else make_indefinite(base, c) for c in fail_at]
    mats = [mats[i % len(mats)] for i in range(count)]
    rt = runtime(device, nb=32, fused_max_rows=0, block=block, block_above=0)
    res = rt.cholesky(packed_from(mats, "F", device)).result()
    factors = res.factors.unpack()
    want = [0 if fail_at[i % 6] is None else fail_at[i % 6] + 1 for i in range(count)]
    assert res.info.tolist() == want
    for i in range(0, count, 7 if device == "cuda" else 1):
        if want[i]:
            check_failed(mats[i], factors[i], want[i], np.float64, where=f"problem {i}")
        else:
            check_factor(mats[i], factors[i], np.float64, where=f"problem {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fused_max_rows", [None, 0], ids=["default", "separated"])
def test_an_infinite_pivot_is_taken_as_lapack_takes_it(device, dtype, fused_max_rows):
    """+inf on the diagonal is a pivot > 0: reference LAPACK factors on with L(i, i) = inf and
    zeros below it (x / inf), info 0. Both backends do the same; -inf fails at its column."""
    rng = np.random.default_rng(13)
    cases = [(5, 2), (40, 17), (33, 32), (200, 0), (300, 150), (300, 299)]
    mats = []
    for n, i in cases:
        a = spd(n, np.float64, rng)
        a[i, i] = np.inf
        mats.append(a.astype(dtype))
    neg = spd(50, np.float64, rng)
    neg[20, 20] = -np.inf
    mats.append(neg.astype(dtype))
    opts = {} if fused_max_rows is None else {"fused_max_rows": fused_max_rows}
    res = runtime(device, **opts).cholesky(as_device(mats, device)).result()
    assert res.info.tolist() == [0] * len(cases) + [21]
    for (n, i), f in zip(cases, res.factors):
        f = to_host(f)
        assert not np.any(np.isnan(f)), f"n={n}, inf at {i}: NaN in the factor"
        assert f[i, i] == np.inf and not np.any(f[i + 1:, i]), f"n={n}: column {i}"
    refs = [reference(a) for a in mats]
    assert res.info.tolist() == [r[1] for r in refs]
    for (n, i), f, (ref, _) in zip(cases, res.factors, refs):
        f = to_host(f).astype(np.float64)
        assert np.array_equal(np.isinf(f), np.isinf(ref)), f"n={n}: infinities differ"
        fin = np.isfinite(ref)
        err = np.linalg.norm(f[fin] - ref[fin]) / max(np.linalg.norm(ref[fin]), 1.0)
        assert err <= 10 * tolerance(n, dtype), f"n={n}, inf at {i}: error {err:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_upper_triangle_of_the_input_is_never_read(device):
    rng = np.random.default_rng(4)
    mats = spd_list([1, 9, 16, 17, 33], np.float64, rng)
    junk = [m + np.triu(np.full_like(m, np.nan), 1) for m in mats]
    for fmr in (0, 10**6):
        res = runtime(device, nb=8, fused_max_rows=fmr).cholesky(as_device(junk, device)).result()
        assert not res.info.any()
        for a, f in zip(mats, res.factors):
            check_factor(a, f, np.float64)


@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("overwrite", [False, True])
def test_cpu_small_problems_compiled_equal_lapack(monkeypatch, order, dtype, overwrite):
    """The CPU backend factors whole problems of at most SMALL_FLOPS as one compiled loop
    (numba): full and partial factorizations, failures (the columns before the failing one;
    the rest is unspecified), an infinite pivot, junk above the diagonal, in and out of place,
    give what the LAPACK calls give (SMALL_FLOPS = -1), and the loop did run."""
    import vbatch.kernels.potrf_cpu as pc

    if not pc.jit.AVAILABLE:
        pytest.skip("numba is not installed: the CPU backend keeps to its LAPACK calls")
    rng = np.random.default_rng(21)
    sizes = [0, 1, 2, 7, 16, 31, 32, 33, 45]
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    mats = [spd(n, wide, rng) for n in sizes]
    mats += [make_indefinite(spd(n, wide, rng), c) for n, c in [(9, 0), (20, 7), (33, 32)]]
    inf = spd(12, wide, rng)
    inf[5, 5] = np.inf
    mats.append(inf)
    mats = [m + np.triu(np.full_like(m, np.nan), 1) for m in mats]  # never read
    npiv = [n if i % 2 else n // 2 for i, n in enumerate(m.shape[0] for m in mats)]
    calls = []
    real = pc._potrf_small

    def counted(rows, *a):
        calls.append(len(rows))
        return real(rows, *a)

    monkeypatch.setattr(pc, "_potrf_small", counted)
    default = pc.SMALL_FLOPS
    outs = []
    for small in (default, -1):
        monkeypatch.setattr(pc, "SMALL_FLOPS", small)
        b = packed_from([m.astype(dtype) for m in mats], order, "cpu")
        res = Runtime("cpu").cholesky(b, npiv, overwrite=overwrite).result()
        outs.append((res.info.tolist(), [to_host(f).astype(wide)
                                          for f in res.factors.unpack()]))
    assert calls and sum(calls) >= len(mats) - 2, calls
    (info, got), (want_info, want) = outs
    assert info == want_info and info[len(sizes):len(sizes) + 3] == [1, 8, 33]
    tol = 1e3 * np.finfo(dtype).eps
    for i, (x, y) in enumerate(zip(got, want)):
        if info[i]:
            # Past a failed problem's leading block (the columns before the failing one, and
            # its pivot) it is unspecified (README): out of place, LAPACK's path leaves the
            # input (one whole problem) or zeros (a task run "wide", alone on the BLAS's
            # threads: 32 cores, one problem of a 13-problem batch), the loop the input.
            g = info[i] - 1
            assert abs(x[g, g] - y[g, g]) <= tol * max(abs(y[g, g]), 1.0), f"problem {i}"
            x, y = x[:, :g], y[:, :g]
        assert np.array_equal(np.isnan(x), np.isnan(y)), f"problem {i}: NaN where LAPACK has none"
        assert np.array_equal(np.isinf(x), np.isinf(y)), f"problem {i}: infinities differ"
        fin = np.isfinite(y)
        scale = max(np.abs(y[fin]).max(initial=0.0), 1.0)
        assert np.abs(x[fin] - y[fin]).max(initial=0.0) <= tol * scale, f"problem {i}"
