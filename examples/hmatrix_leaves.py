"""A kernel solve on an H-matrix (HODLR): vbatch factors the dense leaves and applies the rest.

A kernel matrix ``K = k(x_i, x_j) + sigma I`` on a few thousand points is dense, but its block
between two clusters of points is numerically of low rank. A cluster tree splits the points
(recursive bisection along the widest axis); at each node the block coupling its two children
is stored as ``U V^T``, and only the leaves' diagonal blocks are kept dense. That is HODLR, the
simplest H-matrix (weak admissibility: siblings are compressed however close they are). Every
step of the solve is a batch of problems of different sizes:

* the leaves' diagonal blocks (as many sizes as leaves) are factored in one vbatch ``cholesky``
  call. They are the block-Jacobi preconditioner, applied with one ``potrs`` call per CG step;
* a product ``K_H x`` is two batched ``gemm`` calls: ``w_j = V_j^T x[cols_j]`` for every
  low-rank block (ranks differ), then ``U_j w_j`` for every low-rank block together with
  ``D_i x[leaf_i]`` for every dense leaf.

Preconditioned CG on ``K_H x = b`` is checked against numpy's dense solve of ``K x = b``. The
kernel part of K is positive semi-definite, so ``lambda_min(K) >= sigma``, and with ``E = K -
K_H`` the error is bounded by ``(||E||_F + ||r||/||x||) / (sigma - ||E||_F)`` (``r`` the final
CG residual). The low-rank blocks are truncated so that ``||E||_F <= ETA * sigma``, and CG runs
to a relative residual of ``RTOL``; the program fails if the error is above ``TOL``.

    python examples/hmatrix_leaves.py [--points 3000] [--leaf 96] [--seed 0] [--device auto]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import cdist
from threadpoolctl import threadpool_limits

import vbatch

ELL = 0.05  # the kernel's length scale, on points in the unit square
SIGMA = 1e-2  # the diagonal shift: lambda_min(K) >= SIGMA, so cond(K) is a few thousand
ETA = 1e-7  # truncation: ||K - K_H||_F <= ETA * SIGMA
RTOL = 1e-11  # CG's stopping rule, on ||r|| / ||b||
TOL = 1e-6  # the relative error the solution must reach (its bound is printed; it is far lower)


def kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The exponential (Matern 1/2) kernel: positive definite, and its strong interactions are
    local, which is what a block-diagonal preconditioner captures."""
    return np.exp(-cdist(x, y) / ELL)


@dataclass
class Node:
    """A cluster: points ``start:stop`` of the tree order; two children or none (a leaf)."""

    start: int
    stop: int
    children: tuple[Node, ...] = ()


def cluster_tree(pts: np.ndarray, leaf: int, rng: np.random.Generator) -> tuple[Node, np.ndarray]:
    """Bisect along the widest axis until a cluster has at most ``leaf`` points. Each split is at
    a random quantile in [0.3, 0.7] instead of the exact median, so that leaves come in many
    sizes (an adaptive tree's would; an exact median on n = 3000 gives two). Returns the root
    and the permutation putting each cluster's points in one contiguous range."""
    order: list[np.ndarray] = []
    count = 0

    def split(idx: np.ndarray) -> Node:
        nonlocal count
        start = count
        if len(idx) <= leaf:
            order.append(idx)
            count += len(idx)
            return Node(start, count)
        p = pts[idx]
        axis = int(np.argmax(np.ptp(p, axis=0)))
        cut = int(round(rng.uniform(0.3, 0.7) * len(idx)))
        part = np.argpartition(p[:, axis], cut)
        left = split(idx[part[:cut]])
        right = split(idx[part[cut:]])
        return Node(start, count, (left, right))

    root = split(np.arange(len(pts)))
    return root, np.concatenate(order)


def low_rank(a: np.ndarray, tau: float, rng: np.random.Generator, step: int = 32):
    """``U, V`` with ``||a - U V^T||_F <= tau``, and that error's square.

    A blocked randomized range finder (Martinsson and Voronin 2016, randQB_b): ``step`` columns
    at a time, each sampled from what is left of ``a``, until what is left has ``||.||_F <=
    tau / 2``. What is left is kept explicitly and measured, not estimated as ``||a||^2 -
    ||Q^T a||^2``, which cancels to noise far above the ``tau^2`` wanted here. Then an SVD of
    the small ``Q^T a``, truncated within the rest of the budget: the two errors are orthogonal,
    so their squares add. (A full SVD of the largest blocks would take seconds.)"""
    m, n = a.shape
    rest = a.copy()
    r2 = float(np.sum(rest * rest))
    qs, bs = [], []
    width = 0
    while r2 > 0.25 * tau * tau and width + step < min(m, n):
        q, _ = np.linalg.qr(rest @ rng.standard_normal((n, step)))
        if qs:  # once more against the basis so far: the samples lose orthogonality to it
            basis = np.hstack(qs)
            q, _ = np.linalg.qr(q - basis @ (basis.T @ q))
        b = q.T @ rest
        rest -= q @ b
        r2 = float(np.sum(rest * rest))
        qs.append(q)
        bs.append(b)
        width += step
    if r2 > 0.25 * tau * tau:  # numerically of full rank: an SVD of the block itself
        q, r2 = None, 0.0
        u, s, vt = np.linalg.svd(a, full_matrices=False)
    elif not qs:
        return np.zeros((m, 0)), np.zeros((n, 0)), r2
    else:
        q = np.hstack(qs)
        u, s, vt = np.linalg.svd(np.vstack(bs), full_matrices=False)
    # tail[r] = ||s[r:]||^2: keep the fewest singular values whose dropped tail fits the budget.
    tail = np.r_[np.cumsum((s * s)[::-1])[::-1], 0.0]
    rank = int(np.argmax(tail <= tau * tau - r2))
    u = u[:, :rank] * s[:rank]
    if q is not None:
        u = q @ u
    return np.ascontiguousarray(u), np.ascontiguousarray(vt[:rank].T), r2 + tail[rank]


def leaves_of(node: Node) -> list[Node]:
    return [node] if not node.children else [x for c in node.children for x in leaves_of(c)]


def siblings(node: Node) -> list[tuple[Node, Node]]:
    if not node.children:
        return []
    a, b = node.children
    return [(a, b), *siblings(a), *siblings(b)]


def pcg(matvec, b, precond, rtol: float, maxiter: int):
    """Preconditioned CG (on numpy or cupy arrays); returns x, the iterations, and whether
    ``||r|| <= rtol ||b||`` was reached (on CG's own residual)."""
    x = b * 0
    r = b.copy()
    z = precond(r)
    p = z.copy()
    rz = float((r * z).sum())
    bnorm = float((b * b).sum()) ** 0.5
    for it in range(1, maxiter + 1):
        q = matvec(p)
        alpha = rz / float((p * q).sum())
        x += alpha * p
        r -= alpha * q
        if float((r * r).sum()) ** 0.5 <= rtol * bnorm:
            return x, it, True
        z = precond(r)
        rz, rz_old = float((r * z).sum()), rz
        p = z + (rz / rz_old) * p
    return x, maxiter, False


def main(points: int, leaf: int, device: str, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    rt = vbatch.Runtime(device)
    if rt.device == "cuda":
        import cupy as xp
    else:
        xp = np
    t0 = time.perf_counter()
    pts = rng.random((points, 2))
    root, perm = cluster_tree(pts, leaf, rng)
    pts = pts[perm]  # tree order from here on: each cluster is one range of indices
    leaves = [(c.start, c.stop) for c in leaves_of(root)]
    pairs = siblings(root)

    # Each sibling pair gives two blocks, K[a, b] ~ U V^T and K[b, a] ~ V U^T; with the budget
    # split evenly, ||E||_F^2 = sum over blocks <= (ETA * SIGMA)^2.
    tau = ETA * SIGMA / np.sqrt(2 * len(pairs))
    rows, cols, us, vs = [], [], [], []
    err2 = 0.0
    for a, b in pairs:
        # One BLAS thread: these products and QRs are small, and with two threads on two cores
        # this loop took 4-12 s instead of 0.6 s whenever another process held a core.
        with threadpool_limits(1, user_api="blas"):
            u, v, e2 = low_rank(kernel(pts[a.start:a.stop], pts[b.start:b.stop]), tau, rng)
        u, v = xp.asarray(u), xp.asarray(v)  # once each, though both blocks use them
        err2 += 2 * e2
        rows += [(a.start, a.stop), (b.start, b.stop)]
        cols += [(b.start, b.stop), (a.start, a.stop)]
        us += [u, v]
        vs += [v, u]
    dense = [kernel(pts[s:e], pts[s:e]) + SIGMA * np.eye(e - s) for s, e in leaves]
    err_f = np.sqrt(err2)
    t_build = time.perf_counter() - t0

    t0 = time.perf_counter()
    dense_x = [xp.asarray(d) for d in dense]
    chol = rt.cholesky(dense_x).result()
    t_fact = time.perf_counter() - t0
    if not chol.ok:
        print("leaf blocks not SPD:", chol.failed())
        return 1
    factors = chol.factors
    # The second GEMM's batch: every low-rank block's U, then every dense leaf.
    outer = us + dense_x
    out_rows = rows + leaves

    def matvec(x):
        w = rt.gemm(vs, [x[s:e] for s, e in cols], trans_a=True).result()
        parts = rt.gemm(outer, w + [x[s:e] for s, e in leaves]).result()
        y = xp.zeros_like(x)
        for (s, e), part in zip(out_rows, parts):
            y[s:e] += part
        return y

    def block_jacobi(r):
        return xp.concatenate(rt.potrs(factors, [r[s:e] for s, e in leaves]).result())

    b = xp.asarray(rng.standard_normal((points, 1)))
    runs = {}
    for name, precond in (("none", lambda r: r), ("block-Jacobi", block_jacobi)):
        t0 = time.perf_counter()
        runs[name] = (*pcg(matvec, b, precond, RTOL, 5 * points), time.perf_counter() - t0)

    t0 = time.perf_counter()
    k_dense = kernel(pts, pts) + SIGMA * np.eye(points)
    b_host = b.get() if hasattr(b, "get") else b
    x_ref = np.linalg.solve(k_dense, b_host)
    t_dense = time.perf_counter() - t0
    x_ref_norm = np.linalg.norm(x_ref)

    sizes = np.diff(np.array(leaves), axis=1).ravel()
    ranks = np.array([u.shape[1] for u in us[::2]])
    print(f"n = {points} points, {len(leaves)} leaves (sizes {sizes.min()}..{sizes.max()}), "
          f"{len(pairs)} low-rank sibling pairs (ranks {ranks.min()}..{ranks.max()}, "
          f"mean {ranks.mean():.0f})")
    stored = sum(m.size for m in dense) + 2 * sum(u.size for u in us[::2])
    print(f"  stored {stored / points**2:.1%} of the dense matrix; ||K - K_H||_F = {err_f:.1e} "
          f"(<= {ETA:.0e} * sigma); built in {t_build:.2f} s")
    print(f"  {len(leaves)} leaf blocks factored on {rt.device} in {t_fact * 1e3:.1f} ms "
          f"(plan: {chol.plan.summary()})")
    ok = True
    for name, (x, iters, converged, secs) in runs.items():
        x_host = x.get() if hasattr(x, "get") else x
        err = np.linalg.norm(x_host - x_ref) / x_ref_norm
        r = b - matvec(x)  # the true residual of K_H x = b, for the bound
        r_norm = float((r * r).sum()) ** 0.5
        bound = (err_f + r_norm / x_ref_norm) / (SIGMA - err_f)
        good = converged and err <= TOL
        ok &= good
        print(f"  CG, preconditioner {name:>12}: {iters:4d} iterations in {secs:5.2f} s, "
              f"error vs dense solve {err:.1e} (bound {bound:.1e}, tolerance {TOL:.0e})"
              f"{'' if good else '  FAILED'}")
    print(f"  dense numpy solve for reference: {t_dense:.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=3000)
    ap.add_argument("--leaf", type=int, default=96, help="most points in a leaf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args()
    raise SystemExit(main(args.points, args.leaf, args.device, args.seed))
