"""What a problem is (validated pydantic models), how it becomes tasks, and numpy references."""

from vbatch.ops.batch import MatrixList, PackedBatch, array_kind, pack, tight_offsets
from vbatch.ops.cholesky import (
    FUSED,
    POTF2,
    SCHUR,
    TRSM,
    UPDATE,
    CholeskyRequest,
    cholesky_flops,
    npiv_steps,
    potrf_info,
    reference,
    residual,
    task_graph,
)
from vbatch.ops.errors import InputError, validated

__all__ = [
    "MatrixList",
    "PackedBatch",
    "array_kind",
    "pack",
    "tight_offsets",
    "FUSED",
    "POTF2",
    "SCHUR",
    "TRSM",
    "UPDATE",
    "CholeskyRequest",
    "cholesky_flops",
    "npiv_steps",
    "potrf_info",
    "reference",
    "residual",
    "task_graph",
    "InputError",
    "validated",
]
