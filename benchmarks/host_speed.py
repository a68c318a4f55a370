"""Host-side speed: planning time, and the CPU backend against numpy, one matrix at a time.

    python benchmarks/host_speed.py [--reps 15]

Planning: k = 5,000 sizes uniform on [1, 512], both policies, nb 32 and 64, full and partial.
CPU backend: k = 2,000 uniform on [1, 128], float64, packed batch prepared beforehand, against
``numpy.linalg.cholesky`` called once per matrix. The two are run alternately, so that a slow
patch of a shared machine hits both; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import vbatch
from vbatch.ops.generate import sizes, spd_list
from vbatch.scheduler import make_plan


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
                    return make_plan(n, p, nb=nb, policy=policy, fused_max_rows=512)

                plan = plan_once()
                ms = median_ms(plan_once, reps)
                rows.append(dict(policy=policy, nb=nb, npiv=label, ms=ms,
                                 launches=len(plan.launches)))
    return rows


def cpu_backend(reps: int) -> list[dict]:
    rng = np.random.default_rng(1)
    ns = sizes("uniform", 2000, 128, rng)
    mats = spd_list(ns, np.float64, rng)
    packed = vbatch.pack(mats)
    rows = []
    for nb in (None, 32, 64, 128):
        rt = vbatch.Runtime("cpu", **({} if nb is None else {"nb": nb}))
        rt.cholesky(packed).result()  # plan cached on the batch, as in repeated use
        tv, tn = [], []
        for _ in range(reps):
            tv.append(median_ms(lambda rt=rt: rt.cholesky(packed).result(), 1))
            tn.append(median_ms(lambda: [np.linalg.cholesky(a) for a in mats], 1))
        v, ref = float(np.median(tv)), float(np.median(tn))
        rows.append(dict(nb=rt.plan(packed).nb, default=nb is None, vbatch_ms=v, numpy_loop_ms=ref,
                         ratio=v / ref))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    plans = planning(args.reps)
    print("planning, k = 5000, uniform Nmax = 512 (median ms)")
    for r in plans:
        print(f"  {r['policy']} nb={r['nb']:<3} {r['npiv']:<7} {r['ms']:7.2f} ms  "
              f"{r['launches']:4d} launches")
    cpu = cpu_backend(max(5, args.reps // 2))
    print("CPU backend, k = 2000, uniform Nmax = 128, float64 (median ms)")
    for r in cpu:
        tag = " (default)" if r["default"] else ""
        print(f"  nb={r['nb']:<3}{tag:<10} vbatch {r['vbatch_ms']:7.1f}  numpy loop "
              f"{r['numpy_loop_ms']:7.1f}  ratio {r['ratio']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"planning": plans, "cpu_backend": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
