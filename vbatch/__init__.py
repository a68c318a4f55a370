"""vbatch: a task-graph runtime for variable-size batched dense linear algebra on GPUs.

    >>> import numpy as np, vbatch
    >>> mats = [np.eye(n) * 4.0 for n in (3, 1, 5)]
    >>> res = vbatch.cholesky(mats).result()
    >>> [float(f[0, 0]) for f in res.factors], res.info.tolist()
    ([2.0, 2.0, 2.0], [0, 0, 0])

The code lives in layers, each importing only those below it: ``vbatch.core`` (the vocabulary:
errors, operand forms, the task graph and kinds) < ``vbatch.ops`` < ``vbatch.scheduler`` <
``vbatch.kernels`` < ``vbatch.runtime`` < {``vbatch.sparse``, ``vbatch.distributed``}
(pyproject.toml's import-linter contracts, checked in CI); this module re-exports the public API,
imported when a name of it is first touched.
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

# The public API, bound here when first touched (`vbatch.cholesky`, `from vbatch import
# Runtime`): importing it takes numpy, pydantic and the layers (0.35-0.42 s on an H100 host),
# which `import vbatch` alone no longer pays (docs/decisions.md#lazy-import). Name -> module.
_EXPORTS = {
    "OPS": "vbatch.ops",
    "CholeskyRequest": "vbatch.ops",
    "Config": "vbatch.runtime",
    "CholeskyResult": "vbatch.runtime",
    "DependencyError": "vbatch.runtime",
    "Future": "vbatch.runtime",
    "InputError": "vbatch.core.errors",
    "Launch": "vbatch.scheduler",
    "PackedBatch": "vbatch.core.batch",
    "Plan": "vbatch.scheduler",
    "Prepared": "vbatch.runtime",
    "Runtime": "vbatch.runtime",
    "cholesky_flops": "vbatch.ops",
    "cuda_status": "vbatch.runtime",
    "default_runtime": "vbatch.runtime",
    "make_plan": "vbatch.scheduler",
    "pack": "vbatch.runtime",
    "plan_cholesky": "vbatch.scheduler",
    "prepare": "vbatch.runtime",
    "reference": "vbatch.ops",
    "residual": "vbatch.ops",
    "PosvResult": "vbatch.runtime",
    "GetrfResult": "vbatch.ops.getrf",
    "GesvResult": "vbatch.ops.getrs",
    "API": "vbatch.runtime",
}

__version__ = "0.1.0"


def _load() -> None:
    """Import the public API and bind it in this module (with the subpackages that import
    sets as attributes: ``vbatch.ops``, ``vbatch.runtime``, ...)."""
    import importlib

    g = globals()
    for name, module in _EXPORTS.items():
        g[name] = getattr(importlib.import_module(module), name)
    runtime = importlib.import_module("vbatch.runtime")
    # cholesky, gemm, ...: one function per registered operation (vbatch.runtime.API)
    g.update({name: getattr(runtime, name) for name in runtime.API})
    g["__all__"] = [name for name in _EXPORTS if name != "API"] + list(runtime.API)


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'vbatch' has no attribute {name!r}")
    if "__all__" not in globals():
        _load()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module 'vbatch' has no attribute {name!r}")


def __dir__() -> list:
    if "__all__" not in globals():
        _load()
    return sorted(set(globals()) | set(globals()["__all__"]))
