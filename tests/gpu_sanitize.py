"""A small batch through every CUDA kernel, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck --error-exitcode 9 python tests/gpu_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python tests/gpu_sanitize.py

Covers fused (several block shapes), update, potf2, trsm, schur, gather and scatter, in both
layouts and dtypes, full and partial, with a non-SPD matrix (its failed panel completes its
leading columns in the fused kernel, and in potf2_step + trsm_step when separated) and an infinite
pivot. Exits 1 if any result is wrong. Not collected by pytest (no test_ prefix): the sanitizer
runs it as its own process.
"""

import sys

import cupy
import numpy as np

import vbatch
from vbatch.ops.generate import make_indefinite, spd_list

BAD, INF = 7, 9  # problem indices: indefinite at column 40, +inf pivot at column 50


def main() -> int:
    rng = np.random.default_rng(0)
    ns = [0, 1, 5, 31, 32, 33, 63, 64, 65, 100, 129, 200]
    bad = 0
    for dtype in (np.float64, np.float32):
        eps = np.finfo(dtype).eps
        mats = spd_list(ns, dtype, rng)
        mats[BAD] = make_indefinite(mats[BAD], 40)
        mats[INF][50, 50] = np.inf
        npiv = [min(n, int(rng.integers(0, n + 1))) for n in ns]
        npiv[BAD] = ns[BAD]
        for order in ("F", "C"):
            for fmr in (None, 0):
                opts = {} if fmr is None else {"fused_max_rows": fmr}
                rt = vbatch.Runtime("cuda", **opts)
                for p in (None, npiv):
                    packed = vbatch.pack(mats, order=order)
                    dev = packed.with_data(cupy.asarray(packed.data))
                    res = rt.cholesky(dev, p).result()
                    host = res.factors.with_data(res.factors.data.get())
                    tag = f"{dtype.__name__} {order} fmr={fmr} npiv={p is not None}"
                    for i, a in enumerate(mats):
                        f = host.matrix(i).astype(np.float64)
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
                            # The columns before the failing one hold the partial factor.
                            k = int(res.info[i]) - 1
                            a64 = a.astype(np.float64)
                            sym = np.tril(a64) + np.tril(a64, -1).T
                            err = np.linalg.norm(sym[:, :k] - f[:, :k] @ f[:k, :k].T)
                            r = err / np.linalg.norm(sym)
                        else:
                            r = vbatch.residual(a, f, None if p is None else p[i])
                        if not r <= 2 * max(ns[i], 1) * eps:
                            print(f"{tag} problem {i}: residual {r}")
                            bad += 1
                    if res.info[BAD] != 41:
                        print(f"{tag} problem {BAD}: info {res.info[BAD]}")
                        bad += 1
        work = [cupy.asarray(m) for m in mats]
        vbatch.Runtime("cuda").cholesky(work, overwrite=True).result()  # gather + scatter
    print("sanitize batch:", "ok" if not bad else f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
