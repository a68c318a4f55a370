"""CUDA backend: one vbatched kernel launch per plan launch.

What each launch kind runs belongs to its op's launcher (``kernels/<op>_cuda.py``: the kernel, its
grid and the device tables) and ``.cu`` file; this module is the part every op shares. Kernels are
loaded from the cubins a build with nvcc left beside this module (``bin/``,
:func:`vbatch.kernels.cuda_build.build_binaries`), or, for a device or source they were not built
for, compiled at run time by NVRTC through ``cupy.RawModule`` (:mod:`vbatch.kernels.cuda_build`
gives each its source text): one module per template instantiation, compiled the first time a
plan needs it and cached per device (CuPy also keeps the binaries on disk, ``$CUPY_CACHE_DIR``).

Per (plan, batch layout), built once: the op's device tables (per-problem arrays and the plan's
task table; for a list, laid out from its sizes alone, kept with the plan), a launch record per
plan launch (kernel, grid, block, shared memory, scalars), and a CUDA graph holding every launch,
captured once, with the plan's streams and waits. Kernels take the per-call pointers (the op's
buffers, then ``info``) from a small device table, so the graph's parameters never change.

Per call: an output buffer (out of place) or none, one graph launch, one event record. A call
whose pointers were seen before (the same input, an output buffer the pool hands back, the same
info slot) runs a graph captured for that very table, which is on the device already; any other
call copies its pointers into the plan's shared table first, after the previous such call.
``info`` lives in pinned host memory that the kernels address directly
(unified addressing): the host zeroes it, kernels write a problem's entry only when it fails,
and ``result()`` reads it after the event. Measured on the H100 (profile_cuda.py host,
2026-11-21): a device info array plus memset plus copy-back cost ~11 us per call, and each kernel
launch ~8 us of host time even through ``cuLaunchKernel`` with prebuilt parameter blocks (CuPy's
RawKernel call: ~10 us); a plan for Nmax 512 has 32-46 launches. ``Config(cuda_graphs=False)``
launches kernel by kernel instead.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import functools
import operator
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import cupy
import numpy as np
from cupy_backends.cuda.api import driver

from vbatch.kernels.backend import Backend, Completion, TraceRecord
from vbatch.kernels.cuda_build import (
    Binaries,
    copy_name,
    put_name,
    launchers,
    source_of,
    source_text,
    spd_fill_name,
)
from vbatch.core.batch import (
    MatrixList,
    PackedBatch,
    addresses,
    array_kind,
    extents,
    first_time,
    in_place_layout,
    layout_token,
    overlaps,
    pack,
)
from vbatch.scheduler.plan import Launch, Plan


@cupy.memoize(for_each_device=True)
def _kernel(expr: str, source: str):
    """The kernel for one template instantiation on this device: prebuilt where the package has
    a cubin for the device (:func:`_prebuilt`), else compiled by NVRTC on first use.

    One NVRTC module per instantiation: a plan compiles only what it launches (an instantiation
    takes 1-4 s of NVRTC time; all of them together, minutes)."""
    kern = _prebuilt(expr)
    if kern is not None:
        return kern
    mod = cupy.RawModule(code=source_text(source), options=("-std=c++17",),
                         name_expressions=(expr,))
    return mod.get_function(expr)


@functools.cache
def _binaries() -> Binaries | None:
    return Binaries.read()


def _prebuilt(expr: str):
    """Kernel ``expr`` from the package's cubins (cuda_build.Binaries), or None where none was
    built for this device's architecture from its source as it is now, or where the driver
    cannot load its cubin (one built by a newer nvcc than the driver knows, a damaged file):
    it then compiles through NVRTC."""
    idx = _binaries()
    hit = None if idx is None else idx.find(expr, cupy.cuda.Device().compute_capability)
    if hit is None or str(hit[0]) in _UNUSABLE:
        return None
    try:
        return _module(str(hit[0])).get_function(hit[1])
    except (OSError, cupy.cuda.driver.CUDADriverError) as exc:
        import warnings

        _UNUSABLE.add(str(hit[0]))
        warnings.warn(f"vbatch: the prebuilt kernels in {hit[0]} do not load ({exc}); "
                      f"compiling through NVRTC instead", RuntimeWarning, stacklevel=3)
        return None


_UNUSABLE: set = set()  # cubins the driver refused (_prebuilt)


@cupy.memoize(for_each_device=True)
def _module(path: str):
    return cupy.RawModule(path=path)


def _compile_one(expr: str) -> str:
    _kernel(expr, source_of(expr))
    return expr


def precompile(names: list[str], jobs: int = 8) -> None:
    """Compile kernels in parallel processes, filling CuPy's on-disk cache, so that later
    processes load binaries instead of running NVRTC (a fresh machine would otherwise spend
    minutes compiling one instantiation after another)."""
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_compile_one, names))


def spd_fill(batch: PackedBatch, seed: int) -> PackedBatch:
    """Fill a device batch with diagonally dominant SPD matrices in one launch (generate.cu)."""
    name = spd_fill_name(batch.dtype)
    kern = _kernel(name, source_of(name))
    k = batch.k
    if k:
        kern((k,), (32, 8), (batch.data, cupy.asarray(batch.offset), cupy.asarray(batch.ld),
                             cupy.asarray(batch.n.astype(np.int32)), np.int32(k),
                             np.int32(batch.order == "C"), np.uint64(seed)))
    return batch


class _Params(ctypes.Structure):
    """The pointer parameters every vbatched kernel takes first: the per-call table (buffers,
    info), the per-problem arrays and the task table. Fixed per (plan, layout), so a captured
    graph stays valid."""

    _fields_ = [("tbl", ctypes.c_uint64), ("meta", ctypes.c_uint64), ("imeta", ctypes.c_uint64),
                ("tasks", ctypes.c_uint64)]


SCALARS = 4  # K, lo, hi, extra
IN_PLACE_KEPT = 16  # layouts of in-place lists kept (CudaBackend._in_place)
ENTRIES = 8  # prepared plans kept on one layout token (CudaBackend._prepare), oldest out


@dataclass
class _Record:
    """One launch, ready for cuLaunchKernel: its parameter block points at the plan's shared
    pointer parameters and at its own scalars (K, lo, hi, extra)."""

    kernel: object
    func: int
    grid: tuple
    block: tuple
    smem: int
    launch_: Launch
    scalars: object = None
    params: object = None
    name: str = ""  # the kernel's template instantiation (for profiles)

    def bind(self, ptrs: _Params, scalars: tuple) -> None:
        if len(scalars) != SCALARS:
            raise ValueError(f"a vbatched kernel takes {SCALARS} scalars, got {len(scalars)}")
        self.scalars = (ctypes.c_int32 * SCALARS)(*[int(s) for s in scalars])
        base = ctypes.addressof(ptrs)
        slots = [base + getattr(_Params, f).offset for f, _ in _Params._fields_]
        slots += [ctypes.addressof(self.scalars) + 4 * i for i in range(SCALARS)]
        self.params = (ctypes.c_void_p * len(slots))(*slots)

    def launch(self, stream: int) -> None:
        g, b = self.grid, self.block
        driver.launchKernel(self.func, g[0], g[1], g[2], b[0], b[1], b[2], self.smem, stream,
                            ctypes.addressof(self.params), 0)


# put (copy.cu): Backend.assemble, prebuilt with every other kernel (as NVRTC source it was
# compiled at a process's first sparse factor), launched through the driver as the plans'
# records are.
@functools.cache
def _put_func(dtype, device: int) -> int:
    name = put_name(dtype)
    return _kernel(name, source_of(name)).kernel.ptr


def _issue(records: list, main, sides: list, tracer: list | None = None) -> None:
    """Launch ``records`` in plan order on ``main`` and the side streams: launch i goes on
    stream ``launch.stream`` after the launches it waits for (events), and every side stream
    forks from ``main`` first and joins it last. Used by graph capture and direct launches.
    ``tracer``: a list that gets a TraceRecord per launch, with events around it on its stream
    (direct launches only)."""
    streams = [main] + sides
    base = main.record() if tracer is not None else None
    if sides:
        fork = main.record()
        for s in sides:
            s.wait_event(fork)
    waited = {w for r in records for w in r.launch_.waits}
    done: dict[int, object] = {}
    for rec in records:
        lc = rec.launch_
        s = streams[lc.stream]
        for w in lc.waits:
            s.wait_event(done[w])
        if tracer is not None:
            h0 = time.perf_counter()
            e0 = s.record()
            rec.launch(s.ptr)
            e1 = s.record()
            tracer.append(TraceRecord(lc, lc.stream, rec.name, (h0, time.perf_counter()),
                                      (e0, e1), base))
        else:
            rec.launch(s.ptr)
        if lc.index in waited:
            done[lc.index] = s.record()
    for s in sides:
        main.wait_event(s.record())


def tables(plan: Plan, buffers: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What every kernel reads besides the matrices, per (plan, layout): ``meta`` (int64: for
    each of the op's buffers in order, offset[K] then ld[K]), ``imeta`` (int32: each buffer's
    n[K]) and the task table (int32 rows of ``TASK_COLS``: the problem, then the task's args,
    in plan order). An absent buffer's entries are zeros. A family that reads one buffer finds
    it first (POTRF's kernels read ``meta = offset, ld`` and ``imeta = n`` of buffer 0)."""
    from vbatch.kernels.cuda_build import TASK_COLS

    K = plan.k
    names = plan.buffers
    meta = np.zeros(2 * K * len(names), dtype=np.int64)
    imeta = np.zeros(K * len(names), dtype=np.int32)
    for s, name in enumerate(names):
        b = buffers.get(name)
        if b is None:
            continue
        meta[2 * K * s: 2 * K * s + K] = b.offset
        meta[2 * K * s + K: 2 * K * (s + 1)] = b.ld
        imeta[K * s: K * (s + 1)] = b.n
    t = plan.tasks
    if t.args.shape[1] > TASK_COLS - 1:
        raise ValueError(f"tasks with {t.args.shape[1]} args exceed the table's {TASK_COLS - 1}")
    tasks = np.zeros((len(t), TASK_COLS), dtype=np.int32)
    tasks[:, 0] = t.problem
    tasks[:, 1:1 + t.args.shape[1]] = t.args
    return meta, imeta, tasks.reshape(-1)


def _upload(arrays) -> tuple:
    """One host-to-device copy of several small tables, laid end to end in one device array,
    each at an 8-byte boundary: that array and each table's device address. A copy each cost
    a call's host path a round trip each (the three tables of a new plan: ~64 us apiece on the
    H100 host uncontended, ~350 us under 64 submitting threads, whose turn for the GIL each
    such call waits for: a coalesced bucket's send, benchmarks/coalesce_steps.py, 2026-11-25)."""
    words = [(a.nbytes + 7) // 8 for a in arrays]
    host = np.zeros(max(sum(words), 1), dtype=np.int64)
    raw = host.view(np.uint8)
    at = 0
    for a, w in zip(arrays, words):
        raw[8 * at: 8 * at + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        at += w
    dev = cupy.asarray(host)
    base, addrs, at = dev.data.ptr, [], 0
    for w in words:
        addrs.append(base + 8 * at)
        at += w
    return dev, tuple(addrs)


def sections(plan: Plan, modules: dict) -> tuple[list, dict]:
    """The per-call pointer table: each kernel family's section, one after another (entries:
    the op's buffer names, ``info``, the scalars: SCALAR_ENTRIES), and each family's first
    entry."""
    entries, start = [], {}
    for fam in plan.families:
        start[fam] = len(entries)
        entries += modules[fam].section(plan.buffers)
    return entries, start


# The table's scalar entries: the call's scalar each holds, and which part (0 real, 1 imaginary).
SCALAR_ENTRIES = {"alpha": ("alpha", 0), "beta": ("beta", 0), "alpha_im": ("alpha", 1),
                  "beta_im": ("beta", 1)}

# Pointer tables per (plan, layout) kept on the device with their own graph. A repeated call
# on one batch cycles through two output buffers (the pool hands back the one the previous
# result freed) and one info slot; a few more leave room for interleaved callers. Measured on
# the H200 host (2026-11-24, docs/decisions.md#host-device-tables): the shared table's copy, the
# wait for the previous call and the lock cost ~3.5 us of a ~35 us call. Each fixed table costs a
# graph capture, so only plans whose host time matters (few launches: small problems) get them.
FIXED_TABLES = 4
FIXED_MAX_LAUNCHES = 8


@dataclass
class _Prepared:
    """Device-side state of one (plan, layout): built once, reused by every call.

    ``table`` is the shared device copy of a call's pointers; calls that use it are ordered by
    ``last`` (the previous such call's end event), so one call never rewrites it under another's
    kernels. ``graph`` holds every launch of the plan, captured once against ``table`` on its
    second use: a plan run once (a coalesced bucket, a one-off batch) is not worth capturing.
    ``fixed`` maps a table's contents, seen twice, to a device table that is never rewritten
    and a graph captured against it: such a call copies nothing and waits for no one."""

    plan: Plan
    arrays: tuple  # the device copy of the tables (kept alive for the kernels)
    table: object  # cupy uint64: every family's section
    records: list
    entries: list  # what each table slot holds
    # How to fill a call's pointer table: (slot, buffer name) for the op's buffers, the slots
    # of info, alpha and beta (compiled from entries once, so a call does no string tests).
    fill: tuple = ()
    ptrs: dict = field(default_factory=dict)  # family -> its _Params
    lock: threading.Lock = field(default_factory=threading.Lock)
    graph: object = None
    last: object = None
    calls: int = 0
    start: dict = field(default_factory=dict)  # family -> its first entry in the table
    fixed: dict = field(default_factory=dict)  # table bytes -> (device table, graph)
    seen: dict = field(default_factory=dict)  # table bytes -> calls that used the shared table
    nptr: int = 1  # entries of a call's table
    # Names this (plan, layout) to the slots whose tables hold its constant entries already
    # (a token, not the object: a slot must not keep a dropped plan's device state alive).
    token: object = field(default_factory=object)


class _Exec:
    """One call: its prepared plan, slot, stream, the buffers that must outlive the launches,
    the plan's graph when the call runs through it, else the records to launch one by one.
    (A plain class: a dataclass with a default factory cost ~1 us of every call's path.)"""

    __slots__ = ("prep", "slot", "main", "keep", "graph", "direct", "fixed")

    def __init__(self, prep, slot, main, keep, graph=None, fixed=False):
        self.prep, self.slot, self.main, self.keep, self.graph = prep, slot, main, keep, graph
        self.fixed = fixed  # graph reads a table of its own: no copy, no wait
        self.direct: list = []


class _Slot:
    """Pinned host memory for one call: the pointer table copied to the device at submit, and
    ``info`` itself, which the kernels address directly (unified addressing). Also the event
    that ends the call."""

    __slots__ = ("mem", "table", "info", "info_ptr", "event", "nptr", "key", "owner", "scalars",
                 "tracked")

    def __init__(self, k: int, nptr: int):
        head = 8 * nptr + (-8 * nptr) % 32
        self.nptr, self.key = nptr, (k, nptr)
        self.mem = cupy.cuda.alloc_pinned_memory(head + max(4 * k, 4))
        self.table = np.frombuffer(self.mem, np.uint64, nptr)
        self.info = np.frombuffer(self.mem, np.int32, k, offset=head)
        self.info_ptr = self.mem.ptr + head
        self.event = cupy.cuda.Event(block=False, disable_timing=True)
        # Whose constant entries (info's address, alpha and beta) the table holds: the
        # (plan, layout)'s token and the scalars it was filled with (held, so that the identity
        # test cannot match a new dict at a freed one's address).
        self.owner = self.scalars = None
        self.tracked = False  # in the pool's in-flight list (_SlotPool.track)


class _SlotPool:
    """Slots go back to the free list only after their reader copied info out
    (Completion.wait), or, for a call whose future is dropped unread, once its event completes
    (orphan); until then such a slot is kept here, so memory the kernels may still write is
    never freed under them."""

    def __init__(self):
        self._free: dict[tuple, list] = {}
        self._inflight: deque = deque()
        self._orphans: deque = deque()  # slots of futures dropped unread (_Done.__del__)
        self._lock = threading.Lock()
        self._track = threading.Lock()

    # list.pop is atomic, so taking a slot takes no lock; ``_lock`` guards only the creation of
    # a free list.
    def take(self, k: int, nptr: int) -> _Slot:
        try:
            return self._free[k, nptr].pop()
        except (KeyError, IndexError):
            pass
        if self._orphans:
            self._adopt()
            try:
                return self._free[k, nptr].pop()
            except (KeyError, IndexError):
                pass
        return _Slot(k, nptr)

    def orphan(self, slot: _Slot) -> None:
        """``slot``'s future was dropped unread: no one will copy its info out, so it goes back
        to the free list once its event completes (_adopt). Without this, a loop of submits
        whose futures are dropped (a pipeline waited for by Runtime.wait) allocated pinned
        memory on every call (docs/decisions.md#host-orphan-slots)."""
        self._orphans.append(slot)

    def _adopt(self) -> None:
        # (each orphan looked at once: the finished ones to the free lists, the others back)
        orphans = self._orphans
        for _ in range(len(orphans)):
            try:
                slot = orphans.popleft()
            except IndexError:
                return
            if slot.event.done:
                self.give(slot)
            else:
                orphans.append(slot)

    def track(self, slot: _Slot) -> None:
        """Keep ``slot`` until its event completes; called once the call's event is recorded.
        (Tracked at take(), a slot still showed its previous call's event, done, until flush
        recorded the new one: other threads' takes in that window could forget it while its
        kernels were still to write ``info``: docs/decisions.md#host-slot-tracking.)

        A slot is in the list at most once (``tracked``): a loop of submit-then-wait takes the
        same slot back each call, still running when tracked, and appending it each time made
        a list of one slot repeated without end. Under a lock, so that a
        slot cannot be forgotten by one thread (its old event done) while another, having
        just recorded its new one, finds it still marked and does not append it."""
        inflight = self._inflight
        with self._track:
            if not slot.tracked:
                slot.tracked = True
                inflight.append(slot)
            # Forget finished ones from the old end, stopping at the first still running (it
            # goes back at the new end).
            while len(inflight) > 64:
                old = inflight.popleft()
                if not old.event.done:
                    inflight.append(old)
                    break
                old.tracked = False

    def give(self, slot: _Slot) -> None:
        stack = self._free.get(slot.key)
        if stack is None:
            with self._lock:
                stack = self._free.setdefault(slot.key, [])
        stack.append(slot)


class _Done(Completion):
    def __init__(self, slot: _Slot, pool: _SlotPool, keep, queue):
        self.event, self.queue = slot.event, queue
        self._slot, self._pool, self._keep = slot, pool, keep
        self._info = None

    def __del__(self):
        if self._slot is not None:  # (never waited for: its slot is no one's now)
            self._pool.orphan(self._slot)

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


# Host arrays of at least STAGE_MIN bytes cross the link through two pinned buffers of
# STAGE_CHUNK bytes: host threads copy one chunk while the other crosses. Pageable copies ran at
# 8.7 GB/s up and 2.7 down (a new array's pages faulted in one thread), pinned ones at 54, one
# thread's host copy at 10-12; these at 24.6 up and 14.1-25.3 down (714 MiB, H100 host,
# docs/decisions.md#host-pinned-staging).
STAGE_MIN = 8 << 20
STAGE_CHUNK = 32 << 20
STAGE_THREADS = 8


def _pinned(a: np.ndarray) -> bool:
    """Whether host array ``a`` lies in page-locked memory the device can copy from directly
    (allocated or registered through CUDA)."""
    try:
        return cupy.cuda.runtime.pointerGetAttributes(a.ctypes.data).type == 1  # (host)
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


class _Staging:
    """Two pinned buffers, a stream and an event each, and the threads that fill and empty
    them: one per device, used by one transfer at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.chunk = c = STAGE_CHUNK
        mem = [cupy.cuda.alloc_pinned_memory(c) for _ in range(2)]
        self.pins = [np.frombuffer(m, np.uint8, c) for m in mem]
        self.ptrs = [m.ptr for m in mem]
        self.events = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self.pool = cf.ThreadPoolExecutor(STAGE_THREADS, thread_name_prefix="vbatch-stage")

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``dst[...] = src`` (bytes) in parallel parts (numpy releases the GIL to copy)."""
        n = dst.size
        step = max(1, -(-n // STAGE_THREADS))
        parts = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
        list(self.pool.map(lambda r: np.copyto(dst[r[0]:r[1]], src[r[0]:r[1]]), parts))

    def up(self, src: np.ndarray, dst_ptr: int) -> None:
        """``src`` (host bytes) to the device at ``dst_ptr``; returns when it is there."""
        kind, c = cupy.cuda.runtime.memcpyHostToDevice, self.chunk
        with self.lock:
            for i, lo in enumerate(range(0, src.size, c)):
                b, hi = i % 2, min(lo + c, src.size)
                self.events[b].synchronize()  # (its last chunk has crossed)
                self.copy(self.pins[b][:hi - lo], src[lo:hi])
                cupy.cuda.runtime.memcpyAsync(dst_ptr + lo, self.ptrs[b], hi - lo, kind,
                                              self.stream.ptr)
                self.events[b].record(self.stream)
            self.stream.synchronize()

    def direct(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        """One copy between pinned host memory and the device; returns when it is done."""
        with self.lock:
            cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, self.stream.ptr)
            self.stream.synchronize()

    def down(self, src_ptr: int, dst: np.ndarray) -> None:
        """The device bytes at ``src_ptr`` into ``dst`` (host bytes), the next chunk crossing
        while this one is copied out."""
        kind, c = cupy.cuda.runtime.memcpyDeviceToHost, self.chunk
        chunks = [(lo, min(lo + c, dst.size)) for lo in range(0, dst.size, c)]

        def fetch(i):
            lo, hi = chunks[i]
            cupy.cuda.runtime.memcpyAsync(self.ptrs[i % 2], src_ptr + lo, hi - lo, kind,
                                          self.stream.ptr)
            self.events[i % 2].record(self.stream)

        with self.lock:
            fetch(0)
            for i, (lo, hi) in enumerate(chunks):
                if i + 1 < len(chunks):
                    fetch(i + 1)  # (its buffer was emptied by the step before)
                self.events[i % 2].synchronize()
                self.copy(dst[lo:hi], self.pins[i % 2][:hi - lo])


class CudaBackend(Backend):
    name = "cuda"
    kind = "cupy"
    asynchronous = True
    memory_name = "GPU"

    def __init__(self):
        self._streams: dict[int, list] = {}
        self._slots = _SlotPool()
        self._mem_total: dict[int, int] = {}
        self._info: dict[int, dict] = {}
        self._staging: dict[int, _Staging] = {}
        self._places: dict[tuple, PackedBatch] = {}  # in-place list layouts (_in_place)
        self._seen: dict[tuple, None] = {}  # list layouts seen once (_in_place)
        self._place_lock = threading.Lock()
        self.kernels = launchers()

    def dtypes_for(self, families) -> tuple:
        # (of the dtypes every backend takes, those all of the op's families' kernels take)
        return tuple(d for d in self.dtypes
                     if all(d.name in self._op(f).DTYPES for f in families))

    def _stage(self) -> _Staging:
        dev = cupy.cuda.runtime.getDevice()
        st = self._staging.get(dev)
        if st is None:
            st = self._staging[dev] = _Staging()
        return st

    def upload(self, host: np.ndarray) -> cupy.ndarray:
        """A device copy of a host array (through pinned buffers past STAGE_MIN bytes; in one
        copy where the array is in pinned memory already)."""
        if host.nbytes < STAGE_MIN or not host.flags.c_contiguous:
            return cupy.asarray(host)
        out = cupy.empty(host.shape, host.dtype)
        st = self._stage()
        if _pinned(host):
            st.direct(out.data.ptr, host.ctypes.data, host.nbytes,
                      cupy.cuda.runtime.memcpyHostToDevice)
        else:
            st.up(host.reshape(-1).view(np.uint8), out.data.ptr)
        return out

    def download(self, d: cupy.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``d`` on the host: into ``out`` (same size and dtype) or a new array."""
        if out is None:
            if d.nbytes < STAGE_MIN:
                return d.get()
            out = np.empty(d.shape, d.dtype)
        if d.nbytes < STAGE_MIN or not (out.flags.c_contiguous and d.flags.c_contiguous):
            out[...] = d.get()
            return out
        st = self._stage()
        if _pinned(out):
            st.direct(out.ctypes.data, d.data.ptr, d.nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        else:
            st.down(d.data.ptr, out.reshape(-1).view(np.uint8))
        return out

    def tune_key(self) -> str:
        """The GPU's name and compute capability, and the CUDA runtime's version."""
        dev = cupy.cuda.runtime.getDevice()
        p = cupy.cuda.runtime.getDeviceProperties(dev)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        return (f"cuda {name} sm_{p['major']}{p['minor']} "
                f"runtime {cupy.cuda.runtime.runtimeGetVersion()}")

    def device_info(self) -> dict:
        dev = cupy.cuda.runtime.getDevice()
        hit = self._info.get(dev)
        if hit is None:
            hit = self._info[dev] = {"sms": int(cupy.cuda.Device(dev).attributes[
                "MultiProcessorCount"])}
        return hit

    def memory_total(self) -> int:
        dev = cupy.cuda.runtime.getDevice()
        total = self._mem_total.get(dev)
        if total is None:
            total = self._mem_total[dev] = cupy.cuda.runtime.memGetInfo()[1]
        return total

    def memory_free(self) -> int:
        # What the driver has free plus what CuPy's pool holds for reuse.
        return cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()

    # ------------------------------------------------------------ memory
    def stage_input(self, batch, writable: bool, others: tuple = ()) -> PackedBatch:
        if batch is None:
            return None
        if isinstance(batch, MatrixList):
            if writable and batch.kind == "cupy":
                work = self._in_place(batch, others)
                if work is not None:
                    return work
            # One packed buffer on the device (an upload, or one gather kernel for cupy
            # arrays), laid out from the sizes alone: its device tables are kept with the plan.
            if batch.kind == "numpy":
                host = pack(batch, order="C")
                work = host.with_data(self.upload(host.data))
            else:
                work = pack(batch, order=batch.packed_order, backend=self)
            work.cache()["tight"] = True
            return work
        if batch.kind == "cupy":
            return batch
        return batch.with_data(self.upload(batch.data))  # one upload; the copy is ours

    def reads_in_place(self, batch) -> bool:
        # (the memory check asks only of lists past a quarter of the memory: _in_place takes
        # every such list whose layout it can describe)
        return (type(batch) is MatrixList and batch.kind == "cupy"
                and in_place_layout(batch) is not None)

    def _in_place(self, ml: MatrixList, others: tuple = ()) -> PackedBatch | None:
        """A cupy list written in place (``overwrite``) as a packed batch over the memory its
        arrays occupy (:func:`~vbatch.core.batch.in_place_layout`): no gather, no scatter and
        no copy of its matrices. One layout per set of addresses and sizes (the last
        ``IN_PLACE_KEPT``), so that calls on the same arrays find their device tables and
        graph again. A layout new to the plan costs its tables and launch records (up to
        ~1 ms for a plan of 40 launches), more than the copies of a small list, so a list
        at addresses first seen is gathered, unless it is more than a quarter of the device's
        memory (the copy may not fit, and copying it costs more)."""
        lay = in_place_layout(ml)
        if lay is None:
            return None
        # Another operand of the call in the same memory (posv(A, A), a packed c over a's
        # buffer) would be read while it is written: copied, it is read as it was.
        mine = extents(ml)
        try:
            if any(overlaps(mine, ext) for o in others if (ext := extents(o)) is not None):
                return None
        except ValueError:  # (a device operand whose memory is unknown)
            return None
        base, offset, ld, order, span = lay
        dev = cupy.cuda.runtime.getDevice()
        key = (dev, ml.dtype, order, base, span, offset.tobytes(), ld.tobytes(),
               ml.m.tobytes(), ml.n.tobytes())
        tmpl = self._places.get(key)
        if tmpl is None:
            # (as the memory check counts a list: it asks for room for a copy past a quarter)
            nbytes = int((np.maximum(ml.m, 1) * ml.n).sum()) * ml.dtype.itemsize
            with self._place_lock:
                if (4 * nbytes <= self.memory_total()
                        and first_time(self._seen, key, 4 * IN_PLACE_KEPT)):
                    return None
                if any(a.device.id != dev for a in ml.mats):
                    return None  # (the view below would claim another GPU's memory)
                tmpl = PackedBatch.model_construct(data=None, m=ml.m, n=ml.n, offset=offset,
                                                   ld=ld, order=order)
                tmpl.cache()["in_place"] = True
                while len(self._places) >= IN_PLACE_KEPT:
                    self._places.pop(next(iter(self._places)))
                self._places[key] = tmpl
        # (the view keeps the caller's arrays alive while kernels may write them)
        mem = cupy.cuda.UnownedMemory(base, span * ml.dtype.itemsize, ml.mats, dev)
        return tmpl.with_data(cupy.ndarray((span,), ml.dtype, cupy.cuda.MemoryPointer(mem, 0)))

    def new_output(self, like: PackedBatch) -> PackedBatch:
        return like.with_data(self.new_data(like.data))

    @staticmethod
    def new_data(d):
        # (cupy.ndarray: cupy.empty without its argument handling, 1.75 against 2.13 us a
        # call on the H100 host, 2026-11-25)
        return cupy.ndarray(d.shape, d.dtype)

    def new_buffer(self, m, n, dtype, order: str, zero: bool = True) -> PackedBatch:
        from vbatch.core.batch import tight_layout

        off, ld, total = tight_layout(m, n, order)
        # An empty matrix of a nonzero other dimension still takes space (ld >= 1) that no
        # kernel writes: such a layout is zeroed all the same.
        zero = zero or total != int((np.asarray(m, np.int64) * np.asarray(n, np.int64)).sum())
        data = cupy.zeros(total, dtype) if zero else cupy.ndarray((total,), dtype)
        out = PackedBatch.model_construct(data=data, m=m, n=n, offset=off, ld=ld, order=order)
        out.cache()["tight"] = True
        return out

    def buffer_maker(self, m, n, dtype, order: str, zero: bool = True):
        # One layout (and one cache: the device tables are found again, as for a batch made
        # with with_data) for every buffer it makes; the template holds no device memory.
        # new_buffer itself validates nothing but builds its layout and a pydantic model each
        # call: ~5 us of a known GEMM's host path (H100 host, 2026-11-25). Without zeros, no
        # memset: 4.5 against 9.1 us a call there, and one operation fewer on the stream. (The
        # shared cache also keeps what later calls store in it, plans of ops run on these
        # outputs, for as long as the runtime remembers the call: at most Runtime.KNOWN of them.)
        first = self.new_buffer(m, n, dtype, order, zero)
        zero = zero or first.data.size != int(
            (np.asarray(m, np.int64) * np.asarray(n, np.int64)).sum())  # as new_buffer
        size, dt = (first.data.size,), first.data.dtype
        tmpl = first.with_data(None)
        if zero:
            return tmpl, lambda: cupy.zeros(size, dt)
        return tmpl, lambda: cupy.ndarray(size, dt)

    def assemble(self, dst, index, values) -> None:
        # One kernel: cupy's fancy-index assignment checks and normalizes the index first
        # (several launches and ~85 us of host time for a small matrix's factor; H100,
        # 2026-11-25). The zeros by a memset: dst.fill is a kernel call of cupy's.
        stream = cupy.cuda.get_current_stream().ptr
        cupy.cuda.runtime.memsetAsync(dst.data.ptr, 0, dst.nbytes, stream)
        if index.size:
            if not values.flags.c_contiguous:
                values = cupy.ascontiguousarray(values)
            args = (ctypes.c_int64 * 4)(values.data.ptr, index.data.ptr, index.size,
                                        dst.data.ptr)
            base = ctypes.addressof(args)
            params = (ctypes.c_void_p * 4)(base, base + 8, base + 16, base + 24)
            driver.launchKernel(_put_func(dst.dtype, cupy.cuda.runtime.getDevice()),
                                min(-(-index.size // 256), 8192), 1, 1, 256, 1, 1, 0, stream,
                                ctypes.addressof(params), 0)

    @staticmethod
    def batch_of(staged: PackedBatch) -> PackedBatch:
        return staged

    def gather(self, mats: list, m: np.ndarray, n: np.ndarray, offset: np.ndarray,
               ld: np.ndarray, dtype, order: str, addr: np.ndarray | None = None):
        """One kernel copies every matrix of a cupy list into a new packed buffer (``addr``:
        the arrays' addresses and strides, :func:`vbatch.core.batch.addresses`, if known)."""
        size = ld * (m if order == "C" else n)
        total = int(offset[-1] + size[-1]) if len(n) else 0
        data = cupy.empty(total, dtype=dtype)
        if total:
            self._copy(mats, data, m, n, offset, ld, order, to_packed=True, addr=addr)
        return data

    def copy_in(self, mats: list, data, m, n, offset, ld, addr: np.ndarray) -> None:
        """Copy each cupy array ``mats[i]`` (``m[i] x n[i]``, its address and strides in
        elements in ``addr``, 3 x k) into ``data`` at ``offset[i]``, row-major with leading
        dimension ``ld[i]``: one launch (the sparse solve stacks a list of right-hand sides so;
        a 1-D array is an ``n x 1`` matrix of row stride its stride)."""
        self._copy(mats, data, m, n, offset, ld, "C", to_packed=True, addr=addr)

    def _copy(self, mats, data, m, n, offset, ld, order, to_packed: bool,
              addr: np.ndarray | None = None) -> None:
        k = len(mats)
        tab = np.empty((7, k), dtype=np.int64)
        tab[:3] = addresses(mats, np.dtype(data.dtype).itemsize, m, n) if addr is None else addr
        tab[3], tab[4], tab[5], tab[6] = offset, ld, m, n
        d_tab = cupy.asarray(tab)  # (one upload: each costs a round trip of its own)
        name = copy_name(data.dtype)
        kern = _kernel(name, source_of(name))
        # Each block copies at most ~16 elements a thread of its matrix (runs of 256 elements,
        # gridDim.y blocks a matrix): the largest matrix sets how many blocks a matrix gets.
        most = int((m * n).max()) if k else 0
        ys = max(1, min(65535, -(-most // (256 * 16))))
        kern((k, ys), (256,), (d_tab, data, np.int32(k), np.int32(order == "C"),
                               np.int32(to_packed)))

    def scatter(self, work: PackedBatch, target) -> None:
        if isinstance(target, PackedBatch):
            if target.kind == "numpy":
                self.download(work.data, target.data)
            else:
                target.data[...] = work.data
            return
        if target and array_kind(target[0]) == "cupy":
            self._copy(target, work.data, work.m, work.n, work.offset, work.ld, work.order,
                       to_packed=False)
            return
        host = work.with_data(self.download(work.data))
        for i, a in enumerate(target):
            if a.size:
                a[...] = host._view(i)

    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        return work if kind == "cupy" else work.with_data(self.download(work.data))

    # ------------------------------------------------------------ execution
    def _streams_for(self, n: int) -> list:
        dev = cupy.cuda.Device().id
        pool = self._streams.setdefault(dev, [])
        while len(pool) < n:
            pool.append(cupy.cuda.Stream(non_blocking=True))
        return pool[:n]

    def _prepare(self, plan: Plan, buffers: dict, config) -> _Prepared:
        # The tables depend on every buffer's layout. A list's (or a new output's) follows
        # from its sizes, which the plan fixes: "tight". A packed batch's is named by its
        # layout token (shared by its with_data twins and by live batches of an equal layout:
        # vbatch.core.batch.layout_token), so a batch packed afresh each call finds the tables
        # of the last. The entry lives on the first packed buffer's token (it dies with it;
        # at most ENTRIES a token), else with the plan. That token is "home" in the key and
        # the others are held weakly: a key that held its own token, or two tokens' entries
        # that held each other, would be a cycle, freed only by the cyclic collector.
        # The last buffers' caches seen with this plan, and what they found: a repeated call
        # on the same layout (a packed batch factored again: its output shares its cache)
        # skips the walk below. The memo holds those cache dicts, so their ids stay theirs.
        memo = plan.cache.get("cuda-last")
        dev = cupy.cuda.runtime.getDevice()
        caches = [None if b is None else b.__dict__.get("_vb_cache") for b in buffers.values()]
        if memo is not None and memo[0] == dev and memo[1] is config and len(caches) == len(
                memo[3]) and all(map(operator.is_, caches, memo[3])):
            return memo[2]
        tokens, home = [], None
        for name in plan.buffers:
            b = buffers.get(name)
            if b is None:
                tokens.append(None)
                continue
            if b.cache().get("tight"):
                tokens.append(("tight", b.order))
                continue
            tok = layout_token(b)
            if home is None:
                home = tok
                tokens.append("home")
            else:
                tokens.append(weakref.ref(tok))
        if home is not None and home.entries is None:
            home.entries = {}
        cache = plan.cache if home is None else home.entries
        key = ("cuda", dev, id(plan), config.fp64_update, config.fp64_gemm, tuple(tokens))
        hit = cache.get(key)
        if hit is not None and hit.plan is plan:
            if all(c is not None or b is None for c, b in zip(caches, buffers.values())):
                plan.cache["cuda-last"] = (dev, config, hit, caches)
            return hit
        modules = {fam: self._op(fam) for fam in plan.families}
        entries, start = sections(plan, modules)
        dev_tables, addrs = _upload(tables(plan, buffers))
        # (empty: every call copies its pointers in before its launches, and a fixed table is
        # a device array of its own)
        prep = _Prepared(plan, (dev_tables,), cupy.empty(max(len(entries), 1), dtype=np.uint64),
                         [], entries)
        prep.fill = (tuple((i, e) for i, e in enumerate(entries)
                           if e != "info" and e not in SCALAR_ENTRIES),
                     tuple(i for i, e in enumerate(entries) if e == "info"),
                     tuple((i, e) for i, e in enumerate(entries) if e in SCALAR_ENTRIES))
        prep.start = start
        prep.nptr = max(len(entries), 1)
        for fam in plan.families:
            ptrs = prep.ptrs[fam] = _Params()
            ptrs.tbl = prep.table.data.ptr + 8 * start[fam]
            ptrs.meta, ptrs.imeta, ptrs.tasks = addrs
        layout = next(b for b in buffers.values() if b is not None)
        orders = {name: b.order for name, b in buffers.items() if b is not None}
        for lc in plan.launches:
            mod = modules[lc.family]
            sel = mod.selection(lc, plan, layout.dtype, orders, config)
            kern = _kernel(sel.name, sel.source)
            # (the opt-in is needed past 48 KB of static and dynamic memory together)
            if (sel.smem + kern.shared_size_bytes > 48 * 1024
                    and kern.max_dynamic_shared_size_bytes < sel.smem):
                kern.max_dynamic_shared_size_bytes = sel.smem
            grid3 = sel.grid + (1,) * (3 - len(sel.grid))
            block3 = sel.block + (1,) * (3 - len(sel.block))
            rec = _Record(kern, kern.kernel.ptr, grid3, block3, sel.smem, lc, name=sel.name)
            rec.bind(prep.ptrs[lc.family], (plan.k, lc.lo, lc.hi, sel.extra))
            prep.records.append(rec)
        if home is not None and len(cache) >= ENTRIES:
            try:  # (another thread's call may evict the same one meanwhile)
                cache.pop(next(iter(cache)), None)
            except (StopIteration, RuntimeError):
                pass
        cache[key] = prep
        return prep

    @staticmethod
    def _capture(prep: _Prepared, table=None):
        """Every launch of the plan, captured into a CUDA graph (run by one call per
        factorization), on forked streams with the plan's waits; the kernels read ``table``
        (a device uint64 array), by default the shared one. Called with ``prep.lock`` held: the
        launch records' parameters point at ``prep.ptrs``, which this retargets meanwhile."""
        cs = cupy.cuda.Stream(non_blocking=True)
        sides = [cupy.cuda.Stream(non_blocking=True) for _ in range(prep.plan.nstreams - 1)]
        base = (prep.table if table is None else table).data.ptr
        for fam, ptrs in prep.ptrs.items():
            ptrs.tbl = base + 8 * prep.start[fam]
        cs.begin_capture()
        try:
            _issue(prep.records, cs, sides)
        finally:
            graph = cs.end_capture()
            for fam, ptrs in prep.ptrs.items():
                ptrs.tbl = prep.table.data.ptr + 8 * prep.start[fam]
        return graph

    def _fix(self, prep: _Prepared, key: bytes, slot: _Slot, main):
        """A device table of its own for pointers seen twice, and a graph that reads it: made
        once (under the plan's lock, so two threads cannot make two) and never rewritten.
        The copy goes on this caller's stream; ``ready`` is recorded after it, and a call on
        another stream that finds the table waits for it before its graph reads the table.
        (Today every plan's table holds its slot's ``info`` address, so only
        a call that took this very slot matches the key, and a slot goes back to the pool only
        after its reader synchronized it; the wait keeps that true for a plan without one.)"""
        with prep.lock:
            hit = prep.fixed.get(key)
            if hit is None:
                table = cupy.empty(slot.nptr, dtype=np.uint64)
                cupy.cuda.runtime.memcpyAsync(table.data.ptr, slot.mem.ptr, 8 * slot.nptr,
                                              cupy.cuda.runtime.memcpyHostToDevice, main.ptr)
                ready = cupy.cuda.Event(block=False, disable_timing=True)
                ready.record(main)
                try:
                    graph = self._capture(prep, table)
                except BaseException:
                    # the copy still reads the slot's pinned memory: kept until it ends
                    slot.event.record(main)
                    self._slots.track(slot)
                    raise
                hit = prep.fixed[key] = (table, graph, ready, main.ptr)
        return hit

    def order_after(self, after: list) -> None:
        # on the device: the caller's stream waits for each dependency's event
        main = cupy.cuda.get_current_stream()
        for dep in after:
            if isinstance(dep, _Done):
                main.wait_event(dep.event)
            else:
                dep.wait()

    def begin(self, plan: Plan, buffers: dict, config,
              scalars: dict | None = None) -> _Exec:
        prep = self._prepare(plan, buffers, config)
        main = cupy.cuda.get_current_stream()
        ptrs = []
        for _, e in prep.fill[0]:
            b = buffers.get(e)
            ptrs.append(0 if b is None else b.data.data.ptr)
        return self._start(prep, main, ptrs, config, scalars, tuple(buffers.values()))

    def _start(self, prep: _Prepared, main, ptrs: list, config, scalars: dict | None,
               keep: tuple) -> _Exec:
        """A call's slot and pointer table (the buffers' addresses ``ptrs``, in the order of
        ``prep.fill``'s buffer entries) and the graph it runs: what every call does once its
        plan is prepared (begin, and the replays of :meth:`replayer`)."""
        slot = self._slots.take(prep.plan.k, prep.nptr)
        slot.info.fill(0)
        table = slot.table
        bufs, infos, scal = prep.fill
        # A repeated call gets back the slot it used last: its constant entries are in place
        # (each entry costs ~0.3 us of the call's host path to write; H100 host, 2026-11-25).
        if slot.owner is not prep.token or slot.scalars is not scalars:
            for i in infos:
                table[i] = slot.info_ptr
            for i, e in scal:
                name, part = SCALAR_ENTRIES[e]
                v = complex((scalars or {}).get(name, 0.0))
                table[i] = np.float64(v.imag if part else v.real).view(np.uint64)
            slot.owner, slot.scalars = prep.token, scalars
        for (i, _), p in zip(bufs, ptrs):
            table[i] = p
        graph, fixed = None, False
        if config.cuda_graphs and prep.records:
            if len(prep.records) <= FIXED_MAX_LAUNCHES:
                key = table.tobytes()
                hit = prep.fixed.get(key)
                if hit is None and len(prep.fixed) < FIXED_TABLES:
                    seen = prep.seen
                    if len(seen) > 64:
                        seen.clear()
                    seen[key] = seen.get(key, 0) + 1
                    if seen[key] >= 2:
                        hit = self._fix(prep, key, slot, main)
                if hit is not None:
                    graph, fixed = hit[1], True
                    if hit[3] != main.ptr:  # made on another stream: after its copy
                        main.wait_event(hit[2])
            if not fixed:
                prep.calls += 1
                if prep.graph is None and prep.calls >= 2:
                    with prep.lock:
                        prep.graph = self._capture(prep)
                graph = prep.graph
        return _Exec(prep, slot, main, keep, graph, fixed)

    def replayer(self, plan: Plan, buffers: dict, config, scalars: dict | None = None):
        """``fire(datas)``: ``plan`` run on buffers of the layouts of ``buffers``, given only
        their device arrays (``datas``, in the order of ``buffers``; None for an absent one),
        with nothing to wait for. The plan's device state, the buffers' table slots and the
        device are resolved here once, so a call is its slot, its table, the graph's launch and
        the completion: run() without _prepare's memo and the buffers' batches (about 3 us of a
        36 us call's issue on the H200 host, stamped; docs/decisions.md#host-prepared-calls).
        None where a buffer is on another device than the current one; ``fire`` returns None
        from a call made under another current device (the caller then takes the general path,
        its output allocated again)."""
        dev = cupy.cuda.runtime.getDevice()
        if any(b is not None and b.data.device.id != dev for b in buffers.values()):
            return None  # built on the buffers' own device only (the runtime asks again)
        prep = self._prepare(plan, buffers, config)
        names = list(buffers)
        # (a table entry that is none of the buffers gets 0, as begin writes for it)
        where = [names.index(e) if e in names else None for _, e in prep.fill[0]]
        get_device, stream = cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
        launches = plan.launches

        def fire(datas: tuple):
            if get_device() != dev:
                return None
            main = stream()
            ptrs = []
            for j in where:
                d = None if j is None else datas[j]
                ptrs.append(0 if d is None else d.data.ptr)
            # (prep too: its device tables and graphs must outlive the kernels, as the
            # batches' cache held them for begin's callers)
            ex = self._start(prep, main, ptrs, config, scalars, (datas, prep))
            self.launch_all(ex, launches)
            self.flush(ex)
            return self.end(ex)

        return fire

    def launch_all(self, ex: _Exec, launches) -> None:
        if ex.graph is None:  # (with a graph, flush launches everything at once)
            recs = ex.prep.records
            ex.direct.extend(recs[lc.index] for lc in launches)

    def launch(self, ex: _Exec, lc: Launch) -> None:
        # Nothing reaches the device here: the launches go out together in flush(), which
        # holds the plan's lock for exactly as long as it uses the shared pointer table.
        if ex.graph is None:
            ex.direct.append(ex.prep.records[lc.index])

    def flush(self, ex: _Exec, then=None) -> None:
        main, prep = ex.main, ex.prep
        if ex.fixed:  # its own table, on the device since it was fixed: nothing shared
            try:
                ex.graph.launch(main)
                if then is not None:
                    then()
            finally:
                ex.slot.event.record(main)
                self._slots.track(ex.slot)
            return
        # Calls on one (plan, layout) share its device table: each waits for the previous one
        # before overwriting it, and the lock keeps two threads from interleaving. Held only
        # inside this method (a `with`), so an exception anywhere cannot leave it taken.
        with prep.lock:
            if prep.last is not None:
                main.wait_event(prep.last)
            try:
                cupy.cuda.runtime.memcpyAsync(prep.table.data.ptr, ex.slot.mem.ptr,
                                              8 * ex.slot.nptr,
                                              cupy.cuda.runtime.memcpyHostToDevice, main.ptr)
                if ex.graph is not None:
                    ex.graph.launch(main)
                elif ex.direct:
                    _issue(ex.direct, main, self._streams_for(prep.plan.nstreams - 1)
                           if prep.plan.nstreams > 1 else [], self.tracer)
                if then is not None:
                    then()
            finally:
                # (also when a launch failed: what went out before it may still write info)
                ex.slot.event.record(main)
                self._slots.track(ex.slot)
                prep.last = ex.slot.event

    def end(self, ex: _Exec) -> Completion:
        return _Done(ex.slot, self._slots, ex.keep, ex.main.ptr)
