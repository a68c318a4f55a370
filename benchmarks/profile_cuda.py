"""Where the time goes on the GPU: host costs, per-launch kernel times, the crossover.

    python benchmarks/profile_cuda.py host
    python benchmarks/profile_cuda.py launches --dist uniform --nmax 512 [--fused-max-rows N]
    python benchmarks/profile_cuda.py crossover --nmax 512 1024 --values 0 128 256 512
    python benchmarks/profile_cuda.py listpath
    python benchmarks/profile_cuda.py ops --cases trsm512 gemm-square512 [--dtype float32]
    python benchmarks/profile_cuda.py floor --cells potrf:uniform:32 trsm:uniform:8 [--magma LIB]

``launches`` runs a plan one launch at a time, each between two events with the device idle
before it, and prints each kernel's time, rate and distance from its own roofline floor (bytes
it must move at the measured copy bandwidth, flops at the measured DGEMM/SGEMM rate). ``ops``
does the same for the BLAS ops on the cases of ``cuda_blas.py`` (same shapes and draw), per
launch and summed per kernel. ``floor`` splits a small call of the sweep's cells (same draw) into
what the host spends before the call returns, what the GPU spends on its graph, and what a bare
graph of one empty kernel costs, to tell the host's share of a call from the kernels'.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import cupy
import numpy as np

import vbatch
from vbatch.ops.cholesky import POTRF
from vbatch.kernels.cuda import CudaBackend, spd_fill
from vbatch.ops.generate import sizes

BW = 3.0e12  # bytes/s, device copy measured by cuda_potrf.py on the H100 (2026-11-20)
PEAK = {"float64": 59.5e12, "float32": 50.9e12}  # GEMM rates measured there


def make(dist, k, nmax, dtype, seed=1, order="F"):
    n = sizes(dist, k, nmax, np.random.default_rng(seed))
    ld = np.maximum(n, 1)
    off = np.r_[0, np.cumsum(ld * n)[:-1]].astype(np.int64)
    b = vbatch.PackedBatch.from_buffer(cupy.empty(int((ld * n).sum()), dtype), n, off, ld, order)
    return spd_fill(b, seed)


def per_call_us(fn, reps=2000):
    fn()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def cmd_host(args):
    info = cupy.zeros(2000, np.int32)
    out = {}
    out["cupy.empty(1M f64)"] = per_call_us(lambda: cupy.empty(1 << 20, np.float64))
    out["cupy.zeros(2000 i32)"] = per_call_us(lambda: cupy.zeros(2000, np.int32))
    out["memset_async 8KB"] = per_call_us(lambda: info.data.memset_async(0, info.nbytes))
    k = cupy.RawKernel("extern \"C\" __global__ void nop(const double* a, double* b, "
                       "const long long* m, const int* im, int* info, int K, int lo, int hi, "
                       "int step, int mpad) {}", "nop")
    a = cupy.empty(8)
    args10 = (a, a, info, info, info, np.int32(1), np.int32(0), np.int32(1), np.int32(0),
              np.int32(1))
    out["RawKernel launch, 10 args"] = per_call_us(lambda: k((1,), (32,), args10))
    out["Event() + record"] = per_call_us(lambda: cupy.cuda.get_current_stream().record())
    out["info.get() (8KB D2H + sync)"] = per_call_us(lambda: info.get(), 500)
    pinned = cupy.cuda.alloc_pinned_memory(info.nbytes)
    host = np.frombuffer(pinned, np.int32, 2000)
    out["info.get(out=pinned) + sync"] = per_call_us(lambda: info.get(out=host), 500)
    g = make("uniform", 2000, 32, np.float64)
    rt = vbatch.Runtime("cuda")
    out["vbatch uniform 32 call"] = per_call_us(lambda: rt.cholesky(g).result(), 500)
    out["vbatch submit only"] = per_call_us(lambda: rt.cholesky(g), 500)
    # The stages of one call, each timed alone (same order as Runtime._execute).
    be = rt.backend
    plan = rt.cholesky(g).result().plan
    req = POTRF.request.model_construct(batch=g, npiv=g.n, overwrite=False)
    out["  _plan (signature lookup)"] = per_call_us(lambda: rt._plan(POTRF, req))
    out["  new_output (alloc)"] = per_call_us(lambda: be.new_output(g))
    src, dst = g, be.new_output(g)

    def stages():
        ex = be.begin(plan, {"a": src, "l": dst}, rt.config)
        for lc in plan.launches:
            be.launch(ex, lc)
        be.flush(ex)
        return be.end(ex).wait()

    out["  begin+launch+end"] = per_call_us(stages, 500)
    for name, us in out.items():
        print(f"  {name:<32} {us:8.2f} us")
    _profile(lambda: rt.cholesky(g).result(), "cholesky uniform 32")
    # The BLAS ops on the harness's small cases (same draw as cuda_blas.py), packed operands
    # on the device: per call, submit alone, and where a call's host time goes.
    import cuda_blas as cb

    for name in ("gemm-square32", "potrs32-nrhs1"):
        case = cb.parse_case(name)
        d = cb.draw(case, 12345)
        ins = cb.make_inputs(case, d, np.dtype(np.float64), cupy, 12345)
        fields = {"gemm": dict(beta=1.0), "potrs": {}}[case.op]
        args_ = {k: ins[k] for k in case.operands if k in ins}
        def submit(op=case.op, a=args_, f=fields):
            return getattr(rt, op)(**a, **f)

        def call():
            return submit().result()

        print(f"  {name} call            {per_call_us(call, 500):8.2f} us")
        print(f"  {name} submit only     {per_call_us(submit, 500):8.2f} us")
        _profile(call, name)


def _profile(fn, what: str, reps: int = 300) -> None:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(f"-- cProfile, {reps} calls of {what}")
    print(s.getvalue()[:6000])


def cmd_launches(args):
    dtype = np.dtype(args.dtype)
    k = 500 if args.nmax >= 1024 else 2000
    b = make(args.dist, k, args.nmax, dtype)
    opts = {} if args.fused_max_rows is None else {"fused_max_rows": args.fused_max_rows}
    rt = vbatch.Runtime("cuda", cuda_graphs=False, **opts)
    plan = rt.cholesky(b).result().plan
    be: CudaBackend = rt.backend
    dst = b.with_data(cupy.empty_like(b.data))
    # One call issues the pointer table and every launch; then each launch is run again alone,
    # between its own events, on the same table (the plan's order keeps the data valid).
    ex = be.begin(plan, {"a": b, "l": dst}, rt.config)
    for lc in plan.launches:
        be.launch(ex, lc)
    be.flush(ex)
    be.end(ex).wait()
    main = cupy.cuda.get_current_stream()
    rows = []
    for _ in range(2):  # second pass is timed
        rows = []
        for rec in ex.prep.records:
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            cupy.cuda.Device().synchronize()
            s.record()
            rec.launch(main.ptr)
            e.record()
            e.synchronize()
            rows.append((rec.launch_, cupy.cuda.get_elapsed_time(s, e)))
    isz = dtype.itemsize
    tot = {}
    print(plan.summary())
    print(f"{'#':>3} {'step':>4} {'kind':<7} {'count':>5} {'rows':>9} {'j':>9} {'ms':>8} "
          f"{'GFLOP/s':>8} {'xfloor':>7}")
    for lc, ms in rows:
        t = plan.tasks
        j, w, h = t.cols[lc.lo:lc.hi], t.width[lc.lo:lc.hi], t.rows[lc.lo:lc.hi]
        a = t.args[lc.lo:lc.hi].astype(np.float64)
        if lc.kind == "schur":
            flops = byts = 0.0
        elif lc.kind == "blas.gemm":  # a blocked plan's block update (args r0, mm, k0, kk, nn)
            flops = float((2.0 * a[:, 1] * a[:, 3] * a[:, 4]).sum())
            byts = float(_blas_bytes(lc.kind, a, isz).sum())
        else:
            k = j - a[:, 2]  # a panel's update reads the columns of its block column, [b, j)
            upd = 2.0 * h * w * k
            fac = w**3 / 3.0 + (h - w) * w * w
            flops = float({"fused": upd + fac, "update": upd + w**3 / 3.0,
                           "trsm": (h - w) * w * w}[lc.kind].sum())
            reads_l = (h * k) if lc.kind in ("fused", "update") else 0
            byts = float((reads_l + 2 * h * w).sum()) * isz
        floor = max(byts / BW, flops / PEAK[dtype.name]) * 1e3
        tot[lc.kind] = [a + b_ for a, b_ in zip(tot.get(lc.kind, [0, 0, 0]), [ms, flops, floor])]
        print(f"{lc.index:>3} {lc.step:>4} {lc.kind:<7} {lc.count:>5} "
              f"{f'{lc.rows[0]}..{lc.rows[1]}':>9} {f'{lc.cols[0]}..{lc.cols[1]}':>9} "
              f"{ms:8.4f} {flops / ms / 1e6 if ms else 0:8.1f} {ms / floor if floor else 0:7.1f}")
    total = sum(v[0] for v in tot.values())
    for kind, (ms, fl, fo) in tot.items():
        print(f"  {kind:<7} {ms:8.3f} ms  {fl / ms / 1e6:8.1f} GFLOP/s  floor {fo:7.3f} ms "
              f"({ms / fo if fo else 0:5.1f}x)  {100 * ms / total:5.1f}% of kernel time")
    print(f"  total kernel time {total:.3f} ms")


# H200 (the device notes: about 4.2 TB/s, FP64 about 60 TFLOP/s; DMMA m16n8k8 measured 66).
H200_BW = 4.2e12
H200_PEAK = {"float64": 60e12, "float32": 60e12}


def _blas_bytes(kind: str, a: np.ndarray, isz: int) -> np.ndarray:
    """Bytes a blas task must move at least: its operands once (args r0, mm, k0, kk, nn)."""
    mm, kk, nn = (a[:, i].astype(np.float64) for i in (1, 3, 4))
    if kind.endswith("gemm"):
        return (mm * kk + kk * nn + 2 * mm * nn) * isz
    if kind.endswith(("trsm", "trmm")):
        return (mm * mm / 2 + 2 * mm * nn) * isz
    return 2 * mm * nn * isz


def cmd_ops(args):
    import cuda_blas as cb

    from vbatch.kernels import cuda as kc

    for name in args.cases:
        case = cb.parse_case(name)
        dtype = np.dtype(args.dtype)
        d = cb.draw(case, args.seed)
        ins = cb.make_inputs(case, d, dtype, cupy, args.seed)
        rt = vbatch.Runtime("cuda", cuda_graphs=False)
        run = cb.prep_vbatch(cb.Ctx(case=case, d=d, dtype=dtype, ins=ins, xp=cupy, rt=rt))
        run.call()
        times: list = []
        orig = kc._Record.launch

        def timed_launch(self, stream, _orig=orig, times=times):
            # The events go on the launch's own stream (a plan spreads over several).
            st = cupy.cuda.ExternalStream(stream)
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            cupy.cuda.Device().synchronize()
            s.record(st)
            _orig(self, stream)
            e.record(st)
            e.synchronize()
            times.append((self, cupy.cuda.get_elapsed_time(s, e)))

        kc._Record.launch = timed_launch
        try:
            for _ in range(2):  # the second pass is kept
                times.clear()
                out = run.submit()
                out.result()
        finally:
            kc._Record.launch = orig
        fields = {"gemm": dict(beta=1.0), "trsm": {}, "potrs": {}}[case.op]
        plan = rt.plan_for(case.op, **{k: ins[k] for k in case.operands if k in ins}, **fields)
        t = plan.tasks
        isz = dtype.itemsize
        per: dict = {}
        print(f"== {name} {dtype.name}: {len(times)} launches")
        print(f"{'#':>4} {'kind':<11} {'kernel':<44} {'count':>5} {'grid y':>6} {'ms':>8} "
              f"{'GFLOP/s':>8} {'xfloor':>7}")
        for rec, ms in times:
            lc = rec.launch_
            a = t.args[lc.lo:lc.hi]
            kd = next(k for k in plan.kinds if k.name == lc.task_kind)
            flops = float(kd.flops(a, t.rows[lc.lo:lc.hi], t.cols[lc.lo:lc.hi],
                                   t.width[lc.lo:lc.hi]).sum())
            byts = float(_blas_bytes(lc.kind, a, isz).sum())
            floor = max(byts / H200_BW, flops / H200_PEAK[dtype.name]) * 1e3
            kname = rec.name.replace("vb::", "")[:44]
            acc = per.setdefault((lc.kind, kname), [0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += ms
            acc[2] += flops
            acc[3] += floor
            if args.all:
                print(f"{lc.index:>4} {lc.kind:<11} {kname:<44} {lc.count:>5} {rec.grid[1]:>6} "
                      f"{ms:8.4f} {flops / ms / 1e6 if ms else 0:8.1f} "
                      f"{ms / floor if floor else 0:7.1f}")
        total = sum(v[1] for v in per.values())
        for (kind, kname), (n, ms, fl, fo) in sorted(per.items(), key=lambda x: -x[1][1]):
            print(f"  {kind:<11} {kname:<44} {n:4d} launches {ms:8.3f} ms "
                  f"{fl / ms / 1e6:8.1f} GFLOP/s floor {fo:7.3f} ms ({ms / fo if fo else 0:5.1f}x) "
                  f"{100 * ms / total:5.1f}%")
        print(f"  kernel time {total:.3f} ms (each launch alone, the device idle before it)")


def cmd_tiles(args):
    """The float64 DMMA GEMM tile, tried per candidate on the harness's cases: each candidate
    (BM, BN, WTM, stages) takes every launch whose tasks reach 128 each way (smaller launches
    keep the 64 x 64 tile), a fresh runtime per candidate, the call timed end to end (events,
    median of 7), the output checked on a sample against cupy's product, and the kernel's
    registers and local memory read off the compiled function."""
    import cuda_blas as cb

    from vbatch.kernels import blas_cuda as bc
    from vbatch.kernels import cuda as kc

    cands = [tuple(int(x) for x in c.split(",")) for c in args.tiles]
    real = bc.mma_tile
    for name in args.cases:
        case = cb.parse_case(name)
        d = cb.draw(case, 12345)
        ins = cb.make_inputs(case, d, np.dtype(np.float64), cupy, 12345)
        fields = {"gemm": dict(beta=1.0)}.get(case.op, {})
        args_ = {k: ins[k] for k in case.operands if k in ins}
        sample = [0, 1, int(np.argmax(d.get("m", d.get("n")))), 7, 100]
        print(f"== {name}")
        for cand in [None] + cands:
            bc.mma_tile = real if cand is None else (
                lambda mm, nn, kk=0, c=cand: c if min(mm, nn) >= 128 else real(mm, nn, kk))
            try:
                rt = vbatch.Runtime("cuda")

                def run(rt=rt, op=case.op, a=args_, f=fields):
                    return getattr(rt, op)(**a, **f)

                out = run().result()
                ts = []
                for _ in range(7):
                    s, e = cupy.cuda.Event(), cupy.cuda.Event()
                    s.record()
                    res = run()
                    e.record()
                    res.result()
                    ts.append(cupy.cuda.get_elapsed_time(s, e))
                err = 0.0
                if case.op == "gemm":
                    for i in sample:
                        a, b, c = (ins[x].matrix(i) for x in "abc")
                        ref = a @ b + c
                        got = out.matrix(i)
                        den = float(cupy.linalg.norm(ref)) or 1.0
                        err = max(err, float(cupy.linalg.norm(got - ref)) / den)
                regs = ""
                if cand is not None:
                    nm = bc.mma_name(cand, False, False)
                    k = kc._kernel(nm, "blas.cu")
                    at = k.attributes
                    regs = f"regs {at['num_regs']} local {at['local_size_bytes']}"
                label = "default" if cand is None else str(cand)
                print(f"  {label:<22} {np.median(ts):8.3f} ms  err {err:.1e}  {regs}",
                      flush=True)
            except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported
                print(f"  {cand}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            finally:
                bc.mma_tile = real


def cmd_whole(args):
    """POTRS with few right-hand sides: the whole-triangle solve (blas_trsv) against the
    recursion into GEMM joins, per right-hand-side count (``blas_whole_rhs``, the largest
    count planned whole), on the harness's potrs draw; end-to-end call, events, median of 7."""
    import cuda_blas as cb

    from vbatch.kernels import blas_cuda as bc

    real = bc.WHOLE_RHS
    for nrhs in args.nrhs:
        case = cb.parse_case(f"potrs{args.nmax}-nrhs{nrhs}")
        d = cb.draw(case, 12345)
        ins = cb.make_inputs(case, d, np.dtype(np.float64), cupy, 12345)
        line = f"  potrs{args.nmax} nrhs {nrhs:3d}:"
        for whole in (0, 1 << 20):
            bc.WHOLE_RHS = whole
            try:
                rt = vbatch.Runtime("cuda")
                rt.potrs(ins["l"], ins["b"]).result()
                ts = []
                for _ in range(7):
                    s, e = cupy.cuda.Event(), cupy.cuda.Event()
                    s.record()
                    r = rt.potrs(ins["l"], ins["b"])
                    e.record()
                    r.result()
                    ts.append(cupy.cuda.get_elapsed_time(s, e))
                line += f"  {'whole' if whole else 'recursive'} {np.median(ts):8.3f} ms"
            finally:
                bc.WHOLE_RHS = real
        print(line, flush=True)


def cmd_crossover(args):
    for dtype in args.dtype:
        for dist in args.dist:
            for nmax in args.nmax:
                k = 500 if nmax >= 1024 else 2000
                b = make(dist, k, nmax, np.dtype(dtype))
                for nb in args.nb:
                    line = f"{dtype} {dist:<8} {nmax:>5} nb={nb}:"
                    for v in args.values:
                        opts = {"nb": nb} | ({} if v < 0 else {"fused_max_rows": v})
                        rt = vbatch.Runtime("cuda", **opts)
                        rt.cholesky(b).result()
                        ts = []
                        for _ in range(7):
                            t0 = time.perf_counter()
                            rt.cholesky(b).result()
                            ts.append((time.perf_counter() - t0) * 1e3)
                        line += f"  fmr={v if v >= 0 else 'dflt'}: {np.median(ts):7.3f}"
                    print(line, flush=True)


def cmd_listpath(args):
    b = make("uniform", 2000, 128, np.float64)
    views = b.unpack()
    rt = vbatch.Runtime("cuda")
    from vbatch.core.batch import MatrixList

    print(f"  validate list      {per_call_us(lambda: MatrixList(mats=views), 20) / 1e3:8.3f} ms")
    ml = MatrixList(mats=views)
    be = rt.backend
    gather = per_call_us(lambda: be.stage_input(ml, False), 20) / 1e3
    print(f"  pack (gather)      {gather:8.3f} ms")
    w = be.stage_input(ml, False)
    print(f"  unpack views       {per_call_us(lambda: w.unpack(), 20) / 1e3:8.3f} ms")
    whole = per_call_us(lambda: rt.cholesky(views).result(), 10) / 1e3
    print(f"  whole list call    {whole:8.3f} ms")


def _median_us(fn, reps, before=None):
    ts = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e6)


def cmd_floor(args):
    """Per cell (op:dist:Nmax, the sweep's draw and operands, the pack of --order): the whole
    call synchronized; the host's part (the call returned, nothing waited for); the plan's
    graph alone, launched and waited for, and back to back (the GPU's own time per run); the
    kernels one at a time between events; and, once, an empty kernel's graph."""
    import zlib

    import sweep

    sync = cupy.cuda.Device().synchronize
    reps = args.reps
    nop = cupy.RawKernel('extern "C" __global__ void nop() {}', "nop")
    s = cupy.cuda.Stream(non_blocking=True)
    s.begin_capture()
    nop((1,), (32,), (), stream=s)
    g = s.end_capture()
    main = cupy.cuda.get_current_stream()
    g.launch(main)
    sync()
    one = _median_us(lambda: (g.launch(main), main.synchronize()), reps)

    def burst():
        for _ in range(100):
            g.launch(main)
        main.synchronize()

    print(f"empty graph: launch + wait {one:6.1f} us, back to back "
          f"{_median_us(burst, 20) / 100:6.2f} us")
    magma = None
    if args.magma:
        from cuda_potrf import load_magma

        magma = load_magma(args.magma)
    rt = vbatch.Runtime("cuda")
    print(f"{'cell':<22} {'launches':>8} {'call':>7} {'host':>7} {'graph':>7} {'burst':>7} "
          f"{'kernels':>8} {'magma':>7}   (us)")
    for cell in args.cells:
        op, dist, nmax = cell.split(":")
        dtype = np.dtype(args.dtype)
        rng = np.random.default_rng(zlib.crc32(f"{op} {dtype.name} {dist} {nmax}".encode()))
        n = sweep._sizes(dist, args.k, int(nmax), rng)
        row = _floor_cell(rt, op, *sweep.operands(op, dtype, n, rng, rt)[:2], reps, args.kinds,
                          args.order)
        if magma is not None and op in sweep.ANCHORED:  # (the sweep's own cell, same draw)
            rng = np.random.default_rng(zlib.crc32(f"{op} {dtype.name} {dist} {nmax}".encode()))
            ms = sweep._cell(op, dtype, dist, int(nmax), args.k, [], reps, rt, magma, rng)
            row[-1] = ms["magma"] * 1e3
        print(f"{cell:<22} " + " ".join(f"{v:>7}" if isinstance(v, str) else f"{v:7.1f}"
                                        for v in row), flush=True)


def _floor_cell(rt, op, ops, call, reps, kinds=False, order="F") -> list:
    sync = cupy.cuda.Device().synchronize
    main = cupy.cuda.get_current_stream()
    x = ops["packed" + order]
    for _ in range(5):
        call(x)
    sync()
    total = _median_us(lambda: (call(x), sync()), reps)
    method = getattr(rt, "cholesky" if op == "potrf" else op)
    args = {"mats": x} if op == "potrf" else x if isinstance(x, dict) else {"a": x}
    futs = []
    host = _median_us(lambda: futs.append(method(**args)), reps,
                      before=lambda: (futs and futs.pop().result(), sync()))
    plan = rt.plan_for(op, **({"batch": x} if op == "potrf" else args))
    prep, graph = _graph(plan)
    gtime = _median_us(lambda: (graph.launch(main), main.synchronize()), reps)
    per: dict = {}
    row = [str(len(plan.launches)), total, host, gtime, _burst_us(graph, 20),
           _kernel_us(prep, per), ""]
    if kinds:
        for name, (n, us) in sorted(per.items(), key=lambda x: -x[1][1]):
            print(f"    {name.replace('vb::', ''):<50} {n:3d} launches {us:8.1f} us")
    return row


def _graph(plan):
    """The prepared launches of ``plan``'s last call, and the graph that replays it."""
    prep = plan.cache["cuda-last"][2]
    graph = prep.graph
    if prep.fixed:  # (the kernels timed one by one read the shared table: filled here)
        table, graph = next(iter(prep.fixed.values()))[:2]
        prep.table[:] = table
    return prep, graph


def _burst_us(graph, reps, n=50) -> float:
    """The GPU's own time a run: ``n`` replays back to back, median of ``reps``."""
    main = cupy.cuda.get_current_stream()

    def burst():
        for _ in range(n):
            graph.launch(main)
        main.synchronize()

    return _median_us(burst, reps) / n


def _kernel_us(prep, per: dict | None = None) -> float:
    """The plan's kernels, each launched alone between two events (the device idle first);
    ``per`` gets (launches, us) per kernel."""
    total = 0.0
    st = cupy.cuda.get_current_stream()
    for _ in range(2):  # the second pass is kept
        total = 0.0
        if per is not None:
            per.clear()
        for rec in prep.records:
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            cupy.cuda.Device().synchronize()
            s.record(st)
            rec.launch(st.ptr)
            e.record(st)
            e.synchronize()
            us = cupy.cuda.get_elapsed_time(s, e) * 1e3
            total += us
            if per is not None:
                n, t = per.get(rec.name, (0, 0.0))
                per[rec.name] = (n + 1, t + us)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("host")
    p = sub.add_parser("launches")
    p.add_argument("--dist", default="uniform")
    p.add_argument("--nmax", type=int, default=512)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--fused-max-rows", type=int, default=None)
    c = sub.add_parser("crossover")
    c.add_argument("--dtype", nargs="+", default=["float64"])
    c.add_argument("--dist", nargs="+", default=["uniform"])
    c.add_argument("--nmax", type=int, nargs="+", default=[512, 1024])
    c.add_argument("--values", type=int, nargs="+", default=[0, 64, 128, 256, 512, -1])
    c.add_argument("--nb", type=int, nargs="+", default=[32])
    sub.add_parser("listpath")
    tl = sub.add_parser("tiles")
    tl.add_argument("--cases", nargs="+", default=["gemm-square512", "gemm-square1024",
                                                    "gemm-panel512", "trsm512"])
    tl.add_argument("--tiles", nargs="+", default=["128,128,64,3", "128,128,64,4",
                                                    "128,64,32,3", "64,128,32,3", "128,64,64,3",
                                                    "128,128,32,3", "64,64,32,4"])
    wh = sub.add_parser("whole")
    wh.add_argument("--nmax", type=int, default=512)
    wh.add_argument("--nrhs", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    o = sub.add_parser("ops")
    o.add_argument("--cases", nargs="+", default=["gemm-square512", "gemm-panel512", "trsm512",
                                                  "potrs512-nrhs1", "potrs512-nrhs16"])
    o.add_argument("--dtype", default="float64")
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--all", action="store_true", help="print every launch, not only the sums")
    fl = sub.add_parser("floor")
    fl.add_argument("--cells", nargs="+", default=[
        "potrf:uniform:8", "potrf:uniform:16", "potrf:uniform:32", "potrf:uniform:40",
        "potrf:equal:40", "gemm:uniform:8", "gemm:uniform:32", "gemm:uniform:40",
        "trsm:uniform:8", "trsm:uniform:32", "trsm:uniform:40", "syrk:uniform:8"])
    fl.add_argument("--dtype", default="float64")
    fl.add_argument("--k", type=int, default=2000)
    fl.add_argument("--reps", type=int, default=200)
    fl.add_argument("--magma", default=None)
    fl.add_argument("--kinds", action="store_true", help="each cell's kernel time per kernel")
    fl.add_argument("--order", choices=("F", "C"), default="F", help="the pack's order")
    args = ap.parse_args()
    {"floor": cmd_floor, "host": cmd_host, "launches": cmd_launches, "crossover": cmd_crossover,
     "listpath": cmd_listpath, "ops": cmd_ops, "tiles": cmd_tiles,
     "whole": cmd_whole}[args.cmd](args)


if __name__ == "__main__":
    main()
