"""vbatch in five minutes: a list, a packed batch, partial Cholesky, dependencies, info codes.

    python examples/quickstart.py [--device cpu|cuda|auto]
"""

import argparse

import numpy as np

import vbatch
from vbatch.ops.generate import spd_list


def main(device: str = "auto") -> None:
    rng = np.random.default_rng(0)
    rt = vbatch.Runtime(device)
    print(rt)

    # 1. A list of SPD matrices of different sizes. Factors come back as the same array kind.
    mats = spd_list([3, 50, 1, 0, 200], np.float64, rng)
    res = rt.cholesky(mats).result()
    print("info:", res.info, "| plan:", res.plan.summary())
    f = res.factors[1]
    f = f.get() if hasattr(f, "get") else f
    print("||A - L L^T|| / ||A|| for problem 1:", vbatch.residual(mats[1], f))

    # 2. Pack once, factor many times: no per-call packing, and the plan is cached on the batch.
    packed = vbatch.pack(mats)
    for _ in range(3):
        res = rt.cholesky(packed).result()
    print("packed factors:", res.factors)

    # 3. Partial Cholesky (a multifrontal front): factor the first npiv columns; the trailing
    #    block holds the Schur complement A22 - L21 L21^T.
    res = rt.cholesky(mats, npiv=[2, 20, 1, 0, 150]).result()
    print("partial: trailing block of problem 4 is", res.factors[4][150:, 150:].shape)

    # 4. Dependencies: the second submission starts once the first has finished.
    first = rt.cholesky(packed, overwrite=False)
    second = rt.cholesky(mats, after=[first])
    print("second ok:", second.result().ok, "| first done:", first.done())

    # 5. A matrix that is not SPD gets LAPACK's info; the others are unaffected.
    bad = [m.copy() for m in mats]
    bad[1][10, 10] = -1.0
    res = rt.cholesky(bad).result()
    print("info with problem 1 indefinite at column 11:", res.info, "failed:", res.failed())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    main(ap.parse_args().device)
