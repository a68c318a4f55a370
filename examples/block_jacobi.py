"""Block-Jacobi preconditioned CG on a real sparse SPD matrix; vbatch factors the blocks.

A block-Jacobi preconditioner needs the Cholesky factors of many diagonal blocks of different
sizes: exactly a variable-size batch. The blocks are cut at random points (sizes 1 to ~2 * mean),
factored in one vbatch call, and applied with two triangular solves per block in each CG step.

    python examples/block_jacobi.py --matrix ../shared/data/matrices/bcsstk09.mtx [--blocks 12]

Without --matrix it uses a 2-D Laplacian on a 30 x 30 grid (n = 900).
"""

import argparse
import time

import numpy as np
import scipy.sparse as sp
from scipy.io import mmread
from scipy.linalg import solve_triangular
from scipy.sparse.linalg import LinearOperator, cg

import vbatch


def laplacian_2d(m: int) -> sp.csr_matrix:
    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m), dtype=np.float64)
    return (sp.kron(sp.eye(m), t) + sp.kron(t, sp.eye(m))).tocsr()


def main(matrix: str | None, blocks: int, device: str, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    if matrix:
        a = mmread(matrix).tocsr().astype(np.float64)
        n = a.shape[0]
        inner = rng.choice(np.arange(1, n), min(blocks, n) - 1, replace=False)
    else:
        # Blocks made of whole grid lines couple what the Laplacian couples most strongly.
        m = 30
        a = laplacian_2d(m)
        inner = m * rng.choice(np.arange(1, m), min(blocks, m) - 1, replace=False)
        n = m * m
    cuts = np.unique(np.r_[0, inner, n])
    diag_blocks = [a[s:e, s:e].toarray() for s, e in zip(cuts[:-1], cuts[1:])]

    rt = vbatch.Runtime(device)
    t0 = time.perf_counter()
    res = rt.cholesky(diag_blocks).result()
    t_fact = time.perf_counter() - t0
    if not res.ok:
        print("diagonal blocks not SPD:", res.failed())
        return 1
    factors = [f.get() if hasattr(f, "get") else f for f in res.factors]
    worst = max(vbatch.residual(d, f) for d, f in zip(diag_blocks, factors))

    def apply(r):
        out = np.empty_like(r)
        for (s, e), L in zip(zip(cuts[:-1], cuts[1:]), factors):
            y = solve_triangular(L, r[s:e], lower=True)
            out[s:e] = solve_triangular(L, y, lower=True, trans="T")
        return out

    b = a @ np.ones(n)
    converged = True
    for name, M in (("none", None), ("block-Jacobi", LinearOperator((n, n), matvec=apply))):
        it = []
        x, info = cg(a, b, M=M, rtol=1e-8, maxiter=20 * n, callback=it.append)
        err = np.linalg.norm(x - 1) / np.sqrt(n)
        converged &= info == 0
        print(f"  CG, preconditioner {name:>12}: {len(it):5d} iterations, error {err:.1e}, "
              f"info {info}")
    sizes = np.diff(cuts)
    print(f"n = {n}, {len(sizes)} blocks (sizes {sizes.min()}..{sizes.max()}), factored on "
          f"{rt.device} in {t_fact * 1e3:.1f} ms, worst block residual {worst:.1e}")
    print(f"plan: {res.plan.summary()}")
    return 0 if converged and worst < 1e-12 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", help="a Matrix Market file of an SPD matrix")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args()
    raise SystemExit(main(args.matrix, args.blocks, args.device))
