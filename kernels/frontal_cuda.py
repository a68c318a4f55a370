"""The ``frontal`` kernel family on CUDA: which kernel an extend-add launch runs, its grid, its
``extra`` word. No cupy (tested without a GPU, like every launcher).

The kernel is ``frontal.cu`` beside this file: a block per (task, batch of 32 x 32 tiles of the
update block's lower triangle); ``extra`` holds the plan slots of the fronts (``l``) and of the
positions (``rel``), whose offsets and leading dimensions it reads from the plan's tables.
"""

from __future__ import annotations

import numpy as np

from vbatch.kernels.blas_cuda import Selection  # the launch record every launcher returns
from vbatch.sparse.frontal import EXTEND, RHS_ADD, RHS_GET

OP = "frontal"
SOURCE = "frontal.cu"
TEMPLATES = ("vb::frontal_extend_add", "vb::frontal_rhs")
RHS_CHUNK = 1024  # right-hand-side entries per block of frontal_rhs (256 threads, 4 each)
DTYPES = ("float64", "float32")
ORDERS = ("F", "C")
NB_SUPPORTED = None
TILE = 32  # frontal.cu's tile: 256 threads, 4 entries each
MAX_GRID_Y = 65535  # more tiles than this: the blocks of a task loop over them

_CTYPE = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def plan_defaults(dtype) -> dict:
    return {}


def section(names: tuple[str, ...]) -> list[str]:
    """This family's part of the per-call pointer table (frontal.cu reads tbl[0..2]; the
    factorization has no ``x``: its entry is null)."""
    return ["l", "rel", "x"]


def extend_name(T: str, order: str) -> str:
    return f"vb::frontal_extend_add<{T},{'true' if order == 'C' else 'false'}>"


def rhs_name(T: str, order: str, add: bool) -> str:
    row, a = ("true" if order == "C" else "false"), ("true" if add else "false")
    return f"vb::frontal_rhs<{T},{row},{a}>"


def kernel_names(dtypes=DTYPES, nbs=None, orders=ORDERS) -> list[str]:
    out = []
    for dt in dtypes:
        T = _CTYPE[np.dtype(dt)]
        for o in orders:
            out += [extend_name(T, o), rhs_name(T, o, True), rhs_name(T, o, False)]
    return out


def selection(lc, plan, dtype, layouts: dict, config) -> Selection:
    T = _CTYPE[np.dtype(dtype)]
    a = plan.tasks.args[lc.lo:lc.hi]
    u = int(a[:, 2].max())
    if lc.kind in (RHS_ADD, RHS_GET):
        extra = plan.buffers.index("x") | (plan.buffers.index("rel") << 4)
        chunks = -(-u * int(a[:, 3].max()) // RHS_CHUNK)
        return Selection(rhs_name(T, layouts["x"], lc.kind == RHS_ADD),
                         (lc.count, max(1, min(chunks, MAX_GRID_Y))), (256,), 0, extra, SOURCE)
    if lc.kind != EXTEND:
        raise ValueError(f"cuda backend: the frontal family has no launch kind {lc.kind!r}")
    t = -(-u // TILE)
    extra = plan.buffers.index("l") | (plan.buffers.index("rel") << 4)
    return Selection(extend_name(T, layouts["l"]),
                     (lc.count, max(1, min(t * t, MAX_GRID_Y))), (256,), 0, extra, SOURCE)
