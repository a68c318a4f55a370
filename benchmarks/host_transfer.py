"""Host batches on the GPU: the link's speed against what a call on a host batch gets.

    python benchmarks/host_transfer.py [--k 100000 1000000] [--reps 5]

For k matrices of sizes U[1, 16] (float64) packed in host memory: CuPy's pageable copies up
(``cupy.asarray``) and down (``.get()``), pinned copies either way (the link), one thread's copy
into pinned memory, the backend's ``upload`` and ``download`` (pinned staging where present),
the caller's own array page-locked for one direct copy (``cudaHostRegister``, the copy,
``cudaHostUnregister``: the alternative to staging, docs/decisions.md#host-pinned-staging),
then ``cholesky`` on the device batch, on the host batch, and on the host batch in place. Median
ms of --reps after one warm-up, synchronized; GB/s of the batch's bytes.
"""

from __future__ import annotations

import argparse
import time

import cupy
import numpy as np

import vbatch
from vbatch.ops.generate import spd_packed


def _median_ms(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)


def _one(rt, k: int, reps: int, rng) -> None:
    b = rt.backend
    host = spd_packed(rng.integers(1, 17, k), np.float64, rng)
    dev = host.with_data(cupy.asarray(host.data))
    pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(host.data.nbytes), host.data.dtype,
                           host.data.size)
    d = cupy.empty_like(dev.data)
    out = np.empty_like(host.data)
    cases = {
        "up, pageable (cupy.asarray)": lambda: cupy.asarray(host.data),
        "down, pageable (.get)": lambda: dev.data.get(),
        "host copy into pinned (one thread)": lambda: np.copyto(pinned, host.data),
        "up, pinned": lambda: d.set(pinned),
        "down, pinned": lambda: d.get(out=pinned),
    }
    if hasattr(b, "upload"):
        cases.update({
            "up, backend.upload": lambda: b.upload(host.data),
            "down, backend.download (new array)": lambda: b.download(dev.data),
            "down, backend.download (into an array)": lambda: b.download(dev.data, out),
        })
    rtm = cupy.cuda.runtime
    stream = cupy.cuda.Stream(non_blocking=True)

    def registered(dst: int, src: int, a: np.ndarray, kind: int) -> None:
        # the alternative to staging: page-lock the caller's own array for one direct copy
        rtm.hostRegister(a.ctypes.data, a.nbytes, 0)
        try:
            rtm.memcpyAsync(dst, src, a.nbytes, kind, stream.ptr)
            stream.synchronize()
        finally:
            rtm.hostUnregister(a.ctypes.data)

    def down_new() -> np.ndarray:
        o = np.empty_like(host.data)
        registered(o.ctypes.data, dev.data.data.ptr, o, rtm.memcpyDeviceToHost)
        return o

    cases.update({
        "register + unregister alone": lambda: (rtm.hostRegister(host.data.ctypes.data,
                                                                 host.data.nbytes, 0),
                                                rtm.hostUnregister(host.data.ctypes.data)),
        "up, registered for the copy": lambda: registered(
            d.data.ptr, host.data.ctypes.data, host.data, rtm.memcpyHostToDevice),
        "down, registered (into an array)": lambda: registered(
            out.ctypes.data, dev.data.data.ptr, out, rtm.memcpyDeviceToHost),
        "down, registered (new array)": down_new,
    })
    cases.update({
        "cholesky, device batch": lambda: rt.cholesky(dev).result(),
        "cholesky, host batch": lambda: rt.cholesky(host).result(),
        "cholesky, host batch, in place": lambda: rt.cholesky(host, overwrite=True).result(),
    })
    gb = host.data.nbytes / 1e9
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    print(f"k = {k}, {host.data.nbytes / 2**20:.0f} MiB, {name}")
    for case, fn in cases.items():
        ms = _median_ms(fn, reps)
        print(f"  {case:40s} {ms:9.2f} ms {gb / ms * 1e3:7.1f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rt = vbatch.Runtime("cuda")
    for k in args.k:
        _one(rt, k, args.reps, rng)


if __name__ == "__main__":
    main()
