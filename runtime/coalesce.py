"""Coalesced submissions: many small submissions from many threads become one launch group.

A solver that runs on a task runtime (Dask, PaRSEC, StarPU, a thread pool) submits its small
problems one at a time, from many tasks. One vbatched submission per problem pays the host path
and a launch each; PaRSEC's batched GPU tasks (PaRSEC PR #668) gather such tasks instead. With
``Runtime(coalesce_us=W)`` vbatch does the same: a submission that can be coalesced is validated
in its caller's thread (so bad input still raises there, naming that caller's problem and
operand), then waits in an open *bucket* with the compatible submissions that arrive within the
next ``W`` microseconds. The bucket is then submitted as one batch, and each submitter's future
gives back its own slice of the result, in its own form.

Compatible means one operation, one dtype and array kind, list operands in the same places, and
equal parameters (``alpha``, ``trans_a``, ``overwrite``, ...). A submission coalesces when every
operand is a list (a packed batch was laid out by its caller and goes straight through, as do
operations with other kinds of fields) and no problem is larger than ``coalesce_max_n`` (a large
problem fills the device by itself). A bucket is submitted when its window ends, when it holds
``coalesce_max_k`` problems, when someone waits for the runtime (``wait``, ``close``), or when a
later submission is ordered ``after=`` one of its members.

``after=`` holds: a bucket's submission waits for every future its members were ordered after,
and a submission ordered after a waiting member first sends that member's bucket off.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Any

import numpy as np

from vbatch.core.batch import MatrixList, Views
from vbatch.runtime.future import _PENDING, Future

_SCALARS = (bool, int, float, str, np.bool_, np.integer, np.floating)


def _part_key(op, req) -> tuple | None:
    """What a submission must share with others to join their bucket; None when it cannot be
    coalesced (an operand that is not a list, a field of another kind)."""
    key: list = [op.name]
    k = None
    for name, v in sorted(req.__dict__.items()):
        t = type(v)
        if t is MatrixList:
            key.append((name, "list", v.dtype.str, v.kind, v.frontend))
            k = v.k if k is None else k
        elif v is None or isinstance(v, _SCALARS):
            key.append((name, t.__name__, v))
        elif t is np.ndarray and v.ndim == 1:
            key.append((name, "per-problem", v.dtype.str))
        else:
            return None
    return tuple(key) if k is not None else None


def _sizes_fit(req, max_n: int) -> bool:
    for v in req.__dict__.values():
        if type(v) is MatrixList and v.k and (int(v.m.max()) > max_n or int(v.n.max()) > max_n):
            return False
    return True


def _count(req) -> int:
    """The problems of a coalescible request (every list operand has as many)."""
    return next(v.k for v in req.__dict__.values() if type(v) is MatrixList)


def _joined(reqs: list) -> dict:
    """The fields of one call holding the problems of ``reqs`` (all of one bucket, so alike but
    for their operands and per-problem arrays), in order; its lists need no validation of any
    matrix again."""
    first = reqs[0]
    values = dict(first.__dict__)
    for name, v in first.__dict__.items():
        if type(v) is MatrixList:
            parts = [r.__dict__[name] for r in reqs]
            m = np.concatenate([p.m for p in parts])
            n = m if all(p.m is p.n for p in parts) else np.concatenate([p.n for p in parts])
            m.flags.writeable = False
            n.flags.writeable = False
            # (the parts' device addresses, where each has them: the gather reads them, and
            # the packed copy's order follows them)
            addr = None
            if all(p.addr is not None for p in parts):
                addr = np.concatenate([p.addr for p in parts], axis=1)
                addr.flags.writeable = False
            vector = None  # (the problems given 1-D, where any was)
            if any(p.vector is not None for p in parts):
                vector = np.concatenate([np.zeros(p.k, bool) if p.vector is None else p.vector
                                         for p in parts])
            values[name] = MatrixList.model_construct(
                mats=[a for p in parts for a in p.mats], kind=v.kind, dtype=v.dtype, m=m, n=n,
                frontend=v.frontend, source=[a for p in parts for a in p.source], addr=addr,
                vector=vector)
        elif type(v) is np.ndarray:
            values[name] = np.concatenate([r.__dict__[name] for r in reqs])
    return values


def _slice(value: Any, start: int, stop: int, whole_fields, own_req) -> Any:
    """A member's share of the bucket's result ``value``: problems ``start:stop``, in the form
    the member gave (the caller's own arrays when it asked to overwrite). A result object
    (``CholeskyResult``, ``PosvResult``) is sliced field by field; its plan is the bucket's."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{
            f.name: _share(getattr(value, f.name), start, stop, whole_fields, own_req)
            for f in dataclasses.fields(value) if f.init})
    return _share(value, start, stop, whole_fields, own_req)


def _share(value: Any, start: int, stop: int, whole_fields, own_req) -> Any:
    t = type(value)
    if t is Views:
        return value.part(start, stop)
    if t is list:
        for name, v in whole_fields.items():
            if type(v) is MatrixList and value is v.source:
                return own_req.__dict__[name].source
        return value[start:stop]
    if t is np.ndarray and value.ndim >= 1:
        return value[start:stop]
    return value


class _Bucket:
    __slots__ = ("key", "op", "overwrite", "deadline", "parts", "reqs", "after", "k", "ready",
                 "group", "cv", "building", "finished")

    def __init__(self, key, op, overwrite, deadline):
        self.key, self.op, self.overwrite, self.deadline = key, op, overwrite, deadline
        self.ready = threading.Event()  # set once every member knows its group (one per bucket)
        self.parts: list = []
        self.reqs: list = []
        self.after: list = []
        self.k = 0
        self.group = None  # the bucket's own future, once sent
        # The first member to ask for its result builds every member's (one wait on the
        # group, one pass of slices) and sets ``finished``; the others wake once, on ``cv``.
        # (Each member waiting on the group's future itself made a convoy on its lock: one
        # thread, one GIL hand-off after another; 64 threads on the H100 host, 2026-11-25.)
        # A builder that stops (its timeout, an interrupt) gives the role back and wakes them.
        self.cv = threading.Condition(threading.Lock())
        self.building = False
        self.finished = threading.Event()

class Coalescer:
    """The open buckets of one runtime, and the thread that sends them off when their window
    ends. ``groups`` counts the submissions it made (one per bucket)."""

    def __init__(self, runtime, window_us: float, max_n: int, max_k: int):
        self._rt = runtime
        self.window = window_us * 1e-6
        self.max_n, self.max_k = max_n, max_k
        self._cv = threading.Condition()
        self._open: dict = {}
        self._send = threading.Lock()  # one bucket submitted at a time, in closing order
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sending = 0  # buckets taken from _open and not yet submitted
        self.groups = 0
        self.members = 0

    # ------------------------------------------------------------------ joining
    def offer(self, op, req, after: list, overwrite: bool):
        """A future for ``req`` if it joins a bucket, else None (the caller submits it)."""
        key = _part_key(op, req)
        if key is None or not _sizes_fit(req, self.max_n):
            return None
        self.settle(after)
        k = _count(req)
        part = Part(self._rt, self)
        full = None
        with self._cv:
            if self._closed:
                return None
            bucket = self._open.get(key)
            if bucket is None:
                bucket = self._open[key] = _Bucket(key, op, overwrite,
                                                   time.monotonic() + self.window)
                self._cv.notify()
            part._bucket = part._box = bucket
            part._ready = bucket.ready
            bucket.parts.append(part)
            bucket.reqs.append(req)
            bucket.after.extend(after)
            bucket.k += k
            self.members += 1
            if bucket.k >= self.max_k:
                full = self._open.pop(key)
                self._sending += 1
            elif self._thread is None:
                self._thread = threading.Thread(target=self._timer, daemon=True,
                                                name="vbatch-coalesce")
                self._thread.start()
        if full is not None:
            self._submit(full)
        return part

    def settle(self, after: list) -> None:
        """Send off the bucket of any waiting member in ``after`` and wait until it is enqueued:
        what is ordered after a member must be enqueued after it (on the CPU backend's one
        worker, a job queued ahead of its dependency would wait for it forever)."""
        for d in after:
            if type(d) is Part and not d._ready.is_set():
                d._coalescer._flush_bucket(d._bucket)
                d._ready.wait()

    # ------------------------------------------------------------------ sending
    def _flush_bucket(self, bucket: _Bucket | None) -> None:
        with self._cv:
            if bucket is None or self._open.get(bucket.key) is not bucket:
                return  # already taken by the thread that submits it
            del self._open[bucket.key]
            self._sending += 1
        self._submit(bucket)

    def flush(self) -> None:
        """Send off every open bucket now."""
        with self._cv:
            buckets = list(self._open.values())
            self._open.clear()
            self._sending += len(buckets)
        for b in buckets:
            self._submit(b)
        with self._cv:  # and those other threads took: enqueued before this returns
            while self._sending:
                self._cv.wait()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self.flush()

    def _timer(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    due = [b for b in self._open.values() if b.deadline <= now]
                    if due:
                        for b in due:
                            del self._open[b.key]
                        self._sending += len(due)
                        break
                    wait = min((b.deadline for b in self._open.values()), default=None)
                    self._cv.wait(None if wait is None else wait - now)
            for b in due:
                self._submit(b)

    def _submit(self, bucket: _Bucket) -> None:
        try:
            with self._send:
                self._send_one(bucket)
        finally:
            with self._cv:
                self._sending -= 1
                self._cv.notify_all()

    def _send_one(self, bucket: _Bucket) -> None:
        try:
            req = dict(bucket.reqs[0].__dict__) if len(bucket.reqs) == 1 else \
                _joined(bucket.reqs)
            fut = self._rt.prepare(bucket.op, **req).run(after=bucket.after)
        except BaseException as exc:  # noqa: BLE001 - delivered through every member
            for p in bucket.parts:
                p._abort(exc)
            _finish(bucket)
            bucket.ready.set()
            return
        self.groups += 1
        bucket.group = fut
        start = 0
        for p, r in zip(bucket.parts, bucket.reqs):
            k = _count(r)
            p._resolve(fut, start, start + k, req, r)
            start += k
        bucket.ready.set()


class Part(Future):
    """The future of one coalesced submission: its share of its bucket's result."""

    __slots__ = ("_coalescer", "_bucket", "_group", "_span", "_ready", "_box")

    def __init__(self, runtime, coalescer: Coalescer):
        Future.__init__(self, runtime, threaded=False)
        self._coalescer = coalescer
        self._bucket: _Bucket | None = None  # while it waits to be sent
        self._box: _Bucket | None = None  # its bucket, for the result
        self._group = None
        self._span = None
        self._ready: threading.Event | None = None  # the bucket's, set when it is sent

    def _resolve(self, group, start: int, stop: int, whole_fields, own_req) -> None:
        self._group, self._span = group, (start, stop, whole_fields, own_req)
        self._bucket = None

    def _settle(self) -> None:
        """Enqueued before this returns (what is ordered after it needs that)."""
        self._coalescer.settle([self])

    def _abort(self, exc: BaseException) -> None:
        self._error = exc
        self._bucket = None

    def done(self) -> bool:
        if self._value is not _PENDING or self._error is not None:
            return True
        if not self._ready.is_set():
            return False
        return self._error is not None or self._group.done()

    def completion(self):
        return None if self._group is None else self._group.completion()

    def result(self, timeout: float | None = None) -> Any:
        if self._value is _PENDING and self._error is None:
            box = self._box
            deadline = None if timeout is None else time.monotonic() + timeout
            build = False
            with box.cv:
                while not box.finished.is_set():
                    if not box.building:
                        box.building = build = True
                        break
                    group = box.group
                    if box.ready.is_set() and group is not None and group.done():
                        break  # done: this share now, not after the builder's whole pass
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise cf.TimeoutError()
                    box.cv.wait(left)
            if build:
                try:
                    _build(box, deadline)
                finally:
                    with box.cv:
                        box.building = False
                        box.cv.notify_all()
            elif not box.finished.is_set():
                self._own(box.group)
        if self._error is not None:
            raise self._error
        return self._value

    def _own(self, group) -> None:
        """This member's share of its finished group, taken by itself (another member is
        still building everyone's)."""
        try:
            whole = group.result()
        except Exception as exc:  # noqa: BLE001 - raised to the caller
            with self._lock:
                if self._value is _PENDING and self._error is None:
                    self._error = exc
            return
        self._share(whole)

    def _share(self, whole) -> None:
        """Its slice of the group's result ``whole``, once (the builder or itself)."""
        with self._lock:
            if self._value is _PENDING and self._error is None:
                start, stop, whole_fields, own_req = self._span
                self._value = _slice(whole, start, stop, whole_fields, own_req)
                self._span = None  # (the joined request holds every member's inputs)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _finish(box: _Bucket) -> None:
    """Every member knows its result or error: wake the waiting ones, and let go of what only
    the build needed (the members' requests, and with them their inputs)."""
    box.finished.set()
    with box.cv:
        box.cv.notify_all()
    box.reqs = box.parts = box.after = ()


def _build(box: _Bucket, deadline: float | None) -> None:
    """Every member's result, from one wait on the bucket's group (or its error for each);
    then ``finished``. Raises TimeoutError, building nothing, when ``deadline`` passes first;
    an interrupt (a BaseException that is not an Exception) goes to this caller alone."""
    if box.finished.is_set():
        return
    if not box.ready.wait(_left(deadline)):
        raise cf.TimeoutError()
    if box.group is not None:  # (else it failed to be sent: every member has its error)
        try:
            whole = box.group.result(_left(deadline))
        except cf.TimeoutError:
            raise
        except Exception as exc:  # noqa: BLE001 - each member raises it
            for p in box.parts:
                with p._lock:
                    if p._value is _PENDING and p._error is None:
                        p._error = exc
        else:
            for p in box.parts:
                p._share(whole)
    _finish(box)
