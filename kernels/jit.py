"""numba where it is installed: compiled loops for the CPU kernels and ``vbatch.sparse``.

numba is optional (the ``sparse`` extra). Without it ``njit`` gives stand-ins that raise an
``ImportError`` naming the extra when called, so every module imports on a core install (the
backends import every kernel module, ``vbatch.sparse``'s included), and ``AVAILABLE`` tells the
CPU kernels to keep to their BLAS calls.
"""

from __future__ import annotations

try:
    from numba import njit as _numba_njit
except ImportError:  # the sparse extra is not installed
    _numba_njit = None

AVAILABLE = _numba_njit is not None


def needs(package: str):
    """A decorator making a stand-in for a function that needs ``package``."""
    def decorate(fn):
        def missing(*args, **kwargs):
            raise ImportError(f"{package} is needed here ({fn.__name__}): "
                              "pip install 'vbatch[sparse]'")

        missing.__name__ = missing.__qualname__ = fn.__name__
        missing.py_func = fn
        return missing

    return decorate


def njit(*args, **kwargs):
    """numba's ``njit`` (used as ``@njit(cache=True, ...)``), or :func:`needs`' stand-in."""
    if AVAILABLE:
        return _numba_njit(*args, **kwargs)
    return needs("numba")
