"""The client's view of a distributed submission: its shards, its :class:`Future`, and an
output left on the workers (:class:`DistributedBatch`)."""

from __future__ import annotations

import dataclasses
import functools
import threading
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from vbatch.core.batch import PackedBatch, Views
from vbatch.distributed.worker import _gather_shard

if TYPE_CHECKING:
    from vbatch.distributed.runtime import Runtime


def _pinned(client, fn, calls: list, retries: int = 0) -> list:
    """Dask futures of ``fn(*args)`` for each ``(worker, args)`` of ``calls``, each task
    pinned loosely to its worker, sent to the scheduler as one graph.

    A ``client.submit`` a task sent a graph each: the scheduler took them one by one, so the
    last worker of four started its shard up to 8 ms after the first (H100 host,
    docs/decisions.md#dist-one-graph). ``client.map`` sends one graph but takes one worker
    restriction for all, so each task's comes from Dask's annotations (of this thread's
    context), given as a function of the task's key."""
    if not calls:
        return []
    import dask

    name = getattr(fn, "__name__", "task")
    keys = [f"{name}-{uuid.uuid4()}" for _ in calls]
    where = defaultdict(list, {k: [w] for k, (w, _) in zip(keys, calls)})
    loose = defaultdict(bool, dict.fromkeys(keys, True))
    notes = {"workers": where.__getitem__, "allow_other_workers": loose.__getitem__}
    if retries:
        notes["retries"] = defaultdict(int, dict.fromkeys(keys, retries)).__getitem__
    with dask.annotate(**notes):
        return client.map(fn, *zip(*(args for _, args in calls)), key=keys, pure=False)


@dataclasses.dataclass(frozen=True)
class _Shard:
    worker: str
    future: Any  # a dask Future of the worker's result
    index: np.ndarray  # the caller's problem indices, ascending


@dataclasses.dataclass(frozen=True)
class DistributedBatch:
    """An output that stays on the workers: per shard, the Dask future of the result that
    holds it and which of the caller's problems it has. ``gather()`` brings it back, in order."""

    runtime: "Runtime"
    shards: tuple
    name: str | None
    m: np.ndarray
    n: np.ndarray
    dtype: np.dtype

    @property
    def k(self) -> int:
        return len(self.n)

    @functools.cached_property
    def placeholder(self) -> PackedBatch:
        """Shapes and dtype only, for validating a request that reads this batch (made once:
        1.7 ms for 10^5 problems)."""
        k = self.k
        return PackedBatch.model_construct(
            data=np.empty(0, self.dtype), n=self.n, m=self.m, offset=np.zeros(k, np.int64),
            ld=np.maximum(self.m, 1), order="F", frontend=None)

    def gather(self) -> list:
        return Future(self.runtime, None, self.shards, self.k, None, self.name).result()


class Future:
    """The pending result of one distributed submission (``result``, ``done``, ``exception``,
    ``output``), usable in ``after=`` and as an operand of a later submission."""

    def __init__(self, runtime, op, shards, k: int, form, name=None, shapes=None, dtype=None):
        self._rt, self._op, self.shards, self.k = runtime, op, tuple(shards), k
        self._form, self._name, self._shapes, self._dtype = form, name, shapes, dtype
        self._value = None
        self._outputs: dict = {}
        self._done = False
        self._lock = threading.Lock()

    def done(self) -> bool:
        return all(s.future.done() for s in self.shards)

    def result(self, timeout: float | None = None) -> Any:
        with self._lock:
            if not self._done:
                client = self._rt.client
                # Host arrays already (CPU workers): gathered as they are and put in the
                # caller's form here, without a task per shard doing it on the worker, a round
                # trip of the scheduler less (docs/decisions.md#dist-host-gather).
                host = self._rt._host_results
                futs = [s.future for s in self.shards] if host else _pinned(
                    client, _gather_shard, [(s.worker, (s.future, self._name))
                                            for s in self.shards])
                parts = client.gather(futs) if timeout is None else [
                    f.result(timeout) for f in futs]
                if host:
                    parts = [_gather_shard(p, self._name) for p in parts]
                self._value = self._assemble(parts)
                self._done = True
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except BaseException as exc:  # noqa: BLE001 - this method reports any failure
            return exc
        return None

    def output(self, name: str | None = None) -> DistributedBatch:
        """One output of this submission, left on the workers (``None``: the op's main
        output: the factors of ``cholesky``, the solutions of ``posv``, the one of a BLAS op)."""
        name = name or _MAIN.get(self._op.name if self._op else None)
        if name not in self._outputs:  # (one object a name: its placeholder is made once)
            m, n = self._shapes(name)
            self._outputs[name] = DistributedBatch(self._rt, self.shards, name, m, n,
                                                   self._dtype)
        return self._outputs[name]

    # the caller's order and form
    def _assemble(self, parts: list) -> Any:
        first = parts[0] if parts else None
        if dataclasses.is_dataclass(first):
            return dataclasses.replace(first, **{
                f.name: self._place([getattr(p, f.name) for p in parts], f.name)
                for f in dataclasses.fields(first) if f.init and f.name != "plan"})
        return self._place(parts, self._name)

    def _place(self, values: list, field: str | None) -> Any:
        first = values[0] if values else None
        if isinstance(first, np.ndarray) and first.ndim == 1 and field == "info":
            out = np.zeros(self.k, dtype=first.dtype)
            for s, v in zip(self.shards, values):
                out[s.index] = v
            return out
        if isinstance(first, (list, Views)) or first is None:
            out = np.empty(self.k, dtype=object)
            for s, v in zip(self.shards, values):
                out[s.index] = np.fromiter(v, dtype=object, count=len(v))
            mats = out.tolist()
            return _in_form(mats, self._form)
        return first


_MAIN = {"potrf": "factors", "posv": "solutions"}


def _in_form(mats: list, form) -> Any:
    """The gathered host matrices in the caller's form: ``form`` is (kind, packed order or
    None, frontend)."""
    if form is None:
        return mats
    kind, order, frontend = form
    if kind == "cupy":
        import cupy

        mats = [cupy.asarray(a) for a in mats]
    if order is not None:
        import vbatch

        return vbatch.pack(mats, order=order).with_frontend(frontend)
    if frontend is not None:
        from vbatch.core.frontends import give_all

        return give_all(mats, frontend)
    return mats
