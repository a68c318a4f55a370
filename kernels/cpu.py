"""CPU backend: each launch group's tasks run one per core, each on a single-threaded BLAS.

A launch covers task rows ``[lo, hi)`` of the plan; its tasks are independent, so the backend
hands them to a pool of threads, largest first, each thread pulling the next chunk of tasks as it
finishes one (the largest-processing-time-first greedy). What a task computes belongs to its op's
kernel module (``kernels/<op>_cpu.py``, found by name): a handful of BLAS/LAPACK calls through
:mod:`vbatch.kernels.lapack` (scipy's library, called through ctypes, which releases the GIL).

A task too large to share the machine, one that would alone take longer than the rest of its
launch spread over the other cores, runs before the others with the BLAS's own threads instead.
Each op picks its default panel width so that the blocked plan (threaded tasks) is used only
where a problem is large enough to need threads inside it.

A packed input is read where it is; a list is copied into a packed buffer first, so that the
compiled loops read one buffer. Outputs are new buffers of calloc'd zeros (or the input's own
buffer, when the caller asks to overwrite); each task copies the part of an input it works on.

An op's kernel module provides:

* ``plan_defaults(dtype) -> dict`` (planner options);
* ``prepare(backend, plan, launches) -> state``: for each of its launches (by index), its
  ``Work`` (``state.work[index]``), built once per plan (kept in ``plan.cache``);
* ``run(backend, ex, launch, whole, tasks)``: a chunk of one launch's tasks;
* ``finish(backend, ex) -> info``: the per-problem status (``ex.info``, completed), read once
  at the end;
* optionally ``calls(backend, ex, launch, whole, tasks, names)``: a chunk as calls of its
  compiled loops, bound once for a prepared call's replay (:meth:`CpuBackend.replayer`).
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
import functools
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from vbatch.kernels.backend import Backend, Completion, TraceRecord, kernel_modules
from vbatch.kernels.lapack import BlasThreads, Calls
from vbatch.core.batch import (MatrixList, PackedBatch, array_kind, array_module, pack,
                               tight_template)
from vbatch.scheduler.plan import Launch, Plan

# Tasks are handed to threads in chunks of at least this many flops (or one task), so that the
# hand-out (a lock and a list step, ~0.3 us) is small against the work: a 30 x 30 potrf is ~9
# kflop, and a tiny task's own Python costs ~2 us.
CHUNK_FLOPS = 50e3


INFO = object()  # (a kernel module's ``calls``: the call's per-problem status)


class Data:
    """(a kernel module's ``calls``) The call's data array ``at`` (its place among the
    buffers), as an argument of a bound call."""

    __slots__ = ("at",)

    def __init__(self, at: int):
        self.at = at


def _straight(calls: list):
    """``steps(datas, info)``: the bound ``calls`` (``[(kernel, args), ...]``) made in order,
    written as straight-line source, each argument a name bound once: a loop rebuilding each
    call's arguments cost ~3 us of a 16 us call (10 GEMMs of 8 x 8, 2-core VM)."""
    ns: dict = {}
    src = ["def steps(datas, info):"]
    for i, (kernel, args) in enumerate(calls):
        ns[f"k{i}"] = kernel
        parts = []
        for j, a in enumerate(args):
            if a is INFO:
                parts.append("info")
            elif type(a) is Data:
                parts.append(f"datas[{a.at}]")
            else:
                ns[f"c{i}_{j}"] = a
                parts.append(f"c{i}_{j}")
        src.append(f"    k{i}({', '.join(parts)})")
    src.append("    return None")
    exec("\n".join(src) + "\n", ns)  # noqa: S102 - built above from the modules' calls
    return ns["steps"]


@dataclass
class Work:
    """One launch's tasks (tuples an op's kernel module understands): ``wide`` ones run alone
    with the BLAS's threads; the rest in ``chunks`` ``(whole, [task, ...])``, largest first, one
    thread per chunk. ``whole`` marks chunks an op runs on a shorter path."""

    wide: list
    chunks: list


@dataclass
class View:
    """Where a staged buffer's matrices are: problem ``q``'s A(0, 0) at ``base + off[q]``
    (bytes), leading dimension ``ld[q]``, in ``order``, in the packed batch ``batch`` (a list is
    staged as a packed copy)."""

    off: list
    ld: list
    order: str
    dtype: np.dtype
    m: np.ndarray
    n: np.ndarray
    batch: PackedBatch  # the buffer itself (held: the kernels read it by address)
    from_list: bool = False  # laid out from a list's sizes alone (back to back)

    @property
    def isz(self) -> int:
        return self.dtype.itemsize

    @functools.cached_property
    def base(self) -> int:
        # Read when first needed: numpy's ``.ctypes.data`` costs ~2 us, and the compiled
        # loops, which take the arrays themselves, never ask (a tiny GEMM staged three views).
        return self.batch.data.ctypes.data


@dataclass
class Execution:
    plan: Plan
    buffers: dict  # name -> View (None: an absent input)
    info: np.ndarray  # per problem (caller's order), int32, written by tasks
    states: dict  # kernel family -> its module's per-plan state
    modules: dict  # kernel family -> its module
    scalars: dict  # alpha, beta


class _Done(Completion):
    def __init__(self, info: np.ndarray):
        self._info = info

    def wait(self) -> np.ndarray:
        return self._info

    def done(self) -> bool:
        return True


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


def split(tasks: list, cost: np.ndarray, whole: np.ndarray, size: int,
          small: np.ndarray | None = None, table: Callable[[list], list] | None = None) -> Work:
    """Wide tasks (each longer than its share of the launch: on the critical path, so it gets
    the BLAS's threads and runs alone, before the rest), and the rest in chunks, largest
    first. ``small`` marks the tasks a compiled loop runs, a chunk in one call: never wide,
    they come after the others, in chunks of a quarter of a thread's share of them (at least
    ``CHUNK_FLOPS``), each chunk's tasks made by ``table`` into what the op's loop takes. A
    chunk's call costs ~5-10 us of Python and dispatch: 2,000 GEMMs of U[1, 32] in chunks of
    ``CHUNK_FLOPS`` paid it 186 times a call."""
    if small is not None and small.any():
        big, mine = np.flatnonzero(~small).tolist(), np.flatnonzero(small)
        out = split([tasks[i] for i in big], cost[big], whole[big], size)
        share = max(CHUNK_FLOPS, float(cost[mine].sum()) / (4 * size))
        rest = _chunked([tasks[i] for i in mine.tolist()], cost[mine], whole[mine],
                        np.zeros(len(mine), dtype=bool), share)
        return Work(out.wide, out.chunks + [(wh, table(ts)) for wh, ts in rest.chunks])
    wide = (cost * size > cost.sum()) if size > 1 else np.zeros(len(tasks), dtype=bool)
    return _chunked(tasks, cost, whole, wide, CHUNK_FLOPS)


def _chunked(tasks: list, cost: np.ndarray, whole: np.ndarray, wide: np.ndarray,
             chunk: float) -> Work:
    """The ``wide`` tasks, and the others in chunks of at least ``chunk`` flops (or up to a
    change of ``whole``), largest first."""
    by_cost = np.argsort(-cost, kind="stable")
    wide_tasks, chunks = [], []
    cur, cur_whole, acc = [], None, 0.0
    for i, wd, wh, c in zip(by_cost.tolist(), wide[by_cost].tolist(), whole[by_cost].tolist(),
                            cost[by_cost].tolist()):
        t = tasks[i]
        if wd:
            wide_tasks.append(t)
            continue
        if cur and (wh != cur_whole or acc >= chunk):
            chunks.append((cur_whole, cur))
            cur, acc = [], 0.0
        cur.append(t)
        cur_whole = wh
        acc += c
    if cur:
        chunks.append((cur_whole, cur))
    return Work(wide_tasks, chunks)


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
        self.kernels = kernel_modules("_cpu")

    def tune_key(self) -> str:
        """The processor model and the threads this backend runs on."""
        import platform

        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                model = next((ln.split(":", 1)[1].strip() for ln in f
                              if ln.startswith("model name")), model)
        except OSError:
            pass
        return f"cpu {model} x{self.threads.size}"

    # ------------------------------------------------------------ memory
    def memory_total(self) -> int:
        # Read once: /proc/meminfo costs ~18 us, on the path of every call.
        total = getattr(self, "_mem_total", None)
        if total is None:
            total = self._mem_total = _host_memory()[0]
        return total

    def memory_free(self) -> int:
        return _host_memory()[1]

    def stage_input(self, batch, writable: bool, others: tuple = ()) -> View:
        if batch is None:
            return None
        if isinstance(batch, MatrixList):
            if batch.kind != "numpy":
                xp = array_module(batch.kind)
                batch = MatrixList(mats=[xp.asnumpy(m) for m in batch.mats])
            # Copied into a packed buffer of our own (written back by scatter where it is
            # written): the compiled loops read one buffer, where a list's arrays read where
            # they are cost a view and a BLAS call a task (docs/decisions.md#cpu-inline-calls).
            return self._view(pack(batch, order=batch.packed_order), from_list=True)
        if batch.kind != "numpy":
            batch = batch.with_data(array_module(batch.kind).asnumpy(batch.data))  # ours
        return self._view(batch)

    def new_output(self, like: View) -> View:
        b = like.batch
        # Zeros, not empty: calloc'd pages cost nothing more, and an op's whole-problem path
        # then has nothing above a diagonal to write.
        return self._view(b.with_data(np.zeros(b.data.size, b.dtype)), from_list=like.from_list)

    @staticmethod
    def _view(batch: PackedBatch, from_list: bool = False) -> View:
        cache = batch.cache()
        isz = batch.dtype.itemsize
        key = ("cpu-view", isz)  # (bytes: a layout's cache may serve several dtypes)
        hit = cache.get(key)
        if hit is None:  # per layout: a packed batch's metadata never changes
            hit = cache[key] = ((batch.offset * isz).tolist(), batch.ld.tolist())
        return View(hit[0], hit[1], batch.order, batch.dtype, batch.m, batch.n, batch,
                    from_list)

    def new_buffer(self, m, n, dtype, order: str, zero: bool = True) -> View:
        # (zeros always: on the host they cost nothing that matters)
        layout, total = tight_template(m, n, order)
        return self._view(layout.with_data(np.zeros(total, dtype)), from_list=True)

    @staticmethod
    def new_data(like: np.ndarray) -> np.ndarray:
        return np.zeros(like.shape, like.dtype)  # (zeros: as new_output's)

    def buffer_maker(self, m, n, dtype, order: str, zero: bool = True):
        # (one layout and cache for every buffer it makes)
        layout, total = tight_template(m, n, order)
        return layout, lambda: np.zeros(total, dtype)

    def batch_of(self, staged: View) -> PackedBatch:
        return staged.batch

    def scatter(self, work: PackedBatch, target: list | PackedBatch) -> None:
        if isinstance(target, PackedBatch):
            target.data[...] = array_module(target.kind).asarray(work.data)
            return
        for i, m in enumerate(target):
            if m.size:
                m[...] = array_module(array_kind(m)).asarray(work._view(i))

    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        if kind == "numpy":
            return work
        return work.with_data(array_module(kind).asarray(work.data))

    # ------------------------------------------------------------ execution
    def begin(self, plan: Plan, buffers: dict, config,
              scalars: dict | None = None) -> Execution:
        key = ("cpu", self.threads.size)
        states = plan.cache.get(key)
        if states is None:
            states = {}
            for fam in plan.families:
                mine = [lc for lc in plan.launches if lc.family == fam]
                states[fam] = self._op(fam).prepare(self, plan, mine)
            plan.cache[key] = states
        modules = {fam: self._op(fam) for fam in plan.families}
        return Execution(plan, buffers, np.zeros(plan.k, dtype=np.int32), states, modules,
                         scalars or {})

    def run(self, plan: Plan, buffers: dict, config, scalars: dict | None = None) -> Completion:
        ex = self.begin(plan, self._views(buffers), config, scalars)
        self.launch_all(ex, plan.launches)
        return self.end(ex)

    def _views(self, buffers: dict) -> dict:
        """The runtime's replay passes the buffers as packed batches, where staging gives
        views: one view a batch (an output written in place is its input's view, as the
        kernels test)."""
        views: dict = {}
        seen: dict = {}
        for name, b in buffers.items():
            if b is not None and id(b) not in seen:
                seen[id(b)] = self._view(b)
            views[name] = None if b is None else seen[id(b)]
        return views

    def replayer(self, plan: Plan, buffers: dict, config, scalars: dict | None = None):
        """``fire(datas)``: ``plan`` on buffers of the layouts of ``buffers``, given their
        arrays (in the order of ``buffers``), run in the caller's thread as the compiled loops'
        calls, bound once (each kernel module's ``calls``) and written out as one function: a
        call is those calls and nothing else. None where a launch is not one chunk that its
        module can give as such calls (threads share the work, or BLAS calls do it: run()
        then); ``fire`` returns None while a trace is being taken."""
        names = list(buffers)
        ex = self.begin(plan, self._views(buffers), config, scalars)
        bound = []
        for lc in plan.launches:
            work = ex.states[lc.family].work[lc.index]
            if not work.wide and not work.chunks:
                continue  # (nothing left to it: a partial factor's schur tasks, folded)
            calls = getattr(ex.modules[lc.family], "calls", None)
            if calls is None or work.wide or len(work.chunks) != 1:
                return None
            mine = calls(self, ex, lc, work.chunks[0][0], work.chunks[0][1], names)
            if mine is None:
                return None
            bound += mine
        steps = _straight(bound)
        k, lock = plan.k, self._run_lock

        def fire(datas: tuple):
            if self.tracer is not None:
                return None
            info = np.zeros(k, np.int32)
            with lock:
                steps(datas, info)
            return _Done(info)

        return fire

    def calls(self, dtype, order: str) -> Calls:
        """This thread's caller for BLAS/LAPACK on ``dtype`` matrices stored in ``order``."""
        key = (np.dtype(dtype), order)
        cache = self._local.__dict__.setdefault("calls", {})
        c = cache.get(key)
        if c is None:
            c = cache[key] = Calls(*key)
        return c

    def scratch(self, size: int, dtype) -> np.ndarray:
        """This thread's scratch buffer of at least ``size`` elements."""
        bufs = self._local.__dict__.setdefault("scratch", {})
        b = bufs.get(dtype)
        if b is None or b.size < size:
            b = bufs[dtype] = np.empty(max(size, 1), dtype=dtype)
        return b

    def launch(self, ex: Execution, lc: Launch) -> None:
        if self.tracer is not None:
            h0 = time.perf_counter()
            self._launch(ex, lc)
            self.tracer.append(TraceRecord(lc, 0, lc.kind, (h0, time.perf_counter())))
            return
        self._launch(ex, lc)

    def _launch(self, ex: Execution, lc: Launch) -> None:
        mod = ex.modules[lc.family]
        work = ex.states[lc.family].work[lc.index]
        with self._run_lock:
            try:
                if work.wide:
                    self.threads.wide()
                    mod.run(self, ex, lc, False, work.wide)
                if work.chunks:
                    self._spread(ex, mod, lc, work.chunks)
            finally:
                self.threads.restore()

    def _spread(self, ex: Execution, mod, kind, chunks: list) -> None:
        """Run ``chunks`` on the pool and this thread, each thread taking the next chunk when
        it finishes one (largest tasks first)."""
        helpers = min(self.threads.size, len(chunks)) - 1
        if helpers <= 0 and not self.threads.oversubscribed:
            # One thread (every tiny call): the BLAS keeps its own counts, and there is no
            # hand-out: setting the counts and back cost ~8 us of a 137 us call, the hand-out
            # ~4 us of a 45 us one (10 matrices of 8 x 8, 2-core VM).
            for whole, tasks in chunks:
                mod.run(self, ex, kind, whole, tasks)
            return
        # One BLAS thread each while several threads run chunks at once.
        self.threads.narrow()
        it = iter(chunks)
        lock = threading.Lock()
        run = mod.run

        def worker() -> None:
            while True:
                with lock:
                    ch = next(it, None)
                if ch is None:
                    return
                run(self, ex, kind, ch[0], ch[1])

        futs = [self._pool.submit(worker) for _ in range(helpers)] if helpers > 0 else []
        try:
            worker()
        finally:
            for f in futs:
                f.result()

    def end(self, ex: Execution) -> Completion:
        info = ex.info
        for mod in ex.modules.values():
            info = mod.finish(self, ex)
        return _Done(info)
