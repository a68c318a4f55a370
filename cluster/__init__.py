"""vbatch.distributed: one batch over many GPUs (or many CPU processes) through Dask.

    >>> from dask.distributed import Client
    >>> import vbatch.distributed as vd
    >>> client = Client(vd.local_cluster())            # one worker per GPU (or 2 CPU workers)
    >>> drt = vd.Runtime(client)
    >>> chol = drt.cholesky(mats)                     # sharded by flops, one task per worker
    >>> x = drt.potrs(chol, rhs, after=[chol]).result()  # factors never left the workers

:class:`Runtime` has the methods of :class:`vbatch.Runtime` (every op, ``submit``, ``after=``,
``wait``). A submission is validated here, whole, before any work (errors name the problem in
the caller's numbering). Its problems are split over the workers by their flops, largest first,
each to the least loaded worker (LPT), so that the workers finish together. Each worker runs its
shard as one submission of its own ``vbatch.Runtime`` (one per worker process; on a GPU worker,
the CUDA backend on the GPU that ``CUDA_VISIBLE_DEVICES`` gives it).

A :class:`Future`'s ``result()`` gathers the shards and gives the outputs back in the caller's
order and form (a list for a list, with the caller's kind of array). Its outputs can also stay on
the workers: a distributed future given as an operand of a later op (``potrs(chol, b)``), or
:meth:`Future.output`, is read where it lies, shard by shard, without moving the data.

Failures: a worker that dies mid-batch loses nothing. Each shard is a Dask task whose inputs are
in its own spec, so the scheduler runs it again on another worker; a shard result lost with its
worker is recomputed from its lineage when something still needs it. A shard larger than its
device's memory (``chunk_bytes``) streams through that device in chunks.

The folder is ``cluster/`` and not ``distributed/`` because the repository root is on
``sys.path`` when the tests run from a checkout (``python -m pytest``), where a ``distributed/``
folder would hide Dask's own ``distributed`` package. Installed, it is ``vbatch.distributed``.
Dask is the ``distributed`` extra (``pip install "vbatch[distributed]"``), imported when a
:class:`Runtime` or a cluster is made, not with vbatch.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import threading
import time
from typing import Any

import numpy as np

from vbatch.ops.batch import MatrixList, PackedBatch, Views, array_kind, pack
from vbatch.ops.errors import InputError, validated

__all__ = ["Runtime", "Future", "DistributedBatch", "local_cluster", "shard_by_cost"]


# ====================================================================== sharding
def shard_by_cost(cost: np.ndarray, workers: int, exact: int = 4096) -> list[np.ndarray]:
    """Problem indices per worker (each ascending), balancing the summed ``cost``.

    Longest processing time first (Graham's LPT: each problem, largest first, to the least
    loaded worker; within 4/3 of the best makespan) for the ``exact`` largest problems, through
    a heap. The rest, each no larger than any of those, first even out what imbalance the head
    left, then are dealt in that same descending order in a snake (workers 0..g-1, then
    g-1..0, ...), starting with the least loaded: vectorized, so a million problems take
    milliseconds, and each worker gets as many of them and the same mix of sizes. That matters
    on a GPU, where a small problem costs more than its flops say: on the H200, splitting 10^5
    problems of U[1, 256] by flops alone gave one worker 17,390 problems and the other 82,610,
    12 against 16 ms (docs/notes.md)."""
    cost = np.asarray(cost, dtype=np.float64)
    k = len(cost)
    if workers < 1:
        raise ValueError("need at least one worker")
    order = np.argsort(-cost, kind="stable")
    owner = np.empty(k, dtype=np.int64)
    loads = [(0.0, w) for w in range(workers)]
    for i in order[:exact].tolist():
        load, w = heapq.heappop(loads)
        owner[i] = w
        heapq.heappush(loads, (load + float(cost[i]), w))
    rest = order[exact:]
    if len(rest):
        load = np.zeros(workers)
        for value, w in loads:
            load[w] = value
        # First the head's imbalance: the largest of the rest fill each worker up to the most
        # loaded one (a problem to the worker whose deficit holds its midpoint).
        c = cost[rest]
        cum = np.cumsum(c)
        deficit = load.max() - load
        fill = int(np.searchsorted(cum, deficit.sum(), side="right"))
        if fill:
            w = np.minimum(np.searchsorted(np.cumsum(deficit), cum[:fill] - c[:fill] / 2,
                                           side="right"), workers - 1)
            owner[rest[:fill]] = w
            load += np.bincount(w, weights=c[:fill], minlength=workers)
        # Then the snake: within each round of 2g problems the workers' sums differ by at most
        # that round's spread, and the spreads of a descending sequence add up to at most its
        # first problem.
        tail = rest[fill:]
        by_load = np.argsort(load, kind="stable")
        pos = np.arange(len(tail)) % (2 * workers)
        owner[tail] = by_load[np.where(pos < workers, pos, 2 * workers - 1 - pos)]
    return [np.flatnonzero(owner == w) for w in range(workers)]


def problem_cost(op, req, opts: dict) -> np.ndarray:
    """Flops per problem of a validated request: its task graph's flops (the kinds' own
    counts, the roofline floor's), summed per problem. Every op gets this for free."""
    g = op.graph(req, opts)
    k = int(g.k)
    cost = np.zeros(k)
    for c, kind in enumerate(g.kinds):
        sel = g.kind == c
        if not np.any(sel):
            continue
        f = kind.flops(g.args[sel], g.rows[sel], g.cols[sel], g.width[sel])
        cost += np.bincount(g.problem[sel], weights=np.asarray(f, dtype=np.float64),
                            minlength=k)
    return cost + 1.0  # (every problem costs a little, an empty one included)


# ====================================================================== on the workers
_RUNTIMES: dict = {}
_RUNTIMES_LOCK = threading.Lock()


def _worker_runtime(device: str, options: tuple):
    """This worker process's vbatch runtime (one per device and options)."""
    import vbatch

    key = (device, options)
    with _RUNTIMES_LOCK:
        rt = _RUNTIMES.get(key)
        if rt is None:
            rt = _RUNTIMES[key] = vbatch.Runtime(device, **dict(options))
        return rt


_OUT = "__vbatch_output__"  # (_OUT, shard future, field): an operand computed before


def _pick(result: Any, name: str | None) -> Any:
    if name is None:
        return result
    return getattr(result, name) if not isinstance(result, dict) else result[name]


def _run_shard(op: str, device: str, options: tuple, chunk_bytes: int | None, fields: dict,
               tokens: list) -> Any:
    """One shard: one submission of this worker's runtime (or several, in chunks, when its
    inputs are larger than ``chunk_bytes``). The result stays here; its plan is dropped."""
    rt = _worker_runtime(device, options)
    # Dask resolves the futures inside tuples (not inside objects of ours) to their values.
    fields = {k: _pick(v[1], v[2]) if type(v) is tuple and len(v) == 3 and v[0] == _OUT else v
              for k, v in fields.items()}
    limit = chunk_bytes
    if limit is None and rt.backend.name != "cpu":
        # A host shard larger than half the device's free memory (inputs, outputs and the
        # plan's workspace must fit beside it) streams through in chunks.
        limit = rt.backend.memory_free() // 2
    if limit and _host_bytes(fields) > limit:
        return _chunked(rt, op, fields, limit)
    return _strip(rt.submit(op, **fields).result())


def _host_bytes(fields: dict) -> int:
    total = 0
    for v in fields.values():
        if isinstance(v, list) and v and array_kind(v[0]) == "numpy":
            total += sum(a.nbytes for a in v)
    return total


def _chunked(rt, op: str, fields: dict, limit: int) -> Any:
    """Stream a shard through the device: consecutive chunks of at most ``limit`` input
    bytes, two in flight (one computing while the next is copied in), each brought back to the
    host as it finishes; the outputs are joined in order."""
    lists = [k for k, v in fields.items() if isinstance(v, list)]
    k = len(fields[lists[0]])
    nbytes = np.zeros(k)
    for name in lists:
        nbytes += np.array([a.nbytes for a in fields[name]], dtype=np.float64)
    bounds = [0]
    acc = 0.0
    for i, b in enumerate(nbytes.tolist()):
        if acc + b > limit and i > bounds[-1]:
            bounds.append(i)
            acc = 0.0
        acc += b
    bounds.append(k)
    pending = []
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        chunk = {n: (v[a:b] if n in lists else
                     v[a:b] if isinstance(v, np.ndarray) and v.ndim == 1 and len(v) == k else v)
                 for n, v in fields.items()}
        pending.append(rt.submit(op, **chunk))
        if len(pending) == 2:
            parts.append(_host(_strip(pending.pop(0).result())))
    parts += [_host(_strip(f.result())) for f in pending]
    return _join(parts)


def _strip(result: Any) -> Any:
    if dataclasses.is_dataclass(result) and hasattr(result, "plan"):
        return dataclasses.replace(result, plan=None)
    return result


def _host_value(v: Any) -> Any:
    """Matrices as a list of numpy arrays; per-problem arrays as numpy."""
    if isinstance(v, Views):
        b = v.batch
        if b.kind != "numpy":
            b = b.with_data(b.data.get())
        return v.flat(b.with_frontend(None).unpack())
    if isinstance(v, PackedBatch):
        return _host_value(Views(v))
    if isinstance(v, list):
        return [a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else
                np.asarray(a) for a in v]
    if hasattr(v, "get") and not isinstance(v, np.ndarray):
        return v.get()
    return v


def _host(result: Any) -> Any:
    if dataclasses.is_dataclass(result):
        return dataclasses.replace(result, **{
            f.name: _host_value(getattr(result, f.name)) for f in dataclasses.fields(result)
            if f.init and f.name != "plan"})
    return _host_value(result)


def _join(parts: list) -> Any:
    first = parts[0]
    if dataclasses.is_dataclass(first):
        return dataclasses.replace(first, **{
            f.name: _join([getattr(p, f.name) for p in parts])
            for f in dataclasses.fields(first) if f.init and f.name != "plan"})
    if isinstance(first, list):
        return [a for p in parts for a in p]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    return first


def _gather_shard(result: Any, name: str | None) -> Any:
    return _host(_pick(result, name))


def _make_spd(ns: np.ndarray, seed: int, dtype: str, device: str, options: tuple) -> Views:
    """SPD matrices made where they will be factored (on the worker's device), in one packed
    buffer: entries uniform on [-1, 1] and ``n`` on the diagonal. Only the lower triangle is
    read (by every SPD op here), and that triangle's symmetric matrix is diagonally dominant,
    so SPD, with no transpose to fill the other triangle."""
    from vbatch.ops.batch import tight_offsets

    rt = _worker_runtime(device, options)
    ns = np.asarray(ns, dtype=np.int64)
    ld = np.maximum(ns, 1)
    off = tight_offsets(ns, ld)
    total = int((ld * ns).sum())
    dt = np.dtype(dtype)
    cols = np.repeat(np.arange(len(ns)), ns)
    j = np.arange(len(cols)) - np.repeat(np.cumsum(ns) - ns, ns)
    diag = off[cols] + j * (ld[cols] + 1)
    if rt.backend.kind == "cupy":
        import cupy

        data = _uniform_device(total, dt, seed)
        data[cupy.asarray(diag)] = cupy.asarray(ns[cols].astype(dt))
    else:
        data = np.random.default_rng(seed).uniform(-1.0, 1.0, total).astype(dt, copy=False)
        data[diag] = ns[cols]
    for a in (ns, off, ld):
        a.flags.writeable = False
    return Views(PackedBatch.model_construct(data=data, n=ns, m=ns, offset=off, ld=ld,
                                             order="F", frontend=None))


def _uniform_device(total: int, dt: np.dtype, seed: int):
    """``total`` entries uniform on [-1, 1] on the device, drawn in pieces of 2^27 into the
    array itself: one draw of the whole made two or three temporaries of its size (cupy's
    uniform scales a [0, 1) draw, then the cast), so a batch of most of the device's memory
    could not be made (k = 6 x 10^5 of U[1, 256] on one H200, 2026-11-25)."""
    import cupy

    data = cupy.empty(total, dtype=dt)
    rs = cupy.random.RandomState(seed)
    piece = 1 << 27
    for a in range(0, total, piece):
        b = min(total, a + piece)
        data[a:b] = rs.uniform(-1.0, 1.0, b - a)
    return data


def _make_random(ms: np.ndarray, ns: np.ndarray, seed: int, dtype: str, device: str,
                 options: tuple) -> Views:
    """Matrices ``m_i x n_i`` of entries uniform on [-1, 1], made on the worker's device."""
    from vbatch.ops.batch import tight_offsets

    rt = _worker_runtime(device, options)
    ms, ns = np.asarray(ms, np.int64), np.asarray(ns, np.int64)
    ld = np.maximum(ms, 1)
    off = tight_offsets(ns, ld)
    total = int((ld * ns).sum())
    if rt.backend.kind == "cupy":
        data = _uniform_device(total, np.dtype(dtype), seed)
    else:
        data = np.random.default_rng(seed).uniform(-1.0, 1.0, total).astype(dtype)
    for a in (ms, ns, off, ld):
        a.flags.writeable = False
    return Views(PackedBatch.model_construct(data=data, n=ns, m=ms, offset=off, ld=ld,
                                             order="F", frontend=None))


def _token(*_: Any) -> None:
    """Done when its arguments are: how ``after=`` orders shards without moving their data."""
    return None


# ====================================================================== the client side
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

    def placeholder(self) -> PackedBatch:
        """Shapes and dtype only, for validating a request that reads this batch."""
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
        self._done = False
        self._lock = threading.Lock()

    def done(self) -> bool:
        return all(s.future.done() for s in self.shards)

    def result(self, timeout: float | None = None) -> Any:
        with self._lock:
            if not self._done:
                client = self._rt.client
                gathers = [client.submit(_gather_shard, s.future, self._name, pure=False,
                                         workers=[s.worker], allow_other_workers=True)
                           for s in self.shards]
                parts = client.gather(gathers) if timeout is None else [
                    g.result(timeout) for g in gathers]
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
        m, n = self._shapes(name)
        return DistributedBatch(self._rt, self.shards, name, m, n, self._dtype)

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
        if isinstance(first, list) or first is None:
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
        backend = None
        if kind == "cupy":
            from vbatch.kernels import get_backend

            backend = get_backend("cuda")
        return pack(mats, order=order, backend=backend).with_frontend(frontend)
    if frontend is not None:
        from vbatch.ops.frontends import give_all

        return give_all(mats, frontend)
    return mats


class Runtime:
    """:class:`vbatch.Runtime`'s methods over the workers of a ``dask.distributed.Client``.

    ``device``: what each worker's runtime uses (``"auto"``: its GPU if it has one).
    ``workers``: the worker addresses to use (default: all of the client's, when the runtime
    is made). ``chunk_bytes``: a shard whose host inputs exceed this streams through its device
    in chunks (default: half the device's free memory on a GPU, no chunks on the CPU).
    ``retries``: Dask's retries of a shard that raised (a worker that dies is handled by the
    scheduler either way). Other keywords are :class:`vbatch.Config` options for the workers'
    runtimes."""

    def __init__(self, client, device: str = "auto", *, workers: list | None = None,
                 chunk_bytes: int | None = None, retries: int = 0, **options: Any):
        from vbatch.runtime.config import Config

        self.client = client
        _quicken(client)
        self.device = device
        validated(Config, what="runtime options", **options)  # named here, not on a worker
        self._options = tuple(sorted(options.items()))
        self._chunk = chunk_bytes
        self._retries = retries
        if workers is None:
            workers = sorted(client.scheduler_info()["workers"])
        if not workers:
            raise InputError([(None, "the Dask client has no workers")], what="runtime options")
        self.workers = list(workers)
        self._local = None
        self._pending: list = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"vbatch.distributed.Runtime({len(self.workers)} workers, device={self.device!r})"

    # ------------------------------------------------------------ the ops
    def cholesky(self, mats: Any, npiv: Any = None, *, after: Any = (),
                 overwrite: bool = False) -> Future:
        return self.submit("potrf", after=after, batch=mats, npiv=npiv, overwrite=overwrite)

    def gemm(self, a, b, c=None, **kw) -> Future:
        return self.submit("gemm", a=a, b=b, c=c, **kw)

    def syrk(self, a, c=None, **kw) -> Future:
        return self.submit("syrk", a=a, c=c, **kw)

    def syr2k(self, a, b, c=None, **kw) -> Future:
        return self.submit("syr2k", a=a, b=b, c=c, **kw)

    def trsm(self, a, b, **kw) -> Future:
        return self.submit("trsm", a=a, b=b, **kw)

    def trmm(self, a, b, **kw) -> Future:
        return self.submit("trmm", a=a, b=b, **kw)

    def potrs(self, l, b, **kw) -> Future:  # noqa: E741 - LAPACK's name
        return self.submit("potrs", l=l, b=b, **kw)

    def posv(self, a, b, **kw) -> Future:
        return self.submit("posv", a=a, b=b, **kw)

    def submit(self, op: str, *, after: Any = (), **fields: Any) -> Future:
        """Validate the whole request here, shard it by flops (or as the distributed operands
        it reads are sharded), and run one task per shard on its worker."""
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
                given[name] = v.placeholder()
        req = validated(o.request, **given)  # the whole batch, named in the caller's numbering
        first = getattr(req, o._ins[0][1])
        k = first.k
        if dist:
            shards = next(iter(dist.values())).shards
            for name, v in dist.items():
                if v.shards is not shards and not _same_sharding(v.shards, shards):
                    raise InputError([(None, f"{name} is sharded unlike the other distributed "
                                             "operands")])
            plan = [(s.worker, s.index) for s in shards]
        else:
            cost = problem_cost(o, req, self._plan_options(o, first.dtype))
            idx = shard_by_cost(cost, len(self.workers))
            plan = [(w, i) for w, i in zip(self.workers, idx) if len(i)]
        tokens = self._tokens(deps)
        client = self.client
        out = []
        for worker, index in plan:
            shard_fields = {}
            for name, v in fields.items():
                if name in dist:
                    s = next(s for s in dist[name].shards if s.worker == worker
                             and np.array_equal(s.index, index))
                    shard_fields[name] = (_OUT, s.future, dist[name].name)
                else:
                    shard_fields[name] = _take(getattr(req, name, v), v, index, k)
            fut = client.submit(_run_shard, op, self.device, self._options, self._chunk,
                                shard_fields, tokens.get(worker, []), pure=False,
                                workers=[worker], allow_other_workers=True,
                                retries=self._retries)
            out.append(_Shard(worker, fut, index))
        form = _form_of(req, o, dist)
        res = Future(self, o, out, k, form, None, _shapes_of(req, o), first.dtype)
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
        shards = []
        for w, (worker, index) in enumerate(zip(self.workers, idx)):
            if len(index):
                fut = self.client.submit(_make_spd, ns[index], seed * 1009 + w,
                                         np.dtype(dtype).str, self.device, self._options,
                                         pure=False, workers=[worker], allow_other_workers=True)
                shards.append(_Shard(worker, fut, index))
        return DistributedBatch(self, tuple(shards), None, ns, ns, np.dtype(dtype))

    def random(self, m: Any, n: Any, like: DistributedBatch, seed: int = 0,
               dtype: Any = np.float64) -> DistributedBatch:
        """Matrices ``m[i] x n[i]`` of uniform entries made on the workers, sharded as
        ``like`` (right-hand sides for a batch made with :meth:`spd`)."""
        ms, ns = np.asarray(m, np.int64), np.asarray(n, np.int64)
        if ms.shape != (like.k,) or ns.shape != (like.k,):
            raise InputError([(None, f"m and n need {like.k} entries, as like has")])
        shards = tuple(_Shard(s.worker, self.client.submit(
            _make_random, ms[s.index], ns[s.index], seed * 1009 + w, np.dtype(dtype).str,
            self.device, self._options, pure=False, workers=[s.worker],
            allow_other_workers=True), s.index) for w, s in enumerate(like.shards))
        return DistributedBatch(self, shards, None, ms, ns, np.dtype(dtype))

    def _plan_options(self, op, dtype) -> dict:
        if self._local is None:
            import vbatch

            self._local = vbatch.Runtime("cpu", **dict(self._options))
        return self._local.plan_options(dtype, op.name)

    def _tokens(self, deps: list) -> dict:
        """Per worker, tiny tasks that finish when every shard of ``deps`` has (run where
        each shard lies: ordering moves no data)."""
        out: dict = {}
        for d in deps:
            for s in d.shards:
                t = self.client.submit(_token, s.future, pure=False, workers=[s.worker],
                                       allow_other_workers=True)
                for w in self.workers:
                    out.setdefault(w, []).append(t)
        return out

    def wait(self) -> None:
        """Wait for everything submitted so far (errors stay with their futures)."""
        from distributed import wait

        with self._lock:
            pending = list(self._pending)
        wait([s.future for f in pending for s in f.shards])
        # Forget them: a finished future held here kept its shards' results (a batch factored
        # in place is the batch itself) on the workers after the caller dropped it.
        gone = set(map(id, pending))
        with self._lock:
            self._pending = [f for f in self._pending if id(f) not in gone]

    def close(self) -> None:
        self.wait()
        if self._local is not None:
            self._local.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _quicken(client) -> None:
    """Dask's client batches its messages to the scheduler every 10 ms (a constant in
    distributed/client.py), so back-to-back submissions each waited up to 10 ms: an empty task's
    round trip took 10.7 ms on the H200 machine (docs/notes.md). vbatch submits a few large
    tasks, not many small ones, so it sends them at once (1 ms)."""
    comm = getattr(client, "scheduler_comm", None)
    if comm is not None and getattr(comm, "interval", 0) > 0.001:
        comm.interval = 0.001


def _same_sharding(a, b) -> bool:
    return len(a) == len(b) and all(x.worker == y.worker and np.array_equal(x.index, y.index)
                                    for x, y in zip(a, b))


def _take(validated_value: Any, raw: Any, index: np.ndarray, k: int) -> Any:
    """The shard's part of one field: the listed or packed matrices it holds (the caller's
    arrays, or views of its buffer), its entries of a per-problem array, or the field as is."""
    v = validated_value
    if type(v) is MatrixList:
        return [v.mats[i] for i in index.tolist()]
    if type(v) is PackedBatch:
        views = v._views()
        return [views[i] for i in index.tolist()]
    if type(v) is np.ndarray and v.ndim == 1 and len(v) == k:
        return v[index]
    return raw


def _form_of(req, op, dist: dict) -> tuple | None:
    """How the outputs go back: the kind, packing and framework of the first input (an
    output takes that operand's form); None (a list of numpy arrays) when that input is
    itself a distributed batch."""
    name = op._ins[0][1]
    v = getattr(req, name)
    if name in dist:
        return None
    if type(v) is PackedBatch:
        return (v.kind, v.order, v.frontend)
    return (v.kind, None, v.frontend)


def _shapes_of(req, op):
    """``name -> (m, n)`` of an output field (``factors`` / ``solutions`` / the only one),
    for :meth:`Future.output`."""
    want = {"factors": "l", "solutions": "x"}

    def pick(name):
        for bname, operand, _, buf in op._outs:
            if want.get(name) in (None, bname):
                given = getattr(req, operand)
                if given is not None:
                    return given.m, given.n
                m, n = buf.shape(req)
                return np.asarray(m), np.asarray(n)
        raise InputError([(None, f"{op.name} has no output {name!r}")])

    return pick


# ====================================================================== clusters
def local_cluster(n_workers: int | None = None, device: str = "auto", **kw: Any):
    """A cluster on this machine: one worker process per GPU, each seeing only its own GPU
    (dask-cuda's ``LocalCUDACluster`` where it is installed, else one ``Nanny`` per GPU with
    ``CUDA_VISIBLE_DEVICES`` set), or ``n_workers`` single-threaded CPU processes (default 2)."""
    from vbatch.runtime.device import cuda_status

    gpus = 0
    if device in ("auto", "cuda") and cuda_status()[0]:
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount()
    if gpus:
        n = n_workers or gpus
        try:
            from dask_cuda import LocalCUDACluster

            return LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(n)), **kw)
        except ImportError:
            pass
        from distributed import Nanny, Scheduler, SpecCluster

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
        workers = {f"gpu{i}": {"cls": Nanny, "options": {
            "nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]}}}
            for i in range(n)}
        return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {
            "dashboard_address": None}}, **kw)
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers or 2, threads_per_worker=1, processes=True,
                        dashboard_address=None, **kw)


def wait_for_workers(client, n: int, timeout: float = 60.0) -> None:
    """Block until ``n`` workers are connected (a cluster starts its processes in the
    background)."""
    t0 = time.monotonic()
    while len(client.scheduler_info()["workers"]) < n:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{n} workers did not connect within {timeout} s")
        time.sleep(0.05)
