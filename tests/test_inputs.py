"""Bad input gets a clear error naming the problem, before any work; good input is left alone."""

from __future__ import annotations

import numpy as np
import pytest

import vbatch
from vbatch import InputError, PackedBatch, Runtime
from vbatch.kernels.cpu import CpuBackend
from _check import plan_npiv
from conftest import DEVICES
from vbatch.ops.generate import spd, spd_list


def good(n=4, dtype=np.float64):
    return spd(n, dtype, np.random.default_rng(n))


BAD_LISTS = [
    ([good(), np.ones((3, 4))], r"problem 1: not square: shape \(3, 4\)"),
    ([good(), good(), np.ones(3)], r"problem 2: not 2-D: shape \(3,\)"),
    ([np.ones((2, 2, 2))], r"problem 0: not 2-D: shape \(2, 2, 2\)"),
    ([good(), good(3, np.float32)],
     r"problem 1: dtype float32 differs from problem 0's float64 \(a batch has one dtype\)"),
    ([np.eye(3, dtype=np.int64)],
     r"problem 0: unsupported dtype int64 \(supported: float32, float64, complex64, complex128\)"),
    ([good(), np.eye(2, dtype=np.complex128)],
     r"problem 1: dtype complex128 differs from problem 0.s float64 \(a batch has one dtype\)"),
    ([np.eye(2, dtype=np.float16)], r"problem 0: unsupported dtype float16"),
    ([good(), [[1.0]]], r"problem 1: expected a numpy, cupy, torch or JAX array .*got list"),
    (np.eye(3), r"expected a list of 2-D arrays or a vbatch.PackedBatch, got ndarray"),
    ({"a": good()}, r"expected a list of 2-D arrays or a vbatch.PackedBatch, got dict"),
]


@pytest.mark.parametrize("mats, msg", BAD_LISTS)
def test_bad_list_input_is_named(mats, msg, monkeypatch):
    touched = []
    monkeypatch.setattr(CpuBackend, "begin", lambda *a, **k: touched.append(a))
    with pytest.raises(InputError, match=msg):
        Runtime("cpu").cholesky(mats)  # raised by the call itself, not by result()
    assert not touched, "work started on invalid input"


def test_every_bad_problem_is_listed():
    mats = [good(), np.ones((2, 3)), good(), np.ones(4), np.eye(2, dtype=np.int32)]
    with pytest.raises(InputError) as exc:
        vbatch.cholesky(mats)
    assert [i for i, _ in exc.value.problems] == [1, 3, 4]
    assert str(exc.value).startswith("invalid batch (3 errors):\n  problem 1: not square")
    assert isinstance(exc.value, ValueError)


def test_long_error_lists_are_cut():
    with pytest.raises(InputError, match=r"and 20 more"):
        vbatch.cholesky([np.ones((2, 3))] * 30)


@pytest.mark.parametrize("npiv, msg", [
    ([1, 2], r"npiv must be an int or have one entry per problem \(3\)"),
    ([1, 9, 0], r"problem 1: npiv 9 outside \[0, n=4\]"),
    ([1, -1, 0], r"problem 1: npiv -1 outside"),
    (-2, r"problem 0: npiv -2 outside \[0, n=3\]"),
    ([0.5, 1, 1], r"npiv must hold integers, got dtype float64"),
    # One rule for a scalar and a list: a scalar is broadcast, then every entry is checked,
    # never clamped (it was silently clamped to each n before).
    (3, r"invalid batch: problem 2: npiv 3 outside \[0, n=2\]"),
    (5, r"problem 0: npiv 5 outside \[0, n=3\]\n  problem 1: npiv 5 outside \[0, n=4\]"),
    (1.0, r"npiv must hold integers, got float 1.0"),
    (np.float64(2.0), r"npiv must hold integers, got float64 2.0"),
    (True, r"npiv must be an int or one int per problem, got True"),
    ([True, False, True], r"npiv must hold integers, got dtype bool"),
    ("2", r"npiv must hold integers, got str '2'"),
])
def test_bad_npiv(npiv, msg):
    with pytest.raises(InputError, match=msg):
        Runtime("cpu").cholesky([good(3), good(4), good(2)], npiv)


@pytest.mark.parametrize("npiv", [2, np.int32(2), np.array(2), [2, 2, 2], np.array([2, 2, 2])])
def test_npiv_scalar_forms_broadcast(npiv):
    res = Runtime("cpu").cholesky([good(3), good(4), good(2)], npiv).result()
    assert plan_npiv(res.plan).tolist() == [2, 2, 2] and res.ok


def _buf(n=40):
    return np.zeros(n)


@pytest.mark.parametrize("kw, msg", [
    (dict(data=_buf(), n=[3, -1]), r"problem 1: negative size -1"),
    (dict(data=_buf(), n=[3, 3], ld=[3, 2]), r"problem 1: leading dimension 2 < max\(1, n\) = 3"),
    (dict(data=_buf(), n=[3, 3], offset=[0, -4]), r"problem 1: negative offset -4"),
    (dict(data=_buf(20), n=[3, 4]),
     r"problem 1: matrix \(n=4, ld=4, offset=9\) ends at element 25, "
     r"past the buffer's 20 elements"),
    (dict(data=_buf(), n=[3, 3], offset=[0, 5]), r"problem 1: overlaps problem 0"),
    (dict(data=_buf(), n=[3, 3], offset=[0, 9, 3]),
     r"n, offset and ld differ in length \(2, 3, 2\)"),
    (dict(data=np.zeros(40, dtype=np.int32), n=[3]), r"data: unsupported dtype int32"),
    (dict(data=np.zeros((40, 2))[:, 0], n=[3]), r"data must be contiguous"),
    (dict(data=[0.0] * 9, n=[3]), r"data must be a numpy or cupy array, got list"),
    (dict(data=_buf(), n=[[3]]), r"n must be 1-D"),
    (dict(data=_buf(), n=[3.5]), r"n must hold integers"),
])
def test_bad_packed_batch_is_named(kw, msg):
    with pytest.raises(InputError, match=msg):
        PackedBatch.from_buffer(**kw)


def test_bad_after_is_named():
    with pytest.raises(InputError, match=r"after\[1\] is a str, not a vbatch.Future"):
        rt = Runtime("cpu")
        f = rt.cholesky([good()])
        rt.cholesky([good()], after=[f, "x"])


@pytest.mark.parametrize("bad, msg", [
    (dict(nb=0), "nb"), (dict(policy="fifo"), "policy"), (dict(streams=0), "streams"),
    (dict(bogus=1), "bogus"),
])
def test_bad_runtime_options(bad, msg):
    with pytest.raises(InputError, match=msg):
        Runtime("cpu", **bad)


def test_unknown_device():
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu' or 'cuda', got 'tpu'"):
        Runtime("tpu")


def test_zero_size_and_empty_batches_are_valid():
    res = Runtime("cpu").cholesky([np.zeros((0, 0)), good(1), np.zeros((0, 0))]).result()
    assert res.info.tolist() == [0, 0, 0] and res.factors[0].shape == (0, 0)
    res = Runtime("cpu").cholesky([]).result()
    assert res.factors == [] and res.info.shape == (0,)


def test_inputs_are_not_modified():
    rng = np.random.default_rng(0)
    mats = spd_list([5, 17, 0, 33], np.float64, rng)
    before = [m.copy() for m in mats]
    packed = vbatch.pack(mats, order="F")
    pbefore = packed.data.copy()
    rt = Runtime("cpu", nb=8)
    for npiv in (None, [2, 9, 0, 30]):
        rt.cholesky(mats, npiv).result()
        rt.cholesky(packed, npiv).result()
    assert all(np.array_equal(a, b) for a, b in zip(mats, before))
    assert np.array_equal(packed.data, pbefore)


def test_overwrite_factors_in_place():
    rng = np.random.default_rng(1)
    mats = spd_list([5, 17, 33], np.float64, rng)
    ref = [np.linalg.cholesky(m) for m in mats]
    work = [m.copy() for m in mats]
    res = Runtime("cpu", nb=8).cholesky(work, overwrite=True).result()
    assert all(f is w for f, w in zip(res.factors, work))
    assert all(np.allclose(w, r) for w, r in zip(work, ref))

    packed = vbatch.pack(mats)
    res = Runtime("cpu", nb=8).cholesky(packed, overwrite=True).result()
    assert res.factors is packed
    assert all(np.allclose(packed.matrix(i), r) for i, r in enumerate(ref))


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_of_a_read_only_array_is_refused_at_submit(device, monkeypatch):
    """Named at submit, before any work (it used to fail in result(), after the work ran)."""
    from vbatch.kernels import get_backend

    touched = []
    backend = type(get_backend(device))
    monkeypatch.setattr(backend, "begin", lambda *a, **k: touched.append(a))
    mats = [good(3), good(4), good(5)]
    mats[1].flags.writeable = False
    rt = Runtime(device)
    with pytest.raises(InputError, match=r"problem 1: overwrite=True, but this array is "
                                         r"read-only"):
        rt.cholesky(mats, overwrite=True)
    packed = vbatch.pack([good(3), good(4)])
    packed.data.flags.writeable = False
    for npiv in (None, [1, 2]):
        with pytest.raises(InputError, match=r"overwrite=True, but the packed buffer is "
                                             r"read-only"):
            rt.cholesky(packed, npiv, overwrite=True)
    assert not touched, "work started on invalid input"
    # Read-only inputs are fine when nothing is written into them.
    monkeypatch.undo()
    assert rt.cholesky(mats).result().ok and rt.cholesky(packed).result().ok


@pytest.mark.parametrize("device", DEVICES)
def test_a_problem_too_large_for_memory_is_refused_at_submit(device):
    """n = 2^20 (8 TiB in float64) is named with the bytes it needs, before any allocation.
    A broadcast array stands in for it: valid input, no memory behind it."""
    rt = Runtime(device)
    huge = np.broadcast_to(np.float64(1.0), (2**20, 2**20))
    with pytest.raises(InputError, match=r"problem 1: n = 1048576 needs 8.0 TiB "
                                         r"\(1048576\^2 x 8 bytes\), more than the .* of "
                                         r"(host|GPU) memory"):
        rt.cholesky([good(3), huge])
    # Each fits, all together do not: a batch-wide error naming what it needs and what is free.
    total = rt.backend.memory_total()
    n = int(np.sqrt(total / 2 / 8))
    big = np.broadcast_to(np.float64(1.0), (n, n))
    with pytest.raises(InputError, match=r"the batch needs .* of (host|GPU) memory to run .* "
                                         r"but only .* is free"):
        rt.cholesky([big, big, big])
