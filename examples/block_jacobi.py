"""Block-Jacobi preconditioned CG on a real sparse SPD matrix: vbatch factors and applies blocks.

A block-Jacobi preconditioner needs the Cholesky factors of many diagonal blocks of different
sizes: exactly a variable-size batch. The matrix is cut at random points into ``--blocks``
blocks (sizes 1 to ~2 * mean), and a block larger than ``--max-block`` is split evenly. The
blocks are factored in one vbatch ``cholesky`` call, and each CG step applies the
preconditioner with one ``potrs`` call over all blocks (one right-hand side each).

Blocks go up to 512 (Ginkgo's block-Jacobi stops at 32, a warp), so the same cuts are run with
the largest block capped at 32, 64, ... up to ``--max-block``: larger blocks keep more of the
matrix, and CG needs fewer iterations. ``--setup posv`` builds the preconditioner with one
``posv`` call on the blocks of the right-hand side instead: the factors and ``M^-1 b`` come out
of one task graph, and CG starts from ``M^-1 b``.

    python examples/block_jacobi.py --matrix ../shared/data/matrices/bcsstk09.mtx \
        [--blocks 4] [--max-block 512] [--setup cholesky|posv]

Without --matrix it uses a 2-D Laplacian on a 30 x 30 grid (n = 900), cut at whole grid lines.
"""

import argparse
import time

import numpy as np
import scipy.sparse as sp
from scipy.io import mmread
from scipy.sparse.linalg import LinearOperator, cg

import vbatch

GINKGO_MAX = 32  # Ginkgo's largest block-Jacobi block


def laplacian_2d(m: int) -> sp.csr_matrix:
    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m), dtype=np.float64)
    return (sp.kron(sp.eye(m), t) + sp.kron(t, sp.eye(m))).tocsr()


def cap_blocks(cuts: np.ndarray, cap: int, unit: int) -> np.ndarray:
    """Split every block longer than ``cap`` into the fewest equal parts no longer than it;
    parts are whole multiples of ``unit`` rows (a grid line) when ``cap`` allows."""
    if cap < unit:
        unit = 1
    out = [0]
    for s, e in zip(cuts[:-1], cuts[1:]):
        units = (e - s) // unit
        parts = -(-units // (cap // unit))
        out += [s + unit * int(round(units * j / parts)) for j in range(1, parts)] + [e]
    return np.asarray(out)


def to_host(x):
    return x.get() if hasattr(x, "get") else x


def main(matrix: str | None, blocks: int, device: str, max_block: int = 512,
         setup: str = "cholesky", seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    if matrix:
        a = mmread(matrix).tocsr().astype(np.float64)
        n = a.shape[0]
        unit = 1
        inner = rng.choice(np.arange(1, n), min(blocks, n) - 1, replace=False)
    else:
        # Blocks made of whole grid lines couple what the Laplacian couples most strongly.
        m = unit = 30
        a = laplacian_2d(m)
        inner = m * rng.choice(np.arange(1, m), min(blocks, m) - 1, replace=False)
        n = m * m
    base = np.unique(np.r_[0, inner, n])

    rt = vbatch.Runtime(device)
    if rt.device == "cuda":
        import cupy as xp
    else:
        xp = np
    b = a @ np.ones(n)
    ok = True

    def run_cg(name: str, M=None, x0=None, note: str = "") -> None:
        nonlocal ok
        it = []
        t0 = time.perf_counter()
        x, info = cg(a, b, x0=x0, M=M, rtol=1e-8, maxiter=20 * n, callback=it.append)
        secs = time.perf_counter() - t0
        err = np.linalg.norm(x - 1) / np.sqrt(n)
        ok &= info == 0
        print(f"  {name:<24} {len(it):5d} CG iterations in {secs:5.2f} s, error {err:.1e}, "
              f"info {info}{note}")

    print(f"n = {n}, cut into {len(base) - 1} blocks at random points; blocks factored on "
          f"{rt.device} ({setup}), applied with potrs in each CG step")
    run_cg("no preconditioner")
    caps = sorted({2**e for e in range(5, 20) if 2**e < max_block} | {max_block})
    seen = set()
    worst = 0.0
    for cap in caps:
        cuts = cap_blocks(base, cap, unit)
        if tuple(cuts) in seen:  # the cap no longer splits anything: the same blocks again
            continue
        seen.add(tuple(cuts))
        spans = list(zip(cuts[:-1], cuts[1:]))
        diag_blocks = [a[s:e, s:e].toarray() for s, e in spans]
        on_device = [xp.asarray(d) for d in diag_blocks]
        t0 = time.perf_counter()
        if setup == "posv":
            res = rt.posv(on_device, [xp.asarray(b[s:e, None]) for s, e in spans]).result()
            x0 = to_host(xp.concatenate(res.solutions)).ravel()  # M^-1 b
        else:
            res = rt.cholesky(on_device).result()
            x0 = None
        t_fact = time.perf_counter() - t0
        if not res.ok:
            print("diagonal blocks not SPD:", res.failed())
            return 1
        factors = res.factors
        worst = max(worst, *(vbatch.residual(d, to_host(f))
                             for d, f in zip(diag_blocks, factors)))

        def apply(r, factors=factors, spans=spans):
            r = xp.asarray(r).reshape(-1, 1)
            return to_host(xp.concatenate(
                rt.potrs(factors, [r[s:e] for s, e in spans]).result()))

        sizes = np.diff(cuts)
        label = f"blocks <= {cap}" + (" (Ginkgo's)" if cap == GINKGO_MAX else "")
        note = f"; {len(sizes)} blocks of {sizes.min()}..{sizes.max()}, factored in " \
               f"{t_fact * 1e3:.1f} ms"
        if x0 is not None:
            note += f", start ||b - A M^-1 b|| / ||b|| = " \
                    f"{np.linalg.norm(b - a @ x0) / np.linalg.norm(b):.1e}"
        run_cg(label, LinearOperator((n, n), matvec=apply, dtype=np.float64), x0, note)
    print(f"worst block residual {worst:.1e}; plan of the last: {res.plan.summary()}")
    return 0 if ok and worst < 1e-12 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", help="a Matrix Market file of an SPD matrix")
    ap.add_argument("--blocks", type=int, default=4, help="blocks cut at random points")
    ap.add_argument("--max-block", type=int, default=512, help="largest block (>= 1)")
    ap.add_argument("--setup", default="cholesky", choices=["cholesky", "posv"],
                    help="factor with cholesky, or with posv on the blocks of b")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.max_block < 1 or args.blocks < 1:
        ap.error("--blocks and --max-block must be at least 1")
    raise SystemExit(main(args.matrix, args.blocks, args.device, args.max_block, args.setup,
                          args.seed))
