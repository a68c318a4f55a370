"""vbatch.distributed on a CPU LocalCluster of two processes (what CI can run): results equal a
single runtime's, in the caller's order and form; outputs stay on the workers for a later op;
a worker killed mid-batch loses nothing; bad input is named before any work."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("distributed")

import vbatch  # noqa: E402
import vbatch.distributed as vd  # noqa: E402
from vbatch import InputError  # noqa: E402
from vbatch.ops.generate import spd  # noqa: E402
from _check import check_factor, edge_sizes  # noqa: E402

NB = 16


@pytest.fixture(scope="module")
def client():
    from distributed import Client

    cluster = vd.local_cluster(2, device="cpu")
    c = Client(cluster)
    vd.wait_for_workers(c, 2)
    yield c
    c.close()
    cluster.close()


def _batch(seed, count=40, nmax=60):
    rng = np.random.default_rng(seed)
    ns = edge_sizes(NB) + [int(n) for n in rng.integers(0, nmax, count)]
    return [spd(n, np.float64, rng) for n in ns], rng


def _same(f, w):
    """Equal to the single runtime's factor up to rounding (the BLAS library may block a
    product differently under another thread count, in another process)."""
    f, w = np.asarray(f), np.asarray(w)
    assert f.shape == w.shape
    tol = 4 * max(f.shape[0], 1) * np.finfo(f.dtype).eps * max(1.0, np.linalg.norm(w))
    assert np.linalg.norm(f - w) <= tol


# ---------------------------------------------------------------- sharding
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("dist", ["uniform", "skewed", "equal"])
def test_shards_partition_the_batch_and_balance_flops(workers, dist):
    rng = np.random.default_rng(workers)
    k = 20_000
    if dist == "equal":
        n = np.full(k, 64)
    else:
        from vbatch.ops.generate import sizes

        n = sizes(dist, k, 512, rng)
    cost = n.astype(float) ** 3 / 3
    shards = vd.shard_by_cost(cost, workers, exact=512)
    assert len(shards) == workers
    everything = np.concatenate(shards)
    assert np.array_equal(np.sort(everything), np.arange(k))
    for s in shards:
        assert np.all(np.diff(s) > 0)  # ascending: the caller's relative order kept
    loads = np.array([cost[s].sum() for s in shards])
    share = cost.sum() / workers
    # Within the largest problem outside the heap's head of the share (and never above LPT's
    # 4/3 bound on the optimum, which is at least the share and the largest problem).
    small = np.sort(cost)[::-1][511] if k > 512 else 0.0
    # The fill leaves the loads within one problem of the rest; the snake adds at most two.
    assert loads.max() <= max(share, cost.max()) + 3 * small + 1e-6 * share
    if dist != "skewed":  # (there the fill takes many of the rest to even out the head)
        counts = [len(s) for s in shards]
        assert max(counts) - min(counts) <= 0.01 * k  # the same mix of sizes on each
    assert loads.max() <= 4 / 3 * max(share, cost.max()) + 1e-6 * share


def test_sharding_edge_cases():
    assert [len(s) for s in vd.shard_by_cost(np.zeros(0), 3)] == [0, 0, 0]
    two = vd.shard_by_cost(np.array([5.0, 1.0]), 4)
    assert sorted(len(s) for s in two) == [0, 0, 1, 1]
    # A few huge problems: LPT puts each on its own worker.
    cost = np.r_[np.full(3, 1e9), np.ones(1000)]
    shards = vd.shard_by_cost(cost, 3, exact=2)
    assert [int((cost[s] == 1e9).sum()) for s in shards] == [1, 1, 1]
    with pytest.raises(ValueError):
        vd.shard_by_cost(cost, 0)


# ---------------------------------------------------------------- results
def test_results_equal_a_single_runtime_in_order_and_form(client):
    mats, rng = _batch(1)
    mats[3] = -mats[3] if mats[3].size else mats[3]  # one that fails, if it has a column
    drt = vd.Runtime(client, device="cpu", nb=NB)
    got = drt.cholesky(mats).result()
    want = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    # (a list comes back as the single runtime gives it: matrices read from one buffer)
    assert type(got.factors) is type(want.factors) and len(got.factors) == len(mats)
    assert np.array_equal(got.info, want.info)
    for i, (a, f, w) in enumerate(zip(mats, got.factors, want.factors)):
        assert f.shape == a.shape
        if want.info[i] == 0:
            check_factor(a, f, np.float64, where=f"problem {i}")
            _same(f, w)
    # A packed batch comes back packed, in the caller's layout order.
    packed = vbatch.pack(mats[:8], order="F")
    res = drt.cholesky(packed).result()
    assert isinstance(res.factors, vbatch.PackedBatch) and res.factors.order == "F"
    assert res.factors.k == 8
    assert res.info.tolist() == want.info[:8].tolist()
    for i in range(8):
        if res.info[i] == 0:
            check_factor(mats[i], res.factors.matrix(i), np.float64, where=f"packed {i}")


def _kept_calls(op: str) -> int:
    """On a worker: the prepared calls of ``op`` its runtimes keep."""
    from vbatch.distributed import worker as w

    return sum(1 for rt in w._RUNTIMES.values() for p in rt._calls.values() if p.op.name == op)


def test_a_repeated_call_runs_a_kept_call_on_its_workers(client):
    """A repeated call on host matrices of one layout finds its prepared call on each worker:
    an argument the caller left out (a full factor's npiv) is not sent as the client's
    validated default, which would key nothing; one the caller gave per problem keys the call
    by its values. Each call still gives its own answer."""
    drt = vd.Runtime(client, device="cpu", nb=NB)
    rng = np.random.default_rng(12)
    ns = [int(n) for n in rng.integers(1, 17, 30)]
    before = sum(client.run(_kept_calls, "potrf").values())
    for npiv in (None, np.array([n // 2 for n in ns])):
        for i in range(4):
            mats = [spd(n, np.float64, rng) * (1 + i) for n in ns]
            got = drt.cholesky(mats, npiv=npiv).result()
            want = vbatch.Runtime("cpu", nb=NB).cholesky(mats, npiv=npiv).result()
            assert np.array_equal(got.info, want.info)
            for f, w in zip(got.factors, want.factors):
                _same(np.tril(f), np.tril(w))
        kept = sum(client.run(_kept_calls, "potrf").values())
        # (one per worker holding a shard; a new call of its own for each npiv)
        assert 1 <= kept - before <= 2, (npiv, kept, before)
        before = kept


def _tasks(dask_scheduler=None):
    return set(dask_scheduler.tasks)


def test_a_call_sends_the_scheduler_nothing(client):
    """The client calls each worker's keeper directly: a call, its result and its outputs
    left on the workers add no task to the scheduler (each one's round trip through it cost
    more than the call: docs/decisions.md#dist-keepers)."""
    mats, _ = _batch(8, count=12)
    want = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    for device in ("cpu",) if vbatch.cuda_status()[0] else ("cpu", "auto"):
        drt = vd.Runtime(client, device=device, nb=NB)
        before = client.run_on_scheduler(_tasks)
        fut = drt.cholesky(mats)
        got = fut.result()
        assert np.array_equal(got.info, want.info)
        for i, (a, f) in enumerate(zip(mats, fut.output().gather())):
            if want.info[i] == 0:
                check_factor(a, f, np.float64, where=f"{device} problem {i}")
                _same(got.factors[i], f)
        assert not client.run_on_scheduler(_tasks) - before


@pytest.mark.parametrize("form", ["list", "F", "C"])
def test_an_op_with_an_integer_output_runs_over_the_workers(client, form):
    """GETRF's ``ipiv`` (int32, ``min(m, n)`` per problem) comes back as 1-D arrays in every
    input form, and ``output("ipiv")`` names its own sizes and dtype; the factors as LAPACK's."""
    from scipy.linalg import lu_factor

    rng = np.random.default_rng(9)
    mats = [rng.standard_normal((int(m), int(n))) for m, n in rng.integers(1, 30, (24, 2))]
    arg = mats if form == "list" else vbatch.pack(mats, order=form)
    fut = vd.Runtime(client, device="cpu").getrf(arg)
    got = fut.result()
    facs = got.factors.unpack() if form != "list" else list(got.factors)
    piv = fut.output("ipiv")
    assert piv.dtype == np.int32 and (piv.n == 1).all()
    assert piv.m.tolist() == [min(a.shape) for a in mats]
    for i, a in enumerate(mats):
        lu, p = lu_factor(a)
        assert np.allclose(facs[i], lu, rtol=1e-12, atol=1e-12), i
        assert np.asarray(got.ipiv[i]).tolist() == p.tolist(), i
    assert [np.asarray(x).ravel().tolist() for x in piv.gather()] == [
        np.asarray(x).tolist() for x in got.ipiv]


@pytest.mark.parametrize("form", ["list", "F"])
def test_lu_solves_run_over_the_workers(client, form):
    """gesv, and getrs given getrf's pivots (packed int32, split into 1-D shards) or a list of
    them, against numpy's solve."""
    rng = np.random.default_rng(3)
    ns = rng.integers(0, 30, 24)
    mats = [rng.standard_normal((n, n)) + n * np.eye(n) for n in ns]
    rhs = [rng.standard_normal((n, 2)) for n in ns]
    a, b = (mats, rhs) if form == "list" else (vbatch.pack(mats, order=form),
                                               vbatch.pack(rhs, order=form))
    drt = vd.Runtime(client, device="cpu")

    def check(x, trans=False):
        xs = x.unpack() if form != "list" else list(x)
        for i, (m, y) in enumerate(zip(mats, rhs)):
            want = np.linalg.solve(m.T if trans else m, y) if m.size else y
            assert np.allclose(xs[i], want, rtol=1e-12, atol=1e-12), i

    check(drt.gesv(a, b).result().solutions)
    f = vbatch.getrf(a).result()
    for piv in (f.ipiv, [np.asarray(p) for p in f.ipiv]):
        check(drt.getrs(f.factors, piv, b, trans=True).result(), trans=True)


def test_each_output_comes_back_in_the_form_of_its_input(client):
    """As a local call: posv's factors in a's form, its solutions in b's (a packed a, a list
    b, and the reverse); getrs's solutions in b's form whatever the factors' form."""
    rng = np.random.default_rng(4)
    mats, _ = _batch(4, count=12, nmax=20)
    rhs = [rng.standard_normal((a.shape[0], 2)) for a in mats]
    drt = vd.Runtime(client, device="cpu")
    res = drt.posv(vbatch.pack(mats, order="C"), rhs).result()
    assert isinstance(res.factors, vbatch.PackedBatch) and res.factors.order == "C"
    # (a list's outputs: a list-like sequence of views, as a local call's)
    assert not isinstance(res.solutions, vbatch.PackedBatch) and len(res.solutions) == len(mats)
    res = drt.posv(mats, vbatch.pack(rhs, order="F")).result()
    assert not isinstance(res.factors, vbatch.PackedBatch)
    assert isinstance(res.solutions, vbatch.PackedBatch) and res.solutions.order == "F"
    for i, (a, b) in enumerate(zip(mats, rhs)):
        want = np.linalg.solve(a, b) if a.size else b
        assert np.allclose(res.solutions.matrix(i), want, rtol=1e-10, atol=1e-10), i
    f = vbatch.getrf(vbatch.pack(mats, order="F")).result()
    x = drt.getrs(f.factors, f.ipiv, rhs).result()
    assert not isinstance(x, vbatch.PackedBatch)
    assert all(np.shape(g) == np.shape(b) for g, b in zip(x, rhs))


def test_outputs_stay_on_the_workers_for_a_later_op(client):
    mats, rng = _batch(2)
    rhs = [rng.standard_normal((a.shape[0], int(r))) for a, r in
           zip(mats, rng.integers(0, 4, len(mats)))]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    chol = drt.cholesky(mats)
    sol = drt.potrs(chol, rhs, after=[chol])
    # The solve's shards are the factors' shards: same workers, same problems.
    assert [(s.worker, s.index.tolist()) for s in sol.shards] == [
        (s.worker, s.index.tolist()) for s in chol.shards]
    xs = sol.result()
    for i, (a, b, x) in enumerate(zip(mats, rhs, xs)):
        assert x.shape == b.shape
        assert np.all(np.isfinite(x))
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b)), i
    # A BLAS op reading both a distributed output and local operands, with its parameters.
    ab = drt.gemm(chol.output("factors"), rhs, alpha=2.0).result()
    fac = chol.result().factors
    for i in range(len(mats)):
        assert np.allclose(ab[i], 2.0 * fac[i] @ rhs[i], rtol=1e-12, atol=1e-12)
    assert len(chol.output().gather()) == len(mats)


def test_a_client_that_asks_for_the_scheduler_is_served_through_it(client, monkeypatch):
    """``direct_to_workers=False`` (a client that cannot reach the workers): the calls go
    through the scheduler, with the same results."""
    from distributed import Client
    from distributed.actor import ProxyRPC

    proxied = []
    real = ProxyRPC.__init__
    monkeypatch.setattr(ProxyRPC, "__init__",
                        lambda self, *a: proxied.append(a[1]) or real(self, *a))

    mats, rng = _batch(14, count=12)
    want = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    with Client(client.scheduler.address, direct_to_workers=False) as c:
        drt = vd.Runtime(c, device="cpu", nb=NB)
        chol = drt.cholesky(mats)
        got = chol.result()
        rhs = [rng.standard_normal((a.shape[0], 1)) for a in mats]
        xs = drt.potrs(chol, rhs, after=[chol]).result()
    assert set(proxied) == {s.worker for s in chol.shards}
    assert np.array_equal(got.info, want.info)
    for i, (a, f, b, x) in enumerate(zip(mats, got.factors, rhs, xs)):
        if want.info[i] == 0:
            check_factor(a, f, np.float64, where=f"problem {i}")
            assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b)), i


def _log_shards(folder: str, hold: bool) -> None:
    """On a worker: each shard it runs writes its start and end (time, op, problems) to a log
    named by the worker's pid; with ``hold``, it waits for ``folder/go`` after its start."""
    import os
    import pathlib
    import time

    import vbatch.distributed.worker as m

    real = m.__dict__.setdefault("_real_run_shard", m._run_shard)

    def logged(op, device, options, chunk, fields):
        k = next(len(v) for v in fields.values() if isinstance(v, (list, m.Views)))
        log = pathlib.Path(folder, f"log-{os.getpid()}")
        with log.open("a") as f:
            f.write(f"start {time.time()} {op} {k}\n")
        t0 = time.monotonic()
        while hold and not os.path.exists(os.path.join(folder, "go")):
            if time.monotonic() - t0 > 120:
                raise TimeoutError("liveness guard: the shard was never let go")
            time.sleep(0.01)
        try:
            return real(op, device, options, chunk, fields)
        finally:
            with log.open("a") as f:
                f.write(f"end {time.time()} {op} {k}\n")

    m._run_shard = logged


def test_every_shard_waits_for_every_shard_of_its_after_dependencies(client, tmp_path):
    """``after=``: no shard of a call starts, on any worker, before every shard of its
    dependencies has ended, as a call in one process starts once its dependencies are done.
    One worker's shard of the first call is held until the others have had time to start."""
    mats, _ = _batch(9)
    drt = vd.Runtime(client, device="cpu", nb=NB)
    workers = sorted({w for w in drt.workers})
    client.run(_log_shards, str(tmp_path), True, workers=workers[:1])
    client.run(_log_shards, str(tmp_path), False, workers=workers[1:])
    try:
        first = drt.cholesky(mats)
        assert len({s.worker for s in first.shards}) == 2
        second = drt.cholesky([mats[-1]], after=[first])  # one problem: one worker
        sol = drt.potrs(first, mats, after=[first, second])
        time.sleep(1.0)
        (tmp_path / "go").touch()
        sol.result()
    finally:
        client.run(_let_shards_run)
    events = [line.split() for f in tmp_path.glob("log-*") for line in f.read_text().splitlines()]
    first_ends = [float(t) for e, t, op, k in events if e == "end" and op == "potrf" and k != "1"]
    later = [(float(t), op, k) for e, t, op, k in events if e == "start" and (
        op == "potrs" or k == "1")]
    assert len(first_ends) == 2 and len(later) == 3, events
    assert all(t >= max(first_ends) for t, _, _ in later), events
    assert np.array_equal(second.result().info, [0])


def _fail_shards(error: Exception | None = None) -> None:
    """On a worker: every shard it runs raises ``error`` (by default a RuntimeError), until
    ``_let_shards_run``."""
    import vbatch.distributed.worker as m

    error = error or RuntimeError("this worker's shard failed")
    m.__dict__.setdefault("_real_run_shard", m._run_shard)

    def failing(*a, **kw):
        raise error

    m._run_shard = failing


def test_a_call_after_a_failed_shard_runs_nowhere(client):
    """A call ordered ``after=`` one whose shard failed on one worker fails, and none of its
    shards runs, on any worker: a batch it would factor in place is left as it was."""
    mats, _ = _batch(10)
    drt = vd.Runtime(client, device="cpu", nb=NB)
    made = drt.spd(np.array([5, 9, 12, 3, 7, 8]), seed=3)
    before = made.gather()
    sick = made.shards[0].worker
    client.run(_fail_shards, workers=[sick])
    try:
        bad = drt.cholesky(mats)
        assert {s.worker for s in bad.shards} == {s.worker for s in made.shards}
        with pytest.raises(RuntimeError, match="failed"):
            bad.result()
        drt.wait()  # (result() raised at the first failed shard)
        client.run(_let_shards_run, workers=[sick])
        later = drt.cholesky(made, overwrite=True, after=[bad])
        with pytest.raises(RuntimeError, match="failed"):
            later.result()
        drt.wait()
    finally:
        client.run(_let_shards_run, workers=[sick])
    for i, (b, a) in enumerate(zip(before, made.gather())):
        assert np.array_equal(a, b), f"problem {i} was written after its call's dependency failed"


def test_host_lists_travel_packed_and_come_back_in_their_form(client):
    """A shard's numpy matrices travel as one buffer each way; the caller still gets a list,
    1-D right-hand sides as 1-D solutions, in order."""
    mats, rng = _batch(12)
    rhs = [rng.standard_normal(a.shape[0]) if i % 2 else rng.standard_normal((a.shape[0], 2))
           for i, a in enumerate(mats)]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    xs = drt.posv(mats, rhs).result().solutions
    assert type(xs) is type(vbatch.Runtime("cpu", nb=NB).posv(mats, rhs).result().solutions)
    assert len(xs) == len(mats)
    for i, (a, b, x) in enumerate(zip(mats, rhs, xs)):
        assert x.shape == b.shape, i
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b)), i


def test_repeated_calls_of_one_layout_each_give_their_own_answer(client):
    """A worker copies a small host operand laid out as its call's last one into that one's
    buffer (to find its prepared call): every call still reads its own matrices, and a result
    held from an earlier call is not overwritten."""
    ns = edge_sizes(NB) + [5, 9, 30]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    kept = []
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        mats = [spd(n, np.float64, rng) for n in ns]
        rhs = [rng.standard_normal((n, 2)) for n in ns]
        kept.append((mats, rhs, drt.cholesky(mats), drt.posv(mats, rhs)))
    for mats, rhs, chol, sol in kept:
        for i, (a, f) in enumerate(zip(mats, chol.result().factors)):
            check_factor(a, f, np.float64, where=f"problem {i}")
        for a, b, x in zip(mats, rhs, sol.result().solutions):
            assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b))
        for a, f in zip(mats, chol.output().gather()):  # (fetched from the workers late)
            check_factor(a, f, np.float64, where="gathered")


def test_a_large_host_call_packs_its_shards_in_threads(client, monkeypatch):
    """Past ``BIG`` bytes of host matrices the shards are packed in threads: the same
    results, in order (the threshold lowered so that a small batch takes that road)."""
    import vbatch.distributed.runtime as dr

    monkeypatch.setattr(dr, "BIG", 0)
    mats, rng = _batch(13)
    rhs = [rng.standard_normal((a.shape[0], 2)) for a in mats]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    assert len(drt.workers) == 2
    xs = drt.posv(mats, rhs).result().solutions
    for i, (a, b, x) in enumerate(zip(mats, rhs, xs)):
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b)), i


def test_bad_input_is_named_before_any_work(client):
    mats, _ = _batch(3, count=10)
    mats[7] = np.ones((3, 4))
    drt = vd.Runtime(client, device="cpu", nb=NB)
    before = set(client.who_has())
    with pytest.raises(InputError, match="problem 7"):
        drt.cholesky(mats)
    with pytest.raises(InputError, match="inner dimensions"):
        drt.gemm([np.ones((2, 3))], [np.ones((2, 3))])
    with pytest.raises(InputError, match="after"):
        drt.cholesky(mats[:2], after=[object()])
    # nothing was sent (a key no more: an earlier test's runtime let go meanwhile)
    assert not set(client.who_has()) - before


def test_chunks_stream_through_and_join_in_order(client):
    mats, _ = _batch(4, count=30)
    drt = vd.Runtime(client, device="cpu", nb=NB, chunk_bytes=20_000)
    got = drt.cholesky(mats).result()
    want = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    assert np.array_equal(got.info, want.info)
    for f, w in zip(got.factors, want.factors):
        _same(f, w)
    # Chunked shards come back in the form unchunked ones do, 1-D right-hand sides 1-D.
    rng = np.random.default_rng(4)
    rhs = [rng.standard_normal(a.shape[0]) if i % 2 else rng.standard_normal((a.shape[0], 2))
           for i, a in enumerate(mats)]
    xs = drt.posv(mats, rhs).result().solutions
    whole = vd.Runtime(client, device="cpu", nb=NB).posv(mats, rhs).result().solutions
    assert type(xs) is type(whole)
    for i, (x, y) in enumerate(zip(xs, whole)):
        assert x.shape == y.shape and np.allclose(x, y), i


# ---------------------------------------------------------------- failures
def _kill(client, worker):
    pid = client.run(os.getpid, workers=[worker])[worker]
    os.kill(pid, signal.SIGKILL)


def _hold_shards(folder: str, name: str = "_run_shard", tag: str = "run") -> None:
    """On a worker: each call of ``name`` (its shards; ``_make_spd``: the batches it makes)
    says so (a file ``tag-pid``) and then waits until ``folder/go`` exists (120 s at most: a
    liveness guard)."""
    import os
    import pathlib
    import time

    import vbatch.distributed.worker as m

    real = m.__dict__.setdefault(f"_real{name}", getattr(m, name))

    def held(*a, **kw):
        pathlib.Path(folder, f"{tag}-{os.getpid()}").touch()
        t0 = time.monotonic()
        while not os.path.exists(os.path.join(folder, "go")):
            if time.monotonic() - t0 > 120:
                raise TimeoutError(f"liveness guard: {name} was never let go")
            time.sleep(0.01)
        return real(*a, **kw)

    setattr(m, name, held)


def _let_shards_run(name: str = "_run_shard") -> None:
    import vbatch.distributed.worker as m

    setattr(m, name, m.__dict__.pop(f"_real{name}", getattr(m, name)))


def test_a_worker_killed_mid_batch_loses_nothing(client, tmp_path):
    """The shard of one worker is held running on it (a gate the test opens) when the worker
    is killed: the batch's result is whole all the same (Dask reruns the shard on the new
    worker, which the nanny brings up unheld)."""
    rng = np.random.default_rng(5)
    ns = [int(n) for n in rng.integers(150, 260, 300)]
    mats = [spd(n, np.float64, rng) for n in ns]
    clean = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    drt = vd.Runtime(client, device="cpu", nb=NB)
    client.run(_hold_shards, str(tmp_path))
    try:
        fut = drt.cholesky(mats)
        victim = fut.shards[0].worker
        pid = client.run(os.getpid, workers=[victim])[victim]
        t0 = time.monotonic()
        while not (tmp_path / f"run-{pid}").exists():
            assert time.monotonic() - t0 < 60, "liveness guard: the shard never started"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)  # while its shard runs
    finally:
        (tmp_path / "go").touch()
    res = fut.result(timeout=120)
    client.run(_let_shards_run)
    assert np.array_equal(res.info, clean.info)
    for i, (a, f, w) in enumerate(zip(mats, res.factors, clean.factors)):
        check_factor(a, f, np.float64, where=f"problem {i}")
        _same(f, w)
    vd.wait_for_workers(client, 2)  # the nanny brings a new worker up


def test_a_result_lost_with_its_worker_is_recomputed(client):
    mats, rng = _batch(6)
    rhs = [rng.standard_normal((a.shape[0], 1)) for a in mats]
    vd.wait_for_workers(client, 2)
    drt = vd.Runtime(client, device="cpu", nb=NB)
    chol = drt.cholesky(mats)
    drt.wait()
    _kill(client, chol.shards[-1].worker)  # the factors of that shard are gone with it
    xs = drt.potrs(chol, rhs, after=[chol]).result()
    for a, b, x in zip(mats, rhs, xs):
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b))
    vd.wait_for_workers(client, 2)


def test_a_recompute_replays_the_in_place_call_it_was_ordered_after(client):
    """A batch factored in place, then read ``after=`` that call: when the reader's worker
    dies, the batch is made again and factored again before the reader runs again."""
    vd.wait_for_workers(client, 2)
    drt = vd.Runtime(client, device="cpu", nb=NB)
    ns = np.arange(40) % 20 + 1
    batch = drt.spd(ns, seed=1)
    f1 = drt.cholesky(batch, overwrite=True)
    f1.result()
    rhs = [np.ones((int(n), 1)) for n in ns]
    f3 = drt.potrs(batch, rhs, after=[f1])
    first = f3.result()
    _kill(client, f3.shards[-1].worker)
    again = f3.output().gather()  # (computed again from the shards' records)
    for i, (x, y) in enumerate(zip(first, again)):
        assert np.allclose(x, y), i
    vd.wait_for_workers(client, 2)


def test_a_second_worker_lost_while_a_shards_reads_are_made_again(tmp_path):
    """Two faults in a row: a reader's worker dies, so what it reads is made again on another
    worker, and that one dies while it does (held there by a gate). The call still gives the
    right answer, on the third worker."""
    from distributed import Client

    cluster = vd.local_cluster(3, device="cpu")
    c = Client(cluster)
    try:
        vd.wait_for_workers(c, 3)
        drt = vd.Runtime(c, device="cpu", nb=NB)
        ns = np.arange(30) % 12 + 1
        batch = drt.spd(ns, seed=5)
        chol = drt.cholesky(batch)
        chol.result()
        assert len({s.worker for s in chol.shards}) == 3
        want = [np.tril(f) for f in chol.output().gather()]
        c.run(_hold_shards, str(tmp_path), "_make_spd", "make")
        _kill(c, chol.shards[0].worker)  # (the factors and the batch of shard 0 go)
        rhs = [np.ones((int(n), 1)) for n in ns]
        sol = drt.potrs(chol, rhs)
        t0 = time.monotonic()
        while not list(tmp_path.glob("make-*")):
            assert time.monotonic() - t0 < 60, "liveness guard: nothing was made again"
            time.sleep(0.01)
        os.kill(int(next(tmp_path.glob("make-*")).name.split("-")[1]), signal.SIGKILL)
        (tmp_path / "go").touch()
        xs = sol.result(timeout=120)
        for i, (f, b, x) in enumerate(zip(want, rhs, xs)):
            assert np.linalg.norm(f @ (f.T @ x) - b) <= 1e-10 * max(1.0, np.linalg.norm(b)), i
    finally:
        (tmp_path / "go").touch()
        c.close()
        cluster.close()


def test_batches_made_on_the_workers(client):
    drt = vd.Runtime(client, device="cpu", nb=NB)
    ns = np.array(edge_sizes(NB) + [3, 40, 0, 25])
    made = drt.spd(ns, seed=1)
    mats = made.gather()
    assert [m.shape for m in mats] == [(n, n) for n in ns]
    res = drt.cholesky(made).result()
    assert not res.info.any()
    for i, (a, f) in enumerate(zip(mats, res.factors)):
        full = np.tril(a) + np.tril(a, -1).T  # the matrix its lower triangle stands for
        check_factor(full, f, np.float64, where=f"made {i}")


def _link_threads(on: bool) -> list:
    """On a worker: from now on (``on``) each shard it runs logs the name of the thread it ran
    on; returns and clears the log so far, and puts the shard back when not ``on``."""
    import threading

    import vbatch.distributed.worker as m

    real = m.__dict__.setdefault("_threads_real", m._run_shard)
    log = m.__dict__.setdefault("_threads_log", [])
    out = list(log)
    log.clear()
    if not on:
        m._run_shard = m.__dict__.pop("_threads_real")
        return out

    def logged(*args):
        log.append(threading.current_thread().name)
        return real(*args)

    m._run_shard = logged
    return out


@pytest.mark.parametrize("reachable", [True, False])
def test_calls_go_over_each_keepers_link_or_through_dask(client, monkeypatch, reachable):
    """A runtime calls each keeper over a link of its own, whose thread runs the shards (no
    actor call through Dask's comm); a keeper whose link it cannot reach is called through
    Dask, with the same answers. Operands and results larger than a message written in one
    piece (``link.SMALL``) travel too."""
    from distributed.core import PooledRPCCall

    from vbatch.distributed import link

    if not reachable:
        def refused(self, *a, **kw):
            raise ConnectionRefusedError("unreachable")
        monkeypatch.setattr(link.Link, "__init__", refused)
    through_dask = []
    real = PooledRPCCall.__getattr__
    monkeypatch.setattr(PooledRPCCall, "__getattr__", lambda self, name: (
        through_dask.append(name) if name == "actor_execute" else None) or real(self, name))
    rng = np.random.default_rng(11)
    big = int(np.sqrt(link.SMALL / 8)) + 8  # (one matrix above SMALL bytes)
    mats = [spd(n, np.float64, rng) for n in [big, 5, big + 3, 0, 17, 1]]
    want = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    drt = vd.Runtime(client, device="cpu", nb=NB)
    assert bool(drt._hub.links) is reachable
    client.run(_link_threads, True)
    try:
        for _ in range(2):
            fut = drt.cholesky(mats)
            got = fut.result()
            made = drt.spd(np.array([3, big, 9]), seed=4)
            factored = drt.cholesky(made).output().gather()
        lower = made.gather()
    finally:
        threads = client.run(_link_threads, False)
        drt.close()
    assert np.array_equal(got.info, want.info)
    for i, (a, f) in enumerate(zip(mats, got.factors)):
        check_factor(a, f, np.float64, where=f"problem {i}")
    for i, (a, f) in enumerate(zip(lower, factored)):
        check_factor(np.tril(a) + np.tril(a, -1).T, f, np.float64, where=f"made {i}")
    names = {n for log in threads.values() for n in log}
    assert names == ({"vbatch-keeper-link"} if reachable else {"vbatch-keeper_0"}), names
    assert bool(through_dask) is not reachable, through_dask


def test_a_link_never_blocks_its_caller_on_a_busy_keeper():
    """Calls to a keeper that is busy (here: held until released) return at once, however
    much is sent, and once it serves again every reply comes back, in order: a send that
    waited for the socket while holding the link's lock blocked the caller (and the client's
    event loop), and deadlocked against the replies filling the other way."""
    import threading

    from vbatch.distributed import link

    gate = threading.Event()

    def serve(msg):
        gate.wait(60)
        return ("ok", msg), None  # (replies as large as the calls: both ways fill up)

    server = link.Server("127.0.0.1", b"g" * 32, serve)
    mine = link.Link(server.address, b"g" * 32)
    sent, futs = threading.Event(), []

    def submit():
        for i in range(60):
            futs.append(mine.call(np.full(100_000, float(i))))  # (0.8 MB each, 48 MB)
        sent.set()

    threading.Thread(target=submit, daemon=True).start()
    assert sent.wait(30), "the caller waited for the busy keeper"
    assert not gate.is_set()
    gate.set()
    for i, f in enumerate(futs):
        status, got = f.result(60)
        assert status == "ok" and got.shape == (100_000,) and (got == i).all(), i
    mine.close()


def test_calls_to_a_worker_run_in_the_order_they_were_submitted(client):
    """A call sent at once (its reads done) does not overtake an earlier call to the same
    worker that waits for its own reads: an in-place factorization, then a read of the same
    batch (no ``after=``), sees the factors, as on one runtime."""
    drt = vd.Runtime(client, device="cpu", nb=NB)
    ns = np.array([30, 40, 50, 60] * 5)
    for trial in range(6):
        made = drt.spd(ns, seed=trial)
        first = drt.cholesky(made, overwrite=True)  # (made not yet made: the loop's way)
        for s in made.shards:
            s.run.result(60)
        second = drt.cholesky(made)  # (its reads done: sent at once, unless it would overtake)
        first.result()
        again = second.result().factors
        factored = made.gather()
        for i, (f, a) in enumerate(zip(again, factored)):
            # (run after the first, it factored the factor L: not L itself)
            assert not np.allclose(np.tril(f), np.tril(a)), (trial, i)


def _refuse():
    raise ValueError("this message cannot be read here")


class _Unreadable:
    def __reduce__(self):
        return _refuse, ()


def test_a_keepers_link_serves_only_the_runtime_that_knows_its_token():
    """A connection that does not open with the keeper's token is closed unanswered; the
    runtime's own is then served, one message after another, in order; a message that cannot
    be unpickled is answered with its error, and the link goes on."""
    import socket

    from vbatch.distributed import link

    seen = []

    def serve(msg):
        seen.append(msg)
        return ("ok", msg * 2), None

    server = link.Server("127.0.0.1", b"k" * 32, serve)
    with socket.create_connection(server.address, 5) as stranger:
        stranger.sendall(b"x" * 32)
        link._send(stranger, link._frames("hello"))
        stranger.settimeout(5)
        try:  # (closed, unanswered: reset where the message it sent was left unread)
            assert stranger.recv(1) == b""
        except ConnectionResetError:
            pass
    mine = link.Link(server.address, b"k" * 32)
    futs = [mine.call(i) for i in range(50)]
    assert [f.result(5) for f in futs] == [("ok", 2 * i) for i in range(50)]
    assert seen == list(range(50))
    status, error = mine.call(_Unreadable()).result(5)
    assert status == "err" and "cannot be read" in str(error)
    assert mine.call(3).result(5) == ("ok", 6)
    mine.close()
    with pytest.raises(ConnectionError):
        mine.call(1).result(5)


def test_wait_lets_go_of_results_the_caller_dropped(client):
    """An in-place factorization is finished by ``wait()`` though its future was dropped, and
    afterwards the runtime holds no future (it kept the last one, and with it the batch on the
    workers: a second batch of most of a GPU's memory then ran out of it)."""
    import weakref

    drt = vd.Runtime(client, device="cpu", nb=NB)
    made = drt.spd(np.array([5, NB + 1, 0, 3]), seed=2)
    before = made.gather()
    fut = drt.cholesky(made, overwrite=True)
    gone = weakref.ref(fut)
    del fut
    drt.wait()
    assert gone() is None, "the runtime still holds a finished future"
    after = made.gather()
    for i, (a, f) in enumerate(zip(before, after)):
        full = np.tril(a) + np.tril(a, -1).T
        check_factor(full, f, np.float64, where=f"in place {i}")


def _held_keys(dask_worker=None) -> set:
    from vbatch.distributed.worker import VALUES

    return set(VALUES)


def _held_anywhere(client) -> set:
    return set().union(*client.run(_held_keys).values())


def test_values_are_dropped_on_the_workers_once_nothing_can_read_them(client):
    """A shard's value stays on its worker while its future, an output of it or a later call
    not yet run can read it, and is dropped after: a caller that lets go of its results does
    not fill the workers' memory."""
    import gc

    mats, rng = _batch(15, count=12)
    rhs = [rng.standard_normal((a.shape[0], 1)) for a in mats]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    fut = drt.cholesky(mats)
    keys = {s.key for s in fut.shards}
    fut.result()
    out = fut.output()
    del fut
    drt.wait()
    gc.collect()
    time.sleep(0.3)
    assert keys <= _held_anywhere(client)  # (the output still reads them)
    # A call on a future nobody else holds: it is kept until that call has run.
    sol = drt.potrs(out, rhs)
    del out
    gc.collect()
    xs = sol.result()
    for a, b, x in zip(mats, rhs, xs):
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b))
    keys |= {s.key for s in sol.shards}
    del sol
    drt.wait()
    gc.collect()
    t0 = time.monotonic()
    while keys & _held_anywhere(client):
        assert time.monotonic() - t0 < 10, "the workers still hold values nothing can read"
        time.sleep(0.05)


def test_a_value_read_again_after_a_call_of_its_layout_is_unchanged(client):
    """The buffer a worker reuses for a call's small host operands is never a value it holds
    for a later read."""
    rng = np.random.default_rng(16)
    ns = rng.integers(1, 16, 40)
    a1, a2 = ([spd(int(n), np.float64, rng) for n in ns] for _ in range(2))
    rhs = [rng.standard_normal((int(n), 1)) for n in ns]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    c1 = drt.cholesky(a1)
    drt.potrs(c1, rhs).result()
    c2 = drt.cholesky(a2)
    drt.potrs(c2, rhs).result()
    for a, b, x in zip(a1, rhs, drt.potrs(c1, rhs).result()):
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b))


def test_a_result_read_after_a_later_in_place_call_is_what_that_call_wrote(client):
    """``result()`` of a call whose output a later call overwrote (in place) reads the
    output as it is, for every shard alike, small or large."""
    rng = np.random.default_rng(17)
    ns = [400] + [8] * 30  # (one shard past the size that comes back with its run)
    a = [rng.standard_normal((n, n)) for n in ns]
    b = [rng.standard_normal((n, n)) for n in ns]
    drt = vd.Runtime(client, device="cpu", nb=NB)
    f1 = drt.gemm(a=a, b=b)
    drt.gemm(a=a, b=b, c=f1, beta=1.0, overwrite=True).result()  # c := A B + c
    got = f1.result()
    for i, (x, y, r) in enumerate(zip(a, b, got)):
        assert np.allclose(r, 2 * (x @ y)), i


def test_close_drops_what_the_runtime_left_on_the_workers(client):
    mats, _ = _batch(18, count=10)
    before = _held_anywhere(client)
    with vd.Runtime(client, device="cpu", nb=NB) as drt:
        fut = drt.cholesky(mats)
        fut.result()
        made = drt.spd(np.array([3, 5]), seed=1)
        made.gather()
        assert _held_anywhere(client) - before
    assert not _held_anywhere(client) - before


def test_an_oserror_a_shard_raises_is_its_error_not_a_lost_worker(client):
    mats, _ = _batch(19, count=10)
    drt = vd.Runtime(client, device="cpu", nb=NB)
    client.run(_fail_shards, FileNotFoundError("a shard's own OSError"))
    try:
        with pytest.raises(FileNotFoundError, match="own OSError"):
            drt.cholesky(mats).result()
    finally:
        client.run(_let_shards_run)
    res = drt.cholesky(mats).result()  # (every worker still serves this runtime)
    assert len(res.info) == len(mats)
    assert len({s.worker for s in drt.cholesky(mats).shards}) == 2


@pytest.mark.gpu
def test_gpu_workers_give_a_single_runtimes_results():
    from distributed import Client

    cluster = vd.local_cluster(device="cuda")
    with Client(cluster) as c:
        vd.wait_for_workers(c, len(cluster.workers))
        mats, _ = _batch(7, count=200, nmax=300)
        drt = vd.Runtime(c, device="cuda")
        got = drt.cholesky(mats).result()
        want = vbatch.Runtime("cuda").cholesky(mats).result()
        assert np.array_equal(got.info, want.info)
        for i, (a, f) in enumerate(zip(mats, got.factors)):
            check_factor(a, f, np.float64, where=f"problem {i}")
        made = drt.spd(np.arange(0, 300, 7))
        assert not drt.cholesky(made).result().info.any()
    cluster.close()


def test_a_pipeline_on_batches_made_on_the_workers(client):
    drt = vd.Runtime(client, device="cpu", nb=NB)
    ns = np.array(edge_sizes(NB) + [9, 33])
    a = drt.spd(ns, seed=2)
    b = drt.random(ns, np.arange(len(ns)) % 3, like=a, seed=3)
    chol = drt.cholesky(a)
    x = drt.potrs(chol, b, after=[chol]).result()
    for i, (ai, bi, xi) in enumerate(zip(a.gather(), b.gather(), x)):
        full = np.tril(ai) + np.tril(ai, -1).T
        assert np.linalg.norm(full @ xi - bi) <= 1e-10 * max(1.0, np.linalg.norm(bi)), i


@pytest.fixture(scope="module")
def nodes():
    """A scheduler and two workers started as on separate nodes (``dask scheduler``, then
    ``dask worker ADDRESS`` twice, each its own process that only knows the address), and a
    client connected by that address: the multi-node deployment of docs/guide.md on one
    machine."""
    import socket
    import subprocess
    import sys

    from distributed import Client

    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    for _ in range(3):  # (a port found free may be taken before the scheduler binds it)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        address = f"tcp://127.0.0.1:{port}"
        procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                                   "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                  **quiet)]
        try:
            procs[0].wait(2)  # (exits at once if the port is taken)
        except subprocess.TimeoutExpired:
            break
    procs += [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address,
                                "--nthreads", "1", "--no-dashboard", "--name", f"node{i}"],
                               **quiet) for i in range(2)]
    try:
        c = Client(address, timeout=60)
        vd.wait_for_workers(c, 2)
        yield c
        c.close()
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            p.wait(30)


def test_two_worker_processes_that_only_know_the_schedulers_address(nodes):
    """Results, an after= pipeline on the workers and batches made there, as on a local
    cluster."""
    mats, rng = _batch(11)
    drt = vd.Runtime(nodes, device="cpu", nb=NB)
    chol = drt.cholesky(mats)
    assert len({s.worker for s in chol.shards}) == 2
    got = chol.result()
    want = vbatch.Runtime("cpu", nb=NB).cholesky(mats).result()
    assert np.array_equal(got.info, want.info)
    for i, (a, f) in enumerate(zip(mats, got.factors)):
        if want.info[i] == 0:
            check_factor(a, f, np.float64, where=f"problem {i}")
    rhs = [rng.standard_normal((a.shape[0], 2)) for a in mats]
    for i, (a, b, x) in enumerate(zip(mats, rhs, drt.potrs(chol, rhs, after=[chol]).result())):
        assert np.linalg.norm(a @ x - b) <= 1e-10 * max(1.0, np.linalg.norm(b)), i
    made = drt.spd(np.array([0, 1, NB - 1, NB, NB + 1, 40]), seed=4)
    assert not drt.cholesky(made, overwrite=True).result().info.any()
