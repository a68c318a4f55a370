"""The first call of a fresh process on a fresh install: ``import vbatch``, then the first
POTRF of a list of CuPy arrays, the first TRSM and the first GEMM, each process started with an
empty CuPy kernel cache (``$CUPY_CACHE_DIR``), as on a machine where nothing was compiled yet;
and what was compiled on the way (the files the cache gained: each an NVRTC run). Seconds,
one line per process.

    python benchmarks/first_call.py [--runs 3] [--k 2000] [--nmax 256] [--demo]

Run it under the install being measured (``PYTHONPATH`` or a virtual environment); ``--demo``
also times ``python -m vbatch demo --device cuda`` in a fresh process and cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import vbatch
t1 = time.perf_counter()
import cupy, numpy as np
from vbatch.ops.generate import spd_list
k, nmax = int(sys.argv[1]), int(sys.argv[2])
n = np.random.default_rng(0).integers(1, nmax + 1, k)
mats = [cupy.asarray(a) for a in spd_list(n, np.float64, np.random.default_rng(1))]
cupy.cuda.Device().synchronize()
out = {"import": t1 - t0}
for op, call in (("cholesky", lambda: vbatch.cholesky(mats)),
                 ("trsm", lambda: vbatch.trsm(mats[:10], mats[:10])),
                 ("gemm", lambda: vbatch.gemm(mats[:10], mats[:10]))):
    t = time.perf_counter()
    call().result()
    out[op] = time.perf_counter() - t
t = time.perf_counter()
vbatch.cholesky(mats).result()
out["cholesky again"] = time.perf_counter() - t
print(json.dumps(out))
"""


def _fresh(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run ``cmd`` with an empty CuPy kernel cache: its result, wall seconds, files compiled."""
    with tempfile.TemporaryDirectory(prefix="vbatch-cupy-cache-") as cache:
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True,
                           env=dict(os.environ, CUPY_CACHE_DIR=cache))
        secs = time.perf_counter() - t0
        return p, secs, sum(1 for f in Path(cache).rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--k", type=int, default=2000)
    ap.add_argument("--nmax", type=int, default=256)
    ap.add_argument("--demo", action="store_true")
    args = ap.parse_args(argv)
    for _ in range(args.runs):
        p, secs, compiled = _fresh([sys.executable, "-c", CHILD, str(args.k), str(args.nmax)])
        if p.returncode:
            sys.stderr.write(p.stdout + p.stderr)
            return 1
        times = json.loads(p.stdout.splitlines()[-1])
        print(" ".join(f"{k} {v:.3f}" for k, v in times.items())
              + f" | process {secs:.2f} | NVRTC files {compiled}", flush=True)
    if args.demo:
        p, secs, compiled = _fresh([sys.executable, "-m", "vbatch", "demo", "--device", "cuda"])
        print(f"demo: exit {p.returncode}, {secs:.2f} s, NVRTC files {compiled}")
        if p.returncode:
            sys.stderr.write(p.stdout + p.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
