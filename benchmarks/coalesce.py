"""Throughput of one-problem submissions from many threads, coalesced against not.

Each of ``--threads`` threads plays a task of a task runtime: it submits one small problem
(``cholesky`` or ``posv`` of one matrix), waits for its result, and goes on with the next, ``--per``
times. The same draw of matrices runs on a runtime without coalescing and on one with
``coalesce_us=--window``; each mode runs ``--rounds`` times, alternating, and the medians are
compared. Printed: problems per second, launch groups, and the ratio.

    python benchmarks/coalesce.py --device cuda --threads 64 --per 20 --nmax 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

import vbatch
from vbatch.ops.generate import sizes as draw_sizes
from vbatch.ops.generate import spd


def run_mode(rt, op, mats, rhs, threads, per):
    """Seconds for ``threads`` threads to submit-and-wait ``per`` problems each."""
    start = threading.Barrier(threads + 1)
    errors = []

    def task(t):
        start.wait()
        try:
            for j in range(per):
                i = t * per + j
                if op == "posv":
                    r = rt.posv([mats[i]], [rhs[i]]).result()
                else:
                    r = rt.cholesky([mats[i]]).result()
                if r.info[0] != 0:
                    raise RuntimeError(f"problem {i}: info {r.info[0]}")
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    ts = [threading.Thread(target=task, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return dt


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--op", choices=("cholesky", "posv"), default="cholesky")
    p.add_argument("--threads", type=int, default=64)
    p.add_argument("--per", type=int, default=20, help="problems per thread")
    p.add_argument("--nmax", type=int, default=32)
    p.add_argument("--dist", default="uniform")
    p.add_argument("--window", type=float, default=200.0, help="coalesce_us")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--out")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    count = a.threads * a.per
    ns = draw_sizes(a.dist, count, a.nmax, rng)
    dt = np.dtype(a.dtype)
    mats = [spd(int(n), dt, rng) for n in ns]
    rhs = [rng.standard_normal((int(n), 1)).astype(dt) for n in ns]
    if a.device in ("cuda", "auto") and vbatch.cuda_status()[0]:
        import cupy

        mats = [cupy.asarray(m) for m in mats]
        rhs = [cupy.asarray(b) for b in rhs]
    plain = vbatch.Runtime(a.device)
    merged = vbatch.Runtime(a.device, coalesce_us=a.window)
    # Warm both (kernels, plans for one-problem calls) before timing.
    run_mode(plain, a.op, mats, rhs, min(a.threads, 4), 2)
    run_mode(merged, a.op, mats, rhs, min(a.threads, 4), 2)
    times = {"plain": [], "coalesced": []}
    groups = []
    for _ in range(a.rounds):
        times["plain"].append(run_mode(plain, a.op, mats, rhs, a.threads, a.per))
        g0 = merged._coalescer.groups
        times["coalesced"].append(run_mode(merged, a.op, mats, rhs, a.threads, a.per))
        groups.append(merged._coalescer.groups - g0)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "device": plain.device, "op": a.op, "threads": a.threads, "per": a.per,
        "problems": count, "nmax": a.nmax, "dist": a.dist, "dtype": a.dtype,
        "window_us": a.window, "seconds": times, "median_s": med,
        "problems_per_s": {k: count / v for k, v in med.items()},
        "launch_groups_coalesced": groups, "submissions_plain": count,
        "speedup": med["plain"] / med["coalesced"],
    }
    print(f"{a.op} on {plain.device}: {count} one-problem submissions from {a.threads} threads, "
          f"sizes {a.dist}[1, {a.nmax}], {a.dtype}")
    print(f"  plain      {med['plain'] * 1e3:9.2f} ms  {count / med['plain']:10.0f} problems/s  "
          f"({count} submissions)")
    print(f"  coalesced  {med['coalesced'] * 1e3:9.2f} ms  {count / med['coalesced']:10.0f} "
          f"problems/s  ({statistics.median(groups):.0f} launch groups, window {a.window} us)")
    print(f"  speedup {res['speedup']:.1f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    plain.close()
    merged.close()
    return res


if __name__ == "__main__":
    main()
