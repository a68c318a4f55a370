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
    """One SPD matrix (C order, both triangles filled).

    Without ``cond``: off-diagonal entries uniform on [-1, 1] and ``n`` on the diagonal, which is
    SPD by Gershgorin with a condition number below ``2n`` and costs O(n^2) to make. With
    ``cond``: ``Q diag(logspace(0, -log10(cond))) Q^T`` for a random orthogonal ``Q`` (O(n^3)).
    """
    rng = rng or np.random.default_rng()
    if cond is None:
        r = rng.uniform(-1.0, 1.0, size=(n, n))
        a = (r + r.T) * 0.5
        a[np.diag_indices(n)] = n
    else:
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        d = np.logspace(0, -np.log10(cond), n) if n > 1 else np.ones(n)
        a = (q * d) @ q.T
        a = (a + a.T) * 0.5
    return a.astype(dtype)


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
def square(rng: np.random.Generator, ns) -> list[np.ndarray]:
    """Square matrices with entries uniform on [-1, 1]."""
    return [rng.uniform(-1, 1, (int(n), int(n))) for n in ns]


def triangular(rng: np.random.Generator, ns) -> list[np.ndarray]:
    """Well-conditioned triangles, both halves filled (an op reads only its own)."""
    out = []
    for n in ns:
        n = int(n)
        t = rng.uniform(-1, 1, (n, n)) / max(n, 1)
        np.fill_diagonal(t, rng.uniform(1, 2, n) * rng.choice([-1, 1], n))
        out.append(t)
    return out


def flips(flags: list[str], base: dict) -> list[dict]:
    """Parameter sets that turn ``flags`` on one at a time, then off again one at a time."""
    out, cur = [dict(base, **{f: False for f in flags})], {f: False for f in flags}
    for f in flags + flags:
        cur[f] = not cur[f]
        out.append(dict(base, **cur))
    return out
