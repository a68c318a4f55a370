"""GETRF on CUDA: which kernel each launch kind runs, its grid, the table section. No cupy.

The kernels are ``getrf.cu`` beside this file; its header comment defines the table section
(:func:`section`: A, LU, ipiv, info) and the task row (problem, j, w, m, n). The trailing
updates are the ``blas`` family's GEMMs (:mod:`vbatch.kernels.blas_cuda`).

* ``getrf.factor``: one block per panel, ``FACTOR_THREADS`` threads (the fewest that give the
  tallest panel of the launch a row each, at most the last): a block reduction finds each
  column's pivot, the panel's rows are swapped, scaled and updated in global memory;
* ``getrf.rows``: a thread per column outside the panel, ``ROWS_COLS`` columns a block in the
  grid's second dimension: the step's swaps, then for columns right of the panel the unit
  lower solve by L11 (staged in shared memory; the column's ``w`` entries in registers).
"""

from __future__ import annotations

import math

from vbatch.core.errors import InputError
from vbatch.kernels.potrf_cuda import Selection, ctype
from vbatch.ops.getrf import FACTOR, ROWS

OP = "getrf"
SOURCE = "getrf.cu"
TEMPLATES = ("vb::getrf_factor", "vb::getrf_rows")
NB_SUPPORTED = (8, 16, 32)  # getrf_rows keeps a column's w <= NB entries in registers
FACTOR_THREADS = (64, 128, 256)
ROWS_COLS = 64
MAX_GRID_Y = 65535
DTYPES = ("float64", "float32")
ORDERS = ("F", "C")


def _bool(flag) -> str:
    return "true" if flag else "false"


def plan_defaults(dtype) -> dict:
    return {"nb": 32, "streams": 4}


def check_options(dtype, options: dict) -> None:
    nb = options["nb"]
    if nb not in NB_SUPPORTED:
        raise InputError([(None, f"the cuda backend's getrf supports nb in {NB_SUPPORTED}, "
                                 f"got {nb}")], what="runtime options")


def section(names: tuple[str, ...]) -> list[str]:
    """This family's part of the per-call pointer table (getrf.cu reads tbl[0..3])."""
    return ["a", "lu", "ipiv", "info"]


def factor_name(T: str, nt: int, R: str, P: str) -> str:
    return f"vb::getrf_factor<{T},{nt},{R},{P}>"


def rows_name(T: str, nb: int, R: str, P: str) -> str:
    return f"vb::getrf_rows<{T},{nb},{R},{P}>"


def factor_threads(rows: int) -> int:
    return next((nt for nt in FACTOR_THREADS if rows <= nt), FACTOR_THREADS[-1])


def select(lc, nb: int, dtype, order: str, pivot: bool) -> Selection:
    """The kernel and grid of one launch of a GETRF plan with panel width ``nb``."""
    if nb not in NB_SUPPORTED:
        raise ValueError(f"getrf's cuda kernels support nb in {NB_SUPPORTED}, got {nb}")
    T, R, P = ctype(dtype), _bool(order == "C"), _bool(pivot)
    if lc.kind == FACTOR:
        nt = factor_threads(lc.rows[1])
        return Selection(factor_name(T, nt, R, P), (lc.count,), (nt,), 0, source=SOURCE)
    if lc.kind == ROWS:
        tiles = max(1, math.ceil(lc.cols[1] / ROWS_COLS))
        if tiles > MAX_GRID_Y:
            raise InputError([(None, f"launch {lc.index} (getrf rows) needs {tiles} column "
                                     f"blocks, more than the grid allows ({MAX_GRID_Y})")])
        return Selection(rows_name(T, nb, R, P), (lc.count, tiles), (ROWS_COLS,), 0,
                         source=SOURCE)
    raise ValueError(f"cuda backend: getrf has no launch kind {lc.kind!r}")


def selection(lc, plan, dtype, layouts: dict, config) -> Selection:
    """:func:`select` for the CUDA backend: the plan's panel width, the kind's ``pivot``, the
    order of the factors (A and LU share a layout)."""
    kd = next(k for k in plan.kinds if k.name == lc.task_kind)
    return select(lc, plan.nb, dtype, layouts["lu"], bool(kd.param["pivot"]))


def kernel_names(dtypes=DTYPES, nbs=NB_SUPPORTED, orders=ORDERS) -> list[str]:
    """Every instantiation :func:`select` can return for these parameters."""
    out = []
    for dt in dtypes:
        T = ctype(dt)
        for order in orders:
            R = _bool(order == "C")
            for P in ("true", "false"):
                out += [factor_name(T, nt, R, P) for nt in FACTOR_THREADS]
                out += [rows_name(T, nb, R, P) for nb in nbs]
    return out
