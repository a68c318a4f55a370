"""CPU backend: every launch of the plan executed for real with numpy and LAPACK/BLAS.

A launch covers problems ``plan.order[lo:hi]`` at one global step. For each of them the backend
finds its panel (``j = (step - start) * nb``, width ``w = min(nb, p - j)``) and runs the task kind:

* ``update``: ``A[j:, j:j+w] -= A[j:, :j] @ A[j:j+w, :j]^T`` (numpy matmul, i.e. BLAS gemm);
* ``potf2``:  LAPACK ``?potrf`` on the ``w x w`` diagonal block (scipy's wrapper);
* ``trsm``:   BLAS ``?trsm`` (right, lower, transposed) on the rows below the block;
* ``fused``:  the three above for one problem before moving to the next;
* ``schur``:  ``A[p:, p:] -= A[p:, :p] @ A[p:, :p]^T`` for partial factorizations.

It works in place on the output buffer (a copy of the input unless the caller asked to
overwrite), writes zeros above the diagonal of every panel it finishes, and never factors past a
problem's first failed pivot, so one bad matrix cannot disturb another.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import blas, lapack

from vbatch.kernels.backend import Backend, Completion, PlanDefaults
from vbatch.ops.batch import MatrixList, PackedBatch, array_kind, array_module, pack
from vbatch.ops.cholesky import potrf_info
from vbatch.scheduler.plan import Launch, Plan


@dataclass
class _Execution:
    plan: Plan
    views: list  # plan position -> 2-D view of the output buffer
    n: list
    npiv: list
    start: list
    info: np.ndarray  # plan order, int32
    potrf: object
    trsm: object


class _Done(Completion):
    def __init__(self, info: np.ndarray):
        self._info = info  # caller's order

    def wait(self) -> np.ndarray:
        return self._info

    def done(self) -> bool:
        return True


def _update(a, j: int, w: int) -> None:
    if j:
        a[j:, j : j + w] -= a[j:, :j] @ a[j : j + w, :j].T


def _potf2(a, j: int, w: int, potrf) -> int:
    d = a[j : j + w, j : j + w]
    c, info = potrf(d, lower=1, clean=1)
    d[...] = c  # LAPACK leaves its partial result in place on failure; so do we
    info = potrf_info(c.diagonal(), info)  # NaN pivots fail too (OpenBLAS misses them)
    if not info and j:
        # The panel's columns above the diagonal block. This belongs to potf2, not trsm, because
        # the plan drops a trsm launch that has no rows below the block.
        a[:j, j : j + w] = 0.0
    return int(info)


def _trsm(a, j: int, w: int, trsm) -> None:
    if a.shape[0] > j + w:
        b = a[j + w :, j : j + w]
        b[...] = trsm(1.0, a[j : j + w, j : j + w], b, side=1, lower=1, trans_a=1)


class CpuBackend(Backend):
    name = "cpu"
    kind = "numpy"
    asynchronous = False

    def plan_defaults(self, dtype: np.dtype) -> PlanDefaults:
        # Per (problem, step) Python and LAPACK-call overhead dominates on the CPU, so wider
        # panels win: on uniform Nmax = 128, k = 2000, float64, nb = 64 took 294 ms of CPU time
        # against 389 ms for nb = 32 (docs/notes.md). nb = 128 is faster still (219 ms) but makes
        # most such matrices a single unblocked step. No shared-memory limit: always fused.
        return PlanDefaults(nb=64, fused_max_rows=np.iinfo(np.int64).max, streams=1)

    # ------------------------------------------------------------ memory
    def adopt(self, batch: PackedBatch, overwrite: bool) -> tuple[PackedBatch, PackedBatch]:
        # LAPACK works in place, so the output starts as a copy of the input.
        if batch.kind == "numpy":
            work = batch if overwrite else batch.with_data(batch.data.copy())
        else:
            work = batch.with_data(array_module(batch.kind).asnumpy(batch.data))
        return work, work

    def pack_list(self, mats: MatrixList, order: str) -> PackedBatch:
        if mats.kind != "numpy":
            xp = array_module(mats.kind)
            mats = MatrixList(mats=[xp.asnumpy(m) for m in mats.mats])
        return pack(mats, order=order)

    def scatter(self, work: PackedBatch, target: list | PackedBatch) -> None:
        if isinstance(target, PackedBatch):
            target.data[...] = array_module(target.kind).asarray(work.data)
            return
        for i, m in enumerate(target):
            if m.shape[0]:
                m[...] = array_module(array_kind(m)).asarray(work.matrix(i))

    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        if kind == "numpy":
            return work
        return work.with_data(array_module(kind).asarray(work.data))

    # ------------------------------------------------------------ execution
    def begin(self, src: PackedBatch, dst: PackedBatch, plan: Plan,
              after: list[Completion]) -> _Execution:
        if src is not dst:
            dst.data[...] = src.data
        for dep in after:
            dep.wait()
        work = dst
        views = work.unpack()
        probe = np.empty(0, dtype=work.dtype)
        return _Execution(
            plan=plan,
            views=[views[i] for i in plan.order.tolist()],
            n=plan.n.tolist(),
            npiv=plan.npiv.tolist(),
            start=plan.start.tolist(),
            info=np.zeros(len(plan.order), dtype=np.int32),
            potrf=lapack.get_lapack_funcs("potrf", (probe,)),
            trsm=blas.get_blas_funcs("trsm", (probe,)),
        )

    def launch(self, ex: _Execution, lc: Launch) -> None:
        # A matrix with NaN or inf is reported through its info, not through numpy warnings.
        with np.errstate(all="ignore"):
            self._launch(ex, lc)

    def _launch(self, ex: _Execution, lc: Launch) -> None:
        nb, t, info = ex.plan.nb, lc.step, ex.info
        live = [q for q in range(lc.lo, lc.hi) if not info[q]]
        if lc.kind == "schur":
            for q in live:
                a, p = ex.views[q], ex.npiv[q]
                tr = a[p:, p:]
                if p:
                    tr -= a[p:, :p] @ a[p:, :p].T
                    a[:p, p:] = 0.0
                tr[...] = np.tril(tr)
            return
        for q in live:
            a = ex.views[q]
            j = (t - ex.start[q]) * nb
            w = min(nb, ex.npiv[q] - j)
            if lc.kind == "fused":
                _update(a, j, w)
                bad = _potf2(a, j, w, ex.potrf)
                if bad:
                    info[q] = j + bad
                    continue
                _trsm(a, j, w, ex.trsm)
            elif lc.kind == "update":
                _update(a, j, w)
            elif lc.kind == "potf2":
                bad = _potf2(a, j, w, ex.potrf)
                if bad:
                    info[q] = j + bad
            elif lc.kind == "trsm":
                _trsm(a, j, w, ex.trsm)
            else:
                raise ValueError(f"cpu backend: unknown launch kind {lc.kind!r}")

    def end(self, ex: _Execution) -> Completion:
        info = np.zeros(ex.plan.k, dtype=np.int32)
        info[ex.plan.order] = ex.info
        return _Done(info)
