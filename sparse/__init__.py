"""``vbatch.sparse``: a multifrontal sparse Cholesky on vbatch.

    >>> import numpy as np, scipy.sparse as sp, vbatch.sparse
    >>> A = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(6, 6), format="csr")
    >>> F = vbatch.sparse.cholesky(A)
    >>> x = F.solve(np.ones(6))
    >>> bool(np.allclose(A @ x, 1.0)), F.info.tolist()
    (True, [0])

:func:`cholesky` takes one scipy sparse SPD matrix, or a list of them. Only the **lower
triangle** (diagonal included) is read; a matrix that stores one triangle only may store either
(an upper one is read as its transpose), and one that stores both must be symmetric (checked).

* Analysis (:mod:`vbatch.sparse.analysis`): ordering, elimination tree, supernodes, fronts and
  their index maps, from the pattern alone: one per pattern (matrices of a batch with one
  pattern share it).
* Numeric factorization: every front of every matrix lives in one packed workspace on the
  runtime's device; A's entries are scattered into it (one vectorized scatter), and the fronts'
  partial Cholesky factorizations and extend-adds run as one task graph
  (:mod:`vbatch.ops.frontal`): one submission, whatever the depth of the trees; subtrees of
  small fronts as one launch per size class (``Runtime(tree_max=...)``).
* Solve: forward and backward substitution over the fronts, as one task graph too
  (:func:`vbatch.ops.frontal.frontal_solve_graph`): two sweeps over every front of the
  batch, one launch each whatever the trees' depth, with b moved into the fronts and the
  solution out in the same graph; many right-hand sides at once. A batch's
  right-hand sides may come as a list (one array a matrix) or stacked (one array, the
  matrices' rows one after another): the stacked form makes no Python object per matrix.

A matrix that is not positive definite gets ``info[i] > 0``: 1 + the index (in the matrix's own
numbering) of the column whose pivot was not positive, the first in the elimination order, as
CHOLMOD reports it. The other matrices of the batch are factored as if alone.
"""

from vbatch.sparse.analysis import Analysis, analyze
from vbatch.sparse.factor import Factor, Solutions, Stats, cholesky
from vbatch.ops.frontal import reference  # noqa: F401 - the numpy reference, public
from vbatch.sparse.matrices import laplacian, read

__all__ = ["cholesky", "Factor", "Solutions", "Stats", "Analysis", "analyze", "laplacian",
           "read"]
