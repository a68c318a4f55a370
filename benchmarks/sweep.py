"""The sweep: every entry point at every size on a fine grid, anchors side by side, raw results
kept one file per run, and a report that reads them.

    python benchmarks/sweep.py run --out FILE [--ops potrf gemm syrk trsm getrf]
        [--nmax 8:512:8 ...] [--dist uniform lognormal skewed equal] [--dtype float64 float32]
        [--forms packedF packedC list prepared] [--k 2000] [--reps 11] [--magma LIB] [--cublas]
        [--cusolverdx SITE]
    python benchmarks/sweep.py report FILE [FILE ...]

``run`` times, for each op, dtype, distribution and Nmax (``A:B:S`` is a range, B included):
vbatch's column-major pack (packedF), row-major pack (packedC), list of CuPy arrays (list) and
prepared call on the column-major pack (prepared), and MAGMA's vbatched routine on the same
column-major buffers (``--magma``: libmagma_vb.so, ../shared/anchors/magma/README.md; POTRF,
GEMM, TRSM and, where the build has it, GETRF: MAGMA's SYRK binding is untested, so SYRK has no
anchor) and cuBLAS's grouped
GEMM (``--cublas``: cublasGemmGroupedBatchedEx, cuBLAS >= 12.5, a group per problem, as
cuda_blas.py calls it; GEMM cells: C = A B into a zeroed C) and cuSOLVERDx's Cholesky
(``--cusolverdx SITE``: POTRF cells whose largest order fits its shared memory, an 8-wide bucket
a launch, cusolverdx.py; its time is GPU time, the launches' host cost left out). k problems per
cell (500 from Nmax 768), sizes U[1, Nmax] (uniform), lognormal around Nmax / 4, 1% at Nmax and
the rest U[1, Nmax / 10] (skewed), or all Nmax (equal). GEMM: C = A B, m, n and k each drawn;
SYRK: C = A A^T, A n x k, k drawn; TRSM: L X = B, 16 right-hand sides; GETRF: square, entries
U[-1, 1], partial pivoting. Times: the call and its
result, synchronized, ms, median of --reps after 3 warm-ups; MAGMA's POTRF and TRSM on their
input restored (untimed) before each call. Each cell's rows are written as soon as it is
measured, so a run cut short keeps what it measured.

``report`` prints, per op and dtype: the worst ratio of each vbatch form against each anchor
(above 1: vbatch slower), every cell where vbatch's column-major pack loses to an anchor, and
the worst row-major / column-major ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections import defaultdict

import numpy as np

OPS = ("potrf", "gemm", "syrk", "trsm", "getrf")
ANCHORED = ("potrf", "gemm", "trsm", "getrf")  # (MAGMA's routines the anchors run)
FORMS = ("packedF", "packedC", "list", "prepared")
DISTS = ("uniform", "lognormal", "skewed", "equal")


def _grid(items: list[str]) -> list[int]:
    out = []
    for it in items:
        if ":" in it:
            a, b, s = (int(x) for x in it.split(":"))
            out += list(range(a, b + 1, s))
        else:
            out.append(int(it))
    return out


def _sizes(dist: str, k: int, nmax: int, rng) -> np.ndarray:
    if dist == "uniform":
        n = rng.integers(1, nmax + 1, k)
    elif dist == "lognormal":
        n = np.rint(rng.lognormal(np.log(max(nmax / 4, 1)), 0.8, k))
    elif dist == "skewed":
        n = rng.integers(1, max(nmax // 10, 1) + 1, k)
        n[rng.choice(k, max(k // 100, 1), replace=False)] = nmax
    elif dist == "equal":
        n = np.full(k, nmax)
    else:
        raise ValueError(dist)
    return np.clip(n, 1, nmax).astype(np.int64)


def _host(op: str, n: np.ndarray, dtype, rng) -> dict:
    """Host operands of one cell: GEMM's A (m x k) and B (k x n), m, n and k each drawn;
    SYRK's A (n x k); TRSM's lower triangle (n x n, well conditioned) and 16 right-hand sides."""
    def u(r, c):
        x = rng.uniform(-1, 1, (int(r), int(c)))
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.uniform(-1, 1, x.shape)
        return x.astype(dtype)

    if op == "gemm":
        m, kk = rng.permutation(n), rng.permutation(n)
        return {"a": [u(i, j) for i, j in zip(m, kk)], "b": [u(j, i) for i, j in zip(n, kk)]}
    if op == "syrk":
        return {"a": [u(i, j) for i, j in zip(n, rng.permutation(n))]}
    if op == "getrf":
        return {"a": [u(i, i) for i in n]}
    return {"a": [np.tril(u(i, i)) / max(int(i), 1) + 2 * np.eye(int(i), dtype=dtype)
                  for i in n], "b": [u(i, 16) for i in n]}


def _ms(fn, reps: int, before=None) -> float:
    import cupy

    sync = cupy.cuda.get_current_stream().synchronize
    ts = []
    for i in range(reps + 3):
        if before is not None:
            before()
            sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if i >= 3:
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def operands(op, dtype, n, rng, rt) -> tuple[dict, object, object]:
    """One cell's operands, per form (packedF, packedC on the device, list of CuPy arrays),
    the call that runs the op on a form's operands and returns its result, and the prepared
    call's arguments (the column-major pack)."""
    import cupy

    import vbatch
    from vbatch.ops.generate import spd_packed

    if op == "potrf":
        host = spd_packed(n, dtype, rng, order="F")
        ops = {"packedF": host.with_data(cupy.asarray(host.data))}
        # (symmetric matrices: the same buffer read row-major is the same batch)
        ops["packedC"] = vbatch.PackedBatch.from_buffer(ops["packedF"].data, n, order="C")
        ops["list"] = [ops["packedF"].matrix(i).copy() for i in range(len(n))]

        def call(x):
            return rt.cholesky(x).result()

        return ops, call, {"batch": ops["packedF"]}
    host = _host(op, n, dtype, rng)
    ops = {}
    for form in ("F", "C"):
        ops["packed" + form] = {f: (lambda p: p.with_data(cupy.asarray(p.data)))(
            vbatch.pack(v, order=form)) for f, v in host.items()}
    ops["list"] = {f: [cupy.asarray(x) for x in v] for f, v in host.items()}
    method = getattr(rt, op)

    def call(x):
        return method(**x).result()

    if op == "getrf":
        return ({f: v["a"] for f, v in ops.items()}, lambda x: method(x).result(),
                ops["packedF"])

    return ops, call, ops["packedF"]


def _cell(op, dtype, dist, nmax, k, forms, reps, rt, magma, rng, blas=None,
          dx=None) -> dict:
    import cupy

    import vbatch

    n = _sizes(dist, k, nmax, rng)
    out = {}
    ops, call, prepared = operands(op, dtype, n, rng, rt)
    prep = rt.prepare(op, **prepared) if "prepared" in forms else None
    for form in forms:
        if form == "prepared":
            out[form] = _ms(lambda: prep.run().result(), reps)
        else:
            out[form] = _ms(lambda x=ops[form]: call(x), reps)
    if magma is not None and op in ANCHORED and magma.has(op, dtype):
        if op == "potrf":
            work = ops["packedF"].with_data(ops["packedF"].data.copy())
            call_m = magma.prepare_potrf(work)
            src = ops["packedF"].data
            out["magma"] = _ms(lambda: magma.potrf_vbatched(call_m), reps,
                               before=lambda: work.data.__setitem__(Ellipsis, src))
        elif op == "gemm":
            pa, pb = ops["packedF"]["a"], ops["packedF"]["b"]
            c = vbatch.PackedBatch.from_buffer(cupy.zeros(int((pa.m * pb.n).sum()), dtype),
                                               pb.n, order="F", m=pa.m)
            call_m = magma.prepare_gemm(pa, pb, c, alpha=1.0, beta=0.0)
            out["magma"] = _ms(lambda: magma.gemm_vbatched(call_m), reps)
        elif op == "getrf":  # in place on a copy, restored (untimed) before each call
            pa = ops["packedF"]
            work = pa.with_data(pa.data.copy())
            call_m = magma.prepare_getrf(work)
            out["magma"] = _ms(lambda: magma.getrf_vbatched(call_m), reps,
                               before=lambda: work.data.__setitem__(Ellipsis, pa.data))
            _check_magma_getrf(call_m, pa)
        else:  # trsm: X over a copy of B, restored (untimed) before each call
            pa, pb = ops["packedF"]["a"], ops["packedF"]["b"]
            work = pb.with_data(pb.data.copy())
            call_m = magma.prepare_trsm(pa, work)
            out["magma"] = _ms(lambda: magma.trsm_vbatched(call_m), reps,
                               before=lambda: work.data.__setitem__(Ellipsis, pb.data))
    if blas is not None and op == "gemm" and dtype.kind == "f":  # (grouped GEMM: real types)
        out["cublas"] = _ms(_grouped(blas, ops["packedF"], dtype), reps)
    if dx is not None and op == "potrf" and nmax <= dx.max_order(dtype):
        out["cusolverdx"] = _dx_potrf(dx, ops["packedF"], reps)
    return out


def _check_magma_getrf(call, batch) -> None:
    """MAGMA's pivots (1-based) against LAPACK's on three matrices of the cell (zgetrf's for
    complex types: izamax's |re| + |im|)."""
    from scipy.linalg import lu_factor

    piv = call.ipiv.get()
    for i in sorted({0, batch.k - 1, batch.k // 2}):
        a = batch.matrix(i).get()
        a = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
        r = min(a.shape)
        got = piv[call.ipiv_offset[i]:call.ipiv_offset[i] + r] - 1
        if r and got.tolist() != lu_factor(a)[1].tolist():
            raise SystemExit(f"MAGMA's getrf pivots of matrix {i} differ from LAPACK's")


def _dx_potrf(dx, batch, reps: int) -> float:
    """cuSOLVERDx's GPU time on a copy of the column-major pack, restored before each call;
    its factors checked against numpy's on a few matrices (the anchor's own kernel)."""
    work = batch.with_data(batch.data.copy())
    call = dx.prepare_potrf(work)
    ms = dx.time_potrf(call, reps, lambda: work.data.__setitem__(Ellipsis, batch.data))
    bad = dx.info(call)
    for i in sorted({0, batch.k - 1, batch.k // 2}):
        a = batch.matrix(i).get().astype(np.float64)
        f = np.tril(work.matrix(i).get().astype(np.float64))
        ref = np.linalg.cholesky(a) if a.size else a
        err = np.linalg.norm(f - ref) / max(np.linalg.norm(ref), 1e-300)
        if bad or not err < (1e-10 if batch.dtype == np.float64 else 1e-3):
            raise SystemExit(f"cuSOLVERDx's factor of matrix {i} is off: error {err:.2e}, "
                             f"{bad} matrices with info != 0")
    return ms


def _grouped(blas, x: dict, dtype):
    """cuBLAS's grouped GEMM of C = A B over the column-major pack ``x`` (a group per
    problem), into a zeroed C of its own: the call."""
    import cupy

    import vbatch
    from cublas import GroupedCall

    a, b = x["a"], x["b"]
    c = vbatch.PackedBatch.from_buffer(cupy.zeros(int((a.m * b.n).sum()), dtype), b.n, order="F",
                                       m=a.m)

    def ptrs(p):
        return cupy.asarray(np.uint64(p.data.data.ptr)
                            + p.offset.astype(np.uint64) * np.uint64(dtype.itemsize))

    pa, pb, pc = ptrs(a), ptrs(b), ptrs(c)
    call = GroupedCall(dtype=dtype.name, m=a.m, n=b.n, k=a.n, lda=a.ld, ldb=b.ld, ldc=c.ld,
                       alpha=1.0, beta=0.0, group_size=np.ones(a.k, np.int32),
                       a_ptrs=int(pa.data.ptr), b_ptrs=int(pb.data.ptr),
                       c_ptrs=int(pc.data.ptr), keep=(a, b, c, pa, pb, pc))
    return lambda: blas.gemm_grouped(call)


def run(args) -> int:
    import cupy

    import vbatch

    magma = None
    if args.magma:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from cuda_potrf import load_magma

        magma = load_magma(args.magma)
    blas = None
    if args.cublas:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cublas

        cupy.cuda.device.get_cublas_handle()  # (so that find_libcublas finds CuPy's own)
        blas = cublas.Cublas(cublas.find_libcublas()[0], cupy.cuda.get_current_stream().ptr)
        why = blas.grouped_status()
        if why:
            raise SystemExit(f"--cublas: {why}")
    dx = None
    if args.cusolverdx:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from cusolverdx import CuSolverDx

        dx = CuSolverDx(args.cusolverdx)
    rt = vbatch.Runtime("cuda")
    meta = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "args": vars(args), "magma": bool(magma), "cublas": blas is not None,
            "cusolverdx": dx and dx.version}
    rows = []
    for op in args.ops:
        for dtype in args.dtype:
            for dist in args.dist:
                for nmax in _grid(args.nmax):
                    k = args.k if nmax < 768 else min(args.k, 500)
                    # (one seed per cell, whatever else the run covers)
                    rng = np.random.default_rng(zlib.crc32(f"{op} {dtype} {dist} {nmax}".encode()))
                    ms = _cell(op, np.dtype(dtype), dist, nmax, k, args.forms, args.reps, rt,
                               magma, rng, blas, dx)
                    rows.append(dict(op=op, dtype=dtype, dist=dist, nmax=nmax, k=k, ms=ms))
                    print(f"{op:5} {dtype:7} {dist:9} {nmax:5} " + " ".join(
                        f"{f} {v:7.3f}" for f, v in ms.items()), flush=True)
                    with open(args.out, "w") as fh:
                        json.dump({"meta": meta, "rows": rows}, fh)
    return 0


def report(files: list[str]) -> int:
    rows = []
    for f in files:
        with open(f) as fh:
            rows += json.load(fh)["rows"]
    by = defaultdict(list)
    for r in rows:
        by[(r["op"], r["dtype"])].append(r)
    for (op, dtype), rs in by.items():
        print(f"== {op} {dtype}: {len(rs)} cells")
        anchors = sorted({a for r in rs for a in r["ms"] if a not in FORMS})
        forms = [f for f in FORMS if any(f in r["ms"] for r in rs)]
        for anchor in anchors:
            for form in forms:
                pairs = [(r["ms"][form] / r["ms"][anchor], r) for r in rs
                         if form in r["ms"] and anchor in r["ms"]]
                if not pairs:
                    continue
                worst, r = max(pairs, key=lambda p: p[0])
                losing = sum(1 for q, _ in pairs if q > 1)
                print(f"  {form:8} / {anchor}: worst {worst:5.2f}x ({r['dist']} Nmax "
                      f"{r['nmax']}), behind in {losing} of {len(pairs)} cells")
            lose = sorted(((r["ms"]["packedF"] / r["ms"][anchor], r) for r in rs
                           if "packedF" in r["ms"] and anchor in r["ms"]
                           and r["ms"]["packedF"] > r["ms"][anchor]),
                          key=lambda p: (p[1]["dist"], p[1]["nmax"]))
            for q, r in lose:
                print(f"    behind {anchor}: {r['dist']:9} Nmax {r['nmax']:5}  "
                      f"{r['ms']['packedF']:.3f} vs {r['ms'][anchor]:.3f} ({q:.2f}x)")
        pairs = [(r["ms"]["packedC"] / r["ms"]["packedF"], r) for r in rs
                 if "packedC" in r["ms"] and "packedF" in r["ms"]]
        if pairs:
            q, r = max(pairs, key=lambda p: p[0])
            over = sum(1 for x, _ in pairs if x > 1.05)
            print(f"  row-major / column-major: worst {q:.2f}x ({r['dist']} Nmax {r['nmax']}); "
                  f"over 1.05 in {over} of {len(pairs)} cells")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    r.add_argument("--nmax", nargs="+", default=["8:512:8", "640", "768", "1024"])
    r.add_argument("--dist", nargs="+", default=list(DISTS), choices=DISTS)
    r.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    r.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    r.add_argument("--k", type=int, default=2000)
    r.add_argument("--reps", type=int, default=11)
    r.add_argument("--magma", default=os.environ.get("VBATCH_MAGMA"))
    r.add_argument("--cublas", action="store_true",
                   help="time cuBLAS's grouped GEMM on the GEMM cells (an anchor)")
    r.add_argument("--cusolverdx", metavar="SITE",
                   help="time cuSOLVERDx's Cholesky on the POTRF cells its buckets fit (an "
                        "anchor; SITE: its wheels installed with --target, cusolverdx.py)")
    p = sub.add_parser("report")
    p.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else report(args.files)


if __name__ == "__main__":
    raise SystemExit(main())
