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
# site-packages) they sit beside it, at the repository root. Load exactly those four under their
# vbatch.* names (not the whole root: benchmarks/ and tests/ are not part of the package). All
# four are registered before any runs, since they import one another.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
# vbatch.<name>: folder. vbatch.distributed lives in cluster/ (a root folder named distributed/
# would hide Dask's own package whenever the root is on sys.path; cluster/__init__.py).
_SUBPACKAGES = {"ops": "ops", "scheduler": "scheduler", "kernels": "kernels",
                "runtime": "runtime", "sparse": "sparse", "distributed": "cluster"}
if not _os.path.isdir(_os.path.join(_here, "runtime")) and _os.path.isfile(
    _os.path.join(_root, "runtime", "__init__.py")
):
    _pending = []
    for _name in _SUBPACKAGES:
        if f"vbatch.{_name}" in _sys.modules:
            continue
        _dir = _os.path.join(_root, _SUBPACKAGES[_name])
        _spec = _ilu.spec_from_file_location(f"vbatch.{_name}", _os.path.join(_dir, "__init__.py"),
                                             submodule_search_locations=[_dir])
        _mod = _ilu.module_from_spec(_spec)
        _sys.modules[_spec.name] = _mod
        globals()[_name] = _mod
        _pending.append((_spec, _mod))
    for _spec, _mod in _pending:
        _spec.loader.exec_module(_mod)

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
