"""The backend interface: what the runtime asks of a device.

A backend owns memory of one array kind (numpy for the CPU, cupy for CUDA) and executes a
:class:`~vbatch.scheduler.Plan` one launch at a time. The runtime drives it:

    work = backend.adopt(batch, copy=not overwrite)      # or backend.pack_list(...)
    ex = backend.begin(work, plan, after=[...])          # per-batch metadata, info array
    for launch in plan.launches:
        backend.launch(ex, launch)                       # one vbatched launch per group
    done = backend.end(ex)                               # a Completion; done.wait() -> info

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
    """The end of one submitted plan on a backend."""

    @abstractmethod
    def wait(self) -> np.ndarray:
        """Block until done; return ``info`` in plan order (int32, LAPACK convention)."""

    @abstractmethod
    def done(self) -> bool:
        """True once ``wait`` would not block."""


class Backend(ABC):
    name: str = "?"
    kind: str = "numpy"  # the array kind of this backend's buffers
    asynchronous: bool = False

    @abstractmethod
    def plan_defaults(self, dtype: np.dtype) -> PlanDefaults: ...

    # ------------------------------------------------------------ memory
    @abstractmethod
    def adopt(self, batch: PackedBatch, copy: bool) -> PackedBatch:
        """``batch`` with its buffer on this backend; a copy when ``copy`` or not resident."""

    @abstractmethod
    def pack_list(self, mats: MatrixList, order: str) -> PackedBatch:
        """A new packed buffer on this backend holding the list's matrices."""

    @abstractmethod
    def scatter(self, work: PackedBatch, target: list | PackedBatch) -> None:
        """Copy ``work`` back into the caller's arrays or packed buffer (``overwrite=True``)."""

    @abstractmethod
    def export(self, work: PackedBatch, kind: str) -> PackedBatch:
        """``work`` with its buffer as an array of ``kind`` (no copy when already that kind)."""

    # ------------------------------------------------------------ execution
    @abstractmethod
    def begin(self, work: PackedBatch, plan: Plan, after: list[Completion]) -> Any: ...

    @abstractmethod
    def launch(self, ex: Any, launch: Launch) -> None: ...

    @abstractmethod
    def end(self, ex: Any) -> Completion: ...
