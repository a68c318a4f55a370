"""POTRF on CUDA: which kernel each launch kind runs, its grid, and the device tables. No cupy.

The kernels are ``potrf.cu`` beside this file. This module is the launcher's pure half: given a
plan launch it names the template instantiation, the grid, block and shared memory
(:func:`select`); it lists every instantiation :func:`select` can return (:func:`kernel_names`,
for ``python -m vbatch compile`` and CI's nvcc check, via :mod:`vbatch.kernels.cuda_build`); and
it lays out what the kernels read (:func:`tables`). It imports without cupy, so all of that is
tested on machines without a GPU.

Every POTRF kernel takes ``(tbl, meta, imeta, tasks, K, lo, hi, extra)``: its section of the
per-call pointer table (A, L, info: :func:`section`), the per-problem arrays (``meta``:
offset[K], ld[K] as int64; ``imeta``: n[K] as int32, problems in the caller's order: those of the
op's first buffer, the matrix factored, in the tables ``cuda.tables`` builds for every family)
and the plan's task table (one row per task, problem / a0 / a1 / ...: for a panel its first
column j and width w, for a schur task p and n - p). A launch passes its range ``[lo, hi)`` of
the task table; block ``b`` takes task ``lo + b`` (``vbatched.cuh``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vbatch.core.errors import InputError
from vbatch.kernels.cuda_build import ctype

OP = "potrf"
SOURCE = "potrf.cu"
NB_SUPPORTED = (8, 16, 32)  # POTF2 keeps one row of the diagonal block per lane: nb <= 32
KB = 16  # K-chunk of gemm_nt in potrf.cu
TRSM_RT = 128  # rows per trsm block (trsm_step)
SCHUR_TS = 64  # Schur complement tile (schur_step)
SCHUR_THREADS = 256  # schur_step's __launch_bounds__
MAX_GRID_Y = 65535
# Problems that factor more than BLOCK_ABOVE columns take them BLOCK at a time, each block
# column brought up to date by one GEMM of the blas family (DMMA in float64; ops/cholesky.py:
# blocked); (BLOCK, BLOCK_ABOVE) per dtype. On the H100 (2026-11-25, block 0 / 128 / 256 / 512,
# ms, float64 k = 2000, 500 at 1024): uniform 1024 7.06 / 5.20 / 5.52 / 6.17, skewed 512 1.04 /
# 0.78 / 0.82 / 1.05, but uniform 512 4.17 / 4.31 / 4.27 / 4.17, so (128, 512) then. Narrower
# blocks, measured on the H200 (2026-11-26, interleaved in one process, two rounds,
# docs/decisions.md#potrf-block-widths), (128, 512) -> float64 (96, 256): skewed 512 0.94 -> 0.65,
# uniform 512 3.58 -> 3.34, uniform 1024 4.69 -> 4.32, skewed 1024 1.49 -> 1.38, gauss 512 2.82 ->
# 2.80, Nmax 256 unchanged; float32 (64, 512): uniform 1024 3.98 -> 3.69, skewed 1024 1.45 ->
# 1.27, Nmax 256-512 unchanged (blocking float32 problems of 257-512 columns cost uniform 512
# 7-15%). Measured on column-major batches; row-major float64 keeps (128, 512) (layout_defaults).
# Complex types take their real type's (real_name): not measured on them.
BLOCK = {"float64": 96, "float32": 64}
BLOCK_ABOVE = {"float64": 256, "float32": 512}
ROW_BLOCK, ROW_BLOCK_ABOVE = 128, 512  # row-major float64 batches: layout_defaults
# A batch in which at most BLOCK_FEW_PER_SM x (multiprocessors) problems factor more than
# max(BLOCK, BLOCK_FEW_ABOVE) columns blocks them all (the options block_few, block_few_above):
# a fused step runs a block per problem, two of 256 threads to a multiprocessor, so fewer
# problems than that leave multiprocessors idle through their whole chain of panels, where a
# block update spreads a problem over many tiles. But a block update also adds levels to the
# plan, which costs more than it saves on problems of few block columns: H200, 2026-11-26
# (interleaved A/B, docs/decisions.md#potrf-block-few,
# docs/results/h200-2026-11-26-s4/block-few-ab-*.json, ms, off -> on). float64 past 96 columns: 20
# problems of 256 among 1,980 of at most 25 0.270 -> 0.236, but 200 of U[97, 200] among 1,800
# small 0.245 -> 0.277, gauss Nmax 128 (~140 past 96) 0.194 -> 0.214; past 224: the first two
# as before, 0.236 and 0.245 (no block update), 40 of U[225, 256] 0.298 -> 0.279, 260 of
# U[225, 512] 1.160 -> 1.082, row-major 20 of 512 1.186 -> 0.783, but 200 of U[200, 320]
# 0.530 -> 0.570. float32 (its GEMM on SIMT cores) past 256: 20 of 512 0.668 -> 0.534, but 100
# of U[225, 300] 0.310 -> 0.373; past 384: 0.534 and 0.310, 200 of 512 1.149 -> 1.050, 260 of
# U[225, 512] 0.874 -> 0.893.
BLOCK_FEW_PER_SM = 2
BLOCK_FEW_ABOVE = {"float64": 224, "float32": 384}
# What `python -m vbatch tune` measures (vbatch.runtime.tune), from the defaults above: the
# fused/separated crossover, then the blocking (width, threshold), then the threshold of a
# batch's few large problems, on the harness's batches.
TUNE = (
    ("fused_max_rows", (0, 64, 128, 192, 256)),
    (("block", "block_above"), ((0, 0), (128, 512), (256, 512), (128, 256), (256, 256),
                                (512, 512), (64, 256), (64, 512), (96, 256))),
    ("block_few_above", (0, 128, 224, 384, 512)),
)
TUNE_WORKLOADS = (("uniform", 2000, 128), ("uniform", 2000, 512), ("skewed", 2000, 512),
                  ("uniform", 500, 1024), ("skewed", 500, 1024))
# The fused kernel runs one thread per panel row, so the tallest panel it takes is the largest
# block it is compiled for.
FUSED_ROWS_MAX = 256
# Fused panels of at most SMALL_ROWS rows run as small_step: a warp each, SMALL_WARPS to a block.
SMALL_ROWS = 32
SMALL_WARPS = 4
# The narrowest register panel small_step compiles, per type: a panel of w columns runs the 8-,
# 16-, 24- or 32-wide unrolled code from this width up. With every width (8), a launch's warps
# run four copies of the pivot loop (the float64 column-major kernel's code was 2.6x larger, 229
# against 88 KB of cubin, and spilled 52 bytes) and the warps of an SM stall on instruction fetch
# (ncu, H100, 2026-11-25). The 32-wide code alone, which does up to 4x the flops of a narrow
# panel, took float64 column-major small_step launches from 22.5 to 16.8 us (uniform Nmax 32),
# 52.4 to 45.4 (uniform 128), 39.5 to 28.8 (skewed 128). float32, whose code is smaller, lost 2
# us at uniform 128 with it and nothing anywhere with 16 (the harness: up to 3-5% at Nmax
# 64-256 with 32) (H200, 2026-11-26, docs/decisions.md#potrf-small-nbmin). Row-major kept every
# width while its 32-wide float64 code spilled; since its rows move through the warp's tile
# (potrf.cu, warp_rows_load) neither order spills, and both take the same widths.
# Complex types (nb 16 by default: NB) take every width from 16: a 16-wide panel ran the 32-wide
# code 1.2-1.3x slower (complex128 uniform Nmax 48-128, H200). (Built with the 24- and 32-wide
# code, complex128's kernel spills 164-740 bytes; the 16-wide code alone none: ptxas, sm_90.)
SMALL_NBMIN = {"double": 32, "float": 16, "vb::cx<double>": 16, "vb::cx<float>": 16}
# A launch whose widest panel is at most that wide runs one width alone, the narrowest that
# holds it (small_widths): every warp then runs the same code, so none of the above's
# instruction fetch, and a batch of 8 x 8 problems does not run the 32-wide code. GPU time a
# call against that rule, float64, best of two (H200, docs/decisions.md#potrf-small-nbmin):
# equal Nmax 8 8.0 -> 4.5 us, uniform 16 8.6 -> 6.2, equal 40 64.0 -> 50.6.
SMALL_WIDTHS = (8, 16, 24, 32)
# Taller ones as fused_step, in whole warps up to FUSED_ROWS_MAX: a panel of r rows gets the
# smallest block that holds it.
FUSED_THREADS = tuple(range(SMALL_ROWS + 32, FUSED_ROWS_MAX + 1, 32))
# Rows per update tile (update_step runs 2 * RC threads, update_mma RC).
UPDATE_RCS = (32, 64, 128)
FP64_UPDATES = ("fma", "mma")
DTYPES = ("float64", "float32", "complex128", "complex64")
ORDERS = ("F", "C")
# Elements of a row tile (potrf.cu: row_tile, RK columns of 32 rows and a padding).
RK = 8


def real_name(dtype) -> str:
    """The name of ``dtype``'s real type (``float64`` for ``complex128``)."""
    return np.finfo(dtype).dtype.name


def _row(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be 'F' or 'C', got {order!r}")
    return "true" if order == "C" else "false"


# ----------------------------------------------------------------------------- options
# The panel width: nb 32 beat 16 for real types except in a few small gauss cases (within 15%;
# H100, 2026-11-21). Complex types take 16: a 32-wide complex row holds half the blocks an SM
# (potrf.cu: wide). With small panels from 16 wide (SMALL_NBMIN), nb 16 against 32 took
# complex128 uniform Nmax 64 / 128 / 256 from 0.212 / 0.777 / 3.618 ms to 0.157 / 0.555 / 2.384
# and complex64 from 0.125 / 0.514 / 2.162 to 0.096 / 0.295 / 1.082, but Nmax 32 from 0.044 to
# 0.048 (one panel where 16 takes two; k = 2,000, H200, docs/decisions.md#complex-cholesky-cuda).
NB = {"complex128": 16, "complex64": 16}


def plan_defaults(dtype) -> dict:
    # fused up to the fused kernel's largest block measured at or near the best (crossover
    # sweep, H100, 2026-11-21, docs/decisions.md#potrf-fused-crossover); 4 streams for the
    # chains of partial factorizations.
    name = real_name(dtype)
    return {"nb": NB.get(np.dtype(dtype).name, 32), "fused_max_rows": FUSED_ROWS_MAX,
            "streams": 4, "block": BLOCK[name], "block_above": BLOCK_ABOVE[name], "block_few": 0,
            "block_few_above": BLOCK_FEW_ABOVE[name]}


def device_defaults(dtype, info: dict) -> dict:
    """block_few from the device's multiprocessors (BLOCK_FEW_PER_SM)."""
    return {"block_few": BLOCK_FEW_PER_SM * int(info["sms"])} if "sms" in info else {}


def layout_defaults(dtype, order: str) -> dict:
    """Row-major float64 batches (and complex128 ones, by their real type: real_name) keep the
    blocking measured before the per-dtype one: on them (96, 256) still costs uniform Nmax
    320-512 9-16% and lognormal 10-20% (H100, with the row tiles of potrf.cu;
    docs/decisions.md#potrf-block-row-major). float32 takes its column-major (64, 512): 13-14%
    faster at skewed 768 and 1024, level at uniform."""
    if order == "C" and real_name(dtype) == "float64":
        return {"block": ROW_BLOCK, "block_above": ROW_BLOCK_ABOVE}
    return {}


def check_options(dtype, options: dict) -> None:
    from vbatch.ops.cholesky import check_block

    nb = options["nb"]
    if nb not in NB_SUPPORTED:
        raise InputError([(None, f"the cuda backend supports nb in {NB_SUPPORTED}, got {nb}")],
                         what="runtime options")
    check_block(nb, options.get("block", 0))
    # A taller panel than the fused kernel's largest block cannot be fused whatever was asked:
    # the crossover is "fuse up to this height", so it is capped, not refused.
    options["fused_max_rows"] = min(options["fused_max_rows"], FUSED_ROWS_MAX)


def check_plan(plan) -> None:
    # The one grid dimension a realistic batch can outgrow: schur_step enumerates the tile pairs
    # of a trailing block in gridDim.y, t (t + 1) / 2 of them for t tiles a side, so a trailing
    # block past about 23,000 rows cannot be launched. (The update and trsm grids reach the
    # limit only for n in the millions, which the memory check refuses first.)
    t = plan.tasks
    code = next((c for c, kd in enumerate(plan.kinds) if kd.name == "potrf.schur"), None)
    if code is None:
        return
    schur = np.flatnonzero(t.kind == code)
    tiles = -(-t.args[schur, 1] // SCHUR_TS)
    pairs = tiles * (tiles + 1) // 2
    bad = np.flatnonzero(pairs > MAX_GRID_Y)
    if len(bad):
        problems = []
        for b in bad.tolist():
            i = schur[b]
            p, tr = int(t.args[i, 0]), int(t.args[i, 1])
            problems.append((int(t.problem[i]),
                             f"its trailing block ({tr} x {tr}: n = {p + tr}, npiv = {p}) needs "
                             f"{int(pairs[b])} tile pairs, more than the cuda backend's grid "
                             f"allows ({MAX_GRID_Y}); factor more columns or split the problem"))
        raise InputError(problems)


# ----------------------------------------------------------------------------- selection
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


def row_smem(warps: int, isz: int) -> int:
    """Bytes of the row tiles (two a warp) of a row-major fused_step or small_step launch, in
    dynamic shared memory for 16-byte elements (potrf.cu: dynamic_tiles)."""
    return warps * 2 * RK * (32 + 16 // isz) * isz


def diag_smem(nb: int) -> int:
    """Elements factor_diag reuses of an update kernel's tiles (the diagonal block, padded,
    and potf2_regs' column broadcast)."""
    return nb * (nb + 1) + 2 * nb


# Names, in the syntax both NVRTC's name expressions and C++'s address-of accept.
def fused_name(T: str, nb: int, nt: int, R: str) -> str:
    return f"vb::fused_step<{T},{nb},{nt},{R}>"


def small_name(T: str, R: str, widths: tuple[int, int]) -> str:
    return f"vb::small_step<{T},{SMALL_WARPS},{R},{widths[0]},{widths[1]}>"


def small_widths(T: str, width: int) -> tuple[int, int]:
    """The register widths (NBMIN, NBMAX) small_step compiles for a launch whose widest panel
    has ``width`` columns: that panel's width alone where it is at most the type's
    SMALL_NBMIN, else the type's widths from SMALL_NBMIN up."""
    cover = next((c for c in SMALL_WIDTHS if c >= width), None)
    if cover is None:
        raise ValueError(f"small_step takes panels of at most {SMALL_WIDTHS[-1]} columns, "
                         f"got {width}")
    lo = SMALL_NBMIN[T]
    return (cover, cover) if cover <= lo else (lo, SMALL_WIDTHS[-1])


def _small_sets(T: str) -> list[tuple[int, int]]:
    """Every (NBMIN, NBMAX) small_widths gives for type ``T``."""
    return sorted({small_widths(T, w) for w in SMALL_WIDTHS})


def update_name(T: str, nb: int, rc: int, R: str) -> str:
    return f"vb::update_step<{T},{nb},{rc},{R}>"


def update_mma_name(nb: int, rc: int, R: str) -> str:
    return f"vb::update_mma<{nb},{rc},{R}>"


def trsm_name(T: str, nb: int, R: str) -> str:
    return f"vb::trsm_step<{T},{nb},{R}>"


def schur_name(T: str, R: str) -> str:
    return f"vb::schur_step<{T},{R}>"


TEMPLATES = ("vb::fused_step", "vb::small_step", "vb::update_step", "vb::update_mma",
             "vb::trsm_step", "vb::schur_step")


@dataclass(frozen=True)
class Selection:
    """One plan launch as the CUDA backend issues it. ``smem`` is in bytes; ``extra`` is the
    last scalar every kernel takes (the update's count of zero-only row tiles, else 0)."""

    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    smem: int
    extra: int = 0
    source: str = SOURCE


def select(lc, nb: int, dtype, order: str, fp64_update: str = "fma") -> Selection:
    """The kernel, grid, block and shared memory for one :class:`~vbatch.scheduler.Launch` of a
    POTRF plan with panel width ``nb``. ``fp64_update`` picks the float64 update kernel
    (``"fma"`` or ``"mma"``: tensor cores; float32 has no MMA without TF32, so it takes FMA)."""
    if nb not in NB_SUPPORTED:
        raise ValueError(f"the cuda kernels support nb in {NB_SUPPORTED}, got {nb}")
    if fp64_update not in FP64_UPDATES:
        raise ValueError(f"fp64_update must be one of {FP64_UPDATES}, got {fp64_update!r}")
    T, R = ctype(dtype), _row(order)
    isz = np.dtype(dtype).itemsize
    rows = lc.rows[1]
    tiles = order == "C" and isz > 8  # (potrf.cu: dynamic_tiles)
    if lc.kind == "fused" and rows <= SMALL_ROWS:
        sel = Selection(small_name(T, R, small_widths(T, lc.width)),
                        (-(-lc.count // SMALL_WARPS),), (32 * SMALL_WARPS,),
                        tiles * row_smem(SMALL_WARPS, isz))
    elif lc.kind == "fused":
        nt = fused_threads(rows)
        sel = Selection(fused_name(T, nb, nt, R), (lc.count,), (nt,),
                        tiles * row_smem(nt // 32, isz))
    elif lc.kind == "update":
        rc = update_rc(rows)
        zero_tiles = math.ceil(lc.cols[1] / rc)
        grid = (lc.count, zero_tiles + math.ceil(rows / rc))
        if T == "double" and fp64_update == "mma":
            sel = Selection(update_mma_name(nb, rc, R), grid, (rc,),
                            max(mma_smem(rc, nb, order == "C"), diag_smem(nb)) * isz, zero_tiles)
        else:
            sel = Selection(update_name(T, nb, rc, R), grid, (2 * rc,),
                            max(gemm_smem(rc, nb), diag_smem(nb)) * isz, zero_tiles)
    elif lc.kind == "trsm":
        sel = Selection(trsm_name(T, nb, R), (lc.count, max(1, math.ceil(rows / TRSM_RT))),
                        (TRSM_RT,), 0)
    elif lc.kind == "schur":
        t = math.ceil(rows / SCHUR_TS)
        sel = Selection(schur_name(T, R), (lc.count, t * (t + 1) // 2), (SCHUR_THREADS,),
                        gemm_smem(SCHUR_TS, SCHUR_TS) * isz)
    else:
        raise ValueError(f"cuda backend: potrf has no launch kind {lc.kind!r}")
    if len(sel.grid) > 1 and sel.grid[1] > MAX_GRID_Y:
        raise InputError([(None, f"launch {lc.index} ({lc.kind}) needs {sel.grid[1]} row tiles, "
                                 f"more than the grid allows ({MAX_GRID_Y})")])
    return sel


def section(names: tuple[str, ...]) -> list[str]:
    """This family's part of the per-call pointer table: A, L, info (potrf.cu reads tbl[0..2])."""
    return ["a", "l", "info"]


def selection(lc, plan, dtype, layouts: dict, config) -> Selection:
    """:func:`select` for the CUDA backend: the plan's panel width, the config's update, the
    order of the factored matrix (A and L share a layout)."""
    return select(lc, plan.nb, dtype, layouts["a"], config.fp64_update)


def kernel_names(dtypes=DTYPES, nbs=NB_SUPPORTED, orders=ORDERS) -> list[str]:
    """Every instantiation :func:`select` can return for these parameters."""
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
                out += [trsm_name(T, nb, R)]
            out += [schur_name(T, R)] + [small_name(T, R, ws) for ws in _small_sets(T)]
    return out
