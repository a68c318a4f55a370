"""The public face: :class:`Runtime`, :class:`Future`, :class:`CholeskyResult`.

A submission goes through the same stages on every backend::

    validate (pydantic, before any work) -> plan (cached on a PackedBatch) -> stage memory
        -> begin -> one backend launch per plan launch -> end -> Future

On the CPU the stages after planning run on the runtime's worker thread, so ``cholesky`` returns
at once and ``after=`` dependencies are waited for there. On CUDA they run in the caller's thread
and only enqueue work; dependencies become stream waits on events, and ``Future.result`` is the
single synchronization point, where ``info`` is read back once.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from vbatch.kernels import Completion, get_backend
from vbatch.ops.batch import MatrixList, PackedBatch
from vbatch.ops.cholesky import CholeskyRequest, read_only
from vbatch.ops.errors import InputError, validated
from vbatch.runtime.device import resolve_device
from vbatch.scheduler.plan import Plan, make_plan


# Plans of list inputs kept per runtime, by size signature (least recently used dropped first).
LIST_PLANS = 64


class DependencyError(RuntimeError):
    """A submission could not run because a future it was ordered ``after`` failed."""


class Options(BaseModel):
    """Planning options. ``None`` means the backend's default for the batch's dtype."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nb: int | None = Field(default=None, ge=1, le=1024)
    policy: Literal["dsse", "ssde"] = "dsse"
    fused_max_rows: int | None = Field(default=None, ge=0)
    streams: int | None = Field(default=None, ge=1, le=64)


@dataclass(frozen=True)
class CholeskyResult:
    """``factors``: a list (same array kind as the input list) or a :class:`PackedBatch`.
    ``info``: int32 per problem, LAPACK convention (0 = success, j > 0 = leading minor of
    order j not positive definite; that factor is incomplete, the others are unaffected)."""

    factors: Any
    info: np.ndarray
    plan: Plan

    @property
    def ok(self) -> bool:
        return not np.any(self.info)

    def failed(self) -> np.ndarray:
        """Indices of the problems whose factorization failed."""
        return np.flatnonzero(self.info)


_PENDING = object()


class Future:
    """The pending result of one submission. ``result()`` waits and returns a
    :class:`CholeskyResult`, or raises what the execution raised.

    On the CPU the worker thread fulfils a ``concurrent.futures.Future``. On CUDA the future
    holds the backend's completion (an event) and builds its result on the first ``result()``:
    no thread, no condition variable, on a path whose whole budget is tens of microseconds.
    """

    __slots__ = ("_runtime", "_cf", "_completion", "_finish", "_value", "_error", "_lock",
                 "_deps")

    def __init__(self, runtime: "Runtime", threaded: bool):
        self._runtime = runtime
        self._cf: cf.Future | None = cf.Future() if threaded else None
        self._completion: Completion | None = None
        self._finish = None
        self._value = _PENDING
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        # Dependencies ordered on the device, whose own failure (in building their result on
        # the host) can come after this submission was enqueued: checked by result().
        self._deps: list | None = None

    # Set by the runtime when the work is enqueued on an asynchronous backend.
    def _attach(self, completion: Completion, finish, deps: list | None = None) -> None:
        self._completion, self._finish, self._deps = completion, finish, deps or None

    def _fail(self, exc: BaseException) -> None:
        if self._cf is not None:
            self._cf.set_exception(exc)
        else:
            self._error = exc

    def done(self) -> bool:
        if self._cf is not None:
            return self._cf.done()
        if self._value is not _PENDING or self._error is not None:
            return True
        return self._completion is not None and self._completion.done()

    def result(self, timeout: float | None = None) -> CholeskyResult:
        if self._cf is not None:
            return self._cf.result(timeout)
        if self._value is _PENDING and self._error is None:
            if timeout is not None:
                deadline = time.monotonic() + timeout
                while not self._completion.done():
                    if time.monotonic() > deadline:
                        raise cf.TimeoutError()
                    time.sleep(1e-4)
            with self._lock:
                if self._value is _PENDING and self._error is None:
                    try:
                        info = self._completion.wait()
                        for i, d in self._deps or ():
                            exc = d.exception()
                            if exc is not None:
                                raise DependencyError(f"after[{i}] failed: {exc!r}") from exc
                        self._value = self._finish(info)
                    except BaseException as exc:  # noqa: BLE001 - raised to the caller below
                        self._error = exc
                    self._finish = self._deps = None  # what they hold is no longer needed
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except cf.TimeoutError:
            raise
        except BaseException as exc:  # noqa: BLE001 - this method reports any failure
            return exc
        return None

    def completion(self) -> Completion | None:
        """The backend completion, once enqueued (used to order dependent submissions)."""
        return self._completion


class Runtime:
    """Submit batches, get futures.

    ``device``: ``"auto"`` (CUDA when a GPU is usable, else the CPU), ``"cpu"`` or ``"cuda"``.
    Planning options (``nb``, ``policy``, ``fused_max_rows``, ``streams``) default to what the
    backend prefers for the batch's dtype.
    """

    def __init__(self, device: str = "auto", **options: Any):
        self.device = resolve_device(device)
        self.backend = get_backend(self.device)
        self.options = validated(Options, what="runtime options", **options)
        self._pool = None
        if not self.backend.asynchronous:
            # One worker: submissions run in order, so an `after=` dependency on this runtime is
            # always ahead in the queue and waiting for it cannot deadlock.
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix=f"vbatch-{self.device}")
        # For wait(): asynchronous backends keep the last completion per stream they enqueued
        # on (so no future, and none of its buffers, is held here); the synchronous one uses a
        # barrier job on its FIFO worker.
        self._tails: dict = {}
        self._lock = threading.Lock()
        self._opts: dict = {}  # dtype -> planner options (one dict per dtype, identity-keyed)
        self._list_plans: OrderedDict = OrderedDict()  # size signature -> plan, last used last

    def __repr__(self) -> str:
        return f"Runtime(device={self.device!r}, {self.options!r})"

    # ------------------------------------------------------------------ planning
    def plan_options(self, dtype: Any) -> dict:
        """The planner's options for a batch of this dtype: the caller's, else the backend's."""
        dtype = np.dtype(dtype)
        hit = self._opts.get(dtype)
        if hit is None:
            d = self.backend.plan_defaults(dtype)
            o = self.options
            hit = {
                "nb": d.nb if o.nb is None else o.nb,
                "policy": o.policy,
                "fused_max_rows": (d.fused_max_rows if o.fused_max_rows is None
                                   else o.fused_max_rows),
                "streams": d.streams if o.streams is None else o.streams,
            }
            self.backend.check_options(dtype, hit)
            self._opts[dtype] = hit
        return hit

    def plan(self, mats: Any, npiv: Any = None) -> Plan:
        """The plan that :meth:`cholesky` would execute for this input (for inspection)."""
        req = validated(CholeskyRequest, batch=mats, npiv=npiv)
        return self._plan(req.batch, req.npiv, full=npiv is None)

    def _plan(self, batch, npiv: np.ndarray, full: bool) -> Plan:
        opts = self.plan_options(batch.dtype)
        if not isinstance(batch, PackedBatch):
            # A list is planned from its sizes alone: calls with the same sizes (and npiv) reuse
            # the plan and what the backend derived from it.
            key = (id(opts), batch.n.tobytes(), None if full else npiv.tobytes())
            with self._lock:
                plan = self._list_plans.get(key)
                if plan is not None:
                    self._list_plans.move_to_end(key)
                    return plan
            plan = make_plan(batch.n, npiv, **opts)
            self.backend.check_plan(plan)
            with self._lock:
                self._list_plans[key] = plan
                while len(self._list_plans) > LIST_PLANS:
                    self._list_plans.popitem(last=False)
            return plan
        # A packed batch's metadata is read-only, so its plan is reused call after call.
        key = ("plan", self.device, id(opts))
        hit = batch._cache.get(key)
        if hit is not None and hit.opts is opts and (
            hit.full if full else np.array_equal(hit.npiv, npiv)
        ):
            return hit.plan
        plan = make_plan(batch.n, npiv, **opts)
        self.backend.check_plan(plan)
        batch._cache[key] = _CachedPlan(opts, full, npiv, plan)
        return plan

    # ------------------------------------------------------------------ submission
    def cholesky(
        self,
        mats: Any,
        npiv: Any = None,
        *,
        after: Any = (),
        overwrite: bool = False,
    ) -> Future:
        """Factor a batch: ``mats`` is a list of square arrays or a :class:`PackedBatch`.

        ``npiv`` factors only the first ``npiv[i]`` columns of problem ``i`` and leaves the Schur
        complement in the trailing block. The work starts once every future in ``after`` is done.
        Inputs are left untouched unless ``overwrite=True``. Bad input raises
        :class:`~vbatch.InputError` here, before any work.
        """
        if type(mats) is PackedBatch and npiv is None and (
            overwrite is False or (overwrite is True and not read_only(mats))
        ):
            # Hot path: a packed batch was validated when it was built and its metadata is
            # read-only; nothing else needs checking (pydantic would add ~8 us per call).
            batch, p, full = mats, mats.n, True
        else:
            req = validated(CholeskyRequest, batch=mats, npiv=npiv, overwrite=overwrite)
            batch, p, full = req.batch, req.npiv, npiv is None
        deps = list(after) if isinstance(after, (list, tuple)) else [after]
        if deps:
            bad = [(None, f"after[{i}] is a {type(d).__name__}, not a vbatch.Future")
                   for i, d in enumerate(deps) if not isinstance(d, Future)]
            if bad:
                raise InputError(bad, what="submission")
        self._check_memory(batch, overwrite)
        plan = self._plan(batch, p, full)
        fut = Future(self, threaded=self._pool is not None)
        job = (fut, batch, overwrite, plan, deps)
        if self._pool is not None:
            self._pool.submit(self._run_sync, *job)
        else:
            self._run_async(*job)
        return fut

    def _check_memory(self, batch, overwrite: bool) -> None:
        """Refuse, before any work, a batch the backend's memory cannot stage: a problem whose
        own matrix is larger than the whole memory, or a batch larger than what is free."""
        b = self.backend
        isz = batch.dtype.itemsize
        if isinstance(batch, PackedBatch):
            staged = 0 if (overwrite and batch.kind == b.kind) else batch.data.size * isz
        else:
            staged = int((np.maximum(batch.n, 1) * batch.n).sum()) * isz
        total = b.memory_total()
        # Cheap on the hot path: the free memory is asked only for a batch that is a large
        # part of the whole.
        if not total or staged * 4 <= total:
            return
        where = f"{b.memory_name} memory"
        need = batch.n.astype(np.float64) ** 2 * isz
        big = [(int(i), f"n = {batch.n[i]} needs {_bytes(need[i])} ({batch.n[i]}^2 x {isz} "
                        f"bytes), more than the {_bytes(total)} of {where}")
               for i in np.flatnonzero(need > total)]
        if big:
            raise InputError(big)
        free = b.memory_free()
        if staged > free:
            raise InputError([(None, f"the batch needs {_bytes(staged)} of {where} to run "
                                     f"({'a copy of ' if staged else ''}its matrices), but only "
                                     f"{_bytes(free)} of {_bytes(total)} is free")])

    def wait(self) -> None:
        """Wait for everything submitted so far (errors stay with their futures)."""
        if self._pool is not None:
            self._pool.submit(lambda: None).result()  # one FIFO worker: a barrier
            return
        with self._lock:
            tails = list(self._tails.values())
        for c in tails:
            c.sync()

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ execution
    def _execute(self, batch, overwrite: bool, plan: Plan, after: list[Completion]):
        """Stage memory, run every launch of the plan; return the completion and a finisher
        that turns ``info`` into a :class:`CholeskyResult` in the caller's form."""
        b = self.backend
        if isinstance(batch, MatrixList):
            src, dst = b.stage_list(batch, overwrite)
        else:
            src, dst = b.adopt(batch, overwrite)
        ex = b.begin(src, dst, plan, after)
        for lc in plan.launches:
            b.launch(ex, lc)
        # Writing back into the caller's device arrays is enqueued right after the plan's
        # launches (flush runs it), before the completion, so that work ordered after this
        # submission sees it. Host arrays are written when the result is built (it needs the
        # data on the host anyway).
        device_writeback = (isinstance(batch, MatrixList) and overwrite
                            and batch.kind == b.kind and b.asynchronous)
        b.flush(ex, then=(lambda: b.scatter(dst, batch.mats)) if device_writeback else None)
        completion = b.end(ex)

        def finish(info: np.ndarray) -> CholeskyResult:
            if isinstance(batch, MatrixList):
                if overwrite:
                    if not device_writeback:
                        b.scatter(dst, batch.mats)
                    return CholeskyResult(batch.mats, info, plan)
                return CholeskyResult(b.export(dst, batch.kind).unpack(), info, plan)
            if not overwrite:
                return CholeskyResult(b.export(dst, batch.kind), info, plan)
            if dst.data is not batch.data:
                b.scatter(dst, batch)  # e.g. a host batch factored on the device
            return CholeskyResult(batch, info, plan)

        return completion, finish

    def _run_sync(self, fut: Future, batch, overwrite: bool, plan: Plan, deps: list) -> None:
        try:
            for i, d in enumerate(deps):
                exc = d.exception()
                if exc is not None:
                    raise DependencyError(f"after[{i}] failed: {exc!r}") from exc
            completion, finish = self._execute(batch, overwrite, plan, [])
            fut._cf.set_result(finish(completion.wait()))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            fut._cf.set_exception(exc)

    def _run_async(self, fut: Future, batch, overwrite: bool, plan: Plan, deps: list) -> None:
        waits: list[Completion] = []
        # Host inputs are read now, in this thread, so every dependency must have finished
        # (and written its host results back) first; device inputs are ordered on the device.
        host_input = batch.kind != self.backend.kind
        for i, d in enumerate(deps):
            c = d.completion()
            if (host_input or c is None or d._runtime.backend is not self.backend
                    or d._error is not None):  # (already known to have failed)
                exc = d.exception()
                if exc is not None:
                    fut._fail(DependencyError(f"after[{i}] failed: {exc!r}"))
                    return
            else:
                waits.append(c)
        try:
            completion, finish = self._execute(batch, overwrite, plan, waits)
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            fut._fail(exc)
            return
        # A dependency ordered on the device may still fail in building its own result; this
        # future's result() then raises DependencyError too.
        fut._attach(completion, finish, [(i, d) for i, d in enumerate(deps)
                                         if d.completion() in waits])
        with self._lock:
            self._tails[completion.queue] = completion


def _bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover - the loop returns


@dataclass(frozen=True)
class _CachedPlan:
    opts: dict
    full: bool
    npiv: np.ndarray
    plan: Plan


_default: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The process-wide runtime used by :func:`cholesky` (``device="auto"``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime("auto")
        return _default


def cholesky(mats: Any, npiv: Any = None, *, after: Any = (), overwrite: bool = False) -> Future:
    """:meth:`Runtime.cholesky` on the default runtime."""
    return default_runtime().cholesky(mats, npiv, after=after, overwrite=overwrite)
