"""The public face: :class:`Runtime`, :class:`Future`, :class:`CholeskyResult`.

A submission goes through the same stages for every operation and backend::

    validate (the op's pydantic request, before any work) -> plan (the op's task graph through
        the scheduler; cached by the batch's size signature) -> stage each buffer the op names
        -> begin -> one backend launch per plan launch -> flush -> end -> Future

On the CPU the stages after planning run on the runtime's worker thread, so a submission returns
at once and ``after=`` dependencies are waited for there. On CUDA they run in the caller's thread
and only enqueue work; dependencies become stream waits on events, and ``Future.result`` is the
single synchronization point, where ``info`` is read back once.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import weakref
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import numpy as np

from vbatch.kernels import Completion, get_backend
from vbatch.core.batch import MatrixList, PackedBatch, Views
from vbatch.ops.cholesky import POTRF, CholeskyResult, read_only  # noqa: F401 - re-exported
from vbatch.ops.posv import PosvResult  # noqa: F401 - re-exported
from vbatch.core.errors import InputError, validated
from vbatch.ops.op import Op
from vbatch.runtime.config import Config
from vbatch.runtime.device import resolve_device
from vbatch.runtime.tune import tuned_options
from vbatch.scheduler.plan import Plan, make_plan

# Plans kept per runtime, by size signature (least recently used dropped first).
PLANS = 64


class _Request:
    """A request built on the hot path from an already validated packed batch (the op's
    pydantic request class is what validates; this only carries the same attributes)."""

    __slots__ = ("batch", "npiv", "overwrite")

    def __init__(self, batch, npiv, overwrite):
        self.batch, self.npiv, self.overwrite = batch, npiv, overwrite


class DependencyError(RuntimeError):
    """A submission could not run because a future it was ordered ``after`` failed."""


_PENDING = object()


class Future:
    """The pending result of one submission. ``result()`` waits and returns the op's result
    (a :class:`CholeskyResult` for ``cholesky``), or raises what the execution raised.

    On the CPU the worker thread fulfils a ``concurrent.futures.Future``. On CUDA the future
    holds the backend's completion (an event) and builds its result on the first ``result()``:
    no thread, no condition variable, on a path whose whole budget is tens of microseconds.
    """

    __slots__ = ("_runtime", "_cf", "_completion", "_finish", "_value", "_error", "_lock",
                 "_deps")

    def __init__(self, runtime: "Runtime", threaded: bool):
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
        # (family, dtype name) -> what `python -m vbatch tune` measured for this machine
        self._tuned = tuned_options(self.backend, self.config)
        self._plans: OrderedDict = OrderedDict()  # size signature -> plan, last used last
        self._seen: dict = {}  # the known-call path's entries (_known)
        # Names this runtime's replay entries in a batch's cache (_replay): an object, not
        # id(self), so that a later runtime at the same address cannot find them.
        self._token = object()
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
        defaults followed by what ``python -m vbatch tune`` measured for it on this machine).

        ``order``: the layout of the batch ("F", "C"; None: not said), where a backend's
        defaults depend on it. One read-only mapping per (op, dtype), the same object for
        every layout whose options are those of ``order=None``; another only where the layout
        changes a default. (Options are set through the :class:`Config` alone.)"""
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
        from vbatch.ops.op import OPS

        families = OPS[op].families if op in OPS else (op,)
        hit = {}
        for fam in families:
            hit.update(self.backend.plan_defaults(fam, dtype, order))
            hit.update(self._tuned.get((fam, dtype.name), {}))
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
        req = validated(POTRF.request, batch=mats, npiv=npiv)
        return self._plan(POTRF, req, req.batch, fast=npiv is None)

    def plan_for(self, op: str, **fields: Any) -> Plan:
        """The plan :meth:`submit` would execute for ``op`` with these fields (for
        inspection): ``rt.plan_for("potrs", l=factors, b=rhs)``."""
        from vbatch.ops.op import OPS

        if op not in OPS:
            raise InputError([(None, f"unknown operation {op!r} (known: {', '.join(OPS)})")],
                             what="submission")
        o = OPS[op]
        req = validated(o.request, **fields)
        return self._plan(o, req, getattr(req, o._ins[0][1]), False)

    def _plan(self, op: Op, req, batch, fast: bool) -> Plan:
        """The plan for ``req``: reused for every submission with the same size signature.
        A packed batch also keeps its own plan for the common call (``fast``: the op's
        parameters at their defaults), found without computing the signature."""
        order = batch.order if type(batch) is PackedBatch else getattr(batch, "packed_order",
                                                                          None)
        opts = self.plan_options(batch.dtype, op.name, order)
        key = ("plan", op.name, id(opts))
        if fast and isinstance(batch, PackedBatch):
            hit = batch.cache().get(key)
            if hit is not None and hit[0] is opts:
                return hit[1]
        sig = (op.name, id(opts), op.signature(req))
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
        if fast and isinstance(batch, PackedBatch):
            batch.cache()[key] = (opts, plan)
        return plan

    # ------------------------------------------------------------------ submission
    def cholesky(
        self,
        mats: Any,
        npiv: Any = None,
        *,
        after: Any = (),
        overwrite: bool = False,
    ) -> Future:
        """Factor a batch: ``mats`` is a list of square arrays or a :class:`PackedBatch`.

        ``npiv`` factors only the first ``npiv[i]`` columns of problem ``i`` and leaves the Schur
        complement in the trailing block. The work starts once every future in ``after`` is done.
        Inputs are left untouched unless ``overwrite=True``. Bad input raises
        :class:`~vbatch.InputError` here, before any work.
        """
        if type(mats) is PackedBatch and npiv is None and (
            overwrite is False or (overwrite is True and not read_only(mats))
        ) and mats.square:
            # Hot path: a packed batch was validated when it was built and its metadata is
            # read-only; nothing else needs checking (pydantic would add ~8 us per call, and
            # even model_construct ~2 us: the request is only read by attribute).
            if type(after) is tuple and not after:
                # Keyed by the array type too: batches made by with_data share one cache, and
                # a host sibling of a device batch takes the general path (it is uploaded).
                replay = mats.__dict__.get("_vb_cache", _NO_CACHE).get(
                    (self._token, overwrite, type(mats.data)))
                if replay is not None:
                    return self._replay(replay, mats, overwrite)
            req = _Request(batch=mats, npiv=mats.n, overwrite=overwrite)
            fast = True
        else:
            req = validated(POTRF.request, batch=mats, npiv=npiv, overwrite=overwrite)
            fast = npiv is None
            if self._coalescer is not None:
                part = self._coalescer.offer(POTRF, req, _deps(after), overwrite)
                if part is not None:
                    return part
        return self._submit(POTRF, req, req.batch, after, overwrite, fast)

    # The BLAS operations and the solves: keyword names as scipy.linalg.blas / lapack.
    def gemm(self, a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
             trans_a: bool = False, trans_b: bool = False, after: Any = (),
             overwrite: bool = False) -> Future:
        """``C := alpha op(A) op(B) + beta C`` per problem (``op``: transposed when asked).
        ``c=None``: a new output. ``result()``: the outputs, in the form of ``c`` (or ``a``)."""
        return self.submit("gemm", after=after, a=a, b=b, c=c, alpha=alpha, beta=beta,
                           trans_a=trans_a, trans_b=trans_b, overwrite=overwrite)

    def syrk(self, a: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
             trans: bool = False, lower: bool = True, after: Any = (),
             overwrite: bool = False) -> Future:
        """``C := alpha op(A) op(A)^T + beta C`` in one triangle of C (the other is C's, or
        zeros for a new output)."""
        return self.submit("syrk", after=after, a=a, c=c, alpha=alpha, beta=beta, trans=trans,
                           lower=lower, overwrite=overwrite)

    def syr2k(self, a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
              trans: bool = False, lower: bool = True, after: Any = (),
              overwrite: bool = False) -> Future:
        """``C := alpha (op(A) op(B)^T + op(B) op(A)^T) + beta C`` in one triangle of C (the
        other is C's, or zeros for a new output)."""
        return self.submit("syr2k", after=after, a=a, b=b, c=c, alpha=alpha, beta=beta,
                           trans=trans, lower=lower, overwrite=overwrite)

    def trsm(self, a: Any, b: Any, *, alpha: float = 1.0, side: str = "left",
             lower: bool = True, trans_a: bool = False, unit_diagonal: bool = False,
             after: Any = (), overwrite: bool = False) -> Future:
        """Solve ``op(A) X = alpha B`` (``side="left"``) or ``X op(A) = alpha B`` for X, A
        triangular. ``result()``: X, in the form of ``b``."""
        return self.submit("trsm", after=after, a=a, b=b, alpha=alpha, side=side, lower=lower,
                           trans_a=trans_a, unit_diagonal=unit_diagonal, overwrite=overwrite)

    def trmm(self, a: Any, b: Any, *, alpha: float = 1.0, side: str = "left",
             lower: bool = True, trans_a: bool = False, unit_diagonal: bool = False,
             after: Any = (), overwrite: bool = False) -> Future:
        """``X = alpha op(A) B`` (``side="left"``) or ``alpha B op(A)``, A triangular."""
        return self.submit("trmm", after=after, a=a, b=b, alpha=alpha, side=side, lower=lower,
                           trans_a=trans_a, unit_diagonal=unit_diagonal, overwrite=overwrite)

    def potrs(self, l: Any, b: Any, *, after: Any = (), overwrite: bool = False) -> Future:  # noqa: E741
        """Solve ``A X = B`` given the Cholesky factors ``l`` of A (lower triangles read), each
        problem with its own number of right-hand sides. ``result()``: X, in the form of b."""
        return self.submit("potrs", after=after, l=l, b=b, overwrite=overwrite)

    def posv(self, a: Any, b: Any, *, after: Any = (), overwrite: bool = False) -> Future:
        """Factor SPD ``A`` and solve ``A X = B``, in one task graph. ``result()``: a
        :class:`~vbatch.PosvResult` (factors, solutions, info; a problem whose factorization
        fails keeps ``B`` as its solution and gets its ``info``)."""
        return self.submit("posv", after=after, a=a, b=b, overwrite=overwrite)

    def submit(self, op: str | Op, *, after: Any = (), **fields: Any) -> Future:
        """Submit any registered operation by name, with its request's fields."""
        from vbatch.ops.op import OPS

        if isinstance(op, str):
            if op not in OPS:
                raise InputError([(None, f"unknown operation {op!r} (known: "
                                         f"{', '.join(OPS)})")], what="submission")
            op = OPS[op]
        key, hit = self._known(op, fields)
        if hit is not None and hit[2] is not None and type(after) is tuple and not after:
            return self._replay_known(op, hit[1], hit[2], fields)
        if hit is not None:
            hit = (_rebuild(op.request, hit[0], fields), hit[1])
        if hit is None:
            req = validated(op.request, **fields)
            if self._coalescer is not None:
                part = self._coalescer.offer(op, req, _deps(after),
                                             bool(fields.get("overwrite", False)))
                if part is not None:
                    return part
            first = getattr(req, op._ins[0][1])
            plan = self._plan(op, req, first, False)
            if key is not None:
                self._remember(key, fields, req, plan)
        else:
            req, plan = hit
            first = getattr(req, op._ins[0][1])
        overwrite = bool(fields.get("overwrite", False))
        fut = self._submit(op, req, first, after, overwrite, False, plan)
        if key is not None and type(after) is tuple and not after and fut._error is None:
            self._learn(key, op, req, overwrite)
        return fut

    # ------------------------------------------------------------------ the known-call path
    # A call whose operands are all packed batches (their metadata is read-only, so validation
    # and planning depend only on which batches they are and on the other fields' values)
    # repeats nothing it did before: the request is rebuilt from the validated fields and the
    # plan is the one found then. Validating a GEMM request through pydantic costs ~24 us and
    # finding its plan by size signature ~38 us (2-core VM, docs/decisions.md#host-known-calls);
    # this path ~3 us. Entries hold the batches weakly, so they never keep device memory alive.
    KNOWN = 256

    def _known(self, op: Op, fields: dict) -> tuple:
        """``(key, hit)``: the call's key (None when it has none: a list operand, say) and, for
        a call seen before with these very batches, ``(request, plan)``."""
        key = [op.name]
        batches = []
        for name, v in fields.items():
            t = type(v)
            if t is Views:  # a list an earlier call gave: its packed batch (operands.py)
                v, t = v.batch, PackedBatch
            if t is PackedBatch:
                key += (name, id(v))
                batches.append(v)
            elif v is None or t in _PLAIN:
                key += (name, t, v)  # the type too: True == 1 == 1.0 as dict keys
            else:
                return None, None
        key = tuple(key)
        hit = self._seen.get(key)
        if hit is None:
            return key, None
        refs, template, plan, recipe = hit
        if len(refs) != len(batches) or any(r() is not b for r, b in zip(refs, batches)):
            return key, None
        if fields.get("overwrite") is True and not all(
                getattr(b.data.flags, "writeable", True) for b in batches):
            return key, None  # the slow path names the read-only operand
        return key, (template, plan, recipe)

    def _remember(self, key: tuple, fields: dict, req, plan: Plan) -> None:
        values = dict(req.__dict__)
        refs = []
        for name, v in fields.items():
            if type(v) is Views:
                v = v.batch
            if type(v) is PackedBatch:
                if values.get(name) is not v:
                    return  # the request made something else of it: not rebuildable
                values[name] = None  # held weakly, put back per call
                refs.append(weakref.ref(v))
        if len(self._seen) >= self.KNOWN:
            self._seen.clear()
        self._seen[key] = (tuple(refs), (values, req.__pydantic_fields_set__), plan, None)

    # ------------------------------------------------------------------ the known-call replay
    # A known call (above) on an asynchronous backend, with nothing to wait for and every
    # operand a packed batch already on the backend's memory, replays what its second run
    # decided: which buffers the kernels read, which outputs to allocate and how, the scalars,
    # and the form of each output. No request, no memory checks, no staging. Measured on the
    # 2-core VM with a null backend (docs/decisions.md#host-known-calls): a GEMM of three packed
    # batches ~15.5 -> ~8 us a call.
    def _learn(self, key: tuple, op: Op, req, overwrite: bool) -> None:
        entry = self._seen.get(key)
        if entry is None or entry[3] is not None:
            return
        recipe = self._recipe(op, req, overwrite)
        if recipe is not None:
            self._seen[key] = entry[:3] + (recipe,)

    def _recipe(self, op: Op, req, overwrite: bool) -> tuple | None:
        """What :meth:`_replay_known` needs to run ``op`` again on operands laid out as
        ``req``'s (the same packed batches, or twins made with ``with_data``), or None where
        a call must take the general path (a list operand, a host one, a synchronous
        backend). Also used by callers that keep their own requests (vbatch.sparse)."""
        if self._pool is not None:
            return None
        b = self.backend
        ins = []
        for name, operand, written in op._ins:
            given = getattr(req, operand)
            if given is None:
                ins.append((name, None))
                continue
            if type(given) is not PackedBatch or given.kind != b.kind:
                return None  # staged (uploaded or gathered) per call
            if written and not overwrite and not given.cache().get(("fits", b.name)):
                return None  # the memory check may have something to say next time
            ins.append((name, operand))
        outs = []
        for name, operand, like, buf in op._outs:
            given = getattr(req, operand)
            if given is None:
                m, n = buf.shape(req)
                form = getattr(req, buf.form)
                if type(form) is not PackedBatch or form.kind != b.kind:
                    return None
                order = form.order if type(form) is PackedBatch else "C"
                outs.append((name, 0, b.buffer_maker(m, n, form.dtype, order, not buf.complete),
                             form.frontend, _list_form(form)))
            elif type(given) is not PackedBatch or given.kind != b.kind:
                return None
            elif overwrite:
                outs.append((name, 2, like, None, _list_form(given)))
            else:
                outs.append((name, 1, like, given.frontend, _list_form(given)))
        scalars = op.scalars(req) if op.scalars is not None else None
        return tuple(ins), tuple(outs), scalars

    def _replay_known(self, op: Op, plan: Plan, recipe: tuple, fields: dict) -> Future:
        b = self.backend
        ins, outs, scalars = recipe
        staged: dict = {}
        for name, field in ins:
            if field is None:
                staged[name] = None
            else:
                v = fields[field]
                staged[name] = v.batch if type(v) is Views else v
        try:
            for name, how, arg, _, _ in outs:
                if how == 0:
                    staged[name] = arg()
                elif how == 1:
                    staged[name] = b.new_output(staged[arg])
                else:
                    staged[name] = staged[arg]
            completion = b.run(plan, staged, self.config, scalars)
        except BaseException as exc:  # noqa: BLE001 - delivered through the future, as _run_async
            fut = Future(self, threaded=False)
            fut._fail(exc)
            return fut
        fut = Future(self, threaded=False)  # (after the launch: the GPU's work hides it)
        result = op.result

        def finish(info: np.ndarray):
            out = {}
            for name, how, _, frontend, listed in outs:
                work = b.batch_of(staged[name])
                if how != 2:
                    work = work.with_frontend(frontend)
                out[name] = _give(work, listed)
            return result(out, info, plan)

        fut._completion, fut._finish = completion, finish
        with self._lock:
            self._tails[completion.queue] = completion
        return fut

    def _submit(self, op: Op, req, batch, after, overwrite: bool, fast: bool,
                plan: Plan | None = None) -> Future:
        deps = [] if type(after) is tuple and not after else _deps(after)
        for d in deps:
            settle = getattr(d, "_settle", None)  # a coalesced member still in its bucket
            if settle is not None:
                settle()
        if op is POTRF:
            self._check_memory(batch, overwrite)
        else:
            for _, operand, written in op._ins:
                given = getattr(req, operand)
                if given is not None:
                    self._check_memory(given, overwrite, written)
        if plan is None:
            plan = self._plan(op, req, batch, fast)
        fut = Future(self, threaded=self._pool is not None)
        job = (fut, op, req, overwrite, plan, deps)
        if self._pool is not None:
            self._pool.submit(self._run_sync, *job)
        else:
            self._run_async(*job)
            if (fast and op is POTRF and not deps and type(batch) is PackedBatch
                    and batch.kind == self.backend.kind and fut._error is None):
                batch.cache()[(self._token, overwrite, type(batch.data))] = _Replay(plan)
        return fut

    # ------------------------------------------------------------------ the replay path
    # A packed batch factored again on an asynchronous backend, with nothing to wait for:
    # everything the general path decides (request, checks, plan, staging, the form of the
    # result) was decided by the first such call and cannot have changed (a packed batch's
    # layout is read-only), so the call is an output buffer, the backend's launch and a future.
    # The general path costs ~11 us of Python per call before the backend (2-core VM, a null
    # backend: docs/decisions.md#host-packed-replay); this one ~5 us (6.6 against 11.5 us a call,
    # the stub's own ~2 us in both). Asynchronous backends only: on the CPU a call is a job on the
    # runtime's worker thread, whose cost is the work itself.
    def _replay(self, entry: "_Replay", batch: PackedBatch, overwrite: bool) -> Future:
        # The launch first, then the Python objects of the call (the output's batch, the
        # future, the finisher), which the GPU's work then hides. From the second replay of an
        # entry the backend's fire() takes only the buffers' arrays (Backend.replayer).
        b, plan = self.backend, entry.plan
        try:
            data = batch.data
            fire = entry.fire
            completion = None
            if fire:
                out_data = data if overwrite else b.new_data(data)
                completion = fire((data, out_data))
                if completion is not None:
                    out = batch if overwrite else batch.with_data(out_data)
            if completion is None:
                out = batch if overwrite else b.new_output(batch)
                buffers = {"a": batch, "l": out}
                if fire is None:  # (before the run: what it raises, the run would)
                    entry.fire = b.replayer(plan, buffers, self.config)
                completion = b.run(plan, buffers, self.config)
        except BaseException as exc:  # noqa: BLE001 - delivered through the future, as _run_async
            fut = Future(self, threaded=False)
            fut._fail(exc)
            return fut
        fut = Future(self, threaded=False)
        # The factors in the caller's form, made while the GPU works: only info waits for it.
        f = out if overwrite else out.with_frontend(batch.frontend)
        factors = _give(f, _list_form(batch))
        fut._completion = completion
        fut._finish = lambda info: CholeskyResult(factors, info, plan)
        with self._lock:
            self._tails[completion.queue] = completion
        return fut

    def _check_memory(self, batch, overwrite: bool, written: bool = True) -> None:
        """Refuse, before any work, a batch the backend's memory cannot stage: a problem whose
        own matrix is larger than the whole memory, or a batch larger than what is free."""
        b = self.backend
        packed = type(batch) is PackedBatch
        if packed and batch.cache().get(("fits", b.name)):
            return  # known small against the whole memory (neither changes)
        if packed and (overwrite or not written) and batch.kind == b.kind:
            return  # an input on this backend's memory is read (or overwritten) where it is
        isz = batch.dtype.itemsize
        if packed:
            # One that is written (an output takes its layout) needs a copy.
            staged = batch.data.size * isz
        else:
            staged = int((np.maximum(batch.m, 1) * batch.n).sum()) * isz
        total = b.memory_total()
        # Cheap on the hot path: the free memory is asked only for a batch that is a large
        # part of the whole.
        if not total or staged * 4 <= total:
            if packed and staged == batch.data.size * isz:  # the largest it can stage
                batch.cache()[("fits", b.name)] = True
            return
        where = f"{b.memory_name} memory"
        need = batch.m.astype(np.float64) * batch.n * isz
        big = [(int(i), f"n = {batch.n[i]} needs {_bytes(need[i])} ({batch.n[i]}^2 x {isz} "
                        f"bytes), more than the {_bytes(total)} of {where}")
               for i in np.flatnonzero(need > total)]
        if big:
            raise InputError(big)
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
        with self._lock:
            tails = list(self._tails.values())
        for c in tails:
            c.sync()

    def close(self) -> None:
        if self._coalescer is not None:
            self._coalescer.close()
        self.wait()
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
            staged[name] = None if given is None else b.stage_input(given, overwrite and written)
        lists = None
        for name, operand, like, buf in op._outs:
            given = getattr(req, operand)
            if given is None:  # a new output (GEMM without c): laid out from its sizes
                m, n = buf.shape(req)
                form = getattr(req, buf.form)
                order = form.order if type(form) is PackedBatch else "C"
                staged[name] = b.new_buffer(m, n, form.dtype, order, not buf.complete)
            else:
                staged[name] = staged[like] if overwrite else b.new_output(staged[like])
                if type(given) is MatrixList:
                    lists = lists or {}
                    lists[name] = given
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
                given = getattr(req, operand)
                work = b.batch_of(staged[name])
                if given is None:
                    form = getattr(req, buf.form)
                    exported = b.export(work, form.kind).with_frontend(form.frontend)
                    out[name] = _give(exported, _list_form(form))
                elif type(given) is MatrixList:
                    if overwrite:
                        if not device_writeback:
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

    def _run_sync(self, fut: Future, op, req, overwrite: bool, plan: Plan, deps: list) -> None:
        try:
            for i, d in enumerate(deps):
                exc = d.exception()
                if exc is not None:
                    raise DependencyError(f"after[{i}] failed: {exc!r}") from exc
            completion, finish = self._execute(op, req, overwrite, plan, [])
            fut._cf.set_result(finish(completion.wait()))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            fut._cf.set_exception(exc)

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
        with self._lock:
            self._tails[completion.queue] = completion


_NO_CACHE: dict = {}


class _Replay:
    """A packed batch's replay entry (Runtime._replay): its plan and, once the backend has
    one for it (Backend.replayer), the backend's ``fire``."""

    __slots__ = ("plan", "fire")

    def __init__(self, plan: Plan):
        self.plan, self.fire = plan, None


def _deps(after: Any) -> list:
    """``after=`` as a list of futures; anything else is named before any work."""
    deps = list(after) if isinstance(after, (list, tuple)) else [after]
    bad = [(None, f"after[{i}] is a {type(d).__name__}, not a vbatch.Future")
           for i, d in enumerate(deps) if not isinstance(d, Future)]
    if bad:
        raise InputError(bad, what="submission")
    return deps


_PACKED = object()  # (_list_form: an operand that came as a packed batch)


def _list_form(form):
    """The form of an operand's outputs: :data:`_PACKED` for a packed batch, else (a list, or
    the Views an earlier call gave for one: outputs go back as a list too) which of its
    problems came as 1-D arrays (None: none; ``MatrixList.vector``)."""
    if type(form) is MatrixList:
        return form.vector
    if "_vb_views" in form.__dict__:
        return form.__dict__.get("_vb_vector")
    return _PACKED


def _give(work: PackedBatch, form):
    """``work`` in the form :func:`_list_form` said."""
    return work if form is _PACKED else Views(work, form)


_PLAIN = frozenset({bool, int, float, str, np.float64, np.float32, np.int64, np.int32,
                    np.bool_})


def _rebuild(cls, template: tuple, fields: dict):
    """A request of ``cls`` from a validated one's fields (``template``), the batches of this
    call put back in: what pydantic's model_construct does, without its per-field work."""
    values, fields_set = template
    values = dict(values)
    for name, v in fields.items():
        if type(v) is Views:
            v = v.batch
        if type(v) is PackedBatch:
            values[name] = v
    new = cls.__new__(cls)
    object.__setattr__(new, "__dict__", values)
    object.__setattr__(new, "__pydantic_fields_set__", fields_set)
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new


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
    return pack_on(ml, order, None if ml.kind == "numpy" else get_backend("cuda"))


def default_runtime() -> Runtime:
    """The process-wide runtime used by :func:`cholesky` (``device="auto"``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime("auto")
        return _default


def cholesky(mats: Any, npiv: Any = None, *, after: Any = (), overwrite: bool = False) -> Future:
    """:meth:`Runtime.cholesky` on the default runtime."""
    return default_runtime().cholesky(mats, npiv, after=after, overwrite=overwrite)


def gemm(a: Any, b: Any, c: Any = None, **kw: Any) -> Future:
    """:meth:`Runtime.gemm` on the default runtime."""
    return default_runtime().gemm(a, b, c, **kw)


def syrk(a: Any, c: Any = None, **kw: Any) -> Future:
    """:meth:`Runtime.syrk` on the default runtime."""
    return default_runtime().syrk(a, c, **kw)


def syr2k(a: Any, b: Any, c: Any = None, **kw: Any) -> Future:
    """:meth:`Runtime.syr2k` on the default runtime."""
    return default_runtime().syr2k(a, b, c, **kw)


def trsm(a: Any, b: Any, **kw: Any) -> Future:
    """:meth:`Runtime.trsm` on the default runtime."""
    return default_runtime().trsm(a, b, **kw)


def trmm(a: Any, b: Any, **kw: Any) -> Future:
    """:meth:`Runtime.trmm` on the default runtime."""
    return default_runtime().trmm(a, b, **kw)


def potrs(l: Any, b: Any, **kw: Any) -> Future:  # noqa: E741 - LAPACK's name
    """:meth:`Runtime.potrs` on the default runtime."""
    return default_runtime().potrs(l, b, **kw)


def posv(a: Any, b: Any, **kw: Any) -> Future:
    """:meth:`Runtime.posv` on the default runtime."""
    return default_runtime().posv(a, b, **kw)
