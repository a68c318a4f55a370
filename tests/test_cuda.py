"""CUDA backend, beyond the shared conformance suite (test_cholesky.py runs there too).

Run on a GPU machine: ``python -m pytest -m gpu``. Everything here is skipped without one.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from _check import check_factor, to_host
from vbatch import PackedBatch, Runtime, pack, reference
from vbatch.ops.generate import make_indefinite, sizes, spd_list

pytestmark = pytest.mark.gpu

SIZE_EDGES = [0, 1, 31, 32, 33, 63, 64, 65, 511, 512, 513, 2048]


@pytest.fixture(scope="module")
def cupy():
    import cupy

    return cupy


def _rt(**opts):
    return Runtime("cuda", **opts)


def test_every_kernel_loads_from_the_cubins_built_for_this_device(cupy):
    """Where a build with nvcc left cubins for this device's architecture, every kernel the
    backend can launch loads from them (its symbol as indexed), and the first call of a new
    process compiles nothing: a misread symbol, a cubin that does not load, or an NVRTC run
    fails here."""
    import os
    import subprocess
    import sys
    import tempfile

    from vbatch.kernels import cuda as kc
    from vbatch.kernels import cuda_build as build

    idx = build.Binaries.read()
    if idx is None or idx.arch_for(cupy.cuda.Device().compute_capability) is None:
        pytest.skip("no cubins built for this device (a build without nvcc)")
    for name in build.kernel_names():
        kern = kc._prebuilt(name)
        assert kern is not None and kern.kernel.ptr, name
    # (a sparse factor and solve too: copy.cu's put, the frontal kernels)
    code = ("import cupy, numpy as np, scipy.sparse as sp, vbatch, vbatch.sparse as vs; "
            "m = [cupy.asarray(np.eye(n) * 4) for n in (1, 40, 300)]; "
            "r = vbatch.posv(m, m).result(); print(r.info.tolist()); "
            "A = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], (50, 50)).tocsc(); "
            "x = vs.cholesky(A, runtime=vbatch.Runtime('cuda')).solve(cupy.asarray(np.ones(50))); "
            "assert abs(A @ x.get() - 1).max() < 1e-12")
    with tempfile.TemporaryDirectory() as cache:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, CUPY_CACHE_DIR=cache), timeout=300)
        assert p.returncode == 0 and p.stdout.split() == ["[0,", "0,", "0]"], p.stderr
        assert not [f for f in os.scandir(cache)], "NVRTC compiled at the first call"


class Gate:
    """A kernel that holds a stream until the test opens it (a flag in pinned host memory), so
    that work queued behind it is still pending however fast or slow the machine is. It gives
    up by itself after ``limit`` seconds of wall time (the GPU's global timer): a liveness
    guard, so that a test that never opens it fails instead of hanging the suite."""

    SOURCE = r"""
    extern "C" __global__ void gate(volatile int* open, unsigned long long limit_ns) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do {
            if (*open) return;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t - t0 < limit_ns);
    }"""

    def __init__(self, cupy, limit: float = 120.0):
        self._kernel = cupy.RawKernel(self.SOURCE, "gate")
        self._mem = cupy.cuda.alloc_pinned_memory(4)
        self._flag = np.frombuffer(self._mem, np.int32, 1)
        self._flag[0] = 1
        self._limit = np.uint64(limit * 1e9)
        self._streams = []

    def close(self, stream) -> None:
        """Hold ``stream`` from here on (until :meth:`open`)."""
        self._flag[0] = 0
        with stream:
            self._kernel((1,), (1,), (np.uint64(self._mem.ptr), self._limit))
        self._streams.append(stream)

    def open(self) -> None:
        """Let the held streams go, and wait for the gates (the flag's memory must outlive
        them)."""
        self._flag[0] = 1
        for s in self._streams:
            s.synchronize()
        self._streams.clear()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["numpy", "cupy"])
def test_edge_sizes_including_2048(cupy, dtype, kind):
    """Sizes 0, 1, 31..33, 63..65, 511..513 and 2048 in one batch: the 2048 matrix's tall panels
    take the separated path (beyond the fused kernel's shared memory), the rest the fused one."""
    rng = np.random.default_rng(1)
    mats = spd_list(SIZE_EDGES, dtype, rng)
    inp = mats if kind == "numpy" else [cupy.asarray(m) for m in mats]
    res = _rt().cholesky(inp).result()
    counts = res.plan.counts()
    assert counts.get("fused") and counts.get("update") and counts.get("trsm"), counts
    assert not res.info.any()
    for a, f in zip(mats, res.factors):
        assert type(f).__module__.split(".")[0] == kind
        check_factor(a, f, dtype, where=f"n={a.shape[0]}")


@pytest.mark.parametrize("dist", ["uniform", "gauss", "skewed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ["F", "C"])
def test_distributions_packed_on_the_device(cupy, dist, dtype, order):
    from vbatch.kernels.cuda import spd_fill

    rng = np.random.default_rng(2)
    n = sizes(dist, 300, 300, rng)
    ld = np.maximum(n, 1)
    off = np.r_[0, np.cumsum(ld * n)[:-1]]
    batch = PackedBatch.from_buffer(cupy.empty(int((ld * n).sum()), dtype), n, off, ld, order)
    spd_fill(batch, seed=5)
    before = batch.data.copy()
    res = _rt().cholesky(batch).result()
    assert not res.info.any()
    assert cupy.array_equal(batch.data, before), "input modified"
    host_a = batch.with_data(batch.data.get())
    host_f = res.factors.with_data(res.factors.data.get())
    for i in range(batch.k):
        check_factor(host_a.matrix(i), host_f.matrix(i), dtype, where=f"{dist} problem {i}")


def test_separated_and_fused_agree(cupy):
    rng = np.random.default_rng(3)
    ns = [5, 40, 100, 130, 200, 257]
    mats = [cupy.asarray(m) for m in spd_list(ns, np.float64, rng)]
    # (unblocked: block 0, so that the separated plan is panels alone)
    fused = _rt(nb=32, block=0).cholesky(mats).result()
    sep = _rt(nb=32, fused_max_rows=0, block=0).cholesky(mats).result()
    assert set(sep.plan.counts()) == {"update", "trsm"}
    for a, b in zip(fused.factors, sep.factors):
        np.testing.assert_allclose(to_host(a), to_host(b), rtol=1e-12, atol=1e-12)


def test_row_major_batches_keep_their_own_blocking(cupy):
    """The blocking defaults were measured per layout (potrf_cuda.layout_defaults): a float64
    problem of 300 columns is blocked in a column-major batch (more than 256), not in a
    row-major one (at most 512), and both factor it right; unless it is one of a batch's few
    large problems (block_few, on by default: then it is blocked in both)."""
    from vbatch.kernels import potrf_cuda as sel

    rng = np.random.default_rng(4)
    mats = spd_list([300, 40], np.float64, rng)
    rt = _rt(block_few=0)
    assert rt.plan_options("float64", "potrf", "C")["block_above"] == sel.ROW_BLOCK_ABOVE
    assert rt.plan_options("float64", "potrf", "F")["block_above"] == sel.BLOCK_ABOVE["float64"]
    for run, order, blocked in ((rt, "F", True), (rt, "C", False), (_rt(), "C", True)):
        packed = __import__("vbatch").pack(mats, order=order)
        res = run.cholesky(packed.with_data(cupy.asarray(packed.data))).result()
        assert ("blas.gemm" in res.plan.counts()) is blocked, (order, res.plan.counts())
        for i, a in enumerate(mats):
            check_factor(a, res.factors.matrix(i), np.float64, where=f"{order} {i}")


@pytest.mark.parametrize("update", ["fma", "mma"])
@pytest.mark.parametrize("order", ["F", "C"])
def test_both_float64_update_kernels(cupy, update, order):
    """The FMA update is the default; the tensor-core (DMMA) one is selectable and must agree."""
    rng = np.random.default_rng(9)
    ns = [1, 9, 17, 33, 64, 65, 130, 300]
    mats = spd_list(ns, np.float64, rng)
    packed = __import__("vbatch").pack(mats, order=order)
    dev = packed.with_data(cupy.asarray(packed.data))
    res = _rt(nb=16, fused_max_rows=0, fp64_update=update).cholesky(dev).result()
    host = res.factors.with_data(res.factors.data.get())
    assert res.plan.counts().get("update")
    for i, a in enumerate(mats):
        check_factor(a, host.matrix(i), np.float64, where=f"{update} {order} n={ns[i]}")


def test_graphs_and_direct_launches_agree(cupy):
    rng = np.random.default_rng(10)
    mats = [cupy.asarray(m) for m in spd_list([5, 40, 100, 257, 33], np.float64, rng)]
    npiv = [5, 20, 64, 200, 0]
    with_graph = _rt(streams=4).cholesky(mats, npiv).result()
    direct = _rt(streams=4, cuda_graphs=False).cholesky(mats, npiv).result()
    assert with_graph.plan.nstreams > 1
    for a, b in zip(with_graph.factors, direct.factors):
        assert cupy.array_equal(a, b)


def test_matches_the_cpu_backend(cupy):
    rng = np.random.default_rng(4)
    ns = list(rng.integers(0, 150, 60))
    mats = spd_list(ns, np.float64, rng)
    npiv = [int(rng.integers(0, n + 1)) for n in ns]
    gpu = _rt(nb=16).cholesky(mats, npiv).result()
    cpu = Runtime("cpu", nb=16).cholesky(mats, npiv).result()
    for a, b in zip(gpu.factors, cpu.factors):
        np.testing.assert_allclose(to_host(a), b, rtol=1e-10, atol=1e-10)


def test_seventy_thousand_tiny_matrices(cupy):
    """More problems than gridDim.y could hold (65,535): the batch index is in gridDim.x."""
    rng = np.random.default_rng(5)
    n = rng.integers(1, 9, size=70_000)
    mats = [cupy.asarray(m) for m in spd_list(n, np.float64, rng)]
    res = _rt().cholesky(mats).result()
    assert res.info.shape == (70_000,) and not res.info.any()
    assert len(res.plan.launches) == 1 and res.plan.launches[0].count == 70_000
    host = [m.get() for m in mats]
    facs = res.factors
    for i in range(0, 70_000, 97):  # every 97th, plus the last
        check_factor(host[i], facs[i], np.float64, where=f"problem {i}")
    check_factor(host[-1], facs[-1], np.float64)


def test_gather_and_scatter_for_cupy_lists(cupy):
    rng = np.random.default_rng(6)
    host = spd_list([3, 0, 17, 64, 1], np.float64, rng)
    # One C-contiguous, one Fortran-ordered, one a strided view: gather handles any strides.
    mats = [cupy.asarray(m) for m in host]
    mats[2] = cupy.asfortranarray(mats[2])
    big = cupy.zeros((128, 128))
    big[::2, ::2] = mats[3]
    mats[3] = big[::2, ::2]
    res = _rt().cholesky(mats, overwrite=True).result()
    assert all(f is m for f, m in zip(res.factors, mats))
    for a, m in zip(host, mats):
        check_factor(a, m.get(), np.float64)
    assert not cupy.any(big[1::2, :]), "scatter wrote outside the strided view"


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.complex64])
def test_assemble_moves_every_dtype(cupy, dtype):
    """Backend.assemble (copy.cu's put): its target zeroed, then every value where the index
    says, from strided values, more of them than the grid has threads (its stride loop); an
    empty index leaves zeros."""
    b = _rt().backend
    rng = np.random.default_rng(5)
    n = 1_500_000
    src = rng.standard_normal(2 * n) + (1j * rng.standard_normal(2 * n)
                                        if np.dtype(dtype).kind == "c" else 0)
    src = src.astype(dtype)
    dst = cupy.full(3 * n, 7, dtype)
    at = rng.permutation(3 * n)[:n]  # (n over 8192 blocks of 256 threads)
    b.assemble(dst, cupy.asarray(at), cupy.asarray(src)[::2])
    want = np.zeros(3 * n, dtype)
    want[at] = src[::2]
    assert np.array_equal(dst.get(), want)
    b.assemble(dst, cupy.zeros(0, np.int64), cupy.zeros(0, dtype))
    assert not dst.any()


@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_lists_of_one_order_are_packed_in_it(cupy, order, overwrite):
    """Arrays all column-major (a batch's views, Fortran-ordered arrays) are gathered into a
    column-major buffer, row-major ones into a row-major one; matrices past one block's share
    (4,096 elements) are copied by several blocks; 1 x 1 and empty ones in between. Inputs stay
    unmodified unless overwritten, and a factor comes back in its input's order."""
    rng = np.random.default_rng(11)
    ns = [0, 1, 31, 32, 33, 64, 65, 300, 513, 2]
    host = spd_list(ns, np.float64, rng)
    mats = [cupy.array(m, order=order) for m in host]
    kept = [m.copy() for m in mats]
    rt = _rt()
    from vbatch.core.batch import MatrixList

    assert MatrixList(mats=mats, square=True).packed_order == order
    res = rt.cholesky(mats, overwrite=overwrite).result()
    assert not res.info.any()
    for i, (a, f) in enumerate(zip(host, res.factors)):
        check_factor(a, f.get(), np.float64, where=f"problem {i}")
        if ns[i] > 1:
            assert f.flags.f_contiguous == (order == "F"), f"problem {i}: order of the factor"
    for i, (m, k0) in enumerate(zip(mats, kept)):
        if overwrite:
            assert res.factors[i] is m
        else:
            assert cupy.array_equal(m, k0), f"problem {i}: input modified"


def test_non_spd_isolation_on_device_inputs(cupy):
    rng = np.random.default_rng(7)
    good = spd_list([40, 700, 33, 90], np.float64, rng)
    bad = [m.copy() for m in good]
    bad[1] = make_indefinite(good[1], 650)  # in a separated-path panel
    bad[2] = make_indefinite(good[2], 32)
    res = _rt().cholesky([cupy.asarray(m) for m in bad]).result()
    assert res.info.tolist() == [0, 651, 33, 0]
    assert res.info.tolist() == [reference(m)[1] for m in bad]
    ok = _rt().cholesky([cupy.asarray(m) for m in good]).result()
    for i in (0, 3):
        assert cupy.array_equal(res.factors[i], ok.factors[i])


def test_streams_and_dependencies(cupy):
    """Partial factorizations with several chains run on several streams; a dependent
    submission waits for its dependency on the device."""
    rng = np.random.default_rng(8)
    ns = [64, 64, 200, 200, 90, 300]
    npiv = [64, 32, 40, 40, 90, 100]
    mats = spd_list(ns, np.float64, rng)
    rt = _rt(streams=4)
    f1 = rt.cholesky([cupy.asarray(m) for m in mats], npiv)
    plan = f1.result().plan
    assert plan.nstreams > 1
    for i, (a, f) in enumerate(zip(mats, f1.result().factors)):
        check_factor(a, f, np.float64, npiv[i])

    # f3 factors what f2 wrote in place. Had it run early it would see the SPD inputs and
    # produce their factors; run after f2 it sees lower-triangular factors instead. f2 is held
    # behind a gate on its stream and f3 is issued from another stream, so only the device
    # wait on f2 can order them, whatever the machine's speed.
    # (A device-wide synchronization while they are issued, such as CuPy's memory pool
    # freeing its cache when the GPU's memory runs short under parallel test processes, lets
    # the gate's stream drain, after the gate's 10 s bound: the ordering is then not
    # exercised, and the setup is tried again; the check on f3's result never is.)
    first, other = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    for _ in range(3):
        work = [cupy.asarray(m) for m in mats]
        gate = Gate(cupy, limit=10)
        try:
            gate.close(first)
            with first:
                f2 = rt.cholesky(work, overwrite=True)
            with other:
                f3 = rt.cholesky(work, after=[f2])
            held = not f2.done()
        finally:
            gate.open()
        rt.wait()
        if held:
            break
    assert held, "f2 was done before f3 was issued, in three tries: the order went untested"
    assert f2.done() and f3.done()
    r3 = f3.result()
    direct = _rt().cholesky([w.copy() for w in work]).result()
    early = _rt().cholesky([cupy.asarray(m) for m in mats]).result()
    assert r3.info.tolist() == direct.info.tolist()
    for i in np.flatnonzero(r3.info == 0):
        assert cupy.array_equal(r3.factors[i], direct.factors[i])
        assert not cupy.allclose(r3.factors[i], early.factors[i])


def test_unsupported_nb_is_rejected(cupy):
    from vbatch import InputError

    with pytest.raises(InputError, match=r"supports nb in \(8, 16, 32\), got 64"):
        _rt(nb=64).cholesky([np.eye(3)])


def test_a_launch_the_grid_cannot_hold_is_refused_at_submit(cupy, monkeypatch):
    """A trailing block of 23,200 rows needs 66,066 Schur tile pairs in gridDim.y (limit 65,535):
    named at submit, before any work (it used to arrive through result()). A broadcast array
    stands in for the 4.3 GB matrix."""
    from vbatch import InputError
    from vbatch.kernels.cuda import CudaBackend

    touched = []
    monkeypatch.setattr(CudaBackend, "begin", lambda *a, **k: touched.append(a))
    big = np.broadcast_to(np.float64(1.0), (23200, 23200))
    with pytest.raises(InputError, match=r"problem 1: its trailing block \(23200 x 23200: "
                                         r"n = 23200, npiv = 0\) needs 66066 tile pairs"):
        _rt().cholesky([np.eye(3), big], npiv=[3, 0])
    assert not touched


def test_repeated_packed_calls_replay_the_first(cupy):
    """A packed batch factored again takes the replay road (runtime/prepared.py) and the pointer
    tables fixed on the device (kernels/cuda.py): results equal the first call's, with results
    kept alive (new outputs each time), several calls in flight (several info slots), in place,
    and a host sibling of the batch (same cache) still going through the general path."""
    rng = np.random.default_rng(21)
    ns = [0, 1, 7, 31, 32, 33, 64, 100, 5]
    mats = spd_list(ns, np.float64, rng)
    mats[7] = make_indefinite(mats[7], 40)
    host = pack(mats, order="F")
    dev = host.with_data(cupy.asarray(host.data))
    before = dev.data.copy()
    rt = _rt()
    first = rt.cholesky(dev).result()
    assert first.info[7] == 41 and not np.delete(first.info, 7).any()
    kept = [rt.cholesky(dev).result() for _ in range(4)]
    # Three in flight together, behind a gate: three info slots. (Tried again where a
    # device-wide synchronization while they were issued let the gate go: see
    # test_streams_and_dependencies.)
    for _ in range(3):
        gate = Gate(cupy, limit=10)
        try:
            gate.close(cupy.cuda.get_current_stream())
            futs = [rt.cholesky(dev) for _ in range(3)]
            held = not any(f.done() for f in futs)
            slots = len({id(f._completion._slot) for f in futs})
        finally:
            gate.open()
        if held:
            break
    assert held and slots == 3, (held, slots)
    kept += [f.result() for f in futs]
    kept.append(rt.cholesky(host).result())  # numpy data: uploaded, host result
    def same(r):  # the factor where it is specified: problem 7's columns before its failure
        np.testing.assert_array_equal(r.info, first.info)
        for i in range(len(ns)):
            want, got = to_host(first.factors.matrix(i)), to_host(r.factors.matrix(i))
            cols = 40 if i == 7 else ns[i]
            np.testing.assert_array_equal(got[:, :cols], want[:, :cols])

    for r in kept:
        same(r)
    assert type(kept[-1].factors.data) is np.ndarray
    # outputs are new buffers (each call's own while the results are kept)
    assert len({r.factors.data.data.ptr for r in kept[:-1]}) == len(kept) - 1
    assert cupy.array_equal(dev.data, before)  # the input is never written
    for i, a in enumerate(mats):
        if i != 7:
            check_factor(a, first.factors.matrix(i), np.float64)
    # From the second replay on, the calls went through the backend's fire (Backend.replayer),
    # which takes the buffers' addresses from each call: a batch of the same layout over other
    # data (with_data: the same cache, so the same replay entry) is factored from its own data.
    (entry,) = [p for p in rt._calls.values() if p.op.name == "potrf"]
    fire, fired = entry._fire, []
    assert fire

    def counted(datas):
        done = fire(datas)
        fired.append(done is not None)
        return done

    entry._fire = counted
    mats2 = spd_list(ns, np.float64, rng)
    sib = dev.with_data(cupy.asarray(pack(mats2, order="F").data))
    for _ in range(3):
        r2 = rt.cholesky(sib).result()
        assert not r2.info.any()
        for i, a in enumerate(mats2):
            check_factor(a, r2.factors.matrix(i), np.float64)
    assert fired == [True] * 3  # each call ran through fire, none fell back to run()
    work = dev.with_data(dev.data.copy())
    for _ in range(2):  # in place, twice on fresh copies of the input
        work.data[...] = before
        r = rt.cholesky(work, overwrite=True).result()
        assert r.factors is work
        same(r)


def test_slot_pool_under_many_threads(cupy):
    """Many threads taking and giving back slots at once, with the interpreter switching
    threads as often as it can: no error, and every slot taken is handed out once at a time.
    (The in-flight list's rebuild raised "deque mutated during iteration" when another thread
    appended meanwhile: 64 submitting threads, H100, 2026-11-25.)"""
    import sys
    import threading

    from vbatch.kernels.cuda import _SlotPool

    pool = _SlotPool()
    errors, held = [], set()
    lock = threading.Lock()
    start = threading.Barrier(16, timeout=60)

    def worker():
        try:
            start.wait()
            for _ in range(300):
                s = pool.take(4, 3)
                with lock:
                    assert id(s) not in held, "a slot handed out twice at once"
                    held.add(id(s))
                s.event.record()
                pool.track(s)
                with lock:
                    held.discard(id(s))
                pool.give(s)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "liveness guard: a thread never finished"
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]
    assert len(pool._inflight) <= 64 + 16


def test_slot_pool_keeps_a_running_slot(cupy):
    """A slot whose call is still running stays in the in-flight list however many finished
    calls follow it; one taken but not yet recorded is not in it, so its previous call's
    finished event cannot get it forgotten; and a loop of submit-then-wait,
    which takes the same slot back each call, still running when tracked, keeps it in the list
    once (it was appended every call, without end)."""
    from vbatch.kernels.cuda import _SlotPool

    gate = Gate(cupy)
    busy = cupy.cuda.Stream(non_blocking=True)
    pool = _SlotPool()
    slow = pool.take(4, 3)
    slow.event.record()  # an old call's event, done
    slow.event.synchronize()
    fresh = pool.take(4, 3)  # (taken: not tracked until recorded)
    assert fresh not in pool._inflight
    # Distinct slots (none given back), each finished when tracked; taken before the gate
    # closes, and no collection while it is closed: allocating pinned memory, or freeing an
    # earlier test's, can wait for the device, which the closed gate holds (with the slots
    # taken inside the loop, the loop outlived the gate's 120 s after some orders of tests).
    kept = [pool.take(4, 3) for _ in range(200)]
    gc.collect()
    gc.disable()
    try:
        gate.close(busy)  # the running call: its event is recorded behind the gate
        slow.event.record(busy)
        pool.track(slow)
        for s in kept:
            s.event.record()
            s.event.synchronize()
            pool.track(s)
        assert not slow.event.done, "the gate gave up (its 120 s liveness bound)"
        assert sum(s is slow for s in pool._inflight) == 1, "the running slot, once"
        assert len(pool._inflight) <= 64 + 1, f"{len(pool._inflight)} slots kept"
    finally:
        gate.open()
        gc.enable()
    # submit-then-wait: the slot is still running (behind a closed gate) when tracked
    loop = _SlotPool()
    for _ in range(300):
        s = loop.take(4, 3)
        try:
            gate.close(busy)
            s.event.record(busy)
            loop.track(s)
            assert not s.event.done, "the gate did not hold the stream"
        finally:
            gate.open()
        loop.give(s)
    assert len(loop._inflight) == 1, f"{len(loop._inflight)} entries for one slot"


def test_futures_dropped_unread_give_their_slots_back(cupy, monkeypatch):
    """Submits whose futures are dropped unread (a pipeline waited for by Runtime.wait) hand
    their slots back once their calls are done: 200 such calls make far fewer slots than 200
    (each made one before), and a call after them, on a slot whose last call failed, reports
    its own info and factors."""
    import vbatch.kernels.cuda as kc

    made = []

    class Counting(kc._Slot):
        __slots__ = ()

        def __init__(self, k, nptr):
            made.append(1)
            super().__init__(k, nptr)

    monkeypatch.setattr(kc, "_Slot", Counting)
    rng = np.random.default_rng(3)
    good = spd_list([8, 40, 3], np.float64, rng)
    bad = [make_indefinite(good[0], 2)] + good[1:]
    rt = _rt()
    pb, pg = (pack(m, order="F") for m in (bad, good))
    pb, pg = (b.with_data(cupy.asarray(b.data)) for b in (pb, pg))
    for _ in range(200):
        rt.cholesky(pb)
    rt.wait()
    res = rt.cholesky(pg).result()
    assert len(made) <= 100, f"{len(made)} slots made for 201 calls"
    assert res.info.tolist() == [0, 0, 0]
    for a, f in zip(good, res.factors.unpack()):
        check_factor(a, to_host(f), np.float64)


@pytest.mark.gpu
def test_host_batches_cross_through_the_pinned_chunks(cupy, monkeypatch):
    """Host arrays past STAGE_MIN bytes go up and come back through two pinned buffers, a
    chunk at a time (here 1,000 bytes: many chunks, elements split between two, a short last
    one), or in one copy from and to pinned memory: a host packed batch's factors, in place or
    not, and a host list's solutions are LAPACK's; inputs not overwritten are left as they
    were."""
    from vbatch.kernels import cuda as kc

    monkeypatch.setattr(kc, "STAGE_MIN", 0)
    monkeypatch.setattr(kc, "STAGE_CHUNK", 1000)
    rt = _rt()
    monkeypatch.setattr(rt.backend, "_staging", {})  # (buffers of the chunk set here)
    rng = np.random.default_rng(8)
    ns = [0, 1, 5, 31, 33, 64]
    mats = spd_list(ns, np.float64, rng)
    for order in ("F", "C"):
        packed = pack(mats, order=order)
        before = packed.data.copy()
        res = rt.cholesky(packed).result()
        assert isinstance(res.factors.data, np.ndarray) and not res.info.any()
        np.testing.assert_array_equal(packed.data, before)
        for i, a in enumerate(mats):
            check_factor(a, res.factors.matrix(i), np.float64)
        same = rt.cholesky(packed, overwrite=True).result()
        assert same.factors is packed
        for i, a in enumerate(mats):
            check_factor(a, packed.matrix(i), np.float64)
    rhs = [rng.standard_normal((n, 3)) for n in ns]
    x = rt.posv(mats, rhs).result()
    for a, b, xi in zip(mats, rhs, x.solutions):
        assert np.linalg.norm(a @ xi - b) <= 1e-10 * (1 + np.linalg.norm(b)) * max(len(a), 1)
    # A batch in pinned memory already crosses in one copy each way.
    packed = pack(mats, order="F")
    assert not kc._pinned(packed.data)
    pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(packed.data.nbytes), np.float64,
                           packed.data.size)
    pinned[...] = packed.data
    assert kc._pinned(pinned)
    host = packed.with_data(pinned)
    res = rt.cholesky(host).result()
    for i, a in enumerate(mats):
        check_factor(a, res.factors.matrix(i), np.float64)
    assert rt.cholesky(host, overwrite=True).result().factors is host
    for i, a in enumerate(mats):
        check_factor(a, host.matrix(i), np.float64)
