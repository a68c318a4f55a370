"""Side-by-side batched Cholesky on a GPU: vbatch against what a user can pick today.

    python benchmarks/cuda_potrf.py [--out DIR] [--dtype float64 float32] [--dist ...]
                                    [--nmax ...] [--reps 5] [--methods ...] [--magma LIB]

Same process, same inputs for every method (the anchors' method, ../shared/anchors/README.md):

* vbatch      ``Runtime("cuda").cholesky(packed)``, the packed batch prepared beforehand;
* vbatch-list the list-of-arrays path (one gather kernel packs it, factors come back as views);
* pad         padded to Nmax (identity padding), cuSOLVER potrfBatched (cupy.linalg.cholesky);
* bucket32    padded within 32-wide size buckets, one potrfBatched per bucket;
* streams     one cuSOLVER call per matrix, round-robin over 16 streams;
* torch       torch.linalg.cholesky_ex on the padded batch (when torch imports);
* magma       MAGMA's magma_Xpotrf_vbatched_max_nocheck on a copy of the packed batch, in place
              (only with --magma PATH, or $VBATCH_MAGMA: libmagma_vb.so, built by
              ``bash .magma/build.sh``, ../shared/anchors/magma/README.md); benchmarks/magma.py
              binds it. Its device metadata is built once beforehand; the input is restored
              (untimed) before each call;
* floor       max(bytes / BW, flops / peak): lower triangle read and written once, BW and peak
              (DGEMM/SGEMM) measured in this run.

Time: wall clock of the call with the data on the GPU, synchronized, median of --reps after
four warm-up calls (WARMUP). vbatch's host overhead (host time to issue a call plus host time
in ``result()`` after the GPU finished) and its GPU span (events around the call) are reported
too. Every method's output is checked on a sample of matrices. Writes results.json and
gflops.png to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import cupy
import numpy as np

import vbatch
from vbatch.runtime.trace import ceilings
from vbatch.kernels.cuda import spd_fill
from vbatch.ops.cholesky import cholesky_flops, residual
from vbatch.ops.generate import sizes

METHODS = ["vbatch", "vbatch-list", "pad", "bucket32", "streams", "torch", "magma"]
ANCHORS = ["pad", "bucket32", "streams", "torch", "magma"]
PADDED = ["pad", "bucket32", "streams", "torch"]  # the anchors timed together, or none of them


def sync():
    cupy.cuda.get_current_stream().synchronize()


# Warm-up calls before the timed ones: the steady state of a repeated call. vbatch captures its
# CUDA graph on a plan's second call and, for plans of a few launches, a graph per pointer table
# seen twice (kernels/cuda.py: a repeated call alternates two output buffers), so its fourth
# call is the first in the steady state; every method gets the same warm-up.
WARMUP = 4


def timed(fn, reps: int, before=None) -> tuple[float, list]:
    """Median wall-clock ms of fn() + synchronize, after WARMUP warm-up calls.

    ``before`` (untimed): called, then synchronized, ahead of every call, the warm-ups too; for
    methods that overwrite their input (MAGMA factors in place)."""
    for _ in range(WARMUP):
        if before is not None:
            before()
            sync()
        out = fn()
        sync()
    ts = []
    for _ in range(reps):
        if before is not None:
            before()
            sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts)), out


def make_batch(n: np.ndarray, dtype, seed: int) -> vbatch.PackedBatch:
    ld = np.maximum(n, 1)
    off = np.r_[0, np.cumsum(ld * n)[:-1]].astype(np.int64)
    data = cupy.empty(int((ld * n).sum()), dtype=dtype)
    batch = vbatch.PackedBatch.from_buffer(data, n, off, ld, order="F")
    return spd_fill(batch, seed)


def padded(batch: vbatch.PackedBatch, idx: np.ndarray, size: int):
    """Matrices idx of the batch in a (len(idx), size, size) array, identity padding."""
    from vbatch.kernels.cuda import CudaBackend

    out = cupy.zeros((len(idx), size, size), dtype=batch.dtype)
    views = [out[i] for i in range(len(idx))]
    sub = vbatch.PackedBatch.from_buffer(batch.data, batch.n[idx], batch.offset[idx],
                                         batch.ld[idx], order=batch.order)
    CudaBackend().scatter(sub, views)
    diag = cupy.arange(size)
    pad = cupy.asarray(batch.n[idx])[:, None] <= diag[None, :]
    out[:, diag, diag] += pad.astype(out.dtype)
    return out


def check(batch_host, getter, sample, dtype) -> float:
    """Worst normwise residual over the sampled problems, NaN counts as failure (inf)."""
    worst = 0.0
    for i in sample:
        n = int(batch_host.n[i])
        f = getter(i)
        f = f.get() if hasattr(f, "get") else np.asarray(f)
        r = residual(batch_host.matrix(i), np.tril(f[:n, :n]))
        worst = max(worst, r if np.isfinite(r) else math.inf)
    return worst


def run_config(dist, nmax, dtype, reps, rng, ceil, rt, torch, methods=METHODS,
               magma=None) -> dict:
    k = 500 if nmax >= 1024 else 2000
    n = sizes(dist, k, nmax, rng)
    batch = make_batch(n, dtype, seed=int(rng.integers(2**63)))
    host = batch.with_data(batch.data.get())
    sample = rng.choice(k, size=min(8, k), replace=False).tolist() + [int(np.argmax(n))]
    flops = float(cholesky_flops(n).sum())
    isz = np.dtype(dtype).itemsize
    byts = float((n * (n + 1) // 2).sum()) * 2 * isz
    floor = max(byts / ceil["bw"], flops / ceil["peak"][np.dtype(dtype).name]) * 1e3
    res = {"dist": dist, "nmax": nmax, "k": k, "dtype": np.dtype(dtype).name, "gflop": flops / 1e9,
           "floor_ms": floor, "ms": {}, "resid": {}}

    # vbatch, packed (plan and device metadata are cached on the batch after the warm-up)
    ms, out = timed(lambda: rt.cholesky(batch).result(), reps)
    res["ms"]["vbatch"] = ms
    res["resid"]["vbatch"] = check(host, lambda i: out.factors.matrix(i), sample, dtype)
    res["info_nonzero"] = int(np.count_nonzero(out.info))
    res["plan"] = out.plan.summary()
    # Host overhead and GPU span of the packed call: warmed up like the timed calls, since a
    # loop that keeps its last future alive sees new output buffers, whose first calls capture
    # a graph (kernels/cuda.py's fixed tables): with 5 unwarmed calls the median caught those
    # (0.06-0.2 ms "host" for calls of 0.04-0.05 ms, H100, 2026-11-25). More calls than
    # --reps: each is short.
    hosts, spans = [], []
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for it in range(WARMUP + max(reps, 25)):
        sync()
        t0 = time.perf_counter()
        start.record()
        fut = rt.cholesky(batch)
        stop.record()
        t1 = time.perf_counter()
        fut.completion().event.synchronize()
        t2 = time.perf_counter()
        fut.result()
        t3 = time.perf_counter()
        if it >= WARMUP:
            hosts.append((t1 - t0 + t3 - t2) * 1e3)
            spans.append(cupy.cuda.get_elapsed_time(start, stop))
    res["host_ms"] = float(np.median(hosts))
    res["gpu_ms"] = float(np.median(spans))

    # vbatch, list of device arrays (gathered by one kernel)
    if "vbatch-list" in methods:
        views = batch.unpack()
        ms, out = timed(lambda: rt.cholesky(views).result(), reps)
        res["ms"]["vbatch-list"] = ms
        res["resid"]["vbatch-list"] = check(host, lambda i: out.factors[i], sample, dtype)

    # MAGMA vbatched, in place on its own copy of the batch, restored (untimed) before each call
    if magma is not None and "magma" in methods:
        src = cupy.asarray(host.data)
        mb = vbatch.PackedBatch.from_buffer(src.copy(), batch.n, batch.offset, batch.ld,
                                            order=batch.order)
        call = magma.prepare_potrf(mb)

        def restore():
            cupy.copyto(mb.data, src)
            call.info.fill(0)

        ms, info = timed(lambda: magma.potrf_vbatched(call), reps, before=restore)
        res["ms"]["magma"] = ms
        res["resid"]["magma"] = check(host, lambda i: mb.matrix(i), sample, dtype)
        res["magma_info_nonzero"] = int(cupy.count_nonzero(info))
        res["magma_fused"] = int(n.max()) <= magma.potrf_crossover(dtype)
        del src, mb, call, info
    if not set(methods) & set(PADDED):
        return res

    # pad to Nmax + potrfBatched
    pad = padded(batch, np.arange(k), nmax)
    ms, out = timed(lambda: cupy.linalg.cholesky(pad), reps)
    res["ms"]["pad"] = ms
    res["resid"]["pad"] = check(host, lambda i: out[i], sample, dtype)
    # torch on the same padded array
    if torch is not None:
        tp = torch.from_dlpack(pad)
        ms, tout = timed(lambda: torch.linalg.cholesky_ex(tp)[0], reps)
        res["ms"]["torch"] = ms
        res["resid"]["torch"] = check(host, lambda i: tout[i].cpu().numpy(), sample, dtype)

    # 32-wide buckets
    bucket = (n + 31) // 32
    groups = [(b, np.flatnonzero(bucket == b)) for b in np.unique(bucket)]
    pads = [(padded(batch, idx, 32 * int(b)), idx) for b, idx in groups]
    ms, outs = timed(lambda: [cupy.linalg.cholesky(p) for p, _ in pads], reps)
    res["ms"]["bucket32"] = ms
    where = {int(i): (g, j) for g, (_, idx) in enumerate(pads) for j, i in enumerate(idx)}
    res["resid"]["bucket32"] = check(host, lambda i: outs[where[i][0]][where[i][1]], sample,
                                     dtype)

    # one cuSOLVER call per matrix over 16 streams
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(16)]
    mats = [batch.matrix(i) for i in range(k)]

    def per_matrix():
        outs = []
        for i, m in enumerate(mats):
            with streams[i % 16]:
                outs.append(cupy.linalg.cholesky(m))
        for s in streams:
            s.synchronize()
        return outs

    ms, outs = timed(per_matrix, max(1, min(reps, 3)))
    res["ms"]["streams"] = ms
    res["resid"]["streams"] = check(host, lambda i: outs[i], sample, dtype)
    return res


def shown(results: list[dict]) -> list[str]:
    """The methods to show: all of METHODS, but magma only where it ran."""
    return [m for m in METHODS if m != "magma" or any(m in r["ms"] for r in results)]


def table(results: list[dict]) -> str:
    cols = shown(results)
    label = {"vbatch-list": "list"}
    head = (f"{'dtype':<8}{'dist':<8}{'Nmax':>5} {'floor':>7} "
            + " ".join(f"{label.get(m, m):>8}" for m in cols)
            + f" {'best anchor':>16} {'speedup':>7} {'xfloor':>6} {'host':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        ms = r["ms"]
        anchors = {m: ms[m] for m in ANCHORS if m in ms}
        best = min(anchors, key=anchors.get) if anchors else None
        cells = " ".join(f"{ms[m]:8.3f}" if m in ms else f"{'-':>8}" for m in cols)
        vs = (f"{best + ' ' + format(anchors[best], '.3f'):>16} "
              f"{anchors[best] / ms['vbatch']:7.1f}" if best else f"{'-':>16} {'-':>7}")
        lines.append(
            f"{r['dtype']:<8}{r['dist']:<8}{r['nmax']:>5} {r['floor_ms']:7.3f} {cells} "
            f"{vs} {ms['vbatch'] / r['floor_ms']:6.1f} {r['host_ms']:6.3f}"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in results}, reverse=True)
    dists = [d for d in ("uniform", "gauss", "skewed") if any(r["dist"] == d for r in results)]
    fig, axes = plt.subplots(len(dtypes), len(dists), figsize=(5 * len(dists), 4 * len(dtypes)),
                             squeeze=False)
    for a, dt in enumerate(dtypes):
        for b, dist in enumerate(dists):
            ax = axes[a][b]
            rs = sorted((r for r in results if r["dtype"] == dt and r["dist"] == dist),
                        key=lambda r: r["nmax"])
            x = [r["nmax"] for r in rs]
            for m in shown(results) + ["floor"]:
                y = [r["gflop"] / ((r["floor_ms"] if m == "floor" else r["ms"].get(m, math.nan))
                                   * 1e-3) for r in rs]
                ax.plot(x, y, "k--" if m == "floor" else "o-", label=m)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{dist}, {dt}")
            ax.set_xlabel("Nmax")
            ax.set_ylabel("GFLOP/s")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_magma(path: str):
    """benchmarks/magma.py's Magma on ``path`` (loaded by file: benchmarks/ is no package)."""
    import importlib.util
    import sys

    name = "vbatch_bench_magma"
    mod = sys.modules.get(name)
    if mod is None:
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(name, os.path.join(here, "magma.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # before running it: dataclasses look their module up there
        spec.loader.exec_module(mod)
    return mod.Magma(path)


def magma_meta(magma) -> dict:
    """Which MAGMA ran: the library, its version, the commit extract.sh recorded beside it."""
    meta = {"lib": os.path.abspath(magma.path), "version": magma.version(),
            "routine": "magma_Xpotrf_vbatched_max_nocheck (uplo L, ldda = n)",
            "crossover": {dt: magma.potrf_crossover(dt) for dt in ("float64", "float32")}}
    src = os.path.join(os.path.dirname(os.path.abspath(magma.path)), "..", "src")
    for key, fname in (("commit", "MAGMA_COMMIT"), ("describe", "MAGMA_DESCRIBE")):
        try:
            with open(os.path.join(src, fname)) as f:
                meta[key] = f.read().strip()
        except OSError:
            pass
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    ap.add_argument("--dist", nargs="+", default=["uniform", "gauss", "skewed"])
    ap.add_argument("--nmax", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS,
                    help="what to time (default all; vbatch always; pad, bucket32, streams and "
                         "torch together or not at all; magma needs --magma)")
    ap.add_argument("--magma", default=os.environ.get("VBATCH_MAGMA") or None, metavar="PATH",
                    help="libmagma_vb.so (default $VBATCH_MAGMA): adds the magma method")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    if args.methods is not None and "magma" in args.methods and not args.magma:
        ap.error("--methods magma needs --magma PATH (or VBATCH_MAGMA)")
    methods = args.methods or METHODS
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch
    except ImportError:
        torch = None
    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    ceil = ceilings("cuda")
    print(f"{name}: copy {ceil['bw'] / 1e12:.2f} TB/s, DGEMM {ceil['peak']['float64'] / 1e12:.1f}"
          f" TFLOP/s, SGEMM {ceil['peak']['float32'] / 1e12:.1f} TFLOP/s", flush=True)
    rt = vbatch.Runtime("cuda")
    magma = load_magma(args.magma) if args.magma and "magma" in methods else None
    rng = np.random.default_rng(args.seed)
    results = []
    t0 = time.time()
    for dt in args.dtype:
        for dist in args.dist:
            for nmax in args.nmax:
                r = run_config(dist, nmax, np.dtype(dt), args.reps, rng, ceil, rt, torch,
                               methods, magma)
                results.append(r)
                bad = {m: v for m, v in r["resid"].items() if not v < 1e-3}
                mg = (f", magma {r['ms']['magma']:.3f} ms (info != 0: "
                      f"{r['magma_info_nonzero']})" if "magma" in r["ms"] else "")
                print(f"  {dt} {dist} {nmax}: vbatch {r['ms']['vbatch']:.3f} ms "
                      f"(host {r['host_ms']:.3f}, gpu {r['gpu_ms']:.3f}){mg}"
                      + (f" BAD RESIDUAL {bad}" if bad else ""), flush=True)
    print(table(results))
    meta = {"device": name, "ceilings": ceil, "cupy": cupy.__version__,
            "torch": getattr(torch, "__version__", None), "reps": args.reps,
            "elapsed_s": time.time() - t0,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if magma is not None:
        meta["magma"] = magma_meta(magma)
        magma.close()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    if not args.no_plot:
        plot(results, os.path.join(args.out, "gflops.png"))
    print(f"wrote {args.out}/results.json" + ("" if args.no_plot else " and gflops.png"))


if __name__ == "__main__":
    main()
