"""What a problem is (validated pydantic models), how it becomes tasks, and numpy references."""

from vbatch.ops.batch import (
    MatrixList,
    PackedBatch,
    array_kind,
    pack,
    tight_layout,
    tight_offsets,
)
from vbatch.ops.cholesky import (
    FUSED,
    POTF2,
    POTRF,
    SCHUR,
    TRSM,
    UPDATE,
    CholeskyRequest,
    cholesky_flops,
    plan_cholesky,
    potrf_graph,
    potrf_info,
    reference,
    residual,
)
from vbatch.ops.errors import InputError, validated
from vbatch.ops.kinds import KINDS, LAUNCH_KINDS, TaskKind
from vbatch.ops.op import OPS, Buffer, Op

__all__ = [
    "MatrixList",
    "PackedBatch",
    "array_kind",
    "pack",
    "tight_layout",
    "tight_offsets",
    "FUSED",
    "POTF2",
    "POTRF",
    "SCHUR",
    "TRSM",
    "UPDATE",
    "CholeskyRequest",
    "cholesky_flops",
    "plan_cholesky",
    "potrf_graph",
    "potrf_info",
    "reference",
    "residual",
    "InputError",
    "validated",
    "KINDS",
    "LAUNCH_KINDS",
    "TaskKind",
    "OPS",
    "Buffer",
    "Op",
]
