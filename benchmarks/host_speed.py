"""Host-side speed: planning time, and the CPU backend against a scipy loop, side by side.

    python benchmarks/host_speed.py [--reps 9] [--json FILE] [--only cpu|planning|tiny|lists]
                                    [--dtype float64|complex128]

Planning: k = 5,000 sizes uniform on [1, 512], both policies, nb 32 and 64, full and partial.

CPU backend (float64, or complex128 Hermitian matrices with ``--dtype``; default BLAS
settings): vbatch's packed and list forms against
``scipy.linalg.cholesky`` called once per matrix, for k = 2,000 at Nmax 128 and k = 500 at Nmax
512, every size distribution of ``ops/generate.py``, full and partial (npiv = n // 2; the loop
then does what a user would: potrf of the leading block, a triangular solve, the Schur update).
The packed form is prepared beforehand, as a user factoring the same layout again has it; the list
form includes packing the list and the result views. Each vbatch run is followed by a loop run,
so a slow patch of a shared machine hits both; medians are reported, with the ratio
vbatch / loop (below 1: vbatch is faster).

Tiny calls: 10 matrices of 8 x 8 on the CPU, one call of each op, us, median of 200 calls
after 20, against a scipy loop doing the same (``scipy.linalg.cholesky``, ``dgemm``,
``solve_triangular``, ``cho_factor`` + ``cho_solve``, SciPy's BLAS and LAPACK wrappers for the
others: ``dgetrf``, ``dgetrs``, ``dgesv``, ...), list and packed forms.

Lists: what the list form costs over the packed call, us a matrix, for k = 20,000 numpy matrices
of sizes U[1, 8] (POTRF; TRSM and GEMM, two lists), a repeated call of each form (median of
--reps after two): reading, packing and giving back the arrays. ``--device cuda`` does the same
with cupy arrays on the GPU (each call synchronized).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time

import numpy as np
import scipy.linalg
import scipy.linalg.blas

import vbatch
from vbatch.ops.generate import DISTRIBUTIONS, sizes, spd_list
from vbatch.scheduler import plan_cholesky


def median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def planning(reps: int) -> list[dict]:
    rng = np.random.default_rng(0)
    n = sizes("uniform", 5000, 512, rng)
    npiv = (n * rng.uniform(0, 1, len(n))).astype(np.int64)
    rows = []
    for policy in ("dsse", "ssde"):
        for nb in (32, 64):
            for label, p in (("full", None), ("partial", npiv)):
                def plan_once(p=p, nb=nb, policy=policy):
                    return plan_cholesky(n, p, nb=nb, policy=policy, fused_max_rows=512)

                plan = plan_once()
                ms = median_ms(plan_once, reps)
                rows.append(dict(policy=policy, nb=nb, npiv=label, ms=ms,
                                 launches=len(plan.launches)))
    return rows


def scipy_loop(mats, npiv=None):
    """What a user writes without vbatch: one scipy call (or three, for a partial) per matrix
    (complex: the Hermitian factor, ``L21 = A21 L11^-H`` and ``A22 - L21 L21^H``).

    The partial loop forms L21 L21^H with scipy's gemm, not numpy's ``@``: numpy and scipy
    carry separate OpenBLAS builds whose thread pools fight when a loop alternates between them
    (seconds instead of milliseconds on 2 cores), and the baseline should not pay for that."""
    if npiv is None:
        return [scipy.linalg.cholesky(a, lower=True) for a in mats]
    cplx = bool(mats) and mats[0].dtype.kind == "c"
    gemm, trans = (scipy.linalg.blas.zgemm, 2) if cplx else (scipy.linalg.blas.dgemm, 1)
    out = []
    for a, p in zip(mats, npiv):
        l11 = scipy.linalg.cholesky(a[:p, :p], lower=True)
        l21 = scipy.linalg.solve_triangular(l11, a[:p, p:], lower=True).conj().T
        out.append((l11, l21, gemm(-1.0, l21, l21, 1.0, a[p:, p:], trans_b=trans)))
    return out


CASES = [(2000, 128), (500, 512)]


def cpu_backend(reps: int, nbs=(None,), dtype=np.float64) -> list[dict]:
    rows = []
    for k, nmax in CASES:
        for dist in DISTRIBUTIONS:
            rng = np.random.default_rng(1)
            ns = sizes(dist, k, nmax, rng)
            mats = spd_list(ns, dtype, rng)
            packed = vbatch.pack(mats)
            for partial in (False, True):
                npiv = (ns // 2) if partial else None
                for nb in nbs:
                    rt = vbatch.Runtime("cpu", **({} if nb is None else {"nb": nb}))
                    rt.cholesky(packed, npiv).result()  # plan cached on the batch
                    tp, tl, ts = [], [], []
                    def packed_call(rt=rt, packed=packed, npiv=npiv):
                        return rt.cholesky(packed, npiv).result()

                    def list_call(rt=rt, mats=mats, npiv=npiv):
                        return rt.cholesky(mats, npiv).result()

                    def loop(mats=mats, npiv=npiv):
                        return scipy_loop(mats, npiv)

                    # The six orders of the forms in turn, so that none always runs right
                    # after the same one: on the 2-core VM a list call right after the loop
                    # took 255-1,104 ms (Nmax 512 uniform; 180 packed), for reasons not found.
                    forms = [(tp, packed_call), (ts, loop), (tl, list_call)]
                    orders = list(itertools.permutations(forms))
                    for r in range(reps):
                        for times, fn in orders[r % len(orders)]:
                            times.append(median_ms(fn, 1))
                    p, s, li = (float(np.median(x)) for x in (tp, ts, tl))
                    rows.append(dict(k=k, nmax=nmax, dist=dist, npiv="n//2" if partial else "full",
                                     nb=rt.plan(packed).nb, packed_ms=p, list_ms=li,
                                     scipy_loop_ms=s, ratio_packed=p / s, ratio_list=li / s))
    return rows


def tiny(reps: int = 200) -> list[dict]:
    rng = np.random.default_rng(0)
    a = spd_list([8] * 10, np.float64, rng)
    b = [rng.standard_normal((8, 8)) for _ in range(10)]
    lower = [np.tril(x) for x in scipy.linalg.cholesky(np.stack(a), lower=True)]
    pa, pb, pl = (vbatch.pack(x, order="F") for x in (a, b, lower))
    rt = vbatch.Runtime("cpu")
    sl = scipy.linalg
    blas, lapack = scipy.linalg.blas, scipy.linalg.lapack
    lus = [lapack.dgetrf(x) for x in b]
    lu_list, piv_list = [f for f, _, _ in lus], [p for _, p, _ in lus]
    lu_res = rt.getrf(pb).result()
    cases = {
        "potrf": (lambda: [sl.cholesky(x, lower=True) for x in a],
                  lambda: rt.cholesky(a).result(), lambda: rt.cholesky(pa).result()),
        "gemm": (lambda: [scipy.linalg.blas.dgemm(1.0, x, y) for x, y in zip(a, b)],
                 lambda: rt.gemm(a, b).result(), lambda: rt.gemm(pa, pb).result()),
        "trsm": (lambda: [sl.solve_triangular(x, y, lower=True) for x, y in zip(lower, b)],
                 lambda: rt.trsm(lower, b).result(), lambda: rt.trsm(pl, pb).result()),
        "posv": (lambda: [sl.cho_solve(sl.cho_factor(x, lower=True), y) for x, y in zip(a, b)],
                 lambda: rt.posv(a, b).result(), lambda: rt.posv(pa, pb).result()),
        "potrs": (lambda: [lapack.dpotrs(x, y, lower=1) for x, y in zip(lower, b)],
                  lambda: rt.potrs(lower, b).result(), lambda: rt.potrs(pl, pb).result()),
        "syrk": (lambda: [blas.dsyrk(1.0, x, lower=1) for x in b],
                 lambda: rt.syrk(b).result(), lambda: rt.syrk(pb).result()),
        "syr2k": (lambda: [blas.dsyr2k(1.0, x, y, lower=1) for x, y in zip(a, b)],
                  lambda: rt.syr2k(a, b).result(), lambda: rt.syr2k(pa, pb).result()),
        "symm": (lambda: [blas.dsymm(1.0, x, y, lower=1) for x, y in zip(a, b)],
                 lambda: rt.symm(a, b).result(), lambda: rt.symm(pa, pb).result()),
        "trmm": (lambda: [blas.dtrmm(1.0, x, y, lower=1) for x, y in zip(lower, b)],
                 lambda: rt.trmm(lower, b).result(), lambda: rt.trmm(pl, pb).result()),
        "getrf": (lambda: [lapack.dgetrf(x) for x in b],
                  lambda: rt.getrf(b).result(), lambda: rt.getrf(pb).result()),
        # (the solves on the factors of b: the loop LAPACK's, vbatch a getrf result's, whose
        # ipiv is read where it lies)
        "getrs": (lambda: [lapack.dgetrs(f, p, y) for (f, p, _), y in zip(lus, a)],
                  lambda: rt.getrs(lu_list, piv_list, a).result(),
                  lambda: rt.getrs(lu_res.factors, lu_res.ipiv, pa).result()),
        "gesv": (lambda: [lapack.dgesv(x, y) for x, y in zip(b, a)],
                 lambda: rt.gesv(b, a).result(), lambda: rt.gesv(pb, pa).result()),
    }
    rows = []
    for op, fns in cases.items():
        times: list[list[float]] = [[], [], []]
        for fn in fns:
            for _ in range(20):
                fn()
        for _ in range(reps):  # (the three alternated: a slow patch hits all of them)
            for t, fn in zip(times, fns):
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
        loop, lst, packed = (float(np.median(t) * 1e6) for t in times)
        rows.append(dict(op=op, loop_us=loop, list_us=lst, packed_us=packed))
    return rows


def lists(reps: int, k: int = 20_000, device: str = "cpu") -> list[dict]:
    rng = np.random.default_rng(2)
    n = rng.integers(1, 9, k)
    a = spd_list(n, np.float64, rng)
    lo = [np.linalg.cholesky(x) for x in a]
    b = [rng.standard_normal((x, 4)) for x in n]
    sq = [rng.standard_normal((x, x)) for x in n]
    done = lambda: None  # noqa: E731
    if device == "cuda":
        import cupy

        a, lo, b, sq = ([cupy.asarray(x) for x in v] for v in (a, lo, b, sq))
        done = cupy.cuda.get_current_stream().synchronize
    rt = vbatch.Runtime(device)
    pa, plo, pb, psq = (vbatch.pack(x) for x in (a, lo, b, sq))
    cases = {"potrf": (lambda: rt.cholesky(a).result(), lambda: rt.cholesky(pa).result()),
             "trsm": (lambda: rt.trsm(lo, b).result(), lambda: rt.trsm(plo, pb).result()),
             "gemm": (lambda: rt.gemm(sq, b).result(), lambda: rt.gemm(psq, pb).result())}
    rows = []
    for op, (lst, packed) in cases.items():
        lst_done = lambda f=lst: (f(), done())  # noqa: E731
        packed_done = lambda f=packed: (f(), done())  # noqa: E731
        for fn in (lst_done, packed_done, lst_done, packed_done):
            fn()
        tl, tp = [], []
        for _ in range(reps):
            tl.append(median_ms(lst_done, 1))
            tp.append(median_ms(packed_done, 1))
        li, p = float(np.median(tl)), float(np.median(tp))
        rows.append(dict(op=op, k=k, device=device, list_ms=li, packed_ms=p,
                         over_us=(li - p) * 1e3 / k))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--only", choices=("cpu", "planning", "tiny", "lists"))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where --only lists runs (cuda: lists of cupy arrays)")
    ap.add_argument("--nb", type=int, nargs="+", help="CPU panel widths to compare "
                                                     "(default: the backend's)")
    ap.add_argument("--dtype", choices=("float64", "complex128"), default="float64",
                    help="the CPU backend's factorizations (--only cpu): real SPD or complex "
                         "Hermitian matrices")
    args = ap.parse_args()
    out: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                            f"numpy {np.__version__}, scipy {scipy.__version__}"}
    print(out["machine"])
    if args.only in (None, "tiny"):
        out["tiny"] = tiny()
        print("tiny CPU calls, 10 matrices of 8 x 8 (median us)")
        for r in out["tiny"]:
            print(f"  {r['op']:6} loop {r['loop_us']:7.1f}  list {r['list_us']:7.1f}  "
                  f"packed {r['packed_us']:7.1f}")
    if args.only in (None, "lists"):
        out["lists"] = lists(args.reps, device=args.device)
        kind = "cupy" if args.device == "cuda" else "numpy"
        print(f"lists of 20,000 {kind} matrices of U[1, 8] over the packed call (median ms)")
        for r in out["lists"]:
            print(f"  {r['op']:6} list {r['list_ms']:8.2f}  packed {r['packed_ms']:8.2f}  "
                  f"over {r['over_us']:5.2f} us a matrix")
    if args.only not in ("cpu", "tiny", "lists"):
        out["planning"] = planning(args.reps)
        print("planning, k = 5000, uniform Nmax = 512 (median ms)")
        for r in out["planning"]:
            print(f"  {r['policy']} nb={r['nb']:<3} {r['npiv']:<7} {r['ms']:7.2f} ms  "
                  f"{r['launches']:4d} launches")
    if args.only in (None, "cpu"):
        out["cpu_backend"] = cpu_backend(args.reps, tuple(args.nb) if args.nb else (None,),
                                         np.dtype(args.dtype))
        print(f"CPU backend vs a scipy.linalg.cholesky loop, {args.dtype} (median ms; ratio = "
              "vbatch / loop)")
        print(f"  {'k':>5} {'Nmax':>5} {'dist':<8} {'npiv':<5} {'nb':>4} {'packed':>8} "
              f"{'list':>8} {'loop':>8} {'packed/loop':>12} {'list/loop':>10}")
        for r in out["cpu_backend"]:
            print(f"  {r['k']:>5} {r['nmax']:>5} {r['dist']:<8} {r['npiv']:<5} {r['nb']:>4} "
                  f"{r['packed_ms']:8.1f} {r['list_ms']:8.1f} {r['scipy_loop_ms']:8.1f} "
                  f"{r['ratio_packed']:12.2f} {r['ratio_list']:10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
