"""The public face: :class:`Runtime`, :class:`Future`, :class:`CholeskyResult`.

A submission goes through the same stages for every operation and backend::

    validate (the op's pydantic request, before any work) -> plan (the op's task graph through
        the scheduler; cached by the batch's size signature) -> stage each buffer the op names
        -> begin -> one backend launch per plan launch -> flush -> end -> Future

On the CPU the stages after planning run on the runtime's worker thread, so a submission returns
at once and ``after=`` dependencies are waited for there (a small call with nothing queued before
it runs in the caller's thread: ``INLINE_FLOPS``). On CUDA they run in the caller's thread
and only enqueue work; dependencies become stream waits on events, and ``Future.result`` is the
single synchronization point, where ``info`` is read back once.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import numpy as np

from vbatch.kernels import Completion, get_backend
from vbatch.core.batch import (
    MatrixList,
    PackedBatch,
    Views,
    first_time,
    index_signature,
    list_signature,
    own_token,
    staged_order,
)
from vbatch.ops.cholesky import CholeskyResult  # noqa: F401 - re-exported
from vbatch.ops.posv import PosvResult  # noqa: F401 - re-exported
from vbatch.core.errors import InputError, validated
from vbatch.ops.op import OPS, Op, caller, public, replaced
from vbatch.runtime.config import Config
from vbatch.runtime.future import DependencyError, Future, _deps  # noqa: F401 - re-exported
from vbatch.runtime.prepared import (_NONE, Prepared, _give, _list_form, layout_token,
                                     output_order, staged_bytes, unasked)
from vbatch.runtime.device import resolve_device
from vbatch.runtime.tune import tuned_options
from vbatch.scheduler.plan import Plan, make_plan

# Plans kept per runtime, by size signature (least recently used dropped first).
PLANS = 64


class Runtime:
    """Submit batches, get futures.

    ``device``: ``"auto"`` (CUDA when a GPU is usable, else the CPU), ``"cpu"`` or ``"cuda"``.
    ``config`` (a :class:`~vbatch.Config`) or keyword options (``nb``, ``policy``,
    ``fused_max_rows``, ``streams``, ``cuda_graphs``, ``fp64_update``, ``fp64_gemm``) set how it
    plans and runs; planner options left unset default to what the backend prefers for the op and
    dtype.
    """

    def __init__(self, device: str = "auto", config: Config | None = None, **options: Any):
        self.device = resolve_device(device)
        self.backend = get_backend(self.device)
        self.config = Config.resolve(config, **options)  # (its precedence: runtime/config.py)
        self._check_kernel_options()
        self._pool = None
        # Calls handed to the worker and not yet run: while there are any, a call goes behind
        # them (a caller's calls run in order; the backend keeps concurrent ones apart).
        self._queued = 0
        self._closed = False
        if not self.backend.asynchronous:
            # One worker: submissions run in order, so an `after=` dependency on this runtime is
            # always ahead in the queue and waiting for it cannot deadlock.
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix=f"vbatch-{self.device}")
        # For wait(): asynchronous backends keep the last completion per stream they enqueued
        # on (so no future, and none of its buffers, is held here); the synchronous one uses a
        # barrier job on its FIFO worker.
        self._tails: dict = {}
        self._lock = threading.Lock()
        self._opts: dict = {}  # (op, dtype, order) -> planner options (identity-keyed)
        # (family, dtype name, order) -> what `python -m vbatch tune` measured for this machine
        self._tuned = tuned_options(self.backend, self.config)
        self._plans: OrderedDict = OrderedDict()  # size signature -> plan, last used last
        self._calls: dict = {}  # the call's key (_key) -> its Prepared, oldest first
        self._lists: dict = {}  # hashes of list calls' keys seen once (_once), oldest first
        self._coalescer = None
        if self.config.coalesce_us is not None:
            from vbatch.runtime.coalesce import Coalescer

            c = self.config
            self._coalescer = Coalescer(self, c.coalesce_us, c.coalesce_max_n, c.coalesce_max_k)

    def __repr__(self) -> str:
        return f"Runtime(device={self.device!r}, {self.config!r})"

    def _check_kernel_options(self) -> None:
        """``Config.kernel_options`` names only options some kernel family of this backend
        plans with (the fields of Config are set as fields)."""
        given = self.config.kernel_options
        if not given:
            return
        known = {k for mod in self.backend.kernels.values()
                 for k in mod.plan_defaults(np.dtype(np.float64))} - set(Config.model_fields)
        bad = sorted(set(given) - known)
        if bad:
            raise InputError([(None, f"kernel_options: unknown option {b!r} on the "
                                     f"{self.backend.name} backend (known: "
                                     f"{', '.join(sorted(known))})") for b in bad],
                             what="runtime options")

    # ------------------------------------------------------------------ planning
    def plan_options(self, dtype: Any, op: str = "potrf",
                     order: str | None = None) -> MappingProxyType:
        """The planner's options for ``op`` on this dtype: the config's, else the backend's
        (those of every kernel family the op uses, merged in the op's order, each family's
        defaults followed by what ``python -m vbatch tune`` measured for it on this machine,
        for this layout).

        ``order``: the layout of the batch ("F", "C"; None: not said, read as column-major
        where tuned), where a backend's defaults and the tuned options depend on it. One
        read-only mapping per (op, dtype), the same object for every layout whose options are
        those of ``order=None``; another only where the layout changes one. (Options are set
        through the :class:`Config` alone.)"""
        dtype = np.dtype(dtype)
        hit = self._opts.get((op, dtype, order))
        if hit is None:
            if order is None:
                hit = MappingProxyType(self._options(dtype, op, None))
            else:
                plain = self.plan_options(dtype, op)
                own = self._options(dtype, op, order)
                hit = plain if own == plain else MappingProxyType(own)
            self._opts[(op, dtype, order)] = hit
        return hit

    def _options(self, dtype: np.dtype, op: str, order: str | None) -> dict:
        families = OPS[op].families if op in OPS else (op,)
        self.backend.check_dtype(dtype, None, families, op)  # (an InputError, not a KeyError)
        hit = {}
        for fam in families:
            hit.update(self.backend.plan_defaults(fam, dtype, order))
            # (tuned per layout; a layout not said takes the column-major one's)
            hit.update(self._tuned.get((fam, dtype.name, order or "F"), {}))
        cfg = self.config
        for name in Config.PLANNER:
            if getattr(cfg, name) is not None and name in hit:
                hit[name] = getattr(cfg, name)
        for name, value in cfg.kernel_options.items():
            if name in hit:
                hit[name] = value
        hit["policy"] = cfg.policy
        for fam in families:
            self.backend.check_options(fam, dtype, hit)
        return hit

    def plan(self, mats: Any, npiv: Any = None) -> Plan:
        """The plan that :meth:`cholesky` would execute for this input (for inspection)."""
        return self.plan_for("potrf", batch=mats, npiv=npiv)

    def plan_for(self, op: str, **fields: Any) -> Plan:
        """The plan :meth:`submit` would execute for ``op`` with these fields (for
        inspection): ``rt.plan_for("potrs", l=factors, b=rhs)``."""
        o = self._op(op)
        return self._plan(o, validated(o.request, **fields))

    def _takes(self, op: Op, req) -> np.dtype:
        """The call's dtype, which this runtime's backend must take (else an InputError,
        before any work)."""
        dtype = getattr(req, op._ins[0][1]).dtype
        self.backend.check_dtype(dtype, op._ins[0][1], op.families, op.name)
        return dtype

    def _plan(self, op: Op, req) -> Plan:
        """The plan for ``req``: reused for every call with the same size signature."""
        # (the operands' orders in the key too: a graph may take another form for another
        # layout)
        orders = tuple(staged_order(getattr(req, operand)) for _, operand, _ in op._ins)
        opts = self.plan_options(self._takes(op, req), op.name, orders[0])
        sig = (op.name, id(opts), op.signature(req), orders)
        with self._lock:
            plan = self._plans.get(sig)
            if plan is not None:
                self._plans.move_to_end(sig)
        if plan is None:
            graph = op.graph(req, opts)
            planner = {k: v for k, v in opts.items() if k not in ("policy", "streams")}
            plan = make_plan(graph, op=op.name, policy=opts["policy"],
                             streams=opts.get("streams", 1), buffers=op.names, **planner)
            self.backend.check_plan(plan)
            with self._lock:
                self._plans[sig] = plan
                while len(self._plans) > PLANS:
                    self._plans.popitem(last=False)
        return plan

    # ------------------------------------------------------------------ calls
    def prepare(self, op: str | Op, **fields: Any) -> Prepared:
        """Validate and plan one call of ``op`` (its request's fields, as :meth:`submit`
        takes them) once; ``run()`` it as often as wanted, rebinding operands to new data of
        the same sizes: ``p = rt.prepare("gemm", a=a, b=b); p.run(b=b2)``. Bad input raises
        :class:`~vbatch.InputError` here."""
        o = self._op(op)
        req = validated(o.request, **fields)
        return Prepared(self, o, req, self._plan(o, req))

    # Prepared calls kept per runtime, by the call's key (_key): the first runs of a call
    # prepare it; later ones with the same batches (or their twins) run it. Validating a GEMM
    # request through pydantic costs ~24 us and finding its plan by size signature ~38 us
    # (2-core VM, docs/decisions.md#host-prepared-calls); a kept call's run ~3 us before the
    # backend. Entries hold no batch, so they never keep device memory alive.
    KNOWN = 256

    def submit(self, op: str | Op, *, after: Any = (), **fields: Any) -> Future:
        """Submit any registered operation by name, with its request's fields (the methods
        named after the operations take the same road, their key built inline)."""
        o = op if type(op) is Op else self._op(op)
        key = _key(o, fields)
        p = None if key is None else self._calls.get(key)
        if p is not None:
            fut = p._call(fields, after, fields.get("overwrite", False) is True, True)
            if fut is not None:
                return fut
        return self._run(key, o, fields, after)

    def _run(self, key: tuple | None, o: Op, fields: dict, after: Any) -> Future:
        """A call whose key found no prepared call it could run: prepared, and kept under
        ``key`` where it has one (a key holding ``_NOKEY`` has none)."""
        if key is not None and _NOKEY in key:
            key = None
        req = validated(o.request, **fields)
        overwrite = bool(getattr(req, "overwrite", False))
        if self._coalescer is not None:
            self._takes(o, req)
            part = self._coalescer.offer(o, req, _deps(after), overwrite)
            if part is not None:
                return part
        plan = self._plan(o, req)
        if key is not None and any(type(v) is np.ndarray and _val(v) not in key
                                   for n, v in fields.items() if n not in o.operands):
            key = None  # (an array written while the call was made: not what its key read)
        if key is not None:
            lists = any(type(fields.get(n)) in (list, tuple) for n in o.operands)
            with self._lock:  # (iterating to evict while another thread inserts would raise)
                if lists and first_time(self._lists, hash(key), self.KNOWN):
                    # A list call is kept the second time its sizes come: each kept call holds
                    # its plan, and kept at once, a stream of lists of new sizes (20,000
                    # matrices each) held +1.5 GiB, against +0.4 with the plans alone.
                    key = None
                else:
                    p = Prepared(self, o, req, plan, keep=False)
                    calls = self._calls
                    calls[key] = p
                    if len(calls) > self.KNOWN:
                        calls.pop(next(iter(calls)), None)
        if key is None:  # (nothing will find this call again: no prepared call, no replay)
            return self._submit(o, req, after, overwrite, plan)
        return p._staged(req, after, overwrite)

    def _op(self, op: str | Op) -> Op:
        if isinstance(op, Op):
            return op
        if op not in OPS:
            raise InputError([(None, f"unknown operation {op!r} (known: {', '.join(OPS)})")],
                             what="submission")
        return OPS[op]

    def _tail(self, completion: Completion) -> None:
        # (one dict store, atomic without the lock; wait() copies the values in one step)
        self._tails[completion.queue] = completion

    def _submit(self, op: Op, req, after, overwrite: bool, plan: Plan) -> Future:
        """The staged road of a run (runtime/prepared.py): checks, ``after=``, staging."""
        deps = [] if type(after) is tuple and not after else _deps(after)
        for d in deps:
            settle = getattr(d, "_settle", None)  # a coalesced member still in its bucket
            if settle is not None:
                settle()
        for _, operand, written in op._ins:
            given = getattr(req, operand)
            if given is not None:
                self._check_memory(given, overwrite, written)
        if self._pool is None:
            fut = Future(self, threaded=False)
            self._run_async(fut, op, req, overwrite, plan, deps)
            return fut
        if self._closed:
            raise RuntimeError("this runtime is closed")
        if not deps and not self._queued and self._small(op, req, plan):
            fut = Future(self, threaded=False)
            self._run_sync(fut, op, req, overwrite, plan, deps, inline=True)
            return fut
        fut = Future(self, threaded=True)
        with self._lock:
            self._queued += 1
        try:
            self._pool.submit(self._job, fut, op, req, overwrite, plan, deps)
        except BaseException:
            with self._lock:
                self._queued -= 1
            raise
        return fut

    # On a synchronous backend a call this small (its plan's flops, and the elements of its
    # operands and outputs) runs in the caller's thread when the worker has nothing queued:
    # handing it over costs more than the work (docs/decisions.md#cpu-inline-calls).
    INLINE_FLOPS = 1 << 18
    INLINE_ELEMENTS = 1 << 16

    def _small(self, op: Op, req, plan: Plan) -> bool:
        size = plan.cache.get("inline")  # (the plan is per sizes: so are these)
        if size is None:
            elems = 0
            for _, operand, _ in op._ins:
                v = getattr(req, operand)
                if v is not None:
                    elems += int((v.m * v.n).sum())
            for _, operand, _, buf in op._outs:
                if replaced(req, operand) is None:  # (a new output: its own elements)
                    m, n = buf.shape(req)
                    elems += int((np.asarray(m) * np.asarray(n)).sum())
            size = plan.cache["inline"] = (plan.flops(), elems)
        return size[0] <= self.INLINE_FLOPS and size[1] <= self.INLINE_ELEMENTS

    def _check_memory(self, batch, overwrite: bool, written: bool = True) -> None:
        """Refuse, before any work, a batch the backend's memory cannot stage: a problem whose
        own matrix is larger than the whole memory, or a batch larger than what is free."""
        b = self.backend
        packed = type(batch) is PackedBatch
        isz = batch.dtype.itemsize
        if packed and batch.cache().get(("fits", b.name, isz)):
            return  # known small against the whole memory (neither changes)
        if packed and (overwrite or not written) and batch.kind == b.kind:
            return  # an input on this backend's memory is read (or overwritten) where it is
        # One that is written (an output takes its layout) needs a copy.
        staged = staged_bytes(batch)
        total = b.memory_total()
        # Cheap on the hot path: the free memory is asked only for a batch that is a large
        # part of the whole.
        if unasked(staged, total):
            if packed:  # (its whole buffer: the largest it can stage)
                batch.cache()[("fits", b.name, isz)] = True
            return
        where = f"{b.memory_name} memory"
        need = batch.m.astype(np.float64) * batch.n * isz
        big = [(int(i), f"n = {batch.n[i]} needs {_bytes(need[i])} ({batch.n[i]}^2 x {isz} "
                        f"bytes), more than the {_bytes(total)} of {where}")
               for i in np.flatnonzero(need > total)]
        if big:
            raise InputError(big)
        if not packed and overwrite and written and b.reads_in_place(batch):
            return  # written where it lies
        free = b.memory_free()
        if staged > free:
            raise InputError([(None, f"the batch needs {_bytes(staged)} of {where} to run "
                                     f"({'a copy of ' if staged else ''}its matrices), but only "
                                     f"{_bytes(free)} of {_bytes(total)} is free")])

    def wait(self) -> None:
        """Wait for everything submitted so far (errors stay with their futures)."""
        if self._coalescer is not None:
            self._coalescer.flush()
        if self._pool is not None:
            self._pool.submit(lambda: None).result()  # one FIFO worker: a barrier
            return
        tails = list(self._tails.values())
        for c in tails:
            c.sync()

    def close(self) -> None:
        if self._coalescer is not None:
            self._coalescer.close()  # (its last buckets are submitted here)
        self.wait()
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ execution
    def _execute(self, op: Op, req, overwrite: bool, plan: Plan, after: list[Completion]):
        """Stage the op's buffers, run every launch of the plan; return the completion and a
        finisher that builds the result, each output in the caller's form."""
        b = self.backend
        if after:
            b.order_after(after)  # before staging: a list's gather reads what they write
        staged: dict = {}
        for name, operand, written in op._ins:
            given = getattr(req, operand)
            if given is None:
                staged[name] = None
            elif overwrite and written:
                others = tuple(getattr(req, o) for o in op.operands if o != operand)
                staged[name] = b.stage_input(given, True, others)
            else:
                staged[name] = b.stage_input(given, False)
        lists = None
        for name, operand, like, buf in op._outs:
            given = replaced(req, operand)
            if given is None:  # a new output (GEMM without c): laid out from its sizes
                staged[name] = _new_buffer(b, req, buf)
            else:
                staged[name] = staged[like] if overwrite else b.new_output(staged[like])
                if type(given) is MatrixList and not _in_place(staged[name]):
                    lists = lists or {}
                    lists[name] = given
        for buf in op._scratch:
            staged[buf.name] = _new_buffer(b, req, buf)
        scalars = op.scalars(req) if op.scalars is not None else None
        ex = b.begin(plan, staged, self.config, scalars)
        b.launch_all(ex, plan.launches)
        # Writing back into the caller's device arrays is enqueued right after the plan's
        # launches (flush runs it), before the completion, so that work ordered after this
        # submission sees it. Host arrays are written when the result is built (it needs the
        # data on the host anyway).
        device_writeback = bool(overwrite and lists and b.asynchronous and all(
            m.kind == b.kind for m in lists.values()))
        writeback = None
        if device_writeback:
            def writeback() -> None:
                for name, mats in lists.items():
                    b.scatter(b.batch_of(staged[name]), mats.mats)

        b.flush(ex, then=writeback)
        completion = b.end(ex)
        result = op.result

        def finish(info: np.ndarray):
            out = {}
            # Outputs in the caller's form: a list's as views of the output buffer made when
            # touched (Views), a packed batch's as a packed batch; either given back to the
            # caller's framework (torch, JAX) when the input came from one.
            for name, operand, _, buf in op._outs:
                given = replaced(req, operand)
                work = b.batch_of(staged[name])
                if given is None:
                    form = getattr(req, buf.form)
                    exported = b.export(work, form.kind).with_frontend(form.frontend)
                    out[name] = _give(exported, _list_form(form))
                elif type(given) is MatrixList:
                    if overwrite:
                        if not device_writeback and not _in_place(work):
                            b.scatter(work, given.mats)
                        out[name] = given.source
                    else:
                        out[name] = _give(b.export(work, given.kind).with_frontend(
                            given.frontend), given.vector)
                elif not overwrite:
                    exported = b.export(work, given.kind).with_frontend(given.frontend)
                    out[name] = _give(exported, _list_form(given))
                else:
                    if work.data is not given.data:
                        b.scatter(work, given)  # e.g. a host batch factored on the device
                    out[name] = _give(given, _list_form(given))
            return result(out, info, plan)

        return completion, finish

    def _job(self, *job) -> None:
        """A call on the worker thread."""
        try:
            self._run_sync(*job)
        finally:
            with self._lock:
                self._queued -= 1

    def _run_sync(self, fut: Future, op, req, overwrite: bool, plan: Plan, deps: list,
                  inline: bool = False) -> None:
        try:
            for i, d in enumerate(deps):
                exc = d.exception()
                if exc is not None:
                    raise DependencyError(f"after[{i}] failed: {exc!r}") from exc
            completion, finish = self._execute(op, req, overwrite, plan, [])
            value = finish(completion.wait())
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            if inline and not isinstance(exc, Exception):
                raise  # (Ctrl-C in the caller's own thread is the caller's)
            fut._fail(exc)
            return
        if fut._cf is not None:
            fut._cf.set_result(value)
        else:
            fut._value = value

    def _run_async(self, fut: Future, op, req, overwrite: bool, plan: Plan, deps: list) -> None:
        waits: list[Completion] = []
        # Host inputs are read now, in this thread, so every dependency must have finished
        # (and written its host results back) first; device inputs are ordered on the device.
        host_input = False
        if deps:
            kind = self.backend.kind
            for _, operand, _ in op._ins:
                given = getattr(req, operand)
                if given is not None and given.kind != kind:
                    host_input = True
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
            completion, finish = self._execute(op, req, overwrite, plan, waits)
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            fut._fail(exc)
            return
        # A dependency ordered on the device may still fail in building its own result; this
        # future's result() then raises DependencyError too.
        fut._attach(completion, finish, [(i, d) for i, d in enumerate(deps)
                                         if d.completion() in waits] if deps else None)
        self._tail(completion)


_PLAIN = frozenset({bool, int, float, complex, str, np.float64, np.float32, np.complex128,
                    np.complex64, np.int64, np.int32, np.bool_})


def _key(op: Op, fields: dict) -> tuple | None:
    """A call's key in the runtime's prepared calls: the op, the fields' names, each packed
    batch's layout token (its with_data twins share it), each list's signature (its arrays'
    type, dtype and shapes: a list of the same signature is bound without validation) and the
    other fields' values (with their types: True == 1 == 1.0 as dict keys; a small numeric 1-D
    array by its bytes, :func:`_val`); None where an
    operand is neither (a list of mixed types, 1-D arrays, a foreign framework's: validated on
    every call). The key holds the tokens, so a key found is a call on those very layouts."""
    key = [op.name, *fields]
    put = key.append
    for name, v in fields.items():
        t = type(v)
        if t is PackedBatch or t is Views:
            if t is Views:  # a list an earlier call gave: its packed batch (operands.py)
                v = v.batch
            put(own_token(v) if name in op._checked else
                v.__dict__.get("_vb_cache", _NONE).get("layout") or layout_token(v))
        elif v is None:
            put(None)
        elif t in _PLAIN:
            put(t)
            put(v)
        else:
            sig = (list_signature(v) or index_signature(v)) if name in op.operands else _val(v)
            if sig is None or sig is _NOKEY:
                return None
            put(sig)
    return tuple(key)


def _in_place(staged) -> bool:
    """Whether a staged buffer is the caller's list itself (Backend.stage_input)."""
    return bool(staged.__dict__.get("_vb_cache", {}).get("in_place"))


def _new_buffer(b, req, buf):
    """A new output or scratch buffer of ``buf``'s sizes, laid out as its ``form`` field."""
    m, n = buf.shape(req)
    form = getattr(req, buf.form)
    return b.new_buffer(m, n, buf.dtype or form.dtype, output_order(form), not buf.complete)


_NOKEY = object()  # (in a key: an argument that cannot be keyed, as a list of mixed types)


def _own(v: Any) -> Any:
    """An operand whose values validation reads (``Buffer.checked``) in a generated method's
    key: a packed batch's own token (vbatch.core.batch.own_token), else as ``_lay``."""
    if type(v) is Views:
        v = v.batch
    return own_token(v) if type(v) is PackedBatch else _lay(v)


def _lay(v: Any) -> Any:
    """An operand in a generated method's key: its layout token, a list's signature, None or
    _NOKEY."""
    t = type(v)
    if t is Views:
        v, t = v.batch, PackedBatch
    if t is PackedBatch:
        return v.__dict__.get("_vb_cache", _NONE).get("layout") or layout_token(v)
    if v is None:
        return None
    return list_signature(v) or index_signature(v) or _NOKEY


# The largest 1-D numpy array (a per-problem argument, as a partial factor's npiv) a call's key
# holds by value: hashing its bytes costs ~10 us at this size, where a call without a key is
# validated, planned and prepared again (~200 us on a 2-core VM).
KEY_ARRAY_BYTES = 1 << 16


def _val(v: Any) -> Any:
    """Another argument in a generated method's key (with its type: True == 1 as keys); a
    small 1-D numpy array by its dtype and bytes."""
    if v is None:
        return None
    t = type(v)
    if t in _PLAIN:
        return (t, v)
    # (numbers only: an object array's bytes are its elements' addresses, which can recur)
    if t is np.ndarray and v.ndim == 1 and v.dtype.kind in "biuf" and v.nbytes <= KEY_ARRAY_BYTES:
        return (t, v.dtype.str, v.tobytes())
    return _NOKEY


def _bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover - the loop returns


_default: Runtime | None = None
_default_lock = threading.Lock()


def pack(mats: Any, order: str = "C") -> PackedBatch:
    """Copy a list of arrays into one new packed batch (:func:`vbatch.core.batch.pack`), a list
    of device arrays on its device, by one kernel."""
    from vbatch.core.batch import pack as pack_on

    ml = mats if isinstance(mats, MatrixList) else validated(MatrixList, mats=mats)
    backend = None if ml.kind == "numpy" else get_backend("cuda")
    if backend is not None:
        backend.check_dtype(ml.dtype)
    return pack_on(ml, order, backend)


def default_runtime() -> Runtime:
    """The process-wide runtime used by :func:`cholesky` (``device="auto"``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime("auto")
        return _default


def prepare(op: str, **fields: Any) -> Prepared:
    """:meth:`Runtime.prepare` on the default runtime."""
    return default_runtime().prepare(op, **fields)


# The operations' methods and module functions, made from the registry (vbatch.ops.op.caller):
# ``rt.gemm(a, b, ...)`` is ``rt.submit("gemm", a=a, b=b, ...)`` with gemm's signature.
API = tuple(op.api.__name__ for op in public())
_KEYS = {"_lay": _lay, "_own": _own, "_val": _val, "_PB": PackedBatch, "_NONE": _NONE}
for _op in public():
    setattr(Runtime, _op.api.__name__, caller(_op, "self", _KEYS, keyed=True))
    globals()[_op.api.__name__] = caller(_op, "_runtime()",
                                         dict(_KEYS, _runtime=default_runtime), keyed=True)
del _op
