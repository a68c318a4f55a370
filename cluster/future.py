"""The client's side of a distributed runtime: the link to its workers' keepers (:class:`_Hub`),
the record of each shard (what computes it, where it lies), a submission's :class:`Future`, and
an output left on the workers (:class:`DistributedBatch`)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import secrets
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from vbatch.core.batch import PackedBatch, Views
from vbatch.distributed.link import Link
from vbatch.distributed.worker import Keeper, _joined, wire

if TYPE_CHECKING:
    from vbatch.distributed.runtime import Runtime


_PREFIX, _COUNT = f"vbatch-{uuid.uuid4().hex}", itertools.count()  # (a shard's key)


@dataclasses.dataclass(eq=False)
class _Shard:
    """One shard of a submission: its caller's problem indices, how it is computed (``fn`` on
    ``args`` on a worker, after ``reads``, the shards whose values it reads there: its lineage),
    where its value lies (``worker``, under ``key``), and how its first run ended (``run``)."""

    worker: str
    index: np.ndarray  # the caller's problem indices, ascending
    fn: Any
    args: tuple
    reads: tuple = ()
    key: str = dataclasses.field(default_factory=lambda: f"{_PREFIX}-{next(_COUNT)}")
    run: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
    after: tuple = ()  # the shards it was ordered after (lineage too: an in-place call's effect)
    dropped: bool = False
    answer: bool = True  # whether its first run sends a small result back at once
    early: Any = None  # that result's host form (for its Future's result())
    written: bool = False  # a later call writes its value in place (``early`` no longer is it)
    lock: Any = None  # (an asyncio.Lock on the client's loop, made there)


class _Gone(Exception):
    """A worker that did not answer (its connection failed, or it is known dead): the shard
    moves. An ``OSError`` a shard itself raised comes back as that error, not as this."""


DROP_AFTER = 0.05  # s


class _Hub:
    """The runtime's link to its workers: one keeper (a Dask actor) a worker, called from the
    client's event loop over a link of its own (vbatch.distributed.link) where the worker has
    one, else directly through Dask (or through the scheduler, where the client asks for that).

    A submission's shards are sent once its dependencies are done (``after=`` and the shards
    it reads), so it starts once they have finished everywhere and fails, running nowhere, if
    one of them did. A value lost with its worker is computed again from its shard's record
    (recursively, for the shards it reads) on a live worker: as Dask recomputes a task from its
    lineage, with the lineage kept here (docs/decisions.md#dist-keepers)."""

    def __init__(self, client, workers: list, retries: int):
        self.client = client
        self.loop = client.loop.asyncio_loop
        self.retries = retries
        self.dead: set = set()
        self.drops: dict = {}  # worker -> keys its keeper is to drop (_drop)
        self.held: dict = {}  # worker -> keys of the values there (what close() drops)
        # (drops, held and _flushing, from the loop, a caller's thread and the links' readers;
        # re-entrant: a finalizer may drop shards wherever a reference goes)
        self._books = threading.RLock()
        self.closed = False
        self._flushing = False
        self._starting = None  # (an asyncio.Lock, made on the loop)
        # (the secret a keeper's link asks for; none where the client asks for the scheduler)
        self._token = None if client.direct_to_workers is False else secrets.token_bytes(32)
        self.links: dict = {}  # worker -> the Link to its keeper, where it has one
        # (a runtime dropped unclosed closes its links: their threads, and the keepers')
        weakref.finalize(self, _close_links, self.links)
        # worker -> shards sent to it the loop's way and not yet done: a later call sent from
        # the caller's thread would overtake them (its ordering: go)
        self._looping: collections.Counter = collections.Counter()
        self.actors: dict = self._keepers(workers)  # worker -> its keeper's Dask future

    def _keepers(self, workers: list, timeout: float = 60.0) -> dict:
        futs = {w: self.client.submit(Keeper, self._token, actor=True, workers=[w],
                                      allow_other_workers=False, pure=False,
                                      key=f"vbatch-keeper-{uuid.uuid4().hex}")
                for w in workers}
        for w, f in futs.items():
            keeper = f.result(timeout)
            address = keeper.address().result(timeout) if self._token is not None else None
            if address is not None:
                try:
                    self.links[w] = Link(tuple(address), self._token)
                except OSError:  # (its port cannot be reached from here: through Dask)
                    pass
        return futs

    # ------------------------------------------------------------ from the caller's thread
    def go(self, shards: list, after: list, holds: list) -> None:
        """Run ``shards`` once every shard of ``after`` has run (their reads among them),
        holding ``holds`` (the :class:`_Keep` of what they read) until then. Where all of that
        has run and each shard's link is up, from this thread (``_send``); else from the
        client's loop."""
        with self._books:  # (ready or not, and counted if not, as one step: go's order)
            ready = self._ready(shards, after)
            counted = () if ready else tuple(s.worker for s in shards)
            self._looping.update(counted)
        if ready:
            for s in shards:
                self._send(s, holds)
        else:
            asyncio.run_coroutine_threadsafe(
                self._go(shards, after, holds, None, counted), self.loop)

    def _ready(self, shards: list, after: list) -> bool:
        """Whether every shard of ``after`` ran without error, every shard's reads lie on its
        worker, that worker has a link, and no earlier call to it is still on the loop's way:
        what ``_compute`` would find before sending it, in submission order."""
        if self.closed or not all(a.run.done() and a.run.exception() is None for a in after):
            return False
        return all(s.worker in self.links and s.worker not in self.dead and
                   not self._looping[s.worker] and all(
                       d.worker == s.worker and not d.dropped for d in s.reads) for s in shards)

    def _send(self, s: _Shard, holds: list) -> None:
        """``s``'s first run sent over its worker's link from the caller's thread, its reply
        taken on the link's: a hop to the client's loop each way cost ~0.1-0.3 ms a call, and
        the loop took the GIL from the caller meanwhile. Anything but a reply goes to the
        loop's way (``_first``): a link that broke, a shard that raised where retries are
        left. Pending drops for its worker go with it, run after it there."""
        where = s.worker
        link = self.links.get(where)
        if link is None:  # (the link went meanwhile)
            self._retry(s, self.retries, holds)
            return
        drops = self._take_drops(where, {s.key, *(d.key for d in s.reads)})
        try:
            fut = link.call(("run", s.key, s.answer, drops, (s.fn, s.args)))
        except Exception as exc:  # noqa: BLE001 - (operands that cannot be pickled: its error)
            for key in drops:  # (not sent: they wait for the next call, or the flush)
                self._queue_drop(where, key)
            s.run.set_exception(exc)
            return

        def replied(fut, holds=holds):  # (holds: what it reads, kept until it has run)
            try:
                status, value = fut.result()
            except OSError:  # (the link broke: the loop's way finds the worker gone)
                status, value = "gone", None
            try:
                if status == "ok":
                    if value is not None and not s.written:
                        s.early = _unreply(value)
                    self._kept(s, where)
                elif status == "gone" or self.retries:
                    self._retry(s, self.retries - (status == "err"), holds)
                    return
            except Exception as exc:  # noqa: BLE001 - (the client's loop closed, or an early
                status, value = "err", exc  # result that cannot be read: the call's error)
            if status == "ok":
                s.run.set_result(None)
            else:
                s.run.set_exception(value)

        fut.add_done_callback(replied)

    def _retry(self, s: _Shard, tries: int, holds: list) -> None:
        """``s`` run again the loop's way (from any thread), holding ``holds`` until then."""
        with self._books:
            self._looping[s.worker] += 1
        try:
            asyncio.run_coroutine_threadsafe(
                self._go([s], [], holds, tries, (s.worker,)), self.loop)
        except RuntimeError as exc:  # (the client's loop closed: nothing runs again)
            self._unloop((s.worker,))
            s.run.set_exception(exc)

    def _unloop(self, workers: tuple) -> None:
        """Shards counted to ``workers`` in ``_looping`` are done."""
        with self._books:
            for w in workers:
                self._looping[w] -= 1
                if self._looping[w] <= 0:
                    del self._looping[w]

    def _kept(self, s: _Shard, where: str) -> None:
        with self._books:
            self.held.setdefault(where, set()).add(s.key)
        if s.dropped:  # (let go of before it ran)
            self._drop([s])

    def _take_drops(self, where: str, mine: set) -> list:
        """The keys ``where`` is to drop, sent with a run there (but not ``mine``: a value
        computed again is the one to keep)."""
        with self._books:
            return [k for k in self.drops.pop(where, []) if k not in mine]

    def wait(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def drop_later(self, shards: list) -> None:
        """Let the workers forget these shards' values (from any thread; none once closed)."""
        if not self.loop.is_closed():
            self._drop(shards)

    def close(self) -> None:
        """Drop every value this runtime left on the workers, and let its keepers go."""
        async def drop_all():
            with self._books:
                keys = {w: set(self.held.get(w, ())) | set(self.drops.get(w, ()))
                        for w in self.actors}
                self.drops.clear()
            await asyncio.gather(*(self._quiet(self._call(w, "drop", sorted(k)))
                                   for w, k in keys.items() if k))

        if not self.closed and not self.loop.is_closed():
            self.wait(drop_all(), 60)
        self.closed = True
        _close_links(self.links)
        for fut in self.actors.values():
            fut.release()
        self.actors = {}

    # ------------------------------------------------------------ on the client's loop
    async def _go(self, shards: list, after: list, holds: list, tries: int | None = None,
                  counted: tuple = ()) -> None:
        """(``counted``: the workers ``go`` or ``_retry`` counted these shards to in
        ``_looping``, uncounted once they are done)"""
        try:
            if after:
                try:
                    await asyncio.gather(*(asyncio.wrap_future(s.run) for s in after))
                except BaseException as exc:  # noqa: BLE001 - a failed dependency fails it
                    for s in shards:
                        s.run.set_exception(exc)
                    return
            await asyncio.gather(*(self._first(s, tries) for s in shards))
        finally:
            self._unloop(counted)

    async def _first(self, s: _Shard, tries: int | None = None) -> None:
        try:
            await self._compute(s, s.worker, tries)
        except BaseException as exc:  # noqa: BLE001 - kept for the caller
            s.run.set_exception(exc)
        else:
            s.run.set_result(None)

    async def _compute(self, s: _Shard, where: str | None, tries: int | None = None) -> None:
        """Run ``s`` on ``where`` (or on a live worker, where that one is gone), with the
        values it reads there first; run again (its first run done), with what it was ordered
        after first where that was lost with its worker."""
        tries = self.retries if tries is None else tries
        gone = None
        while True:
            if where is None or where in self.dead:
                where = await self._live(gone)
            try:
                if s.run.done():
                    for a in s.after:
                        await self._again(a, where)
                for d in s.reads:
                    await self._held(d, where)
                if where in self.dead:  # (found out while the values it reads were moved)
                    raise _Gone(where)
                drops = self._take_drops(where, {s.key, *(d.key for d in s.reads)})
                early = await self._call(where, "run", s.key, s.answer and not s.run.done(),
                                         drops, (s.fn, s.args))
            except _Gone:
                self._lost(where)
                gone, where = where, None
                continue
            except Exception:
                if tries:
                    tries -= 1
                    continue
                raise
            old, s.worker = s.worker, where
            with self._books:
                self.held.setdefault(where, set()).add(s.key)
                if old != where and old not in self.dead and old in self.held:
                    # (moved off a live worker: the copy there goes)
                    self.held[old].discard(s.key)
                    self._queue_drop(old, s.key)
            if early is not None and not s.written:
                s.early = _unreply(early)
            if s.dropped and not s.run.done():  # (let go of before it first ran)
                self._drop([s])
            return

    async def _again(self, a: _Shard, where: str) -> None:
        """``a``, a call some shard was ordered after, run again where it was lost with its
        worker: an in-place call's effect is part of what a later call reads."""
        if a.lock is None:
            a.lock = asyncio.Lock()
        async with a.lock:
            if a.worker in self.dead:
                await self._compute(a, where)

    async def _held(self, d: _Shard, where: str) -> None:
        """Make sure ``d``'s value lies on ``where``: computed again there if it is lost,
        dropped or elsewhere (a read shard lies where its reader runs, unless a worker died).
        A dropped one computed again for a reader stays until the runtime closes."""
        if d.lock is None:
            d.lock = asyncio.Lock()
        async with d.lock:
            if d.worker != where or d.dropped or d.worker in self.dead:
                await self._compute(d, where)

    async def _fetch(self, s: _Shard, name: str | None, early: bool = False) -> Any:
        """``s``'s value (its ``name`` output) in host memory; ``early``: as its first run
        ended, where that came back with the run and no later call wrote it."""
        if early and s.early is not None and not s.written:
            return s.early
        while True:
            where = s.worker
            try:
                await self._held(s, where)
                return _unreply(await self._call(s.worker, "fetch", s.key, name))
            except _Gone:
                self._lost(s.worker)

    async def _call(self, where: str, method: str, *args) -> Any:
        if self.closed:
            raise RuntimeError("this vbatch.distributed.Runtime is closed")
        if where in self.dead:
            raise _Gone(where)
        if where not in self.actors:  # (a worker that joined since: its keeper, made once)
            if self._starting is None:
                self._starting = asyncio.Lock()
            async with self._starting:
                if where not in self.actors:
                    try:
                        futs = await asyncio.get_running_loop().run_in_executor(
                            None, self._keepers, [where])
                    except Exception as exc:  # (it went, or never came up)
                        raise _Gone(where) from exc
                    self.actors.update(futs)
        link = self.links.get(where)
        if link is not None:
            try:
                status, value = await asyncio.wrap_future(link.call((method, *args)))
            except OSError as exc:
                raise _Gone(where) from exc
            if status == "ok":
                return value
            raise value
        if method == "run":  # (the call as a pickle and its buffers: Dask's own cost more)
            *args, call = args
            args = (*args, *wire(call))
        if self.client.direct_to_workers is False:  # (the caller asked for the scheduler's)
            from distributed.actor import ProxyRPC

            rpc = ProxyRPC(self.client.scheduler, where)
        else:
            rpc = self.client.rpc(where)
        try:
            out = await rpc.actor_execute(function=method, actor=self.actors[where].key,
                                          args=list(args), kwargs={})
        except OSError as exc:
            raise _Gone(where) from exc
        if out["status"] == "OK":
            return out["result"]
        raise out["exception"]

    def _lost(self, where: str) -> None:
        self.dead.add(where)
        link = self.links.pop(where, None)
        if link is not None:
            link.close()
        with self._books:
            self.held.pop(where, None)
            self.drops.pop(where, None)
        fut = self.actors.pop(where, None)
        if fut is not None:
            fut.release()

    async def _live(self, gone: str | None, timeout: float = 120.0) -> str:
        """A live worker to run on instead of ``gone``: one whose keeper is up if there is one,
        else a worker the scheduler knows (a nanny's replacement, say), waited for."""
        up = sorted(w for w in self.actors if w not in self.dead)
        if up:
            return up[hash(gone) % len(up)]
        t0 = time.monotonic()
        while True:
            info = await self.client.scheduler.identity()
            known = sorted(w for w in info.get("workers", {}) if w not in self.dead)
            if known:
                return known[hash(gone) % len(known)]
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"no live worker to run on within {timeout} s")
            await asyncio.sleep(0.1)

    def _drop(self, shards: list) -> None:
        """Values to drop go with the next run sent to their worker, or on their own after
        ``DROP_AFTER`` s: a message of their own just before the next call's delayed it (they
        fall due as a caller's next call replaces its last future)."""
        with self._books:
            for s in shards:
                s.dropped = True
                if s.key in self.held.get(s.worker, ()):
                    self.held[s.worker].discard(s.key)
                    self._queue_drop(s.worker, s.key)

    def _queue_drop(self, where: str, key: str) -> None:
        with self._books:
            if where in self.actors:
                self.drops.setdefault(where, []).append(key)
            arm = bool(self.drops) and not self._flushing
            self._flushing = self._flushing or arm
        if arm:
            try:
                self.loop.call_soon_threadsafe(self.loop.call_later, DROP_AFTER, self._flush)
            except RuntimeError:  # (the loop closed meanwhile)
                pass

    def _flush(self) -> None:
        with self._books:
            self._flushing = False
            due = {w: keys for w, keys in self.drops.items() if w in self.actors}
            self.drops.clear()
        for w, keys in due.items():
            asyncio.ensure_future(self._quiet(self._call(w, "drop", keys)))

    @staticmethod
    async def _quiet(coro) -> None:
        try:
            await coro
        except Exception:  # noqa: BLE001 - a worker gone took the values with it
            pass


def _close_links(links: dict) -> None:
    for link in list(links.values()):
        link.close()
    links.clear()


def _unreply(out: Any) -> Any:
    """A keeper's reply: a small value comes pickled, a large one as itself."""
    if isinstance(out, bytes):
        import pickle

        return pickle.loads(out)
    return out


class _Keep:
    """Held by what can still read a submission's values (its :class:`Future`, its
    :class:`DistributedBatch` outputs, a later submission until it has run): when the last of
    them goes, the workers drop the values."""

    def __init__(self, hub: _Hub, shards: tuple):
        weakref.finalize(self, hub.drop_later, list(shards))


@dataclasses.dataclass(frozen=True)
class DistributedBatch:
    """An output that stays on the workers: its shards (where each lies and which of the
    caller's problems it has) and which of their outputs it is. ``gather()`` brings it back,
    in order."""

    runtime: "Runtime"
    shards: tuple
    name: str | None
    m: np.ndarray
    n: np.ndarray
    dtype: np.dtype
    keep: _Keep = dataclasses.field(repr=False, compare=False)

    @property
    def k(self) -> int:
        return len(self.n)

    @functools.cached_property
    def placeholder(self) -> PackedBatch:
        """Shapes and dtype only, for validating a request that reads this batch (made once:
        1.7 ms for 10^5 problems)."""
        k, m = self.k, self.m
        # (its sizes as they are where none is 0: a copy of 4 x 10^5 entries cost ~0.5 ms)
        ld = m if not k or m.min() > 0 else np.maximum(m, 1)
        return PackedBatch.model_construct(
            data=np.empty(0, self.dtype), n=self.n, m=m, offset=np.zeros(k, np.int64),
            ld=ld, order="F", frontend=None)

    def gather(self) -> list:
        return Future(self.runtime, None, self.shards, self.k, None, self.name,
                      keep=self.keep).result()


class Future:
    """The pending result of one distributed submission (``result``, ``done``, ``exception``,
    ``output``), usable in ``after=`` and as an operand of a later submission."""

    def __init__(self, runtime, op, shards, k: int, form, name=None, shapes=None, dtype=None,
                 keep: _Keep | None = None):
        self._rt, self._op, self.shards, self.k = runtime, op, tuple(shards), k
        self._form, self._name, self._shapes, self._dtype = form, name, shapes, dtype
        self._keep = keep or _Keep(runtime._hub, self.shards)
        self._value = None
        self._outputs: dict = {}
        self._done = False
        self._lock = threading.Lock()

    def done(self) -> bool:
        return all(s.run.done() for s in self.shards)

    def result(self, timeout: float | None = None) -> Any:
        with self._lock:
            if not self._done:
                t0 = time.monotonic()
                runs = [s.run for s in self.shards]
                # (waited for here: each run's end wakes this thread, not the client's loop)
                if concurrent.futures.wait(runs, timeout).not_done:
                    raise TimeoutError(f"the call did not finish within {timeout} s")
                for r in runs:
                    r.result()
                parts = [s.early for s in self.shards]
                if self._op is None or any(p is None for p in parts):
                    # (not all back with their runs: fetched where they lie)
                    left = None if timeout is None else max(timeout - time.monotonic() + t0, 0)
                    hub = self._rt._hub
                    parts = hub.wait(self._gather(hub), left)
                self._value = self._assemble(parts)
                self._done = True
        return self._value

    async def _gather(self, hub: _Hub) -> list:
        own = self._op is not None  # (the submission's own result, not a batch's gather)
        return await asyncio.gather(*(hub._fetch(s, self._name, own) for s in self.shards))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except BaseException as exc:  # noqa: BLE001 - this method reports any failure
            return exc
        return None

    def output(self, name: str | None = None) -> DistributedBatch:
        """One output of this submission, left on the workers (``None``: the op's main
        output: the factors of ``cholesky``, the solutions of ``posv``, the one of a BLAS op)."""
        if name is None and self._op is not None and self._op.returns:
            name = self._op.returns[0][0]
        if name not in self._outputs:  # (one object a name: its placeholder is made once)
            m, n, dtype = self._shapes(name)
            self._outputs[name] = DistributedBatch(self._rt, self.shards, name, m, n,
                                                   dtype or self._dtype, self._keep)
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
        form = self._form.get(field) if type(self._form) is dict else self._form
        if isinstance(first, np.ndarray) and first.ndim == 1 and field == "info":
            out = np.zeros(self.k, dtype=first.dtype)
            for s, v in zip(self.shards, values):
                out[s.index] = v
            return out
        if values and all(type(v) is Views for v in values):
            return _in_form(_joined([s.index for s in self.shards], values, self.k), form)
        if isinstance(first, (list, Views)) or first is None:
            out = np.empty(self.k, dtype=object)
            for s, v in zip(self.shards, values):
                out[s.index] = np.fromiter(v, dtype=object, count=len(v))
            return _in_form(out.tolist(), form)
        return first


def _in_form(mats: Any, form) -> Any:
    """The gathered host matrices (a list or :class:`Views`) in the caller's form: ``form`` is
    (kind, packed order or None, frontend); None: as they are."""
    if form is None:
        return mats
    kind, order, frontend = form
    # (integer outputs, GETRF's pivots, stay 1-D arrays over one buffer: a packed form is
    # for matrices of the batch's float type)
    ints = type(mats) is Views and mats.batch.dtype.kind in "iu"
    if type(mats) is Views and (order is None or ints) and (frontend is None or ints):
        if kind == "cupy":  # (one copy of the buffer, not one a matrix)
            import cupy

            b = mats.batch
            return Views(b.with_data(cupy.asarray(b.data)), mats.vector)
        return mats
    mats = list(mats)
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
