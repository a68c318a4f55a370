"""vbatch: a task-graph runtime for variable-size batched dense linear algebra on GPUs.

    >>> import numpy as np, vbatch
    >>> mats = [np.eye(n) * 4.0 for n in (3, 1, 5)]
    >>> res = vbatch.cholesky(mats).result()
    >>> [float(f[0, 0]) for f in res.factors], res.info.tolist()
    ([2.0, 2.0, 2.0], [0, 0, 0])

The code lives in the sibling packages ``vbatch.ops``, ``vbatch.scheduler``, ``vbatch.kernels`` and
``vbatch.runtime``; this module re-exports the public API.
"""

import os as _os

# Installed, the subpackages sit inside this folder (setuptools package-dir mapping). Run from a
# source checkout (`python -m vbatch` in the repository root puts the root on sys.path ahead of
# site-packages) they sit beside it, at the repository root; make them importable from there too.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "runtime")) and _os.path.isfile(
    _os.path.join(_root, "runtime", "__init__.py")
):
    __path__.append(_root)  # noqa: F821 - __path__ is defined for packages

from vbatch.ops import (  # noqa: E402
    CholeskyRequest,
    InputError,
    PackedBatch,
    cholesky_flops,
    pack,
    reference,
    residual,
)
from vbatch.runtime import (  # noqa: E402
    CholeskyResult,
    DependencyError,
    Future,
    Runtime,
    cholesky,
    cuda_status,
    default_runtime,
)
from vbatch.scheduler import Launch, Plan, make_plan  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CholeskyRequest",
    "CholeskyResult",
    "DependencyError",
    "Future",
    "InputError",
    "Launch",
    "PackedBatch",
    "Plan",
    "Runtime",
    "cholesky",
    "cholesky_flops",
    "cuda_status",
    "default_runtime",
    "make_plan",
    "pack",
    "reference",
    "residual",
]
