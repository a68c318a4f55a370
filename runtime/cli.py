"""``python -m vbatch``: ``demo`` factors a generated batch and checks it; ``plan`` prints a plan.

``demo`` exits 0 when every factor is within tolerance, 1 when any matrix failed (non-zero
``info``, a residual over tolerance, or NaN), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

# ||A - L L^T||_F / ||A||_F <= RESIDUAL_C * n * eps. Cholesky is backward stable with an error
# of order n * u (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 10.3);
# measured worst cases on the demo's matrices are 0.1-0.3 n eps, so 2 leaves room for other
# summation orders (GPU kernels) without hiding a real error, which is O(1) or NaN.
RESIDUAL_C = 2.0


def _parser() -> argparse.ArgumentParser:
    from vbatch.ops.generate import DISTRIBUTIONS

    ap = argparse.ArgumentParser(prog="python -m vbatch", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--count", type=int, default=2000, help="matrices in the batch (2000)")
        p.add_argument("--nmax", type=int, default=128, help="largest size (128)")
        p.add_argument("--dist", choices=DISTRIBUTIONS, default="uniform", help="size distribution")
        p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--policy", choices=("dsse", "ssde"), default="dsse")
        p.add_argument("--nb", type=int, default=None, help="panel width (backend default)")
        p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")

    demo = sub.add_parser("demo", help="factor a generated batch, check every factor, report")
    common(demo)
    demo.add_argument("--repeat", type=int, default=3, help="timed runs after a warm-up (3)")
    demo.add_argument(
        "--nonspd", type=int, default=0,
        help="make this many matrices indefinite, to show per-matrix info (the demo then fails)",
    )
    plan = sub.add_parser("plan", help="print the launch plan for a generated batch of sizes")
    common(plan)
    plan.add_argument("--limit", type=int, default=60, help="launches to print (60)")
    comp = sub.add_parser("compile", help="compile the CUDA kernels ahead of use (fills CuPy's "
                                          "kernel cache, in parallel)")
    comp.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    comp.add_argument("--nb", type=int, nargs="+", default=[32])
    comp.add_argument("--order", nargs="+", default=["F", "C"], choices=["F", "C"])
    comp.add_argument("--jobs", type=int, default=8)
    return ap


def cmd_compile(args) -> int:
    from vbatch.kernels.cuda import kernel_names, precompile

    names = kernel_names(args.dtype, args.nb, args.order)
    names += [f"vb::spd_fill<{t}>" for t in ("double", "float")]
    t0 = time.perf_counter()
    precompile(names, jobs=args.jobs)
    print(f"compiled {len(names)} kernels in {time.perf_counter() - t0:.1f} s")
    return 0


def _sizes(args):
    from vbatch.ops.generate import sizes

    if args.count < 0 or args.nmax < 1:
        raise SystemExit(f"--count must be >= 0 and --nmax >= 1 (got {args.count}, {args.nmax})")
    rng = np.random.default_rng(args.seed)
    return sizes(args.dist, args.count, args.nmax, rng), rng


def _runtime(args):
    from vbatch.runtime.runtime import Runtime

    opts = {"policy": args.policy}
    if args.nb is not None:
        opts["nb"] = args.nb
    return Runtime(args.device, **opts)


def cmd_plan(args) -> int:
    ns, _ = _sizes(args)
    rt = _runtime(args)
    from vbatch.ops.batch import PackedBatch

    empty = PackedBatch.from_buffer(np.zeros(int((np.maximum(ns, 1) * ns).sum()), args.dtype), ns)
    print(rt.plan(empty).table(limit=args.limit))
    return 0


def cmd_demo(args) -> int:
    from vbatch.ops.cholesky import cholesky_flops, residual
    from vbatch.ops.generate import make_indefinite, spd_packed

    ns, rng = _sizes(args)
    rt = _runtime(args)
    dtype = np.dtype(args.dtype)
    batch = spd_packed(ns, dtype, rng, order="F")
    expect_bad: dict[int, int] = {}
    if args.nonspd:
        cand = np.flatnonzero(ns > 0)
        for i in rng.choice(cand, size=min(args.nonspd, len(cand)), replace=False):
            col = int(rng.integers(0, ns[i]))
            m = batch.matrix(int(i))
            m[...] = make_indefinite(m, col)
            expect_bad[int(i)] = col + 1
    if rt.device == "cuda":
        batch, _ = rt.backend.adopt(batch, overwrite=True)  # a device copy: time the call with
        # the data already on the GPU, as users of the packed form have it

    res = rt.cholesky(batch).result()  # warm-up: compiles kernels, caches the plan
    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        res = rt.cholesky(batch).result()
        times.append(time.perf_counter() - t0)
    t = float(np.median(times))

    host = rt.backend.export(batch, "numpy")
    out = rt.backend.export(res.factors, "numpy")
    eps = np.finfo(dtype).eps
    worst, worst_ratio, bad_resid = 0.0, 0.0, []
    for i in np.flatnonzero((ns > 0) & (res.info == 0)):
        r = residual(host.matrix(int(i)), out.matrix(int(i)))
        ratio = r / (ns[i] * eps)
        if not np.isfinite(r) or ratio > RESIDUAL_C:
            bad_resid.append(int(i))
        if not np.isfinite(r) or r > worst:
            worst = r
        worst_ratio = max(worst_ratio, ratio if np.isfinite(ratio) else np.inf)

    plan = res.plan
    flops = float(cholesky_flops(ns).sum())
    pct = np.percentile(ns, [0, 50, 100]).astype(int) if len(ns) else [0, 0, 0]
    print(f"vbatch demo: {len(ns)} SPD matrices, dist={args.dist}, nmax={args.nmax}, "
          f"{dtype.name}, device={rt.device} ({rt.backend.name})")
    print(f"  sizes    min {pct[0]}, median {pct[1]}, max {pct[2]}, sum(n) {int(ns.sum())}")
    print(f"  plan     {plan.summary()}")
    print(f"  time     {t * 1e3:.3f} ms (median of {len(times)}), {flops / t / 1e9:.2f} GFLOP/s")
    print(f"  residual worst ||A - LL^T||_F/||A||_F = {worst:.2e} "
          f"({worst_ratio:.3f} n eps; tolerance {RESIDUAL_C:g} n eps)")
    failed = {int(i): int(res.info[i]) for i in res.failed()}
    ok = not failed and not bad_resid
    if failed:
        shown = ", ".join(f"{i}: info={v}" for i, v in list(failed.items())[:10])
        print(f"  FAILED   {len(failed)} not positive definite ({shown})")
        if expect_bad:
            match = failed == expect_bad
            print(f"           --nonspd made {len(expect_bad)} indefinite; info "
                  f"{'matches' if match else 'DIFFERS from'} the planted pivots; "
                  f"{len(ns) - len(failed)} others unaffected")
    if bad_resid:
        print(f"  FAILED   {len(bad_resid)} residuals over tolerance or NaN: {bad_resid[:10]}")
    print("  ok" if ok else "  FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return {"demo": cmd_demo, "plan": cmd_plan, "compile": cmd_compile}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
