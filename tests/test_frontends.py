"""Arrays of other frameworks in and out, through DLPack, on every backend.

Every op takes torch tensors and JAX arrays (lists, and packed buffers) and gives its outputs back
as that framework's arrays, viewing vbatch's output memory (no copy). The frameworks run where
they are installed (torch and JAX are on the GPU machine; CI has neither), and a minimal
DLPack-only array type, registered the way a user would register another framework, runs
everywhere: it has nothing but ``__dlpack__`` and ``__dlpack_device__``, so any place that
treated it as a numpy or cupy array would fail here.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import DEVICES

import vbatch
from vbatch import InputError
from vbatch.core import frontends
from vbatch.ops import gemm_reference, potrs_reference


class Fake:
    """An array of a framework vbatch has never heard of: DLPack only."""

    __module__ = "fakearray"

    def __init__(self, arr):
        self.arr = arr  # numpy or cupy

    def __dlpack__(self, **kw):
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def _fake_from_dlpack(x):
    dev = int(x.__dlpack_device__()[0])
    if dev == 2:
        import cupy

        return Fake(cupy.from_dlpack(x))
    return Fake(np.from_dlpack(x))


frontends.register("fakearray", _fake_from_dlpack)

FRONTENDS = ["fake"] + [f for f in ("torch", "jax") if importlib.util.find_spec(f)]


def _to(fe, device, a):
    """numpy ``a`` as an array of framework ``fe`` on ``device``."""
    if fe == "fake":
        if device == "cuda":
            import cupy

            return Fake(cupy.asarray(a))
        return Fake(np.array(a, order="C", copy=True))
    if fe == "torch":
        import torch

        t = torch.from_numpy(np.array(a, order="C", copy=True))
        return t.cuda() if device == "cuda" else t
    import jax

    jax.config.update("jax_enable_x64", True)  # else JAX takes float64 in as float32
    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    return jax.device_put(np.ascontiguousarray(a), dev)


def _back(fe, x):
    """An output array of framework ``fe`` as numpy (and a check that it is of ``fe``)."""
    if fe == "fake":
        assert isinstance(x, Fake), type(x)
        a = x.arr
    elif fe == "torch":
        import torch

        assert isinstance(x, torch.Tensor), type(x)
        a = x
    else:
        import jax

        assert isinstance(x, jax.Array), type(x)
        a = x
    if hasattr(a, "get"):
        return a.get()
    if fe == "torch":
        return a.cpu().numpy()
    return np.asarray(a)


def _frontend_param(fe):
    return pytest.param(fe, marks=pytest.mark.skipif(
        fe not in FRONTENDS, reason=f"{fe} is not installed"))


ALL = [_frontend_param(f) for f in ("fake", "torch", "jax")]


def _spd(rng, n):
    g = rng.standard_normal((n, n))
    return g @ g.T / max(n, 1) + 2 * np.eye(n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fe", ALL)
def test_every_op_takes_and_gives_the_callers_arrays(device, fe):
    rng = np.random.default_rng(3)
    ns = [0, 1, 31, 32, 33, 70]
    A = [_spd(rng, n) for n in ns]
    B = [rng.standard_normal((n, r)) for n, r in zip(ns, (2, 0, 1, 3, 33, 5))]
    rt = vbatch.Runtime(device)
    a = [_to(fe, device, x) for x in A]
    b = [_to(fe, device, x) for x in B]
    before = [_back(fe, x).copy() for x in a]

    res = rt.cholesky(a).result()
    assert res.ok and len(res.factors) == len(ns)
    L = [_back(fe, f) for f in res.factors]
    for x, fac in zip(A, L):
        assert np.all(np.isfinite(fac))
        assert np.linalg.norm(fac @ fac.T - x) <= 4 * max(len(x), 1) * 2e-16 * np.linalg.norm(x)

    X = [_back(fe, x) for x in rt.potrs(res.factors, b).result()]
    for fac, bb, x in zip(L, B, X):
        assert np.allclose(x, potrs_reference(fac, bb), rtol=1e-10, atol=1e-10)

    sol = rt.posv(a, b).result()
    assert sol.ok
    for x, bb, s in zip(A, B, sol.solutions):
        s = _back(fe, s)
        assert np.linalg.norm(x @ s - bb) <= 1e-10 * (np.linalg.norm(x) * np.linalg.norm(s) + 1)

    G = [rng.standard_normal((n, 4)) for n in ns]
    H = [rng.standard_normal((4, r)) for r in (2, 0, 1, 3, 33, 5)]
    C = [_back(fe, c) for c in rt.gemm([_to(fe, device, g) for g in G],
                                       [_to(fe, device, h) for h in H]).result()]
    for g, h, c in zip(G, H, C):
        assert np.allclose(c, gemm_reference(g, h), rtol=1e-12, atol=1e-12)
    S = rt.syrk([_to(fe, device, g) for g in G], alpha=1.0).result()
    for g, s in zip(G, S):
        assert np.allclose(_back(fe, s), np.tril(g @ g.T), rtol=1e-12, atol=1e-12)
    T = [np.tril(x) for x in A]
    Y = rt.trsm([_to(fe, device, t) for t in T], b).result()
    for t, bb, y in zip(T, B, Y):
        assert np.allclose(t @ _back(fe, y), bb, rtol=1e-9, atol=1e-9)
    W = rt.trmm([_to(fe, device, t) for t in T], b, side="left").result()
    for t, bb, w in zip(T, B, W):
        assert np.allclose(_back(fe, w), t @ bb, rtol=1e-12, atol=1e-12)
    for x, was in zip(a, before):  # inputs untouched
        assert np.array_equal(_back(fe, x), was)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fe", ALL)
@pytest.mark.parametrize("order", ["F", "C"])
def test_a_packed_buffer_of_the_callers_kind(device, fe, order):
    rng = np.random.default_rng(4)
    ns = np.array([3, 0, 33, 1])
    A = [_spd(rng, n) for n in ns]
    from vbatch.core.batch import tight_layout

    off, ld, total = tight_layout(ns, ns, order)
    data = np.zeros(total)
    for i, x in enumerate(A):
        data[off[i]: off[i] + x.size] = (x if order == "C" else x.T).reshape(-1)
    pb = vbatch.PackedBatch.from_buffer(_to(fe, device, data), n=ns, offset=off, ld=ld,
                                        order=order)
    assert pb.frontend == ("fakearray" if fe == "fake" else fe)
    assert pb.kind == ("cupy" if device == "cuda" else "numpy")
    res = vbatch.Runtime(device).cholesky(pb).result()
    out = res.factors
    assert isinstance(out, vbatch.PackedBatch) and out.frontend == pb.frontend
    whole = _back(fe, out.buffer)
    for i, x in enumerate(A):
        fac = _back(fe, out.matrix(i))
        assert np.allclose(fac @ fac.T, x, rtol=1e-12, atol=1e-12)
        assert fac.shape == x.shape
    assert whole.shape == data.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fe", [_frontend_param(f) for f in ("fake", "torch")])
def test_outputs_share_the_output_buffer(device, fe):
    """No copy on the way out: each output matrix is a view of the output buffer (torch: the
    same address; both: a write through it shows in the buffer). JAX is left out: its arrays
    are immutable, and whether its from_dlpack copies is JAX's choice."""
    rng = np.random.default_rng(5)
    A = [_spd(rng, n) for n in (4, 9)]
    out = vbatch.Runtime(device).cholesky([_to(fe, device, x) for x in A]).result().factors
    batch = out.batch
    if fe == "torch":
        base = batch.data.data.ptr if device == "cuda" else batch.data.ctypes.data
        isz = batch.dtype.itemsize
        for i, f in enumerate(out):
            assert f.data_ptr() == base + int(batch.offset[i]) * isz
    f0 = out[0]
    (f0.arr if fe == "fake" else f0)[0, 0] = 123.0
    assert float(batch._view(0)[0, 0]) == 123.0


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_writes_the_callers_tensors(device):
    pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    A = [_spd(rng, n) for n in (5, 40)]
    a = [_to("torch", device, x) for x in A]
    res = vbatch.Runtime(device).cholesky(a, overwrite=True).result()
    assert all(f is t for f, t in zip(res.factors, a))
    for x, t in zip(A, a):
        fac = np.tril(_back("torch", t))
        assert np.allclose(fac @ fac.T, x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_foreign_input_is_named(device):
    rt = vbatch.Runtime(device)
    a = [_to("fake", device, np.eye(2)), _to("fake", device, np.eye(3))]
    kind = "cupy" if device == "cuda" else "numpy"
    with pytest.raises(InputError, match=rf"b holds {kind} arrays but a holds fakearray arrays"):
        rt.gemm(a, [_eye_like(device, 2), _eye_like(device, 3)])
    with pytest.raises(InputError, match=rf"problem 1: is a {kind} array but problem 0 is "
                                         r"fakearray"):
        rt.cholesky([a[0], _eye_like(device, 3)])
    if "torch" in FRONTENDS:
        import torch

        t = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
        with pytest.raises(InputError, match=r"problem 0: cannot read this torch array "
                                             r"through DLPack: .*gradient"):
            rt.cholesky([t])
    if "jax" in FRONTENDS:
        j = _to("jax", device, np.eye(3))
        with pytest.raises(InputError, match=r"jax arrays are immutable"):
            rt.cholesky([j], overwrite=True)
        with pytest.raises(InputError, match=r"jax arrays are immutable"):
            rt.trsm([j], [_to("jax", device, np.ones((3, 1)))], overwrite=True)


def _cupy_eye(n):
    import cupy

    return cupy.eye(n)


def _eye_like(device, n):
    return _cupy_eye(n) if device == "cuda" else np.eye(n)


class FakeImmutable(Fake):
    """A DLPack-only framework whose arrays cannot be written (as JAX's)."""

    __module__ = "fakeimmutable"


frontends.register("fakeimmutable", lambda x: FakeImmutable(_fake_from_dlpack(x).arr),
                   immutable=True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_call_is_not_found_by_an_equal_layout_of_another_framework(device):
    """A batch of a layout equal to a kept call's operand, over another framework's buffer,
    is validated as on a first call: a call of two array kinds is refused, and so is an
    in-place call on an immutable framework's buffer, which stays as it was."""
    from vbatch.core.batch import PackedBatch

    xp = pytest.importorskip("cupy") if device == "cuda" else np
    rng = np.random.default_rng(5)
    shapes = [(3, 3), (4, 4), (2, 2), (0, 0)]
    mats = [a @ a.T + len(a) * np.eye(len(a)) for a in (rng.standard_normal(s) for s in shapes)]
    rt = vbatch.Runtime(device)
    for _ in range(3):
        a, b = (vbatch.pack([xp.asarray(m) for m in mats], order="F") for _ in range(2))
        rt.gemm(a, b).result()
        rt.cholesky(b, overwrite=True).result()
    for cls in (Fake, FakeImmutable):
        other = PackedBatch.from_buffer(cls(a.data.copy()), n=a.n, order="F")
        with pytest.raises(InputError, match="one array kind"):
            rt.gemm(a, other)
    before = a.data.copy()
    other = PackedBatch.from_buffer(FakeImmutable(before.copy()), n=a.n, order="F")
    with pytest.raises(InputError, match="immutable"):
        rt.cholesky(other, overwrite=True)
    assert bool((other.data == before).all())


def test_views_are_made_when_touched():
    """A list's results are views made on access: nothing per matrix until one is read."""
    from vbatch.core.batch import Views

    rng = np.random.default_rng(8)
    A = [_spd(rng, n) for n in (3, 0, 7, 2)]
    out = vbatch.Runtime("cpu").cholesky(A).result().factors
    assert isinstance(out, Views) and out._all is None
    f2 = out[2]
    assert out._all is None  # one index made one view
    assert np.allclose(f2 @ f2.T, A[2])
    assert out[-1].shape == (2, 2) and out[1].shape == (0, 0)
    assert [x.shape for x in out[1:3]] == [(0, 0), (7, 7)]
    with pytest.raises(IndexError):
        out[4]
    with pytest.raises(TypeError):
        out[1.0]
    assert [x.shape for x in out] == [(3, 3), (0, 0), (7, 7), (2, 2)]
    assert len(list(out)) == 4 and len(out + [np.eye(1)]) == 5
