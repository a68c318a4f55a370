"""Device code and the CPU backend, behind one backend interface (:mod:`vbatch.kernels.backend`)."""

from __future__ import annotations

import functools

from vbatch.kernels.backend import Backend, Completion


@functools.cache
def get_backend(name: str) -> Backend:
    """The process-wide backend instance for ``"cpu"`` or ``"cuda"``."""
    if name == "cpu":
        from vbatch.kernels.cpu import CpuBackend

        return CpuBackend()
    if name == "cuda":
        from vbatch.kernels.cuda import CudaBackend

        return CudaBackend()
    raise ValueError(f"unknown backend {name!r} (choose from cpu, cuda)")


__all__ = ["Backend", "Completion", "get_backend"]
