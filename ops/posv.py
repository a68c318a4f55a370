"""``posv``: factor and solve in one submission, as one task graph.

The graph is POTRF's (``a`` into the factor ``l``) followed by POTRS's (``l`` and ``b`` into the
solution ``x``), joined per problem by one edge: the problem's last factorization task before its
first solve. The forward solve reads ``b`` where it first writes each row block of ``x``
(``chain_graph``). The scheduler sees one graph: a small problem's solves run while a large one
still factors (DSSE ends them together), and no host round trip separates the two halves.

A problem whose factorization fails gets its ``info`` (LAPACK's) and keeps its right-hand side:
the solve kernels skip problems whose ``info`` is set (``skip_failed``) but for those first
writes, which bring ``b`` into ``x`` all the same; the other problems never notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import model_validator

from vbatch.ops.blas import (
    FAMILY,
    _parsed,
    _Request,
    _system,
    _sig,
    chain_graph,
    potrs_phases,
    potrs_reference,
    rows_wise,
)
from vbatch.ops.cholesky import CholeskyResult, graph_options, potrf_graph, reference
from vbatch.ops.generate import spd_list, square, unread_diagonal
from vbatch.ops.op import Buffer, Example, Op
from vbatch.ops.op import register as register_op
from vbatch.core.graph import TaskGraph, sequence


class PosvRequest(_Request):
    """``A X = B`` for SPD ``A`` (lower triangle read): the factor and the solution."""

    a: Any
    b: Any
    overwrite: bool = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, v: dict) -> dict:
        v = _parsed(cls, v, (), ("overwrite",))
        v["a"], v["b"] = _system(v, "a", ("a", "b"))
        return v


def posv_graph(req: PosvRequest, opts: dict) -> TaskGraph:
    fac = potrf_graph(req.a.n, None, *graph_options(opts))
    sol = chain_graph(req.b.m, req.b.n, potrs_phases("l", "x", "b", skip_failed=1),
                      int(opts["blas_nb"]), int(opts.get("blas_whole_rhs", 0)),
                      swap=rows_wise(req.b, 0))
    return sequence([fac, sol])


@dataclass(frozen=True)
class PosvResult:
    """``factors`` (as :class:`~vbatch.CholeskyResult`'s), ``solutions`` (the form of ``b``),
    ``info`` (LAPACK's, per problem: a failed problem's solution is its ``b``, unchanged)."""

    factors: Any
    solutions: Any
    info: np.ndarray
    plan: Any

    ok = CholeskyResult.ok
    failed = CholeskyResult.failed


def posv(a: Any, b: Any):
    """Factor SPD (complex: Hermitian positive definite) ``A`` and solve ``A X = B``, in one
    task graph. ``result()``: a
    :class:`~vbatch.PosvResult` (factors, solutions, info; a problem whose factorization fails
    keeps ``B`` as its solution and gets its ``info``)."""


def posv_example(rng, sizes, dtype=np.float64) -> Example:
    ops = {"a": unread_diagonal(rng, spd_list(sizes, dtype, rng)), "b": square(rng, sizes, dtype)}

    def ref(o, p):
        ls = [reference(x)[0] for x in o["a"]]
        return [ls, [potrs_reference(x, y) for x, y in zip(ls, o["b"])]]

    return Example(ops, [{}], ref, lambda r: [r.factors, r.solutions], "b")


POSV_OP = register_op(Op(
    name="posv", api=posv, example=posv_example, request=PosvRequest,
    buffers=(Buffer("a", "a"), Buffer("l", "a", output=True), Buffer("b", "b"),
             Buffer("x", "b", output=True)),
    graph=posv_graph, signature=_sig("a", "b"),
    result=lambda outs, info, plan: PosvResult(outs["l"], outs["x"], info, plan),
    returns=(("solutions", "x"), ("factors", "l")),
    scalars=lambda req: {"alpha": 1.0, "beta": 0.0}, families=("potrf", FAMILY),
    doc="A X = B for SPD A: Cholesky and the solve, one graph",
))
