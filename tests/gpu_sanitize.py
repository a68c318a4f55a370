"""A small batch through every CUDA kernel, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck --error-exitcode 9 python tests/gpu_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python tests/gpu_sanitize.py \
        --dtype complex128 --part cholesky

Parts (``--part``, default all), each in every dtype its kernels take (``--dtype``, default
all four):
- ``cholesky``: fused (several block shapes), small_step, update (with its diagonal block),
  trsm, schur, in both layouts, full and partial, unblocked and blocked, with a non-SPD matrix
  (its failed panel completes its leading columns and the failed pivot in the fused kernel, and
  in update + trsm_step when separated), one that fails in its first panel (its later fused and
  small panels stop) and an infinite pivot;
- ``lists``: gather and scatter of lists of arrays;
- ``blas`` (real types): GEMM, SYRK, TRSM, TRMM, POSV with a failing problem;
- ``registered``: every registered op's conformance example (symm's symmetric copy among them;
  complex operands with the parameters only they take for a complex dtype);
- ``sparse`` (real types): the frontal family (vbatch.sparse, with a failing matrix; the
  extend-add and the solve's sweeps in both layouts, on fronts that split into several items).
Exits 1 if any result is wrong. Not collected by pytest (no test_ prefix): the sanitizer runs
it as its own process. Racecheck over every part takes longer than a device call may: run it a
part (or a dtype) at a time.
"""

import argparse
import sys

import cupy
import numpy as np

import vbatch
from vbatch.core.batch import Views
from vbatch.kernels import blas_cuda
from vbatch.ops.generate import make_indefinite, spd_list
from vbatch.ops.op import wide

BAD, INF = 7, 9  # problem indices: indefinite at column 40, +inf pivot at column 50
SMALL_BAD = 3  # n = 31, indefinite at column 12: a failed first panel in small_step
EARLY = 8  # n = 65, indefinite at column 5: its later panels (fused_step, small_step) stop


PARTS = ("cholesky", "lists", "blas", "registered", "sparse")
REAL_ONLY = ("blas", "sparse")
DTYPES = ("float64", "float32", "complex128", "complex64")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES))
    ap.add_argument("--part", nargs="+", choices=PARTS, default=list(PARTS))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    bad = 0
    for dtype in map(np.dtype, args.dtype):
        parts = [p for p in args.part if dtype.kind != "c" or p not in REAL_ONLY]
        if "cholesky" in parts or "lists" in parts:
            bad += cholesky(rng, dtype.type, parts)
        if "blas" in parts:
            bad += blas(rng, dtype.type)
        if "registered" in parts:
            bad += registered(rng, dtype.type)
        if "sparse" in parts:
            bad += sparse(rng, dtype.type)
    print("sanitize batch:", "ok" if not bad else f"{bad} failures")
    return 1 if bad else 0


def cholesky(rng, dtype, parts) -> int:
    """The potrf family's kernels (part ``cholesky``) and a list's gather and scatter
    (``lists``): the count of problems wrong."""
    ns = [0, 1, 5, 31, 32, 33, 63, 64, 65, 100, 129, 200]
    bad = 0
    eps = np.finfo(dtype).eps
    mats = spd_list(ns, dtype, rng)
    mats[BAD] = make_indefinite(mats[BAD], 40)
    mats[INF][50, 50] = np.inf
    mats[SMALL_BAD] = make_indefinite(mats[SMALL_BAD], 12)
    mats[EARLY] = make_indefinite(mats[EARLY], 5)
    npiv = [min(n, int(rng.integers(0, n + 1))) for n in ns]
    npiv[BAD] = ns[BAD]
    for order in ("F", "C") if "cholesky" in parts else ():
        # block 64 and 96: problems over 64 (96) columns factor in block columns (the blas
        # GEMM's block updates, panels that read L and update from their own block column;
        # 96 is float64's default width).
        for fmr, blk in ((None, 0), (0, 0), (None, 64), (0, 64), (None, 96)):
            opts = {"block": blk, "block_above": 0}
            if fmr is not None:
                opts["fused_max_rows"] = fmr
            rt = vbatch.Runtime("cuda", **opts)
            for p in (None, npiv):
                packed = vbatch.pack(mats, order=order)
                dev = packed.with_data(cupy.asarray(packed.data))
                res = rt.cholesky(dev, p).result()
                if p is None:  # the replays (runtime/prepared.py; fire from the second on)
                    for _ in range(3):
                        res = rt.cholesky(dev).result()
                host = res.factors.with_data(res.factors.data.get())
                tag = f"{np.dtype(dtype).name} {order} fmr={fmr} block={blk} npiv={p is not None}"
                for i, a in enumerate(mats):
                    f = wide(host.matrix(i))
                    if i == INF:
                        ref, info = vbatch.reference(a, None if p is None else p[i])
                        fin = np.isfinite(ref)
                        ok = (res.info[i] == info and not np.isnan(f).any()
                              and np.allclose(f[fin], ref[fin], rtol=1e-3, atol=1e-3))
                        if not ok:
                            print(f"{tag} inf pivot problem {i}: info {res.info[i]}")
                            bad += 1
                        continue
                    if res.info[i]:
                        # The columns before the failing one hold the partial factor,
                        # and the failing pivot LAPACK's tested value.
                        k = int(res.info[i]) - 1
                        a64 = wide(a)
                        sym = np.tril(a64) + np.tril(a64, -1).conj().T
                        err = np.linalg.norm(sym[:, :k] - f[:, :k] @ f[:k, :k].conj().T)
                        ref = vbatch.reference(a, None if p is None else p[i])[0]
                        err += abs(f[k, k] - ref[k, k])
                        r = err / np.linalg.norm(sym)
                    else:
                        r = vbatch.residual(a, f, None if p is None else p[i])
                    if not r <= 2 * max(ns[i], 1) * eps:
                        print(f"{tag} problem {i}: residual {r}")
                        bad += 1
                if res.info[BAD] != 41:
                    print(f"{tag} problem {BAD}: info {res.info[BAD]}")
                    bad += 1
                for i, col in ((SMALL_BAD, 12), (EARLY, 5)):
                    want = col + 1 if p is None or npiv[i] > col else 0
                    if res.info[i] != want:
                        print(f"{tag} problem {i}: info {res.info[i]}, not {want}")
                        bad += 1
    if "lists" not in parts:
        return bad
    want = vbatch.Runtime("cuda").cholesky([cupy.asarray(m) for m in mats]).result()
    # gather + scatter; column-major arrays: gathered into a column-major buffer (several
    # blocks a matrix past 4,096 elements), then scattered back. The third call of one
    # runtime on a list of the same sizes is a replay (gathered, then the plan's fire).
    for layout in (cupy.ascontiguousarray, cupy.asfortranarray):
        work = [layout(cupy.asarray(m)) for m in mats]
        rt = vbatch.Runtime("cuda")
        for _ in range(3):
            got = rt.cholesky([layout(cupy.asarray(m)) for m in mats]).result()
        vbatch.Runtime("cuda").cholesky(work, overwrite=True).result()
        for i in range(len(mats)):
            w = want.factors[i].get()
            tol = 1e3 * eps * (1.0 + np.abs(w[np.isfinite(w)]).max(initial=0.0))
            fin = np.isfinite(w)
            if not want.info[i] and not all(
                    np.array_equal(np.isinf(x), np.isinf(w))
                    and np.abs(x[fin] - w[fin]).max(initial=0.0) <= tol
                    for x in (got.factors[i].get(), np.tril(work[i].get()))):
                print(f"{np.dtype(dtype).name} {layout.__name__} list problem {i}: not "
                      "the factor")
                bad += 1
    return bad


def sparse(rng, dtype) -> int:
    """The frontal family (extend-add, both layouts through the op; F through vbatch.sparse,
    with a matrix that is not positive definite in the batch)."""
    import scipy.sparse as sp

    import vbatch.sparse

    bad = 0
    eps = np.finfo(dtype).eps
    mats = []
    for side in (1, 3, 9, 14, 30):  # (14: one subtree item; 30: three, under a front)
        t = sp.diags([-np.ones(side - 1), 2 * np.ones(side), -np.ones(side - 1)], [-1, 0, 1])
        e = sp.eye(side)
        mats.append(sp.csr_matrix(sp.kron(t, e) + sp.kron(e, t)))
    fail = mats[2].tolil()
    fail[10, 10] = -40.0
    mats.insert(2, sp.csr_matrix(fail))
    F = vbatch.sparse.cholesky(mats, runtime=vbatch.Runtime("cuda"), dtype=dtype)
    if not (F.info[2] > 0 and not np.delete(F.info, 2).any()):
        print(f"sparse {dtype.__name__}: info {F.info}")
        bad += 1
    xs = F.solve([np.ones(a.shape[0]) for a in mats])
    for i, (a, x) in enumerate(zip(mats, xs)):
        if i == 2:
            continue
        r = np.abs(a @ x - 1).max() / (abs(a).sum(axis=1).max() * np.abs(x).max() + 1)
        if not r <= 50 * a.shape[0] * eps:
            print(f"sparse {dtype.__name__} matrix {i}: backward error {r}")
            bad += 1
    for order in ("F", "C"):
        n, p, parent = [40, 37, 45], [2, 3, 45], [2, 2, -1]
        rel = [np.sort(rng.choice(45, 38, replace=False)),
               np.sort(rng.choice(45, 34, replace=False)), np.zeros(0)]
        fronts = [np.tril((lambda m: m @ m.T + 2 * k * np.eye(k))(rng.standard_normal((k, k))))
                  .astype(dtype) for k in n]
        want = vbatch.sparse.reference(fronts, p, parent, rel)
        a = vbatch.pack(fronts, order=order)
        r = vbatch.pack([x.reshape(-1, 1).astype(dtype) for x in rel], order="F")
        a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
        res = vbatch.Runtime("cuda").submit("frontal", a=a, rel=r, parent=parent, npiv=p,
                                            overwrite=True).result()
        for f in range(3):
            got = res.fronts.matrix(f).get().astype(np.float64)
            err = np.abs(got - want[f]).max() / np.abs(want[f]).max()
            if not err <= 100 * eps:
                print(f"frontal {order} {dtype.__name__} front {f}: {err}")
                bad += 1
        rhs = [np.zeros((k, 2)) for k in n]
        for f in range(3):
            rhs[f][: p[f]] = rng.standard_normal((p[f], 2))
        want_x = vbatch.ops.frontal.solve_reference(want, p, parent, rel, rhs)
        x = vbatch.pack([v.astype(dtype) for v in rhs], order=order)
        x = x.with_data(cupy.asarray(x.data))
        got = vbatch.Runtime("cuda").submit("frontal_solve", a=res.fronts, rel=r, parent=parent,
                                            npiv=p, x=x, overwrite=True).result().fronts
        for f in range(3):
            g = got.matrix(f).get().astype(np.float64)[: p[f]]
            err = np.abs(g - want_x[f][: p[f]]).max() / np.abs(want_x[f][: p[f]]).max()
            if not err <= 1000 * eps:
                print(f"frontal_solve {order} {dtype.__name__} front {f}: {err}")
                bad += 1
        # fronts split into several sweep items (pivot chunks, update items, items waiting on
        # each other), with 5 right-hand sides (two passes)
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from test_sparse import sweep_tree

        n, p, parent, fronts, rel = sweep_tree(rng, dtype)
        rhs = [np.zeros((k, 5), dtype) for k in n]
        for f in range(len(n)):
            rhs[f][: p[f]] = rng.standard_normal((p[f], 5))
        want_x = vbatch.ops.frontal.solve_reference([f.astype(np.float64) for f in fronts], p,
                                                       parent, rel, rhs)
        a = vbatch.pack(fronts, order=order)
        r = vbatch.pack([x.reshape(-1, 1).astype(dtype) for x in rel], order="F")
        x = vbatch.pack(rhs, order=order)
        a, r, x = (b.with_data(cupy.asarray(b.data)) for b in (a, r, x))
        for split in (None, 0):  # (0: the small subtrees' fronts in launches of their own)
            rt = vbatch.Runtime("cuda", kernel_options={} if split is None else {
                "sweep_split": split})
            got = rt.submit("frontal_solve", a=a, rel=r, parent=parent, npiv=p,
                            x=x.with_data(x.data.copy()), overwrite=True).result().fronts
            g = np.concatenate([got.matrix(f).get()[: p[f]].astype(np.float64)
                                for f in range(len(n))])
            w = np.concatenate([want_x[f][: p[f]] for f in range(len(n))])
            err = np.linalg.norm(g - w) / np.linalg.norm(w)
            if not err <= 10 * n.max() * eps:
                print(f"frontal_solve sweeps {order} {dtype.__name__} split {split}: {err}")
                bad += 1
        # the factor's tree launches: every size class, subtrees under chain fronts, and a
        # front that fails (test_sparse's hand-made trees)
        from test_sparse import _tree_fronts

        n, p, parent, rel, fronts = _tree_fronts(rng, dtype)
        want = vbatch.sparse.reference([f.astype(np.float64) for f in fronts], p, parent, rel)
        fronts[5][4, 4] = -1000.0  # front 5 fails at its column 5; its parent 6 and 7 vary
        # (the last: other thread grids, through the plan option tree_shapes)
        from test_sparse import _OTHER_SHAPES, _PANEL_SHAPES

        from vbatch.kernels.frontal_cuda import TREE_SHAPES

        other = [tuple(sorted(s.items())) for s in _OTHER_SHAPES]
        # (frontal_tree_smem's panel widths and warps: a column at a time, 8 and 4 swapped,
        # one warp and panels of 2)
        other += [tuple(sorted({**TREE_SHAPES, **s}.items())) for s in _PANEL_SHAPES]
        for tm, shapes in [(0, None), (32, None), (128, None)] + [(128, s) for s in other]:
            a = vbatch.pack([f.copy() for f in fronts], order=order)
            r = vbatch.pack([x.reshape(-1, 1).astype(dtype) for x in rel], order="F")
            a, r = a.with_data(cupy.asarray(a.data)), r.with_data(cupy.asarray(r.data))
            rt = vbatch.Runtime("cuda", tree_max=tm,
                                kernel_options={"tree_shapes": shapes} if shapes else {})
            res = rt.submit("frontal", a=a, rel=r, parent=parent, npiv=p,
                            overwrite=True).result()
            if not (res.info[5] == 5 and not np.delete(res.info, [5, 6, 7]).any()):
                print(f"frontal tree_max {tm} {order} {dtype.__name__}: info {res.info}")
                bad += 1
            for f in [0, 1, 2, 3, 4] + list(range(8, len(n))):
                got = np.tril(res.fronts.matrix(f).get().astype(np.float64))
                err = np.abs(got - want[f]).max() / np.abs(want[f]).max()
                if not err <= 30 * n[f] * eps:
                    print(f"frontal tree_max {tm} {order} {dtype.__name__} front {f}: {err}")
                    bad += 1
    return bad


def blas(rng, dtype) -> int:
    """Every blas-family kernel (GEMM tiles, triangle-restricted GEMM, the diagonal kernel,
    copy) in both layouts, and posv with a failing problem (the solve kernels skip it)."""
    eps = float(np.finfo(dtype).eps)
    bad = 0
    rt = vbatch.Runtime("cuda")
    # The last two reach the large DMMA tile (every dimension >= 128, K >= 128) in float64.
    shapes = [(0, 3, 2), (1, 1, 1), (31, 33, 32), (65, 64, 63), (100, 7, 129), (5, 70, 0),
              (257, 256, 130), (300, 260, 131)]
    # Every task within 32 x 32 (K past one chunk): one launch of a one-warp tile (DMMA in
    # float64, FMA in float32).
    small = [(0, 3, 2), (1, 1, 1), (31, 32, 33), (32, 17, 40), (5, 32, 0), (32, 32, 32)]
    for order in ("F", "C"):
        A = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in small]
        B = [rng.standard_normal((n, k)).astype(dtype) for m, n, k in small]
        C = [rng.standard_normal((m, n)).astype(dtype) for m, n, k in small]
        out = rt.gemm(dev(A, order), dev(B, order), dev(C, order), alpha=-1.5, beta=0.5,
                      trans_b=True).result()
        for i, (x, y, z) in enumerate(zip(A, B, C)):
            ref = -1.5 * x.astype(np.float64) @ y.T + 0.5 * z
            if not np.allclose(out.matrix(i).get(), ref, rtol=100 * eps,
                               atol=100 * eps * (1 + x.shape[1])):
                print(f"gemm small {order} problem {i}")
                bad += 1
    for order in ("F", "C"):
        A = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in shapes]
        B = [rng.standard_normal((k, n)).astype(dtype) for m, n, k in shapes]
        C = [rng.standard_normal((m, n)).astype(dtype) for m, n, k in shapes]
        a, b, c = (dev(x, order) for x in (A, B, C))
        # float64 GEMM on both kernels (FP64 tensor cores by default, and FMA), every
        # orientation of A and B (transposed views of the same buffers).
        runs = [(rt, False, False)]
        if dtype == np.float64:
            runs += [(rt, True, True), (vbatch.Runtime("cuda", fp64_gemm="fma"), False, False)]
        for r_, ta, tb in runs:
            aa = dev([x.T for x in A], order) if ta else a
            bb = dev([y.T for y in B], order) if tb else b
            out = r_.gemm(aa, bb, c, alpha=2.0, beta=-1.0, trans_a=ta, trans_b=tb).result()
            for i, (x, y, z) in enumerate(zip(A, B, C)):
                ref = 2.0 * x.astype(np.float64) @ y + -1.0 * z
                got = out.matrix(i).get()
                if not np.allclose(got, ref, rtol=100 * eps, atol=100 * eps * (1 + x.shape[1])):
                    print(f"gemm {order} ta={ta} tb={tb} {r_.config.fp64_gemm} problem {i}")
                    bad += 1
        c2 = dev([z @ z.T for z in A], order)
        s2 = rt.syr2k(a, a, c2, alpha=0.5, beta=-1.0).result()
        for i, x in enumerate(A):
            x64 = x.astype(np.float64)
            full = x64 @ x64.T
            ref = np.tril(full - full) + np.triu(full, 1)  # 0.5 (A A^T + A A^T) - C, C = A A^T
            atol = 100 * eps * (1 + x.shape[1]) * (1 + np.abs(full).max(initial=0.0))
            if not np.allclose(s2.matrix(i).get(), ref, rtol=100 * eps, atol=atol):
                print(f"syr2k {order} problem {i}")
                bad += 1
        sy = rt.syrk(a, alpha=1.0).result()
        for i, x in enumerate(A):
            ref = np.tril(x.astype(np.float64) @ x.T)
            if not np.allclose(sy.matrix(i).get(), ref, rtol=100 * eps,
                               atol=100 * eps * (1 + x.shape[1])):
                print(f"syrk {order} problem {i}")
                bad += 1
        ns = [0, 1, 31, 32, 33, 100, 40]
        T = [np.tril(rng.uniform(-1, 1, (n, n)) / max(n, 1)) + 2 * np.eye(n) for n in ns]
        R = [rng.standard_normal((n, r)) for n, r in zip(ns, (2, 1, 3, 130, 4, 5, 1))]
        t, r = dev([x.astype(dtype) for x in T], order), dev([x.astype(dtype) for x in R], order)
        # The whole-triangle solves (problems with few right-hand sides) keep X in shared
        # memory; a runtime run with the budget for it at zero (kernels are chosen at a plan's
        # first run) keeps it in global memory.
        real = blas_cuda.TRSV_SMEM
        runs = [("trsm", rt.trsm, real), ("trmm", rt.trmm, real),
                ("trsm", vbatch.Runtime("cuda").trsm, 0)]
        for side_ok, fn, budget in runs:
            blas_cuda.TRSV_SMEM = budget
            bad += _triangular(side_ok, fn, T, R, t, r, eps, f"{order} budget {budget}")
        blas_cuda.TRSV_SMEM = real
        # The diagonal kernel's code for launches whose widest block has 8, 16 and 24 rows
        # (the sizes above reach its 32-row code), with 16 right-hand sides.
        for widths in ([0, 1, 5, 8], [3, 9, 16, 12], [17, 24, 20, 2]):
            Tw = [np.tril(rng.uniform(-1, 1, (n, n)) / max(n, 1)) + 2 * np.eye(n)
                  for n in widths]
            Rw = [rng.standard_normal((n, 16)) for n in widths]
            tw, rw = (dev([x.astype(dtype) for x in y], order) for y in (Tw, Rw))
            for side_ok, fn in (("trsm", rt.trsm), ("trmm", rt.trmm)):
                bad += _triangular(side_ok, fn, Tw, Rw, tw, rw, eps, f"{order} rows {widths}")
        S = spd_list(ns, dtype, rng)
        S[5] = make_indefinite(S[5], 20)
        res = rt.posv(dev(S, order), r).result()
        for i, (s_, rr) in enumerate(zip(S, R)):
            x = res.solutions.matrix(i).get().astype(np.float64)
            if i == 5:
                ok = res.info[i] == 21 and np.array_equal(x, rr.astype(dtype))
            else:
                ok = res.info[i] == 0 and np.linalg.norm(s_ @ x - rr) <= 1e3 * eps * (
                    np.linalg.norm(s_) * np.linalg.norm(x) + np.linalg.norm(rr) + 1)
            if not ok:
                print(f"posv {order} problem {i}: info {res.info[i]}")
                bad += 1
    return bad


def registered(rng, dtype) -> int:
    """Every registered op's conformance example (vbatch.ops.op.Example, its first and last
    parameter sets) on sizes around the tiles, packed in both orders: an op registered later
    (symm) is covered without a line here. A complex ``dtype`` runs the ops whose kernels take
    it."""
    from vbatch.kernels.cuda_build import launchers
    from vbatch.ops.op import public

    eps = float(np.finfo(dtype).eps)
    sizes = [0, 1, 31, 32, 33, 70]
    bad = 0
    rt = vbatch.Runtime("cuda")
    for op in public():
        if not all(np.dtype(dtype).name in launchers()[f].DTYPES for f in op.families):
            continue
        ex = op.example(rng, sizes, dtype)
        param = {f: p for p, f in op.fields}
        for order in ("F", "C"):
            # (getrs's pivots, an operand of no matrices, go as they are)
            ops = {param.get(f, f): v if isinstance(v, Views) else
                   dev([x.astype(dtype) for x in v], order) for f, v in ex.operands.items()}
            for params in (ex.params[0], ex.params[-1]):
                res = getattr(rt, op.api.__name__)(**ops, **params).result()
                for got, want in zip(ex.outputs(res), ex.reference(ex.operands, params)):
                    for i, w in enumerate(want):
                        # (a packed output, or a list-like one: getrf's 1-D pivots)
                        g = wide((got.matrix(i) if isinstance(got, vbatch.PackedBatch) else
                                  got[i]).get())
                        err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1.0)
                        if not err <= 50 * max(sizes) * eps:
                            print(f"{op.name} {order} {params} problem {i}: {err:.2e}")
                            bad += 1
    return bad


def _triangular(kind, fn, T, R, t, r, eps, tag) -> int:
    """``fn`` (a runtime's trsm or trmm) on the packed ``t`` and ``r`` (of ``T``, ``R``), both
    transpositions, checked against float64: the count of problems wrong."""
    bad = 0
    for trans in (False, True):
        X = fn(t, r, trans_a=trans).result()
        for i, (tt, rr) in enumerate(zip(T, R)):
            op = tt.T if trans else tt
            x = X.matrix(i).get().astype(np.float64)
            res = op @ x - rr if kind == "trsm" else x - op @ rr
            den = np.linalg.norm(op) * (np.linalg.norm(x) + np.linalg.norm(rr)) or 1
            if not np.linalg.norm(res) / den <= 4 * max(len(tt), 1) * eps:
                print(f"{kind} trans={trans} {tag} problem {i}")
                bad += 1
    return bad


def dev(mats, order):
    packed = vbatch.pack([np.asarray(m) for m in mats], order=order)
    return packed.with_data(cupy.asarray(packed.data))


if __name__ == "__main__":
    sys.exit(main())
