"""Host time of one repeated packed call, steady state: issue (the call until it returns) and
call (issue, then ``result()``), medians of rounds of calls after warm-up calls.

    python benchmarks/host_call.py [--op potrf|gemm] [--nmax 32] [--k 2000] [--rounds 3]

float64 SPD matrices of sizes uniform on [1, Nmax], packed column-major, on the GPU. For a
before/after comparison run it under each tree's PYTHONPATH, alternating, on one machine.
"""

from __future__ import annotations

import argparse
import time

import cupy
import numpy as np

import vbatch
from vbatch.ops.generate import sizes, spd_packed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="potrf", choices=["potrf", "gemm"])
    ap.add_argument("--nmax", type=int, default=32)
    ap.add_argument("--k", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rt = vbatch.Runtime("cuda")
    g = spd_packed(sizes("uniform", args.k, args.nmax, np.random.default_rng(0)))
    g = g.with_data(cupy.asarray(g.data))
    fn = (lambda: rt.cholesky(g)) if args.op == "potrf" else (lambda: rt.gemm(g, g))
    for _ in range(args.warmup):
        fn().result()
    for _ in range(args.rounds):
        issue, call = [], []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            f = fn()
            t1 = time.perf_counter()
            f.result()
            t2 = time.perf_counter()
            issue.append(t1 - t0)
            call.append(t2 - t0)
        print(f"{args.op} Nmax {args.nmax}: issue {np.median(issue) * 1e6:.1f} us, "
              f"call {np.median(call) * 1e6:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
