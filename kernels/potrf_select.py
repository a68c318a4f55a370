"""Which CUDA kernel instantiation each launch runs, and its grid: pure Python, no cupy.

Three lists must agree: what the CUDA backend launches (:func:`select`, per plan launch), what
``python -m vbatch compile`` builds ahead of use (:func:`kernel_names`), and what CI compiles with
nvcc (:func:`instantiation_source`, a translation unit that instantiates every name of
:func:`kernel_names`). All three come from the parameter tuples and name builders below, so a
template argument the selector can pick is compiled by the other two as well. This module imports
without cupy, so the CLI and CI can use it on machines without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vbatch.ops.errors import InputError

NB_SUPPORTED = (8, 16, 32)  # POTF2 keeps one row of the diagonal block per lane: nb <= 32
KB = 16  # K-chunk of gemm_nt in potrf.cu
TRSM_RT = 128  # rows per trsm block (trsm_step)
SCHUR_TS = 64  # Schur complement tile (schur_step)
SCHUR_THREADS = 256  # schur_step's __launch_bounds__
MAX_GRID_Y = 65535
# The fused kernel runs one thread per panel row, so the tallest panel it takes is the largest
# block it is compiled for.
FUSED_ROWS_MAX = 256
# Whole warps up to FUSED_ROWS_MAX: a panel of r rows gets the smallest block that holds it.
FUSED_THREADS = tuple(range(32, FUSED_ROWS_MAX + 1, 32))
# Rows per update tile (update_step runs 2 * RC threads, update_mma RC).
UPDATE_RCS = (32, 64, 128)
FP64_UPDATES = ("fma", "mma")
DTYPES = ("float64", "float32")
ORDERS = ("F", "C")
# Every .cu file beside this module; the generated translation unit includes them all.
SOURCES = ("potrf.cu", "generate.cu")

_CTYPE = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def ctype(dtype) -> str:
    """The C++ type of a supported numpy dtype."""
    dt = np.dtype(dtype)
    if dt not in _CTYPE:
        raise ValueError(f"the cuda kernels take float64 or float32, not {dt}")
    return _CTYPE[dt]


def _row(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be 'F' or 'C', got {order!r}")
    return "true" if order == "C" else "false"


def fused_threads(rows: int) -> int:
    """Threads of the fused kernel for panels up to ``rows`` tall: one per row, whole warps."""
    for nt in FUSED_THREADS:
        if rows <= nt:
            return nt
    raise ValueError(f"a fused launch of {rows} rows is taller than the fused kernel's largest "
                     f"block ({FUSED_ROWS_MAX} threads, one per row)")


def update_rc(rows: int) -> int:
    """Rows per update tile: the smallest tile that holds the tallest panel, else the largest,
    so short panels get small blocks and many per SM."""
    return next((rc for rc in UPDATE_RCS if rows <= rc), UPDATE_RCS[-1])


def gemm_smem(rc: int, cc: int) -> int:
    """Elements of gemm_nt's double-buffered tiles."""
    return 2 * (rc + cc) * (KB + 1)


def mma_smem(rc: int, nb: int, row: bool) -> int:
    """Elements of update_mma's double-buffered tiles (paddings as in potrf.cu)."""
    sa = rc * (KB + 4) if row else KB * (rc + 8)
    sb = nb * (KB + 4) if row else KB * (nb + 8)
    return 2 * (sa + sb)


# Names, in the syntax both NVRTC's name expressions and C++'s address-of accept.
def fused_name(T: str, nb: int, nt: int, R: str) -> str:
    return f"vb::fused_step<{T},{nb},{nt},{R}>"


def update_name(T: str, nb: int, rc: int, R: str) -> str:
    return f"vb::update_step<{T},{nb},{rc},{R}>"


def update_mma_name(nb: int, rc: int, R: str) -> str:
    return f"vb::update_mma<{nb},{rc},{R}>"


def potf2_name(T: str, nb: int, R: str) -> str:
    return f"vb::potf2_step<{T},{nb},{R}>"


def trsm_name(T: str, nb: int, R: str) -> str:
    return f"vb::trsm_step<{T},{nb},{R}>"


def schur_name(T: str, R: str) -> str:
    return f"vb::schur_step<{T},{R}>"


def copy_name(dtype) -> str:
    return f"vb::copy_matrices<{ctype(dtype)}>"


def spd_fill_name(dtype) -> str:
    return f"vb::spd_fill<{ctype(dtype)}>"


def source_of(name: str) -> str:
    """The .cu file that defines a kernel of :func:`kernel_names`."""
    return "generate.cu" if name.startswith("vb::spd_fill<") else "potrf.cu"


@dataclass(frozen=True)
class Selection:
    """One plan launch as the CUDA backend issues it. ``smem`` is in bytes; ``extra`` is the
    fifth scalar every step kernel takes (the update's count of zero-only row tiles, else 0)."""

    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    smem: int
    extra: int = 0

    @property
    def source(self) -> str:
        return source_of(self.name)


def select(lc, nb: int, dtype, order: str, fp64_update: str = "fma") -> Selection:
    """The kernel, grid, block and shared memory for one :class:`~vbatch.scheduler.Launch` of a
    plan with panel width ``nb``. ``fp64_update`` picks the float64 update kernel (``"fma"`` or
    ``"mma"``: tensor cores; float32 has no MMA without TF32, so it always takes FMA)."""
    if nb not in NB_SUPPORTED:
        raise ValueError(f"the cuda kernels support nb in {NB_SUPPORTED}, got {nb}")
    if fp64_update not in FP64_UPDATES:
        raise ValueError(f"fp64_update must be one of {FP64_UPDATES}, got {fp64_update!r}")
    T, R = ctype(dtype), _row(order)
    isz = np.dtype(dtype).itemsize
    rows = lc.rows[1]
    if lc.kind == "fused":
        nt = fused_threads(rows)
        sel = Selection(fused_name(T, nb, nt, R), (lc.count,), (nt,), 0)
    elif lc.kind == "update":
        rc = update_rc(rows)
        zero_tiles = math.ceil(lc.cols[1] / rc)
        grid = (lc.count, zero_tiles + math.ceil(rows / rc))
        if T == "double" and fp64_update == "mma":
            sel = Selection(update_mma_name(nb, rc, R), grid, (rc,),
                            mma_smem(rc, nb, order == "C") * isz, zero_tiles)
        else:
            sel = Selection(update_name(T, nb, rc, R), grid, (2 * rc,),
                            gemm_smem(rc, nb) * isz, zero_tiles)
    elif lc.kind == "potf2":
        sel = Selection(potf2_name(T, nb, R), (lc.count,), (32,), 0)
    elif lc.kind == "trsm":
        sel = Selection(trsm_name(T, nb, R), (lc.count, max(1, math.ceil(rows / TRSM_RT))),
                        (TRSM_RT,), 0)
    elif lc.kind == "schur":
        t = math.ceil(rows / SCHUR_TS)
        sel = Selection(schur_name(T, R), (lc.count, t * (t + 1) // 2), (SCHUR_THREADS,),
                        gemm_smem(SCHUR_TS, SCHUR_TS) * isz)
    else:
        raise ValueError(f"cuda backend: unknown launch kind {lc.kind!r}")
    if len(sel.grid) > 1 and sel.grid[1] > MAX_GRID_Y:
        raise InputError([(None, f"launch {lc.index} ({lc.kind}) needs {sel.grid[1]} row tiles, "
                                 f"more than the grid allows ({MAX_GRID_Y})")])
    return sel


def kernel_names(dtypes=DTYPES, nbs=NB_SUPPORTED, orders=ORDERS) -> list[str]:
    """Every instantiation :func:`select` can return for these parameters, plus the gather /
    scatter and generator kernels (``copy_matrices``, ``spd_fill``) of each dtype."""
    out = []
    for dt in dtypes:
        T = ctype(dt)
        for order in orders:
            R = _row(order)
            for nb in nbs:
                if nb not in NB_SUPPORTED:
                    raise ValueError(f"the cuda kernels support nb in {NB_SUPPORTED}, got {nb}")
                out += [fused_name(T, nb, nt, R) for nt in FUSED_THREADS]
                out += [update_name(T, nb, rc, R) for rc in UPDATE_RCS]
                if T == "double":
                    out += [update_mma_name(nb, rc, R) for rc in UPDATE_RCS]
                out += [potf2_name(T, nb, R), trsm_name(T, nb, R)]
            out.append(schur_name(T, R))
        out += [copy_name(dt), spd_fill_name(dt)]
    return out


def instantiation_source(names: list[str] | None = None) -> str:
    """A translation unit for nvcc that compiles the kernels ``names`` (default: all of
    :func:`kernel_names`). Taking a kernel's address instantiates it, so no signature is
    written here and none can drift from the templates in the .cu files."""
    names = kernel_names() if names is None else list(names)
    if not names:
        raise ValueError("instantiation_source needs at least one kernel name")
    head = [
        "// Generated by vbatch.kernels.potrf_select.instantiation_source(); do not edit.",
        "// Instantiates every kernel the CUDA backend can launch, for an nvcc build (CI's check,",
        "// `python -m vbatch compile --nvcc`); at run time NVRTC compiles them one by one.",
    ]
    head += [f'#include "{s}"' for s in SOURCES]
    table = ["", "[[maybe_unused]] static void* const vb_all[] = {"]
    table += [f"  (void*)&{name}," for name in names]
    return "\n".join(head + table + ["};", ""])
