"""Matrices to factor: read from a file (Matrix Market, or a triplet file of one triangle),
or the Dirichlet Laplacian on a grid."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def read(path: str) -> sp.csr_matrix:
    """A symmetric matrix from a file: Matrix Market (``.mtx``), or a 0-based ``i j value``
    triplet file holding one triangle (as ../shared/data/matrices/bcsstk16.triplet0), mirrored
    into both."""
    if path.endswith(".mtx"):
        from scipy.io import mmread

        return sp.csr_matrix(mmread(path))
    t = np.loadtxt(path, ndmin=2)
    n = int(t[:, :2].max()) + 1
    tri = sp.csr_matrix((t[:, 2], (t[:, 0].astype(int), t[:, 1].astype(int))), shape=(n, n))
    low = sp.tril(tri) if sp.tril(tri, -1).nnz or not sp.triu(tri, 1).nnz else sp.tril(tri.T)
    return sp.csr_matrix(low + sp.tril(low, -1).T)


def laplacian(side: int, dim: int = 2) -> sp.csr_matrix:
    """The Dirichlet Laplacian on a ``side^dim`` grid (the 5-point stencil in 2-D, 7-point in
    3-D; SPD, ``2 dim`` on the diagonal): the test and benchmark matrices of cuDSS's anchor."""
    t = sp.diags([-np.ones(side - 1), 2 * np.ones(side), -np.ones(side - 1)], [-1, 0, 1])
    eye = sp.eye(side)
    out = sp.csr_matrix((side**dim, side**dim))
    for d in range(dim):
        term = sp.eye(1)
        for e in range(dim):
            term = sp.kron(term, t if e == d else eye)
        out = out + term
    return sp.csr_matrix(out)
