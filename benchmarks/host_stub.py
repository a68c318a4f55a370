"""The Python cost of one repeated packed call, counted in instructions: the runtime's own path
(key, kept call, replay, outputs, future) on a stub backend that launches nothing, so that
neither a GPU nor the host's noise enters the number.

    python benchmarks/host_stub.py [--op potrf|gemm|getrf] [--calls 2000] [--result]  # us a call
    python benchmarks/host_stub.py --callgrind [--op potrf] [--calls 2000]  # instructions

``--callgrind`` runs the calls under ``valgrind --tool=callgrind`` twice (none, then
``--calls``) and prints the difference per call: the same on every run of a tree, where a
timing on a shared host moves by 20-40% (docs/performance.md#host-overhead-of-a-call). For a
before/after comparison, run it under each tree's PYTHONPATH.

POTRF and GETRF: 2,000 SPD matrices of sizes in [1, 32), packed column-major. GEMM: C = A B + C
over 20 problems of those sizes. ``--result``: each call's ``result()`` too (its result object,
built after the wait). The stub is an asynchronous CPU backend whose launches do nothing and
whose completions are done at once (it reaches into the backend interface: a probe, not an
example).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

import numpy as np

import vbatch
from vbatch.kernels.backend import Completion
from vbatch.core.batch import tight_template
from vbatch.kernels.cpu import CpuBackend
from vbatch.ops.generate import spd_packed


class _Done(Completion):
    queue = 0

    def __init__(self, k: int):
        self.k = k

    def wait(self):
        return np.zeros(self.k, np.int32)

    def done(self) -> bool:
        return True


class _Stub(CpuBackend):
    asynchronous = True
    kind = "numpy"

    def replayer(self, plan, buffers, config, scalars=None):
        return lambda datas: _Done(plan.k)

    def run(self, plan, buffers, config, scalars=None):
        return _Done(plan.k)

    def order_after(self, after):
        pass

    def stage_input(self, batch, writable, others=()):
        return batch

    def new_output(self, like):
        return like.with_data(like.data)

    @staticmethod
    def new_data(d):
        return d

    def buffer_maker(self, m, n, dtype, order, zero=True):
        layout, total = tight_template(m, n, order)
        data = np.zeros(total, dtype)
        return layout, lambda: data  # (no allocation a call, as new_data)

    def batch_of(self, staged):
        return getattr(staged, "batch", staged)  # (inputs come unstaged; new buffers as views)

    def begin(self, plan, buffers, config, scalars=None):
        return plan

    def launch_all(self, ex, launches):
        pass

    def flush(self, ex, then=None):
        pass

    def end(self, ex):
        return _Done(ex.k)


def _calls(op: str, n: int, result: bool = False) -> float:
    rt = vbatch.Runtime("cpu")
    rt.backend, rt._pool = _Stub(), None
    g = spd_packed(np.random.default_rng(0).integers(1, 32, 2000))
    s = spd_packed(np.random.default_rng(0).integers(1, 32, 20))
    fn = {"potrf": lambda: rt.cholesky(g), "getrf": lambda: rt.getrf(g),
          "gemm": lambda: rt.gemm(s, s, s, beta=1.0)}[op]
    for _ in range(5):  # (the first calls prepare the call and make the replay)
        fn().result()
    t0 = time.perf_counter()
    if result:
        for _ in range(n):
            fn().result()
    else:
        for _ in range(n):
            fn()
    return (time.perf_counter() - t0) / max(n, 1) * 1e6


def _instructions(op: str, n: int, result: bool) -> int:
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, __file__, "--op", op, "--calls", str(n)]
                         + ["--result"] * result,
                         capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="potrf", choices=["potrf", "gemm", "getrf"])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--result", action="store_true")
    args = ap.parse_args(argv)
    if args.callgrind:
        per = (_instructions(args.op, args.calls, args.result)
               - _instructions(args.op, 0, args.result)) / args.calls
        print(f"{args.op}: {per:.0f} instructions a call")
    else:
        print(f"{args.op}: {_calls(args.op, args.calls, args.result):.2f} us a call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
