"""CPU backend: each launch group's tasks run one per core, each on a single-threaded BLAS.

A launch covers problems ``plan.order[lo:hi]`` at one global step; its tasks are independent, so
the backend hands them to a pool of threads, largest first, each thread pulling the next chunk of
tasks as it finishes one (the largest-processing-time-first greedy). Every task is a handful of
BLAS/LAPACK calls through :mod:`vbatch.kernels.lapack` (scipy's library, called through ctypes,
which releases the GIL):

* ``fused``:  the step's panel of the output is copied from the input, brought up to date
  (``syrk`` on the diagonal block, ``gemm`` below it), its diagonal block factored (``potrf``) and
  the rows below solved (``trsm``);
* ``update``, ``potf2``, ``trsm``: the same three, one per launch (separated plans);
* ``schur``: the trailing block copied and updated by ``syrk`` (partial factorizations).

Where a problem fits in one panel (the default panel width is large, see ``plan_defaults``) its
fused task is the whole problem: ``lacpy`` of the lower triangle, one ``potrf`` and, for a partial
factorization, ``trsm`` and ``syrk`` for the Schur complement, done in the same task (its schur
task is then dropped), so a tiny problem costs a few ctypes calls. A task too large to share the
machine, one that would alone take longer than the rest of its launch spread over the other
cores, runs before the others with the BLAS's own threads instead. So the blocked plan with
threaded tasks is used only where a problem is large enough to need threads inside it.

Inputs are read where they are: a packed buffer, or each array of a list (no packing first).
Out of place, each task copies the part of the input it is about to work on into the output,
which starts as calloc'd zeros; nothing copies the whole input first. ``info`` follows reference
LAPACK: the first pivot that is not > 0, NaN included (OpenBLAS's ``potrf`` misses NaN; a
vectorized scan of the diagonals at the end catches it). A failed problem's columns before the
failing one hold its factor, as the partial factorization of those columns would: on a failed
``potrf`` the diagonal block is restored, its leading columns refactored and the rows below solved
against them.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from vbatch.kernels.backend import Backend, Completion, PlanDefaults
from vbatch.kernels.lapack import BlasThreads, Calls
from vbatch.ops.batch import MatrixList, PackedBatch, array_kind, array_module, pack, tight_offsets
from vbatch.ops.cholesky import FUSED, POTF2, SCHUR, TRSM, UPDATE
from vbatch.scheduler.plan import Launch, Plan

# Tasks are handed to threads in chunks of at least this many flops (or one task), so that the
# hand-out (a lock and a list step, ~0.3 us) is small against the work: a 30 x 30 potrf is ~9
# kflop, and a tiny task's own Python costs ~2 us.
CHUNK_FLOPS = 50e3


@dataclass
class _Work:
    """One launch's tasks, ``(q, j, w)`` per problem (plan position, first panel column, width):
    ``wide`` ones run alone with the BLAS's threads; ``narrow`` ones run one per thread, handed
    out in ``chunks`` (largest tasks first) so that a thread takes many tiny tasks per turn. A
    chunk of ``whole`` tasks holds problems this launch factors entirely (one panel holding all
    ``npiv`` columns): those take the short path of :meth:`CpuBackend._whole`."""

    wide: list
    chunks: list  # [(whole: bool, [task, ...]), ...]


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
class _ListSource:
    """A list's arrays, read where they are: per problem (the caller's order) the byte
    address of A(0, 0) and the leading dimension in the output's order. ``keep`` holds the
    arrays (and any contiguous copies made of them) alive for the call."""

    addr: np.ndarray
    ld: np.ndarray
    keep: list = field(default_factory=list)


@dataclass
class _Execution:
    prep: _Prepared
    dst: PackedBatch
    src_base: int  # A(0, 0) of problem q is at src_base + src_off[q]
    src_off: list
    src_ld: list
    dst_base: int
    in_place: bool
    info: np.ndarray  # plan order, int32: LAPACK's own info (the NaN scan comes at the end)
    keep: object = None

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
        # a launch. The sweep of nb 64 / 256 / 512 / 1024 on the 2-core VM (docs/notes.md,
        # 2026-11-21) put 512 at or near the best everywhere. No shared-memory limit: always
        # fused.
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

    def stage_list(self, mats: MatrixList, overwrite: bool):
        if mats.kind != "numpy":
            xp = array_module(mats.kind)
            mats = MatrixList(mats=[xp.asnumpy(m) for m in mats.mats])
        if overwrite:
            # Factored in a packed buffer of our own, then written back (scatter).
            work = pack(mats, order="C")
            return work, work
        # Read each array where it is. The output takes the layout most arrays have, so that
        # lacpy can read them as they are; the others are copied to that layout first.
        isz = mats.dtype.itemsize
        n = mats.n
        row = sum(1 for a in mats.mats if a.strides[-1] == isz) * 2 >= len(mats.mats)
        order = "C" if row else "F"
        addr = [0] * len(n)
        ld = np.maximum(n, 1).tolist()
        keep = []
        for i, (a, k) in enumerate(zip(mats.mats, n.tolist())):
            if not k:
                continue
            rs, cs = a.strides
            if not ((cs == isz and rs >= k * isz) if row else (rs == isz and cs >= k * isz)):
                a = np.ascontiguousarray(a) if row else np.asfortranarray(a)
                rs, cs = a.strides
                keep.append(a)
            addr[i] = a.ctypes.data
            ld[i] = (rs if row else cs) // isz
        addr, ld = np.array(addr, dtype=np.int64), np.array(ld, dtype=np.int64)
        ld_out = np.maximum(n, 1)
        off = tight_offsets(n, ld_out)
        total = int(off[-1] + ld_out[-1] * n[-1]) if len(n) else 0
        dst = PackedBatch.model_construct(data=np.zeros(total, mats.dtype), n=n, offset=off,
                                          ld=ld_out, order=order)
        return _ListSource(addr, ld, [mats.mats, keep]), dst

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
    def _prepare(self, batch: PackedBatch, plan: Plan, cache: dict) -> _Prepared:
        """``cache``: the batch's own (a packed batch: any layout) or the plan's (a list's
        output, laid out by its sizes alone, the same for every call with that plan)."""
        key = ("cpu", id(plan), batch.order, batch.dtype)
        hit = cache.get(key)
        if hit is not None and hit.plan is plan:
            return hit
        order = plan.order
        isz = batch.dtype.itemsize
        nb = plan.nb
        work = []
        folded = np.zeros(len(order), dtype=bool)  # schur done by the problem's one fused task
        for lc in plan.launches:
            q = np.arange(lc.lo, lc.hi)
            if lc.kind == SCHUR:
                q = q[~folded[q]]
                tr = plan.n[q] - plan.npiv[q]
                cost = tr.astype(np.float64) ** 2 * plan.npiv[q] + 1.0
                j, w = plan.npiv[q], tr
                whole = np.zeros(len(q), dtype=bool)
            else:
                j = (lc.step - plan.start[q]) * nb
                w = np.minimum(nb, plan.npiv[q] - j)
                m = plan.n[q] - j
                cost = _task_flops(lc.kind, j, w, m) + 1.0
                whole = (lc.kind == FUSED) & (j == 0) & (w == plan.npiv[q])
                if lc.kind == FUSED:
                    tr = (plan.n[q] - plan.npiv[q]).astype(np.float64)
                    cost = cost + np.where(whole, tr * tr * w, 0.0)
                    folded[q[whole & (tr > 0)]] = True
            work.append(self._split(q, j, w, cost, whole))
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
        cache[key] = prep
        return prep

    def _split(self, q, j, w, cost, whole) -> _Work:
        """Wide tasks, and the rest in chunks, largest first."""
        # A task longer than its share of the launch is on the critical path: give it the
        # BLAS's threads (it runs alone, before the rest).
        size = self.threads.size
        wide = (cost * size > cost.sum()) if size > 1 else np.zeros(len(q), dtype=bool)
        by_cost = np.argsort(-cost, kind="stable")
        tasks = list(zip(q[by_cost].tolist(), j[by_cost].tolist(), w[by_cost].tolist()))
        wide_tasks, chunks = [], []
        cur, cur_whole, acc = [], None, 0.0
        for t, wd, wh, c in zip(tasks, wide[by_cost].tolist(), whole[by_cost].tolist(),
                                cost[by_cost].tolist()):
            if wd:
                wide_tasks.append(t)
                continue
            if cur and (wh != cur_whole or acc >= CHUNK_FLOPS):
                chunks.append((cur_whole, cur))
                cur, acc = [], 0.0
            cur.append(t)
            cur_whole = wh
            acc += c
        if cur:
            chunks.append((cur_whole, cur))
        return _Work(wide_tasks, chunks)

    # ------------------------------------------------------------ execution
    def begin(self, src, dst: PackedBatch, plan: Plan, after: list[Completion]) -> _Execution:
        """``src`` is a packed batch (the caller's, or ``dst`` itself in place) or a list's
        arrays (:meth:`stage_list`); out of place, ``dst`` is a new buffer of zeros."""
        for dep in after:
            dep.wait()
        prep = self._prepare(dst, plan, plan.cache if isinstance(src, _ListSource)
                             else dst._cache)
        dst_base = dst.data.ctypes.data
        info = np.zeros(len(plan.order), dtype=np.int32)
        if isinstance(src, _ListSource):
            # A list's addresses are in the caller's order; tasks index plan positions.
            o = plan.order
            return _Execution(prep, dst, 0, src.addr[o].tolist(), src.ld[o].tolist(), dst_base,
                              False, info, src.keep)
        src_base = src.data.ctypes.data
        return _Execution(prep, dst, src_base, prep.off, prep.ld, dst_base,
                          src_base == dst_base, info, src)

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
                if whole and not ex.in_place:
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

    # ------------------------------------------------------------ tasks
    def _whole(self, ex: _Execution, c: Calls, tasks: list) -> None:
        """Problems factored entirely by one task, out of place: copy the lower triangle,
        ``potrf``, and for a partial factorization ``trsm`` and ``syrk`` (the Schur
        complement). The common case, so its Python is kept to a few ctypes calls per problem:
        the output buffer starts as zeros, so nothing above the diagonal needs writing."""
        prep = ex.prep
        f = c.f
        lacpy, potrf = f["lacpy"], f["potrf"]
        ii, pn, plds, pld, pinfo = c._i, c._ia, c._ia + 4, c._ia + 8, c._ia + 12
        lo = c.lo
        sb, so, sl, db, off, ns = (ex.src_base, ex.src_off, ex.src_ld, ex.dst_base, prep.off,
                                   prep.n)
        for q, _, p in tasks:
            n = ns[q]
            ii[0], ii[1], ii[2] = n, sl[q], prep.ld[q]
            d = db + off[q]
            lacpy(lo, pn, pn, sb + so[q], plds, d, pld)
            ii[0] = p
            potrf(lo, pn, d, pld, pinfo)
            if ii[3]:
                # The general path redoes the problem from the input, leaving the columns
                # before the failing one factored.
                self._task(ex, c, FUSED, q, 0, p)
                continue
            if p < n:
                ld = ii[2]
                c.trsm_right_lower_t(c.at(d, ld, p, 0), d, n - p, p, ld)
                c.syrk_lower(c.at(d, ld, p, p), c.at(d, ld, p, 0), n - p, p, ld)

    def _task(self, ex: _Execution, c: Calls, kind: str, q: int, j: int, w: int) -> None:
        if ex.info[q]:
            return  # failed at an earlier step: stop, like LAPACK
        prep = ex.prep
        ld, n, lds = prep.ld[q], prep.n[q], ex.src_ld[q]
        src = ex.src_base + ex.src_off[q]
        dst = ex.dst_base + prep.off[q]
        out_of_place = not ex.in_place
        if kind == SCHUR:
            self._schur(c, src, dst, n, j, ld, lds, out_of_place)
            return
        m = n - j
        diag = c.at(dst, ld, j, j)
        if kind in (FUSED, UPDATE) or (kind == POTF2 and j == 0):
            # The panel: rows [j, n) of columns [j, j + w), lower trapezoid (only the lower
            # triangle of the input is read).
            if out_of_place:
                c.copy("L", c.at(src, lds, j, j), diag, m, w, lds, ld)
            if kind != POTF2 and j:
                c.syrk_lower(diag, c.at(dst, ld, j, 0), w, j, ld)
                c.gemm_nt(c.at(dst, ld, j + w, j), c.at(dst, ld, j + w, 0), c.at(dst, ld, j, 0),
                          m - w, w, j, ld)
        if kind in (FUSED, POTF2):
            if not self._potf2(ex, c, q, j, w, m, ld, src, lds, diag, out_of_place):
                return
        if kind in (FUSED, TRSM):
            c.trsm_right_lower_t(c.at(dst, ld, j + w, j), diag, m - w, w, ld)
        if kind == FUSED and j == 0 and w == prep.p[q] and w < n:
            # The problem's one panel: its Schur complement too (its schur task was dropped).
            self._schur(c, src, dst, n, w, ld, lds, out_of_place)

    @staticmethod
    def _schur(c: Calls, src, dst, n, p, ld, lds, out_of_place) -> None:
        """A22 - L21 L21^T in the trailing block; zeros above it and in the (1, 2) block."""
        tr = n - p
        if out_of_place:
            c.copy("L", c.at(src, lds, p, p), c.at(dst, ld, p, p), tr, tr, lds, ld)
        c.syrk_lower(c.at(dst, ld, p, p), c.at(dst, ld, p, 0), tr, p, ld)
        c.zero("U", c.at(dst, ld, p, p), tr, tr, ld)
        c.zero("A", c.at(dst, ld, 0, p), p, tr, ld)

    def _potf2(self, ex, c: Calls, q, j, w, m, ld, src, lds, diag, out_of_place) -> bool:
        """Factor the diagonal block; zeros above it and above the panel. On a failed pivot,
        leave the columns before it factored (rows below solved too) and record ``info``."""
        # The block before potrf, to come back to on failure: the input itself when nothing
        # updated it and it is not the output, else a copy.
        if out_of_place and j == 0:
            keep, keep_ld = src, lds
        else:
            buf = self._scratch(w * w, ex.dst.dtype)
            keep, keep_ld = buf.ctypes.data, max(w, 1)
            c.copy("L", diag, keep, w, w, ld, keep_ld)
        c.zero("A", c.at(diag, ld, -j, 0), j, w, ld)  # X(0, j): above the panel
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
