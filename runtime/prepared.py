"""A prepared call: one operation validated and planned once, run as often as wanted.

    p = rt.prepare("gemm", a=a, b=b, alpha=2.0)   # validates and plans, here
    f1 = p.run()                                   # the operands it was prepared with
    f2 = p.run(b=b2, after=[f1])                   # b rebound to new data of the same sizes

Every call goes through one: ``rt.gemm(...)`` finds the prepared call of its operation,
parameters and packed batches (by layout) in the runtime's cache, or prepares one. A run takes
one of two roads, by what the call's first run found (never by operation):

* **replay**: with nothing to wait for, every operand a packed batch of the prepared layout in
  the backend's memory, on an asynchronous backend (or on a synchronous one, a call small enough
  to run in the caller's thread, with nothing queued): the backend's ``fire`` (or ``run``) on
  the operands' arrays, the outputs allocated as the first run allocated them. No request, no
  check, no staging (docs/decisions.md#host-prepared-calls);
* **staged**: the request (put together without validation where every operand is a packed
  batch of the prepared layout or a list of the prepared signature, else validated), memory
  checks, ``after=``, staging (a list gathered, a host batch uploaded), the plan's launches
  (``Runtime._submit``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vbatch.core.batch import (MatrixList, PackedBatch, Views, layout_token, list_signature,
                                own_token, pack)
from vbatch.core.errors import InputError, constructed, validated
from vbatch.ops.op import replaced
from vbatch.runtime.future import Future

_PACKED = object()  # (_list_form: an operand that came as a packed batch)
_NONE: dict = {}


def staged_bytes(batch: PackedBatch | MatrixList) -> int:
    """The bytes a copy of ``batch`` takes on a backend (a packed one's whole buffer, a list's
    matrices back to back, an empty one of n columns counted as one row)."""
    if type(batch) is PackedBatch:
        return batch.data.size * batch.dtype.itemsize
    return int((np.maximum(batch.m, 1) * batch.n).sum()) * batch.dtype.itemsize


def unasked(staged: int, total: int) -> bool:
    """Whether a copy of ``staged`` bytes is one the memory check passes without asking the
    backend what is free (a quarter of its ``total`` memory at most; any, where it reports
    none)."""
    return not total or staged * 4 <= total


def output_order(form: PackedBatch | MatrixList) -> str:
    """The order of a new output laid out for ``form``: a packed batch's own, row-major for a
    list."""
    return form.order if type(form) is PackedBatch else "C"


class _ListLayout:
    """What a prepared call keeps of a list operand to bind a later list of the same
    :func:`~vbatch.core.batch.list_signature` without validating it: the signature, and the
    description a twin of it takes (its sizes, dtype, kind and staged order), not the
    arrays."""

    __slots__ = ("sig", "template")

    def __init__(self, sig: tuple, ml: MatrixList):
        self.sig = sig
        self.template = ml.twin([]), ml.packed_order

    def bind(self, mats: Any, known: bool, written: bool) -> MatrixList | None:
        """``mats`` as a validated list of this signature (``known``: the call's key held it,
        so it was compared already), or None: another signature, another staged order (device
        arrays of other strides), or read-only arrays the call writes (``written``: validation
        names them)."""
        if not known and list_signature(mats) != self.sig:
            return None
        ml, order = self.template
        ml = ml.twin(mats)
        if ml.addr is not None and ml.packed_order != order:
            return None
        if written and ml.kind == "numpy" and not all(a.flags.writeable for a in ml.mats):
            return None
        return ml


class Prepared:
    """One call of ``op``, validated and planned (:meth:`Runtime.prepare`).

    ``run(**operands)`` runs it, each named operand rebound to new data of the same sizes and
    dtype (a list or a packed batch, either); other sizes are an :class:`~vbatch.InputError`
    naming the problem and operand, never a new plan. ``after=`` and ``overwrite=`` are per
    run. ``plan`` is the plan every run executes."""

    __slots__ = ("runtime", "op", "plan", "_req", "_values", "_fset", "_operands", "_written",
                 "_layout", "_sizes", "_sig", "_overwrite", "_scalars", "_replay", "_fire")

    def __init__(self, runtime: Any, op: Any, req: Any, plan: Any, keep: bool = True):
        self.runtime, self.op, self.plan = runtime, op, plan
        self._operands = tuple(dict.fromkeys(operand for _, operand, _ in op._ins))
        self._written = frozenset(operand for _, operand, w in op._ins if w)
        self._overwrite = bool(getattr(req, "overwrite", False))
        # (what a rebinding is checked against: only a kept call validates one)
        self._sig = op.signature(req) if keep else None
        self._scalars = op.scalars(req) if op.scalars is not None else None
        values = dict(req.__dict__)
        layout, sizes = {}, {}
        for name in self._operands:
            v = values[name]
            if v is not None:
                sizes[name] = (v.m, v.n, v.dtype)
            if type(v) is PackedBatch:
                layout[name] = own_token(v) if name in op._checked else layout_token(v)
            elif type(v) is MatrixList and v.vector is None and v.frontend is None:
                sig = list_signature(v.mats)
                if sig is not None:  # (a later list of this signature: a twin of v)
                    layout[name] = _ListLayout(sig, v)
            values[name] = None  # held by the request of a kept call only
        self._values, self._fset = values, req.__pydantic_fields_set__
        self._layout, self._sizes = layout, sizes
        # A call kept by its caller holds its operands; the runtime's cache does not (an entry
        # must not keep device memory alive), so its runs name every operand.
        self._req = req if keep else None
        self._replay: Any = None  # the replay road (_learn); False: this call never replays
        self._fire: Any = None  # the backend's replayer, made on the first replay

    def __repr__(self) -> str:
        return (f"Prepared({self.op.name}, {len(self.plan.launches)} launches, "
                f"operands {', '.join(self._operands)})")

    # ------------------------------------------------------------------ public
    def run(self, *, after: Any = (), overwrite: bool | None = None, **operands: Any) -> Future:
        """Run the call: the operands it was prepared with, or those named here (the same
        sizes and dtype). ``overwrite``: None keeps the prepared value."""
        bad = [n for n in operands if n not in self._operands]
        if bad:
            raise InputError([(None, f"{n!r} is not an operand of {self.op.name} (operands: "
                                     f"{', '.join(self._operands)}); its other fields are fixed "
                                     "when the call is prepared") for n in bad], what="run")
        given = {n: getattr(self._req, n) for n in self._operands}
        given.update(operands)
        ow = self._overwrite if overwrite is None else bool(overwrite)
        return self._call(given, after, ow)

    # ------------------------------------------------------------------ the two roads
    def _call(self, given: dict, after: Any, ow: bool, known: bool = False) -> Future | None:
        """A run on ``given`` (every operand by name). Called by the runtime's cache with
        ``given`` the call's fields (``known``: found by its layouts): None there when an
        operand cannot be bound (the runtime then prepares anew)."""
        same = ow == self._overwrite
        replay = self._replay if same and type(after) is tuple and not after else None
        if replay and known:  # (the layouts are known: nothing to bind first)
            fut = replay(given, ow)
            if fut is not None:
                return fut
            replay = None
        batches = self._bind(given, ow, known) if same else None
        if batches is not None:
            if replay:
                fut = replay(batches, ow)
                if fut is not None:
                    return fut
            req = _rebuild(self.op.request, (self._values, self._fset), batches)
        elif self._req is None:
            return None
        elif same and all(given[n] is getattr(self._req, n)
                                           for n in self._operands):
            req = self._req  # the operands it was prepared with (a list's, say)
        else:
            fields = dict(self._values)
            fields.update((n, given[n]) for n in self._operands)
            fields["overwrite"] = ow
            req = validated(self.op.request, **fields)
            self._check_sizes(req)
        return self._staged(req, after, ow)

    def _bind(self, given: dict, ow: bool, known: bool) -> dict | None:
        """The operands as packed batches of the prepared layouts (a list's views as their
        batch), or None where one is not (or is read-only and would be overwritten).
        ``known``: the caller found this call by a key holding the operands' layout tokens,
        so their layouts are known to be the prepared ones."""
        out = {}
        layout = self._layout
        convert = self.op._convert
        for name in self._operands:
            v = given.get(name)
            lay = layout.get(name)
            if name in convert and type(v) in (list, tuple):
                v = convert[name](v, out)  # (its values checked: InputError at call time)
            if v is None:
                if lay is not None or name in self._sizes:
                    return None
                out[name] = None
                continue
            if type(lay) is _ListLayout:
                v = (lay.bind(v, known, ow and name in self._written)
                     if type(v) in (list, tuple) else None)
                if v is None:
                    return None
                out[name] = v
                continue
            if type(v) is Views:
                v = v.batch
            if lay is None or type(v) is not PackedBatch or not known and (
                    own_token(v) if name in self.op._checked else
                    v.__dict__.get("_vb_cache", _NONE).get("layout") or layout_token(v)
            ) is not lay:
                return None
            if ow and not getattr(v.data.flags, "writeable", True):
                return None  # validation names the read-only operand
            out[name] = v
        return out

    def _staged(self, req: Any, after: Any, ow: bool) -> Future:
        rt = self.runtime
        fut = rt._submit(self.op, req, after, ow, self.plan)
        if (self._replay is None and fut._error is None and ow == self._overwrite
                and type(after) is tuple and not after):
            self._replay = self._learn(req, ow) or False
        return fut

    def _learn(self, req: Any, ow: bool) -> Any:
        """The replay of runs on operands of this layout (:func:`_replayer`), made from a
        recipe: per input buffer its operand, per output how it is made (0: a new buffer of its
        sizes, 1: a new buffer laid out as the input it replaces, 2: that input itself) and the
        operand whose form it comes back in (None: a scratch buffer, not given back). None
        where a run must be staged (a list or host operand, a batch the memory check may
        refuse, a call a synchronous backend hands to its worker thread)."""
        rt = self.runtime
        b = rt.backend
        if not b.asynchronous and not rt._small(self.op, req, self.plan):
            return None
        ins, lists = [], set()
        total = b.memory_total()
        for name, operand, written in self.op._ins:
            given = getattr(req, operand)
            if given is None:
                ins.append((name, None))
                continue
            if type(given) is MatrixList:
                # A list of the prepared signature, gathered into a buffer of its staged
                # layout as staging does (lists written in place are staged: a device list is
                # then written where it lies); only where its copy is one the memory check
                # passes without asking what is free.
                if (type(self._layout.get(operand)) is not _ListLayout or given.kind != b.kind
                        or written and ow or not unasked(staged_bytes(given), total)):
                    return None
                lists.add(operand)
            elif type(given) is not PackedBatch or given.kind != b.kind:
                return None
            elif written and not ow and not given.cache().get(("fits", b.name,
                                                               given.dtype.itemsize)):
                return None
            ins.append((name, operand))

        def maker(buf):  # a new buffer laid out from its sizes, as staging lays it out
            form = getattr(req, buf.form)
            if type(form) not in (PackedBatch, MatrixList) or form.kind != b.kind:
                return None
            return b.buffer_maker(*buf.shape(req), buf.dtype or form.dtype, output_order(form),
                                  not buf.complete)

        outs = []
        for name, operand, _, buf in self.op._outs:
            if replaced(req, operand) is not None:  # (it replaces its operand's input)
                outs.append((name, 2 if ow else 1, operand, operand))
                continue
            outs.append((name, 0, maker(buf), buf.form))
        outs += [(buf.name, 0, maker(buf), None) for buf in self.op._scratch]  # (not given back)
        inputs = {o for _, o in ins}
        if any(how == 0 and make is None or form is not None and form not in inputs
               for _, how, make, form in outs):
            return None
        o = next(o for _, o in ins if o is not None)  # (the backend's kind of array)
        kind = type(getattr(req, o).mats[0] if o in lists else getattr(req, o).data)
        return _replayer(self, ins, outs, kind, lists)

    def _first(self, datas: tuple, buffers: dict) -> Any:
        """A replay's launch where the backend's ``fire`` has not been made yet (made here,
        before the run: what it raises, the run would) or cannot take it (then run on the
        buffers' batches, by name in the order of ``datas``)."""
        rt = self.runtime
        b = rt.backend
        if self._fire is None:
            self._fire = b.replayer(self.plan, buffers, rt.config, self._scalars) or False
            if self._fire:
                done = self._fire(datas)
                if done is not None:
                    return done
        return b.run(self.plan, buffers, rt.config, self._scalars)

    def _failed(self, exc: BaseException) -> Future:
        fut = Future(self.runtime, threaded=False)
        fut._fail(exc)
        return fut

    def _check_sizes(self, req: Any) -> None:
        """Operands rebound to other sizes or dtype than prepared: named, problem by problem."""
        if self.op.signature(req) == self._sig and all(
                getattr(req, n).dtype == s[2] for n, s in self._sizes.items()):
            return
        problems = []
        for name in self._operands:
            v, s = getattr(req, name), self._sizes.get(name)
            if v is None or s is None:
                if (v is None) != (s is None):
                    problems.append((None, f"{name}: prepared {'with' if s else 'without'} "
                                           "it, run " + ("without" if s else "with") + " it"))
                continue
            m, n, dtype = s
            if v.dtype != dtype:
                problems.append((None, f"{name} is {v.dtype}; prepared for {dtype}"))
            elif v.k != len(m):
                problems.append((None, f"{name} has {v.k} problems; prepared for {len(m)}"))
            else:
                for i in np.flatnonzero((v.m != m) | (v.n != n))[:20].tolist():
                    problems.append((i, f"{name} is {v.m[i]} x {v.n[i]}; prepared for "
                                        f"{m[i]} x {n[i]} (prepare another call for other "
                                        "sizes)"))
        raise InputError(problems or [(None, "the call's sizes differ from the prepared ones")],
                         what="run")


_CODE: dict = {}  # a replay's source -> its compiled code (one per shape of call)


def _replayer(p: Prepared, ins: tuple, outs: tuple, kind: Any, lists: set) -> Any:
    """``replay(given, ow) -> Future | None``: the replay road of ``p`` on ``given`` (operand ->
    a packed batch of the prepared layout, or the views of one; for an operand in ``lists``, a
    list of the prepared signature, bound or not), None where it cannot take it (an operand
    elsewhere, or read-only and to be overwritten). A list is gathered into a buffer of its
    staged layout, as staging does, and its outputs come back as lists (a new buffer for the
    output that replaces it, as staging gives: what a failed problem leaves is the same on
    both roads).

    Written as straight-line source from the recipe (``ins``, ``outs``: Prepared._learn), as
    the runtime's methods are (vbatch.ops.op.caller): the same steps for every op, without a
    loop over the buffers on a road whose whole budget is a few microseconds
    (docs/decisions.md#host-prepared-calls). The launch comes first, on the buffers' arrays
    alone; then the Python objects of the call (the outputs' batches, the future), which the
    GPU's work then hides."""
    rt = p.runtime
    ns = {"Views": Views, "kind": kind, "new_data": rt.backend.new_data, "p": p, "rt": rt,
          "MatrixList": MatrixList, "pack": pack, "backend": rt.backend,
          "Future": Future, "give": _give, "form": _list_form, "result": p.op.result,
          "plan": p.plan, "tails": rt._tails}
    var: dict = {}  # operand -> the variable of its batch
    shape: dict = {}  # operand -> the variable of what gives its outputs their form
    src = ["def replay(given, ow):"]
    if not rt.backend.asynchronous:
        # A synchronous backend runs a call in the caller's thread only while nothing is
        # queued on its worker (Runtime._submit); else the call is staged, behind the queue.
        src += ["    if rt._queued or rt._closed:", "        return None"]
    gather = []  # (in the try below: what gathering raises, the future carries)
    for _, o in ins:
        if o is None or o in var:
            continue
        v = var[o] = f"v{len(var)}"
        if o in lists:
            ml = shape[o] = f"m{v}"
            ns[f"lay{v}"] = p._layout[o]
            src += [f"    {ml} = given[{o!r}]",
                    f"    if type({ml}) is not MatrixList:",  # (not bound yet: the call's key
                    f"        if type({ml}) is not list and type({ml}) is not tuple:",  # held
                    "            return None",  # its signature)
                    f"        {ml} = lay{v}.bind({ml}, True, False)",
                    f"        if {ml} is None:",
                    "            return None"]
            gather.append(f"        {v} = pack({ml}, {ml}.packed_order, backend)")
            continue
        shape[o] = v
        src += [f"    {v} = given[{o!r}]"]
        if o in p.op._convert:  # (checked and packed again: InputError at call time)
            ns[f"conv{v}"] = p.op._convert[o]
            before = ", ".join(f"{q!r}: {shape[q]}" for q in shape if q != o)
            src += [f"    if type({v}) is list or type({v}) is tuple:",
                    f"        {v} = conv{v}({v}, {{{before}}})"]
        src += [f"    if type({v}) is Views:",  # (a list an earlier call gave: its batch)
                f"        {v} = {v}.batch",
                f"    if type({v}.data) is not kind or ow and not getattr({v}.data.flags, "
                "'writeable', True):",
                "        return None"]
    datas = ["None" if o is None else f"{var[o]}.data" for _, o in ins]
    buffers = [f"{name!r}: " + ("None" if o is None else var[o]) for name, o in ins]
    make, back = [], []
    for j, (name, how, arg, form) in enumerate(outs):
        if how == 0:  # (the bare array first; its batch after the launch)
            ns[f"tmpl{j}"], ns[f"alloc{j}"] = arg
            make.append(f"        o{j} = alloc{j}()")
            datas.append(f"o{j}")
            buffers.append(f"{name!r}: tmpl{j}.with_data(o{j})")
            work = (f"tmpl{j}.with_data(o{j}).with_frontend({shape[form]}.frontend)" if form
                    else None)
        elif how == 1:
            make.append(f"        o{j} = new_data({var[arg]}.data)")
            datas.append(f"o{j}")
            buffers.append(f"{name!r}: {var[arg]}.with_data(o{j})")
            work = f"{var[arg]}.with_data(o{j})"
        else:
            datas.append(f"{var[arg]}.data")
            buffers.append(f"{name!r}: {var[arg]}")
            work = var[arg]
        if work is not None:
            back.append(f"{name!r}: give({work}, form({shape[form]}))")
    src += ["    try:", *gather, *make,
            f"        datas = ({', '.join(datas)},)",
            "        fire = p._fire",
            "        c = fire(datas) if fire else None",
            "        if c is None:",
            f"            c = p._first(datas, {{{', '.join(buffers)}}})",
            # (a synchronous backend works in the caller's thread: Ctrl-C there is the
            # caller's, as on the staged road, Runtime._run_sync)
            f"    except {'BaseException' if rt.backend.asynchronous else 'Exception'} as exc:"
            "  # noqa: BLE001 - delivered through the future",
            "        return p._failed(exc)",
            f"    out = {{{', '.join(back)}}}",
            "    fut = Future(rt, threaded=False)",
            "    fut._completion = c",
            "    fut._finish = lambda info: result(out, info, plan)",
            "    tails[c.queue] = c  # (Runtime._tail)",
            "    return fut"]
    text = "\n".join(src) + "\n"
    code = _CODE.get(text)
    if code is None:
        code = _CODE[text] = compile(text, "<vbatch replay>", "exec")
    exec(code, ns)  # noqa: S102 - the source is built above from an op's registered buffers
    return ns["replay"]


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


def _rebuild(cls, template: tuple, fields: dict):
    """A request of ``cls`` from a validated one's fields (``template``), the batches of this
    call put back in, validating nothing."""
    values, fields_set = template
    values = dict(values)
    for name, v in fields.items():
        if type(v) is Views:
            v = v.batch
        if type(v) is PackedBatch or type(v) is MatrixList:
            values[name] = v
    return constructed(cls, values, fields_set)
