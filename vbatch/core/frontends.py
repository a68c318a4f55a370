"""Arrays of other frameworks (torch, JAX, anything that speaks DLPack), in and out.

vbatch's kernels work on numpy arrays (CPU) and cupy arrays (CUDA). An operand whose arrays come
from another framework, a list of torch tensors or a packed buffer that is a JAX array, is
*adopted* through DLPack: a numpy or cupy view of the same memory, made without a copy, on the
device where the data is. The batch keeps the framework's name (its *frontend*), and what comes
back is given back to that framework through DLPack too, again without a copy: a list of torch
CUDA tensors in, torch CUDA tensors out, all viewing vbatch's output buffer.

    >>> import numpy as np
    >>> from vbatch.core.frontends import adopt
    >>> adopt(np.ones(3))[1] is None  # numpy and cupy arrays are vbatch's own: no frontend
    True

The frameworks known by name are torch and JAX; :func:`register` adds another (its module
name, as ``type(x).__module__`` starts, and the function that makes one of its arrays from a
DLPack producer). JAX arrays are immutable: ``overwrite=True`` on one is refused.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

# DLPack device types (dlpack.h): where an adopted array's memory is.
_HOST = (1, 3)  # kDLCPU, kDLCUDAHost (pinned host memory)
_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged

# frontend name -> from_dlpack of that framework; filled on first use for torch and JAX.
_FROM_DLPACK: dict[str, Callable[[Any], Any]] = {}
# Frameworks whose arrays must never be written in place.
IMMUTABLE = {"jax"}
# Module names (the first component of type(x).__module__) -> frontend name.
_ALIASES = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}


def register(name: str, from_dlpack: Callable[[Any], Any], immutable: bool = False,
             modules: tuple[str, ...] = ()) -> None:
    """Teach vbatch another framework: arrays whose type's module starts with ``name`` (or
    one of ``modules``) are adopted through DLPack and given back with ``from_dlpack``."""
    _FROM_DLPACK[name] = from_dlpack
    for m in (name, *modules):
        _ALIASES[m] = name
    if immutable:
        IMMUTABLE.add(name)


def _builtin(name: str) -> Callable[[Any], Any]:
    if name == "torch":
        import torch

        return torch.from_dlpack
    if name == "jax":
        import jax.dlpack

        return jax.dlpack.from_dlpack
    raise KeyError(name)


def frontend_of(x: Any) -> str | None:
    """The framework of a foreign array (one vbatch adopts through DLPack), else None."""
    t = type(x)
    if not hasattr(t, "__dlpack__") or not hasattr(t, "__dlpack_device__"):
        return None
    top = t.__module__.split(".")[0]
    return _ALIASES.get(top, top)


def adopt(x: Any) -> tuple[Any, str | None]:
    """``(array, frontend)``: ``x`` itself for numpy and cupy arrays (frontend None), else a
    numpy or cupy view of its memory through DLPack and the name of its framework. Raises
    ValueError, with the framework's reason, for an array DLPack cannot export (a torch
    tensor that requires grad, memory on another kind of device, ...)."""
    fe = frontend_of(x)
    if fe is None or isinstance(x, np.ndarray):
        return x, None
    if fe == "cupy":
        return x, None
    try:
        dev = int(x.__dlpack_device__()[0])
        if dev in _HOST:
            return np.from_dlpack(x), fe
        if dev in _CUDA:
            import cupy

            return cupy.from_dlpack(x), fe
    except ImportError as exc:
        raise ValueError(f"a {fe} array on a CUDA device needs cupy ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the framework's own reason, passed on
        raise ValueError(f"cannot read this {fe} array through DLPack: {exc}") from None
    raise ValueError(f"a {fe} array on DLPack device type {dev}: vbatch reads host and CUDA "
                     "memory only")


def give(arr: Any, frontend: str | None) -> Any:
    """``arr`` (numpy or cupy) as an array of ``frontend``, sharing its memory (DLPack)."""
    if frontend is None:
        return arr
    fn = _FROM_DLPACK.get(frontend)
    if fn is None:
        fn = _FROM_DLPACK[frontend] = _builtin(frontend)
    return fn(arr)


def give_all(arrays: list, frontend: str | None) -> list:
    """Every array of ``arrays`` given back to ``frontend``."""
    if frontend is None:
        return arrays
    return [give(a, frontend) for a in arrays]
