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
* a numpy/LAPACK reference, used by the tests.

The kinds its graph uses live in the same module (:mod:`vbatch.core.kinds`); the kernels that run
them live in ``kernels/<name>_cpu.py`` and ``kernels/<name>_cuda.py``. Adding an operation is
adding those files and one conformance test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

OPS: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Buffer:
    """A buffer the kernels of an op address.

    An input's ``operand`` is the request field it comes from (``None`` there: the buffer is
    absent, its pointer null, as GEMM's ``c``). An output's ``operand`` is the input it replaces:
    it takes that input's layout and, when the caller overwrites, its memory. Where that input is
    absent, the output is new: ``shape(request) -> (m, n)`` gives its sizes and it comes back in
    the form of the request field ``form`` (a list for a list, ...). ``complete``: the op's
    kernels write every element of such a new output, so it need not be zeroed first."""

    name: str
    operand: str
    output: bool = False
    shape: Callable[[Any], tuple] | None = None
    form: str | None = None
    complete: bool = False


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

    def __post_init__(self):
        # What staging a submission needs, computed once (it runs on every call's hot path):
        # the inputs as (buffer, operand, written when overwriting), the outputs as (buffer,
        # operand, the input buffer whose layout it takes, the Buffer).
        ins, outs = self.inputs(), self.outputs()
        written = {o.operand for o in outs}
        object.__setattr__(self, "_ins", tuple((b.name, b.operand, b.operand in written)
                                               for b in ins))
        object.__setattr__(self, "_outs", tuple(
            (o.name, o.operand, next(b.name for b in ins if b.operand == o.operand), o)
            for o in outs))
        object.__setattr__(self, "names", tuple(b.name for b in self.buffers))
        if not self.families:
            object.__setattr__(self, "families", (self.name,))

    def inputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if not b.output)

    def outputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.output)


def register(op: Op) -> Op:
    if op.name in OPS and OPS[op.name] is not op:
        raise ValueError(f"operation {op.name!r} is registered twice")
    OPS[op.name] = op
    return op
