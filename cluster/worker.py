"""What runs on the workers: each worker's keeper (the actor a distributed runtime calls, and
the values it holds), each worker process's own runtime, a shard's submission (in chunks where
it is larger than its device), its result made host-side, and batches made on the workers."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from vbatch.core.batch import PackedBatch, Views, array_kind
from vbatch.distributed.link import Server


_RUNTIMES: dict = {}
_RUNTIMES_LOCK = threading.Lock()
VALUES: dict = {}  # a shard's key -> its value, in this worker process


class Keeper:
    """A distributed runtime's hand on one worker (a Dask actor): it runs shards and makers one
    at a time, in the order they come, on a thread of its own (a shard may run for minutes,
    which the worker's event loop must not wait out), keeps their values under the client's
    keys, and hands them back or drops them when told.

    The client sends a call only once its dependencies are done (vbatch.distributed.future),
    so one thread in arrival order is all the ordering a worker needs. Its runtime calls it
    over a link of its own (``token``: the runtime's secret, which the link's first message
    must carry): a TCP socket that thread reads, with no hop through the worker's event loop
    or Dask's comm (docs/decisions.md#dist-link). Where the worker's address is not TCP (TLS,
    UCX, in-process) or the client cannot reach it, the calls come as actor methods through
    Dask, run on the same thread."""

    def __init__(self, token: bytes | None = None) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="vbatch-keeper")
        host = _link_host() if token is not None else None
        self._server = None if host is None else Server(host, token, _serve)

    async def address(self) -> tuple | None:
        """Where the link listens, or None (no link: the calls come through Dask)."""
        return None if self._server is None else self._server.address

    # Through Dask: the link's messages as actor methods, on the keeper's thread.
    async def run(self, key: str, early: bool, drops: list, *wire) -> Any:
        return await self._through_dask(lambda: ("run", key, early, drops, unwire(wire)))

    async def fetch(self, key: str, name: str | None) -> Any:
        return await self._through_dask(lambda: ("fetch", key, name))

    async def drop(self, keys: list) -> None:
        await self._through_dask(lambda: ("drop", keys))

    async def _through_dask(self, message) -> Any:
        (status, value), then = await asyncio.get_running_loop().run_in_executor(
            self._thread, lambda: _serve(message()))
        if then is not None:  # (after this call, before the next, off the reply's path)
            self._thread.submit(then)
        if status == "err":
            raise value
        return value


def _link_host() -> str | None:
    """The host of this worker's TCP address (where its keeper's link listens), or None."""
    try:
        from distributed import get_worker
        from distributed.comm import get_address_host, parse_address

        address = get_worker().address
        return get_address_host(address) if parse_address(address)[0] == "tcp" else None
    except Exception:  # noqa: BLE001 - no worker here, or an address of another kind
        return None


def _serve(msg: tuple) -> tuple:
    """One message to a keeper: ``("run", key, early, drops, (fn, args))`` computes ``fn(*args)``
    and keeps it under ``key`` (``early``: its host form comes back at once where it is small,
    what the caller's ``result()`` reads), then drops the values of ``drops``;
    ``("fetch", key, name)`` sends a value's host form back; ``("drop", keys)``. Returns
    ``((status, value), then)``: ``then()`` (the drops) runs after the reply is sent."""
    method, *args = msg
    then = None
    try:
        if method == "run":
            key, early, drops, call = args
            if drops:
                then = functools.partial(_drop, drops)
            fn, fargs = call
            return ("ok", _apply(key, early, fn, fargs)), then
        if method == "fetch":
            return ("ok", _reply(VALUES[args[0]], args[1])), then
        if method == "drop":
            _drop(args[0])
            return ("ok", None), then
        raise ValueError(f"a keeper has no method {method!r}")
    except Exception as exc:  # noqa: BLE001 - the caller's to raise
        return ("err", exc), then


SMALL = 1 << 20  # bytes: a result this small comes back with its run's reply


def wire(obj: Any) -> list:
    """``obj`` as a pickle (protocol 5) and its buffers: small ones inline in Dask's message,
    large ones as frames of their own (not copied)."""
    import pickle

    from distributed.protocol import to_serialize

    bufs: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return [head, *(b.raw() if b.raw().nbytes < SMALL else to_serialize(b.raw())
                    for b in bufs)]


def unwire(parts: Any) -> Any:
    import pickle

    head, *bufs = parts
    # (a buffer that came inline is read-only bytes: an operand may be written in place)
    return pickle.loads(head, buffers=[
        bytearray(b) if memoryview(b).readonly else b for b in bufs])


def _apply(key: str, early: bool, fn, args: tuple) -> Any:
    value = VALUES[key] = fn(*args)
    return _reply(value, None) if early and _nbytes(value) < SMALL else None


def _reply(value: Any, name: str | None) -> Any:
    """``value``'s host form (its ``name`` field), as one pickle where small: Dask's
    serialization of a small result (or of a list of buffers) cost 3-5 times a pickle's."""
    import pickle

    out = _gather_shard(value, name)
    return pickle.dumps(out, protocol=5) if _nbytes(out) < SMALL else out


def _nbytes(value: Any) -> int:
    if dataclasses.is_dataclass(value):
        return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value)
                   if f.init and f.name != "plan")
    if isinstance(value, (PackedBatch, Views)):
        return int(_packed(value).data.nbytes)
    if isinstance(value, list):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))


def _drop(keys: list) -> None:
    for k in keys:
        VALUES.pop(k, None)


def _worker_runtime(device: str, options: tuple):
    """This worker process's vbatch runtime (one per device and options)."""
    import vbatch

    key = (device, repr(options))  # (an option may be a dict: kernel_options)
    with _RUNTIMES_LOCK:
        rt = _RUNTIMES.get(key)
        if rt is None:
            rt = _RUNTIMES[key] = vbatch.Runtime(device, **dict(options))
        return rt


_OUT = "__vbatch_output__"  # (_OUT, shard key, field): an operand computed before, held here


def _pick(result: Any, name: str | None) -> Any:
    if name is None:
        return result
    return getattr(result, name) if not isinstance(result, dict) else result[name]


def _run_shard(op: str, device: str, options: tuple, chunk_bytes: int | None,
               fields: dict) -> Any:
    """One shard: one submission of this worker's runtime (or several, in chunks, when its
    inputs are larger than ``chunk_bytes``). The result stays here; its plan is dropped."""
    rt = _worker_runtime(device, options)
    taken: list = []
    if not _overwrites(op, fields):  # (in place, an output is its operand, kept in VALUES)
        # (only what came with the call: a value held here may be read again later)
        fields = {k: _reused((device, options, op, k), v, taken) for k, v in fields.items()}
    fields = {k: _pick(VALUES[v[1]], v[2]) if type(v) is tuple and len(v) == 3 and v[0] == _OUT
              else v for k, v in fields.items()}
    try:
        return _submit(rt, op, fields, chunk_bytes)
    finally:
        with _LAST_LOCK:
            _LAST.update(taken)


def _overwrites(op: str, fields: dict) -> bool:
    from vbatch.ops.op import OPS

    default = OPS[op].request.model_fields.get("overwrite")
    return bool(fields.get("overwrite", default.default if default is not None else False))


def _submit(rt, op: str, fields: dict, chunk_bytes: int | None) -> Any:
    limit = chunk_bytes
    if limit is None and rt.backend.name != "cpu":
        # A host shard larger than half the device's free memory (inputs, outputs and the
        # plan's workspace must fit beside it) streams through in chunks.
        limit = rt.backend.memory_free() // 2
    if limit and _host_bytes(fields) > limit:
        return _chunked(rt, op, fields, limit)
    return _strip(rt.submit(op, **fields).result())


_LAST: dict = {}  # (device, options, op, field) -> the last small host operand it was given
_LAST_LOCK = threading.Lock()


def _reused(key: tuple, v: Any, taken: list) -> Any:
    """A small host operand laid out as the last one of its call (the same sizes, a new buffer
    from the client each call), copied into that one's buffer: the runtime then finds its
    prepared call, where a new buffer costs validation and a plan lookup (40 matrices of
    n <= 16: 0.42 against 0.19 ms on a 2-core VM's CPU worker). The buffer is out of
    ``_LAST`` while its call runs (``taken``): another runtime's keeper in this process could
    run the same call meanwhile."""
    if (type(v) is not Views or v.vector is not None or v.batch.kind != "numpy"
            or v.batch.data.nbytes > SMALL):  # (1-D problems: a batch remembers which)
        return v
    b = v.batch
    with _LAST_LOCK:
        last = _LAST.pop(key, None)
    if last is None or not _same_layout(last, b):
        taken.append((key, b))
        return v
    np.copyto(last.data, b.data)
    taken.append((key, last))
    return Views(last)


def _same_layout(a: PackedBatch, b: PackedBatch) -> bool:
    return (a.order == b.order and a.data.dtype == b.data.dtype and a.data.size == b.data.size
            and all(np.array_equal(getattr(a, f), getattr(b, f))
                    for f in ("n", "m", "ld", "offset")))


def _host_bytes(fields: dict) -> int:
    """Bytes of the host matrices among a shard's operands."""
    return int(sum(_each_bytes(v).sum() for v in fields.values()
                   if isinstance(v, (PackedBatch, Views)) and _packed(v).kind == "numpy"
                   or isinstance(v, list) and v and array_kind(v[0]) == "numpy"))


def _packed(v: Any) -> PackedBatch:
    return v.batch if isinstance(v, Views) else v


def _each_bytes(v: Any) -> np.ndarray:
    """Bytes of each problem of a listed or packed operand."""
    if isinstance(v, (PackedBatch, Views)):
        b = _packed(v)
        return (b.m * b.n * b.dtype.itemsize).astype(np.float64)
    return np.array([a.nbytes for a in v], dtype=np.float64)


def _chunked(rt, op: str, fields: dict, limit: int) -> Any:
    """Stream a shard through the device: consecutive chunks of at most ``limit`` input
    bytes, two in flight (one computing while the next is copied in), each brought back to the
    host as it finishes; the outputs are joined in order."""
    lists = [k for k, v in fields.items() if isinstance(v, (list, PackedBatch, Views))]
    first = fields[lists[0]]
    k = first.k if isinstance(first, PackedBatch) else len(first)
    nbytes = np.zeros(k)
    for name in lists:
        nbytes += _each_bytes(fields[name])
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
        chunk = {n: (v.part(a, b) if isinstance(v, (PackedBatch, Views)) and n in lists else
                     v[a:b] if n in lists else
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
    """Matrices as host :class:`Views` (one buffer travels to the client faster than an array
    a matrix) or a list of numpy arrays; per-problem arrays as numpy."""
    if isinstance(v, Views):
        b = v.batch
        if b.kind != "numpy":
            b = b.with_data(b.data.get())
        return Views(b.with_frontend(None), v.vector)
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


def _joined(indices: list, parts: list, k: int) -> Any:
    """Host matrices in parts (a :class:`Views` each, holding the problems ``indices[j]``) as
    one :class:`Views` of ``k`` in order: their buffers joined, each matrix's place read from
    its part's layout, with no Python object a matrix."""
    bs = [v.batch for v in parts]
    data = np.concatenate([b.data for b in bs]) if len(bs) > 1 else bs[0].data
    cols = {f: np.empty(k, np.int64) for f in ("offset", "m", "n", "ld")}
    vector = None
    base = 0
    for index, v, b in zip(indices, parts, bs):
        for f, out in cols.items():
            out[index] = getattr(b, f) + (base if f == "offset" else 0)
        if v.vector is not None:
            if vector is None:
                vector = np.zeros(k, bool)
            vector[index] = v.vector
        base += b.data.size
    for a in cols.values():
        a.flags.writeable = False
    order = bs[0].order if all(b.order == bs[0].order for b in bs) else None
    if order is None:  # (not from one op: each matrix apart)
        out = np.empty(k, dtype=object)
        for index, v in zip(indices, parts):
            out[index] = np.fromiter(v, dtype=object, count=len(v))
        return out.tolist()
    return Views(PackedBatch.model_construct(data=data, order=order, frontend=None, **cols),
                 vector)


def _join(parts: list) -> Any:
    first = parts[0]
    if dataclasses.is_dataclass(first):
        return dataclasses.replace(first, **{
            f.name: _join([getattr(p, f.name) for p in parts])
            for f in dataclasses.fields(first) if f.init and f.name != "plan"})
    if all(type(p) is Views for p in parts):  # (as a shard that was not chunked comes)
        ends = np.cumsum([len(p) for p in parts])
        return _joined([np.arange(e - len(p), e) for e, p in zip(ends, parts)], parts,
                       int(ends[-1]))
    if isinstance(first, (list, Views)):
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
    from vbatch.core.batch import tight_offsets

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
    from vbatch.core.batch import tight_offsets

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
