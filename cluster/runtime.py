"""The distributed :class:`Runtime`: validates a submission whole, shards it, and runs a shard
on each worker's keeper."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import threading
from typing import Any

import numpy as np

from vbatch.core.batch import MatrixList, PackedBatch, Views, pack
from vbatch.core.errors import InputError, validated
from vbatch.ops.op import caller, public, replaced
from vbatch.distributed.future import DistributedBatch, Future, _Hub, _Keep, _Shard
from vbatch.distributed.local import workers_of
from vbatch.distributed.sharding import problem_cost, shard_by_cost
from vbatch.distributed.worker import _OUT, _make_random, _make_spd, _run_shard


class Runtime:
    """:class:`vbatch.Runtime`'s methods over the workers of a ``dask.distributed.Client``.

    ``device``: what each worker's runtime uses (``"auto"``: its GPU if it has one).
    ``workers``: the worker addresses to use (default: all of the client's, when the runtime
    is made). ``chunk_bytes``: a shard whose host inputs exceed this streams through its device
    in chunks (default: half the device's free memory on a GPU, no chunks on the CPU).
    ``retries``: how many times a shard that raised is run again (a shard whose worker dies
    runs again on another either way). Other keywords are :class:`vbatch.Config` options for
    the workers' runtimes.

    The client talks to the workers directly (a keeper a worker: a Dask actor), as a client
    made with ``direct_to_workers=True`` does; one made with ``direct_to_workers=False`` goes
    through the scheduler instead."""

    def __init__(self, client, device: str = "auto", *, workers: list | None = None,
                 chunk_bytes: int | None = None, retries: int = 0, **options: Any):
        from vbatch import Config

        self.client = client
        self.device = device
        validated(Config, what="runtime options", **options)  # named here, not on a worker
        self._options = tuple(sorted(options.items()))
        self._chunk = chunk_bytes
        self._retries = retries
        if workers is None:
            workers = workers_of(client)
        if not workers:
            raise InputError([(None, "the Dask client has no workers")], what="runtime options")
        self.workers = list(workers)
        self._hub = _Hub(client, self.workers, retries)
        self._local = None
        self._splits: dict = {}  # a request's sizes and parameters -> its shards (_split)
        self._reqs: dict = {}  # a call's placeholders and parameters -> its request (_validated)
        self._pending: list = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"vbatch.distributed.Runtime({len(self.workers)} workers, device={self.device!r})"

    def submit(self, op: str, *, after: Any = (), **fields: Any) -> Future:
        """Validate the whole request here, shard it by flops (or as the distributed operands
        it reads are sharded), and run each shard on its worker once ``after=`` is done."""
        from vbatch.ops.op import OPS

        if op not in OPS:
            raise InputError([(None, f"unknown operation {op!r} (known: {', '.join(OPS)})")],
                             what="submission")
        o = OPS[op]
        deps = list(after) if isinstance(after, (list, tuple)) else [after]
        bad = [(None, f"after[{i}] is a {type(d).__name__}, not a vbatch.distributed.Future")
               for i, d in enumerate(deps) if not isinstance(d, Future)]
        if bad:
            raise InputError(bad, what="submission")
        dist = {}
        given = dict(fields)
        for name, v in fields.items():
            if isinstance(v, Future):
                v = v.output()
            if isinstance(v, DistributedBatch):
                if v.runtime is not self:
                    raise InputError([(None, f"{name}: a distributed batch of another runtime")])
                dist[name] = v
                given[name] = v.placeholder
        req = self._validated(o, given, dist)  # the whole batch, in the caller's numbering
        first = getattr(req, o._ins[0][1])
        k = first.k
        if dist:
            shards = next(iter(dist.values())).shards
            for name, v in dist.items():
                if v.shards is not shards and not _same_sharding(v.shards, shards):
                    raise InputError([(None, f"{name} is sharded unlike the other distributed "
                                             "operands")])
            plan = [(s.worker, s.index, j) for j, s in enumerate(shards)]
        elif len(self.workers) == 1:
            plan = [(self.workers[0], np.arange(k), None)]
        else:
            idx = self._split(o, req, first.dtype)
            plan = [(w, i, None) for w, i in zip(self.workers, idx) if len(i)]
        after = tuple(s for d in deps for s in d.shards)

        def shard(worker, index, j):
            shard_fields, reads = {}, []
            for name, v in fields.items():
                if name in dist:
                    d = dist[name].shards[j]
                    shard_fields[name] = (_OUT, d.key, dist[name].name)
                    reads.append(d)
                else:
                    shard_fields[name] = _take(getattr(req, name, v), v, index, k)
            return _Shard(worker, index, _run_shard, (
                op, self.device, self._options, self._chunk, shard_fields), tuple(reads),
                after=after)

        # (host matrices are packed a shard a thread: numpy copies without the GIL)
        big = len(plan) > 1 and sum(_host_nbytes(getattr(req, n, None)) for n in fields) > BIG
        out = list(_packers().map(shard, *zip(*plan)) if big else (shard(*p) for p in plan))
        if getattr(req, "overwrite", False):  # (their values change: a result read later
            for _, operand, w in o._ins:        # is fetched, not the one its run sent back)
                for d in dist[operand].shards if w and operand in dist else ():
                    d.written = True
        form = _form_of(req, o, dist)
        res = Future(self, o, out, k, form, None, _shapes_of(req, o), first.dtype)
        # (a submission holds what it reads until it has run: the caller may drop it at once)
        holds = [v.keep for v in dist.values()] + [d._keep for d in deps]
        waits = list(after) + [r for s in out for r in s.reads]
        # (near the end: the client's loop, sending the shards, would otherwise take the GIL
        # in turns with the rest of this call)
        self._hub.go(out, waits, holds)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [res]
        return res

    def spd(self, sizes: Any, seed: int = 0, dtype: Any = np.float64) -> DistributedBatch:
        """A batch of SPD matrices of these sizes made on the workers (on their devices),
        sharded by Cholesky flops: for benchmarks and tests at sizes no client should ship
        (lower triangles read; see ``_make_spd``)."""
        ns = np.asarray(sizes, dtype=np.int64)
        if ns.ndim != 1 or (ns < 0).any():
            raise InputError([(None, "sizes must be a 1-D array of non-negative ints")])
        from vbatch.ops.cholesky import cholesky_flops

        idx = shard_by_cost(cholesky_flops(ns) + 1.0, len(self.workers))
        plan = [(worker, (ns[index], seed * 1009 + w, np.dtype(dtype).str), index)
                for w, (worker, index) in enumerate(zip(self.workers, idx)) if len(index)]
        return self._made(_make_spd, plan, ns, ns, dtype)

    def random(self, m: Any, n: Any, like: DistributedBatch, seed: int = 0,
               dtype: Any = np.float64) -> DistributedBatch:
        """Matrices ``m[i] x n[i]`` of uniform entries made on the workers, sharded as
        ``like`` (right-hand sides for a batch made with :meth:`spd`)."""
        ms, ns = np.asarray(m, np.int64), np.asarray(n, np.int64)
        if ms.shape != (like.k,) or ns.shape != (like.k,):
            raise InputError([(None, f"m and n need {like.k} entries, as like has")])
        plan = [(s.worker, (ms[s.index], ns[s.index], seed * 1009 + w, np.dtype(dtype).str),
                 s.index) for w, s in enumerate(like.shards)]
        return self._made(_make_random, plan, ms, ns, dtype)

    def _made(self, maker, plan: list, m, n, dtype) -> DistributedBatch:
        """Matrices made on the workers by ``maker``: ``(worker, args, index)`` a shard."""
        shards = tuple(_Shard(w, index, maker, (*args, self.device, self._options),
                              answer=False) for w, args, index in plan)
        # (frozen: the caller's arrays may change; one object where the caller gave one)
        n, m = _frozen(n), (None if m is n else _frozen(m))
        m = n if m is None else m
        self._hub.go(list(shards), [], [])
        return DistributedBatch(self, shards, None, m, n, np.dtype(dtype),
                                _Keep(self._hub, shards))

    def _validated(self, op, given: dict, dist: dict):
        """``given`` validated as ``op``'s request; where it holds only distributed batches
        and plain parameters, the request validated for the same ones before (a batch's
        placeholder holds its shapes only: 0.13 of a 0.22 ms submission of 10^5 problems on
        a 2-core VM)."""
        if not dist or any(n not in dist and type(v) not in _PLAIN for n, v in given.items()):
            return validated(op.request, **given)
        key = (op.name, *((n, id(v)) if n in dist else (n, type(v), v)
                          for n, v in given.items()))
        hit = self._reqs.get(key)
        if hit is None:
            # (the placeholders are held with it, so their ids stay theirs)
            hit = ([given[n] for n in dist], validated(op.request, **given))
            with self._lock:
                if len(self._reqs) >= 16:
                    self._reqs.pop(next(iter(self._reqs)))
                self._reqs[key] = hit
        return hit[1]

    def _split(self, op, req, dtype) -> list:
        """``shard_by_cost`` of the request's problems, kept for the next request of the same
        sizes and parameters: the cost model builds the op's task graph (~0.3 ms for 40 small
        matrices on a 2-core VM, where the whole call takes ~5)."""
        key = (op.name, dtype.str, tuple(_sized(v) for v in req.__dict__.values()))
        idx = self._splits.get(key)
        if idx is None:
            cost = problem_cost(op, req, self._plan_options(op, dtype))
            idx = shard_by_cost(cost, len(self.workers))
            with self._lock:
                if len(self._splits) >= 16:
                    self._splits.pop(next(iter(self._splits)))
                self._splits[key] = idx
        return idx

    def _plan_options(self, op, dtype) -> dict:
        if self._local is None:
            import vbatch

            # (the planner's options for costing the shards; the kernel families' own are the
            # workers' backend's, which the CPU may not have)
            self._local = vbatch.Runtime("cpu", **{k: v for k, v in self._options
                                                   if k != "kernel_options"})
        return self._local.plan_options(dtype, op.name)

    def wait(self) -> None:
        """Wait for everything submitted so far (errors stay with their futures)."""
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait([s.run for f in pending for s in f.shards])
        # Forget them: a finished future held here kept its shards' results (a batch factored
        # in place is the batch itself) on the workers after the caller dropped it.
        gone = set(map(id, pending))
        with self._lock:
            self._pending = [f for f in self._pending if id(f) not in gone]

    def close(self) -> None:
        self.wait()
        self._hub.close()
        if self._local is not None:
            self._local.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



# The operations' methods, made from the registry as vbatch.Runtime's are.
for _op in public():
    setattr(Runtime, _op.api.__name__, caller(_op, "self.submit"))
del _op

BIG = 1 << 26  # bytes of host matrices in a call, from which its shards are packed in threads
_PLAIN = (type(None), bool, int, float, str)


@functools.cache
def _packers() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1),
                                                 thread_name_prefix="vbatch-pack")


def _frozen(a: Any) -> np.ndarray:
    a = np.asarray(a, dtype=np.int64)
    if a.flags.writeable:
        a = a.copy()
        a.flags.writeable = False
    return a


def _host_nbytes(v: Any) -> int:
    if type(v) is MatrixList and v.kind == "numpy":
        return int((v.m * v.n).sum()) * v.dtype.itemsize
    if type(v) is PackedBatch and v.kind == "numpy":
        return int(v.data.nbytes)
    return 0


def _sized(v: Any) -> Any:
    """What of a request's field its cost depends on: an operand's sizes and dtype, an
    array's entries, a parameter's value."""
    if isinstance(v, (PackedBatch, MatrixList)):
        return (v.m.tobytes(), v.n.tobytes(), v.dtype.str)
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def _same_sharding(a, b) -> bool:
    # (by problems only: a shard lies where its reader runs, moved there if it must be)
    return len(a) == len(b) and all(np.array_equal(x.index, y.index) for x, y in zip(a, b))


def _take(validated_value: Any, raw: Any, index: np.ndarray, k: int) -> Any:
    """The shard's part of one field: the listed or packed matrices it holds (host ones
    packed into one buffer, device ones as the caller's arrays or views of its buffer), its
    entries of a per-problem array, or the field as is. A field the caller left out stays out:
    its worker derives the same default from the shard (a per-problem default is per problem),
    and a call without it is one its runtime keeps prepared (runtime.py ``_key``)."""
    if raw is None:
        return None
    v = validated_value
    if type(v) is MatrixList:
        if v.kind != "numpy":
            return [v.mats[i] for i in index.tolist()]
        # One buffer a shard (as views, which keep the list form and its 1-D problems): an
        # array a matrix travelled at 0.4-0.6 GB/s (docs/decisions.md#dist-host-operands).
        # (its part of the validated list, not the shard's arrays validated again: a warm call
        # of 40 matrices on two CPU workers submitted in 0.80-0.82 ms against 0.87-0.95)
        part = v.part(index)
        return Views(pack(part, v.packed_order), part.vector)
    if type(v) is PackedBatch:
        views = v._views()
        if not np.issubdtype(v.dtype, np.floating):  # (getrs's pivots: 1-D, as a list gives
            return [views[i][:, 0] for i in index.tolist()]  # them)
        mats = [views[i] for i in index.tolist()]
        return pack(validated(MatrixList, mats=mats), v.order) if v.kind == "numpy" else mats
    if type(v) is np.ndarray and v.ndim == 1 and len(v) == k:
        return v[index]
    return raw


def _form_of(req, op, dist: dict) -> dict:
    """How each output goes back, by result field (None: an op whose result is its one
    output): the kind, packing and framework of the input it replaces, or for a new output of
    its ``form`` field's input, as a local call gives it; None (a list of numpy arrays) where
    that input is itself a distributed batch."""
    def of(name):
        if name in dist:
            return None
        v = getattr(req, name)
        if type(v) is PackedBatch:
            return (v.kind, v.order, v.frontend)
        return (v.kind, None, v.frontend)

    by_buffer = {b: of(operand if replaced(req, operand) is not None else buf.form)
                 for b, operand, _, buf in op._outs}
    forms = {field: by_buffer[b] for field, b in op.returns}
    if len(by_buffer) == 1:
        forms[None] = next(iter(by_buffer.values()))
    return forms


def _shapes_of(req, op):
    """``name -> (m, n, dtype)`` of an output field (one of ``op.returns``, or the only
    output), for :meth:`Future.output`; dtype None: the inputs'."""
    want = dict(op.returns)

    def pick(name):
        for bname, operand, _, buf in op._outs:
            if want.get(name) in (None, bname):
                given = replaced(req, operand)
                if given is not None:
                    return given.m, given.n, None
                m, n = buf.shape(req)
                return np.asarray(m), np.asarray(n), buf.dtype and np.dtype(buf.dtype)
        raise InputError([(None, f"{op.name} has no output {name!r}")])

    return pick
