"""The public face: Runtime, prepared calls, futures, memory staging, plan execution, the CLI.

Each registered operation's method and module function (``gemm``, ``cholesky``, ...) is made
from the registry (:data:`vbatch.runtime.runtime.API`)."""

from vbatch.runtime import runtime as _runtime
from vbatch.runtime.config import Config
from vbatch.runtime.device import cuda_status, resolve_device
from vbatch.runtime.future import DependencyError, Future
from vbatch.runtime.prepared import Prepared
from vbatch.runtime.runtime import (
    API,
    CholeskyResult,
    PosvResult,
    Runtime,
    default_runtime,
    pack,
    prepare,
)

globals().update({_name: getattr(_runtime, _name) for _name in API})

__all__ = [
    "API",
    "Config",
    "cuda_status",
    "resolve_device",
    "CholeskyResult",
    "DependencyError",
    "Future",
    "Prepared",
    "Runtime",
    "default_runtime",
    "pack",
    "prepare",
    "PosvResult",
    *API,
]
