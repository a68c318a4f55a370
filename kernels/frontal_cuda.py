"""The ``frontal`` kernel family on CUDA: which kernel an extend-add launch runs, its grid, its
``extra`` word. No cupy (tested without a GPU, like every launcher).

The kernels are in ``frontal.cu`` beside this file. The extend-add: a block per (task, batch of
32 x 32 tiles of the update block's lower triangle); ``extra`` holds the plan slots of the fronts
(``l``) and of the positions (``rel``), whose offsets and leading dimensions it reads from the
plan's tables. The solve's sweeps: a block per item (256 threads), ``extra`` the slots of ``l``,
``rel``, ``x`` and the scratch, and the column count; the small subtrees' sweeps: a warp per
front, 8 a block, each warp taking fronts until none is left (so the blocks past those that fit
on the GPU at once find none and exit); the reset: a thread per front; the moves of the
stacked right-hand sides in and of the solution out: a warp per CHUNK rows of a front, 8 a
block.
"""

from __future__ import annotations

import numpy as np

from vbatch.kernels.blas_cuda import Selection  # the launch record every launcher returns
from vbatch.kernels.cuda_build import ctype
from vbatch.ops.frontal import (CHUNK, EXTEND, SMALL_FRONT, SWEEP_BWD, SWEEP_BWD_SMALL,
                                   SWEEP_FWD, SWEEP_FWD_SMALL, SWEEP_IN, SWEEP_OUT, SWEEP_RESET,
                                   SWEEP_SPLIT, TREE, TREE_CLASSES, UPDATE_ROWS)

OP = "frontal"
SOURCE = "frontal.cu"
TEMPLATES = ("vb::frontal_extend_add", "vb::frontal_sweep", "vb::frontal_sweep_small",
             "vb::frontal_sweep_reset", "vb::frontal_sweep_move", "vb::frontal_tree",
             "vb::frontal_tree_smem")
DTYPES = ("float64", "float32")
ORDERS = ("F", "C")
NB_SUPPORTED = None
TILE = 32  # frontal.cu's tile: 256 threads, 4 entries each
MAX_GRID_Y = 65535  # more tiles than this: the blocks of a task loop over them



# The cost model by which the sparse analysis's "auto" ordering chooses (analysis.estimate):
# seconds a flop, and a panel step on the assembly tree's critical path. Fitted (least squares
# on relative error) to the float64 factor times of 25 (matrix, ordering) pairs on the H100
# (2026-11-25, docs/decisions.md#sparse-ordering-cost-model: the shared matrices, 2-D and 3-D
# Laplacians, in ND, RCM and natural order): 1.4 TFLOP/s and 18 us a step. bcsstk16 has the
# least fill in its natural order (a band) but a chain of 129 fronts: 5.45 ms; ND 2.27 ms.
ORDER_COST = {"flop": 7.2e-13, "step": 1.8e-5}
# Subtrees of fronts of at most this many rows factor in frontal.tree launches (frontal.cu's
# tree kernels; ops.frontal.TREE_CLASSES). Chosen when the 96-row class still ran the
# register kernel (it now runs frontal_tree_smem, 128 us -> 85 in the 1000 Laplacians; 96 vs
# 128 not measured since). H200, 2026-11-25, one process, factor ms at
# tree_max 0 / 64 / 96 / 128 (tree-ab1.json): the 1000 Laplacians 1.96 / 1.64 / 1.60 / 1.59,
# 494_bus 0.178 / 0.119 / 0.123 / 0.124, lap2-100 0.695 / 0.584 / 0.558 / 0.585, lap2-300 2.92 /
# 2.66 / 2.31 / 2.36, lap3-40 11.85 / 11.58 / 11.07 / 10.73, bcsstk16 2.03 / 2.00 / 1.92 / 1.85:
# 96 and 128 within a few percent either way; 128's class holds one block a multiprocessor.
TREE_MAX = 96


def plan_defaults(dtype) -> dict:
    # A front's panels are one problem's chain, latency-bound like a skewed batch's largest
    # problems, so fronts block from 256 columns in block columns of 256 (the dense defaults
    # are 96 from 256 in float64, 64 from 512 in float32: potrf_cuda.BLOCK). Factor of the
    # 3-D Laplacians on the H100 (docs/decisions.md#sparse-front-blocking; one process, interleaved,
    # ms; unblocked / block 128 from 512 / 128 from 128 / 256 from 256):
    # 40^3 19.35 / 12.80 / 13.01 / 12.50, 60^3 99.2 / 53.0 / 52.9 / 48.0.
    # tree_max: fronts in subtrees of fronts of at most this many rows factor in frontal.tree
    # launches (vbatch.ops.frontal.frontal_graph); 0 turns them off.
    # tree_shapes: the tree kernels' shape per class (TREE_SHAPES, as sorted pairs: a plan
    # option is hashable), for measuring others.
    # sweep_split: the solve's small subtrees' fronts in launches of their own from this many,
    # and always where every front is in one (vbatch.ops.frontal.SWEEP_SPLIT, where the
    # measurement is).
    # block_few (the dense batches' few large problems, potrf_cuda.BLOCK_FEW_PER_SM) is off:
    # not measured on fronts.
    return {"block": 256, "block_above": 256, "block_few": 0, "block_few_above": 0,
            "tree_max": TREE_MAX,
            "tree_split": True,
            "tree_shapes": tuple(sorted(TREE_SHAPES.items())), "sweep_split": SWEEP_SPLIT}


def section(names: tuple[str, ...]) -> list[str]:
    """This family's part of the per-call pointer table (frontal.cu reads tbl[0..7]; an
    absent buffer's entry is null: the factorization's ``x``, a solve's ``rhs`` and ``rows``
    where it was given none)."""
    return ["l", "rel", "x", "sync", "info", "rhs", "rows", "y"]


def extend_name(T: str, order: str) -> str:
    return f"vb::frontal_extend_add<{T},{'true' if order == 'C' else 'false'}>"


RHS_PASSES = (1, 4)  # right-hand sides a pass of the sweeps: 1 for one, else 4
# frontal_sweep's blocks a multiprocessor with one right-hand side a pass, per type (4 a pass:
# 2). At 3 (80 registers) the float64 builds spilled 4-192 bytes of stores and 12-240 of loads
# (ptxas, sm_90, nvcc 13.0); at 2 none. GPU us of a solve, 3 -> 2 (the small sweeps' 3 -> 2
# beside it, which moved no all-small case; H200, two alternated runs,
# docs/decisions.md#sparse-solve-sweeps): bcsstk09 111 -> 104, bcsstk16 393 -> 361, lap2-100
# 194 -> 179, lap3-20 422 -> 385, lap3-40 1542 -> 1448. float32 (at most 8 bytes of spill
# stores at 3) lost 4% at lap3-40 and 8% on the 1000 Laplacians with both at 2, so it keeps 3.
# Complex types take their real type's (not measured on them).
SWEEP_BLOCKS = {"double": 2, "float": 3, "vb::cx<double>": 2, "vb::cx<float>": 3}


def sweep_name(T: str, order: str, forward: bool, rc: int) -> str:
    row, f = ("true" if order == "C" else "false"), ("true" if forward else "false")
    return (f"vb::frontal_sweep<{T},{row},{f},{CHUNK},{UPDATE_ROWS},{rc},{SMALL_FRONT // 32},"
            f"{SWEEP_BLOCKS[T] if rc == 1 else 2}>")


# frontal_sweep_small's blocks a multiprocessor (8 warps each; registers capped to fit): 3
# (80 registers, 8-52 bytes of spills, float32 24-48; nvcc 13.0) against 4 (64, 80-250 bytes
# in float64), GPU us of the 1000 Laplacians' small sweeps, forward / backward, two rounds
# (H200, 2026-11-26): 208-212 / 244 against 224-226 / 271-273; lap2-300 48-49 / 71-72 against
# 49-56 / 74-76. With 4 and half the chunk (64 registers, 8-40 bytes of spills) 216-217 / 248,
# with 5 243-245 / 284-291: more warps with fewer loads each gain nothing. Since a front's rows
# stay in registers (the slice selects, docs/decisions.md#sparse-solve-small-fronts) the builds
# spill 16-76 bytes of stores at 3 and none at 2, where the small matrices' solves were 2-5%
# faster but the 1000 Laplacians' 3% (float64) and 6% (float32) slower.
SWEEP_SMALL_BLOCKS = 3


def sweep_small_name(T: str, order: str, forward: bool) -> str:
    row, f = ("true" if order == "C" else "false"), ("true" if forward else "false")
    return (f"vb::frontal_sweep_small<{T},{row},{f},{SMALL_FRONT // 32},"
            f"{SWEEP_SMALL_BLOCKS}>")


# The tree kernels' shape per size class (ops.frontal.TREE_CLASSES): ("smem", threads,
# blocks, panel) for frontal_tree_smem (panel: its pivot columns a barrier, 1 if left out),
# (TXR, TXC, RR, RC, blocks) for frontal_tree (a TXR x TXC thread
# grid holding the front's TXR RR = TXC RC rows, RR x RC entries a thread); blocks: those a
# multiprocessor must hold (registers capped to fit). frontal_tree_smem holds the front in
# dynamic shared memory (96 rows in float64: 74 KB, 3 blocks a multiprocessor at most; 128
# rows: 132 KB, one), so 128 rows stay with frontal_tree. Measured on the H200
# (2026-11-25; tree_ab.py and sp_kinds.py; files in docs/results/h200-2026-11-25-s8/), for the
# 1000 Laplacians' classes (17,041 fronts of up to 32 rows, 22,800 of up to 64, 676 of up to
# 96):
# - frontal_tree, 16 x 16 threads for every class, no cap (8, 3, 1 blocks): 175, 1,029 and
#   128 us (tree-kinds-batch.json); 8 x 8 threads and 16 blocks for 32 rows, a cap of 4 blocks
#   for 64: 121, 920, 128 (tree-kinds-s1.json). ncu on the 64-row class: an instruction issued
#   76% of cycles a scheduler (each column costs every warp its barrier, broadcast and guards);
#   fewer threads a front (8 x 8 for 48 and 64 rows; 16 x 8; one warp for 32) moved a class by
#   +-10% and the small matrices the other way (tree-kinds-tx8.json, tree-shapes-2.json).
# - frontal_tree_smem (per-front globaltimer stamps: a 64-row-class front spent 4.2 us loading
#   and 17.8 factoring, 0.74 us a column, each column's loads waiting on the last one's
#   stores): with the loads and the column updates batched, 115, 653 and 128 us; the batch's
#   factor 1.40 -> 1.12 ms, 494_bus 0.124 -> 0.117, lap2-300 2.45 -> 2.40, bcsstk16, lap2-100
#   and lap3-40 within 1% (tree-smem.json). A 48-row class between them gained nothing (268 +
#   401 us against 653).
# - panels of 4 pivot columns with a look-ahead (2026-11-26, docs/results/h200-2026-11-26-s2/,
#   sp_kinds.py): 32 / 64 rows at panel 1 / 1: 115 / 656 us; 4 / 4: 103 / 510; 4 / 8: 102 /
#   577; 8 / 8: 105 / 580; with a Schur pass since reverted, 2 / 4: 106 / 574 against 4 / 4:
#   109 / 577. The batch's factor 1.163 / 1.135 -> 1.059 / 1.019 ms in two rounds against the
#   tree before (tree_ab.py, ab_*.json); the other matrices within the rounds' spread.
# - frontal_tree_smem for 96 rows too (its front in dynamic shared memory), same process
#   (ab6.json, kinds_Q*.json): the class 128 us with frontal_tree (16 x 16, 2 blocks), 92 with
#   128 threads and 3 blocks, 85 with 192 threads and 2, 99 with 128 threads and panels of 8;
#   the batch's factor 1.064 -> 1.014 ms, lap2-100 0.541 -> 0.516, 494_bus, lap2-300, bcsstk16
#   and lap3-40 within 1.5%.
TREE_SHAPES = {32: ("smem", 64, 16, 4), 64: ("smem", 128, 6, 4), 96: ("smem", 192, 2, 4),
               128: (16, 16, 8, 8, 1)}


def tree_threads(shape: tuple) -> int:
    """A block's threads for a TREE_SHAPES entry: ("smem", threads, blocks[, panel]) for
    frontal_tree_smem, (TXR, TXC, RR, RC, blocks) for frontal_tree."""
    return shape[1] if shape[0] == "smem" else shape[0] * shape[1]


def tree_name(T: str, order: str, rows: int, shapes=None) -> str:
    shape = (shapes or TREE_SHAPES)[rows]
    row = "true" if order == "C" else "false"
    if shape[0] == "smem":
        pb = shape[3] if len(shape) > 3 else 1
        return f"vb::frontal_tree_smem<{T},{row},{rows},{shape[1]},{shape[2]},{pb}>"
    txr, txc, rr, rc, minb = shape
    return f"vb::frontal_tree<{T},{row},{txr},{txc},{rr},{rc},{minb}>"


def reset_name(T: str) -> str:
    return f"vb::frontal_sweep_reset<{T}>"


def move_name(T: str, order: str, into: bool) -> str:
    row = "true" if order == "C" else "false"
    return f"vb::frontal_sweep_move<{T},{row},{'true' if into else 'false'},{CHUNK}>"


def kernel_names(dtypes=DTYPES, nbs=None, orders=ORDERS) -> list[str]:
    out = []
    for dt in dtypes:
        T = ctype(dt)
        for o in orders:
            out.append(extend_name(T, o))
            out += [sweep_name(T, o, fw, rc) for fw in (True, False) for rc in RHS_PASSES]
            out += [sweep_small_name(T, o, fw) for fw in (True, False)]
            out += [move_name(T, o, into) for into in (True, False)]
            out += [tree_name(T, o, c) for c in TREE_CLASSES]
        out.append(reset_name(T))
    return out


def selection(lc, plan, dtype, layouts: dict, config) -> Selection:
    T = ctype(dtype)
    a = plan.tasks.args[lc.lo:lc.hi]
    if lc.kind in (SWEEP_IN, SWEEP_OUT):
        slot = {name: plan.buffers.index(name) for name in ("x", "rhs", "rows", "y")}
        r = int(plan.tasks.width[lc.lo])
        extra = slot["x"] | slot["rhs"] << 4 | slot["rows"] << 8 | slot["y"] << 12 | r << 16
        return Selection(move_name(T, layouts["x"], lc.kind == SWEEP_IN), (-(-lc.count // 8),),
                         (256,), 0, extra, SOURCE)
    if lc.kind in (SWEEP_FWD, SWEEP_BWD, SWEEP_RESET, SWEEP_FWD_SMALL, SWEEP_BWD_SMALL):
        # (the factor's plan has no x: only the reset of its tree counters comes here)
        slot = {name: plan.buffers.index(name) if name in plan.buffers else 0
                for name in ("l", "rel", "x", "sync")}
        r = int(plan.tasks.width[lc.lo])  # every item's width is the column count
        extra = slot["l"] | slot["rel"] << 4 | slot["x"] << 8 | slot["sync"] << 12 | r << 16
        if lc.kind == SWEEP_RESET:
            return Selection(reset_name(T), (max(1, -(-plan.k // 256)),), (256,), 0, extra,
                             SOURCE)
        if lc.kind in (SWEEP_FWD_SMALL, SWEEP_BWD_SMALL):
            return Selection(sweep_small_name(T, layouts["x"], lc.kind == SWEEP_FWD_SMALL),
                             (-(-lc.count // 8),), (256,), 0, extra, SOURCE)
        return Selection(sweep_name(T, layouts["x"], lc.kind == SWEEP_FWD, 1 if r == 1 else 4),
                         (lc.count,), (256,), 0, extra, SOURCE)
    if lc.kind == TREE:
        slot = {name: plan.buffers.index(name) for name in ("l", "rel", "sync")}
        rows = int(plan.tasks.rows[lc.lo:lc.hi].max())  # the launch's class: its largest
        cls = int(np.searchsorted(np.asarray(TREE_CLASSES), rows))
        extra = slot["l"] | slot["rel"] << 4 | slot["sync"] << 12 | cls << 16
        shapes = dict(plan.opts.get("tree_shapes", ())) or TREE_SHAPES
        rows = TREE_CLASSES[cls]
        shape = shapes[rows]
        # frontal_tree_smem's front: rows x (rows + 1) entries of dynamic shared memory
        smem = rows * (rows + 1) * np.dtype(dtype).itemsize if shape[0] == "smem" else 0
        return Selection(tree_name(T, layouts["l"], rows, shapes), (lc.count,),
                         (tree_threads(shape),), smem, extra, SOURCE)
    if lc.kind != EXTEND:
        raise ValueError(f"cuda backend: the frontal family has no launch kind {lc.kind!r}")
    u = int(a[:, 2].max())
    t = -(-u // TILE)
    extra = plan.buffers.index("l") | (plan.buffers.index("rel") << 4)
    return Selection(extend_name(T, layouts["l"]),
                     (lc.count, max(1, min(t * t, MAX_GRID_Y))), (256,), 0, extra, SOURCE)
