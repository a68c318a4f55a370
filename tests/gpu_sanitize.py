"""A small batch through every CUDA kernel, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck --error-exitcode 9 python tests/gpu_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python tests/gpu_sanitize.py

Covers fused (all three block shapes), update, potf2, trsm, schur, gather and scatter, in both
layouts and dtypes, full and partial, with a non-SPD matrix. Exits 1 if any result is wrong.
Not collected by pytest (no test_ prefix): the sanitizer runs it as its own process.
"""

import sys

import cupy
import numpy as np

import vbatch
from vbatch.ops.generate import make_indefinite, spd_list


def main() -> int:
    rng = np.random.default_rng(0)
    ns = [0, 1, 5, 31, 32, 33, 63, 64, 65, 100, 129, 200]
    bad = 0
    for dtype in (np.float64, np.float32):
        eps = np.finfo(dtype).eps
        mats = spd_list(ns, dtype, rng)
        mats[7] = make_indefinite(mats[7], 40)
        npiv = [min(n, int(rng.integers(0, n + 1))) for n in ns]
        for order in ("F", "C"):
            for fmr in (None, 0):
                opts = {} if fmr is None else {"fused_max_rows": fmr}
                rt = vbatch.Runtime("cuda", **opts)
                for p in (None, npiv):
                    packed = vbatch.pack(mats, order=order)
                    dev = packed.with_data(cupy.asarray(packed.data))
                    res = rt.cholesky(dev, p).result()
                    host = res.factors.with_data(res.factors.data.get())
                    for i, a in enumerate(mats):
                        if res.info[i]:
                            continue
                        r = vbatch.residual(a, host.matrix(i), None if p is None else p[i])
                        if not r <= 2 * max(ns[i], 1) * eps:
                            print(f"{dtype.__name__} {order} fmr={fmr} npiv={p is not None} "
                                  f"problem {i}: residual {r}")
                            bad += 1
                    if res.info[7] != (0 if p is not None and p[7] <= 40 else 41):
                        print(f"problem 7: info {res.info[7]}")
                        bad += 1
        work = [cupy.asarray(m) for m in mats]
        vbatch.Runtime("cuda").cholesky(work, overwrite=True).result()  # gather + scatter
    print("sanitize batch:", "ok" if not bad else f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
