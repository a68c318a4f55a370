"""The backend interface: what the runtime asks of a device.

A backend owns memory of one array kind (numpy for the CPU, cupy for CUDA) and executes a
:class:`~vbatch.scheduler.Plan` one launch at a time. The runtime drives it:

    src, dst = backend.adopt(batch, overwrite)           # or backend.stage_list(list, ...)
    ex = backend.begin(src, dst, plan, after=[...])      # per-batch metadata, info array
    for launch in plan.launches:
        backend.launch(ex, launch)                       # one vbatched launch per group
    backend.flush(ex, then=writeback)                    # all issued (a CUDA graph runs here)
    done = backend.end(ex)                               # a Completion; done.wait() -> info

Kernels read each panel of ``src`` once (its original values) and write the factor to ``dst``;
``src is dst`` is allowed. Out of place, no backend copies the whole input first: each task
reads the part of the input it works on (the CPU backend copies it into the output just before
working on it, the CUDA kernels read it straight into registers or shared memory).

No call leaves state behind that the next one depends on if it raises: a backend that must
serialize calls on shared device state (the CUDA backend's pointer table) does so inside one
method (``flush``), never from one call to the next.

``launch`` gets the launch record only (kind, step, a contiguous range of the plan order); a
backend finds each problem's panel from arrays it built once in ``begin``. That is what lets the
CUDA backend issue exactly one kernel per launch with no host-to-device copy per step.

A backend is *synchronous* (the CPU: work is done when ``launch`` returns, so the runtime runs it
on a worker thread) or *asynchronous* (CUDA: ``launch`` only enqueues, the runtime calls it in the
caller's thread and ``Completion.wait`` synchronizes once at the end).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from vbatch.ops.batch import MatrixList, PackedBatch
from vbatch.scheduler.plan import Launch, Plan


@dataclass(frozen=True)
class PlanDefaults:
    """What a backend prefers when the caller does not say: panel width, crossover, streams."""

    nb: int
    fused_max_rows: int
    streams: int


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


class Backend(ABC):
    name: str = "?"
    kind: str = "numpy"  # the array kind of this backend's buffers
    asynchronous: bool = False

    @abstractmethod
    def plan_defaults(self, dtype: np.dtype) -> PlanDefaults: ...

    def check_plan(self, plan: Plan) -> None:  # noqa: B027 - optional hook
        """Raise ``InputError``, naming the problem, for a plan this backend cannot run (a
        launch larger than its grid allows). Called at submit, once per new plan."""

    def check_options(self, dtype: np.dtype, options: dict) -> None:  # noqa: B027
        """Raise ``InputError`` for planner options this backend cannot run, or cap them in
        place to what it can (default: accept all)."""

    # ------------------------------------------------------------ memory
    @abstractmethod
    def adopt(self, batch: PackedBatch, overwrite: bool) -> tuple[PackedBatch, PackedBatch]:
        """``(src, dst)`` on this backend for a packed input: where kernels read A and write L.
        ``dst`` is ``batch`` itself only when ``overwrite``; the caller's buffer is never written
        otherwise."""

    @abstractmethod
    def stage_list(self, mats: MatrixList, overwrite: bool) -> tuple[Any, PackedBatch]:
        """``(src, dst)`` for a list: where kernels read A (a packed copy on this backend, or
        the list's arrays where they are) and a new packed buffer for L (``src`` itself when the
        backend factors its packed copy in place)."""

    @abstractmethod
    def scatter(self, work: PackedBatch, target: list | PackedBatch) -> None:
        """Copy ``work`` back into the caller's arrays or packed buffer (``overwrite=True``)."""

    @abstractmethod
    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        """``work`` with its buffer as an array of ``kind`` (no copy when already that kind)."""

    # ------------------------------------------------------------ execution
    @abstractmethod
    def begin(self, src: PackedBatch, dst: PackedBatch, plan: Plan,
              after: list[Completion]) -> Any: ...

    @abstractmethod
    def launch(self, ex: Any, launch: Launch) -> None: ...

    def flush(self, ex: Any, then=None) -> None:
        """Issue whatever ``launch`` deferred, then call ``then()`` (a write-back into the
        caller's arrays), which is ordered after the factorization and before the completion."""
        if then is not None:
            then()

    @abstractmethod
    def end(self, ex: Any) -> Completion: ...

    # ------------------------------------------------------------ memory limits
    memory_name: str = "host"

    def memory_total(self) -> int:
        """Bytes of this backend's memory in all (0: unknown, nothing is checked)."""
        return 0

    def memory_free(self) -> int:
        """Bytes this backend could allocate now."""
        return self.memory_total()
