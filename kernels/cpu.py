"""CPU backend: each launch group's tasks run one per core, each on a single-threaded BLAS.

A launch covers problems ``plan.order[lo:hi]`` at one global step; its tasks are independent, so
the backend hands them to a pool of threads, largest first, each thread pulling the next task as
it finishes one (the largest-processing-time-first greedy). Every task is a handful of
BLAS/LAPACK calls through :mod:`vbatch.kernels.lapack` (scipy's library, called through ctypes,
which releases the GIL):

* ``fused``:  the step's panel of the output is copied from the input, brought up to date
  (``syrk`` on the diagonal block, ``gemm`` below it), its diagonal block factored (``potrf``) and
  the rows below solved (``trsm``);
* ``update``, ``potf2``, ``trsm``: the same three, one per launch (separated plans);
* ``schur``: the trailing block copied and updated by ``syrk`` (partial factorizations).

Where a problem fits in one panel (the default panel width is large, see ``plan_defaults``) its
fused task is one ``potrf`` of the whole problem: the best single-core code there is. A task too
large to share the machine, one that would alone take longer than the rest of its launch spread
over the other cores, runs before the others with the BLAS's own threads instead. So the blocked
plan with threaded tasks is used only where a problem is large enough to need threads inside it.

Out of place, each task copies the part of the input it is about to work on (one pass, while it
is in cache); nothing copies the whole input first. ``info`` follows reference LAPACK: the first
pivot that is not > 0, NaN included (OpenBLAS's ``potrf`` misses NaN; a vectorized scan of the
diagonals at the end catches it). A failed problem's columns before the failing one hold its
factor, as the partial factorization of those columns would: on a failed ``potrf`` the diagonal
block is restored, its leading columns refactored and the rows below solved against them.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from dataclasses import dataclass

import numpy as np

from vbatch.kernels.backend import Backend, Completion, PlanDefaults
from vbatch.kernels.lapack import BlasThreads, Calls
from vbatch.ops.batch import MatrixList, PackedBatch, array_kind, array_module, pack
from vbatch.ops.cholesky import FUSED, POTF2, SCHUR, TRSM, UPDATE
from vbatch.scheduler.plan import Launch, Plan


@dataclass
class _Work:
    """One launch's tasks, ``(q, j, w)`` per problem (plan position, first panel column,
    width): ``wide`` ones run alone with the BLAS's threads; ``narrow`` ones run one per thread,
    handed out in ``chunks`` (lists of tasks, largest first) so that a thread takes many tiny
    tasks per turn. A chunk of ``whole`` tasks holds problems factored entirely by this launch
    (one panel, the whole matrix): those take a two-call path."""

    wide: list
    chunks: list  # [(whole: bool, [task, ...]), ...]


# Tasks are handed to threads in chunks of at least this many flops (or one task), so that the
# hand-out (a lock and a list step, ~0.3 us) is small against the work: a 30 x 30 potrf is ~9 kflop.
CHUNK_FLOPS = 50e3


@dataclass
class _Prepared:
    """Per (batch layout, plan), built once and cached on the batch."""

    plan: Plan
    off: list  # plan position -> byte offset of the matrix in the buffer
    ld: list
    n: list
    p: list
    work: list  # launch index -> _Work
    diag: np.ndarray  # element index of every pivot L(i, i), i < p, problems in plan order
    diag_owner: np.ndarray  # plan position owning each entry of diag
    diag_first: np.ndarray  # plan position -> index into diag of its first pivot


@dataclass
class _Execution:
    prep: _Prepared
    src: PackedBatch
    dst: PackedBatch
    src_base: int
    dst_base: int
    in_place: bool
    info: np.ndarray  # plan order, int32: LAPACK's own info (the NaN scan comes at the end)

    @property
    def plan(self) -> Plan:
        return self.prep.plan


class _Done(Completion):
    def __init__(self, info: np.ndarray):
        self._info = info  # caller's order

    def wait(self) -> np.ndarray:
        return self._info

    def done(self) -> bool:
        return True


def _task_flops(kind: str, j: np.ndarray, w: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Operation counts of one step's tasks (j: first panel column, w: width, m = n - j)."""
    j, w, m = (np.asarray(x, dtype=np.float64) for x in (j, w, m))
    upd = 2.0 * m * w * j
    pot = w**3 / 3
    trs = w * w * np.maximum(m - w, 0)
    return {FUSED: upd + pot + trs, UPDATE: upd, POTF2: pot, TRSM: trs}[kind]


def _host_memory() -> tuple[int, int]:
    """(total, available) bytes of host memory; available from /proc/meminfo where it exists."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0, 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return total, int(line.split()[1]) * 1024
    except OSError:
        pass
    return total, total


class CpuBackend(Backend):
    name = "cpu"
    kind = "numpy"
    asynchronous = False

    def __init__(self):
        self.threads = BlasThreads()
        self._pool = (cf.ThreadPoolExecutor(self.threads.size - 1, thread_name_prefix="vbatch-cpu")
                      if self.threads.size > 1 else None)
        self._local = threading.local()
        # Launches of different runtimes share the cores and the BLAS thread setting: one at a
        # time.
        self._run_lock = threading.Lock()

    def plan_defaults(self, dtype: np.dtype) -> PlanDefaults:
        # A problem that fits in one panel is one LAPACK potrf, the fastest single-core code;
        # wider problems are blocked, and their tasks get the BLAS's threads when they dominate
        # a launch. 512 measured best on the 2-core VM (docs/notes.md, 2026-11-21). No
        # shared-memory limit: always fused.
        return PlanDefaults(nb=512, fused_max_rows=np.iinfo(np.int64).max, streams=1)

    # ------------------------------------------------------------ memory
    def memory_total(self) -> int:
        return _host_memory()[0]

    def memory_free(self) -> int:
        return _host_memory()[1]

    def adopt(self, batch: PackedBatch, overwrite: bool) -> tuple[PackedBatch, PackedBatch]:
        if batch.kind == "numpy":
            if overwrite:
                return batch, batch
            # Zeros, not empty: calloc'd pages cost nothing more, and the whole-problem path
            # then has nothing above the diagonal to write.
            return batch, batch.with_data(np.zeros(batch.data.size, batch.dtype))
        host = batch.with_data(array_module(batch.kind).asnumpy(batch.data))  # a copy: ours
        return host, host

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

    # ------------------------------------------------------------ planning per batch
    def _prepare(self, batch: PackedBatch, plan: Plan) -> _Prepared:
        key = ("cpu", id(plan))
        hit = batch._cache.get(key)
        if hit is not None and hit.plan is plan:
            return hit
        order = plan.order
        isz = batch.dtype.itemsize
        nb = plan.nb
        work = []
        for lc in plan.launches:
            q = np.arange(lc.lo, lc.hi)
            if lc.kind == SCHUR:
                tr = plan.n[q] - plan.npiv[q]
                cost = tr.astype(np.float64) ** 2 * plan.npiv[q] + 1.0
                j = plan.npiv[q]
                w = tr
            else:
                j = (lc.step - plan.start[q]) * nb
                w = np.minimum(nb, plan.npiv[q] - j)
                cost = _task_flops(lc.kind, j, w, plan.n[q] - j) + 1.0
            # A task longer than its share of the launch is on the critical path: give it the
            # BLAS's threads (it runs alone, before the rest).
            wide = (cost * self.threads.size > cost.sum()) if self.threads.size > 1 else \
                np.zeros(len(q), dtype=bool)
            whole = (lc.kind == FUSED) & (j == 0) & (w == plan.n[q])
            by_cost = np.argsort(-cost, kind="stable")
            wide_tasks, chunks = [], []
            cur, cur_whole, acc = [], None, 0.0
            for i in by_cost.tolist():
                t = (int(q[i]), int(j[i]), int(w[i]))
                if wide[i]:
                    wide_tasks.append(t)
                    continue
                wh = bool(whole[i])
                if cur and (wh != cur_whole or acc >= CHUNK_FLOPS):
                    chunks.append((cur_whole, cur))
                    cur, acc = [], 0.0
                cur.append(t)
                cur_whole = wh
                acc += float(cost[i])
            if cur:
                chunks.append((cur_whole, cur))
            work.append(_Work(wide_tasks, chunks))
        # Every pivot position, for the NaN scan (offset + i (ld + 1) in either layout).
        p = plan.npiv
        off = batch.offset[order]
        ld = batch.ld[order]
        first = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(p, out=first[1:])
        owner = np.repeat(np.arange(len(order)), p)
        diag = (np.repeat(off, p) + (np.arange(int(first[-1])) - first[owner])
                * np.repeat(ld + 1, p))
        prep = _Prepared(plan, (off * isz).tolist(), ld.tolist(), plan.n.tolist(), p.tolist(),
                         work, diag, owner, first)
        batch._cache[key] = prep
        return prep

    # ------------------------------------------------------------ execution
    def begin(self, src: PackedBatch, dst: PackedBatch, plan: Plan,
              after: list[Completion]) -> _Execution:
        for dep in after:
            dep.wait()
        prep = self._prepare(src, plan)
        return _Execution(prep, src, dst, src.data.ctypes.data, dst.data.ctypes.data,
                          src.data is dst.data, np.zeros(len(plan.order), dtype=np.int32))

    def _calls(self, ex: _Execution) -> Calls:
        key = (ex.dst.dtype, ex.dst.order)
        cache = self._local.__dict__.setdefault("calls", {})
        c = cache.get(key)
        if c is None:
            c = cache[key] = Calls(*key)
        return c

    def launch(self, ex: _Execution, lc: Launch) -> None:
        work = ex.prep.work[lc.index]
        kind = lc.kind
        with self._run_lock:
            try:
                if work.wide:
                    self.threads.wide()
                    c = self._calls(ex)
                    for t in work.wide:
                        self._task(ex, c, kind, *t)
                if work.chunks:
                    self.threads.narrow()
                    self._spread(ex, kind, work.chunks)
            finally:
                self.threads.restore()

    def _spread(self, ex: _Execution, kind: str, chunks: list) -> None:
        """Run ``chunks`` on the pool and this thread, each thread taking the next chunk when
        it finishes one (largest tasks first)."""
        helpers = min(self.threads.size, len(chunks)) - 1
        it = iter(chunks)
        lock = threading.Lock()

        def worker() -> None:
            c = self._calls(ex)
            while True:
                with lock:
                    ch = next(it, None)
                if ch is None:
                    return
                whole, tasks = ch
                if whole:
                    self._whole(ex, c, tasks)
                else:
                    for t in tasks:
                        self._task(ex, c, kind, *t)

        futs = [self._pool.submit(worker) for _ in range(helpers)] if helpers > 0 else []
        try:
            worker()
        finally:
            for f in futs:
                f.result()

    # ------------------------------------------------------------ one task
    def _whole(self, ex: _Execution, c: Calls, tasks: list) -> None:
        """Problems factored entirely in one panel: copy the lower triangle, ``potrf``. The
        common case, so its Python is kept to two ctypes calls per problem: out of place, the
        output buffer starts as zeros (``adopt``), so nothing above the diagonal needs writing.
        """
        if ex.in_place:
            for t in tasks:
                self._task(ex, c, FUSED, *t)
            return
        prep = ex.prep
        lacpy, potrf = c.f["lacpy"], c.f["potrf"]
        ii, pn, pld, pinfo = c._i, c._ia, c._ia + 4, c._ia + 8
        lo, src0, dst0, off, lds = c.lo, ex.src_base, ex.dst_base, prep.off, prep.ld
        for q, _, n in tasks:
            ii[0], ii[1] = n, lds[q]
            o = off[q]
            lacpy(lo, pn, pn, src0 + o, pld, dst0 + o, pld)
            potrf(lo, pn, dst0 + o, pld, pinfo)
            if ii[2]:
                # Back to the general path for the failed problem: it restores the block from
                # the input and leaves the columns before the failing one factored.
                self._task(ex, c, FUSED, q, 0, n)

    def _task(self, ex: _Execution, c: Calls, kind: str, q: int, j: int, w: int) -> None:
        if ex.info[q]:
            return  # failed at an earlier step: stop, like LAPACK
        prep = ex.prep
        ld, n = prep.ld[q], prep.n[q]
        src = ex.src_base + prep.off[q]
        dst = ex.dst_base + prep.off[q]
        out_of_place = src != dst
        if kind == SCHUR:
            p, tr = j, w
            if out_of_place:
                c.copy("L", c.at(src, ld, p, p), c.at(dst, ld, p, p), tr, tr, ld, ld)
            c.syrk_lower(c.at(dst, ld, p, p), c.at(dst, ld, p, 0), tr, p, ld)
            c.zero("U", c.at(dst, ld, p, p), tr, tr, ld)
            c.zero("A", c.at(dst, ld, 0, p), p, tr, ld)
            return
        m = n - j
        diag = c.at(dst, ld, j, j)
        if kind in (FUSED, UPDATE) or (kind == POTF2 and j == 0):
            # The panel: rows [j, n) of columns [j, j + w), lower trapezoid (only the lower
            # triangle of the input is read).
            if out_of_place:
                c.copy("L", c.at(src, ld, j, j), diag, m, w, ld, ld)
            if kind != POTF2 and j:
                c.syrk_lower(diag, c.at(dst, ld, j, 0), w, j, ld)
                c.gemm_nt(c.at(dst, ld, j + w, j), c.at(dst, ld, j + w, 0), c.at(dst, ld, j, 0),
                          m - w, w, j, ld)
        if kind in (FUSED, POTF2):
            if not self._potf2(ex, c, q, j, w, m, ld, src, diag, out_of_place):
                return
        if kind in (FUSED, TRSM):
            c.trsm_right_lower_t(c.at(dst, ld, j + w, j), diag, m - w, w, ld)

    def _potf2(self, ex, c: Calls, q, j, w, m, ld, src, diag, out_of_place) -> bool:
        """Factor the diagonal block; zeros above it and above the panel. On a failed pivot,
        leave the columns before it factored (rows below solved too) and record ``info``."""
        # The block before potrf, to come back to on failure: the input itself when nothing
        # updated it and it is not the output, else a copy.
        if out_of_place and j == 0:
            keep, keep_ld = src, ld
        else:
            buf = self._scratch(w * w, ex.dst.dtype)
            keep, keep_ld = buf.ctypes.data, max(w, 1)
            c.copy("L", diag, keep, w, w, ld, keep_ld)
        dst0 = c.at(diag, ld, -j, 0)  # X(0, j): top of the panel's columns
        c.zero("A", dst0, j, w, ld)
        f = c.potrf_lower(diag, w, ld)
        if not f:
            c.zero("U", diag, w, w, ld)
            return True
        # Factor the g = f - 1 columns that can be, from the block as it was.
        g = f - 1
        while g > 0:
            c.copy("L", keep, diag, w, w, keep_ld, ld)
            r = c.potrf_lower(diag, g, ld)
            if not r:
                break
            f, g = r, r - 1  # a pivot that passed in the first try failed now (rounding)
        if g > 0:
            c.trsm_right_lower_t(c.at(diag, ld, g, 0), diag, m - g, g, ld)
            c.zero("U", diag, g, g, ld)
        ex.info[q] = j + f
        return False

    def _scratch(self, size: int, dtype) -> np.ndarray:
        bufs = self._local.__dict__.setdefault("scratch", {})
        b = bufs.get(dtype)
        if b is None or b.size < size:
            b = bufs[dtype] = np.empty(max(size, 1), dtype=dtype)
        return b

    def end(self, ex: _Execution) -> Completion:
        prep = ex.prep
        info = ex.info
        if len(prep.diag):
            # LAPACK's info, or the first pivot that is not > 0 (NaN included) if earlier.
            bad = np.flatnonzero(~(ex.dst.data[prep.diag] > 0))
            if len(bad):
                owner = prep.diag_owner[bad]
                first_of = np.unique(owner, return_index=True)
                q, at = first_of[0], bad[first_of[1]]
                col = (at - prep.diag_first[q] + 1).astype(np.int32)
                cur = info[q]
                info[q] = np.where((cur == 0) | (col < cur), col, cur)
        out = np.zeros(prep.plan.k, dtype=np.int32)
        out[prep.plan.order] = info
        return _Done(out)
