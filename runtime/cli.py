"""The ``vbatch`` command (also ``python -m vbatch``): ``demo`` factors a generated batch and
checks it, ``plan`` prints its launch plan, ``trace`` times every launch of one call (a Chrome
trace and a Gantt chart, :mod:`vbatch.runtime.trace`), ``compile`` builds the CUDA kernels ahead
of use, ``tune`` measures the planner's crossovers on this machine and keeps them as the
defaults (:mod:`vbatch.runtime.tune`).

``demo`` exits 0 when every factor is within tolerance, 1 when any matrix failed (non-zero
``info``, a residual over tolerance, or NaN). Every command exits 2, with one line on stderr, on
bad arguments or when the device or compiler it needs is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

# ||A - L L^T||_F / ||A||_F <= RESIDUAL_C * n * eps. Cholesky is backward stable with an error
# of order n * u (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 10.3);
# measured worst cases on the demo's matrices are 0.1-0.3 n eps, so 2 leaves room for other
# summation orders (GPU kernels) without hiding a real error, which is O(1) or NaN.
RESIDUAL_C = 2.0
TRACE_OPS = ("cholesky", "posv", "potrs", "trsm", "gemm")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr, ``prog: error: message``, exit status 2:
    the usage block argparse prints first would bury the line that says what is wrong."""

    def error(self, message: str):
        lines = [line.strip() for line in str(message).splitlines() if line.strip()]
        text = " ".join(lines[:1] + ["; ".join(lines[1:])]) if len(lines) > 1 else "".join(lines)
        self.exit(2, f"{self.prog}: error: {text}\n")


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value

    return parse


def _arch(text: str) -> str:
    # -cubin needs a real architecture; a virtual one (compute_90) or "native" makes nvcc fail
    # after a minute of work instead of here, and the backend loads cubins of plain ones only
    # (an sm_90a cubin would never be used).
    if not re.fullmatch(r"sm_\d+", text):
        raise argparse.ArgumentTypeError(f"expected a GPU architecture such as sm_90, got {text!r}")
    return text


def _parser(prog: str) -> argparse.ArgumentParser:
    from vbatch.kernels.cuda_build import ARCHS, DTYPES, ORDERS
    # The Cholesky commands take real types: the device generator (generate.cu) makes real SPD
    # matrices, and tune's choices are per dtype (complex ones keep potrf_cuda's defaults).
    from vbatch.kernels.cuda_build import REAL as CHOLESKY_DTYPES
    from vbatch.kernels.potrf_cuda import NB_SUPPORTED
    from vbatch.ops.generate import DISTRIBUTIONS

    ap = _Parser(
        prog=prog,
        description="Variable-size batched Cholesky: factor a generated batch and check it "
                    "(demo), print its launch plan (plan), time every launch of one call "
                    "(trace), compile the CUDA kernels ahead of use (compile), or measure this "
                    "machine's crossovers (tune).",
        epilog="Exit status: 0 ok; 1 a factor failed (demo) or nvcc failed (compile); 2 bad "
               "arguments, or the device or compiler a command needs is missing.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--count", type=_int_at_least(0), default=2000,
                       help="matrices in the batch (2000)")
        p.add_argument("--nmax", type=_int_at_least(1), default=128, help="largest size (128)")
        p.add_argument("--dist", choices=DISTRIBUTIONS, default="uniform", help="size distribution")
        p.add_argument("--dtype", choices=CHOLESKY_DTYPES, default="float64")
        p.add_argument("--seed", type=_int_at_least(0), default=0)
        p.add_argument("--policy", choices=("dsse", "ssde"), default="dsse")
        # The upper bound depends on the backend (cuda: 8, 16 or 32); the runtime checks it.
        p.add_argument("--nb", type=_int_at_least(1), default=None,
                       help="panel width (backend default)")
        p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")

    demo = sub.add_parser(
        "demo", help="factor a generated batch, check every factor, report",
        description="Factor a generated batch of SPD matrices, check every factor's residual, "
                    "report time and rate. Exits 0 when every factor is within tolerance, 1 when "
                    "any failed (non-zero info, residual over tolerance, NaN), 2 on bad "
                    "arguments.",
    )
    common(demo)
    demo.add_argument("--repeat", type=_int_at_least(1), default=3,
                      help="timed runs after a warm-up (3)")
    demo.add_argument(
        "--nonspd", type=_int_at_least(0), default=0,
        help="make this many matrices (at most --count) indefinite, to show per-matrix info "
             "(the demo then fails)",
    )
    plan = sub.add_parser(
        "plan", help="print the launch plan for a generated batch of sizes",
        description="Print the launch plan the runtime would execute for a generated batch of "
                    "sizes, one line per launch.",
    )
    common(plan)
    plan.add_argument("--limit", type=_int_at_least(0), default=60,
                      help="launches to print (60)")
    trc = sub.add_parser(
        "trace", help="time every launch of one call: a Chrome trace and a Gantt chart",
        description="Run one call on a generated batch once to warm up and once launch by "
                    "launch, timing each launch (CUDA: events on its stream; CPU: on the host), "
                    "and write OUT.json (a Chrome/Perfetto trace: one event per launch of the "
                    "plan, with its kind, group, sizes and time) and OUT.png (a Gantt chart, one "
                    "row per stream).",
    )
    common(trc)
    trc.add_argument("--op", choices=TRACE_OPS, default="cholesky",
                     help="what to run: cholesky, posv, potrs, trsm (a triangle of order n, "
                          "--nrhs right-hand sides) or gemm (m = n = k = n) (cholesky)")
    trc.add_argument("--nrhs", type=_int_at_least(0), default=1,
                     help="right-hand sides per problem for posv, potrs, trsm (1)")
    trc.add_argument("--out", default="vbatch-trace", metavar="PREFIX",
                     help="writes PREFIX.json and PREFIX.png (vbatch-trace)")
    trc.add_argument("--no-png", action="store_true", help="write the JSON trace only")
    comp = sub.add_parser(
        "compile", help="compile the CUDA kernels ahead of use",
        description="Compile every CUDA kernel instantiation a plan with these parameters can "
                    "launch (by default all: both dtypes, every supported nb, both orders). "
                    "Without --nvcc: through CuPy/NVRTC into CuPy's on-disk kernel cache, in "
                    "parallel processes (needs cupy and a GPU). With --nvcc: to cubins with "
                    "nvcc, one per template, type and architecture, and their index, where the "
                    "CUDA backend loads them from (needs no cupy or GPU; what the package's "
                    "build does where nvcc is present).",
    )
    comp.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES))
    comp.add_argument("--nb", type=int, nargs="+", choices=NB_SUPPORTED,
                      default=list(NB_SUPPORTED), metavar="NB",
                      help=f"panel widths, from {', '.join(map(str, NB_SUPPORTED))} (all)")
    comp.add_argument("--order", nargs="+", choices=ORDERS, default=list(ORDERS))
    comp.add_argument("--jobs", type=_int_at_least(1), default=8,
                      help="compiler processes in parallel (8)")
    comp.add_argument("--nvcc", action="store_true",
                      help="compile with nvcc to cubins instead of through CuPy/NVRTC")
    comp.add_argument("--arch", type=_arch, nargs="+", default=None,
                      help=f"with --nvcc: GPU architectures (those of {' '.join(ARCHS)} "
                           f"that this nvcc knows)")
    comp.add_argument("--out", default=None, metavar="DIR",
                      help="with --nvcc: write the cubins and their index to DIR, replacing "
                           "those there (default: the installed package's kernels/bin, where "
                           "the CUDA backend looks)")
    tun = sub.add_parser(
        "tune", help="measure the planner's crossovers here and keep them as the defaults",
        description="Time each tunable option's candidates (the kernel modules' TUNE) on "
                    "generated batches, choose the fastest, and write them to the tune file, "
                    "where every Runtime on this machine, backend and kernels finds them "
                    "(options a Runtime is given still win).",
    )
    tun.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    tun.add_argument("--dtype", nargs="+", choices=CHOLESKY_DTYPES, default=list(CHOLESKY_DTYPES))
    tun.add_argument("--reps", type=_int_at_least(1), default=5,
                     help="timed calls per candidate and batch, after warm-up (5)")
    tun.add_argument("--file", default=None, metavar="PATH",
                     help="the tune file (default ~/.cache/vbatch/tune.json)")
    tun.add_argument("--quick", action="store_true",
                     help="tiny batches, one timed call each: checks the command, not the "
                          "machine")
    for p in (demo, plan, trc, comp, tun):
        p.set_defaults(parser=p)  # errors found after parsing name the subcommand too
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # (every command, in the usage line)
    return ap


def cmd_compile(args) -> int:
    if args.nvcc:
        return _compile_nvcc(args)
    from vbatch.kernels.cuda import precompile
    from vbatch.kernels.cuda_build import kernel_names

    names = kernel_names(args.dtype, args.nb, args.order)
    t0 = time.perf_counter()
    precompile(names, jobs=args.jobs)
    print(f"compiled {len(names)} kernels in {time.perf_counter() - t0:.1f} s")
    return 0


def _compile_nvcc(args) -> int:
    from vbatch.kernels import cuda_build as build

    names = build.kernel_names(args.dtype, args.nb, args.order)
    out = Path(args.out) if args.out else build.BIN
    t0 = time.perf_counter()
    try:
        runs = build.build_binaries(out, args.arch, names, jobs=args.jobs,
                                    nvcc=shutil.which("nvcc"))
    except (OSError, ValueError) as exc:
        print(f"building the kernels in {out} failed: {exc}", file=sys.stderr)
        return 1
    failed = 0
    for cmd, r in runs:
        if r.returncode or r.stdout or r.stderr:  # warnings too: CI's log should show them
            print(" ".join(cmd), file=sys.stderr)
            sys.stderr.write(r.stdout + r.stderr)
        failed += r.returncode != 0
    secs = time.perf_counter() - t0
    if failed:
        print(f"nvcc failed in {failed} of {len(runs)} runs ({secs:.1f} s)", file=sys.stderr)
        return 1
    print(f"compiled {len(names)} kernels for {' '.join(args.arch)} with nvcc in {secs:.1f} s "
          f"({len(runs)} nvcc runs, into {out})")
    return 0


def _sizes(args):
    from vbatch.ops.generate import sizes

    rng = np.random.default_rng(args.seed)
    return sizes(args.dist, args.count, args.nmax, rng), rng


def _runtime(args):
    from vbatch.runtime.runtime import Runtime

    opts = {"policy": args.policy}
    if args.nb is not None:
        opts["nb"] = args.nb
    rt = Runtime(args.device, **opts)
    rt.plan_options(args.dtype)  # the backend checks nb here: fail before generating a batch
    return rt


def cmd_tune(args) -> int:
    from vbatch.core.errors import InputError
    from vbatch.runtime.tune import describe, tune

    try:
        entry = tune(args.device, tuple(args.dtype), quick=args.quick, reps=args.reps,
                     path=args.file)
    except (InputError, RuntimeError) as exc:
        args.parser.error(str(exc))
    print(describe(entry))
    return 0


def cmd_plan(args, rt) -> int:
    ns, _ = _sizes(args)
    from vbatch.core.batch import PackedBatch

    empty = PackedBatch.from_buffer(np.zeros(int((np.maximum(ns, 1) * ns).sum()), args.dtype), ns)
    print(rt.plan(empty).table(limit=args.limit))
    return 0


def cmd_demo(args, rt) -> int:
    from vbatch.ops.cholesky import cholesky_flops, residual
    from vbatch.ops.generate import make_indefinite, spd_packed

    ns, rng = _sizes(args)
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
        # A device copy: time the call with the data already on the GPU, as users of the
        # packed form have it.
        batch = rt.backend.stage_input(batch, writable=True)

    res = rt.cholesky(batch).result()  # warm-up: compiles kernels, caches the plan
    times = []
    for _ in range(args.repeat):
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


def cmd_trace(args, rt) -> int:
    from vbatch.ops.generate import spd_packed
    from vbatch.core.batch import PackedBatch, tight_layout
    from vbatch.runtime.trace import trace

    ns, rng = _sizes(args)
    dtype = np.dtype(args.dtype)

    def dense(m, n):
        off, ld, total = tight_layout(m, n, "F")
        data = rng.uniform(-1, 1, total).astype(dtype)
        return PackedBatch.from_buffer(data, n=n, m=m, offset=off, ld=ld, order="F")

    def on_device(b):
        return rt.backend.stage_input(b, writable=True) if rt.device == "cuda" else b

    nrhs = np.full(len(ns), args.nrhs, dtype=np.int64)
    if args.op in ("cholesky", "posv", "potrs", "trsm"):
        a = on_device(spd_packed(ns, dtype, rng, order="F"))
    if args.op == "cholesky":
        op, fields = "potrf", dict(batch=a)
    elif args.op == "posv":
        op, fields = "posv", dict(a=a, b=on_device(dense(ns, nrhs)))
    elif args.op in ("potrs", "trsm"):
        l = rt.cholesky(a).result().factors  # noqa: E741 - the factor
        op = args.op
        fields = dict(b=on_device(dense(ns, nrhs)))
        fields["l" if op == "potrs" else "a"] = l
    else:
        op, fields = "gemm", dict(a=on_device(dense(ns, ns)), b=on_device(dense(ns, ns)))
    tr = trace(rt, op, **fields)
    meta = {"op": args.op, "count": args.count, "nmax": args.nmax, "dist": args.dist,
            "dtype": dtype.name, "seed": args.seed, "nrhs": args.nrhs}
    try:
        paths = tr.write(args.out, meta, png=not args.no_png)
    except ImportError as exc:  # the chart needs matplotlib (vbatch[bench])
        paths = tr.write(args.out, meta, png=False)
        print(f"vbatch trace: no Gantt chart ({exc}); pip install matplotlib, or --no-png",
              file=sys.stderr)
    total = max((e["start_us"] + e["dur_us"] for e in tr.events), default=0.0)
    busy = sum(e["dur_us"] for e in tr.events)
    print(f"vbatch trace: {args.op}, {len(ns)} problems, {tr.plan.summary()}")
    print(f"  {len(tr.events)} launches, {total / 1e3:.3f} ms from the first to the last, "
          f"{busy / 1e3:.3f} ms of launches (each timed alone on its stream)")
    floor = sum(e["floor_us"] for e in tr.events)
    print(f"  floor of the launches' work {floor / 1e3:.3f} ms (bandwidth "
          f"{tr.ceil['bw'] / 1e12:.2f} TB/s, {dtype.name} GEMM peak "
          f"{tr.ceil['peak'].get(dtype.name, 0) / 1e12:.1f} TFLOP/s, measured here)")
    print(f"  {'launches of':<14}{'launches':>9}{'tasks':>8}{'ms':>10}{'floor ms':>10}"
          f"{'x floor':>8}")
    for k in tr.by_kind():
        x = k["us"] / k["floor_us"] if k["floor_us"] > 0 else float("nan")
        print(f"  {k['kind']:<14}{k['launches']:9d}{k['tasks']:8d}{k['us'] / 1e3:10.3f}"
              f"{k['floor_us'] / 1e3:10.3f}{x:8.1f}")
    print("  wrote " + ", ".join(paths))
    return 0


def _check_compile(args) -> None:
    """Refuse a compile whose tools are missing, before any work."""
    if args.nvcc:
        if shutil.which("nvcc") is None:
            args.parser.error("--nvcc: nvcc is not on PATH")
        from vbatch.kernels.cuda_build import nvcc_archs

        args.arch = args.arch or nvcc_archs(shutil.which("nvcc"))
        if not args.arch:
            args.parser.error("--nvcc: this nvcc knows none of the architectures the package "
                              "builds by default; name them with --arch")
        if args.out:
            try:
                Path(args.out).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                args.parser.error(f"argument --out: cannot make folder {args.out!r}: "
                                  f"{exc.strerror or exc}")
        else:
            from vbatch.kernels.cuda_build import BIN

            # (a read-only install: say so before a minute of nvcc, not after)
            if not os.access(BIN if BIN.exists() else BIN.parent, os.W_OK):
                args.parser.error(f"--nvcc: the package's kernel folder {BIN} is not "
                                  f"writable; name another with --out")
        return
    if args.arch or args.out:
        args.parser.error("--arch and --out apply only with --nvcc")
    from vbatch.runtime.device import cuda_status

    usable, why = cuda_status()
    if not usable:
        args.parser.error(f"compiling through CuPy/NVRTC needs a usable GPU, but {why}; "
                          f"--nvcc compiles with nvcc instead")


def main(argv: list[str] | None = None, prog: str = "vbatch") -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``). ``prog`` is the name that usage
    and errors show: ``vbatch`` for the console script, ``python -m vbatch`` from __main__."""
    from vbatch.core.errors import InputError

    args = _parser(prog).parse_args(argv)
    if args.cmd == "compile":
        _check_compile(args)
        return cmd_compile(args)
    if args.cmd == "tune":
        return cmd_tune(args)
    if args.cmd == "demo" and args.nonspd > args.count:
        args.parser.error(f"argument --nonspd: must be <= --count ({args.count}), "
                          f"got {args.nonspd}")
    # Options only the runtime can judge (nb for the backend, a GPU for --device cuda) surface
    # when it is built; anything raised later is a failure of the run, not of the arguments.
    try:
        rt = _runtime(args)
    except (InputError, RuntimeError) as exc:
        args.parser.error(str(exc))
    return {"demo": cmd_demo, "plan": cmd_plan, "trace": cmd_trace}[args.cmd](args, rt)


if __name__ == "__main__":
    sys.exit(main())
