"""The backend interface: what the runtime asks of a device.

A backend owns memory of one array kind (numpy for the CPU, cupy for CUDA) and executes a
:class:`~vbatch.scheduler.Plan` one launch at a time. The runtime drives it, for an op whose
buffers are, say, an input ``a`` and an output ``l`` laid out like it::

    backend.order_after([...])                           # what it must wait for, first
    a = backend.stage_input(batch, writable=overwrite)   # where kernels read the input
    l = a if overwrite else backend.new_output(a)        # where they write the output
    ex = backend.begin(plan, {"a": a, "l": l}, config=config)
    for launch in plan.launches:
        backend.launch(ex, launch)                       # one vbatched launch per group
    backend.flush(ex, then=writeback)                    # all issued (a CUDA graph runs here)
    done = backend.end(ex)                               # a Completion; done.wait() -> info

What each launch kind computes lives in its kernel family's module (``kernels/<family>_cpu.py``,
``kernels/<family>_cuda.py``; a launch names its family), so one plan may mix families (``posv``:
the ``potrf`` kernels, then the ``blas`` ones); this interface and the two backends know no
operation. Kernels read each part of an input once and write the outputs; an output may be its
input's own buffer (in place). Out of place, no backend copies a whole input first: each task
reads the part it works on (the CPU backend copies it into the output just before working on it,
the CUDA kernels read it straight into registers or shared memory).

No call leaves state behind that the next one depends on if it raises: a backend that must
serialize calls on shared device state (the CUDA backend's pointer table) does so inside one
method (``flush``), never from one call to the next.

A backend is *synchronous* (the CPU: work is done when ``launch`` returns, so the runtime runs it
on a worker thread) or *asynchronous* (CUDA: ``launch`` only records, the runtime calls it in the
caller's thread and ``Completion.wait`` synchronizes once at the end).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from vbatch.core.batch import SUPPORTED_DTYPES, MatrixList, PackedBatch
from vbatch.core.errors import InputError
from vbatch.scheduler.plan import Launch, Plan


class Completion(ABC):
    """The end of one submitted plan on a backend. ``queue`` names the ordered queue (stream) it
    ends on: the runtime keeps the last completion per queue to implement ``wait()``."""

    queue: Any = None

    @abstractmethod
    def wait(self) -> np.ndarray:
        """Block until done; return ``info`` (int32, LAPACK convention) in the caller's problem
        order, one entry per problem of the batch."""

    @abstractmethod
    def done(self) -> bool:
        """True once ``wait`` would not block."""

    def sync(self) -> None:
        """Block until done without consuming the result (``Runtime.wait``)."""
        self.wait()


class TraceRecord:
    """One traced launch: the plan's launch, its stream, the kernel it ran (a device's), host
    times (perf_counter seconds) around issuing it, and on an asynchronous backend the events
    around it on its stream and the event every time of the call counts from."""

    __slots__ = ("launch", "stream", "kernel", "host", "events", "base")

    def __init__(self, launch, stream=0, kernel="", host=(0.0, 0.0), events=None, base=None):
        self.launch, self.stream, self.kernel = launch, stream, kernel
        self.host, self.events, self.base = host, events, base


def kernel_modules(suffix: str) -> dict:
    """``{op name: module}`` for every ``kernels/<op><suffix>.py`` (each names its ``OP``): how
    a backend finds the kernels of every operation without a list to edit."""
    import importlib
    import pkgutil

    import vbatch.kernels as pkg

    out = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.endswith(suffix):
            mod = importlib.import_module(f"vbatch.kernels.{info.name}")
            out[mod.OP] = mod
    return out


class Backend(ABC):
    name: str = "?"
    kind: str = "numpy"  # the array kind of this backend's buffers
    asynchronous: bool = False
    memory_name: str = "host"
    # While a list (vbatch.runtime.trace), every launch appends a TraceRecord to it: the launch
    # run launch by launch, with its host times and, on a device, its events.
    tracer: list | None = None
    # {op name: its kernel module for this backend}; each backend fills it.
    kernels: dict = {}
    # The dtypes its kernels take (the runtime refuses others before any work: check_dtype).
    dtypes: tuple = SUPPORTED_DTYPES

    def dtypes_for(self, families) -> tuple:
        """The dtypes the kernels of every one of ``families`` take."""
        return self.dtypes

    def check_dtype(self, dtype, operand: str | None = None, families=(),
                    op: str | None = None) -> None:
        """An InputError (naming ``operand``) where this backend's kernels (of ``families``,
        for ``op``) do not take ``dtype``."""
        have = self.dtypes_for(families)
        if np.dtype(dtype) not in have:
            what = f"{operand}: " if operand else ""
            names = ", ".join(d.name for d in have)
            raise InputError([(None, f"{what}the {self.name} backend does not take "
                                     f"{np.dtype(dtype)}{f' for {op}' if op else ''} "
                                     f"(it takes {names})")])

    def tune_key(self) -> str:
        """What a tune file's entry must have been measured on (:mod:`vbatch.runtime.tune`):
        the backend and its device."""
        return self.name

    def _op(self, op: str):
        try:
            return self.kernels[op]
        except KeyError:
            raise ValueError(f"the {self.name} backend has no kernels for {op!r}") from None

    def plan_defaults(self, op: str, dtype: np.dtype, order: str | None = None) -> dict:
        """Planner options this backend prefers for ``op`` on ``dtype`` (``nb``,
        ``fused_max_rows``, ``streams``, ...), where the caller does not say: the op's kernel
        module's ``plan_defaults(dtype)``, what its optional ``device_defaults(dtype, info)``
        makes of this device (:meth:`device_info`), and for a batch of layout ``order`` ("F" or
        "C"; None: unknown) what its optional ``layout_defaults(dtype, order)`` changes."""
        mod = self._op(op)
        out = mod.plan_defaults(dtype)
        device = getattr(mod, "device_defaults", None)
        if device is not None:
            out = {**out, **device(dtype, self.device_info())}
        layout = getattr(mod, "layout_defaults", None)
        if order is not None and layout is not None:
            out = {**out, **layout(dtype, order)}
        return out

    def device_info(self) -> dict:
        """What kernel modules' ``device_defaults`` read of the current device (CUDA: ``sms``,
        its multiprocessors); empty where nothing is known."""
        return {}

    def check_options(self, op: str, dtype: np.dtype, options: dict) -> None:
        """Raise ``InputError`` for planner options this backend cannot run, or cap them in
        place to what it can: the op's kernel module's ``check_options``, if it has one."""
        check = getattr(self._op(op), "check_options", None)
        if check is not None:
            check(dtype, options)

    def check_plan(self, plan: Plan) -> None:
        """Raise ``InputError``, naming the problem, for a plan this backend cannot run (a
        launch larger than its grid allows): each kernel family's ``check_plan``, if it has
        one. Called at submit, once per new plan."""
        for fam in plan.families:
            check = getattr(self._op(fam), "check_plan", None)
            if check is not None:
                check(plan)

    def memory_total(self) -> int:
        """Bytes of this backend's memory in all (0: unknown, nothing is checked)."""
        return 0

    def memory_free(self) -> int:
        """Bytes this backend could allocate now."""
        return self.memory_total()

    # ------------------------------------------------------------ memory
    @abstractmethod
    def stage_input(self, batch: PackedBatch | MatrixList, writable: bool,
                    others: tuple = ()) -> Any:
        """Where kernels read an input: the caller's packed buffer when it is on this
        backend's memory, else a copy; a list packed (gathered into one buffer).
        ``writable``: an output will be written over it, so it must be a packed buffer that is
        the caller's (packed, ``overwrite``), a list's own memory (a batch whose cache says
        ``in_place``: :meth:`reads_in_place`) or our own copy (a list, written back after).
        ``others``: the call's other operands; a list that shares memory with one of them is
        copied."""

    def reads_in_place(self, batch: PackedBatch | MatrixList) -> bool:
        """Whether :meth:`stage_input` of ``batch`` written in place (``writable``) works on
        the caller's own memory, with no copy (the memory check then counts none)."""
        return False

    @abstractmethod
    def new_output(self, like: Any) -> PackedBatch:
        """A new packed buffer on this backend with the layout of the staged input ``like``
        (a list's: packed back to back)."""

    @abstractmethod
    def new_buffer(self, m: np.ndarray, n: np.ndarray, dtype: Any, order: str,
                   zero: bool = True) -> Any:
        """A new packed buffer of ``m[i] x n[i]`` matrices back to back (an output no input
        gives the layout of), zeros; ``zero=False``: the kernels will write all of it, so a
        backend may leave it as allocated."""

    @abstractmethod
    def buffer_maker(self, m: np.ndarray, n: np.ndarray, dtype: Any, order: str,
                     zero: bool = True) -> tuple[Any, Any]:
        """``(template, alloc)`` for the runtime's replay of a known call: ``alloc()`` returns
        a new data array of :meth:`new_buffer`'s for these shapes on each call, and
        ``template.with_data`` lays it out. The replay launches on the bare array and builds
        the batch after the launch, where the GPU's work hides it. A backend may keep the
        layout, and what it derived from it, from one call to the next."""

    def assemble(self, dst: Any, index: Any, values: Any) -> None:
        """``dst`` zeroed, then ``dst[index] = values`` (a contiguous ``dst``, a contiguous
        int64 ``index`` without repeats and ``values`` of its size and ``dst``'s dtype, all
        three arrays of this backend's kind): a sparse matrix's entries into its fronts."""
        dst.fill(0)
        dst[index] = values

    def batch_of(self, staged: Any) -> PackedBatch:
        """The packed batch behind a staged output (the runtime builds results from it)."""
        return staged

    @abstractmethod
    def scatter(self, work: PackedBatch, target: list | PackedBatch) -> None:
        """Copy ``work`` back into the caller's arrays or packed buffer (``overwrite=True``)."""

    @abstractmethod
    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        """``work`` with its buffer as an array of ``kind`` (no copy when already that kind)."""

    # ------------------------------------------------------------ execution
    def order_after(self, after: list[Completion]) -> None:
        """Whatever this caller issues from here on (staging included: a gather reads what a
        dependency writes) runs after ``after``. By default: wait for each."""
        for dep in after:
            dep.wait()

    @abstractmethod
    def begin(self, plan: Plan, buffers: dict, config: Any,
              scalars: dict | None = None) -> Any:
        """Start a call: ``buffers`` maps the op's buffer names to staged inputs and outputs
        (``None``: an absent input); ``scalars`` the call's ``alpha`` and ``beta``. What it
        must wait for was ordered before staging (:meth:`order_after`)."""

    @abstractmethod
    def launch(self, ex: Any, launch: Launch) -> None: ...

    def launch_all(self, ex: Any, launches) -> None:
        """Every launch of a plan, in order (a backend that runs a whole plan at once, as a
        CUDA graph, need not visit them one by one)."""
        for lc in launches:
            self.launch(ex, lc)

    def flush(self, ex: Any, then=None) -> None:
        """Issue whatever ``launch`` deferred, then call ``then()`` (a write-back into the
        caller's arrays), which is ordered after the work and before the completion."""
        if then is not None:
            then()

    @abstractmethod
    def end(self, ex: Any) -> Completion: ...

    def run(self, plan: Plan, buffers: dict, config: Any,
            scalars: dict | None = None) -> Completion:
        """A whole call with nothing to wait for and nothing to write back (the runtime's
        replay paths): ``begin``, every launch, ``flush``, ``end``. A backend may do it in
        fewer steps."""
        ex = self.begin(plan, buffers, config, scalars)
        self.launch_all(ex, plan.launches)
        self.flush(ex)
        return self.end(ex)

    def replayer(self, plan: Plan, buffers: dict, config: Any,
                 scalars: dict | None = None) -> Any:
        """``fire(datas) -> Completion | None``: :meth:`run` on buffers laid out as
        ``buffers``, given only their data arrays in the order
        of ``buffers``, with what run() resolves per call resolved once; ``fire`` returns None
        where it cannot (the caller then uses run()). None where there is none (here: a backend
        without one); the prepared call then calls run() on every replay. A backend that has
        one also has
        ``new_data(like)``: an uninitialized array of the kind, shape and dtype of ``like``."""
        return None
