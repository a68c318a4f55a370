"""Real SPD matrices from public collections (../shared/data/matrices, or $VBATCH_MATRICES).

Block-Jacobi leaves and multifrontal-like fronts are diagonal blocks of these matrices: SPD with
the conditioning of real problems (494_bus and 1138_bus are near 1e6-1e7). Skips when the folder
is absent (it is never copied into the repository).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from _check import check_factor
from conftest import DEVICES
from vbatch import Runtime

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.environ.get(
    "VBATCH_MATRICES", os.path.join(HERE, "..", "..", "shared", "data", "matrices")
)
FILES = ["494_bus.mtx", "1138_bus.mtx", "bcsstk09.mtx", "gr_900_900_crg.mtx"]


def load(name: str) -> np.ndarray:
    from scipy.io import mmread

    path = os.path.join(FOLDER, name)
    if not os.path.exists(path):
        pytest.skip(f"real matrices not found at {FOLDER} (set VBATCH_MATRICES)")
    return np.asarray(mmread(path).toarray(), dtype=np.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("name", FILES)
def test_diagonal_blocks_of_real_matrices(device, dtype, name):
    """complex128: ``U A U^H`` for a random diagonal unitary ``U``, a Hermitian matrix with
    complex entries off the diagonal and A's conditioning."""
    a = load(name)
    rng = np.random.default_rng(0)
    if dtype == np.complex128:
        u = np.exp(2j * np.pi * rng.uniform(0, 1, a.shape[0]))
        a = (u[:, None] * a) * u.conj()[None, :]
    cuts = np.unique(np.r_[0, np.sort(rng.choice(np.arange(1, a.shape[0]), 25, replace=False)),
                          a.shape[0]])
    blocks = [a[s:e, s:e] for s, e in zip(cuts[:-1], cuts[1:])] + [a]  # leaves plus the whole
    mats = blocks
    if device == "cuda":
        import cupy

        mats = [cupy.asarray(b) for b in blocks]
    res = Runtime(device, nb=32).cholesky(mats).result()
    assert not res.info.any()
    for i, (b, f) in enumerate(zip(blocks, res.factors)):
        check_factor(b, f, dtype, where=f"{name} block {i} (n={b.shape[0]})")
