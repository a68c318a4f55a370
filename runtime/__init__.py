"""The public face: Runtime, futures, memory staging, plan execution, the CLI."""

from vbatch.runtime.device import cuda_status, resolve_device
from vbatch.runtime.runtime import (
    CholeskyResult,
    DependencyError,
    Future,
    Options,
    Runtime,
    cholesky,
    default_runtime,
)

__all__ = [
    "cuda_status",
    "resolve_device",
    "CholeskyResult",
    "DependencyError",
    "Future",
    "Options",
    "Runtime",
    "cholesky",
    "default_runtime",
]
