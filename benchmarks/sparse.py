"""vbatch.sparse against cuDSS, CHOLMOD and scipy's SuperLU, side by side in one process.

    python benchmarks/sparse.py [--cases ...] [--reps 5] [--cudss LIB] [--device cuda]
                                      [--matrices DIR] [--out FILE]

CHOLMOD (SuiteSparse's supernodal Cholesky, on the host, through scikit-sparse) is timed where
``sksparse`` imports: scikit-sparse has no binary wheels; 0.4.16 builds against SuiteSparse 5
(0.5 needs 7), and ``auditwheel repair`` makes a wheel that carries its libraries (to a machine
without SuiteSparse, as the GPU machine is), its BLAS whatever they were linked to (OpenBLAS
in the runs of docs/performance.md). Set ``OPENBLAS_NUM_THREADS`` (1: one core, as splu): left at
every core beside the runtime's own threads, its times were 0.6-38x the one-core ones (H200 host,
2026-11-26, docs/performance.md).

Cases (../shared/anchors/cudss/README.md's): the shared real matrices (``--matrices`` or
$VBATCH_MATRICES), ``lap2-N`` (the 2-D Laplacian on an N x N grid), ``lap3-N`` (3-D, N^3), and
``batch`` (1000 2-D Laplacians with sides uniform in [8, 40], seed 2026, one call).

Per case and method, medians over ``--reps`` in ms: analysis (once: ordering and symbolic; numba's
start-up, once a process, is paid before the first case),
factor (the numeric factorization of values already on the device: vbatch's scatter into the
fronts and its one submission; cuDSS's FACTORIZATION phase), solve (one right-hand side on the
device, in and out; for ``batch``, stacked in one array, and ``solve_list`` one array a
matrix). ``levels``: the same factorization level by level (:func:`level_baseline`),
the baseline that the scheduler's one graph replaces. vbatch's ``refactor`` (the user's call:
the new matrix checked on the host and its values sent) is reported beside its factor. Every
method's residual is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))


def case(name: str, folder: str):
    from vbatch.sparse import laplacian as lap

    if name == "batch":
        rng = np.random.default_rng(2026)
        return [lap(int(s), 2) for s in rng.integers(8, 41, 1000)]
    if name.startswith("lap2-"):
        return lap(int(name[5:]), 2)
    if name.startswith("lap3-"):
        return lap(int(name[5:]), 3)
    from vbatch.sparse import read

    return read(os.path.join(folder, name))


def median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


def _host(x):
    return x.get() if hasattr(x, "get") else x


def bench_vbatch(A, rt, reps: int, relax: int) -> dict:
    import vbatch.sparse as vs

    if rt.backend.kind == "cupy":
        import cupy as xp

        def sync():
            xp.cuda.runtime.deviceSynchronize()
    else:
        xp = np

        def sync():
            pass

    mats = A if isinstance(A, list) else [A]
    t = time.perf_counter()
    F = vs.cholesky(A, runtime=rt, relax_width=relax)
    first = time.perf_counter() - t
    vals = xp.asarray(np.concatenate(F._values))

    def factor():
        F._factor(vals)
        sync()

    factor()  # the plan and graph are built on the first call
    out = {"analysis": 1e3 * F.stats.analysis_s, "first_call": 1e3 * first,
           "factor": median_ms(factor, reps),
           "refactor": median_ms(lambda: F.refactor(A), reps),
           "fronts": F.stats.fronts, "nnz_l": F.stats.nnz_l, "flops": F.stats.flops,
           "levels": F.stats.levels, "largest_front": F.stats.largest_front}
    bs = [xp.ones(m.shape[0]) for m in mats]
    b = bs if isinstance(A, list) else bs[0]
    for _ in range(3):  # the first calls capture graphs and grow the memory pool
        xs = F.solve(b)
    out["solve"] = median_ms(lambda: F.solve(b), reps)
    xs = xs if isinstance(A, list) else [xs]
    out["residual"] = max(float(np.abs(m @ _host(x) - 1).max()) for m, x in zip(mats, xs))
    if isinstance(A, list):
        # a batch's right-hand sides stacked in one array (cuDSS's batch is given its arrays
        # once too): the list form's time is then mostly a Python object per matrix
        B = xp.ones(sum(m.shape[0] for m in mats))
        out["solve_list"] = out["solve"]
        for _ in range(3):
            X = _host(F.solve(B))
        out["solve"] = median_ms(lambda: F.solve(B), reps)
        r0 = np.cumsum([0] + [m.shape[0] for m in mats])
        out["residual"] = max(out["residual"], max(
            float(np.abs(m @ X[r0[i]: r0[i + 1]] - 1).max()) for i, m in enumerate(mats)))
    out["info"] = int(np.abs(F.info).max())
    run, nlev = level_baseline(F, xp)
    run()
    out["levels_factor"] = median_ms(run, reps)
    out["levels_count"] = nlev
    # the baseline leaves F's workspace factored the same way: its solve must still be right
    xs = F.solve(b)
    xs = xs if isinstance(A, list) else [xs]
    out["levels_residual"] = max(float(np.abs(m @ _host(x) - 1).max())
                                 for m, x in zip(mats, xs))
    return out


def level_baseline(F, xp):
    """The level-by-level baseline (what STRUMPACK and SuperLU_DIST do with MAGMA): per level
    of the assembly trees (fronts of one height), one vbatch partial Cholesky of the level's
    fronts, waited for, then one vectorized scatter-add of their Schur complements into their
    parents. The same kernels as vbatch's factorization, without its scheduler. Returns a
    function that refactors F's workspace this way and returns the worst info."""
    size, width, parent, off = F._size, F._width, F._parent, F._offset
    h = np.zeros(len(size), np.int64)
    for f in range(len(size)):
        if parent[f] >= 0:
            h[parent[f]] = max(h[parent[f]], h[f] + 1)
    rel = F._rel
    relv = rel.data.get() if hasattr(rel.data, "get") else rel.data
    levels = []
    from vbatch.core.batch import PackedBatch

    for lv in range(int(h.max()) + 1):
        fr = np.flatnonzero(h == lv)
        batch = PackedBatch(data=F._work.data, m=size[fr], n=size[fr], offset=off[fr],
                            ld=size[fr], order="F")
        src, dst = [], []
        for f in fr[parent[fr] >= 0]:
            p, n, P = int(width[f]), int(size[f]), int(parent[f])
            u = n - p
            if not u:
                continue
            r = relv[rel.offset[f]: rel.offset[f] + u].astype(np.int64)
            i, j = np.tril_indices(u)
            src.append(off[f] + (p + i) + (p + j) * n)
            dst.append(off[P] + r[i] + r[j] * size[P])
        s_ = xp.asarray(np.concatenate(src)) if src else None
        d_ = xp.asarray(np.concatenate(dst)) if dst else None
        levels.append((batch, width[fr], s_, d_))
    vals = xp.asarray(np.concatenate(F._values))

    def run():
        work = F._work.data
        work.fill(0)
        work[F._amap] = vals
        worst = 0
        for batch, npiv, s_, d_ in levels:
            res = F._rt.cholesky(batch, npiv, overwrite=True).result()
            worst = max(worst, int(np.abs(res.info).max()))
            if s_ is not None:
                if xp is np:
                    np.add.at(work, d_, work[s_])
                else:
                    import cupyx

                    cupyx.scatter_add(work, d_, work[s_])
        if xp is not np:
            xp.cuda.runtime.deviceSynchronize()
        return worst

    return run, len(levels)


def bench_splu(A, reps: int) -> dict:
    """scipy's SuperLU on the host (one core, MMD on A^T + A, no pivoting: symmetric mode),
    factor and solve, each matrix of a batch in turn."""
    import scipy.sparse.linalg as sla

    mats = A if isinstance(A, list) else [A]
    cs = [sp.csc_matrix(m) for m in mats]

    def factor():
        return [sla.splu(c, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                         options=dict(SymmetricMode=True)) for c in cs]

    lus = factor()
    out = {"factor": median_ms(factor, reps)}
    bs = [np.ones(m.shape[0]) for m in mats]
    out["solve"] = median_ms(lambda: [lu.solve(b) for lu, b in zip(lus, bs)], reps)
    out["nnz_l"] = int(sum(lu.L.nnz for lu in lus))
    out["residual"] = max(float(np.abs(m @ lu.solve(b) - 1).max())
                          for m, lu, b in zip(mats, lus, bs))
    return out


def bench_cholmod(A, reps: int) -> dict:
    """CHOLMOD (scikit-sparse) on the host: analysis (its default ordering: AMD, or METIS where
    built with it) once, factor (numeric, reusing the analysis) and solve, each matrix of a
    batch in turn; only the lower triangle is passed."""
    from sksparse.cholmod import analyze

    mats = A if isinstance(A, list) else [A]
    cs = [sp.csc_matrix(sp.tril(m)) for m in mats]
    t = time.perf_counter()
    sym = [analyze(c, mode="supernodal") for c in cs]
    out = {"analysis": 1e3 * (time.perf_counter() - t)}

    def factor():
        return [s.cholesky(c) for s, c in zip(sym, cs)]

    fs = factor()
    out["factor"] = median_ms(factor, reps)
    bs = [np.ones(m.shape[0]) for m in mats]
    out["solve"] = median_ms(lambda: [f(b) for f, b in zip(fs, bs)], reps)
    out["nnz_l"] = int(sum(f.L().nnz for f in fs))
    out["residual"] = max(float(np.abs(m @ f(b) - 1).max()) for m, f, b in zip(mats, fs, bs))
    return out


def bench_cudss(A, lib: str, reps: int) -> dict:
    sys.path.insert(0, HERE)
    from cudss import ANALYSIS, DATA_FLOPS, DATA_LU_NNZ, FACTORIZATION, SOLVE, CuDSS

    s = CuDSS(lib)
    batched = isinstance(A, list)
    s.batch(A) if batched else s.matrix(A)
    t = time.perf_counter()
    s.run(ANALYSIS)
    out = {"analysis": 1e3 * (time.perf_counter() - t)}
    s.run(FACTORIZATION)
    out["factor"] = median_ms(lambda: s.run(FACTORIZATION), reps)
    out["solve"] = median_ms(lambda: s.run(SOLVE), reps)
    try:
        out["nnz_l"] = s.get(DATA_LU_NNZ)
        out["flops"] = s.get(DATA_FLOPS)
    except RuntimeError:
        pass
    mats = A if batched else [A]
    xs = s.x if batched else [s.x]
    out["residual"] = max(float(np.abs(m @ x.get() - 1).max()) for m, x in zip(mats, xs))
    return out


def _has_cholmod() -> bool:
    try:
        import sksparse.cholmod  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=[
        "494_bus.mtx", "1138_bus.mtx", "bcsstk09.mtx", "gr_900_900_crg.mtx",
        "bcsstk16.triplet0", "lap2-100", "lap2-300", "lap3-20", "lap3-40", "batch"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cudss", default=os.environ.get("VBATCH_CUDSS"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--matrices", default=os.environ.get(
        "VBATCH_MATRICES", os.path.join(HERE, "..", "..", "shared", "data", "matrices")))
    ap.add_argument("--splu-max-n", type=int, default=100_000,
                    help="time scipy's splu on cases up to this order (0: never)")
    ap.add_argument("--cholmod-max-n", type=int, default=300_000,
                    help="time CHOLMOD on cases up to this order, where sksparse imports "
                         "(0: never)")
    ap.add_argument("--relax-width", type=int, default=None,
                    help="vbatch.sparse's amalgamation width (default: its own)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import vbatch

    rt = vbatch.Runtime(args.device)
    # numba's start-up (~0.5 s, once a process: its first compiled call, 2-core VM and the GPU
    # machine alike) would land in the first case's analysis: pay it before timing, as every
    # other warm-up here.
    from vbatch.sparse import cholesky as _warm, laplacian as _lap

    _warm(_lap(4), runtime=rt)
    # and the split dissection's compiled refinement (~3 s to compile, once an install: a
    # large matrix's analysis would pay it), on a graph past a lowered threshold
    from vbatch.sparse.dissect import nested_dissection as _nd

    _g = sp.csr_matrix(_lap(8))
    _g.setdiag(0)
    _g.eliminate_zeros()
    _nd(_g.indptr.astype(np.int64), _g.indices.astype(np.int64), parallel_min=16)
    rows = []
    for name in args.cases:
        A = case(name, args.matrices)
        row = {"case": name}
        try:
            from vbatch.sparse.analysis import RELAX_WIDTH

            row["vbatch"] = bench_vbatch(A, rt, args.reps, args.relax_width or RELAX_WIDTH)
        except Exception as exc:  # noqa: BLE001 - a case that fails is reported, not fatal
            row["vbatch"] = {"error": repr(exc)}
        if args.cudss:
            try:
                row["cudss"] = bench_cudss(A, args.cudss, args.reps)
            except Exception as exc:  # noqa: BLE001
                row["cudss"] = {"error": repr(exc)}
        n = sum(m.shape[0] for m in A) if isinstance(A, list) else A.shape[0]
        if n <= args.splu_max_n:
            row["splu"] = bench_splu(A, min(args.reps, 3))
        if n <= args.cholmod_max_n and _has_cholmod():
            row["cholmod"] = bench_cholmod(A, min(args.reps, 5))
        rows.append(row)
        v, c = row["vbatch"], row.get("cudss", {})
        ratio = (v.get("factor", np.nan) / c["factor"]) if "factor" in c else np.nan
        sp_, ch = row.get("splu", {}), row.get("cholmod", {})
        print(f"{name:20s} vbatch factor {v.get('factor', np.nan):8.3f} solve "
              f"{v.get('solve', np.nan):8.3f} (list {v.get('solve_list', np.nan):7.3f}) "
              f"analysis {v.get('analysis', np.nan):9.1f} "
              f"levels {v.get('levels_factor', np.nan):8.3f} ({v.get('levels_count', 0)}) | "
              f"cuDSS factor {c.get('factor', np.nan):8.3f} solve {c.get('solve', np.nan):8.3f} "
              f"analysis {c.get('analysis', np.nan):9.1f} | splu factor "
              f"{sp_.get('factor', np.nan):8.2f} | CHOLMOD factor {ch.get('factor', np.nan):8.2f} "
              f"solve {ch.get('solve', np.nan):7.2f} | vbatch/cuDSS factor {ratio:5.2f}  "
              f"{v.get('error', '')}{c.get('error', '')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
