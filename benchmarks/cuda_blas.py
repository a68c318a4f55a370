"""Variable-size batched GEMM, TRSM and POTRS on a GPU, side by side: vbatch and the anchors.

What a user can pick today, against vbatch.

    python benchmarks/cuda_blas.py [--cases ...] [--methods ...] [--dtype float64 float32]
                                   [--reps 5] [--magma LIB] [--out PREFIX] [--no-plot]

One process; per case one draw of sizes and one set of inputs, shared by every method (the
anchors' method, ../shared/anchors/README.md). Cases (``--cases``; names are parsed, so any Nmax
works; k = 2000 problems, 500 from Nmax 1024 on, ``--count`` overrides):

* ``gemm-squareN``  C := A B + C, m = n = k ~ U[1, N] (one draw per problem, all three equal);
* ``gemm-panelN``   C := A B + C, m = n ~ U[1, N], inner dimension 32 (a factorization's update);
* ``gemm-panelmnN`` the same with m and n drawn independently: not in the default set, but what
  the anchors file's panel numbers imply (its GFLOP and floors match E[m] E[n] * 64 per problem,
  not E[n^2] * 64), for comparing with that table;
* ``trsmN``         X := A^{-1} B, A lower triangular m x m, B m x n, m = n ~ U[1, N];
* ``potrsN-nrhsR``  X := (L L^T)^{-1} B, B n x R, n ~ U[1, N], L the Cholesky factor of a
  diagonally dominant SPD draw.

Default: gemm-square 32/128/512/1024, gemm-panel512, trsm512, potrs512 with 1 and 16 right-hand
sides. Inputs: entries uniform on [-1, 1], column-major packed batches (``order="F"``, tight
leading dimensions); a triangular A has its diagonal set to m (so it is well conditioned,
cond < 3); only lower triangles are read (the upper ones hold random numbers, on purpose).

Methods (``--methods``; an anchor that cannot run is skipped with its reason, never fatal):

* vbatch    ``rt.gemm(a, b, c, beta=1.0)`` / ``rt.trsm(a, b)`` / ``rt.potrs(l, b)`` on the packed
            device batches, ``.result()`` included (a new output each call, as a user gets);
* bucket32  problems grouped into buckets of 32 sizes per dimension (a dimension that is the
            same for all problems, like the panel's 32 or potrs' nrhs, is not padded), each
            bucket zero-padded (identity on a triangle's padded diagonal) into a strided stack,
            one cuBLAS call per bucket: ``cublas<t>gemmStridedBatched`` (beta = 1, in place),
            ``cublas<t>trsmBatched`` (POTRS: two, L then L^T);
* grouped   GEMM only: ``cublasGemmGroupedBatchedEx`` on the packed batches, one group per
            problem (as the anchors measured it), host size arrays, device pointer arrays;
            needs cuBLAS >= 12.5; ``benchmarks/cublas.py`` finds CuPy's own libcublas;
* torch     everything zero-padded to the largest size, one call: ``torch.baddbmm``,
            ``torch.linalg.solve_triangular(upper=False)``, ``torch.cholesky_solve(upper=False)``;
* magma     ``--magma PATH`` (or $VBATCH_MAGMA) to libmagma_vb.so (``bash .magma/build.sh``):
            ``magmablas_Xgemm_vbatched_max_nocheck`` (beta = 1), ``..._Xtrsm_vbatched_...``;
            POTRS is two TRSM calls (MAGMA has no potrs_vbatched); through benchmarks/magma.py.

In-place methods (bucket32, grouped, magma) get their output operand restored, untimed, before
every call. Padding, pointer arrays and MAGMA's device metadata are built once beforehand.

Time: wall clock of the call with the data on the GPU, device synchronized, median of --reps
after WARMUP warm-up calls (every method the same). For vbatch also its host time (issuing
the call, plus ``result()`` after the GPU finished) and its GPU span (events around the call).

Floor: max(flops / peak, bytes / bandwidth), peak 60 TFLOP/s FP64 and 51 TFLOP/s FP32 (the
H200's measured DGEMM and SGEMM ceilings, anchors README), bandwidth 4.2 TB/s (its measured
device copy, bytes read + written); ``--measure-ceilings`` measures all three here instead.
flops: GEMM 2 m n k; TRSM m^2 n; POTRS 2 n^2 nrhs. Bytes, each operand read or written once:
GEMM A, B read, C read and written; TRSM A's lower triangle read, B read, X written; POTRS L's
lower triangle read once, B read, X written.

Check: each method's output on a sample of problems (--check random ones, plus the largest and
the smallest) against numpy/scipy in float64 on the same inputs: relative normwise error, worst
over the sample, NaN counted as infinite, failed above 20 eps(dtype) max(dimension). GEMM:
||C - C_ref||_F / (||A||_F ||B||_F + ||C||_F) (MAGMA testing_zgemm's, without its sqrt(k+2)
and 2, so stricter); TRSM, POTRS: ||X - X_ref||_F / ||X_ref||_F (their matrices have condition
numbers near 1).

Output: the tables on stdout; PREFIX.json (everything), PREFIX.txt (the tables), PREFIX.png (time
over floor per case; not with --no-plot). Exit status 1 when a check failed or a method raised.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import vbatch
from vbatch.ops.generate import sizes

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["vbatch", "bucket32", "grouped", "torch", "magma"]
ANCHORS = METHODS[1:]
DEFAULT_CASES = ["gemm-square32", "gemm-square128", "gemm-square512", "gemm-square1024",
                 "gemm-panel512", "trsm512", "potrs512-nrhs1", "potrs512-nrhs16"]
# Nominal ceilings of the H200 (anchors README: DGEMM 58.6-63.8, SGEMM 50.6-51.1 TFLOP/s, copy
# 4.2 TB/s read + written).
PEAK = {"float64": 60e12, "float32": 51e12}
BANDWIDTH = 4.2e12
BUCKET = 32
FLOOR = {"ms": "max(flops / peak, bytes / bandwidth) * 1e3",
         "flops": {"gemm": "2 m n k", "trsm": "m^2 n", "potrs": "2 n^2 nrhs"},
         "elements moved": {"gemm": "m k + k n + 2 m n (A, B read; C read and written)",
                            "trsm": "m (m + 1) / 2 + 2 m n (A's lower triangle; B read, X "
                                    "written)",
                            "potrs": "n (n + 1) / 2 + 2 n nrhs (L's lower triangle once; B "
                                     "read, X written)"}}
PANEL_K = 32
TOL_FACTOR = 20


# ----------------------------------------------------------------------------- cases and draws
@dataclass(frozen=True)
class Case:
    """One benchmark configuration: an operation, a shape rule, Nmax and the batch size k."""

    name: str
    op: str  # "gemm" | "trsm" | "potrs"
    shape: str  # gemm: "square" | "panel" | "panelmn"; else ""
    nmax: int
    k: int
    nrhs: int = 0  # potrs

    @property
    def operands(self) -> tuple[str, ...]:
        return {"gemm": ("a", "b", "c"), "trsm": ("a", "b"), "potrs": ("l", "b")}[self.op]

    @property
    def output(self) -> str:
        """The operand whose shape (and, for the in-place anchors, buffer) the result has."""
        return "c" if self.op == "gemm" else "b"


_CASE = re.compile(r"^(?:gemm-(square|panelmn|panel)(\d+)|trsm(\d+)|potrs(\d+)-nrhs(\d+))$")


def default_count(nmax: int) -> int:
    """The anchors' batch sizes: k = 2000, 500 from Nmax 1024 on."""
    return 500 if nmax >= 1024 else 2000


def parse_case(name: str, count: int | None = None) -> Case:
    """``gemm-square512``, ``gemm-panel512``, ``gemm-panelmn512``, ``trsm512``,
    ``potrs512-nrhs16``; ValueError naming the accepted forms otherwise."""
    mt = _CASE.match(name)
    if mt is None:
        raise ValueError(f"unknown case {name!r}: expected gemm-squareN, gemm-panelN, "
                         "gemm-panelmnN, trsmN or potrsN-nrhsR (N, R >= 1)")
    g = mt.groups()
    if g[0]:
        op, shape, nmax, nrhs = "gemm", g[0], int(g[1]), 0
    elif g[2]:
        op, shape, nmax, nrhs = "trsm", "", int(g[2]), 0
    else:
        op, shape, nmax, nrhs = "potrs", "", int(g[3]), int(g[4])
    if nmax < 1 or (op == "potrs" and nrhs < 1):
        raise ValueError(f"case {name!r}: Nmax and nrhs must be >= 1")
    k = default_count(nmax) if count is None else int(count)
    if k < 1:
        raise ValueError(f"batch count must be >= 1, got {k}")
    return Case(name=name, op=op, shape=shape, nmax=nmax, k=k, nrhs=nrhs)


def case_rng(seed: int, case: Case, stream: int = 0) -> np.random.Generator:
    """A generator per (seed, case name, stream): a case draws the same sizes (stream 0), data
    (1) and checked sample (2) whatever else runs."""
    return np.random.default_rng([seed, zlib.crc32(case.name.encode()), stream])


def draw(case: Case, seed: int) -> dict[str, np.ndarray]:
    """The sizes of every problem: gemm ``m, n, kk`` (C is m x n, the inner dimension kk),
    trsm ``m, n`` (A m x m, B m x n), potrs ``n, nrhs``."""
    rng = case_rng(seed, case)
    s = sizes("uniform", case.k, case.nmax, rng)
    if case.op == "gemm":
        if case.shape == "square":
            return {"m": s, "n": s.copy(), "kk": s.copy()}
        n = s.copy() if case.shape == "panel" else sizes("uniform", case.k, case.nmax, rng)
        return {"m": s, "n": n, "kk": np.full(case.k, PANEL_K, np.int64)}
    if case.op == "trsm":
        return {"m": s, "n": s.copy()}
    return {"n": s, "nrhs": np.full(case.k, case.nrhs, np.int64)}


def shapes(case: Case, d: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{operand: (rows, cols)}`` per problem."""
    if case.op == "gemm":
        return {"a": (d["m"], d["kk"]), "b": (d["kk"], d["n"]), "c": (d["m"], d["n"])}
    if case.op == "trsm":
        return {"a": (d["m"], d["m"]), "b": (d["m"], d["n"])}
    return {"l": (d["n"], d["n"]), "b": (d["n"], d["nrhs"])}


def dims(case: Case, d: dict) -> np.ndarray:
    """(k, ndim) problem dimensions in the order the padded anchors use: gemm (m, kk, n), trsm
    (m, n), potrs (n, nrhs)."""
    cols = {"gemm": ("m", "kk", "n"), "trsm": ("m", "n"), "potrs": ("n", "nrhs")}[case.op]
    return np.stack([np.asarray(d[c], np.int64) for c in cols], axis=1)


def main_size(case: Case, d: dict) -> np.ndarray:
    return d["n"] if case.op == "potrs" else d["m"]


def work(case: Case, d: dict, itemsize: int) -> tuple[float, float]:
    """(flops, bytes) of the whole batch; see the module docstring."""
    f = {k: np.asarray(v, np.float64) for k, v in d.items()}
    if case.op == "gemm":
        m, n, kk = f["m"], f["n"], f["kk"]
        flops = 2 * m * n * kk
        elems = m * kk + kk * n + 2 * m * n
    elif case.op == "trsm":
        m, n = f["m"], f["n"]
        flops = m * m * n
        elems = m * (m + 1) / 2 + 2 * m * n
    else:
        n, r = f["n"], f["nrhs"]
        flops = 2 * n * n * r
        elems = n * (n + 1) / 2 + 2 * n * r
    return float(flops.sum()), float(elems.sum()) * itemsize


def floor_ms(flops: float, nbytes: float, peak: float, bw: float) -> tuple[float, str]:
    """(ms, "flops" or "memory"): the larger of the two times, and which one it is."""
    tf, tb = flops / peak, nbytes / bw
    return max(tf, tb) * 1e3, ("flops" if tf >= tb else "memory")


def tolerance(case: Case, d: dict, dtype) -> float:
    """What a relative normwise error may reach: 20 eps max(dimension)."""
    return TOL_FACTOR * float(np.finfo(np.dtype(dtype)).eps) * max(int(dims(case, d).max()), 1)


# ----------------------------------------------------------------------------- inputs
def to_host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def dev_ptr(a) -> int:
    """The address of a contiguous array's first element (cupy: device, numpy: host)."""
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError("dev_ptr needs a contiguous array")
    return int(a.data.ptr) if hasattr(a.data, "ptr") else int(a.ctypes.data)


def uniform(xp, size: int, dtype, seed: int):
    """``size`` numbers uniform on [-1, 1] of ``dtype``, made where ``xp`` lives."""
    if xp is np:
        return np.random.default_rng(seed).uniform(-1.0, 1.0, size).astype(dtype)
    out = xp.random.RandomState(seed).uniform(-1.0, 1.0, size=size, dtype=dtype)
    return out.astype(dtype, copy=False)


def packed(xp, rows, cols, dtype, seed: int) -> vbatch.PackedBatch:
    """A column-major packed batch, tight, random entries."""
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    total = int((np.maximum(rows, 1) * cols).sum())
    return vbatch.PackedBatch.from_buffer(uniform(xp, total, dtype, seed), cols, m=rows,
                                          order="F")


def diag_index(batch: vbatch.PackedBatch) -> tuple[np.ndarray, np.ndarray]:
    """(buffer index of every diagonal element, its problem), square column-major batch."""
    n = np.asarray(batch.n, np.int64)
    prob = np.repeat(np.arange(len(n)), n)
    start = np.cumsum(n) - n
    j = np.arange(int(n.sum())) - np.repeat(start, n)
    return batch.offset[prob] + j * (batch.ld[prob] + 1), prob


def make_inputs(case: Case, d: dict, dtype, xp, seed: int) -> dict[str, vbatch.PackedBatch]:
    """Every operand as a packed batch where ``xp`` lives (see the module docstring)."""
    ins = {}
    for j, (name, (r, c)) in enumerate(shapes(case, d).items()):
        ins[name] = packed(xp, r, c, dtype, seed + 1000 * j)
    tri = ins.get("a") if case.op == "trsm" else ins.get("l")
    if tri is not None:
        idx, prob = diag_index(tri)
        tri.data[xp.asarray(idx)] = xp.asarray(tri.n[prob].astype(dtype))
    if case.op == "potrs":  # L := chol((A + A^T) / 2 + n I), per problem, in place
        batch = ins["l"]
        for i in range(batch.k):
            n = int(batch.n[i])
            a = batch.matrix(i)
            s = (a + a.T) * 0.5
            s[xp.arange(n), xp.arange(n)] = n
            a[...] = xp.linalg.cholesky(s)
    return ins


def pick_sample(case: Case, d: dict, count: int, rng: np.random.Generator) -> list[int]:
    """``count`` random problems, the largest and the smallest, sorted."""
    s = main_size(case, d)
    pick = rng.choice(len(s), size=min(count, len(s)), replace=False).tolist()
    return sorted(set(pick) | {int(np.argmax(s)), int(np.argmin(s))})


def reference(case: Case, mats: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """One problem's result in float64 from its inputs (numpy/scipy), and the norm its error is
    measured against: GEMM ||A||_F ||B||_F + ||C||_F (MAGMA's testing_zgemm divides by
    sqrt(k+2) ||A|| ||B|| + 2 ||C||: a result near 0 by cancellation must not fail a correct
    float32 GEMM), TRSM and POTRS ||X_ref||_F (their matrices are well conditioned, so this
    forward error is small for a correct solve)."""
    import scipy.linalg as sla

    f = {k: np.asarray(v, np.float64) for k, v in mats.items()}
    if case.op == "gemm":
        ref = f["a"] @ f["b"] + f["c"]
        nrm = np.linalg.norm
        return ref, float(nrm(f["a"]) * nrm(f["b"]) + nrm(f["c"]))
    tri = f["a"] if case.op == "trsm" else f["l"]
    if tri.shape[0] == 0:
        ref = f["b"].copy()
    elif case.op == "trsm":
        ref = sla.solve_triangular(tri, f["b"], lower=True)
    else:
        ref = sla.cho_solve((np.tril(tri), True), f["b"])
    return ref, float(np.linalg.norm(ref))


def rel_err(x, ref: np.ndarray, scale: float | None = None) -> float:
    """||x - ref||_F / scale (default ||ref||_F) in float64; NaN or a wrong shape is
    infinite."""
    x = np.asarray(x, np.float64)
    if x.shape != ref.shape:
        return math.inf
    nr = float(np.linalg.norm(ref)) if scale is None else scale
    e = float(np.linalg.norm(x - ref))
    e = e / nr if nr > 0 else e
    return e if np.isfinite(e) else math.inf


def worst_err(get: Callable[[int], Any], refs: dict[int, tuple[np.ndarray, float]]) -> float:
    return max((rel_err(to_host(get(i)), r, sc) for i, (r, sc) in refs.items()), default=0.0)


# ----------------------------------------------------------------------------- padding
@dataclass
class Stack:
    """``cnt`` matrices of ``rows x cols`` padded: ``store`` is a C-contiguous (cnt, cols, rows)
    array, so matrix j is column-major at ``store[j]`` with ld = rows; ``view`` is the logical
    (cnt, rows, cols) view of it."""

    store: Any
    rows: int
    cols: int

    @property
    def view(self):
        return self.store.transpose(0, 2, 1)

    @property
    def stride(self) -> int:
        return self.rows * self.cols


def pad_stack(batch: vbatch.PackedBatch, idx, rows: int, cols: int, xp,
              eye: bool = False) -> Stack:
    """Problems ``idx`` of ``batch`` zero-padded to rows x cols (``eye``: ones on the padded
    part of the diagonal, so a padded triangle stays invertible)."""
    idx = np.asarray(idx, np.int64)
    st = Stack(xp.zeros((len(idx), cols, rows), dtype=batch.dtype), rows, cols)
    v = st.view
    for j, i in enumerate(idx.tolist()):
        r, c = int(batch.m[i]), int(batch.n[i])
        if r and c:
            v[j, :r, :c] = batch.matrix(i)
    if eye and len(idx):
        d = min(rows, cols)
        pad = np.arange(d)[None, :] >= np.asarray(batch.m[idx])[:, None]
        ar = xp.arange(d)
        v[:, ar, ar] += xp.asarray(pad.astype(batch.dtype))
    return st


def buckets(dm: np.ndarray, width: int = BUCKET) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Problems grouped by their dimensions rounded up to ``width`` (per column; a column that
    is the same for every problem is kept exact), as ``[(padded dims, problem indices)]``
    sorted by dims. Every problem is in exactly one bucket."""
    dm = np.asarray(dm, np.int64)
    if dm.size == 0:
        return []
    fixed = np.all(dm == dm[:1], axis=0)
    padded = np.where(fixed[None, :], dm, -(-np.maximum(dm, 1) // width) * width)
    keys, inv = np.unique(padded, axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    return [(tuple(int(x) for x in key), np.flatnonzero(inv == g)) for g, key in enumerate(keys)]


def pointer_array(xp, st: Stack):
    """A device array of the ``cnt`` matrix pointers of a stack."""
    isz = np.dtype(st.store.dtype).itemsize
    cnt = st.store.shape[0]
    # uint64 throughout: numpy 1.x would turn int + uint64 into float64
    ptrs = np.uint64(dev_ptr(st.store)) + np.arange(cnt, dtype=np.uint64) * np.uint64(
        st.stride * isz)
    return xp.asarray(ptrs.astype(np.uint64))


def packed_pointers(xp, batch: vbatch.PackedBatch):
    """A device array of the pointers of every matrix of a packed batch."""
    isz = batch.dtype.itemsize
    ptrs = np.uint64(dev_ptr(batch.data)) + batch.offset.astype(np.uint64) * np.uint64(isz)
    return xp.asarray(ptrs.astype(np.uint64))


def copy_batch(batch: vbatch.PackedBatch, xp) -> vbatch.PackedBatch:
    return vbatch.PackedBatch.from_buffer(xp.array(batch.data, copy=True), batch.n,
                                          batch.offset, batch.ld, order=batch.order, m=batch.m)


# ----------------------------------------------------------------------------- methods
@dataclass
class Ctx:
    """What a method needs for one case: the inputs, where they live, the libraries."""

    case: Case
    d: dict
    dtype: np.dtype
    ins: dict
    xp: Any
    rt: Any = None
    blas: Any = None  # benchmarks/cublas.py Cublas (or a stand-in with the same methods)
    torch: Any = None
    magma: Any = None


@dataclass
class Runner:
    """``call()`` is what is timed; ``before()`` (untimed) restores an in-place output;
    ``get(out, i)`` is problem i of the result ``call()`` returned."""

    call: Callable[[], Any]
    get: Callable[[Any, int], Any]
    before: Callable[[], None] | None = None
    submit: Callable[[], Any] | None = None  # vbatch: the call without result()
    keep: Any = None  # what the call's pointers point into


def prep_vbatch(ctx: Ctx) -> Runner:
    rt, ins, op = ctx.rt, ctx.ins, ctx.case.op
    if op == "gemm":
        def submit():
            return rt.gemm(ins["a"], ins["b"], ins["c"], beta=1.0)
    elif op == "trsm":
        def submit():
            return rt.trsm(ins["a"], ins["b"])
    else:
        def submit():
            return rt.potrs(ins["l"], ins["b"])
    return Runner(call=lambda: submit().result(), get=lambda out, i: out.matrix(i),
                  submit=submit)


def _restore(pairs) -> Callable[[], None]:
    def before():
        for dst, src in pairs:
            dst[...] = src
    return before


def prep_bucket32(ctx: Ctx) -> Runner:
    case, ins, xp, blas, dt = ctx.case, ctx.ins, ctx.xp, ctx.blas, ctx.dtype.name
    calls: list[Callable[[], None]] = []
    outs: list[Stack] = []
    saved = []
    where: dict[int, tuple[int, int]] = {}
    keep: list = []
    for g, (key, idx) in enumerate(buckets(dims(case, ctx.d))):
        for j, i in enumerate(idx.tolist()):
            where[i] = (g, j)
        cnt = len(idx)
        if case.op == "gemm":
            mm, kk, nn = key
            a = pad_stack(ins["a"], idx, mm, kk, xp)
            b = pad_stack(ins["b"], idx, kk, nn, xp)
            c = pad_stack(ins["c"], idx, mm, nn, xp)
            keep += [a, b]
            calls.append(functools.partial(
                blas.gemm_strided_batched, dt, mm, nn, kk, 1.0, dev_ptr(a.store), mm, a.stride,
                dev_ptr(b.store), kk, b.stride, 1.0, dev_ptr(c.store), mm, c.stride, cnt))
            out = c
        else:
            tri_name = "a" if case.op == "trsm" else "l"
            mm, nn = key
            t = pad_stack(ins[tri_name], idx, mm, mm, xp, eye=True)
            x = pad_stack(ins["b"], idx, mm, nn, xp)
            tp, xptr = pointer_array(xp, t), pointer_array(xp, x)
            keep += [t, tp, xptr]
            trans = [0] if case.op == "trsm" else [0, 1]  # OP_N; potrs: L then L^T
            for tr in trans:  # side left (0), lower (0), non-unit diagonal (0)
                calls.append(functools.partial(blas.trsm_batched, dt, 0, 0, tr, 0, mm, nn, 1.0,
                                               dev_ptr(tp), mm, dev_ptr(xptr), mm, cnt))
            out = x
        outs.append(out)
        saved.append((out.store, out.store.copy()))

    def call():
        for f in calls:
            f()
        return outs

    def get(res, i):
        g, j = where[i]
        r, c = (int(v[i]) for v in shapes(case, ctx.d)[case.output])
        return res[g].view[j, :r, :c]

    return Runner(call=call, get=get, before=_restore(saved), keep=keep)


def prep_grouped(ctx: Ctx) -> Runner:
    cublas = load_sibling("cublas")
    ins, xp, d = ctx.ins, ctx.xp, ctx.d
    a, b, c0 = ins["a"], ins["b"], ins["c"]
    c = copy_batch(c0, xp)
    pa, pb, pc = (packed_pointers(xp, x) for x in (a, b, c))
    k = ctx.case.k
    call = cublas.GroupedCall(
        dtype=ctx.dtype.name, m=d["m"], n=d["n"], k=d["kk"], lda=a.ld, ldb=b.ld, ldc=c.ld,
        alpha=1.0, beta=1.0, group_size=np.ones(k, np.int32), a_ptrs=dev_ptr(pa),
        b_ptrs=dev_ptr(pb), c_ptrs=dev_ptr(pc), keep=(a, b, c, pa, pb, pc))
    blas = ctx.blas

    def run():
        blas.gemm_grouped(call)
        return c

    return Runner(call=run, get=lambda out, i: out.matrix(i),
                  before=_restore([(c.data, c0.data)]))


def prep_torch(ctx: Ctx) -> Runner:
    torch, case, xp = ctx.torch, ctx.case, ctx.xp
    idx = np.arange(case.k)
    sh = shapes(case, ctx.d)
    big = {name: (int(r.max()), int(c.max())) for name, (r, c) in sh.items()}
    eye = "a" if case.op == "trsm" else "l"
    st = {name: pad_stack(ctx.ins[name], idx, *big[name], xp, eye=(name == eye))
          for name in case.operands}
    t = {name: torch.from_dlpack(s.view) for name, s in st.items()}
    if case.op == "gemm":
        def call():
            return torch.baddbmm(t["c"], t["a"], t["b"])
    elif case.op == "trsm":
        def call():
            return torch.linalg.solve_triangular(t["a"], t["b"], upper=False)
    else:
        def call():
            return torch.cholesky_solve(t["b"], t["l"], upper=False)

    def get(out, i):
        r, c = (int(v[i]) for v in sh[case.output])
        return out[i, :r, :c].cpu().numpy()

    return Runner(call=call, get=get, keep=(st, t))


def prep_magma(ctx: Ctx) -> Runner:
    mg, case, ins, xp = ctx.magma, ctx.case, ctx.ins, ctx.xp
    out = copy_batch(ins[case.output], xp)
    if case.op == "gemm":
        calls = [mg.prepare_gemm(ins["a"], ins["b"], out, alpha=1.0, beta=1.0)]
        fns = [mg.gemm_vbatched]
    elif case.op == "trsm":
        calls = [mg.prepare_trsm(ins["a"], out, side="L", uplo="L", trans="N", diag="N")]
        fns = [mg.trsm_vbatched]
    else:  # L Y = B, then L^T X = Y
        calls = [mg.prepare_trsm(ins["l"], out, side="L", uplo="L", trans=t, diag="N")
                 for t in ("N", "T")]
        fns = [mg.trsm_vbatched] * 2

    def call():
        for f, c in zip(fns, calls):
            f(c)
        return out

    return Runner(call=call, get=lambda o, i: o.matrix(i),
                  before=_restore([(out.data, ins[case.output].data)]), keep=calls)


PREPARE = {"vbatch": prep_vbatch, "bucket32": prep_bucket32, "grouped": prep_grouped,
           "torch": prep_torch, "magma": prep_magma}


def applies(method: str, case: Case, magma=None, dtype=None) -> str | None:
    """None when ``method`` can run ``case``, else why not (a per-case skip)."""
    if method == "grouped" and case.op != "gemm":
        return "GEMM only"
    if method == "magma" and magma is not None and dtype is not None:
        op = "gemm" if case.op == "gemm" else "trsm"
        if not magma.has(op, dtype):
            return f"{magma.path} lacks {magma.routine_name(op, dtype)}"
    return None


# ----------------------------------------------------------------------------- timing
# A repeated vbatch call replays its first run's decisions from the second call on, captures
# the plan's CUDA graph on its second call and, for plans of a few launches, a graph per
# pointer table seen twice (kernels/cuda.py: a repeated call alternates two output buffers), so
# its fourth call is the first in the steady state (as in cuda_potrf.py). With one warm-up the
# median of 5 reps caught the captures: gemm-square32 0.121 ms against ~0.045 in the steady
# state (H200, 2026-11-25).
WARMUP = 4


def timed(fn, reps: int, sync: Callable[[], None], before=None) -> tuple[float, Any]:
    """Median wall-clock ms of fn() + sync(), after WARMUP warm-up calls; ``before``
    (untimed) runs and is synchronized ahead of every call, the warm-ups too."""
    for _ in range(WARMUP):
        if before is not None:
            before()
            sync()
        out = fn()
        sync()
    ts = []
    for _ in range(reps):
        if before is not None:
            before()
            sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts)), out


def vbatch_split(submit, reps: int, sync) -> dict:
    """vbatch's host time (issuing the call, plus result() once the GPU is done) and GPU span
    (events around the call), medians; {} where the future has no CUDA event. Warmed up like
    the timed calls, and at least 25 calls: this loop keeps its last future alive, so it sees
    new output buffers, whose first calls capture graphs (cuda_potrf.py says more)."""
    import cupy

    hosts, spans = [], []
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for it in range(WARMUP + max(reps, 25)):
        sync()
        t0 = time.perf_counter()
        start.record()
        fut = submit()
        stop.record()
        t1 = time.perf_counter()
        comp = fut.completion()
        ev = getattr(comp, "event", None)
        if ev is None:
            fut.result()
            return {}
        ev.synchronize()
        t2 = time.perf_counter()
        fut.result()
        t3 = time.perf_counter()
        if it >= WARMUP:
            hosts.append((t1 - t0 + t3 - t2) * 1e3)
            spans.append(cupy.cuda.get_elapsed_time(start, stop))
    return {"host_ms": float(np.median(hosts)), "gpu_ms": float(np.median(spans))}


def ceilings(xp) -> dict:
    """Device copy bandwidth (bytes read + written) and GEMM peaks, measured here."""
    sync = xp.cuda.runtime.deviceSynchronize
    a = xp.ones(1024**3 // 8, dtype=np.float64)
    b = xp.empty_like(a)
    ms, _ = timed(lambda: xp.copyto(b, a), 5, sync)
    out = {"bw": 2 * a.nbytes / (ms * 1e-3), "peak": {}}
    for dt in ("float64", "float32"):
        n = 8192
        x = xp.random.standard_normal((n, n)).astype(dt)
        ms, _ = timed(lambda x=x: x @ x, 5, sync)
        out["peak"][dt] = 2 * n**3 / (ms * 1e-3)
    return out


# ----------------------------------------------------------------------------- one case
def free_memory(xp, torch=None) -> None:
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_case(case: Case, dtype, methods: list[str], env: dict, args) -> dict:
    """Every method on one case and dtype. ``env``: xp, sync, rt, blas, torch, magma, skip
    (method -> reason, for the whole run), ceil."""
    xp, sync = env["xp"], env["sync"]
    dtype = np.dtype(dtype)
    d = draw(case, args.seed)
    flops, nbytes = work(case, d, dtype.itemsize)
    ceil = env["ceil"]
    fl, bound = floor_ms(flops, nbytes, ceil["peak"][dtype.name], ceil["bw"])
    res = {"case": case.name, "op": case.op, "shape": case.shape, "nmax": case.nmax,
           "k": case.k, "nrhs": case.nrhs, "dtype": dtype.name, "gflop": flops / 1e9,
           "gbyte": nbytes / 1e9, "floor_ms": fl, "floor_bound": bound,
           "sizes": {name: {"mean": float(np.mean(v)), "max": int(np.max(v)),
                            "min": int(np.min(v))} for name, v in d.items()},
           "tol": tolerance(case, d, dtype), "ms": {}, "err": {}, "ok": {}, "x_vbatch": {},
           "skipped": {}, "errors": {}}
    ins = make_inputs(case, d, dtype, xp, int(case_rng(args.seed, case, 1).integers(2**31)))
    sample = pick_sample(case, d, args.check, case_rng(args.seed, case, 2))
    refs = {i: reference(case, {n: to_host(ins[n].matrix(i)) for n in case.operands})
            for i in sample}
    res["sample"] = sample
    ctx = Ctx(case=case, d=d, dtype=dtype, ins=ins, xp=xp, rt=env.get("rt"),
              blas=env.get("blas"), torch=env.get("torch"), magma=env.get("magma"))
    for m in methods:
        why = env["skip"].get(m) or applies(m, case, env.get("magma"), dtype)
        if why:
            res["skipped"][m] = why
            continue
        runner = out = None
        try:
            runner = PREPARE[m](ctx)
            sync()
            ms, out = timed(runner.call, args.reps, sync, runner.before)
            res["ms"][m] = ms
            err = worst_err(lambda i, r=runner, o=out: r.get(o, i), refs)
            res["err"][m] = err
            res["ok"][m] = bool(err <= res["tol"])
            if m == "vbatch" and xp is not np and runner.submit is not None:
                res.update(vbatch_split(runner.submit, args.reps, sync))
        except Exception as exc:  # noqa: BLE001 - one method's failure must not end the run
            if args.strict:
                raise
            res["errors"][m] = f"{type(exc).__name__}: {exc}"
        finally:
            del runner, out
            free_memory(xp, env.get("torch"))
    if "vbatch" in res["ms"]:
        v = res["ms"]["vbatch"]
        res["x_vbatch"] = {m: t / v for m, t in res["ms"].items() if m != "vbatch"}
    del ins, ctx
    free_memory(xp, env.get("torch"))
    return res


# ----------------------------------------------------------------------------- output
def _shown(results: list[dict]) -> list[str]:
    return [m for m in METHODS if any(m in r["ms"] or m in r["errors"] for r in results)]


def _fmt(x: float) -> str:
    return f"{x:.4g}" if x >= 1e-3 else f"{x:.2e}"


def table(results: list[dict]) -> str:
    """Times (ms) with each anchor's ratio to vbatch (anchor / vbatch: above 1, vbatch is
    faster), vbatch over the floor; then the errors table; then what was skipped or failed."""
    cols = _shown(results)
    w = 18
    head = (f"{'case':<20}{'dtype':<8}{'k':>5} {'floor ms':>14} "
            + "".join(f"{m:>{w}}" for m in cols) + f" {'vbatch/floor':>12}")
    lines = ["time, ms (anchor / vbatch)", head, "-" * len(head)]
    for r in results:
        cells = []
        for m in cols:
            if m in r["ms"]:
                s = _fmt(r["ms"][m])
                if m in r["x_vbatch"]:
                    s += f" ({r['x_vbatch'][m]:.2f}x)"
            elif m in r["errors"]:
                s = "error"
            else:
                s = "-"
            cells.append(f"{s:>{w}}")
        fl = f"{_fmt(r['floor_ms'])} {'F' if r['floor_bound'] == 'flops' else 'M'}"
        vf = (f"{r['ms']['vbatch'] / r['floor_ms']:12.1f}" if "vbatch" in r["ms"]
              else f"{'-':>12}")
        lines.append(f"{r['case']:<20}{r['dtype']:<8}{r['k']:>5} {fl:>14} " + "".join(cells)
                     + f" {vf}")
    lines.append("floor: F = flop-bound (flops / peak), M = memory-bound (bytes / bandwidth)")
    head = f"{'case':<20}{'dtype':<8}{'tol':>9} " + "".join(f"{m:>{w}}" for m in cols)
    lines += ["", "relative normwise error vs numpy, worst over the sample", head,
              "-" * len(head)]
    bad = 0
    for r in results:
        cells = []
        for m in cols:
            if m in r["err"]:
                s = f"{r['err'][m]:.1e}"
                if not r["ok"][m]:
                    s, bad = "FAIL " + s, bad + 1
            else:
                s = "-"
            cells.append(f"{s:>{w}}")
        lines.append(f"{r['case']:<20}{r['dtype']:<8}{r['tol']:9.1e} " + "".join(cells))
    notes = []
    for r in results:
        for m, why in r["errors"].items():
            notes.append(f"  {r['case']} {r['dtype']} {m}: ERROR {why}")
    seen = set()
    for r in results:
        for m, why in r["skipped"].items():
            if (m, why) not in seen:
                seen.add((m, why))
                notes.append(f"  {m}: skipped ({why})")
    if notes:
        lines += ["", "not measured:"] + notes
    lines.append("" if not bad else f"\n{bad} check(s) FAILED")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> str | None:
    """Time over floor per case and method (log scale); returns why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib is not installed ({exc})"
    cols = [m for m in _shown(results) if any(m in r["ms"] for r in results)]
    labels = [f"{r['case']}\n{r['dtype']}" for r in results]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(results)), 4.5))
    width = 0.8 / max(1, len(cols))
    for j, m in enumerate(cols):
        y = [r["ms"][m] / r["floor_ms"] if m in r["ms"] else math.nan for r in results]
        ax.bar(np.arange(len(results)) + (j - (len(cols) - 1) / 2) * width, y, width, label=m)
    ax.axhline(1.0, color="k", ls="--", lw=1, label="floor")
    ax.set_yscale("log")
    ax.set_ylabel("time / floor")
    ax.set_xticks(np.arange(len(results)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ----------------------------------------------------------------------------- setup
def load_sibling(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is no package)."""
    key = f"vbatch_bench_{name}"
    mod = sys.modules.get(key)
    if mod is None:
        spec = importlib.util.spec_from_file_location(key, os.path.join(HERE, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod  # before running it: dataclasses look their module up there
        spec.loader.exec_module(mod)
    return mod


def git_commit() -> str | None:
    """The commit measured: $VBATCH_COMMIT when set (the device machine gets a copy of the
    working tree whose .git may lag behind it), else git's HEAD."""
    if os.environ.get("VBATCH_COMMIT"):
        return os.environ["VBATCH_COMMIT"]
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, metavar="CASE",
                    help="gemm-squareN, gemm-panelN, gemm-panelmnN, trsmN, potrsN-nrhsR "
                         f"(default: {' '.join(DEFAULT_CASES)})")
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS,
                    help="what to time (default all; grouped is GEMM only; magma needs --magma)")
    ap.add_argument("--dtype", nargs="+", default=["float64"], choices=["float64", "float32"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--count", type=int, default=None,
                    help="problems per case (default 2000, 500 from Nmax 1024)")
    ap.add_argument("--check", type=int, default=8,
                    help="random problems checked per case (plus the largest and smallest)")
    ap.add_argument("--magma", default=os.environ.get("VBATCH_MAGMA") or None, metavar="PATH",
                    help="libmagma_vb.so (default $VBATCH_MAGMA): adds the magma method")
    ap.add_argument("--out", default="bench-out/blas", metavar="PREFIX",
                    help="writes PREFIX.json, PREFIX.txt and PREFIX.png")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--measure-ceilings", action="store_true",
                    help="floors from bandwidth and GEMM peaks measured in this run")
    ap.add_argument("--strict", action="store_true",
                    help="a method that raises ends the run (default: recorded, run goes on)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.check < 0:
        ap.error("--check must be >= 0")
    try:
        args.case_list = [parse_case(c, args.count) for c in dict.fromkeys(args.cases)]
    except ValueError as exc:
        ap.error(str(exc))
    args.methods = list(dict.fromkeys(args.methods))
    return args


def setup(args) -> tuple[dict, dict]:
    """(env, meta): the device, vbatch's runtime and every anchor's library, each one that
    cannot be had recorded in env["skip"] with its reason."""
    import cupy

    env: dict = {"xp": cupy, "sync": cupy.cuda.runtime.deviceSynchronize, "skip": {}}
    meta: dict = {}
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    meta.update(device=name, cc=f"{props['major']}.{props['minor']}", cupy=cupy.__version__,
                cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                driver=cupy.cuda.runtime.driverGetVersion(), vbatch_commit=git_commit())
    methods = args.methods
    skip = env["skip"]

    if args.measure_ceilings:
        env["ceil"] = ceilings(cupy)
        meta["ceilings"] = {"measured": True, **env["ceil"]}
    else:
        env["ceil"] = {"bw": BANDWIDTH, "peak": dict(PEAK)}
        meta["ceilings"] = {"measured": False, **env["ceil"]}

    if "vbatch" in methods:
        try:
            env["rt"] = vbatch.Runtime("cuda")
        except Exception as exc:  # noqa: BLE001 - reported as the reason vbatch is skipped
            skip["vbatch"] = f"Runtime('cuda') failed: {type(exc).__name__}: {exc}"

    # cuBLAS: CuPy's handle first, so that its library is the one mapped and found.
    if {"bucket32", "grouped"} & set(methods):
        cupy.cuda.device.get_cublas_handle()
        cublas = load_sibling("cublas")
        try:
            path, how = cublas.find_libcublas()
            env["blas"] = cublas.Cublas(path, cupy.cuda.get_current_stream().ptr)
            meta["cublas"] = {"path": path, "found": how,
                              "version": env["blas"].version_string()}
            why = env["blas"].grouped_status()
            if why:
                skip["grouped"] = why
        except (OSError, cublas.CublasError) as exc:
            skip["bucket32"] = skip["grouped"] = f"no usable libcublas: {exc}"

    if "torch" in methods:
        try:
            import torch

            if not torch.cuda.is_available():
                skip["torch"] = f"torch {torch.__version__} sees no CUDA device"
            else:
                env["torch"] = torch
                meta["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                                 "allow_tf32": torch.backends.cuda.matmul.allow_tf32}
        except ImportError as exc:
            skip["torch"] = f"torch does not import ({exc})"

    if "magma" in methods:
        if not args.magma:
            skip["magma"] = "no --magma PATH (nor $VBATCH_MAGMA)"
        else:
            try:
                mg = load_sibling("magma").Magma(args.magma)
                env["magma"] = mg
                meta["magma"] = {"lib": os.path.abspath(args.magma), "version": mg.version(),
                                 "potrs": "two magmablas_Xtrsm_vbatched_max_nocheck calls "
                                          "(MAGMA has no potrs_vbatched)"}
                for key, fname in (("commit", "MAGMA_COMMIT"), ("describe", "MAGMA_DESCRIBE")):
                    src = os.path.join(os.path.dirname(os.path.abspath(args.magma)), "..",
                                       "src", fname)
                    if os.path.exists(src):
                        with open(src) as f:
                            meta["magma"][key] = f.read().strip()
            except (OSError, RuntimeError, AttributeError) as exc:
                skip["magma"] = f"{args.magma} did not load: {type(exc).__name__}: {exc}"
    for m, why in skip.items():
        if m in methods:
            print(f"skipping {m}: {why}", flush=True)
    return env, meta


def close(env: dict) -> None:
    if env.get("blas") is not None:
        env["blas"].close()
    if env.get("magma") is not None:
        env["magma"].close()


def write(prefix: str, meta: dict, results: list[dict], text: str, no_plot: bool) -> list[str]:
    """PREFIX.json, PREFIX.txt and (unless no_plot) PREFIX.png; returns what was written. A
    PREFIX that names a folder (ends in / or exists as one) gets ``blas`` appended."""
    if prefix.endswith(os.sep) or os.path.isdir(prefix):
        prefix = os.path.join(prefix, "blas")
    d = os.path.dirname(prefix)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(prefix + ".txt", "w") as f:
        f.write(text + "\n")
    written = [prefix + ".json", prefix + ".txt"]
    if not no_plot:
        why = plot(results, prefix + ".png")
        if why:
            print(f"no plot: {why}")
        else:
            written.append(prefix + ".png")
    return written


def main(argv=None) -> int:
    from vbatch.runtime.device import cuda_status

    args = parse_args(argv)
    usable, why = cuda_status()
    if not usable:
        print(f"cuda_blas.py needs a GPU: {why}", file=sys.stderr)
        return 2
    t0 = time.time()
    env, meta = setup(args)
    peak = env["ceil"]["peak"]
    print(f"{meta['device']}: floors from {env['ceil']['bw'] / 1e12:.2f} TB/s, "
          f"{peak['float64'] / 1e12:.1f} TFLOP/s FP64, {peak['float32'] / 1e12:.1f} FP32 "
          f"({'measured' if args.measure_ceilings else 'nominal'})", flush=True)
    results = []
    try:
        for dt in args.dtype:
            for case in args.case_list:
                r = run_case(case, dt, args.methods, env, args)
                results.append(r)
                parts = [f"{m} {ms:.4g}" for m, ms in r["ms"].items()]
                if "host_ms" in r:
                    parts[0] += f" (host {r['host_ms']:.3g}, gpu {r['gpu_ms']:.3g})"
                bad = [m for m, ok in r["ok"].items() if not ok]
                print(f"  {case.name} {dt}: " + ", ".join(parts) + " ms"
                      + (f"  CHECK FAILED: {bad}" if bad else "")
                      + (f"  ERRORS: {sorted(r['errors'])}" if r["errors"] else ""),
                      flush=True)
    finally:
        close(env)
    text = table(results)
    print(text)
    meta.update(args={k: v for k, v in vars(args).items() if k != "case_list"},
                methods=args.methods, floor=FLOOR,
                elapsed_s=time.time() - t0, date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    written = write(args.out, meta, results, text, args.no_plot)
    print("wrote " + ", ".join(written))
    failed = sum(not ok for r in results for ok in r["ok"].values())
    errors = sum(len(r["errors"]) for r in results)
    if failed or errors:
        print(f"exit 1: {failed} failed check(s), {errors} method error(s)")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
