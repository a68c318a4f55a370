"""A list of CuPy arrays written in place (``overwrite=True``) against the same batch packed:
POTRF and POSV (4 right-hand sides), float64, the list's arrays column-major views of one buffer,
inputs restored (untimed) before each call; ms, median of --reps after 3 warm-ups. ``--big``
also factors a list of 6,000 views of 1024 x 1024 (46.9 GiB) in place and checks three
residuals.

    python benchmarks/list_in_place.py [--reps 9] [--big]

For a before/after comparison run it under each tree's PYTHONPATH on one machine.
"""

from __future__ import annotations

import argparse
import time

import cupy
import numpy as np

import vbatch
from vbatch import PackedBatch
from vbatch.kernels.cuda import spd_fill
from vbatch.ops.generate import sizes

from sweep import _ms  # (the sweep's timer: synchronized, median after 3 warm-ups)

CASES = (("uniform", 32, 2000), ("uniform", 128, 2000), ("uniform", 512, 2000),
         ("skewed", 512, 2000), ("uniform", 1024, 500))


def _views(buf, m, n) -> list:
    out, at = [], 0
    for r, c in zip(m, n):
        r, c = int(r), int(c)
        out.append(buf[at:at + r * c].reshape((r, c), order="F"))
        at += r * c
    return out


def _spd(n, seed: int):
    buf = cupy.empty(int((n * n).sum()), np.float64)
    spd_fill(PackedBatch.from_buffer(buf, n=n, order="F"), seed)
    return buf


def _case(rt, n, rng, reps: int) -> tuple[float, float, float]:
    """POTRF of the list in place, of the packed batch in place, POSV of the list in place."""
    k = len(n)
    src = _spd(n, 0)
    buf = src.copy()
    mats = _views(buf, n, n)
    packed = PackedBatch.from_buffer(buf, n=n, order="F")
    rhs_src = cupy.asarray(rng.uniform(-1, 1, 4 * int(n.sum())))
    rhs = rhs_src.copy()
    bs = _views(rhs, n, np.full(k, 4))

    def restore():
        buf[...] = src
        rhs[...] = rhs_src

    return (_ms(lambda: rt.cholesky(mats, overwrite=True).result(), reps, restore),
            _ms(lambda: rt.cholesky(packed, overwrite=True).result(), reps, restore),
            _ms(lambda: rt.posv(mats, bs, overwrite=True).result(), reps, restore))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--big", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rt = vbatch.Runtime("cuda")
    for dist, nmax, k in CASES:
        t_list, t_pack, t_posv = _case(rt, sizes(dist, k, nmax, rng), rng, args.reps)
        print(f"{dist:8} {nmax:5} k {k}: cholesky list in place {t_list:8.3f} packed in place "
              f"{t_pack:8.3f} | posv list in place {t_posv:8.3f}", flush=True)
    if args.big:
        size, count = 1024, 6000
        free, total = cupy.cuda.runtime.memGetInfo()
        print(f"GPU memory {total / 2**30:.1f} GiB, free {free / 2**30:.1f} GiB; batch "
              f"{count * size * size * 8 / 2**30:.1f} GiB", flush=True)
        n = np.full(count, size)
        buf = _spd(n, 3)
        mats = _views(buf, n, n)
        probe = (0, count // 2, count - 1)
        keep = [mats[i].copy() for i in probe]
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        res = vbatch.cholesky(mats, overwrite=True).result()
        cupy.cuda.Device().synchronize()
        secs = time.perf_counter() - t
        errs = []
        for a, i in zip(keep, probe):
            f = cupy.tril(mats[i])
            errs.append(float(cupy.linalg.norm(f @ f.T - a) / cupy.linalg.norm(a)))
        print(f"{count} x {size} list in place: {secs:.3f} s, info nonzero "
              f"{int((res.info != 0).sum())}, residuals {', '.join(f'{e:.1e}' for e in errs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
