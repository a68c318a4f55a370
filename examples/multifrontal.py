"""A sparse SPD system solved by vbatch's multifrontal Cholesky, checked against scipy.

    python examples/multifrontal.py [--matrix FILE] [--device cpu|cuda] [--rhs 4]

``--matrix``: a Matrix Market file, or a 0-based ``i j value`` triplet file holding the lower
triangle (as ../shared/data/matrices/bcsstk16.triplet0); without it, ``$VBATCH_MATRICES``'s
bcsstk16 when present, else the 2-D Laplacian on a 60 x 60 grid. It factors the matrix, solves
``A X = B`` for ``--rhs`` right-hand sides, refactors ``A + I`` with the same analysis, and
prints the backward errors, the fronts and the time of each phase. Exits 1 if an error is
large.
"""

import argparse
import os

import numpy as np
import scipy.sparse as sp

import vbatch
import vbatch.sparse as vs

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(os.environ.get("VBATCH_MATRICES", os.path.join(
    HERE, "..", "..", "shared", "data", "matrices")), "bcsstk16.triplet0")


def backward(A, x, b) -> float:
    """max |A x - b| / (||A||_inf max|x| + max|b|)."""
    return float(np.abs(A @ x - b).max()
                 / (abs(A).sum(axis=1).max() * np.abs(x).max() + np.abs(b).max()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rhs", type=int, default=4)
    args = ap.parse_args()
    path = args.matrix or (DEFAULT if os.path.exists(DEFAULT) else None)
    A = vs.read(path) if path else vs.laplacian(60, 2)
    name = os.path.basename(path) if path else "2-D Laplacian 60 x 60"
    n = A.shape[0]
    print(f"matrix: {name}, n = {n}, nnz = {A.nnz}, device {args.device}")
    rt = vbatch.Runtime(args.device)
    F = vs.cholesky(A, runtime=rt)
    s = F.stats
    print(f"fronts: {s.fronts} (largest {s.largest_front}, tree height {s.levels}), "
          f"nnz(L) = {s.nnz_l:,}, {s.flops / 1e6:.1f} Mflop, info {F.info.tolist()}")
    B = np.random.default_rng(0).standard_normal((n, args.rhs))
    if args.device == "cuda":
        import cupy

        X = F.solve(cupy.asarray(B)).get()
    else:
        X = F.solve(B)
    err = backward(A, X, B)
    ref = sp.linalg.spsolve(sp.csc_matrix(A), B)
    diff = float(np.abs(X - ref).max() / np.abs(ref).max())
    print(f"time: analysis {1e3 * s.analysis_s:.1f} ms, factor {1e3 * s.factor_s:.1f} ms, "
          f"solve {1e3 * s.solve_s:.1f} ms")
    print(f"backward error {err:.2e}; against scipy spsolve {diff:.2e}")
    A2 = sp.csr_matrix(A + sp.eye(n))
    X2 = F.refactor(A2).solve(B)
    X2 = X2.get() if hasattr(X2, "get") else X2
    err2 = backward(A2, X2, B)
    print(f"refactor(A + I): backward error {err2:.2e}, factor {1e3 * F.stats.factor_s:.1f} ms")
    ok = max(err, err2) <= 100 * n * np.finfo(np.float64).eps and not F.info.any()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
