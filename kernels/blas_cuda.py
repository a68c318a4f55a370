"""The ``blas`` kernel family on CUDA: which kernel each launch kind runs, its grid, its
``extra`` word. No cupy (tested without a GPU, like every launcher).

The kernels are ``blas.cu`` beside this file; its header comment defines the table section
(:func:`section`) and the bits of ``extra`` (:func:`encode`), which must agree with this module.
A task kind's ``params`` (:mod:`vbatch.ops.blas`) name the op's buffers; a buffer's index in the
plan's ``buffers`` is its slot, and whether a view has contiguous rows is the buffer's order
(``"C"``) exclusive-or the kind's transposition of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vbatch.ops.blas import COPY, GEMM, TRMM, TRSM
from vbatch.core.errors import InputError
from vbatch.kernels.cuda_build import ctype

OP = "blas"
SOURCE = "blas.cu"
TEMPLATES = ("vb::blas_gemm", "vb::blas_gemm_mma", "vb::blas_gemm_simt", "vb::blas_diag_cols",
             "vb::blas_trsv", "vb::blas_copy")
DTYPES = ("float64", "float32", "complex128", "complex64")
# Recursion base of triangular ops: a diagonal block has at most DIAG_NB rows, and
# blas_diag_cols takes it, a warp per block and a lane per right-hand-side column (32 a block of
# the grid's second dimension), in code unrolled for the narrowest of DIAG_COLS_NBS rows that
# holds the launch's widest block. Against the block kernels it replaced (four warps a block, a
# lane per row, for at most 32 right-hand sides; a thread per column, 128 a block, past that),
# TRSM with 16 right-hand sides, float64, the sweep's medians over Nmax 8-512, column- / row-major:
# 0.66x / 0.70x uniform, 0.82x / 0.87x skewed, 0.69x / 0.71x lognormal (H200;
# docs/decisions.md#blas-diag-cols).
DIAG_NB = 32
DIAG_WARPS = 4  # (2 for complex128: four warps' tiles would pass 48 KB of static shared memory)
DIAG_COLS_NBS = (8, 16, 24, 32)  # blas_diag_cols' unrolled widths
# (the widest covers every diagonal block: cols_nb finds one for any launch)
assert DIAG_COLS_NBS[-1] == DIAG_NB
# GEMM tiles on FMA (float32, and float64 with fp64_gemm="fma"): (BM, BN, BK, TM, TN), threads
# (BM / TM) x (BN / TN); the small one for launches of tasks within 32 x 32. It is one warp of
# 4 x 8 outputs a lane (as float64's one-warp DMMA tile): 256 threads of 2 x 2 took 33.9 us for
# uniform Nmax 32 (2,000 problems, one launch alone; float64's one-warp tile 17.3 us; H100,
# 2026-11-25).
GEMM_TILES = ((32, 32, 32, 4, 8), (64, 64, 16, 4, 4))
# The same kernel's tiles for complex types (the only GEMM kernel they take): the small one
# with a block of 128 threads of 2 x 4 outputs and 8-deep slices (the real types' one-warp tile
# held 34 KB of shared memory a warp in complex128 and spilled). GEMM of uniform sizes, k =
# 2,000, column-major, ms (H200; docs/decisions.md#complex-cuda), complex128 / complex64:
#   Nmax 8:  (32, 32, 32, 4, 8) 0.092 / 0.074, (32, 32, 8, 4, 8) 0.039 / 0.036,
#            (32, 32, 8, 2, 4) 0.037 / 0.034, (32, 32, 16, 4, 4) 0.044 / 0.038
#   Nmax 32: 0.108 / 0.079, 0.076 / 0.066, 0.055 / 0.047, 0.066 / 0.052
# The large tile stays: at Nmax 512, 29.4 / 14.3 against 39.2 / 18.4 for (64, 64, 8, 4, 4)
# and 31.4 / 22.8 for (64, 64, 16, 2, 4).
CX_GEMM_TILES = ((32, 32, 8, 2, 4), GEMM_TILES[1])
# float64 GEMM tiles on FP64 tensor cores: (BM, BN, WTM, stages), warps of WTM x 32, K chunks of 16
# through `stages` shared-memory buffers of A and B (mma_smem). The large tile is 128 x 64 in 4
# warps of 64 x 32: with 254 registers a thread, two blocks fit a multiprocessor, where the
# 128 x 128 tile (8 warps) fitted one and sat latency-bound (ncu: 2 warps per scheduler, 13 cycles
# per issued instruction, DP tensor pipe 38% busy). Of seven tiles tried on the harness's cases
# (`profile_cuda.py tiles`, H200, 2026-11-23), it was the fastest on square GEMMs: 6.24 against
# 7.60 ms at Nmax 512, 8.67 against 10.52 at 1024; on a K of 32 (the panel case) every large
# tile lost to the 64 x 64 one, hence the K rule in mma_tile. Swept again with the new
# epilogue (2026-11-24: 128 x 64 x 2 or 3 stages 4.36 ms at Nmax 512; 8 or 16 warps of 32 x 32,
# 128 x 128, 64 x 128: 5.0-6.3), it stays. The one-warp 32 x 32 tile takes launches of tasks
# within 32 x 32: uniform Nmax 32, one launch of it 0.022 ms of kernel time, where six launches
# of the 64 x 64 one took 0.090.
MMA_TILES = ((32, 32, 32, 2), (64, 64, 32, 3), (128, 64, 64, 3))
MMA_KB = 16
# float32 GEMM tiles for launches with a task past 32 rows or columns (blas_gemm_simt): (BM,
# stages), square, 256 threads of (BM / 16)^2 outputs; the large one where the output reaches
# 128 each way. The FMA tiles above remain for launches of tasks within 32 x 32. At the
# register bounds of their launch bounds (128 for the large tile, 80 for the small), ptxas
# spills up to ~90 bytes in some orientations' builds (sm_90, 2026-11-24).
SIMT_TILES = ((64, 3), (128, 3))
SIMT_KB = 16
# Whole-triangle solves (blas_trsv): a problem with at most WHOLE_RHS right-hand sides is solved
# in one task (one block reads its triangle once) instead of the recursion's chain; the column
# counts a block takes at once, the smallest that covers a launch's widest task. The crossover,
# POTRS (`profile_cuda.py whole`, float64, H200, 2026-11-24, X in shared memory), whole against
# recursive, ms:
#   Nmax 128:  1 rhs 0.22 / 0.42, 4: 0.26 / 0.43, 8: 0.51 / 0.43, 16: 0.61 / 0.46
#   Nmax 512:  1 rhs 0.76 / 2.29, 4: 0.96 / 2.26, 8: 2.41 / 2.49, 16: 2.78 / 2.70
#   Nmax 1024: 1 rhs 1.12 / 3.12, 4: 1.65 / 3.14, 8: 3.70 / 3.19, 16: 4.90 / 3.50
# (with X in global memory, 2026-11-23: Nmax 512, 1 rhs 0.88, 4: 1.24, 16: 4.04).
WHOLE_RHS = 4
TRSV_COLS = (1, 4)  # the last covers WHOLE_RHS (more columns: more blocks, each reading T)
# A float64 launch keeps its right-hand sides in shared memory for the whole solve (blas_trsv's
# XS) when its widest triangle's rows of NCOL columns fit in this much (two blocks a
# multiprocessor with the kernel's static 8.4 KB; H200: 227 KB a block, 228 an SM); else they
# stay in global memory, a block of rows staged at a time. float32 keeps them in global memory:
# POTRS of Nmax 512, one right-hand side, float32 0.73 ms with X in shared memory against
# 0.50-0.52 without; float64 0.70 against 0.78 (H200, 2026-11-25; not understood yet: the
# float32 build takes 60 registers against 48, four blocks a multiprocessor against five).
TRSV_SMEM = 100 * 1024
TRSV_XS_DTYPES = ("float64",)
# The copy's tile (blas_copy: 256 threads, CT^2 / 256 elements each). 32 x 32 spent most of
# each block in its start: 2.8x the copy's floor in trsm512 (H200, 2026-11-24).
COPY_TILE = 64
MAX_GRID_Y = 65535
MAX_GRID_X = 2**31 - 1
ABSENT = 7
NB_SUPPORTED = None  # no panel width: cuda_build.kernel_names passes None through

_ALPHA = {"alpha": 0, "minus": 1, "one": 2, "conj_alpha": 3}
_BETA = {"beta": 0, "zero": 1, "one": 2}


def section(names: tuple[str, ...]) -> list[str]:
    """This family's part of the per-call pointer table (blas.cu's header)."""
    return ["alpha", "beta", "info", "alpha_im", "beta_im", *names]


def plan_defaults(dtype) -> dict:
    return {"blas_nb": DIAG_NB, "streams": 4, "blas_whole_rhs": WHOLE_RHS}


def check_options(dtype, options: dict) -> None:
    if options.get("blas_nb", DIAG_NB) > DIAG_NB:
        raise InputError([(None, f"the cuda backend's triangular base is at most {DIAG_NB}, "
                                 f"got {options['blas_nb']}")], what="runtime options")


def gemm_tiles(T: str) -> tuple:
    """blas_gemm's (small, large) tiles for element type ``T``."""
    return CX_GEMM_TILES if T.startswith("vb::cx") else GEMM_TILES


def gemm_name(T: str, tile) -> str:
    return "vb::blas_gemm<{},{},{},{},{},{}>".format(T, *tile)


def mma_min_blocks(tile) -> int:
    """The blocks of a tile a multiprocessor must hold (blas_gemm_mma's launch bounds): a
    fifth entry of the tile, else as many as fit at 255 registers a thread for warps of 64 rows
    (two of the 128 x 64 tile) or 168 for warps of 32 (three of the 64 x 64, twelve of the
    one-warp 32 x 32), which their shared memory allows but for the last (mma_smem: 111, 74 and
    25 KB at most: nine). Unbounded, the row-major orientations took 184 registers at 64 x 64,
    a block fewer; bounded, ptxas spills 48-56 bytes in the row-major-A builds of the 32 x 32
    and 64 x 64 tiles (sm_90, 2026-11-24)."""
    if len(tile) > 4:
        return int(tile[4])
    bm, bn, wtm = tile[:3]
    threads = (bm // wtm) * (bn // 32) * 32
    return max(1, 65536 // (threads * (256 if wtm >= 64 else 168)))


def mma_name(tile, arow: bool, brow: bool) -> str:
    """A tile is (BM, BN, WTM, stages), or with a fifth entry the kernel's MINB."""
    return "vb::blas_gemm_mma<{},{},{},{},{},{},{}>".format(*tile[:4], _b(arow), _b(brow),
                                                          mma_min_blocks(tile))


def mma_smem(tile, arow: bool, brow: bool) -> int:
    """Dynamic shared memory of blas_gemm_mma in bytes (pipeline.cuh's smw_size per stage)."""
    bm, bn, _, stages = tile[:4]

    def size(kcont: bool, o: int) -> int:
        return o * (MMA_KB + 8) if kcont else MMA_KB * (o + 2)

    # The epilogue parks the block's tile (bm x (bn + 1)) in the same buffers.
    return 8 * max(stages * (size(arow, bm) + size(not brow, bn)), bm * (bn + 1))


def simt_name(tile, arow: bool, brow: bool) -> str:
    return "vb::blas_gemm_simt<{},{},{},{}>".format(*tile, _b(arow), _b(brow))


def simt_smem(tile) -> int:
    """Dynamic shared memory of blas_gemm_simt in bytes: its stages (k-major, rows padded by
    4), or the block's tile parked for the epilogue (bm x (bm + 1)), whichever is larger."""
    bm, stages = tile
    return 4 * max(stages * 2 * SIMT_KB * (bm + 4), bm * (bm + 1))


def _b(v: bool) -> str:
    return "true" if v else "false"


def diag_warps(T: str) -> int:
    return 2 if T == "vb::cx<double>" else DIAG_WARPS


def cols_name(T: str, nb: int, mul: bool) -> str:
    return f"vb::blas_diag_cols<{T},{diag_warps(T)},{nb},{_b(mul)}>"


def cols_nb(mm: int) -> int:
    """blas_diag_cols' unrolled width for a launch whose widest block has ``mm`` rows."""
    return next(nb for nb in DIAG_COLS_NBS if nb >= mm)


def trsv_name(T: str, ncol: int, xs: bool) -> str:
    return f"vb::blas_trsv<{T},{ncol},{'true' if xs else 'false'}>"


def trsv_smem(w: int, ncol: int, itemsize: int) -> int:
    """blas_trsv's dynamic shared memory with X held there (XS): rows rounded up to 32, each
    padded to ncol + 1 (ncol > 1; blas.cu's XP)."""
    return -(-w // 32) * 32 * (ncol + (ncol > 1)) * itemsize


def copy_name(T: str) -> str:
    return f"vb::blas_copy<{T},{COPY_TILE}>"


def kernel_names(dtypes=DTYPES, nbs=None, orders=None) -> list[str]:
    out = []
    for dt in dtypes:
        T = ctype(dt)
        out += [gemm_name(T, tile) for tile in gemm_tiles(T)]
        if T == "double":
            out += [mma_name(tile, ar, br) for tile in MMA_TILES
                    for ar in (False, True) for br in (False, True)]
        elif T == "float":
            out += [simt_name(tile, ar, br) for tile in SIMT_TILES
                    for ar in (False, True) for br in (False, True)]
        out += [cols_name(T, nb, mul) for nb in DIAG_COLS_NBS for mul in (False, True)]
        out += [copy_name(T)]
        out += [trsv_name(T, c, xs) for c in TRSV_COLS
                for xs in ((False, True) if dt in TRSV_XS_DTYPES else (False,))]
    return out


def encode(slots, rows, tri: int = 0, alpha: str = "one", beta: str = "one",
           skip: int = 0, source: tuple = (ABSENT, False, "one"), conj: tuple = ()) -> int:
    """``extra``: up to four operand slots and view orientations, the source (its slot,
    orientation and scale) that a task whose ``src`` arg is set reads first, and whether
    operands 0 and 1 are conjugated (blas.cu's header)."""
    word = 0
    for i, s in enumerate(slots):
        word |= (s & 7) << (3 * i)
    for i in range(len(slots), 4):
        word |= ABSENT << (3 * i)
    for i, r in enumerate(rows):
        word |= int(bool(r)) << (12 + i)
    slot, row, scale = source
    return (word | (tri << 16) | (_ALPHA[alpha] << 18) | (_BETA[beta] << 20) | (int(skip) << 22)
            | ((slot & 7) << 23) | (int(bool(row)) << 26) | (_ALPHA[scale] << 27)
            | sum(int(bool(c)) << (29 + i) for i, c in enumerate(conj)))


@dataclass(frozen=True)
class Selection:
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    smem: int
    extra: int = 0
    source: str = SOURCE


def _slot(plan, name: str) -> int:
    if not name:
        return ABSENT
    return plan.buffers.index(name)


def _row(layouts: dict, name: str, t: int) -> bool:
    # (t's bit 1, a conjugate, goes to extra's conjugate bits: _conj)
    return (layouts.get(name) == "C") != bool(t & 1)


def _conj(dtype, *ts: int) -> tuple:
    """The conjugate bits of operands 0 and 1 (views ``ts``): set for complex types only, so a
    real launch's ``extra`` is what it was before complex types."""
    return tuple(bool(t & 2) for t in ts) if np.dtype(dtype).kind == "c" else ()


def _source(plan, layouts: dict, p: dict, t: int) -> tuple:
    """A kind's source (``src``: the buffer its first tasks read, viewed as ``t`` says, times
    ``scale``), as :func:`encode` takes it."""
    return _slot(plan, p["src"]), _row(layouts, p["src"], t), p["scale"]


def mma_tile(mm: int, nn: int, kk: int = MMA_TILES[2][0]) -> tuple:
    """The DMMA tile of a launch whose tasks are at most mm x nn x kk: the large one where the
    output reaches 128 each way and K is at least 128 (measured: module constants); a short K,
    where C in and O out dominate, keeps the 64 x 64 tile and more blocks per multiprocessor;
    tasks within 32 x 32 take one warp each (a 64 x 64 block of 4 warps for a problem of 32 or
    less left three of them idle, and held three blocks a multiprocessor where a warp's block
    takes twelve), and so do outputs at most 32 wide (a triangular solve's joins with few
    right-hand sides, where the 64 x 64 block left half of its warps idle: POTRS of Nmax 512
    with 16, 2.64-2.71 ms against 2.80-2.81, H100, 2026-11-25; outputs at most 32 tall were
    no faster that way, TRSM of Nmax 512 9.70-9.81 against 9.69-9.87)."""
    big = MMA_TILES[2][0]
    if nn <= MMA_TILES[0][0]:
        return MMA_TILES[0]
    return MMA_TILES[2] if min(mm, nn) >= big and kk >= big else MMA_TILES[1]


def _task_tiles(a: np.ndarray, tile) -> np.ndarray:
    """The tiles each task (task args ``a``) needs."""
    return (a[:, 1] + tile[0] - 1) // tile[0] * ((a[:, 4] + tile[1] - 1) // tile[1])


def _tiles(a: np.ndarray, tile) -> int:
    """The most tiles any task of a launch needs."""
    return int(_task_tiles(a, tile).max())


def diag_kernel(mm: int, nn: int) -> tuple[str, int]:
    """Which kernel runs a triangular launch whose widest block has ``mm`` rows and ``nn``
    columns, and the columns one block of its grid takes: ("trsv", 1 or 4) whole triangles,
    else ("cols", 32)."""
    if mm > DIAG_NB:
        return "trsv", next((c for c in TRSV_COLS if c >= nn), TRSV_COLS[-1])
    return "cols", 32


def selection(lc, plan, dtype, layouts: dict, config) -> Selection:
    """The kernel and grid of one launch; ``layouts`` maps the op's buffers to their order."""
    kd = next(k for k in plan.kinds if k.name == lc.task_kind)
    p = kd.param
    T = ctype(dtype)
    a = plan.tasks.args[lc.lo:lc.hi]
    mm, nn = int(a[:, 1].max()), int(a[:, 4].max())
    if lc.kind == GEMM:
        tri = {"": 0, "lower": 1, "upper": 2}[p["uplo"]]
        slots = [_slot(plan, p[x]) for x in ("a", "b", "c", "o")]
        rows = [_row(layouts, p["a"], p["ta"]), _row(layouts, p["b"], p["tb"]),
                _row(layouts, p["c"], p["tc"]), _row(layouts, p["o"], p["tc"])]
        extra = encode(slots, rows, tri, p["alpha"], p["beta"], p["skip_failed"],
                       _source(plan, layouts, p, p["tc"]), _conj(dtype, p["ta"], p["tb"]))
        if T == "double" and config.fp64_gemm == "mma":
            tile = mma_tile(mm, nn, int(a[:, 3].max()))
            sel = Selection(mma_name(tile, rows[0], rows[1]), (lc.count * _tiles(a, tile),),
                            ((tile[0] // tile[2]) * (tile[1] // 32) * 32,),
                            mma_smem(tile, rows[0], rows[1]), extra)
        elif T == "float" and max(mm, nn) > GEMM_TILES[0][0]:
            tile = SIMT_TILES[1] if min(mm, nn) >= SIMT_TILES[1][0] else SIMT_TILES[0]
            sel = Selection(simt_name(tile, rows[0], rows[1]),
                            (lc.count * _tiles(a, (tile[0], tile[0])),), (256,),
                            simt_smem(tile), extra)
        else:
            small, large = gemm_tiles(T)
            tile = small if mm <= small[0] and nn <= small[1] else large
            sel = Selection(gemm_name(T, tile), (lc.count * _tiles(a, tile),),
                            ((tile[0] // tile[3]) * (tile[1] // tile[4]),), 0, extra)
    elif lc.kind in (TRSM, TRMM):
        tri = int(p["lower"]) | (int(p["unit"]) << 1)
        extra = encode([_slot(plan, p["t"]), _slot(plan, p["x"])],
                       [_row(layouts, p["t"], p["tt"]), _row(layouts, p["x"], p["tx"])],
                       tri, "one", "one", p["skip_failed"], _source(plan, layouts, p, p["tx"]),
                       _conj(dtype, p["tt"]))
        kernel, cols = diag_kernel(mm, nn)
        if kernel == "trsv":  # whole triangles (a solve: products recurse)
            if lc.kind == TRMM:
                raise ValueError(f"cuda backend: a triangular product block of "
                                 f"{mm} rows (at most {DIAG_NB})")
            smem = trsv_smem(mm, cols, np.dtype(dtype).itemsize)
            xs = smem <= TRSV_SMEM and np.dtype(dtype).name in TRSV_XS_DTYPES
            sel = Selection(trsv_name(T, cols, xs), (lc.count, math.ceil(nn / cols)), (256,),
                            smem if xs else 0, extra)
        else:
            warps = diag_warps(T)
            sel = Selection(cols_name(T, cols_nb(mm), lc.kind == TRMM),
                            (math.ceil(lc.count / warps), math.ceil(nn / cols)),
                            (32 * warps,), 0, extra)
    elif lc.kind == COPY:
        tiles = _tiles(a, (COPY_TILE, COPY_TILE))
        extra = encode([_slot(plan, p["src"]), _slot(plan, p["dst"])],
                       [_row(layouts, p["src"], p["t"]), _row(layouts, p["dst"], p["t"])],
                       {"": 0, "lower": 1, "upper": 2}[p["sym"]], p["alpha"], "one",
                       conj=_conj(dtype, p["t"]))
        sel = Selection(copy_name(T), (lc.count, tiles), (256,), 0, extra)
    else:
        raise ValueError(f"cuda backend: the blas family has no launch kind {lc.kind!r}")
    if len(sel.grid) > 1 and sel.grid[1] > MAX_GRID_Y or sel.grid[0] > MAX_GRID_X:
        raise InputError([(None, f"launch {lc.index} ({lc.kind}) needs {sel.grid[1]} tiles, "
                                 f"more than the grid allows ({MAX_GRID_Y})")])
    return sel


def check_plan(plan) -> None:
    """A task whose launch would need more blocks in the grid's second dimension than it allows
    is named at submit: a copy's 64 x 64 tiles, a triangular block's groups of right-hand
    sides (as many as its launch's kernel takes a block: diag_kernel); a GEMM's grid is
    one-dimensional."""
    t = plan.tasks
    bad = []
    for lc in plan.launches:
        if lc.family != OP or lc.kind == GEMM:
            continue
        a = t.args[lc.lo:lc.hi]
        if lc.kind == COPY:
            y = _task_tiles(a, (COPY_TILE, COPY_TILE))
        else:
            y = -(-a[:, 4] // diag_kernel(int(a[:, 1].max()), int(a[:, 4].max()))[1])
        bad += [(lc.lo + int(i), int(y[i])) for i in np.flatnonzero(y > MAX_GRID_Y)]
    if bad:
        raise InputError([(int(t.problem[i]), f"a {int(t.args[i, 1])} x {int(t.args[i, 4])} "
                                              f"block needs {y} blocks of a launch's grid, more "
                                              f"than the cuda backend allows ({MAX_GRID_Y})")
                          for i, y in bad[:10]])
