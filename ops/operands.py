"""The operands of one submission, validated together, in one place for every op.

An op's request names its operands (``a``, ``b``, ``c``, ...); each is a list of 2-D arrays or a
:class:`~vbatch.core.batch.PackedBatch` (:mod:`vbatch.core.batch` checks each on its own). Here they
are checked against each other: one problem count, one dtype, one array kind (numpy or cupy:
forms may differ, a list ``a`` with a packed ``b``). Every message names the problem and the
operand. The op then states its shape rule (:func:`shape_rule`).
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any

import numpy as np

from vbatch.core.batch import MatrixList, PackedBatch, Views
from vbatch.core.errors import InputError, validated
from vbatch.core.frontends import IMMUTABLE


def operand(v: Any, name: str, square: bool = False,
            vectors: str | None = None) -> PackedBatch | MatrixList:
    """``v`` as a validated batch; errors name ``name``. The views an earlier call gave back
    for a list (:class:`~vbatch.core.batch.Views`) are read as the packed batch behind them:
    no validation per matrix, and no copy. ``vectors`` ("column" or "row"): a list's 1-D
    arrays are taken as one column (or row), as SciPy's solvers take a 1-D right-hand side,
    and their outputs come back 1-D (``MatrixList.vector``)."""
    if isinstance(v, Views):
        v = v.batch
    if isinstance(v, PackedBatch):
        if square and not v.square:
            bad = np.flatnonzero(v.m != v.n)
            raise InputError([(int(i), f"{name}: not square: {v.m[i]} x {v.n[i]}")
                              for i in bad])
        return v
    if isinstance(v, MatrixList):
        return v
    if isinstance(v, (list, tuple)):
        mats, vec = (v, None) if vectors is None else _vectors(v, vectors)
        try:
            ml = validated(MatrixList, mats=mats, square=square)
        except InputError as exc:
            raise InputError([(i, f"{name}: {r}") for i, r in exc.problems]) from None
        if vec is not None:
            vec.flags.writeable = False
            ml = MatrixList.model_construct(**{**ml.__dict__, "source": list(v), "vector": vec})
        return ml
    raise InputError([(None, f"{name}: expected a list of 2-D arrays or a vbatch.PackedBatch, "
                             f"got {type(v).__name__}")])


_NDIM = attrgetter("ndim")


def _vectors(mats: Any, how: str) -> tuple[Any, np.ndarray | None]:
    """``mats`` with each 1-D array as a 2-D view of one column (``how="column"``) or one row,
    and which ones were 1-D (None: none was, or something has no ``ndim``, which the list's
    own validation names)."""
    try:
        nd = np.fromiter(map(_NDIM, mats), dtype=np.int64, count=len(mats))
    except (AttributeError, TypeError):
        return mats, None
    vec = nd == 1
    if not vec.any():
        return mats, None
    shape = (-1, 1) if how == "column" else (1, -1)
    return [a.reshape(shape) if f else a for a, f in zip(mats, vec.tolist())], vec


def together(**batches: Any) -> None:
    """The operands given (``None``: absent) share k, dtype and array kind."""
    given = [(n, b) for n, b in batches.items() if b is not None]
    if not given:
        return
    n0, b0 = given[0]
    problems: list[tuple[int | None, str]] = []
    for n, b in given[1:]:
        if b.k != b0.k:
            problems.append((None, f"{n} has {b.k} problems but {n0} has {b0.k}"))
        if b.dtype != b0.dtype:
            problems.append((None, f"{n} is {b.dtype} but {n0} is {b0.dtype} (one call, one "
                                   "dtype)"))
        if (b.kind, b.frontend) != (b0.kind, b0.frontend):
            problems.append((None, f"{n} holds {label(b)} arrays but {n0} holds {label(b0)} arrays "
                                   "(one call, one array kind)"))
    if problems:
        raise InputError(problems)


def shape_rule(checks: list[tuple[np.ndarray, str]]) -> None:
    """Raise one error listing, per problem, every ``(mask, message)`` that holds for it;
    ``message`` may use ``{i}``-free format fields filled per problem by the caller."""
    problems: list[tuple[int | None, str]] = []
    for mask, msg in checks:
        for i in np.flatnonzero(mask):
            problems.append((int(i), msg(int(i)) if callable(msg) else msg))
    if problems:
        problems.sort(key=lambda p: p[0])
        raise InputError(problems)


def finite_scalar(v: Any, name: str) -> float | complex:
    """``alpha``/``beta``: a finite real or complex number (bools refused: ``True`` is not
    ``1.0``); a complex one with no imaginary part is taken as real. Whether the call's dtype
    takes a complex one is :func:`fit_scalars`'s to say, once the operands are known."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, float, complex, np.integer, np.floating, np.complexfloating)):
        raise InputError([(None, f"{name} must be a number, got {type(v).__name__}")])
    z = complex(v)
    if not (math.isfinite(z.real) and math.isfinite(z.imag)):
        raise InputError([(None, f"{name} must be finite, got {v}")])
    return z.real if z.imag == 0 else z


def fit_scalars(v: dict, dtype: Any, names: tuple[str, ...], real: tuple[str, ...] = ()) -> None:
    """A complex scalar needs complex operands, and the scalars named ``real`` are real for
    every dtype (HERK's alpha and beta: its output's diagonal stays real)."""
    cplx = np.dtype(dtype).kind == "c"
    for name in names:
        if isinstance(v[name], complex) and (name in real or not cplx):
            why = f"{name} is real for this op" if name in real else \
                f"the operands are {np.dtype(dtype)}"
            raise InputError([(None, f"{name} = {v[name]} is complex, but {why}")])


def transpose(v: Any, name: str) -> bool | str:
    """``trans``-like parameters as LAPACK takes them: False or "N", True or "T", "C" (the
    conjugate transpose), as False, True or "C" (:func:`fit_trans` makes "C" True for real
    operands; :func:`view_flag` gives a view's flag)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, str) and v.upper() in ("N", "T", "C"):
        return {"N": False, "T": True, "C": "C"}[v.upper()]
    raise InputError([(None, f"{name} must be False, True, 'N', 'T' or 'C', got {v!r}")])


def fit_trans(v: dict, dtype: Any, names: tuple[str, ...]) -> None:
    """Real operands: "C" is "T" (one plan for both, as LAPACK's real routines read them)."""
    if np.dtype(dtype).kind != "c":
        for name in names:
            v[name] = bool(v[name])


def view_flag(trans: bool | str) -> int:
    """A view's flag from a :func:`transpose` value: bit 0 transposes the view, bit 1
    conjugates it ("C": both)."""
    return 3 if trans == "C" else int(trans)


def flag(v: Any, name: str) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise InputError([(None, f"{name} must be True or False, got {v!r}")])
    return bool(v)


def choice(v: Any, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v.lower() not in allowed:
        raise InputError([(None, f"{name} must be one of {allowed}, got {v!r}")])
    return v.lower()


def label(batch: Any) -> str:
    """What kind of arrays a batch holds, as the caller sees it: numpy, cupy, torch, jax."""
    return batch.frontend or batch.kind


def writable(batch: Any, name: str | None = None) -> list[tuple[int | None, str]]:
    """The problems of ``batch`` that ``overwrite=True`` could not write: read-only numpy
    arrays or buffers, and arrays of an immutable framework (JAX). Device arrays are always
    writable."""
    what = "" if name is None else f"{name}: "
    if batch.frontend in IMMUTABLE:
        return [(None, f"overwrite=True, but {what}{batch.frontend} arrays are immutable")]
    if isinstance(batch, PackedBatch):
        if not getattr(batch.data.flags, "writeable", True):
            return [(None, f"overwrite=True, but {what}the packed buffer is read-only")]
        return []
    return [(i, f"overwrite=True, but {what}this array is read-only")
            for i, a in enumerate(batch.mats) if not getattr(a.flags, "writeable", True)]
