"""Batched LU (getrf): factors, pivots and info against LAPACK's ``dgetrf`` on every backend.

Each test runs on the CPU and, where a GPU is usable, on CUDA. Factors are compared with
LAPACK's through ``||F - F_ref||_F / ||F_ref||_F <= C n eps`` (NaN fails), pivots and info
exactly: the inputs have no ties (Gaussian entries; or exact arithmetic where a pivot is zero).
Sizes 0, 1, tile - 1, tile, tile + 1 and past it, square, tall and wide, in one batch; the
panel width of each backend's default and a narrow one (every size then blocked).
"""

from __future__ import annotations

import numpy as np
import pytest

from _check import to_host
from conftest import DEVICES
from vbatch import InputError, PackedBatch, Runtime
from vbatch.ops.getrf import TRAILING, getrf_graph, lu_nopivot, reference, residual
from vbatch.ops.op import wide

SIZES = [0, 1, 31, 32, 33, 70]
SHAPES = [(s, s) for s in SIZES] + [(70, 33), (33, 70), (32, 1), (1, 32), (5, 0), (0, 5),
                                    (71, 64), (64, 71)]
C = 20  # the factors' normwise error, in units of max(m, n) eps


def _xp(device):
    if device == "cuda":
        import cupy

        return cupy
    return np


def _list(mats, device, dtype=np.float64):
    return [_xp(device).asarray(np.array(a, dtype)) for a in mats]


def _packed(mats, order, device, dtype=np.float64):
    from vbatch import pack

    b = pack([np.array(a, dtype) for a in mats], order=order)
    return b.with_data(_xp(device).asarray(b.data)) if device == "cuda" else b


def _factors(res) -> list:
    f = res.factors
    return [to_host(a) for a in (f.unpack() if isinstance(f, PackedBatch) else f)]


def _check(mats, res, dtype=np.float64, pivot=True, where=""):
    facs = _factors(res)
    assert len(facs) == len(mats) == len(res.ipiv) == len(res.info), where
    for i, a in enumerate(mats):
        want, piv, info = reference(np.asarray(a, dtype), pivot)
        got = wide(facs[i])
        p = to_host(res.ipiv[i])
        at = f"{where}, problem {i} {a.shape}"
        assert got.shape == a.shape and p.shape == (min(a.shape),), at
        assert p.dtype == np.int32, at
        assert not np.isnan(got).any(), f"{at}: NaN in the factors"
        assert p.tolist() == piv.tolist(), f"{at}: pivots {p.tolist()} != {piv.tolist()}"
        assert int(res.info[i]) == info, f"{at}: info {res.info[i]} != {info}"
        err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1.0)
        tol = C * max(a.shape + (1,)) * np.finfo(dtype).eps
        assert err <= tol, f"{at}: error {err:.2e} > {tol:.2e}"
        if min(a.shape):
            r = residual(np.asarray(a, dtype), got, p)
            assert r <= tol, f"{at}: residual {r:.2e}"


def _gaussian(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["list", "F", "C"])
@pytest.mark.parametrize("nb", [None, 8])
def test_factors_pivots_and_info_are_lapacks(device, form, nb):
    mats = _gaussian(SHAPES)
    rt = Runtime(device) if nb is None else Runtime(device, nb=nb)
    arg = _list(mats, device) if form == "list" else _packed(mats, form, device)
    _check(mats, rt.getrf(arg).result(), where=f"{device} {form} nb={nb}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nb", [None, 8])
def test_large_panels_and_wide_problems(device, nb):
    """Shapes past the CUDA kernels' one-tile cases: a panel of more than 256 rows (a factor
    thread owns several), more than 64 columns outside a panel (several column tiles of the
    rows kernel), tall and wide, in both orders."""
    mats = _gaussian([(300, 200), (40, 300), (257, 257), (9, 130)], seed=5)
    rt = Runtime(device) if nb is None else Runtime(device, nb=nb)
    for form in ("F", "C"):
        _check(mats, rt.getrf(_packed(mats, form, device)).result(),
               where=f"{device} {form} nb={nb}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("nb", [None, 8])
def test_complex_against_zgetrf(device, dtype, nb):
    """Complex Gaussian matrices (their pivots by LAPACK's |re| + |im|, which differs from
    the modulus), exactly zero columns among them, every form: factors, pivots and info as
    LAPACK's zgetrf on the same values; with pivot=False, the diagonal."""
    rng = np.random.default_rng(6)
    mats = [(rng.standard_normal(s) + 1j * rng.standard_normal(s)).astype(dtype)
            for s in SHAPES]
    mats[2][:, [0, 7]] = 0  # (31 x 31: its first pivot and a later one exactly zero)
    rt = Runtime(device) if nb is None else Runtime(device, nb=nb)
    for form in ("list", "F", "C"):
        arg = _list(mats, device, dtype) if form == "list" else _packed(mats, form, device, dtype)
        res = rt.getrf(arg).result()
        assert res.info[2] == 1
        _check(mats, res, dtype, where=f"{device} {np.dtype(dtype).name} {form} nb={nb}")
    dom = [a + (sum(a.shape) + 1) * np.eye(*a.shape) for a in mats if a.size]
    _check(dom, rt.getrf(_list(dom, device, dtype), pivot=False).result(), dtype, pivot=False,
           where=f"{device} {np.dtype(dtype).name} nopiv")


def _ties(shapes, dtype, rng) -> list:
    """Ties for the pivot search, with exact arithmetic up to them. Column 0 is zero but for
    row 3 (row 0 and row 3 swap; every multiplier is 0, so no other row changes). In column 1
    the original rows 0 (now in place 3) and 2 (in place 2) tie at magnitude 1, the others
    are smaller: LAPACK takes place 2, the first in the rows' current order, where lane (or
    original row) order would take row 0. Real: row 2's 1 keeps column 1's multipliers exact.
    Complex: row 2's entry is (1 + 1j) / 2, of |re| + |im| 1 (as izamax measures) but modulus
    0.71, so a search by modulus would take row 0's -1 (or the others' 0.9j). The later columns
    are Gaussian."""
    cx = np.dtype(dtype).kind == "c"
    mats = []
    for m, n in shapes:
        a = rng.standard_normal((m, n)) + (1j * rng.standard_normal((m, n)) if cx else 0)
        a[:, 0] = 0
        a[3, 0] = 4
        a[:, 1] = 0.9j if cx else 0.9 * rng.choice([-1.0, 1.0], m)
        a[0, 1], a[2, 1] = -1, (0.5 + 0.5j) if cx else 1
        mats.append(a.astype(dtype))
    return mats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("form", ["F", "C"])
def test_ties_take_the_first_row_of_largest_magnitude(device, dtype, form):
    """Pivots on ties as LAPACK's i?amax: the first row (in the rows' current order) of the
    largest magnitude (|re| + |im| for a complex entry), through every GETRF kernel (a warp,
    a block in registers, the factor kernel: up to 300 rows)."""
    shapes = [(4, 4), (8, 8), (31, 31), (33, 33), (64, 64), (70, 70), (100, 40), (300, 20)]
    mats = _ties(shapes, dtype, np.random.default_rng(8))
    res = Runtime(device).getrf(_packed(mats, form, device, dtype)).result()
    assert all(to_host(p)[:2].tolist() == [3, 2] for p in res.ipiv)
    _check(mats, res, dtype, where=f"{device} {np.dtype(dtype).name} {form} ties")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_column_of_subnormals_pivots_on_its_largest(device, dtype):
    """A column of subnormals is factored as LAPACK factors it: its largest entry is the pivot
    (a search through fabs in a build that flushes subnormals to zero saw a column of zeros and
    kept the diagonal), that pivot is not zero (info 0) and the factors reproduce A, through
    each GETRF kernel (panels of 8 rows: a warp; 33 and 100: a block in registers; 300: the
    factor kernel). (Below a subnormal pivot the CUDA kernels divide, as reference LAPACK's
    dgetf2 does; OpenBLAS 0.3.30's dgetrf leaves that column as it is. Both reproduce A.)"""
    if device == "cuda" and dtype == np.float32:
        from vbatch.kernels import cuda as kc

        if kc._prebuilt("vb::getrf_warp<float,8,false,true>") is None:
            pytest.xfail("kernels compiled by NVRTC flush float32 subnormals (CuPy compiles "
                         "with -ftz=true; decisions.md#getrf-pivot-search): open")
    rng = np.random.default_rng(9)
    tiny = np.finfo(dtype).smallest_subnormal
    mats = []
    for n in (8, 33, 100, 300):
        a = rng.standard_normal((n, n))
        a[:, 0] = tiny * rng.integers(1, 4, n)
        a[5, 0] = -4 * tiny
        mats.append(a.astype(dtype))
    res = Runtime(device).getrf(_packed(mats, "F", device, dtype)).result()
    assert [int(to_host(p)[0]) for p in res.ipiv] == [5, 5, 5, 5]
    assert res.info.tolist() == [0, 0, 0, 0]
    for a, f, p in zip(mats, _factors(res), res.ipiv):
        r = residual(a, f, to_host(p))
        assert r <= C * len(a) * np.finfo(dtype).eps, f"{len(a)}: residual {r:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_float32_against_lapack_on_its_own_input(device):
    mats = [np.asarray(a, np.float32) for a in _gaussian(SHAPES, seed=3)]
    res = Runtime(device).getrf(_list(mats, device, np.float32)).result()
    assert _factors(res)[3].dtype == np.float32
    _check(mats, res, np.float32, where=f"{device} float32")


def _zero_columns(shapes, cols, seed=1):
    """Gaussian matrices with the columns ``cols`` exactly zero: the pivot there is exactly
    zero whatever rounding does elsewhere (U's column above it is L11^-1 times zeros)."""
    mats = _gaussian(shapes, seed)
    for a, c in zip(mats, cols):
        a[:, [x for x in c if x < a.shape[1]]] = 0.0
    return mats


def _exact(shapes, zeros, seed=2):
    """Rank-deficient ``L U`` in exact arithmetic: L unit lower of entries in {0, +-1/4,
    +-1/2} (partial pivoting keeps the diagonal), U upper of small integers with zero pivots at
    ``zeros`` (and L's column below each zero): every step is exact, so the zeros are too."""
    rng = np.random.default_rng(seed)
    out = []
    for (m, n), z in zip(shapes, zeros):
        r = min(m, n)
        lo = np.tril(rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5], (m, r)), -1) + np.eye(m, r)
        up = np.triu(rng.integers(-3, 4, (r, n)).astype(np.float64), 1)
        up[np.arange(r), np.arange(r)] = rng.choice([-2.0, -1.0, 1.0, 2.0], r)
        for c in z:
            if c < r:
                up[c, c] = 0.0
                lo[c + 1:, c] = 0.0
        out.append(lo @ up)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nb", [None, 16])
def test_singular_and_rank_deficient_problems_leave_the_others_alone(device, nb):
    """Exactly zero columns (the first, across a panel edge, the last), a zero matrix and
    rank-deficient ones among good ones: info is LAPACK's first zero pivot, the factorization
    is complete (pivots and factors as LAPACK's), and the good problems are as when alone."""
    shapes = [(33, 33), (40, 40), (70, 70), (32, 32), (70, 40), (40, 70), (5, 5)]
    cols = [[0], [31, 32], [69], [], [15, 39], [3], []]
    mats = _zero_columns(shapes, cols)
    mats[6][...] = 0.0
    good = _gaussian([(33, 33), (70, 70), (17, 40)], seed=9)
    deficient = _exact([(70, 70), (64, 40), (30, 64)], [[10, 40, 41], [0, 39], [29]])
    batch = mats[:3] + good[:1] + mats[3:] + good[1:] + deficient
    rt = Runtime(device) if nb is None else Runtime(device, nb=nb)
    res = rt.getrf(_list(batch, device)).result()
    _check(batch, res, where=f"{device} nb={nb}")
    assert res.info.tolist()[:3] == [1, 32, 70] and res.info[7] == 1
    assert res.info.tolist()[-3:] == [11, 1, 30] and not res.ok
    alone = rt.getrf(_list(good, device)).result()
    for i, j in zip([3, 8, 9], range(3)):
        np.testing.assert_array_equal(_factors(res)[i], _factors(alone)[j])


def _dominant(shapes, seed=4):
    rng = np.random.default_rng(seed)
    out = []
    for m, n in shapes:
        a = rng.uniform(-1, 1, (m, n))
        r = min(m, n)
        a[np.arange(r), np.arange(r)] = (m + n) * rng.choice([-1.0, 1.0], r)
        out.append(a)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nb", [None, 16])
def test_without_pivoting(device, nb):
    """pivot=False on diagonally dominant matrices: the unpivoted factors, ipiv 0..r-1; a zero
    pivot (exact arithmetic) sets info, leaves its column unscaled and nothing reaches the
    other problems. The same shapes with pivot=True on one runtime get their own plan."""
    dom = _dominant(SHAPES)
    zero = _exact([(40, 40), (33, 70)], [[5, 34], [32]])
    batch = dom + zero
    rt = Runtime(device) if nb is None else Runtime(device, nb=nb)
    res = rt.getrf(_list(batch, device), pivot=False).result()
    _check(batch, res, pivot=False, where=f"{device} nb={nb} pivot=False")
    assert res.info.tolist() == [0] * len(dom) + [6, 33]
    assert lu_nopivot(batch[-1])[1] == 33
    swapped = [a[::-1].copy() for a in batch]  # (partial pivoting now swaps rows)
    piv = rt.getrf(_list(swapped, device)).result()
    _check(swapped, piv, where=f"{device} nb={nb} pivot=True after False")


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_change_only_when_asked(device):
    mats = _gaussian([(31, 31), (0, 0), (40, 33), (33, 40), (1, 1)], seed=5)
    given = _list(mats, device)
    rt = Runtime(device)
    res = rt.getrf(given).result()
    for a, g in zip(mats, given):
        np.testing.assert_array_equal(to_host(g), a)
    res2 = rt.getrf(given, overwrite=True).result()
    assert all(f is g for f, g in zip(res2.factors, given))
    for f, want in zip(_factors(res2), _factors(res)):
        np.testing.assert_array_equal(f, want)
    np.testing.assert_array_equal(res2.info, res.info)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_is_named_before_any_work(device, monkeypatch):
    rt = Runtime(device)
    began = []
    real = type(rt.backend).begin
    monkeypatch.setattr(type(rt.backend), "begin",
                        lambda self, *a, **kw: began.append(1) or real(self, *a, **kw))
    good = np.eye(3)
    for bad in (np.ones((3, 3), np.int32), np.ones((3, 3), np.float16)):
        with pytest.raises(InputError, match=r"problem 1: a: .*dtype"):
            rt.getrf([_xp(device).asarray(x) for x in (good, bad, good)])
    for pivot in (1, "yes", None, np.float64(1.0)):
        with pytest.raises(InputError, match="pivot must be True or False"):
            rt.getrf(_list([good], device), pivot=pivot)
    with pytest.raises(InputError, match=r"problem 1: a: dtype complex128 differs from "
                                         r"problem 0's float64"):
        rt.getrf([_xp(device).asarray(x) for x in (good, good.astype(np.complex128))])
    assert not began


def test_the_graph_is_right_looking_with_the_blas_gemm_for_the_trailing_update():
    g = getrf_graph([70, 40, 5, 0], [70, 70, 3, 4], nb=32)
    assert TRAILING.op == "blas" and g.kinds[1] is TRAILING
    assert g.problem.tolist() == [0] * 5 + [1] * 3 + [2]
    assert g.kind.tolist() == [0, 1, 0, 1, 0, 0, 1, 0, 0]
    # panel (j, w, m, n); update (r0, mm, k0, kk, nn, c0)
    assert g.args[:5, :6].tolist() == [[0, 32, 70, 70, 0, 0], [32, 38, 0, 32, 38, 32],
                                       [32, 32, 70, 70, 0, 0], [64, 6, 32, 32, 6, 64],
                                       [64, 6, 70, 70, 0, 0]]
    assert g.args[5:8, :6].tolist() == [[0, 32, 40, 70, 0, 0], [32, 8, 0, 32, 38, 32],
                                        [32, 8, 40, 70, 0, 0]]
    assert g.edges.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [5, 6], [6, 7]]


@pytest.mark.parametrize("pivot", [True, False])
def test_every_cuda_launch_selects_a_kernel_that_is_built(pivot):
    """Without a GPU: a CUDA-option plan's launches (factor and rows of every thread count and
    grid, the blas GEMMs) select kernels of cuda_build.kernel_names, sized to their tasks."""
    from vbatch.core.errors import validated
    from vbatch.kernels import blas_cuda, cuda_build, getrf_cuda
    from vbatch.ops.op import OPS
    from vbatch.runtime.config import Config
    from vbatch.scheduler import make_plan

    names = set(cuda_build.kernel_names())
    rng = np.random.default_rng(6)
    m = rng.integers(0, 600, 60)
    n = np.where(rng.random(60) < 0.3, m, rng.integers(0, 600, 60))
    op = OPS["getrf"]
    req = validated(op.request, a=[np.zeros((a, b)) for a, b in zip(m, n)], pivot=pivot)
    seen = set()
    for nb in getrf_cuda.NB_SUPPORTED:
        opts = {**blas_cuda.plan_defaults(np.float64), **getrf_cuda.plan_defaults(np.float64),
                "nb": nb}
        plan = make_plan(op.graph(req, opts), op="getrf", streams=4, buffers=op.names,
                         **{k: v for k, v in opts.items() if k != "streams"})
        for dtype in getrf_cuda.DTYPES:
            for order in getrf_cuda.ORDERS:
                lay = dict.fromkeys(op.names, order)
                for lc in plan.launches:
                    mod = getrf_cuda if lc.family == "getrf" else blas_cuda
                    s = mod.selection(lc, plan, dtype, lay, Config())
                    assert s.name in names, s.name
                    seen.add((lc.kind, s.block[0]))
                    if lc.kind == "getrf.factor" and "getrf_warp" in s.name:
                        w = getrf_cuda.PANEL_WARPS
                        assert lc.rows[1] <= 32
                        assert s.block == (32 * w,) and s.grid[0] * w >= lc.count
                        seen.add((lc.kind, "warp"))
                    elif lc.kind == "getrf.factor":
                        assert s.grid == (lc.count,)
                        assert s.block[0] >= min(lc.rows[1], getrf_cuda.FACTOR_THREADS[-1])
                    elif lc.kind == "getrf.rows":
                        assert s.grid[0] == lc.count
                        assert s.grid[1] * getrf_cuda.rows_cols(nb, order) >= lc.cols[1]
    assert {k for k, _ in seen} == {"getrf.factor", "getrf.rows", blas_cuda.GEMM}
    assert {b for k, b in seen if k == "getrf.factor"} == {*getrf_cuda.FACTOR_THREADS, "warp"}
