"""Where a coalesced bucket's send goes: the coalescer thread's steps, stamped.

``benchmarks/coalesce.py`` gives the throughput; this says why. Each of ``--threads`` threads
submits one problem at a time (``cholesky`` of one matrix, sizes U[1, ``--nmax``]) and waits
for it, on a runtime with ``coalesce_us=--window``; the runtime's and the backend's steps are
wrapped, and their time is summed where the coalescer's own thread (``vbatch-coalesce``) runs
them (a member thread's calls pass through unstamped). Printed: throughput, buckets, and per
step its calls, total, median and largest time. Measured on the H100 (2026-11-25, 64 threads):
a bucket's send took 5.2 ms (median), of which four uploads 1.4 ms and planning 1.25 ms, where
one thread alone takes ~0.5 ms (docs/decisions.md#coalesce-buckets).

    python benchmarks/coalesce_steps.py --device cuda --threads 64 --per 20
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time

import numpy as np

import vbatch
import vbatch.runtime.coalesce as coalescing
import vbatch.runtime.runtime as runtime_mod
from coalesce import run_mode
from vbatch.ops.generate import sizes as draw_sizes
from vbatch.ops.generate import spd


def stamp(acc: dict, owner, name: str, label: str | None = None) -> None:
    """Wrap ``owner.name`` so that its time on the coalescer's thread adds to ``acc``."""
    fn = getattr(owner, name)
    label = label or f"{getattr(owner, '__name__', owner)}.{name}"

    def wrapped(*args, **kwargs):
        if threading.current_thread().name != "vbatch-coalesce":
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label].append(time.perf_counter() - t0)

    setattr(owner, name, wrapped)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=64)
    p.add_argument("--per", type=int, default=20, help="problems per thread")
    p.add_argument("--nmax", type=int, default=32)
    p.add_argument("--window", type=float, default=200.0, help="coalesce_us")
    a = p.parse_args(argv)
    acc: dict = collections.defaultdict(list)
    stamp(acc, coalescing.Coalescer, "_send_one")
    for name in ("_submit", "_plan", "_check_memory", "_execute"):
        stamp(acc, runtime_mod.Runtime, name)
    rng = np.random.default_rng(0)
    count = a.threads * a.per
    mats = [spd(int(n), np.dtype("float64"), rng) for n in draw_sizes("uniform", count,
                                                                     a.nmax, rng)]
    rt = vbatch.Runtime(a.device, coalesce_us=a.window)
    if rt.backend.kind == "cupy":
        import cupy

        import vbatch.kernels.cuda as cuda_mod

        for name in ("stage_input", "gather", "begin", "flush", "new_output", "_prepare"):
            stamp(acc, cuda_mod.CudaBackend, name)
        stamp(acc, cupy, "asarray", "cupy.asarray")
        mats = [cupy.asarray(m) for m in mats]
    run_mode(rt, "cholesky", mats, None, min(a.threads, 4), 2)  # kernels and plans warm
    acc.clear()
    g0 = rt._coalescer.groups
    dt = run_mode(rt, "cholesky", mats, None, a.threads, a.per)
    print(f"{rt.device}: {count / dt:.0f} problems/s, {rt._coalescer.groups - g0} buckets, "
          f"{dt * 1e3:.0f} ms ({a.threads} threads, window {a.window} us)")
    print("step (on the coalescer's thread)         calls   total ms  median us     max us")
    for k, v in sorted(acc.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {k:38s} {len(v):5d} {sum(v) * 1e3:10.1f} {statistics.median(v) * 1e6:10.1f} "
              f"{max(v) * 1e6:10.0f}")
    rt.close()


if __name__ == "__main__":
    main()
