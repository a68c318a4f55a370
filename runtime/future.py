"""What a submission gives back: :class:`Future`, and :class:`DependencyError` for one ordered
after a failed future."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from typing import Any

from vbatch.core.errors import InputError
from vbatch.kernels import Completion


class DependencyError(RuntimeError):
    """A submission could not run because a future it was ordered ``after`` failed."""


_PENDING = object()


class Future:
    """The pending result of one submission. ``result()`` waits and returns the op's result
    (a :class:`CholeskyResult` for ``cholesky``), or raises what the execution raised.

    On the CPU the worker thread fulfils a ``concurrent.futures.Future`` (a small call run in
    the caller's thread returns its future done: ``Runtime.INLINE_FLOPS``). On CUDA the future
    holds the backend's completion (an event) and builds its result on the first ``result()``:
    no thread, no condition variable, on a path whose whole budget is tens of microseconds.
    """

    __slots__ = ("_runtime", "_cf", "_completion", "_finish", "_value", "_error", "_lock",
                 "_deps")

    def __init__(self, runtime: Any, threaded: bool):
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

    def result(self, timeout: float | None = None) -> Any:
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


def _deps(after: Any) -> list:
    """``after=`` as a list of futures; anything else is named before any work."""
    deps = list(after) if isinstance(after, (list, tuple)) else [after]
    bad = [(None, f"after[{i}] is a {type(d).__name__}, not a vbatch.Future")
           for i, d in enumerate(deps) if not isinstance(d, Future)]
    if bad:
        raise InputError(bad, what="submission")
    return deps
