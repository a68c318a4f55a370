"""The public face: Runtime, futures, memory staging, plan execution, the CLI."""

from vbatch.runtime.config import Config
from vbatch.runtime.device import cuda_status, resolve_device
from vbatch.runtime.runtime import (
    CholeskyResult,
    DependencyError,
    Future,
    PosvResult,
    Runtime,
    cholesky,
    default_runtime,
    gemm,
    pack,
    posv,
    potrs,
    syrk,
    syr2k,
    trmm,
    trsm,
)

__all__ = [
    "Config",
    "cuda_status",
    "resolve_device",
    "CholeskyResult",
    "DependencyError",
    "Future",
    "Runtime",
    "cholesky",
    "default_runtime",
    "pack",
    "PosvResult",
    "gemm",
    "posv",
    "potrs",
    "syrk",
    "syr2k",
    "trmm",
    "trsm",
]
