"""CI: vbatch installed without extras (numpy, scipy, networkx, pydantic, threadpoolctl) imports
and runs its dense ops on the CPU, and vbatch.sparse says which extra it needs. The test
environment has every extra, so only a separate core install catches an optional import that
leaked into the import path (numba did: vbatch.sparse is imported with every backend's
kernels)."""

import importlib.util
import sys

import numpy as np
import scipy.sparse as sp

import vbatch
import vbatch.sparse

assert importlib.util.find_spec("numba") is None, "this check needs an environment without numba"
a = [np.eye(n) * 4.0 + 0.5 for n in (3, 1, 5)]
res = vbatch.cholesky(a).result()
assert res.info.tolist() == [0, 0, 0]
for f, m in zip(res.factors, a):
    assert np.allclose(f @ f.T, m)
c = vbatch.gemm([np.ones((2, 3))], [np.ones((3, 4))]).result()[0]
assert np.array_equal(c, np.full((2, 4), 3.0))
x = vbatch.posv(a, [np.ones((n, 2)) for n in (3, 1, 5)]).result().solutions
assert all(np.allclose(m @ xi, 1.0) for m, xi in zip(a, x))
try:
    vbatch.sparse.cholesky(sp.eye(4, format="csr"))
except ImportError as exc:
    assert "vbatch.sparse needs numba" in str(exc) and "vbatch[sparse]" in str(exc), exc
else:
    sys.exit("vbatch.sparse ran without numba")
print("CI: core install ok (dense ops on the CPU; vbatch.sparse names its extra)")
