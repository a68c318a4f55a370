"""numba where it is installed: compiled loops for the CPU kernels and ``vbatch.sparse``.

numba is optional (the ``sparse`` extra). Without it ``njit`` gives stand-ins that raise an
``ImportError`` naming the extra when called, so every module imports on a core install (the
backends import every kernel module, ``vbatch.sparse``'s included), and ``AVAILABLE`` tells the
CPU kernels to keep to their BLAS calls.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit as _numba_njit
except ImportError:  # the sparse extra is not installed
    _numba_njit = None

AVAILABLE = _numba_njit is not None


def missing(package: str, what: str) -> ImportError:
    """The error for ``what`` (a feature, as a user knows it) needing an optional ``package``
    (both are the sparse extra's)."""
    return ImportError(f"{what} needs {package}, which is not installed: "
                       "pip install 'vbatch[sparse]'")


def _feature(module: str) -> str:
    """What a user called, from a compiled function's module: ``vbatch.sparse`` for its
    analysis and its fronts' kernels, the CPU backend for another kernel module."""
    if module.startswith("vbatch.sparse") or module.startswith("vbatch.kernels.frontal"):
        return "vbatch.sparse"
    return "this part of the CPU backend"


def needs(package: str):
    """A decorator making a stand-in for a function that needs ``package``."""
    def decorate(fn):
        def stand_in(*args, **kwargs):
            raise missing(package, _feature(getattr(fn, "__module__", "") or ""))

        stand_in.__name__ = stand_in.__qualname__ = fn.__name__
        stand_in.py_func = fn
        return stand_in

    return decorate


def njit(*args, **kwargs):
    """numba's ``njit`` (used as ``@njit(cache=True, ...)``), or :func:`needs`' stand-in."""
    if AVAILABLE:
        return _numba_njit(*args, **kwargs)
    return needs("numba")


def packed(batch) -> tuple:
    """A packed batch as the compiled CPU loops read it: its data, offsets and leading
    dimensions (int64), and whether its columns are contiguous (order F)."""
    return (batch.data, np.asarray(batch.offset, np.int64), np.asarray(batch.ld, np.int64),
            batch.order == "F")


@njit(cache=True, nogil=True, inline="always")
def strides(ld, col, q, t):
    """(row, column) strides, in elements, of problem ``q`` of a packed batch (``ld``, ``col``
    as :func:`packed` gives them), seen transposed when ``t``."""
    rs, cs = (1, ld[q]) if col else (ld[q], 1)
    return (cs, rs) if t else (rs, cs)
