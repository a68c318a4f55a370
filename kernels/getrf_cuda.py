"""GETRF on CUDA: which kernel each launch kind runs, its grid, the table section. No cupy.

The kernels are ``getrf.cu`` beside this file; its header comment defines the table section
(:func:`section`: A, LU, ipiv, info) and the task row (problem, j, w, m, n). The trailing
updates are the ``blas`` family's GEMMs (:mod:`vbatch.kernels.blas_cuda`).

* ``getrf.factor``: panels of at most 32 rows (the launch's tallest) a warp each, a row a
  lane in registers; real ones of at most ``REGS_ROWS`` (at most 256 in a launch of few
  panels, ``REGS_FEW``) a block of ``REGS_WARPS`` warps, a row a thread in registers; others a
  block each, ``FACTOR_THREADS`` threads (the fewest that give the tallest panel of the launch
  a row each, at most the last): a block reduction finds
  each column's pivot, the panel's rows are swapped, scaled and updated, in shared memory where
  the launch's tallest panel fits ``FACTOR_SMEM``, else in global memory;
* ``getrf.rows``: the step's swaps as one permutation of rows (the panel's ``w`` final rows
  gathered, the rows below them that a swap touched written) on the columns outside the panel,
  then for columns right of it the unit lower solve by L11. Column-major (``getrf_rows_cm``):
  :func:`rows_cols` columns a block of ``ROWS_CM_WARPS`` warps, each warp its own columns with a
  lane a row, the solve in shuffles; row-major (``getrf_rows``): a thread a column, its rows
  in registers, ``ROWS_COLS`` columns a block. Both take the grid's second dimension for the
  column blocks;
* ``getrf.swap`` (getrs, gesv): a thread per right-hand side, ``SWAP_COLS`` a block: the copy
  of B into X where the kind has a source, then the interchanges, one after another; the
  buffers' slots travel in ``extra`` (:func:`swap_extra`).
"""

from __future__ import annotations

import math

import numpy as np

from vbatch.core.errors import InputError
from vbatch.kernels.cuda_build import ctype
from vbatch.kernels.potrf_cuda import Selection
from vbatch.ops.getrf import FACTOR, ROWS, SWAP

OP = "getrf"
SOURCE = "getrf.cu"
TEMPLATES = ("vb::getrf_factor", "vb::getrf_warp", "vb::getrf_regs", "vb::getrf_rows",
             "vb::getrf_rows_cm", "vb::getrf_swap")
NB_SUPPORTED = (8, 16, 32)  # getrf_rows keeps a column's w <= NB entries in registers
FACTOR_THREADS = (64, 128, 256)
# A launch whose panels have at most 32 rows is factored a warp a panel, PANEL_WARPS panels a
# block, a row a lane in registers, unrolled to the launch's widest panel rounded up to
# WARP_WIDTHS (getrf.cu getrf_warp; decisions.md#getrf-warp-panel).
WARP_WIDTHS = (8, 16, 24, 32)
PANEL_WARPS = 4
# Panels of 33 to REGS_ROWS rows, and in a launch of at most REGS_FEW panels up to
# 32 * REGS_WARPS[-1] rows: a block of the fewest REGS_WARPS warps that give each row a thread,
# the row in registers (getrf.cu getrf_regs). Many taller panels ran faster in shared memory;
# a few (skewed sizes' largest, a chain of latency) faster so (column-major:
# decisions.md#getrf-rows-cm; row-major takes the same thresholds:
# decisions.md#getrf-row-major-panels).
REGS_WARPS = (2, 4, 8)
REGS_ROWS = 64
REGS_FEW = 128
# ... for these dtypes: a complex row of 32 columns is 128 (complex128) registers, and the
# kernels' complex builds were the slowest of all to compile (67 s for complex128's 24 on one
# core, against 39 for float64's), so complex panels take the factor kernel.
REGS_DTYPES = ("float64", "float32")
# A panel of at most this many bytes (its tallest rows x nb) is factored in shared memory: read
# once, its columns' steps there, written once; a taller one step by step where it lies.
FACTOR_SMEM = 64 * 1024
ROWS_COLS = 128  # (getrf_rows, row-major: a thread a column; at most getrf.cu ROWS_MAX_NT)
# getrf_rows_cm (column-major): 8 warps a block, 4 columns a lane, 32 / nb columns an instruction
ROWS_CM_WARPS, ROWS_CM_COLS = 8, 4
SWAP_COLS = 64  # (getrf_swap: a thread per right-hand side)
ABSENT = 7  # (a swap's slot of no buffer)
MAX_GRID_Y = 65535
DTYPES = ("float64", "float32", "complex128", "complex64")
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
    """This family's part of the per-call pointer table: A, LU, ipiv, info (the factor and
    rows kernels read tbl[0..3]), then every buffer of the op (the swap reads buffer ``s`` at
    tbl[4 + s])."""
    return ["a", "lu", "ipiv", "info", *names]


def swap_name(T: str, R: str) -> str:
    return f"vb::getrf_swap<{T},{R}>"


def swap_extra(x: int, src: int, ipiv: int, forward: bool, skip: bool) -> int:
    """getrf_swap's ``extra``: the slots of X, the source (``ABSENT``: none) and ipiv, the
    direction, and whether a failed problem is skipped (getrf.cu)."""
    for s in (x, src, ipiv):
        if not 0 <= s <= ABSENT:
            raise ValueError(f"a buffer slot out of range: {s}")
    return x | (src << 3) | (ipiv << 6) | (int(forward) << 9) | (int(skip) << 10)


def factor_name(T: str, nt: int, R: str, P: str, SH: str = "false") -> str:
    return f"vb::getrf_factor<{T},{nt},{R},{P},{SH}>"


def warp_name(T: str, nb: int, R: str, P: str) -> str:
    return f"vb::getrf_warp<{T},{nb},{R},{P}>"


def rows_name(T: str, nb: int, P: str) -> str:
    return f"vb::getrf_rows<{T},{nb},{P}>"


def regs_name(T: str, nb: int, warps: int, R: str, P: str) -> str:
    return f"vb::getrf_regs<{T},{nb},{warps},{R},{P}>"


def rows_cm_name(T: str, nb: int, P: str) -> str:
    return f"vb::getrf_rows_cm<{T},{nb},{P}>"


def rows_cols(nb: int, order: str) -> int:
    """Columns outside the panel a rows block takes (the grid's second dimension)."""
    if order == "F":
        return ROWS_CM_WARPS * (32 // nb) * ROWS_CM_COLS
    return ROWS_COLS


def factor_threads(rows: int) -> int:
    return next((nt for nt in FACTOR_THREADS if rows <= nt), FACTOR_THREADS[-1])


def select(lc, nb: int, dtype, order: str, pivot: bool) -> Selection:
    """The kernel and grid of one launch of a GETRF plan with panel width ``nb``."""
    if nb not in NB_SUPPORTED:
        raise ValueError(f"getrf's cuda kernels support nb in {NB_SUPPORTED}, got {nb}")
    T, R, P = ctype(dtype), _bool(order == "C"), _bool(pivot)
    if lc.kind == FACTOR:
        if lc.rows[1] <= 32:
            wb = next(b for b in WARP_WIDTHS if b >= min(lc.width, nb))
            return Selection(warp_name(T, wb, R, P), (math.ceil(lc.count / PANEL_WARPS),),
                             (32 * PANEL_WARPS,), 0, source=SOURCE)
        if np.dtype(dtype).name in REGS_DTYPES and (
                lc.rows[1] <= REGS_ROWS or (
                lc.count <= REGS_FEW and lc.rows[1] <= 32 * REGS_WARPS[-1])):
            wb = next(b for b in WARP_WIDTHS if b >= min(lc.width, nb))
            nw = next(v for v in REGS_WARPS if 32 * v >= lc.rows[1])
            return Selection(regs_name(T, wb, nw, R, P), (lc.count,), (32 * nw,), 0,
                             source=SOURCE)
        nt = factor_threads(lc.rows[1])
        smem = lc.rows[1] * nb * np.dtype(dtype).itemsize
        if smem <= FACTOR_SMEM:  # (the panel staged in shared memory)
            return Selection(factor_name(T, nt, R, P, "true"), (lc.count,), (nt,), smem,
                             source=SOURCE)
        return Selection(factor_name(T, nt, R, P), (lc.count,), (nt,), 0, source=SOURCE)
    if lc.kind == ROWS:
        tiles = max(1, math.ceil(lc.cols[1] / rows_cols(nb, order)))
        if tiles > MAX_GRID_Y:
            raise InputError([(None, f"launch {lc.index} (getrf rows) needs {tiles} column "
                                     f"blocks, more than the grid allows ({MAX_GRID_Y})")])
        if order == "F":
            return Selection(rows_cm_name(T, nb, P), (lc.count, tiles), (32 * ROWS_CM_WARPS,),
                             0, source=SOURCE)
        return Selection(rows_name(T, nb, P), (lc.count, tiles),
                         (rows_cols(nb, order),), 0, source=SOURCE)
    raise ValueError(f"cuda backend: getrf has no launch kind {lc.kind!r}")


def select_swap(lc, dtype, order: str, extra: int) -> Selection:
    """The kernel and grid of a swap launch on X of ``order``."""
    tiles = max(1, math.ceil(lc.cols[1] / SWAP_COLS))
    if tiles > MAX_GRID_Y:
        raise InputError([(None, f"launch {lc.index} (getrf swap) needs {tiles} column "
                                 f"blocks, more than the grid allows ({MAX_GRID_Y})")])
    return Selection(swap_name(ctype(dtype), _bool(order == "C")), (lc.count, tiles),
                     (SWAP_COLS,), 0, extra, source=SOURCE)


def selection(lc, plan, dtype, layouts: dict, config) -> Selection:
    """:func:`select` for the CUDA backend: the plan's panel width, the kind's ``pivot``, the
    order of the factors (A and LU share a layout); a swap's from its kind's buffers."""
    kd = next(k for k in plan.kinds if k.name == lc.task_kind)
    if lc.kind == SWAP:
        p = kd.param
        slot = plan.buffers.index
        extra = swap_extra(slot(p["x"]), slot(p["src"]) if p["src"] else ABSENT, slot("ipiv"),
                           p["forward"], p["skip_failed"])
        return select_swap(lc, dtype, layouts[p["x"]], extra)
    return select(lc, plan.nb, dtype, layouts["lu"], bool(kd.param["pivot"]))


def kernel_names(dtypes=DTYPES, nbs=NB_SUPPORTED, orders=ORDERS) -> list[str]:
    """Every instantiation :func:`select` can return for these parameters."""
    out = []
    for dt in dtypes:
        T = ctype(dt)
        for order in orders:
            R = _bool(order == "C")
            for P in ("true", "false"):
                out += [factor_name(T, nt, R, P, SH) for nt in FACTOR_THREADS
                        for SH in ("false", "true")]
                out += [warp_name(T, b, R, P) for b in WARP_WIDTHS if b <= max(nbs)]
                out += [regs_name(T, b, v, R, P) for b in WARP_WIDTHS if b <= max(nbs)
                        for v in REGS_WARPS if dt in REGS_DTYPES]
                if order == "F":
                    out += [rows_cm_name(T, nb, P) for nb in nbs]
                else:
                    out += [rows_name(T, nb, P) for nb in nbs]
            out.append(swap_name(T, R))
    return out
