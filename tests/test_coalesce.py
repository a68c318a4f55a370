"""Coalesced submissions (``Runtime(coalesce_us=...)``), on every backend: many threads submit
small problems, the runtime issues far fewer launch groups, and each submitter gets exactly its
own result, in its own form, with ``after=`` still holding."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np
import pytest

from vbatch import DependencyError, InputError, Runtime, pack
from vbatch.ops.generate import spd
from vbatch.runtime.coalesce import Part
from _check import check_factor, edge_sizes, to_host
from conftest import DEVICES

NB = 16  # the planner's panel width here: sizes below take in 0, 1, NB-1, NB, NB+1
# The longest window (a minute): a bucket then goes when the test sends it (rt.wait()), never
# because a slow machine let its window end early.
WINDOW = 60_000_000


def _threads(n, fn):
    out = [None] * n
    errors = []

    def run(i):
        try:
            out[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((i, exc))

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
        assert not t.is_alive(), "liveness guard: a thread never finished"
    return out, errors


def _xp(device):
    if device == "cuda":
        import cupy

        return cupy
    return np


@pytest.mark.parametrize("device", DEVICES)
def test_64_threads_one_problem_each_make_few_launch_groups(device):
    rng = np.random.default_rng(1)
    sizes = edge_sizes(NB) + [int(n) for n in rng.integers(0, 3 * NB, 64 - len(edge_sizes(NB)))]
    mats = [spd(n, np.float64, rng) for n in sizes]
    # A window of a minute (the longest): every submission joins the one bucket, however
    # slowly the threads start; rt.wait() sends it.
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW)
    start = threading.Barrier(64, timeout=60)
    futs, errors = _threads(64, lambda i: (start.wait(), rt.cholesky([mats[i]]))[1])
    assert not errors, errors
    rt.wait()
    res = [f.result() for f in futs]
    groups = rt._coalescer.groups
    assert groups == 1, f"{groups} launch groups for 64 submissions"
    assert rt._coalescer.members == 64
    for i, r in enumerate(res):
        assert isinstance(futs[i], Part)
        assert len(r.factors) == 1 and r.info.shape == (1,) and r.info[0] == 0
        check_factor(mats[i], r.factors[0], np.float64, where=f"thread {i}, n={sizes[i]}")
    rt.close()


@pytest.mark.parametrize("device", DEVICES)
def test_members_keep_their_own_info_forms_and_overwrites(device):
    xp = _xp(device)
    rng = np.random.default_rng(2)
    good = [xp.asarray(spd(n, np.float32, rng)) for n in (3, NB, NB + 1)]
    bad = xp.asarray(-np.eye(4, dtype=np.float32))  # fails at column 1
    mine = [xp.asarray(spd(5, np.float32, rng))]
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW)
    f1 = rt.cholesky(good[:2])
    f2 = rt.cholesky([good[2], bad])
    f3 = rt.cholesky(mine, overwrite=True)  # another bucket: overwrite differs
    f4 = rt.cholesky(good[:1])
    rt.wait()  # (sends both buckets)
    r1, r2, r3, r4 = (f.result() for f in (f1, f2, f3, f4))
    assert rt._coalescer.groups == 2
    assert r1.info.tolist() == [0, 0] and r2.info.tolist() == [0, 1] and r4.info.tolist() == [0]
    for a, f in zip(good[:2], r1.factors):
        check_factor(a, f, np.float32)
    check_factor(good[2], r2.factors[0], np.float32)
    check_factor(good[0], r4.factors[0], np.float32)
    assert type(r1.factors[0]) is type(good[0])  # the caller's kind of array
    assert r3.factors[0] is mine[0]  # overwrite: the caller's own arrays, written
    assert float(to_host(mine[0])[0, 1]) == 0.0  # (the upper triangle is zeroed)


@pytest.mark.parametrize("device", DEVICES)
def test_blas_members_coalesce_by_parameters(device):
    xp = _xp(device)
    rng = np.random.default_rng(3)
    shapes = [(0, 3, 2), (1, 1, 1), (NB, NB + 1, NB - 1), (5, 0, 7), (9, 4, 0)]
    a = [rng.standard_normal((m, k)) for m, _, k in shapes]
    b = [rng.standard_normal((k, n)) for _, n, k in shapes]
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW)
    futs = [rt.gemm([xp.asarray(a[i])], [xp.asarray(b[i])], alpha=2.0) for i in range(5)]
    other = rt.gemm([xp.asarray(a[2])], [xp.asarray(b[2])], alpha=3.0)  # another alpha
    rt.wait()
    got = [f.result() for f in futs]
    c3 = to_host(other.result()[0])
    assert rt._coalescer.groups == 2
    for i, g in enumerate(got):
        ref = 2.0 * a[i] @ b[i]
        c = to_host(g[0])
        assert c.shape == ref.shape
        assert np.all(np.isfinite(c))
        assert np.linalg.norm(c - ref) <= 8 * max(shapes[i]) * np.finfo(float).eps * max(
            1.0, np.linalg.norm(np.abs(a[i]) @ np.abs(b[i])))
    assert np.allclose(c3, 3.0 * a[2] @ b[2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_posv_member_failure_stays_its_own(device):
    rng = np.random.default_rng(4)
    a = [spd(n, np.float64, rng) for n in (NB, 1, NB + 1)]
    a[1] = -a[1]
    bs = [rng.standard_normal((x.shape[0], r)) for x, r in zip(a, (3, 2, 0))]
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW)
    futs = [rt.posv([a[i]], [bs[i]]) for i in range(3)]
    rt.wait()
    res = [f.result() for f in futs]
    assert rt._coalescer.groups == 1
    assert [int(r.info[0]) for r in res] == [0, 1, 0]
    x0 = to_host(res[0].solutions[0])
    assert np.linalg.norm(a[0] @ x0 - bs[0]) <= 1e-10 * np.linalg.norm(bs[0])
    assert np.array_equal(to_host(res[1].solutions[0]), bs[1])  # b unchanged where it failed
    assert to_host(res[2].solutions[0]).shape == (NB + 1, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_after_orders_members_of_one_kind_of_bucket(device):
    rng = np.random.default_rng(5)
    a, b, d = (rng.standard_normal((6, 6)) for _ in range(3))
    c = np.zeros((6, 6))
    e = np.zeros((6, 6))
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW)  # only ordering may send the bucket
    f1 = rt.gemm([a], [b], [c], overwrite=True)
    # Same parameters, so the same kind of bucket: f2 reads c, which f1 writes.
    f2 = rt.gemm([c], [d], [e], overwrite=True, after=[f1])
    assert rt._coalescer.groups == 1  # f1's bucket, sent off by f2's after=
    rt.wait()
    f2.result()
    assert rt._coalescer.groups == 2
    assert np.allclose(c, a @ b, rtol=1e-12, atol=1e-12)
    assert np.allclose(e, (a @ b) @ d, rtol=1e-12, atol=1e-12)
    # A direct submission (a packed factor, not coalescible) ordered after a member.
    spd_a = [spd(7, np.float64, rng)]
    fc = rt.cholesky(spd_a)
    rt.wait()
    fs = rt.potrs(fc.result().factors, [np.ones((7, 2))], after=[fc])
    x = to_host(fs.result()[0])
    assert np.allclose(spd_a[0] @ x, 1.0, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_large_and_packed_submissions(device):
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW, coalesce_max_n=8)
    ok = rt.cholesky([np.eye(3) * 4.0])
    with pytest.raises(InputError, match=r"problem 1: not square"):
        rt.cholesky([np.eye(2), np.ones((2, 3))])  # named in the caller's own numbering
    big = rt.cholesky([np.eye(9) * 4.0])  # larger than coalesce_max_n: straight through
    assert not isinstance(big, Part)
    assert big.result().info.tolist() == [0]
    packed = rt.cholesky(pack([np.eye(2) * 9.0]))  # a packed batch: straight through
    assert not isinstance(packed, Part)
    assert np.allclose(to_host(packed.result().factors.matrix(0)), np.eye(2) * 3.0)
    rt.wait()  # sends the open bucket
    assert ok.done() and rt._coalescer.groups == 1  # the large and packed ones were not in one
    assert np.allclose(to_host(ok.result().factors[0]), np.eye(3) * 2.0)
    nan = rt.cholesky([np.full((2, 2), np.nan)])  # passes (NaN is numerics), then fails
    rt.wait()
    assert nan.result().info.tolist() != [0]
    rt.close()


def test_a_failed_bucket_fails_each_member_and_their_dependents(monkeypatch):
    rt = Runtime("cpu", nb=NB, coalesce_us=WINDOW)
    boom = RuntimeError("backend failed")

    def fail(*args, **kw):
        raise boom

    # On the class: patching the shared backend instance would leave the method pinned there
    # (monkeypatch restores an attribute it did not find on the instance by setting it).
    monkeypatch.setattr(type(rt.backend), "begin", fail)
    f1 = rt.cholesky([np.eye(2)])
    f2 = rt.cholesky([np.eye(3)])
    after = rt.cholesky([np.eye(4)], after=[f1])  # sends f1's bucket first
    assert rt._coalescer.groups == 1 and not after.done()
    rt.wait()
    for f in (f1, f2):
        with pytest.raises(RuntimeError, match="backend failed"):
            f.result()
    with pytest.raises(DependencyError):
        after.result()


def test_a_joined_bucket_keeps_its_lists_addresses():
    """A bucket's joined list carries the device addresses its parts read (what the gather
    and the packed copy's order use), in the parts' order; none where a part has none."""
    from vbatch.core.batch import MatrixList
    from vbatch.ops.cholesky import POTRF
    from vbatch.core.errors import validated
    from vbatch.runtime.coalesce import _joined

    def req(ns, addr):
        r = validated(POTRF.request, batch=[np.eye(n) for n in ns])
        ml = r.batch
        with_addr = MatrixList.model_construct(**{**ml.__dict__, "addr": addr})
        return type(r).model_construct(**{**r.__dict__, "batch": with_addr})

    a1 = np.arange(6, dtype=np.int64).reshape(3, 2)
    a2 = 10 + np.arange(3, dtype=np.int64).reshape(3, 1)
    joined = _joined([req([2, 3], a1), req([4], a2)])
    assert joined["batch"].n.tolist() == [2, 3, 4]
    assert np.array_equal(joined["batch"].addr, np.concatenate([a1, a2], axis=1))
    assert _joined([req([2, 3], a1), req([4], None)])["batch"].addr is None


@pytest.mark.parametrize("device", DEVICES)
def test_a_member_that_stops_waiting_leaves_the_bucket_to_the_others(device):
    """The first member to wait builds every member's result; one whose wait times out before
    its bucket is even sent builds nothing and holds no one up: the others get theirs, and it
    gets its own later."""
    import concurrent.futures as cf

    xp = _xp(device)
    rng = np.random.default_rng(9)
    mats = [xp.asarray(spd(n, np.float64, rng)) for n in (1, NB - 1, NB + 1)]
    rt = Runtime(device, nb=NB, coalesce_us=WINDOW)  # the bucket goes when rt.wait() sends it
    futs = [rt.cholesky([m]) for m in mats]
    with pytest.raises(cf.TimeoutError):
        futs[0].result(timeout=0.01)
    got, errors = [None, None], []

    def member(i):
        try:
            got[i] = futs[i + 1].result()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    ts = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(2)]
    for t in ts:
        t.start()
    rt.wait()
    for t in ts:
        t.join(60)
        assert not t.is_alive(), "liveness guard: a member never got its result"
    assert not errors, errors
    assert rt._coalescer.groups == 1
    for i, r in enumerate([futs[0].result()] + got):
        assert r.info.shape == (1,) and r.info[0] == 0
        check_factor(to_host(mats[i]), to_host(r.factors[0]), np.float64, where=f"member {i}")
    assert all(f.done() for f in futs)
    rt.close()


def test_a_builder_that_stops_hands_the_build_on(monkeypatch):
    """A member building everyone's results that stops (its timeout, an interrupt) wakes the
    others at once, one of them builds instead, and the interrupt is its caller's alone: the
    other members get their results, and so does the interrupted one when it asks again. A
    member whose group is done gets its result at once though another member is building."""
    import time

    import vbatch.runtime.coalesce as co

    rng = np.random.default_rng(11)
    mats = [spd(n, np.float64, rng) for n in (2, NB, NB + 3)]
    rt = Runtime("cpu", nb=NB, coalesce_us=WINDOW)  # (the bucket goes when rt.wait() sends it)
    futs = [rt.cholesky([m]) for m in mats]
    # Member 1 builds and times out; member 2, waiting on the bucket while it builds (its
    # wait seen through the bucket's condition), is woken and builds instead.
    box = futs[0]._box
    waiting, first = threading.Event(), threading.Event()

    class Seen(threading.Condition):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    box.cv = Seen(threading.Lock())
    real_build, builders = co._build, []

    def build(b, deadline):
        builders.append(threading.current_thread().name)
        if len(builders) == 1:
            first.set()
            assert waiting.wait(60), "liveness guard: member 2 never waited"
        return real_build(b, deadline)

    monkeypatch.setattr(co, "_build", build)
    out: dict = {}

    def member(i, name, timeout):
        try:
            if i == 2:
                assert first.wait(60), "liveness guard: member 1 never built"
            out[name] = futs[i].result(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            out[name] = exc

    ts = [threading.Thread(target=member, args=(1, "one", 0.05), name="one", daemon=True),
          threading.Thread(target=member, args=(2, "two", None), name="two", daemon=True)]
    for t in ts:
        t.start()
    ts[0].join(60)
    assert not ts[0].is_alive() and isinstance(out["one"], cf.TimeoutError), out
    rt.wait()  # sends the bucket: member 2, the builder now, finishes
    ts[1].join(60)
    assert not ts[1].is_alive(), "liveness guard: member 2 was not woken"
    assert builders == ["one", "two"]
    check_factor(mats[2], out["two"].factors[0], np.float64, where="member 2")
    monkeypatch.setattr(co, "_build", real_build)

    real, calls = co._slice, []

    def interrupted(*a):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*a)

    futs = [rt.cholesky([m]) for m in mats]
    rt.wait()
    try:
        co._slice = interrupted
        with pytest.raises(KeyboardInterrupt):
            futs[0].result()
        for i in (1, 2, 0):
            check_factor(mats[i], futs[i].result().factors[0], np.float64, where=f"after {i}")
    finally:
        co._slice = real
    assert futs[0]._box.reqs == () and all(f._span is None for f in futs)

    futs = [rt.cholesky([m]) for m in mats]
    rt.wait()
    box = futs[0]._box
    with box.cv:
        box.building = True  # another member's pass under way
    t0 = time.monotonic()
    while not futs[0].done():
        assert time.monotonic() - t0 < 60, "liveness guard"
        time.sleep(0.001)
    check_factor(mats[0], futs[0].result(timeout=0).factors[0], np.float64, where="done")
    with box.cv:
        box.building = False
    rt.close()
