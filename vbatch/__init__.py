"""vbatch: a task-graph runtime for variable-size batched dense linear algebra on GPUs.

    >>> import numpy as np, vbatch
    >>> mats = [np.eye(n) * 4.0 for n in (3, 1, 5)]
    >>> res = vbatch.cholesky(mats).result()
    >>> [float(f[0, 0]) for f in res.factors], res.info.tolist()
    ([2.0, 2.0, 2.0], [0, 0, 0])

The code lives in layers, each importing only those below it: ``vbatch.core`` (the vocabulary:
errors, operand forms, the task graph and kinds) < ``vbatch.ops`` < ``vbatch.scheduler`` <
``vbatch.kernels`` < ``vbatch.runtime`` < {``vbatch.sparse``, ``vbatch.distributed``}
(pyproject.toml's import-linter contracts, checked in CI); this module re-exports the public API.
"""

import importlib.util as _ilu
import os as _os
import sys as _sys

# Installed, the subpackages sit inside this folder (setuptools package-dir mapping). Run from a
# source checkout (`python -m vbatch` in the repository root puts the root on sys.path ahead of
# site-packages) they sit beside it, at the repository root: a finder maps exactly those (not the
# whole root: benchmarks/ and tests/ are not part of the package) to their vbatch.* names, each
# loaded when first imported, as an installed one is (`import vbatch` loads neither
# vbatch.sparse nor vbatch.distributed).
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
# vbatch.<name>: folder. vbatch.distributed lives in cluster/ (a root folder named distributed/
# would hide Dask's own package whenever the root is on sys.path; cluster/__init__.py).
_SUBPACKAGES = {"ops": "ops", "scheduler": "scheduler", "kernels": "kernels",
                "runtime": "runtime", "sparse": "sparse", "distributed": "cluster"}


class _Checkout:
    """A meta-path finder for the subpackages of a source checkout (see above)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        top, _, rest = name.partition(".")[2].partition(".")
        if not name.startswith("vbatch.") or top not in _SUBPACKAGES or rest:
            return None  # (their modules are found through the package's __path__)
        folder = _os.path.join(_root, _SUBPACKAGES[top])
        return _ilu.spec_from_file_location(name, _os.path.join(folder, "__init__.py"),
                                            submodule_search_locations=[folder])


if not _os.path.isdir(_os.path.join(_here, "runtime")) and _os.path.isfile(
    _os.path.join(_root, "runtime", "__init__.py")
):
    _sys.meta_path.insert(0, _Checkout)

from vbatch.core.batch import PackedBatch  # noqa: E402
from vbatch.core.errors import InputError  # noqa: E402
from vbatch.ops import (  # noqa: E402
    OPS,
    CholeskyRequest,
    cholesky_flops,
    reference,
    residual,
)
import vbatch.runtime as _runtime  # noqa: E402
from vbatch.runtime import (  # noqa: E402
    API,
    CholeskyResult,
    Config,
    DependencyError,
    Future,
    PosvResult,
    Prepared,
    Runtime,
    cuda_status,
    default_runtime,
    pack,
    prepare,
)
from vbatch.scheduler import Launch, Plan, make_plan, plan_cholesky  # noqa: E402

# cholesky, gemm, ...: one function per registered operation (vbatch.runtime.API)
globals().update({_name: getattr(_runtime, _name) for _name in API})

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "CholeskyRequest",
    "Config",
    "CholeskyResult",
    "DependencyError",
    "Future",
    "InputError",
    "Launch",
    "PackedBatch",
    "Plan",
    "Prepared",
    "Runtime",
    "cholesky_flops",
    "cuda_status",
    "default_runtime",
    "make_plan",
    "pack",
    "plan_cholesky",
    "prepare",
    "reference",
    "residual",
    "PosvResult",
    *API,
]
