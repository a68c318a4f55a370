"""The submit-and-wait contract: futures, dependencies, wait(), devices, plan reuse."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import vbatch
from vbatch import DependencyError, Runtime
from vbatch.core import jit
from vbatch.kernels.cpu import CpuBackend
from vbatch.ops.generate import spd_list
from _check import check_factor, count_staged, plan_npiv
from conftest import DEVICES
from vbatch.runtime.device import cuda_status


def batch(seed=0, ns=(5, 40, 17, 64)):
    return spd_list(ns, np.float64, np.random.default_rng(seed))


@pytest.fixture
def journal(monkeypatch):
    """Records, in the order they happen, when each submission's execution begins and ends (per
    plan object): a counter under a lock, never a clock. ``hold`` (plan id -> Event) keeps a
    submission in its begin until the event is set (plan id -> a function: called there)."""
    events = []
    hold: dict = {}
    lock = threading.Lock()
    begin, end = CpuBackend.begin, CpuBackend.end

    def spy_begin(self, plan, buffers, config, scalars=None):
        with lock:
            events.append(("begin", id(plan)))
            gate = hold.get(id(plan))
        if callable(gate):  # a callback, not a gate
            gate()
        elif gate is not None:
            assert gate.wait(60), "liveness guard: the gate was never opened"
        return begin(self, plan, buffers, config, scalars)

    def spy_end(self, ex):
        with lock:
            events.append(("end", id(ex.plan)))
        return end(self, ex)

    monkeypatch.setattr(CpuBackend, "begin", spy_begin)
    monkeypatch.setattr(CpuBackend, "end", spy_end)
    # Every call on the worker thread (a small one with nothing queued would run in the caller's:
    # test_a_small_cpu_call_runs_in_the_callers_thread_unless_work_is_queued).
    monkeypatch.setattr(Runtime, "INLINE_FLOPS", -1)
    return events, hold


def test_the_cpu_backends_blas_count_is_set_from_every_thread():
    """The CPU backend runs a launch on its runtime's worker thread (or the caller's), with its
    BLAS at one thread while several problems run at once. threadpoolctl 3.8 lets only the first
    thread that sets a pthreads OpenBLAS's count set it again while that thread lives: a second
    runtime's narrowing then did nothing, behind the first one's idle worker, and its calls ran
    at a third of the speed with the BLAS's own threads inside its workers."""
    from vbatch.kernels.lapack import BlasThreads

    blas = BlasThreads()
    if not blas._libs or max(blas._orig) < 2:
        pytest.skip("the BLAS runs one thread here: nothing to narrow")

    def cycle(out):
        blas.narrow()
        out.append([lc.get_num_threads() for lc in blas._libs])
        blas.restore()
        out.append([lc.get_num_threads() for lc in blas._libs])

    first, second, done, hold = [], [], threading.Event(), threading.Event()

    def idle_worker():  # (sets the count once, then lives on, as a runtime's worker does)
        cycle(first)
        done.set()
        hold.wait(30)

    a = threading.Thread(target=idle_worker, daemon=True)
    a.start()
    assert done.wait(30)
    b = threading.Thread(target=cycle, args=(second,))
    b.start()
    b.join(30)
    hold.set()
    a.join(30)
    one = [1] * len(blas._libs)
    assert first == [one, blas._orig]
    assert second == [one, blas._orig], "a second thread's narrowing did nothing"


def test_the_cpu_backend_gives_back_the_callers_blas_limit():
    """A caller's own limit (a threadpool_limits block around its calls) is as it was after a
    launch narrowed the BLAS from another thread, and the block's end sets its counts back."""
    from threadpoolctl import threadpool_limits

    from vbatch.kernels.lapack import BlasThreads

    blas = BlasThreads()
    if not blas._libs or max(blas._orig) < 2:
        pytest.skip("the BLAS runs one thread here: nothing to narrow")
    counts = lambda: [lc.get_num_threads() for lc in blas._libs]  # noqa: E731
    with threadpool_limits(limits=1, user_api="blas"):
        t = threading.Thread(target=lambda: (blas.narrow(), blas.restore()))
        t.start()
        t.join(30)
        assert counts() == [1] * len(blas._libs), "the caller's limit was not given back"
    assert counts() == blas._orig, "the caller's block did not set its counts back"


def test_the_cpu_backend_controls_the_blas_it_calls():
    """The backend's thread control covers scipy's BLAS (the one its LAPACK calls go to) even
    where scipy.linalg was not imported before the first runtime: only numpy's was found then."""
    code = ("import threadpoolctl, numpy\n"
            "from vbatch.kernels.lapack import BlasThreads\n"
            "found = len(BlasThreads()._libs)\n"
            "import scipy.linalg.cython_lapack\n"
            "ctl = threadpoolctl.ThreadpoolController()\n"
            "print(found, len([lc for lc in ctl.lib_controllers if lc.user_api == 'blas']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    assert out[0] == out[1], f"{out[0]} of the {out[1]} BLAS libraries loaded"


def test_after_holds_a_submission_until_its_dependencies_finish(journal, monkeypatch):
    """Two runtimes have two workers, so only the dependency can order them. The first is held
    in its begin until the second's worker waits for it (as it must) or, were the dependency
    lost, the second begins: then the second begins while the first is held, and the order
    shows it whatever the machine's speed."""
    events, hold = journal
    rt1, rt2 = Runtime("cpu", nb=8), Runtime("cpu", nb=8)
    b1, b2 = batch(1), batch(2)
    p1, p2 = rt1.plan_for("potrf", batch=b1), rt2.plan_for("potrf", batch=b2)
    release = threading.Event()
    hold[id(p1)] = release
    hold[id(p2)] = release.set
    f1 = rt1.cholesky(b1)
    real = vbatch.Future.exception

    def waited(self, timeout=None):
        if self is f1 and threading.current_thread() is not threading.main_thread():
            release.set()  # the second's worker waits on the first
        return real(self, timeout)

    monkeypatch.setattr(vbatch.Future, "exception", waited)
    f2 = rt2.cholesky(b2, after=[f1])
    r2, r1 = f2.result(), f1.result()
    assert (r1.plan, r2.plan) == (p1, p2)
    assert events.index(("begin", id(p2))) > events.index(("end", id(p1)))
    assert r1.ok and r2.ok


def test_independent_submissions_are_not_serialized_across_runtimes(journal):
    """The first is held in its begin until the second has begun: only if the two run side by
    side does the first ever finish (a serialized pair trips the liveness guard)."""
    events, hold = journal
    rt1, rt2 = Runtime("cpu", nb=8), Runtime("cpu", nb=8)
    b1, b2 = batch(1), batch(2)
    p1, p2 = rt1.plan_for("potrf", batch=b1), rt2.plan_for("potrf", batch=b2)
    assert p1 is not p2
    second = threading.Event()
    hold[id(p1)] = second
    real = CpuBackend.begin

    def begun(self, plan, *a, **kw):
        if plan is p2:
            second.set()
        return real(self, plan, *a, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(CpuBackend, "begin", begun)
        f1, f2 = rt1.cholesky(b1), rt2.cholesky(b2)
        r1, r2 = f1.result(), f2.result()
    assert (r1.plan, r2.plan) == (p1, p2)
    assert events.index(("begin", id(p2))) < events.index(("end", id(p1)))  # they overlapped


def test_a_failed_dependency_fails_its_dependents(monkeypatch):
    rt = Runtime("cpu", nb=8)
    calls = {"n": 0}
    real = CpuBackend.launch

    def flaky(self, ex, lc):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device lost")
        return real(self, ex, lc)

    monkeypatch.setattr(CpuBackend, "launch", flaky)
    f1 = rt.cholesky(batch(1))
    f2 = rt.cholesky(batch(2), after=f1)
    with pytest.raises(RuntimeError, match="device lost"):
        f1.result()
    with pytest.raises(DependencyError, match=r"after\[0\] failed"):
        f2.result()
    assert isinstance(f2.exception(), DependencyError)


def test_wait_waits_for_everything():
    rt = Runtime("cpu", nb=8)
    futs = [rt.cholesky(batch(s)) for s in range(5)]
    rt.wait()
    assert all(f.done() for f in futs)
    assert all(f.result().ok for f in futs)


def test_runtime_as_context_manager_drains_on_exit():
    with Runtime("cpu") as rt:
        f = rt.cholesky(batch())
    assert f.done() and f.result().ok


def test_module_level_cholesky_uses_the_default_runtime():
    """The default runtime is the auto device's: CUDA where a GPU is usable, else the CPU."""
    res = vbatch.cholesky(batch()).result()
    assert res.ok and res.plan is vbatch.default_runtime().plan_for("potrf", batch=batch())
    assert vbatch.default_runtime().device == ("cuda" if cuda_status()[0] else "cpu")


def test_auto_device_follows_gpu_availability():
    usable, _ = cuda_status()
    assert Runtime("auto").device == ("cuda" if usable else "cpu")


@pytest.mark.skipif(cuda_status()[0], reason="checks the no-GPU message")
def test_cuda_without_a_gpu_says_why():
    with pytest.raises(RuntimeError, match="device='cuda' was asked for, but"):
        Runtime("cuda")


def test_a_packed_batch_is_planned_once():
    rt = Runtime("cpu", nb=8)
    packed = vbatch.pack(batch())
    p1 = rt.cholesky(packed).result().plan
    p2 = rt.cholesky(packed).result().plan
    assert p1 is p2
    p3 = rt.cholesky(packed, [1, 2, 3, 4]).result().plan
    assert p3 is not p1 and plan_npiv(p3).tolist() == [1, 2, 3, 4]
    # A list of the same sizes is planned by its signature: the same plan again.
    assert rt.cholesky(batch()).result().plan is p1
    assert rt.cholesky(batch(), [1, 2, 3, 4]).result().plan is p3
    assert Runtime("cpu", nb=16).cholesky(packed).result().plan.nb == 16


def test_layout_dependent_defaults_get_their_own_options(monkeypatch):
    """A backend whose defaults depend on the batch's layout (a kernel module's
    layout_defaults) gets one options mapping per layout that changes them; layouts that
    change nothing share the mapping of order None; the plans of the two layouts are apart.
    The mappings are read-only: options come through the Config alone. (The CPU backend has
    no layout defaults: one mapping, one plan.)"""
    from vbatch.kernels import potrf_cpu

    rt = Runtime("cpu")
    assert rt.plan_options("float64", "potrf", "C") is rt.plan_options("float64", "potrf")
    assert rt.plan_options("float64", "potrf", "F") is rt.plan_options("float64", "potrf")
    monkeypatch.setattr(potrf_cpu, "layout_defaults",
                        lambda dtype, order: {"nb": 8} if order == "C" else {}, raising=False)
    rt = Runtime("cpu", fused_max_rows=7)
    plain = rt.plan_options("float64", "potrf")
    with pytest.raises(TypeError):
        plain["fused_max_rows"] = 9  # read-only
    f = rt.plan_options("float64", "potrf", "F")
    c = rt.plan_options("float64", "potrf", "C")
    assert f is plain and f["fused_max_rows"] == 7 and c["fused_max_rows"] == 7
    assert c is not plain and c["nb"] == 8 and plain["nb"] != 8
    mats = [np.eye(3) * 2.0, np.eye(5) * 3.0]
    plan_c = rt.plan(vbatch.pack(mats, order="C"))
    plan_f = rt.plan(vbatch.pack(mats, order="F"))
    assert plan_c.nb == 8 and plan_f.nb == plain["nb"]
    # a config's value holds for every layout (the layouts then agree: one dict)
    rt = Runtime("cpu", nb=16)
    assert rt.plan_options("float64", "potrf", "C") is rt.plan_options("float64", "potrf")
    assert rt.plan_options("float64", "potrf", "C")["nb"] == 16


def test_result_reports_failures():
    mats = batch()
    mats[2] = -mats[2]
    res = Runtime("cpu").cholesky(mats).result()
    assert not res.ok and res.failed().tolist() == [2] and res.info[2] == 1


def test_plan_is_inspectable_before_running():
    rt = Runtime("cpu", nb=16, policy="ssde")
    plan = rt.plan(batch())
    assert plan.policy == "ssde" and plan.nb == 16
    for q in range(4):  # SSDE: every problem starts at level 0
        assert plan.tasks.level[plan.tasks.problem == q].min() == 0
    assert "ssde plan, nb=16" in plan.table()


def fail_once(monkeypatch, device: str, method: str, exc: BaseException) -> None:
    """The backend's ``method`` raises ``exc`` on its first call, then works as usual."""
    from vbatch.kernels import get_backend

    backend = type(get_backend(device))
    real = getattr(backend, method)
    calls = {"n": 0}

    def failing_once(self, *args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise exc
        return real(self, *args)

    monkeypatch.setattr(backend, method, failing_once)


def _device_list(mats, device):
    if device == "cuda":
        import cupy

        return [cupy.asarray(m) for m in mats]
    return mats


@pytest.mark.parametrize("device", DEVICES)
def test_a_chain_after_a_failed_future_raises_dependency_error(device, monkeypatch):
    """f1 fails in building its result (after its work was enqueued); f2 ordered after it and
    f3 after f2 raise DependencyError on every backend. On CUDA, f2's device input used to be
    ordered on the device only, so it ran and returned as if nothing had failed."""
    fail_once(monkeypatch, device, "export", RuntimeError("lost the result"))
    rt = Runtime(device)
    f1 = rt.cholesky(batch(1))  # a host list: its result is exported to the host
    f2 = rt.cholesky(_device_list(batch(2), device), after=[f1])
    f3 = rt.cholesky(_device_list(batch(3), device), after=f2)
    with pytest.raises(DependencyError, match=r"after\[0\] failed: DependencyError"):
        f3.result()
    with pytest.raises(DependencyError, match=r"after\[0\] failed: RuntimeError\('lost the "
                                              r"result'\)"):
        f2.result()
    with pytest.raises(RuntimeError, match="lost the result"):
        f1.result()
    f4 = rt.cholesky(_device_list(batch(4), device), after=[f3])  # known failed at submit
    with pytest.raises(DependencyError):
        f4.result()
    assert rt.cholesky(batch(5)).result().ok  # the runtime itself is fine


@pytest.mark.parametrize("device", DEVICES)
def test_an_exception_mid_call_leaves_the_batch_usable(device, monkeypatch):
    """A call that raises between its first and last backend step must not leave anything
    held: the next call on the same packed batch runs (it deadlocked on CUDA, whose batch lock
    was taken in begin and released in end)."""
    packed = vbatch.pack(batch(6))
    if device == "cuda":
        import cupy

        packed = packed.with_data(cupy.asarray(packed.data))
    rt = Runtime(device)
    fail_once(monkeypatch, device, "launch_all", RuntimeError("launch failed"))
    with pytest.raises(RuntimeError, match="launch failed"):
        rt.cholesky(packed).result()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("res", rt.cholesky(packed).result()),
                         daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the second call on the batch hung"
    res = out["res"]
    assert res.ok
    host = res.factors.with_data(res.factors.data.get()) if device == "cuda" else res.factors
    for i, a in enumerate(batch(6)):
        assert np.allclose(host.matrix(i), np.linalg.cholesky(a))


def test_options_come_from_arguments_then_the_environment_then_the_defaults(monkeypatch):
    """One channel, one precedence (runtime/config.py): an argument (or a field a config object
    sets) beats VBATCH_<FIELD>, which beats the defaults; a bad environment value is named
    with its variable, before any work; kernel_options reach the plan, and a name no kernel
    family plans with is refused."""
    from vbatch import Config, InputError

    monkeypatch.setenv("VBATCH_NB", "24")
    monkeypatch.setenv("VBATCH_POLICY", "ssde")
    monkeypatch.setenv("VBATCH_COALESCE_US", "none")
    rt = Runtime("cpu")
    assert (rt.config.nb, rt.config.policy, rt.config.coalesce_us) == (24, "ssde", None)
    assert rt.plan_options("float64")["nb"] == 24
    assert Runtime("cpu", nb=16).config.nb == 16
    assert Runtime("cpu", config=Config(nb=8)).config.nb == 8
    assert Runtime("cpu", config=Config(tuned=False)).config.policy == "ssde"  # (not set there)
    monkeypatch.setenv("VBATCH_NB", "many")
    with pytest.raises(InputError, match=r"VBATCH_NB='many': Input should be a valid integer"):
        Runtime("cpu")
    monkeypatch.delenv("VBATCH_NB")
    monkeypatch.delenv("VBATCH_POLICY")
    monkeypatch.setenv("VBATCH_KERNEL_OPTIONS", '{"blas_nb": 64}')
    assert Runtime("cpu").plan_options("float64", "potrs")["blas_nb"] == 64
    with pytest.raises(InputError, match=r"kernel_options: unknown option 'no_such'"):
        Runtime("cpu", kernel_options={"no_such": 1})
    with pytest.raises(InputError, match=r"kernel_options: unknown option 'nb'"):
        Runtime("cpu", kernel_options={"nb": 8})  # a Config field: set as one


def test_the_suite_never_reads_the_users_tune_file():
    """tests/conftest.py points VBATCH_TUNE_FILE away from ~/.cache and clears VBATCH_*."""
    import os

    from vbatch.runtime.tune import file_path

    path = file_path(Runtime("cpu").config.tune_file)
    assert path == file_path(os.environ["VBATCH_TUNE_FILE"]) and ".cache" not in path.parts
    assert not path.exists()
    from vbatch import Config

    assert not [k for k in os.environ if k.startswith("VBATCH_") and k != "VBATCH_TUNE_FILE"
                and k[len("VBATCH_"):].lower() in Config.model_fields]


def test_kept_calls_from_many_threads_evict_without_error():
    """Threads calling with new packed batches fill and evict the runtime's kept calls at
    once: every call gives its own factor, and a kept call's batch is never another's."""
    rt = Runtime("cpu")
    rt.KNOWN = 4
    rng = np.random.default_rng(3)
    mats = spd_list([1, 5, 33], np.float64, rng)
    want = [np.linalg.cholesky(a) for a in mats]
    errors: list = []

    def work(seed: int) -> None:
        try:
            for i in range(25):
                packed = vbatch.pack([a * (1 + (seed + i) % 3) for a in mats])
                res = rt.cholesky(packed).result(timeout=60)
                for j, w in enumerate(want):
                    got = np.asarray(res.factors.matrix(j))
                    scale = np.sqrt(1 + (seed + i) % 3)
                    assert np.allclose(np.tril(got), w * scale, atol=1e-10), (seed, i, j)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert len(rt._calls) <= rt.KNOWN


def test_a_small_cpu_call_runs_in_the_callers_thread_unless_work_is_queued(journal, monkeypatch):
    """Runtime.INLINE_FLOPS: a small call with nothing queued runs where it is made (its future
    done on return); behind a queued call it goes to the worker, and the two run in order."""
    events, hold = journal
    monkeypatch.setattr(Runtime, "INLINE_FLOPS", 1 << 18)
    where = []
    hold_fn = lambda: where.append(threading.current_thread())  # noqa: E731
    rt = Runtime("cpu")
    small, big = batch(3), spd_list([90, 90], np.float64, np.random.default_rng(4))
    ps, pb = rt.plan_for("potrf", batch=small), rt.plan_for("potrf", batch=big)
    assert ps.flops() <= Runtime.INLINE_FLOPS < pb.flops()
    hold[id(ps)] = hold_fn
    f = rt.cholesky(small)
    assert f.done() and where == [threading.current_thread()]
    release = threading.Event()
    hold[id(pb)] = release
    fb = rt.cholesky(big)  # held on the worker
    fs = rt.cholesky(small)  # queued behind it
    assert not fs.done()
    release.set()
    for fut, mats in ((fb, big), (fs, small), (f, small)):
        res = fut.result(timeout=60)
        assert not res.info.any()
        for a, f_ in zip(mats, res.factors):
            check_factor(a, f_, np.float64)
    assert where[1] is not threading.current_thread()
    order = [e for e in events if e[1] in (id(ps), id(pb))]
    assert order[2:] == [("begin", id(pb)), ("end", id(pb)), ("begin", id(ps)), ("end", id(ps))]


def test_a_cpu_call_with_little_arithmetic_but_much_memory_goes_to_the_worker(journal,
                                                                              monkeypatch):
    """Runtime.INLINE_ELEMENTS: a GEMM of k = 0 (no flops) writing a 300 x 300 output is not
    run in the caller's thread; a closed runtime refuses a small call as a large one."""
    events, hold = journal
    monkeypatch.setattr(Runtime, "INLINE_FLOPS", 1 << 18)
    rt = Runtime("cpu")
    a, b = [np.ones((300, 0))], [np.ones((0, 300))]
    where = []
    plan = rt.plan_for("gemm", a=a, b=b)
    assert plan.flops() == 0
    hold[id(plan)] = lambda: where.append(threading.current_thread())
    out = rt.gemm(a, b).result(timeout=60)
    assert where and where[0] is not threading.current_thread()
    np.testing.assert_array_equal(out[0], np.zeros((300, 300)))
    rt.close()
    for mats in (batch(3), spd_list([90, 90], np.float64, np.random.default_rng(4))):
        with pytest.raises(RuntimeError, match="closed"):
            rt.cholesky(mats)


def test_a_list_call_is_kept_the_second_time_its_sizes_come():
    """A stream of lists of new sizes keeps no call (each would hold its plan); the second
    list of one set of sizes is kept, and the third runs it."""
    rt = Runtime("cpu")
    rng = np.random.default_rng(5)
    for n in range(1, 6):
        rt.cholesky(spd_list([n, n + 2], np.float64, rng)).result()
    assert not rt._calls
    for i in range(3):
        mats = spd_list([3, 9], np.float64, rng)
        res = rt.cholesky(mats).result()
        for a, f in zip(mats, res.factors):
            check_factor(a, f, np.float64)
        assert len(rt._calls) == (1 if i else 0)


def test_a_small_partial_factorization_replays_on_the_cpu():
    """A partial Cholesky of small problems folds each one's Schur task into its one panel
    task, which leaves the schur launch with no work: the backend's replayer passes over it
    (giving up there ran such a call ~4x slower than a full one)."""
    if not jit.AVAILABLE:
        pytest.skip("the CPU's replay runs the compiled loops (numba)")
    rt = Runtime("cpu")
    rng = np.random.default_rng(3)
    mats = spd_list([8, 5, 12, 1], np.float64, rng)
    npiv = np.array([4, 4, 4, 1])  # (an array: a list would not key the call)
    packed = vbatch.pack(mats, order="F")
    for _ in range(3):
        res = rt.cholesky(packed, npiv).result()
    assert next(iter(rt._calls.values()))._fire  # (the backend's replayer: the loops' calls)
    for i, a in enumerate(mats):
        check_factor(a, res.factors.matrix(i), np.float64, npiv[i])


def test_ctrl_c_in_a_call_run_in_the_callers_thread_reaches_the_caller(monkeypatch):
    """A small CPU call runs in the caller's thread, staged or replayed (a known packed call):
    KeyboardInterrupt raised there reaches the caller, an exception goes into the future."""
    rt = Runtime("cpu")
    packed = vbatch.pack(batch(3))
    for _ in range(2):
        rt.cholesky(packed).result()
    assert next(iter(rt._calls.values()))._replay  # (the CPU's replay road)

    def raising(exc):
        def run(*args, **kw):
            raise exc
        return run

    monkeypatch.setattr(CpuBackend, "run", raising(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        rt.cholesky(packed)
    monkeypatch.setattr(CpuBackend, "run", raising(ValueError("in the kernels")))
    fut = rt.cholesky(packed)
    with pytest.raises(ValueError, match="in the kernels"):
        fut.result()


def test_a_layout_shared_by_two_dtypes_gives_each_its_own_byte_offsets():
    """One set of read-only sizes is one layout and one cache (tight_template), whatever the
    dtype of the buffer: the CPU's views of it hold each dtype's byte offsets."""
    from vbatch.core.batch import tight_template

    n = np.array([3, 5, 2], np.int64)
    n.flags.writeable = False
    layout, total = tight_template(n, n, "F")
    b = Runtime("cpu").backend
    for dtype in (np.float64, np.float32, np.float64):
        view = b._view(layout.with_data(np.zeros(total, dtype)))
        assert view.off == (layout.offset * np.dtype(dtype).itemsize).tolist()


def test_import_vbatch_loads_its_api_when_a_name_is_first_touched():
    """``import vbatch`` alone imports neither numpy nor pydantic; the first name touched
    binds the whole public API (every registered op among it), and ``import *`` gives it."""
    import subprocess
    import sys

    code = (
        "import sys, vbatch\n"
        "assert 'numpy' not in sys.modules and 'pydantic' not in sys.modules, 'eager'\n"
        "import numpy as np\n"
        "res = vbatch.cholesky([np.eye(3) * 4.0]).result()\n"
        "assert res.info.tolist() == [0] and float(res.factors[0][0, 0]) == 2.0\n"
        "from vbatch.ops.op import public\n"
        "names = set(vbatch.__all__)\n"
        "assert {o.api.__name__ for o in public()} <= names, names\n"
        "assert {'Runtime', 'PackedBatch', 'InputError', 'pack', 'Config'} <= names\n"
        "assert all(hasattr(vbatch, n) for n in names) and 'Runtime' in dir(vbatch)\n"
        "ns = {}\n"
        "exec('from vbatch import *', ns)\n"
        "assert names <= set(ns), names - set(ns)\n"
        "try:\n"
        "    vbatch.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_a_per_problem_argument_is_part_of_a_kept_calls_key(device):
    """A partial factor's npiv given as one int per problem keys the call by its values: the
    same values again (a new array, or the same one refilled) run the kept call, other values
    are another call, and each gives its own factor; an array past KEY_ARRAY_BYTES is not
    kept. ``submit`` keys it the same way as the method."""
    from vbatch.ops.cholesky import reference
    from vbatch.runtime import runtime as runtime_mod

    rt = Runtime(device)
    mats = spd_list([4, 7, 9], np.float64, np.random.default_rng(8))
    packed = vbatch.pack(mats)
    if device == "cuda":
        import cupy

        packed = packed.with_data(cupy.asarray(packed.data))
    first, other = np.array([2, 7, 3]), np.array([4, 0, 9])
    for i, (npiv, call) in enumerate([
            (first, rt.cholesky), (first.copy(), rt.cholesky),
            (other, lambda b, npiv: rt.submit("potrf", batch=b, npiv=npiv)),
            (other.copy(), lambda b, npiv: rt.submit("potrf", batch=b, npiv=npiv))]):
        res = call(packed, npiv=npiv).result()
        for j, a in enumerate(mats):
            want, info = reference(a, int(npiv[j]))
            assert info == 0
            got = np.tril(_host(res.factors.matrix(j)))
            err = np.abs(got - want).max(initial=0.0) / max(np.abs(a).max(), 1.0)
            assert err <= 10 * a.shape[0] * np.finfo(np.float64).eps, (i, j, err)
        kept = [p for p in rt._calls.values() if p.op.name == "potrf"]
        assert len(kept) == (1 if i < 2 else 2), i
    big = np.zeros(runtime_mod.KEY_ARRAY_BYTES // 8 + 1, np.int64)  # (as an argument: too big)
    assert runtime_mod._val(big) is runtime_mod._NOKEY
    assert runtime_mod._val(first)[2] == first.tobytes()
    assert runtime_mod._val(first.astype(object)) is runtime_mod._NOKEY


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def test_a_call_whose_array_changed_while_it_was_made_is_not_kept():
    """A key reads a per-problem array's bytes before validation copies it: where the array
    the call was made with is no longer what its key read (another thread wrote it between),
    the call is not kept, so no later call finds a plan made for other values."""
    from vbatch.ops.op import OPS
    from vbatch.runtime import runtime as runtime_mod

    rt = Runtime("cpu")
    packed = vbatch.pack(spd_list([4, 7], np.float64, np.random.default_rng(9)))
    read, made = np.array([4, 7]), np.array([2, 3])
    key = ("potrf", "batch", "npiv", "overwrite", runtime_mod.layout_token(packed),
           runtime_mod._val(read), (bool, False))
    fields = {"batch": packed, "npiv": made, "overwrite": False}
    res = rt._run(key, OPS["potrf"], fields, ()).result()
    assert not res.info.any()
    assert key not in rt._calls
    fields["npiv"] = read
    rt._run(key, OPS["potrf"], fields, ()).result()
    assert key in rt._calls


def test_a_frontal_request_keeps_its_own_read_only_arrays():
    """A kept call holds its request: the fronts' npiv and parent must be its copies, not the
    caller's arrays, which the caller may reuse for other values."""
    from vbatch.core.batch import tight_layout
    from vbatch.core.errors import validated
    from vbatch.ops.frontal import FrontalRequest

    a = vbatch.pack([np.array([[4.0, 1.0], [1.0, 3.0]])], order="F")
    m, n = np.array([0]), np.array([1])
    off, ld, total = tight_layout(m, n, "F")
    rel = vbatch.PackedBatch(data=np.zeros(total), m=m, n=n, offset=off, ld=ld, order="F")
    npiv, parent = np.array([2]), np.array([-1])
    req = validated(FrontalRequest, a=a, rel=rel, parent=parent, npiv=npiv)
    for mine, theirs in ((req.npiv, npiv), (req.parent, parent)):
        assert not np.shares_memory(mine, theirs) and not mine.flags.writeable


@pytest.mark.parametrize("coalesce", [False, True], ids=["direct", "coalesced"])
def test_a_dtype_the_backend_does_not_take_is_refused_before_any_work(monkeypatch, coalesce):
    """Backend.dtypes_for (a kernel family that takes fewer dtypes, as the frontal one): a call of
    another dtype is an InputError naming the operand, the backend and the op, raised before
    anything reaches the backend, coalescing or not, and by prepare as well. Checked on the CPU
    backend, its dtypes narrowed."""
    monkeypatch.setattr(CpuBackend, "dtypes", (np.dtype(np.float64),))
    began = []
    real = CpuBackend.begin
    monkeypatch.setattr(CpuBackend, "begin", lambda self, *a, **kw: began.append(1)
                        or real(self, *a, **kw))
    rt = Runtime("cpu", **({"coalesce_us": 1000} if coalesce else {}))
    a = [np.eye(3, dtype=np.complex128)]
    want = r"a: the cpu backend does not take complex128 for gemm \(it takes float64\)"
    with pytest.raises(vbatch.InputError, match=want):
        rt.gemm(a, a)
    with pytest.raises(vbatch.InputError, match=want):
        rt.prepare("gemm", a=a, b=a)
    # (the planner's options too: an InputError naming the op, not a missing table entry)
    with pytest.raises(vbatch.InputError, match="does not take complex128 for gemm"):
        rt.plan_options(np.complex128, "gemm")
    assert not began
    rt.gemm([np.eye(3)], [np.eye(3)]).result()  # (float64: taken)


@pytest.mark.gpu
def test_a_host_batch_packed_afresh_finds_the_device_tables_of_its_layout(monkeypatch):
    """On CUDA, a host batch packed afresh each call (staged into a device copy each call)
    finds the device tables built for its layout's token, where it built them again every
    call; a token keeps at most ``ENTRIES`` plans' tables, and holds none of the tokens in its
    keys strongly (a cycle would be freed only by the cyclic collector)."""
    from vbatch.kernels import cuda

    seen, builds = [], {"n": 0}
    real_token, real_upload = cuda.layout_token, cuda._upload
    monkeypatch.setattr(cuda, "layout_token", lambda b: seen.append(real_token(b)) or seen[-1])
    monkeypatch.setattr(cuda, "_upload", lambda *a: builds.update(n=builds["n"] + 1) or
                        real_upload(*a))
    rng = np.random.default_rng(32)
    ns = [0, 1, 7, 8, 9, 16, 3, 12]
    rt = Runtime("cuda", nb=8)
    mats = spd_list(ns, np.float64, rng)
    for step in range(4):
        res = rt.cholesky(vbatch.pack(mats)).result()
        for i, (a, f) in enumerate(zip(mats, res.factors.unpack())):
            check_factor(a, f, np.float64, where=f"step {step} problem {i}")
    assert builds["n"] == 1, builds
    first = vbatch.pack(mats)
    for nb in (8, 16, 32):  # (a plan each: more than a token keeps)
        other = Runtime("cuda", nb=nb)
        for got in (other.cholesky(first), other.syrk(first), other.gemm(first, first),
                    other.trmm(first, first)):
            got.result()
    tokens = {id(t): t for t in seen if t.entries}.values()
    assert max(len(t.entries) for t in tokens) == cuda.ENTRIES
    held = [x for t in tokens for key in t.entries for x in key[-1] if isinstance(x, type(t))]
    assert not held, held


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_a_batch_packed_afresh_each_call_replays_the_kept_call(device, order, monkeypatch):
    """A packed batch of a layout equal to a live one's (sizes, offsets, leading dimensions,
    order, dtype and buffer size) finds that one's kept call and replays it, as the same batch
    would: a loop that packs its matrices afresh each call plans once. Each call reads its own
    batch, in place or not; a batch of the same sizes laid out otherwise is a call of its
    own."""
    xp = np if device == "cpu" else pytest.importorskip("cupy")
    rng = np.random.default_rng(31)
    ns = [0, 1, 7, 8, 9, 16, 3, 12]  # (nb 8: tile-1, tile, tile+1)
    rt = Runtime(device, nb=8)
    staged = count_staged(rt, monkeypatch)
    for overwrite in (False, True):
        staged["n"] = 0
        for step in range(4):
            mats = spd_list(ns, np.float64, rng)
            batch = vbatch.pack([xp.asarray(a) for a in mats], order=order)
            res = rt.cholesky(batch, overwrite=overwrite).result()
            assert not res.info.any()
            assert (res.factors is batch) == overwrite
            for i, (a, f) in enumerate(zip(mats, res.factors.unpack())):
                check_factor(a, f, np.float64, where=f"step {step} problem {i}")
        assert staged["n"] == 1, (overwrite, staged)
    mats = spd_list(ns, np.float64, rng)
    host = vbatch.pack(mats, order=order)
    ld = host.ld + 1  # (padded: the same sizes, another layout)
    padded = vbatch.PackedBatch.from_buffer(
        xp.zeros(int((ld * host.n).sum()) + 1), n=host.n, ld=ld, order=order,
        offset=np.concatenate([[0], np.cumsum(ld * host.n)[:-1]]))
    for i, a in enumerate(mats):
        padded.matrix(i)[...] = xp.asarray(a)
    res = rt.cholesky(padded).result()
    assert staged["n"] == 2
    for i, (a, f) in enumerate(zip(mats, res.factors.unpack())):
        check_factor(a, f, np.float64, where=f"padded problem {i}")
