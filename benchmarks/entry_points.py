"""Every entry point a user takes, timed side by side: a list of arrays, a column-major pack, a
row-major pack, for POTRF, GEMM, TRSM and POSV on the harness's size distributions; and the host
time of one packed call.

    python benchmarks/entry_points.py [--nmax 32 128 512] [--dist uniform skewed] [--reps 7]
                                      [--ops ...] [--forms list packedF packedC] [--json FILE]

For a before/after comparison of two trees on one GPU, run it under each tree's PYTHONPATH one
right after the other (``--tag`` names the tree in the JSON) and compare the medians (METHOD.md:
same process order, medians, ratios). It uses only API that every tree of the project has.

Cases: k = 2000 problems (500 at Nmax >= 512), sizes drawn with ``ops/generate.py``'s
distributions; GEMM m, n, k each drawn; TRSM 16 right-hand sides; POSV one. float64, data on the
GPU. ``ms``: the call and ``result()``, synchronized, median of --reps after --warmup calls.
``host_us``: the time to issue one packed column-major call (nothing synchronized inside it),
median over --reps x 20 calls, each followed by a synchronization outside the timed span.
"""

from __future__ import annotations

import argparse
import json
import time

import cupy
import numpy as np

import vbatch
from vbatch.ops.generate import sizes, spd

FORMS = ("list", "packedF", "packedC")
OPS = ("potrf", "gemm", "trsm", "posv")


def _sync():
    cupy.cuda.get_current_stream().synchronize()


def _median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
        _sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def _host_us(fn, reps):
    ts = []
    for _ in range(reps * 20):
        t0 = time.perf_counter()
        fut = fn()
        ts.append(time.perf_counter() - t0)
        fut.result()
    return float(np.median(ts) * 1e6)


def _operands(op, n, rng):
    """Host float64 operands of one case: field -> list of arrays."""
    if op == "potrf":
        return {"mats": [spd(int(x), np.float64, rng) for x in n]}
    if op == "gemm":
        k = rng.permutation(n)
        m = rng.permutation(n)
        return {"a": [rng.uniform(-1, 1, (int(i), int(j))) for i, j in zip(m, k)],
                "b": [rng.uniform(-1, 1, (int(j), int(i))) for i, j in zip(n, k)]}
    if op == "trsm":
        a = [np.tril(rng.uniform(-1, 1, (int(x), int(x))) / max(int(x), 1)) + 2 * np.eye(int(x))
             for x in n]
        return {"a": a, "b": [rng.uniform(-1, 1, (int(x), 16)) for x in n]}
    if op == "posv":
        return {"a": [spd(int(x), np.float64, rng) for x in n],
                "b": [rng.uniform(-1, 1, (int(x), 1)) for x in n]}
    raise KeyError(op)


def _form(mats, form):
    if form == "list":
        return [cupy.asarray(a) for a in mats]
    packed = vbatch.pack(mats, order=form[-1])
    return packed.with_data(cupy.asarray(packed.data))


def _call(rt, op, ops):
    if op == "potrf":
        return rt.cholesky(ops["mats"])
    if op == "gemm":
        return rt.gemm(ops["a"], ops["b"])
    return getattr(rt, op)(ops["a"], ops["b"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nmax", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--dist", nargs="+", default=["uniform", "skewed"])
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before each median")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--tag", default="")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rt = vbatch.Runtime("cuda")
    rows = []
    for dist in args.dist:
        for nmax in args.nmax:
            rng = np.random.default_rng(args.seed + nmax)
            n = sizes(dist, 500 if nmax >= 512 else 2000, nmax, rng)
            for op in args.ops:
                host = _operands(op, n, rng)
                row = {"op": op, "dist": dist, "nmax": nmax, "k": len(n)}
                for form in args.forms:
                    ops = {f: _form(v, form) for f, v in host.items()}
                    row[form] = _median_ms(lambda op=op, ops=ops: _call(rt, op, ops).result(),
                                           args.reps, args.warmup)
                    if form == "packedF":
                        row["host_us"] = _host_us(lambda op=op, ops=ops: _call(rt, op, ops),
                                                  args.reps)
                rows.append(row)
                print(f"{op:6} {dist:8} {nmax:5} " + " ".join(
                    f"{f} {row[f]:8.3f}" for f in args.forms)
                    + f"  host {row.get('host_us', float('nan')):6.1f} us",
                    flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"tag": args.tag, "device": cupy.cuda.runtime.getDeviceProperties(0)[
                "name"].decode(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
