"""What a problem is (validated pydantic models), how it becomes tasks, and numpy references."""

from vbatch.ops.cholesky import (
    FUSED,
    POTRF,
    SCHUR,
    TRSM,
    UPDATE,
    CholeskyRequest,
    cholesky_flops,
    potrf_graph,
    potrf_info,
    reference,
    residual,
)
from vbatch.ops.blas import (
    GEMM_OP,
    POTRS_OP,
    SYRK_OP,
    SYR2K_OP,
    TRMM_OP,
    TRSM_OP,
    gemm_reference,
    potrs_reference,
    syrk_reference,
    syr2k_reference,
    trmm_reference,
    trsm_reference,
)
from vbatch.ops.cholesky import CholeskyResult
from vbatch.ops.frontal import FRONTAL_OP, FRONTAL_SOLVE_OP, FrontalResult
from vbatch.ops.op import OPS, Buffer, Op
from vbatch.ops.posv import POSV_OP, PosvResult, posv_graph

__all__ = [
    "FUSED",
    "POTRF",
    "SCHUR",
    "TRSM",
    "UPDATE",
    "CholeskyRequest",
    "cholesky_flops",
    "potrf_graph",
    "potrf_info",
    "reference",
    "residual",
    "GEMM_OP",
    "POTRS_OP",
    "SYRK_OP",
    "SYR2K_OP",
    "TRMM_OP",
    "TRSM_OP",
    "POSV_OP",
    "FRONTAL_OP",
    "FRONTAL_SOLVE_OP",
    "FrontalResult",
    "CholeskyResult",
    "PosvResult",
    "gemm_reference",
    "posv_graph",
    "potrs_reference",
    "syrk_reference",
    "syr2k_reference",
    "trmm_reference",
    "trsm_reference",
    "OPS",
    "Buffer",
    "Op",
]

# Every operation module registers its op on import: importing them all here is what makes an
# operation known everywhere (Runtime methods, module functions, the CLI, the conformance
# suite) without a list to edit.
import importlib as _importlib  # noqa: E402
import pkgutil as _pkgutil  # noqa: E402

for _m in _pkgutil.iter_modules(__path__):
    _importlib.import_module(f"{__name__}.{_m.name}")
