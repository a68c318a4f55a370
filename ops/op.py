"""What an operation is, to the rest of vbatch.

An operation module (``ops/<name>.py``) defines one :class:`Op`:

* ``request(...)``: the pydantic request that validates a submission (operands as lists or packed
  batches, with the op's shape rule) and names the problem and operand of anything wrong;
* ``buffers``: the buffers its kernels address, in order: the inputs read and the outputs
  written, each output laid out like the input it replaces (``like``) and written in place when
  the caller asks to overwrite;
* ``graph(request, options)``: its tasks as a :class:`~vbatch.core.graph.TaskGraph`, from
  the sizes and parameters alone (so a plan is reused for every batch with the same signature);
* ``signature(request)``: those sizes and parameters as a hashable key;
* a numpy/LAPACK reference, used by the tests;
* ``api``: its public signature and docstring, written once as a function with no body (its
  parameters are the request's fields; ``fields`` renames the few that differ). ``Runtime``
  methods, module functions and ``vbatch.distributed.Runtime`` methods are generated from it
  (:func:`caller`), so ``help(rt.gemm)`` and ``inspect.signature(rt.gemm)`` show it;
* ``example``: a batch of problems of given sizes for the conformance suite
  (``tests/test_conformance.py``), with the reference each output is checked against;
* ``returns``: which fields of its result are outputs, and of which buffer (``factors`` is
  ``l``), the main one first: ``vbatch.distributed`` leaves them on the workers by that name.

The kinds its graph uses live in the same module (:mod:`vbatch.core.kinds`); the kernels that run
them live in ``kernels/<family>_cpu.py`` and ``kernels/<family>_cuda.py``. Every module of this
package is imported with it, so adding an operation is adding those files: nothing else lists
the operations.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

OPS: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Buffer:
    """A buffer the kernels of an op address.

    An input's ``operand`` is the request field it comes from (``None`` there: the buffer is
    absent, its pointer null, as GEMM's ``c``). An output's ``operand`` is the input it replaces:
    it takes that input's layout and, when the caller overwrites, its memory. Where that input is
    absent, the output is new: ``shape(request) -> (m, n)`` gives its sizes and it comes back in
    the form of the request field ``form`` (a list for a list, ...). ``complete``: the op's
    kernels write every element of such a new output that is ever read (all of an output the
    caller gets; of the sparse ops' counters, those their reset zeroes for the kernels, not the
    padding), so it need not be zeroed first.
    ``scratch``: a new buffer of ``shape(request)`` the kernels work in and the caller never
    sees (no operand; laid out as the field ``form``'s batch). ``dtype``: a new output or
    scratch buffer of this dtype instead of the form's (GETRF's int32 pivots). ``convert``: an
    input the request also takes as a list of 1-D integer arrays, which it checks and packs
    (GETRS's pivots): ``convert(value, operands) -> PackedBatch``, ``operands`` the call's
    operands before this one, bound (a packed batch or a validated list). A call's key holds
    such a list by its arrays' lengths, so a known call converts it again, its values checked
    as on the first call."""

    name: str
    operand: str | None
    output: bool = False
    shape: Callable[[Any], tuple] | None = None
    form: str | None = None
    complete: bool = False
    scratch: bool = False
    dtype: str | None = None
    convert: Callable[[Any, dict], Any] | None = None
    # Validation reads its values (the solve's rows): a call on it is kept for that batch and
    # its twins only, never found by another batch of an equal layout, whose values would then
    # go unchecked (vbatch.core.batch.own_token).
    checked: bool = False


@dataclass(frozen=True)
class Op:
    """One operation (module docstring). ``scalars(request) -> dict`` gives the call's
    floating-point parameters (``alpha``, ``beta``): kernels read them per call, so one plan and
    one CUDA graph serve every value. ``result(outputs, info, plan)`` builds what ``Future.result``
    returns from the outputs, each in the caller's form."""

    name: str
    request: type
    buffers: tuple[Buffer, ...]
    graph: Callable[[Any, dict], Any]
    signature: Callable[[Any], tuple]
    result: Callable[[dict, Any, Any], Any] | None = None
    scalars: Callable[[Any], dict] | None = None
    # The kernel families its tasks use (the kernel modules kernels/<family>_<backend>.py);
    # the planner's options are theirs, merged. Default: the op's own name.
    families: tuple[str, ...] = ()
    doc: str = ""
    # Its public signature and docstring (module docstring); None: internal (vbatch.sparse's).
    api: Callable | None = None
    # api parameter -> request field, where they differ (cholesky's ``mats`` is ``batch``).
    fields: tuple[tuple[str, str], ...] = ()
    # ``example(rng, sizes) -> Example``: problems of these sizes for the conformance suite.
    example: Callable | None = None
    # The fields of ``result``'s object that are outputs, as (field, buffer) pairs, the main one
    # first (what ``vbatch.distributed``'s ``Future.output()`` gives); empty where the result
    # is the one output itself (the BLAS ops).
    returns: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        # What staging a submission needs, computed once (it runs on every call's hot path):
        # the inputs as (buffer, operand, written when overwriting), the outputs as (buffer,
        # operand, the input buffer whose layout it takes, the Buffer; an output of no operand
        # is always new, and takes none).
        ins = self.inputs()
        outs = tuple(b for b in self.outputs() if not b.scratch)
        written = {o.operand for o in outs}
        object.__setattr__(self, "_ins", tuple((b.name, b.operand, b.operand in written)
                                               for b in ins))
        object.__setattr__(self, "_outs", tuple(
            (o.name, o.operand, next((b.name for b in ins if b.operand == o.operand), None), o)
            for o in outs))
        object.__setattr__(self, "_scratch", tuple(b for b in self.buffers if b.scratch))
        object.__setattr__(self, "_convert", {b.operand: b.convert for b in ins if b.convert})
        object.__setattr__(self, "names", tuple(b.name for b in self.buffers))
        # (the request fields that are batches: a call's key reads a list there by its sizes)
        object.__setattr__(self, "operands", frozenset(b.operand for b in ins if b.operand))
        object.__setattr__(self, "_checked", frozenset(b.operand for b in ins if b.checked))
        if not self.families:
            object.__setattr__(self, "families", (self.name,))

    def inputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if not b.output)

    def outputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.output)


@dataclass
class Example:
    """An op's problems for the conformance suite (``Op.example``), in numpy float64.

    ``operands``: request field -> list of arrays. ``params``: the parameter sets to try, each
    differing from the one before in one parameter (a plan must never be reused across them).
    ``reference(operands, params)``: every output, as lists of float64 arrays; ``outputs(result)``
    the same outputs of a call's result (lists or packed batches), in that order, the last one
    being what replaces ``written`` (the operand ``overwrite=True`` writes; ``mask`` gives the
    part of that array the output is, e.g. a factor's lower triangle). ``read``/``zero``: an
    operand that the scalar ``zero`` set to 0 must not read (BLAS: NaN there stays out).
    ``any_shape``: every shape of the operands is a problem of the op (GETRF's ``m x n``), so
    the suite has no wrong shape to give it."""

    operands: dict
    params: list
    reference: Callable
    outputs: Callable
    written: str
    read: str | None = None
    zero: str | None = None
    mask: Callable | None = None
    any_shape: bool = False


def wide(a: Any) -> np.ndarray:
    """``a`` in double precision for a reference: float64, or complex128 for complex ``a``."""
    a = np.asarray(a)
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def replaced(req: Any, operand: str | None) -> Any:
    """The input an output replaces (None: the output is new, as one of no operand always
    is)."""
    return None if operand is None else getattr(req, operand)


def register(op: Op) -> Op:
    if op.name in OPS and OPS[op.name] is not op:
        raise ValueError(f"operation {op.name!r} is registered twice")
    if op.api is not None:
        known = set(op.request.model_fields)
        rename = dict(op.fields)
        bad = [p for p in inspect.signature(op.api).parameters if rename.get(p, p) not in known]
        if bad or "overwrite" not in known or op.example is None:
            raise ValueError(f"{op.name}: api parameters {bad} are not fields of "
                             f"{op.request.__name__} (or it has no overwrite, or the op no "
                             "example for the conformance suite)")
    OPS[op.name] = op
    return op


def public() -> list[Op]:
    """The operations a user calls (those with an ``api``), in registration order."""
    return [op for op in OPS.values() if op.api is not None]


def caller(op: Op, target: str, namespace: dict | None = None,
           keyed: bool = False) -> Callable:
    """A function with ``op``'s public signature (its api's parameters, then ``after=`` and
    ``overwrite=``), name and docstring. Its body is ``return <target>(name, after=...,
    <field>=<parameter>, ...)``; ``target`` starting with ``self`` makes a method.

    ``keyed``: ``target`` is then a runtime (``self``, or an expression giving one), and the
    body finds the call's prepared call in its ``_calls`` by the call's key, built inline from
    the arguments by the namespace's ``_lay`` (an operand's layout; ``_own`` for a
    ``Buffer.checked`` one) and ``_val`` (another value), and runs it; on a miss (or a run it
    cannot take) it calls ``<target>._run(key, op, fields, after)``
    (vbatch.runtime.Runtime._run). Its own names start with ``_vb_``, so that no op parameter
    can shadow them. A repeated call is then one dict lookup from the run, with no loop over
    the fields and no call in between.

    Generated as source, not as ``*args, **kwargs`` bound per call: binding through
    ``inspect.Signature.bind`` costs ~3 us, more than a whole known call's own path."""
    sig = inspect.signature(op.api)
    rename = dict(op.fields)
    operands = {b.operand for b in op.inputs()}
    ns = dict(namespace or {}, _op=op, _name=op.name)
    params, fields, keys, star = [], [], [], False
    for i, p in enumerate(sig.parameters.values()):
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        text = p.name
        if p.default is not p.empty:
            ns[f"_d{i}"] = p.default
            text += f"=_d{i}"
        params.append(text)
        field = rename.get(p.name, p.name)
        fields.append((field, p.name))
        keys.append(f"_own({p.name})" if field in op._checked else
                    _lay_of(p.name) if field in operands else _val_of(p.name))
    if not star:
        params.append("*")
    params += ["after=()", "overwrite=False"]
    if target.split(".")[0] == "self":
        params.insert(0, "self")
    if keyed:
        items = ", ".join(f"{f!r}: {p}" for f, p in fields + [("overwrite", "overwrite")])
        body = (f"_vb_rt = {target}\n"
                f"    _vb_key = (_name, {', '.join(keys)}, {_val_of('overwrite')})\n"
                f"    _vb_fields = {{{items}}}\n"
                "    _vb_p = _vb_rt._calls.get(_vb_key)\n"
                "    if _vb_p is not None:\n"
                "        _vb_fut = _vb_p._call(_vb_fields, after, overwrite is True, True)\n"
                "        if _vb_fut is not None:\n"
                "            return _vb_fut\n"
                "    return _vb_rt._run(_vb_key, _op, _vb_fields, after)")
    else:
        body = (f"return {target}(_name, after=after, overwrite=overwrite, "
                f"{', '.join(f'{f}={p}' for f, p in fields)})")
    src = f"def {op.api.__name__}({', '.join(params)}):\n    {body}\n"
    exec(src, ns)  # noqa: S102 - the source is built above from a registered op's signature
    fn = ns[op.api.__name__]
    fn.__doc__ = inspect.cleandoc(op.api.__doc__ or "") + _TAIL
    fn.__annotations__ = {**op.api.__annotations__, "after": "Any", "overwrite": "bool",
                          "return": "Future"}
    return fn


def _lay_of(name: str) -> str:
    """A keyed caller's expression for an operand's layout: a packed batch's token read
    inline (a call to ``_lay`` costs as much as the rest of the key), else ``_lay``."""
    return (f"(type({name}) is _PB and {name}.__dict__.get('_vb_cache', _NONE).get('layout') "
            f"or _lay({name}))")


def _val_of(name: str) -> str:
    """A keyed caller's expression for another argument: None and a bool inline, else
    ``_val``."""
    return (f"(None if {name} is None else (bool, {name}) if type({name}) is bool else "
            f"_val({name}))")


_TAIL = """

``after``: futures this call starts after (their failure fails it with DependencyError).
``overwrite``: write the outputs into the inputs they replace (else inputs are left alone).
Returns a Future at once; bad input raises InputError here, before any work."""
