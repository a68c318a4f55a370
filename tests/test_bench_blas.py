"""benchmarks/cuda_blas.py without a GPU: its draws, floors, padding, reference checks and
tables, and every method's argument plumbing run on host memory.

The cuBLAS calls are replaced by a numpy stand-in that takes the same plain-int addresses the
harness computes (and checks each one against the arrays the harness took addresses of), so a
wrong leading dimension, stride, pointer or transpose shows up as a failed check here rather
than on the GPU. vbatch runs on its CPU backend; torch, where it imports, on the CPU."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import types

import numpy as np
import pytest

import vbatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name: str):
    key = f"vbatch_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            key, os.path.join(ROOT, "benchmarks", f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


cb = _load("cuda_blas")
cublas = _load("cublas")


@pytest.fixture(autouse=True, scope="module")
def _task_kinds_left_as_found():
    """Running vbatch's CPU blas ops here registers their parameterized task kinds in
    ``vbatch.core.kinds`` (made on first use); put both tables back afterwards, so that later
    test modules see the registry as they would without this one (test_cuda_build's launch-kind
    check reads it, and the CUDA blas launchers are not written yet at this commit)."""
    from vbatch.core.kinds import KINDS, LAUNCH_KINDS

    saved = dict(KINDS), dict(LAUNCH_KINDS)
    yield
    for table, old in zip((KINDS, LAUNCH_KINDS), saved):
        table.clear()
        table.update(old)


# ----------------------------------------------------------------------------- stand-ins
class FakeBlas:
    """cuBLAS's strided-batched GEMM, batched TRSM and grouped GEMM on host memory, column-major,
    addressed by plain ints. Every matrix it touches must lie inside an array whose address the
    harness took (``dev_ptr``, wrapped by the ``fake_blas`` fixture)."""

    def __init__(self):
        self.arrays: list[tuple[int, int, np.ndarray]] = []
        self.calls: list[str] = []

    def close(self):
        self.arrays.clear()

    def register(self, a: np.ndarray, addr: int) -> None:
        self.arrays.append((addr, a.nbytes, a))

    def _find(self, addr: int, nbytes: int) -> tuple[int, np.ndarray]:
        for base, size, arr in self.arrays:
            if base <= addr and addr + nbytes <= base + size:
                return base, arr
        raise AssertionError(f"address {addr:#x} (+{nbytes} bytes) is in no array the harness "
                             "took the address of")

    def mat(self, addr: int, dtype, rows: int, cols: int, ld: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        isz = dtype.itemsize
        assert ld >= max(1, rows), (ld, rows)
        extent = ((cols - 1) * ld + rows) * isz if rows and cols else 0
        base, arr = self._find(addr, extent)
        assert arr.flags.c_contiguous
        return np.ndarray((rows, cols), dtype, buffer=arr.reshape(-1).view(np.uint8),
                          offset=addr - base, strides=(isz, ld * isz))

    def vec(self, addr: int, count: int) -> np.ndarray:
        return self.mat(addr, np.uint64, count, 1, max(count, 1))[:, 0]

    def gemm_strided_batched(self, dt, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                             count):
        self.calls.append("gemm_strided_batched")
        isz = np.dtype(dt).itemsize
        for i in range(count):
            A = self.mat(a + i * sa * isz, dt, m, k, lda)
            B = self.mat(b + i * sb * isz, dt, k, n, ldb)
            C = self.mat(c + i * sc * isz, dt, m, n, ldc)
            C[...] = alpha * (A @ B) + beta * C

    def trsm_batched(self, dt, side, uplo, trans, diag, m, n, alpha, a_ptrs, lda, b_ptrs, ldb,
                     count):
        import scipy.linalg as sla

        self.calls.append(f"trsm_batched(trans={trans})")
        assert (side, uplo, diag) == (cublas.SIDE_LEFT, cublas.FILL_LOWER, cublas.DIAG_NON_UNIT)
        pa, pb = self.vec(a_ptrs, count), self.vec(b_ptrs, count)
        for i in range(count):
            A = self.mat(int(pa[i]), dt, m, m, lda)
            B = self.mat(int(pb[i]), dt, m, n, ldb)
            B[...] = sla.solve_triangular(np.tril(A), alpha * B, lower=True,
                                          trans=1 if trans == cublas.OP_T else 0)

    def gemm_grouped(self, call):
        self.calls.append("gemm_grouped")
        total = call.problems
        pa, pb, pc = (self.vec(p, total) for p in (call.a_ptrs, call.b_ptrs, call.c_ptrs))
        p = 0
        for g in range(len(call.m)):
            m, n, k = int(call.m[g]), int(call.n[g]), int(call.k[g])
            assert call.trans_a[g] == cublas.OP_N and call.trans_b[g] == cublas.OP_N
            for _ in range(int(call.group_size[g])):
                A = self.mat(int(pa[p]), call.dtype, m, k, int(call.lda[g]))
                B = self.mat(int(pb[p]), call.dtype, k, n, int(call.ldb[g]))
                C = self.mat(int(pc[p]), call.dtype, m, n, int(call.ldc[g]))
                C[...] = call.alpha[g] * (A @ B) + call.beta[g] * C
                p += 1


@pytest.fixture
def fake_blas(monkeypatch):
    fake = FakeBlas()
    real = cb.dev_ptr

    def dev_ptr(a):
        addr = real(a)
        fake.register(a, addr)
        return addr

    monkeypatch.setattr(cb, "dev_ptr", dev_ptr)
    return fake


def _args(**kw):
    base = dict(seed=12345, reps=1, check=6, strict=True)
    base.update(kw)
    return types.SimpleNamespace(**base)


def _env(blas=None, torch=None, skip=None):
    return {"xp": np, "sync": lambda: None, "skip": dict(skip or {}),
            "rt": vbatch.Runtime("cpu"), "blas": blas, "torch": torch, "magma": None,
            "ceil": {"bw": cb.BANDWIDTH, "peak": dict(cb.PEAK)}}


# ----------------------------------------------------------------------------- cases and draws
def test_default_cases_are_the_briefs():
    cases = cb.parse_args([]).case_list
    got = {(c.op, c.shape, c.nmax, c.k, c.nrhs) for c in cases}
    assert got == {("gemm", "square", 32, 2000, 0), ("gemm", "square", 128, 2000, 0),
                   ("gemm", "square", 512, 2000, 0), ("gemm", "square", 1024, 500, 0),
                   ("gemm", "panel", 512, 2000, 0), ("trsm", "", 512, 2000, 0),
                   ("potrs", "", 512, 2000, 1), ("potrs", "", 512, 2000, 16)}


@pytest.mark.parametrize("bad", ["gemm512", "gemm-square", "trsm0", "potrs512", "potrs64-nrhs0",
                                 "gemm-cube64", "syrk64"])
def test_bad_case_names_are_refused(bad):
    with pytest.raises(ValueError, match="case"):
        cb.parse_case(bad)


def test_cli_rejects_bad_input(capsys):
    for argv in (["--cases", "gemm-square"], ["--methods", "cusolver"], ["--dtype", "float16"],
                 ["--reps", "0"]):
        with pytest.raises(SystemExit):
            cb.parse_args(argv)
    a = cb.parse_args(["--cases", "trsm64", "trsm64", "--methods", "torch", "vbatch",
                       "--dtype", "float32", "float64", "--count", "7", "--no-plot"])
    assert [c.name for c in a.case_list] == ["trsm64"]
    assert a.methods == ["torch", "vbatch"] and a.dtype == ["float32", "float64"]
    assert a.case_list[0].k == 7 and a.no_plot


@pytest.mark.parametrize("name", ["gemm-square128", "gemm-panel512", "gemm-panelmn512",
                                  "trsm512", "potrs512-nrhs16", "gemm-square1024"])
def test_draws_follow_the_shape_rules(name):
    case = cb.parse_case(name)
    d = cb.draw(case, 12345)
    for v in d.values():
        assert len(v) == case.k and v.dtype == np.int64
    size = cb.main_size(case, d)
    assert size.min() >= 1 and size.max() <= case.nmax
    # uniform on [1, Nmax]: the mean is near (Nmax + 1) / 2
    assert abs(size.mean() - (case.nmax + 1) / 2) < 0.1 * case.nmax
    if case.shape == "square":
        assert np.array_equal(d["m"], d["n"]) and np.array_equal(d["m"], d["kk"])
    elif case.shape == "panel":
        assert np.array_equal(d["m"], d["n"]) and np.all(d["kk"] == 32)
    elif case.shape == "panelmn":
        assert not np.array_equal(d["m"], d["n"]) and np.all(d["kk"] == 32)
    elif case.op == "trsm":
        assert np.array_equal(d["m"], d["n"])
    else:
        assert np.all(d["nrhs"] == case.nrhs)
    # the same draw whatever else runs, another with another seed
    assert all(np.array_equal(v, cb.draw(case, 12345)[k]) for k, v in d.items())
    assert not np.array_equal(size, cb.main_size(case, cb.draw(case, 1)))


def test_work_and_floor_by_hand():
    g = cb.parse_case("gemm-square32", count=2)
    d = {"m": np.array([2, 3]), "n": np.array([2, 3]), "kk": np.array([2, 3])}
    flops, nbytes = cb.work(g, d, 8)
    assert flops == 2 * 8 + 2 * 27
    assert nbytes == 8 * (4 * 4 + 4 * 9)  # A, B read, C read and written
    t = cb.parse_case("trsm32", count=1)
    flops, nbytes = cb.work(t, {"m": np.array([4]), "n": np.array([3])}, 4)
    assert flops == 16 * 3 and nbytes == 4 * (10 + 2 * 12)
    p = cb.parse_case("potrs32-nrhs2", count=1)
    flops, nbytes = cb.work(p, {"n": np.array([5]), "nrhs": np.array([2])}, 8)
    assert flops == 2 * 25 * 2 and nbytes == 8 * (15 + 2 * 10)
    assert cb.floor_ms(6e10, 4.2e9, 60e12, 4.2e12) == (1.0, "flops")
    assert cb.floor_ms(6e9, 8.4e9, 60e12, 4.2e12) == (2.0, "memory")


def test_floors_match_the_anchors_file():
    """The anchors' H200 GEMM floors (gemm-h200-2026-11-21.json, its own draw of sizes and its
    measured ceilings) within the spread a different draw gives."""
    anchors = {("square", 32): 0.00533, ("square", 512): 2.13, ("square", 1024): 3.93,
               ("panelmn", 512): 0.556}
    for (shape, nmax), want in anchors.items():
        case = cb.parse_case(f"gemm-{shape}{nmax}")
        flops, nbytes = cb.work(case, cb.draw(case, 12345), 8)
        got, _ = cb.floor_ms(flops, nbytes, 63.76e12, 4.2045e12)
        assert abs(got / want - 1) < 0.06, (shape, nmax, got, want)


# ----------------------------------------------------------------------------- inputs and checks
def test_inputs_are_column_major_with_the_stated_diagonals():
    t = cb.parse_case("trsm40", count=30)
    d = cb.draw(t, 1)
    ins = cb.make_inputs(t, d, np.float64, np, 7)
    a, b = ins["a"], ins["b"]
    assert a.order == b.order == "F" and np.array_equal(b.m, d["m"]) and np.array_equal(b.n, d["n"])
    for i in range(t.k):
        m = int(d["m"][i])
        assert np.array_equal(np.diag(a.matrix(i)), np.full(m, float(m)))
        off = a.matrix(i) - np.diag(np.diag(a.matrix(i)))
        assert np.abs(off).max(initial=0) <= 1.0
        assert np.linalg.cond(np.tril(a.matrix(i))) < 3
    p = cb.parse_case("potrs40-nrhs3", count=30)
    d = cb.draw(p, 1)
    ins = cb.make_inputs(p, d, np.float32, np, 7)
    assert ins["l"].dtype == np.float32 and np.all(ins["b"].n == 3)
    for i in range(p.k):
        lo = ins["l"].matrix(i)
        assert np.allclose(lo, np.tril(lo)) and np.all(np.diag(lo) > 0)
        s = lo.astype(np.float64) @ lo.T.astype(np.float64)
        n = int(d["n"][i])
        assert np.allclose(np.diag(s), n, rtol=1e-5)  # the SPD draw had n on its diagonal


def test_reference_and_error_measure():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 4)), rng.standard_normal((4, 3))
    c = rng.standard_normal((5, 3))
    g = cb.parse_case("gemm-square8", count=1)
    ref, scale = cb.reference(g, {"a": a, "b": b, "c": c})
    assert np.allclose(ref, a @ b + c)
    norm = np.linalg.norm
    assert scale == pytest.approx(norm(a) * norm(b) + norm(c))
    assert cb.rel_err(ref + 1e-3, ref, scale) == pytest.approx(1e-3 * math.sqrt(15) / scale)
    assert cb.rel_err(ref, ref) == 0.0
    assert cb.rel_err(ref * (1 + 1e-3), ref) == pytest.approx(1e-3)
    bad = ref.copy()
    bad[0, 0] = np.nan
    assert cb.rel_err(bad, ref) == math.inf
    assert cb.rel_err(ref[:, :2], ref) == math.inf
    t = cb.parse_case("trsm8", count=1)
    L = np.tril(rng.standard_normal((4, 4))) + 4 * np.eye(4)
    upper_junk = L + np.triu(rng.standard_normal((4, 4)), 1)
    x, scale = cb.reference(t, {"a": upper_junk, "b": b})
    assert np.allclose(L @ x, b) and scale == pytest.approx(np.linalg.norm(x))
    p = cb.parse_case("potrs8-nrhs3", count=1)
    x, scale = cb.reference(p, {"l": upper_junk, "b": b})
    assert np.allclose(L @ L.T @ x, b) and scale == pytest.approx(np.linalg.norm(x))
    assert cb.tolerance(g, {"m": np.array([100]), "n": np.array([3]), "kk": np.array([7])},
                        np.float64) == pytest.approx(20 * np.finfo(np.float64).eps * 100)


# ----------------------------------------------------------------------------- padding
def test_buckets_pad_varying_dimensions_only():
    dm = np.array([[1, 32, 5], [33, 32, 40], [31, 32, 2], [64, 32, 64], [65, 32, 1]])
    got = cb.buckets(dm)
    assert [k for k, _ in got] == [(32, 32, 32), (64, 32, 64), (96, 32, 32)]
    assert [idx.tolist() for _, idx in got] == [[0, 2], [1, 3], [4]]
    allidx = np.concatenate([idx for _, idx in got])
    assert sorted(allidx.tolist()) == list(range(len(dm)))
    for key, idx in got:
        assert np.all(dm[idx] <= np.asarray(key))
    assert cb.buckets(np.zeros((0, 2), np.int64)) == []


def test_pad_stack_is_column_major_with_identity_padding():
    batch = cb.packed(np, np.array([2, 3]), np.array([2, 3]), np.float64, 3)
    st = cb.pad_stack(batch, [1, 0], 4, 4, np, eye=True)
    assert st.store.shape == (2, 4, 4) and st.store.flags.c_contiguous
    for j, i in enumerate([1, 0]):
        n = int(batch.n[i])
        m = st.view[j]
        assert np.array_equal(m[:n, :n], batch.matrix(i))
        assert np.array_equal(np.diag(m)[n:], np.ones(4 - n))
        assert not m[n:, :n].any() and not m[:n, n:].any()
        # column-major: element (r, c) at store[j].ravel()[r + c * ld], ld = rows
        assert st.store[j].ravel()[1 + 2 * 4] == m[1, 2]


# ----------------------------------------------------------------------------- every method
CASES = ["gemm-square40", "gemm-panel70", "gemm-panelmn70", "trsm70", "potrs70-nrhs1",
         "potrs70-nrhs5"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", CASES)
def test_methods_on_the_host_agree_with_numpy(name, dtype, fake_blas):
    """vbatch (CPU backend), bucket32 and grouped (the numpy stand-in for cuBLAS), torch (CPU)
    through run_case: every check passes, nothing is skipped but what must be."""
    try:
        import torch
    except ImportError:
        torch = None
    case = cb.parse_case(name, count=37)
    methods = ["vbatch", "bucket32", "grouped", "torch", "magma"]
    skip = {"magma": "no --magma PATH"}
    if torch is None:  # CI has no torch; the GPU machine's image does
        skip["torch"] = "torch is not installed"
    env = _env(blas=fake_blas, torch=torch, skip=skip)
    r = cb.run_case(case, dtype, methods, env, _args())
    want = {"vbatch", "bucket32"} | ({"grouped"} if case.op == "gemm" else set()) \
        | ({"torch"} if torch is not None else set())
    assert set(r["ms"]) == want, r
    assert r["errors"] == {}
    assert all(r["ok"].values()), (r["err"], r["tol"])
    assert max(r["err"].values()) < (1e-4 if dtype == "float32" else 1e-12)
    assert r["skipped"]["magma"] == "no --magma PATH"
    if case.op != "gemm":
        assert r["skipped"]["grouped"] == "GEMM only"
    assert set(r["x_vbatch"]) == want - {"vbatch"}
    assert case.k - 1 in r["sample"] or len(r["sample"]) >= 6
    calls = set(fake_blas.calls)
    if case.op == "gemm":
        assert calls == {"gemm_strided_batched", "gemm_grouped"}
    elif case.op == "trsm":
        assert calls == {"trsm_batched(trans=0)"}
    else:
        assert calls == {"trsm_batched(trans=0)", "trsm_batched(trans=1)"}
    json.dumps(r)  # the JSON output takes it as is


def test_in_place_anchors_restore_their_output_before_each_call(fake_blas):
    """With 3 timed calls after a warm-up, an unrestored C += A B would be off by 4x A B."""
    case = cb.parse_case("gemm-square24", count=9)
    env = _env(blas=fake_blas, skip={"magma": "x", "torch": "x"})
    r = cb.run_case(case, "float64", ["bucket32", "grouped"], env, _args(reps=3))
    assert all(r["ok"].values()) and max(r["err"].values()) < 1e-13, r["err"]


def test_a_wrong_answer_fails_the_check(fake_blas, monkeypatch):
    real = FakeBlas.gemm_strided_batched

    def doubled_alpha(self, dt, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, cnt):
        real(self, dt, m, n, k, 2 * alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, cnt)

    monkeypatch.setattr(FakeBlas, "gemm_strided_batched", doubled_alpha)
    case = cb.parse_case("gemm-square24", count=9)
    env = _env(blas=fake_blas, skip={"magma": "x", "torch": "x"})
    r = cb.run_case(case, "float64", ["vbatch", "bucket32"], env, _args())
    assert r["ok"] == {"vbatch": True, "bucket32": False}
    assert "FAIL" in cb.table([r])


def test_a_method_that_raises_is_recorded_and_the_run_goes_on(fake_blas):
    case = cb.parse_case("trsm16", count=5)

    class Broken(FakeBlas):
        def trsm_batched(self, *a, **k):
            raise RuntimeError("cublasDtrsmBatched returned 7")

    env = _env(blas=Broken(), skip={"magma": "x", "torch": "x"})
    r = cb.run_case(case, "float64", ["bucket32", "vbatch"], env, _args(strict=False))
    assert "cublasDtrsmBatched returned 7" in r["errors"]["bucket32"]
    assert r["ok"] == {"vbatch": True}
    with pytest.raises(RuntimeError):
        cb.run_case(case, "float64", ["bucket32"], env, _args(strict=True))


# ----------------------------------------------------------------------------- output
def _fake_result(case="gemm-square32", **kw):
    r = {"case": case, "dtype": "float64", "k": 2000, "floor_ms": 0.005, "floor_bound": "memory",
         "tol": 1e-12, "ms": {"vbatch": 0.05, "bucket32": 0.04, "torch": 0.1},
         "err": {"vbatch": 1e-16, "bucket32": 2e-16, "torch": 3e-16},
         "ok": {"vbatch": True, "bucket32": True, "torch": True},
         "x_vbatch": {"bucket32": 0.8, "torch": 2.0},
         "skipped": {"grouped": "cuBLAS 12.4 has no cublasGemmGroupedBatchedEx",
                     "magma": "no --magma PATH"},
         "errors": {}}
    r.update(kw)
    return r


def test_table_shows_times_ratios_errors_and_reasons(tmp_path):
    rs = [_fake_result(), _fake_result("trsm512", ms={"bucket32": 3.0}, err={"bucket32": 1e-15},
                                       ok={"bucket32": True}, x_vbatch={},
                                       errors={"vbatch": "KeyError: 'blas'"})]
    text = cb.table(rs)
    for want in ("0.05", "0.04 (0.80x)", "0.1 (2.00x)", "10.0", "0.005 M", "1.0e-16",
                 "trsm512", "error", "ERROR KeyError: 'blas'",
                 "grouped: skipped (cuBLAS 12.4 has no cublasGemmGroupedBatchedEx)",
                 "magma: skipped (no --magma PATH)"):
        assert want in text, (want, text)
    assert "grouped" not in text.splitlines()[1]  # a column only for what ran or failed
    prefix = str(tmp_path / "sub" / "blas")
    written = cb.write(prefix, {"device": "none"}, rs, text, no_plot=False)
    assert written[:2] == [prefix + ".json", prefix + ".txt"]
    back = json.load(open(prefix + ".json"))
    assert back["results"][0]["ms"]["vbatch"] == 0.05
    assert open(prefix + ".txt").read().startswith("time, ms")


# ----------------------------------------------------------------------------- cuBLAS plumbing
def test_libcublas_is_read_from_the_process_maps():
    maps = "\n".join([
        "7f00-7f10 r--p 00000000 08:01 1 /usr/lib/libc.so.6",
        "7f10-7f20 r-xp 00000000 08:01 2 /site/nvidia/cu13/lib/libcublasLt.so.13",
        "7f20-7f30 r-xp 00000000 08:01 3 /site/nvidia/cu13/lib/libcublas.so.13",
        "7f30-7f40 r--p 00010000 08:01 3 /site/nvidia/cu13/lib/libcublas.so.13",
        "7f40-7f50 rw-p 00000000 00:00 0 ",
        "7f50-7f60 r-xp 00000000 08:01 4 /opt/cuda with space/lib64/libcublas.so.12.9.1.4",
    ])
    assert cublas.mapped_libcublas(maps) == ["/site/nvidia/cu13/lib/libcublas.so.13",
                                             "/opt/cuda with space/lib64/libcublas.so.12.9.1.4"]
    assert cublas.mapped_libcublas("") == []


def test_grouped_call_normalizes_its_host_arrays():
    call = cublas.GroupedCall(dtype="float32", m=[1, 2], n=[3, 4], k=[5, 6], lda=[1, 2],
                              ldb=[5, 6], ldc=[1, 2], alpha=1.0, beta=0.5, group_size=[1, 1],
                              a_ptrs=1, b_ptrs=2, c_ptrs=3)
    assert call.m.dtype == np.int32 and call.alpha.dtype == np.float32
    assert call.beta.tolist() == [0.5, 0.5] and call.trans_a.tolist() == [0, 0]
    assert call.problems == 2
    with pytest.raises(ValueError, match="lda"):
        cublas.GroupedCall(dtype="float64", m=[1, 2], n=[3, 4], k=[5, 6], lda=[1], ldb=[5, 6],
                           ldc=[1, 2], alpha=1.0, beta=0.0, group_size=[1, 1], a_ptrs=1,
                           b_ptrs=2, c_ptrs=3)


def test_main_runs_end_to_end_on_the_host(monkeypatch, tmp_path, fake_blas, capsys):
    """main() with the device part swapped for the host one: progress, tables, files, exit."""
    import vbatch.runtime.device as device

    monkeypatch.setattr(device, "cuda_status", lambda: (True, "stand-in"))
    env = _env(blas=fake_blas, skip={"magma": "no --magma PATH", "torch": "not here"})
    monkeypatch.setattr(cb, "setup", lambda args: (env, {"device": "host stand-in"}))
    out = tmp_path / "res"
    rc = cb.main(["--cases", "gemm-panel40", "potrs40-nrhs2", "--count", "6", "--reps", "2",
                  "--dtype", "float32", "--out", str(out) + os.sep, "--no-plot"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "gemm-panel40 float32: vbatch" in text and "relative normwise error" in text
    data = json.load(open(out / "blas.json"))
    assert [r["case"] for r in data["results"]] == ["gemm-panel40", "potrs40-nrhs2"]
    assert data["meta"]["args"]["reps"] == 2 and data["meta"]["device"] == "host stand-in"
    assert (out / "blas.txt").exists() and not (out / "blas.png").exists()


def test_main_without_a_gpu_says_why(monkeypatch, capsys):
    import vbatch.runtime.device as device

    monkeypatch.setattr(device, "cuda_status", lambda: (False, "no device here"))
    assert cb.main(["--cases", "trsm8"]) == 2
    assert "needs a GPU: no device here" in capsys.readouterr().err
