"""CUDA backend: one vbatched kernel launch per plan launch.

Device code is ``potrf.cu`` beside this file, compiled at run time by NVRTC through
``cupy.RawModule``: one module per template instantiation, compiled the first time a plan needs
it and cached per device (CuPy also keeps the binaries on disk, ``$CUPY_CACHE_DIR``).

Per batch and plan, built once and cached on the batch:

* two metadata arrays on the device, in plan order: ``meta`` (int64: offset, ld) and ``imeta``
  (int32: n, npiv, start step, caller's index). A launch passes only ``(lo, hi, step)``.
* a launch record per plan launch: kernel, grid, block, dynamic shared memory, scalars;
* a CUDA graph holding every launch of the plan, captured once. Kernels take the per-call
  pointers (A, L, info) from a 3-entry device table, so the graph's parameters never change.

Per call: an output buffer (out of place) or none (``overwrite`` or a buffer of our own), one
24-byte copy of the pointer table, one graph launch, one event record. ``info`` lives in pinned
host memory that the kernels address directly (unified addressing): the host zeroes it, kernels
write a problem's entry only when a pivot fails, and ``result()`` reads it after the event.
Measured on the H100 (profile_cuda.py host, 2026-11-21): a device info array plus memset plus
copy-back cost ~11 us per call, and each kernel launch ~8 us of host time even through
``cuLaunchKernel`` with prebuilt parameter blocks (CuPy's RawKernel call: ~10 us); a plan for
Nmax 512 has 32-46 launches. ``VBATCH_CUDA_GRAPHS=0`` launches kernel by kernel instead.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import cupy
import numpy as np
from cupy_backends.cuda.api import driver

from vbatch.kernels.backend import Backend, Completion, PlanDefaults
from vbatch.kernels.potrf_select import (
    FUSED_ROWS_MAX,
    MAX_GRID_Y,
    NB_SUPPORTED,
    SCHUR_TS,
    copy_name,
    select,
    source_of,
    spd_fill_name,
)
from vbatch.kernels.potrf_select import kernel_names  # noqa: F401 - callers import it from here
from vbatch.ops.batch import MatrixList, PackedBatch, array_kind, pack
from vbatch.ops.errors import InputError
from vbatch.scheduler.plan import Launch, Plan

HERE = Path(__file__).parent


@functools.cache
def _source(name: str) -> str:
    return (HERE / name).read_text()


@cupy.memoize(for_each_device=True)
def _kernel(expr: str, source: str = "potrf.cu"):
    """The kernel for one template instantiation, compiled on first use on this device.

    One module per instantiation: a plan compiles only what it launches (an instantiation takes
    1-4 s of NVRTC time; all of them together, minutes)."""
    mod = cupy.RawModule(code=_source(source), options=("-std=c++17",), name_expressions=(expr,))
    return mod.get_function(expr)


def _compile_one(expr: str) -> str:
    _kernel(expr, source_of(expr))
    return expr


def precompile(names: list[str], jobs: int = 8) -> None:
    """Compile kernels in parallel processes, filling CuPy's on-disk cache, so that later
    processes load binaries instead of running NVRTC (a fresh machine would otherwise spend
    minutes compiling one instantiation after another)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_compile_one, names))


def spd_fill(batch: PackedBatch, seed: int) -> PackedBatch:
    """Fill a device batch with diagonally dominant SPD matrices in one launch (generate.cu)."""
    kern = _kernel(spd_fill_name(batch.dtype), "generate.cu")
    k = batch.k
    if k:
        kern((k,), (32, 8), (batch.data, cupy.asarray(batch.offset), cupy.asarray(batch.ld),
                             cupy.asarray(batch.n.astype(np.int32)), np.int32(k),
                             np.int32(batch.order == "C"), np.uint64(seed)))
    return batch


class _Params(ctypes.Structure):
    """The pointer parameters every step kernel takes first: the per-call table (A, L, info)
    and the batch's metadata. Fixed per (batch, plan), so a captured graph stays valid."""

    _fields_ = [("tbl", ctypes.c_uint64), ("meta", ctypes.c_uint64), ("imeta", ctypes.c_uint64)]


@dataclass
class _Record:
    """One launch, ready for cuLaunchKernel: its parameter block points at the plan's shared
    pointer parameters and at its own scalars (K, lo, hi, step, extra)."""

    kernel: object
    func: int
    grid: tuple
    block: tuple
    smem: int
    stream: int
    scalars: object = None
    params: object = None

    def bind(self, ptrs: _Params, scalars: tuple) -> None:
        if len(scalars) != 5:
            raise ValueError(f"a step kernel takes 5 scalars, got {len(scalars)}")
        self.scalars = (ctypes.c_int32 * len(scalars))(*[int(s) for s in scalars])
        base = ctypes.addressof(ptrs)
        slots = [base + getattr(_Params, f).offset for f, _ in _Params._fields_]
        slots += [ctypes.addressof(self.scalars) + 4 * i for i in range(len(scalars))]
        self.params = (ctypes.c_void_p * len(slots))(*slots)

    def launch(self, stream: int) -> None:
        g, b = self.grid, self.block
        driver.launchKernel(self.func, g[0], g[1], g[2], b[0], b[1], b[2], self.smem, stream,
                            ctypes.addressof(self.params), 0)


@dataclass
class _Prepared:
    """Device-side state of one (batch layout, plan): built once, reused by every call.

    ``table`` is the device copy of a call's (A, L, info) pointers; calls that share it are
    ordered by ``last`` (the previous call's end event), so one call never rewrites the table
    under another's kernels. ``graph`` holds every launch of the plan, captured once."""

    plan: Plan
    meta: object  # cupy int64 [2K]
    imeta: object  # cupy int32 [4K]
    table: object  # cupy uint64 [3]
    records: list
    nstreams: int
    ptrs: _Params = field(default_factory=_Params)
    lock: threading.Lock = field(default_factory=threading.Lock)
    graph: object = None
    last: object = None


@dataclass
class _Exec:
    prep: _Prepared
    slot: object
    main: object  # the caller's current stream
    keep: tuple  # buffers that must outlive the launches
    graph: object = None  # the plan's graph, when the call runs through it
    direct: list = field(default_factory=list)  # records to launch one by one (no graph)


class _Slot:
    """Pinned host memory for one call: the (A, L, info) table copied to the device at submit,
    and ``info`` itself, which the kernels address directly (unified addressing). Also the
    event that ends the call."""

    __slots__ = ("mem", "table", "info", "info_ptr", "event")

    def __init__(self, k: int):
        self.mem = cupy.cuda.alloc_pinned_memory(32 + max(4 * k, 4))
        self.table = np.frombuffer(self.mem, np.uint64, 3)
        self.info = np.frombuffer(self.mem, np.int32, k, offset=32)
        self.info_ptr = self.mem.ptr + 32
        self.event = cupy.cuda.Event(block=False, disable_timing=True)


class _SlotPool:
    """Slots go back to the free list only after their reader copied info out
    (Completion.wait). One taken by a call whose future is dropped unread is kept here until its
    event completes, so memory the kernels may still write is never freed under them."""

    def __init__(self):
        self._free: dict[int, list] = {}
        self._inflight: deque = deque()
        self._lock = threading.Lock()

    def take(self, k: int) -> _Slot:
        with self._lock:
            stack = self._free.get(k)
            slot = stack.pop() if stack else _Slot(k)
            self._inflight.append(slot)
            if len(self._inflight) > 64:  # forget finished ones now and then, not on every call
                self._inflight = deque(s for s in self._inflight if not s.event.done)
        return slot

    def give(self, slot: _Slot) -> None:
        with self._lock:
            self._free.setdefault(slot.info.size, []).append(slot)


class _Done(Completion):
    def __init__(self, slot: _Slot, pool: _SlotPool, keep, queue):
        self.event, self.queue = slot.event, queue
        self._slot, self._pool, self._keep = slot, pool, keep
        self._info = None

    def wait(self) -> np.ndarray:
        if self._info is None:
            self.event.synchronize()
            self._info = self._slot.info.copy()
            self._pool.give(self._slot)
            self._slot = self._keep = None
        return self._info

    def done(self) -> bool:
        return self.event.done

    def sync(self) -> None:
        self.event.synchronize()


class CudaBackend(Backend):
    name = "cuda"
    kind = "cupy"
    asynchronous = True

    def __init__(self):
        self._streams: dict[int, list] = {}
        self._slots = _SlotPool()
        self._mem_total: dict[int, int] = {}
        # One CUDA graph launch per call instead of one launch per plan step: launches cost
        # ~8 us each of host time through the driver (cuda_potrf.py host column, H100,
        # 2026-11-21). VBATCH_CUDA_GRAPHS=0 launches kernel by kernel (profile_cuda.py uses it).
        self.graphs = os.environ.get("VBATCH_CUDA_GRAPHS", "1") != "0"
        # float64 panel updates with FMA (default) or on tensor cores (DMMA):
        # VBATCH_FP64_UPDATE=fma|mma. DMMA measured no faster: uniform Nmax 512 4.56 ms against
        # 4.22 ms with FMA, Nmax 1024 7.31 against 7.26 (fused_max_rows 256, H100,
        # 2026-11-21); the update is bound by re-reading the factored columns, not by flops.
        self.fp64_update = os.environ.get("VBATCH_FP64_UPDATE", "fma")

    # ------------------------------------------------------------ options
    def plan_defaults(self, dtype: np.dtype) -> PlanDefaults:
        return PlanDefaults(nb=32, fused_max_rows=FUSED_ROWS_MAX, streams=4)

    def check_options(self, dtype: np.dtype, options: dict) -> None:
        nb = options["nb"]
        if nb not in NB_SUPPORTED:
            raise InputError([(None, f"the cuda backend supports nb in {NB_SUPPORTED}, got {nb}")],
                             what="runtime options")
        # A taller panel than the fused kernel's largest block cannot be fused whatever was
        # asked: the crossover is "fuse up to this height", so it is capped, not refused.
        options["fused_max_rows"] = min(options["fused_max_rows"], FUSED_ROWS_MAX)

    def check_plan(self, plan: Plan) -> None:
        # The one grid dimension a realistic batch can outgrow: schur_step enumerates the tile
        # pairs of a trailing block in gridDim.y, t (t + 1) / 2 of them for t tiles a side, so
        # a trailing block past about 23,000 rows cannot be launched. (The update and trsm grids
        # reach the limit only for n in the millions, which the memory check refuses first.)
        trail = plan.n - plan.npiv
        t = -(-trail // SCHUR_TS)
        bad = np.flatnonzero(t * (t + 1) // 2 > MAX_GRID_Y)
        if len(bad):
            raise InputError([
                (int(plan.order[q]), f"its trailing block ({trail[q]} x {trail[q]}: n = "
                                     f"{plan.n[q]}, npiv = {plan.npiv[q]}) needs "
                                     f"{t[q] * (t[q] + 1) // 2} tile pairs, more than the cuda "
                                     f"backend's grid allows ({MAX_GRID_Y}); factor more "
                                     f"columns or split the problem")
                for q in bad])

    # ------------------------------------------------------------ memory
    def adopt(self, batch: PackedBatch, overwrite: bool):
        if batch.kind == "cupy":
            if overwrite:
                return batch, batch
            return batch, batch.with_data(cupy.empty(batch.data.size, batch.data.dtype))
        dev = batch.with_data(cupy.asarray(batch.data))  # one upload; the copy is ours
        return dev, dev

    def stage_list(self, mats: MatrixList, overwrite: bool):
        # One packed buffer on the device (an upload, or one gather kernel for cupy arrays),
        # factored in place.
        if mats.kind == "numpy":
            host = pack(mats, order="C")
            work = host.with_data(cupy.asarray(host.data))
        else:
            work = pack(mats, order="C", backend=self)
        return work, work

    def gather(self, mats: list, n: np.ndarray, offset: np.ndarray, dtype, order: str):
        """One kernel copies every matrix of a cupy list into a new packed buffer."""
        ld = np.maximum(n, 1)
        total = int(offset[-1] + ld[-1] * n[-1]) if len(n) else 0
        data = cupy.empty(total, dtype=dtype)
        if total:
            self._copy(mats, data, n, offset, ld, order, to_packed=True)
        return data

    def _copy(self, mats, data, n, offset, ld, order, to_packed: bool) -> None:
        k = len(mats)
        isz = np.dtype(data.dtype).itemsize
        addr = np.empty((3, k), dtype=np.int64)
        for i, m in enumerate(mats):
            addr[0, i] = m.data.ptr
            addr[1, i] = m.strides[0] // isz
            addr[2, i] = m.strides[1] // isz
        d_addr = cupy.asarray(addr)
        d_off = cupy.asarray(np.asarray(offset, dtype=np.int64))
        d_ld = cupy.asarray(np.asarray(ld, dtype=np.int64))
        d_n = cupy.asarray(np.asarray(n, dtype=np.int32))
        kern = _kernel(copy_name(data.dtype))
        kern((k,), (32, 8), (d_addr[0], d_addr[1], d_addr[2], data, d_off, d_ld, d_n, np.int32(k),
                             np.int32(order == "C"), np.int32(to_packed)))

    def scatter(self, work: PackedBatch, target) -> None:
        if isinstance(target, PackedBatch):
            if target.kind == "numpy":
                target.data[...] = work.data.get()
            else:
                target.data[...] = work.data
            return
        if target and array_kind(target[0]) == "cupy":
            self._copy(target, work.data, work.n, work.offset, work.ld, work.order, to_packed=False)
            return
        host = work.with_data(work.data.get())
        for i, m in enumerate(target):
            if m.shape[0]:
                m[...] = host.matrix(i)

    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        return work if kind == "cupy" else work.with_data(work.data.get())

    # ------------------------------------------------------------ execution
    def _streams_for(self, n: int) -> list:
        dev = cupy.cuda.Device().id
        pool = self._streams.setdefault(dev, [])
        while len(pool) < n:
            pool.append(cupy.cuda.Stream(non_blocking=True))
        return pool[:n]

    def _prepare(self, batch: PackedBatch, plan: Plan) -> _Prepared:
        key = ("cuda", cupy.cuda.runtime.getDevice(), id(plan))
        hit = batch._cache.get(key)
        if hit is not None and hit.plan is plan:
            return hit
        order = plan.order
        K = len(order)
        meta = np.concatenate([batch.offset[order], batch.ld[order]]).astype(np.int64)
        imeta = np.concatenate([plan.n, plan.npiv, plan.start, order]).astype(np.int32)
        prep = _Prepared(plan, cupy.asarray(meta), cupy.asarray(imeta),
                         cupy.zeros(3, dtype=np.uint64), [], plan.nstreams)
        prep.ptrs.tbl = prep.table.data.ptr
        prep.ptrs.meta, prep.ptrs.imeta = prep.meta.data.ptr, prep.imeta.data.ptr
        for lc in plan.launches:
            rec, scalars = self._record(lc, plan, batch.dtype, batch.order, K)
            rec.bind(prep.ptrs, scalars)
            prep.records.append(rec)
        if prep.records:
            prep.graph = self._capture(prep)
        batch._cache[key] = prep
        return prep

    @staticmethod
    def _capture(prep: _Prepared):
        """Every launch of the plan, captured once into a CUDA graph (run by one call per
        factorization). Plans with several chains keep them on forked streams in the graph."""
        cs = cupy.cuda.Stream(non_blocking=True)
        sides = [cupy.cuda.Stream(non_blocking=True) for _ in range(prep.nstreams - 1)]
        cs.begin_capture()
        try:
            streams = [cs] + sides
            if sides:
                fork = cs.record()
                for s in sides:
                    s.wait_event(fork)
            for rec in prep.records:
                rec.launch(streams[rec.stream].ptr)
            for s in sides:
                cs.wait_event(s.record())
        finally:
            graph = cs.end_capture()
        return graph

    def _record(self, lc: Launch, plan: Plan, dtype: np.dtype, order: str, K: int) -> _Record:
        sel = select(lc, plan.nb, dtype, order, self.fp64_update)
        kern = _kernel(sel.name, sel.source)
        # Every step kernel takes (tbl, meta, imeta, K, lo, hi, step, extra): five scalars
        # (cuLaunchKernel reads exactly as many parameter pointers as the kernel has, so a short
        # list reads past the array).
        scalars = (K, lc.lo, lc.hi, lc.step, sel.extra)
        if sel.smem > 48 * 1024 and kern.max_dynamic_shared_size_bytes < sel.smem:
            kern.max_dynamic_shared_size_bytes = sel.smem
        grid3 = sel.grid + (1,) * (3 - len(sel.grid))
        block3 = sel.block + (1,) * (3 - len(sel.block))
        return _Record(kern, kern.kernel.ptr, grid3, block3, sel.smem, lc.stream), scalars

    def begin(self, src: PackedBatch, dst: PackedBatch, plan: Plan, after: list) -> _Exec:
        prep = self._prepare(src, plan)
        main = cupy.cuda.get_current_stream()
        for dep in after:
            if isinstance(dep, _Done):
                main.wait_event(dep.event)
            else:
                dep.wait()
        slot = self._slots.take(plan.k)
        slot.info[:] = 0
        slot.table[0], slot.table[1], slot.table[2] = (src.data.data.ptr, dst.data.data.ptr,
                                                        slot.info_ptr)
        graph = prep.graph if self.graphs else None
        return _Exec(prep, slot, main, (src, dst), graph)

    def launch(self, ex: _Exec, lc: Launch) -> None:
        # Nothing reaches the device here: the launches go out together in flush(), which
        # holds the batch's lock for exactly as long as it uses the shared pointer table.
        if ex.graph is None:
            ex.direct.append(ex.prep.records[lc.index])

    def flush(self, ex: _Exec, then=None) -> None:
        main, prep = ex.main, ex.prep
        # Calls on one (batch, plan) share its device table: each waits for the previous one
        # before overwriting it, and the lock keeps two threads from interleaving. Held only
        # inside this method (a `with`), so an exception anywhere cannot leave it taken.
        with prep.lock:
            if prep.last is not None:
                main.wait_event(prep.last)
            cupy.cuda.runtime.memcpyAsync(prep.table.data.ptr, ex.slot.mem.ptr, 24,
                                          cupy.cuda.runtime.memcpyHostToDevice, main.ptr)
            if ex.graph is not None:
                ex.graph.launch(main)
            elif ex.direct:
                self._launch_direct(main, ex.direct, prep.nstreams)
            if then is not None:
                then()
            ex.slot.event.record(main)
            prep.last = ex.slot.event

    def _launch_direct(self, main, records: list, nstreams: int) -> None:
        """Launch by launch (no graph), chains forked onto the backend's streams and joined."""
        if nstreams == 1:
            for rec in records:
                rec.launch(main.ptr)
            return
        streams = self._streams_for(nstreams)
        ready = main.record()
        for s in streams:
            s.wait_event(ready)
        sptr = [s.ptr for s in streams]
        for rec in records:
            rec.launch(sptr[rec.stream])
        for s in streams:
            main.wait_event(s.record())

    def end(self, ex: _Exec) -> Completion:
        return _Done(ex.slot, self._slots, ex.keep, ex.main.ptr)

    # ------------------------------------------------------------ memory limits
    memory_name = "GPU"

    def memory_total(self) -> int:
        dev = cupy.cuda.runtime.getDevice()
        total = self._mem_total.get(dev)
        if total is None:
            total = self._mem_total[dev] = cupy.cuda.runtime.memGetInfo()[1]
        return total

    def memory_free(self) -> int:
        # What the driver has free plus what CuPy's pool holds for reuse.
        return cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()
