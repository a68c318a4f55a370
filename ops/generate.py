"""Test and benchmark batches: the papers' size distributions and SPD matrices of known quality.

Distributions (Abdelfattah et al., the MAGMA vbatched papers; the anchors use the same):

* ``uniform``: sizes uniform on ``[1, nmax]``;
* ``gauss``:   ``normal(nmax / 2, nmax / 6)``, rounded and clipped to ``[1, nmax]``;
* ``skewed``:  1% of sizes at ``nmax``, 99% uniform on ``[1, nmax / 10]``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from vbatch.core.batch import PackedBatch, tight_offsets

DISTRIBUTIONS = ("uniform", "gauss", "skewed")


def sizes(dist: str, count: int, nmax: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` sizes drawn from a named distribution (see the module docstring)."""
    if nmax < 1:
        raise ValueError(f"nmax must be >= 1, got {nmax}")
    if dist == "uniform":
        out = rng.integers(1, nmax + 1, size=count)
    elif dist == "gauss":
        out = np.clip(np.rint(rng.normal(nmax / 2, nmax / 6, size=count)), 1, nmax)
    elif dist == "skewed":
        out = rng.integers(1, max(1, nmax // 10) + 1, size=count)
        big = int(round(0.01 * count))
        out[rng.choice(count, size=big, replace=False)] = nmax
    else:
        raise ValueError(f"unknown distribution {dist!r} (choose from {', '.join(DISTRIBUTIONS)})")
    return out.astype(np.int64)


def spd(n: int, dtype=np.float64, rng: np.random.Generator | None = None,
        cond: float | None = None) -> np.ndarray:
    """One SPD matrix (C order, both triangles filled); Hermitian positive definite for a complex
    ``dtype``.

    Without ``cond``: off-diagonal entries uniform on [-1, 1] (complex: of magnitude at most 1)
    and ``n`` on the diagonal, which is positive definite by Gershgorin with a condition number
    below ``2n`` and costs O(n^2) to make. With ``cond``: ``Q diag(logspace(0, -log10(cond)))
    Q^H`` for a random orthogonal (unitary) ``Q`` (O(n^3)).
    """
    rng = rng or np.random.default_rng()
    if cond is None:
        r = uniform(rng, (n, n), dtype)
        a = (r + r.conj().T) * 0.5
        a[np.diag_indices(n)] = n
    else:
        g = rng.standard_normal((n, n))
        if np.dtype(dtype).kind == "c":
            g = g + 1j * rng.standard_normal((n, n))
        q, _ = np.linalg.qr(g)
        d = np.logspace(0, -np.log10(cond), n) if n > 1 else np.ones(n)
        a = (q * d) @ q.conj().T
        a = (a + a.conj().T) * 0.5
    return a.astype(dtype)


def uniform(rng: np.random.Generator, shape, dtype=np.float64) -> np.ndarray:
    """Entries uniform on [-1, 1]; for a complex ``dtype``, uniform on the unit disc's square
    [-1, 1]^2 scaled by 1/sqrt(2) (magnitude at most 1), in double precision."""
    if np.dtype(dtype).kind != "c":
        return rng.uniform(-1.0, 1.0, shape)
    return (rng.uniform(-1.0, 1.0, shape) + 1j * rng.uniform(-1.0, 1.0, shape)) / np.sqrt(2)


def unread_diagonal(rng: np.random.Generator, mats: list) -> list:
    """``mats``, complex ones given random imaginary parts on the diagonal, in place: a Hermitian
    factorization reads a diagonal's real part only (ZPOTRF), so an example carrying parts there
    checks that they change nothing."""
    for m in mats:
        if m.dtype.kind == "c":
            m[np.diag_indices(len(m))] += 1j * rng.uniform(-1.0, 1.0, len(m))
    return mats


def spd_list(ns, dtype=np.float64, rng: np.random.Generator | None = None,
             cond: float | None = None) -> list[np.ndarray]:
    rng = rng or np.random.default_rng()
    return [spd(int(n), dtype, rng, cond) for n in ns]


def spd_packed(ns, dtype=np.float64, rng: np.random.Generator | None = None,
               order: Literal["F", "C"] = "F") -> PackedBatch:
    """A packed batch of diagonally dominant SPD matrices, generated straight into the buffer."""
    rng = rng or np.random.default_rng()
    ns = np.asarray(ns, dtype=np.int64)
    ld = np.maximum(ns, 1)
    off = tight_offsets(ns, ld)
    data = np.empty(int((ld * ns).sum()), dtype=dtype)
    for i, n in enumerate(ns):
        n = int(n)
        if n:
            # Symmetric, so the F/C layouts hold the same numbers.
            data[off[i] : off[i] + n * n] = spd(n, dtype, rng).reshape(-1)
    return PackedBatch.from_buffer(data, ns, off, ld, order=order)


def make_indefinite(a: np.ndarray, col: int) -> np.ndarray:
    """Copy of SPD ``a`` whose leading minor of order ``col + 1`` is the first that is not
    positive definite, so LAPACK's ``info`` for it is ``col + 1``."""
    b = np.array(a, copy=True)
    # The pivot at `col` is a[col, col] - (earlier rows' contribution) > 0; lowering the diagonal
    # entry by more than a[col, col] makes it negative without touching earlier minors.
    b[col, col] = -abs(b[col, col]) - 1.0
    return b


# ----------------------------------------------------------------------------- op examples
# The conformance suite's operands (each op's ``example``, vbatch.ops.op.Example).
def square(rng: np.random.Generator, ns, dtype=np.float64) -> list[np.ndarray]:
    """Square matrices with entries uniform on [-1, 1] (:func:`uniform`)."""
    return [uniform(rng, (int(n), int(n)), dtype) for n in ns]


def triangular(rng: np.random.Generator, ns, dtype=np.float64) -> list[np.ndarray]:
    """Well-conditioned triangles, both halves filled (an op reads only its own)."""
    out = []
    for n in ns:
        n = int(n)
        t = uniform(rng, (n, n), dtype) / max(n, 1)
        np.fill_diagonal(t, rng.uniform(1, 2, n) * signs(rng, n, dtype))
        out.append(t)
    return out


def signs(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Random unit numbers: +-1, or e^(i theta) for a complex ``dtype``."""
    if np.dtype(dtype).kind != "c":
        return rng.choice([-1.0, 1.0], n)
    return np.exp(2j * np.pi * rng.uniform(0, 1, n))


def flips(flags: list[str], base: dict) -> list[dict]:
    """Parameter sets that turn ``flags`` on one at a time, then off again one at a time."""
    out, cur = [dict(base, **{f: False for f in flags})], {f: False for f in flags}
    for f in flags + flags:
        cur[f] = not cur[f]
        out.append(dict(base, **cur))
    return out
