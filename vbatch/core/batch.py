"""What a batch is: k matrices of different shapes, as a list or as one packed buffer.

Every operand of every operation comes in one of two forms:

* a **list** of 2-D arrays (numpy, or cupy on a GPU), each of its own shape;
* a :class:`PackedBatch`: one 1-D buffer plus per-problem ``m`` (rows), ``n`` (columns),
  ``offset`` (first element, in elements, not bytes) and ``ld`` (leading dimension). Matrix ``i``
  element ``(r, c)`` lives at ``data[offset[i] + r + c * ld[i]]`` for ``order="F"``
  (column-major, the LAPACK/multifrontal convention) and at ``data[offset[i] + r * ld[i] + c]``
  for ``order="C"`` (row-major). ``m`` defaults to ``n``: a batch of square matrices.

The packed form is what the hot path uses: it is zero-copy, its metadata is numpy arrays (never a
Python object per matrix), and backends cache plans and device metadata on it, so factoring the
same layout again costs no planning (a runtime finds its kept call for another batch of an equal
layout too, while one lives). :func:`pack` turns a list into a packed batch once; keep the
result and pass it again to reuse it.

Shape rules (square, inner dimensions that match, ...) belong to each operation (``ops/``);
this module checks what every operand must be. Zero-size matrices are valid.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from vbatch.core.errors import InputError, constructed, validated
from vbatch.core.frontends import adopt, frontend_of, give, give_all

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64),
                    np.dtype(np.complex128))


_KIND_OF_TYPE: dict[type, str | None] = {np.ndarray: "numpy"}


def array_kind(a: Any) -> str | None:
    """``"numpy"`` or ``"cupy"`` for arrays vbatch accepts, else ``None``.

    Answered per type and cached: probing ``__cuda_array_interface__`` on each cupy array builds
    a dict, which made validating a list of 2,000 device arrays take 3.3 ms (H100 run,
    2026-11-21)."""
    t = type(a)
    try:
        return _KIND_OF_TYPE[t]
    except KeyError:
        pass
    if isinstance(a, np.ndarray):
        kind = "numpy"
    elif t.__module__.split(".")[0] == "cupy" and hasattr(t, "__cuda_array_interface__"):
        kind = "cupy"
    else:
        kind = None
    _KIND_OF_TYPE[t] = kind
    return kind


def array_module(kind: str):
    if kind == "numpy":
        return np
    import cupy  # only reached for arrays that are already cupy arrays

    return cupy


def _adopt_data(data: Any) -> tuple[Any, str | None]:
    """A packed buffer from another framework as a numpy or cupy view (frontends.adopt), and
    the framework's name; numpy, cupy and anything that is no array at all pass as they are."""
    if array_kind(data) is not None or frontend_of(data) is None:
        return data, None
    try:
        return adopt(data)
    except ValueError as exc:
        raise InputError([(None, f"data: {exc}")], "packed batch") from None


def _dtype_problem(dt: np.dtype) -> str | None:
    if dt in SUPPORTED_DTYPES:
        return None
    return f"unsupported dtype {dt} (supported: float32, float64, complex64, complex128)"


def _index_array(v: Any, name: str) -> np.ndarray:
    """A read-only int64 copy: backends cache plans keyed on these, so they must not change."""
    try:
        a = np.asarray(v)
    except Exception as exc:  # noqa: BLE001 - any unconvertible object is a user error here
        raise InputError([(None, f"{name} must be a 1-D integer array: {exc}")]) from None
    if a.ndim != 1:
        raise InputError([(None, f"{name} must be 1-D, got shape {a.shape}")])
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise InputError([(None, f"{name} must hold integers, got dtype {a.dtype}")])
    out = np.array(a, dtype=np.int64, copy=True)
    out.flags.writeable = False
    return out


def _first_bad(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask)


class PackedBatch(BaseModel):
    """k matrices in one buffer: ``data`` (1-D, numpy or cupy) with ``m``, ``n``, ``offset``,
    ``ld``.

    Build one with :meth:`from_buffer` (which fills in tight offsets and leading dimensions) or
    with :func:`pack` from a list. Validation checks, per problem, that sizes are non-negative,
    that ``ld`` covers a column (order F: ``ld >= max(1, m)``) or a row (order C:
    ``ld >= max(1, n)``), and that every matrix lies inside the buffer without overlapping
    another.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    data: Any
    n: Any
    offset: Any
    ld: Any
    order: Literal["F", "C"] = "F"
    m: Any = None  # rows; None: m = n (square)
    # The framework the caller's buffer came from ("torch", "jax"; None for numpy and cupy):
    # ``data`` is then a numpy or cupy view of that buffer (DLPack, no copy), and the
    # matrices (matrix, unpack) and ``buffer`` are given back as that framework's arrays.
    frontend: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _adopt(cls, values: Any) -> Any:
        if isinstance(values, dict):
            data, fe = _adopt_data(values.get("data"))
            if fe is not None:
                values = {**values, "data": data, "frontend": fe}
        return values

    @field_validator("data")
    @classmethod
    def _check_data(cls, v: Any) -> Any:
        kind = array_kind(v)
        if kind is None:
            got = type(v).__name__
            raise InputError([(None, f"data must be a numpy or cupy array, got {got}")])
        if v.ndim != 1:
            raise InputError([(None, f"data must be 1-D, got shape {tuple(v.shape)}")])
        bad = _dtype_problem(np.dtype(v.dtype))
        if bad:
            raise InputError([(None, f"data: {bad}")])
        if not v.flags.c_contiguous:
            raise InputError([(None, "data must be contiguous")])
        return v

    @field_validator("n", "offset", "ld", mode="before")
    @classmethod
    def _check_index(cls, v: Any, info) -> np.ndarray:
        return _index_array(v, info.field_name)

    @field_validator("m", mode="before")
    @classmethod
    def _check_rows(cls, v: Any, info) -> np.ndarray:
        if v is None:
            n = info.data.get("n")
            return n if n is not None else None
        return _index_array(v, "m")

    @model_validator(mode="after")
    def _check_layout(self) -> "PackedBatch":
        m, n, off, ld = self.m, self.n, self.offset, self.ld
        if not (len(m) == len(n) == len(off) == len(ld)):
            if m is n:
                msg = f"n, offset and ld differ in length ({len(n)}, {len(off)}, {len(ld)})"
            else:
                msg = (f"m, n, offset and ld differ in length ({len(m)}, {len(n)}, {len(off)}, "
                       f"{len(ld)})")
            raise InputError([(None, msg)])
        problems: list[tuple[int | None, str]] = []
        square = m is n
        for i in _first_bad((m < 0) | (n < 0)):
            problems.append((int(i), f"negative size {n[i]}" if square else
                             f"negative size ({m[i]} x {n[i]})"))
        inner = n if self.order == "C" else m
        what = ("n" if self.order == "C" else "m") if not square else "n"
        for i in _first_bad(ld < np.maximum(inner, 1)):
            problems.append((int(i), f"leading dimension {ld[i]} < max(1, {what}) = "
                                     f"{max(1, inner[i])}"))
        for i in _first_bad(off < 0):
            problems.append((int(i), f"negative offset {off[i]}"))
        if problems:
            raise InputError(sorted(problems, key=lambda p: p[0]))
        live = np.flatnonzero((n > 0) & (m > 0))
        end = _extent_end(m, n, off, ld, self.order)  # one past the last element touched
        size = int(self.data.size)
        for i in live[end[live] > size]:
            shape = f"n={n[i]}" if square else f"{m[i]} x {n[i]}"
            problems.append(
                (int(i), f"matrix ({shape}, ld={ld[i]}, offset={off[i]}) ends at element "
                         f"{end[i]}, past the buffer's {size} elements")
            )
        if problems:
            raise InputError(problems)
        # Two matrices must not share elements: kernels write them concurrently.
        clash = _overlap(off, end, live)
        if clash is not None:
            a, b = clash
            raise InputError([
                (b, f"overlaps problem {a} in the buffer (elements [{off[b]}, {end[b]}) and "
                    f"[{off[a]}, {end[a]}))")
            ])
        return self

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_buffer(
        cls,
        data: Any,
        n: Any,
        offset: Any = None,
        ld: Any = None,
        order: Literal["F", "C"] = "F",
        m: Any = None,
    ) -> "PackedBatch":
        """Adopt ``data`` as is (no copy). ``n``: columns (and rows, unless ``m`` is given).
        Missing ``ld`` means a tight column (F) or row (C); missing ``offset`` means the matrices
        follow each other tightly in index order."""
        n_arr = _index_array(n, "n")
        m_arr = n_arr if m is None else _index_array(m, "m")
        if ld is None and len(m_arr) == len(n_arr):
            ld = np.maximum(n_arr if order == "C" else m_arr, 1)
        ld_arr = _index_array(ld, "ld")
        if offset is None and len(ld_arr) == len(n_arr) == len(m_arr):
            offset = tight_offsets(ld_arr * (m_arr if order == "C" else n_arr))
        data, frontend = _adopt_data(data)  # (first: a 2-D tensor is flattened below)
        if array_kind(data) is not None and data.ndim > 1 and data.flags.c_contiguous:
            data = data.reshape(-1)
        return validated(
            cls, "packed batch", data=data, n=n_arr, offset=offset, ld=ld_arr, order=order,
            m=None if m is None else m_arr, frontend=frontend,
        )

    def cache(self) -> dict:
        """Plans and device tables derived from this batch's layout, keyed by their users: the
        metadata arrays are read-only, so an entry stays valid as long as the batch lives.
        Batches made by :meth:`with_data` share it. A plain entry of the instance dict, not a
        pydantic private attribute: reading one of those costs ~2 us, on every call's path."""
        d = self.__dict__
        c = d.get("_vb_cache")
        if c is None:
            c = d["_vb_cache"] = {}
        return c

    def __getstate__(self) -> dict:
        # A pickled batch is its data and layout: the cache holds this process's plans and
        # device tables (weak references among them), which a copy elsewhere derives again.
        state = super().__getstate__()
        if "_vb_cache" in state["__dict__"]:
            state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k != "_vb_cache"}
        return state

    def with_data(self, data: Any) -> "PackedBatch":
        """The same layout over another buffer of the same size and dtype (any kind).

        Internal: the caller guarantees size and dtype. The new batch shares this one's cache,
        whose entries depend on the layout only, so a device copy of a host batch, or a factor,
        reuses the plan and device metadata of the batch it came from.
        """
        self.cache()  # create it before the copy, so that both share it
        return self._like({**self.__dict__, "data": data})

    def _like(self, fields: dict) -> "PackedBatch":
        """A batch of these fields, valid because they come from this valid one (once per
        call for the output batch)."""
        return constructed(PackedBatch, fields, self.__pydantic_fields_set__)

    def with_frontend(self, frontend: str | None) -> "PackedBatch":
        """The same batch, given back to ``frontend`` (its matrices and ``buffer``)."""
        if frontend == self.frontend:
            return self
        new = self.with_data(self.data)
        new.__dict__["frontend"] = frontend
        return new

    def part(self, start: int, stop: int) -> "PackedBatch":
        """Problems ``start:stop`` as a batch over the same buffer (no copy, nothing
        validated again: a part of a valid batch is valid). A coalesced submission's member
        gets its share of the result this way (:mod:`vbatch.runtime.coalesce`)."""
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("_vb_")}
        n = self.n[start:stop]
        d.update(n=n, offset=self.offset[start:stop], ld=self.ld[start:stop],
                 m=n if self.m is self.n else self.m[start:stop])
        return self._like(d)

    # ---------------------------------------------------------------- views
    @property
    def buffer(self) -> Any:
        """The whole buffer as the caller's kind of array: ``data`` itself for numpy and cupy,
        a torch tensor or JAX array over the same memory for a batch that came from one."""
        return give(self.data, self.frontend)

    @property
    def k(self) -> int:
        return len(self.n)

    @property
    def square(self) -> bool:
        return self.m is self.n or bool(np.array_equal(self.m, self.n))

    def shapes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(m, n)``: rows and columns of every problem."""
        return self.m, self.n

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def kind(self) -> str:
        return array_kind(self.data)  # type: ignore[return-value]

    def strides(self, i: int) -> tuple[int, int]:
        """(row, column) strides of matrix ``i``, in elements."""
        return (1, int(self.ld[i])) if self.order == "F" else (int(self.ld[i]), 1)

    def matrix(self, i: int):
        """Matrix ``i`` as a 2-D view into the buffer (writes go to the buffer), as the
        caller's kind of array (``frontend``)."""
        v = self._view(i)
        return v if self.frontend is None else give(v, self.frontend)

    def unpack(self) -> list:
        """All matrices as 2-D views into the buffer, in problem order, as the caller's kind
        of array (``frontend``)."""
        views = self._views()
        return views if self.frontend is None else give_all(views, self.frontend)

    def _view(self, i: int):
        """Matrix ``i`` as a numpy or cupy view (what kernels and backends use)."""
        m, n, off = int(self.m[i]), int(self.n[i]), int(self.offset[i])
        if m == 0 or n == 0:
            return self.data[:0].reshape(m, n)
        rs, cs = self.strides(i)
        isz = self.dtype.itemsize
        strides = (rs * isz, cs * isz)
        # The ndarray constructors make a view in ~1 us; as_strided takes ~15 us, which showed up
        # as a fifth of the CPU backend's time at k = 2000 (docs/decisions.md#host-list-form).
        if self.kind == "numpy":
            return np.ndarray(
                (m, n), self.dtype, buffer=self.data, offset=off * isz, strides=strides
            )
        import cupy

        return cupy.ndarray((m, n), self.dtype, memptr=self.data.data + off * isz, strides=strides)

    def _views(self) -> list:
        """All matrices as numpy or cupy views, in problem order.

        One constructor call per matrix with everything else computed once (vectorized): the
        per-matrix ``matrix(i)`` took 3.5 us each, a list of 2,000 factors 7 ms (2-core VM,
        2026-11-21); this takes about 0.4 us each."""
        isz = self.dtype.itemsize
        dt, buf = self.dtype, self.data
        ms, ns = self.m.tolist(), self.n.tolist()
        empty = (self.m == 0) | (self.n == 0)
        offs = np.where(empty, 0, self.offset * isz).tolist()
        lds = (self.ld * isz).tolist()
        fortran = self.order == "F"
        if self.kind == "numpy":
            return [np.ndarray((m, n), dt, buf, o, (isz, s) if fortran else (s, isz))
                    for m, n, o, s in zip(ms, ns, offs, lds)]
        import cupy

        base = buf.data
        return [cupy.ndarray((m, n), dt, memptr=base + o,
                             strides=(isz, s) if fortran else (s, isz))
                for m, n, o, s in zip(ms, ns, offs, lds)]

    def __repr__(self) -> str:
        fe = "" if self.frontend is None else f", frontend={self.frontend!r}"
        return (
            f"PackedBatch(k={self.k}, dtype={self.dtype}, kind={self.kind}{fe}, "
            f"order={self.order!r}, elements={self.data.size})"
        )

    __str__ = __repr__


class ListLike(Sequence):
    """A read-only sequence whose items are made when touched (``_one(j)``, ``0 <= j <
    len``): indexing (as a list's: integers, numpy's and torch's too, negative ones), slicing,
    iteration, ``==`` and ``+`` work as on a list. :class:`Views` and the sparse solve's
    ``Solutions`` are ones."""

    __slots__ = ()
    _items = "items"  # (what an IndexError calls them)

    def _one(self, j: int):
        raise NotImplementedError

    def __getitem__(self, i):
        k = len(self)
        if isinstance(i, slice):
            return [self._one(j) for j in range(*i.indices(k))]
        try:
            j = operator.index(i)
        except TypeError:
            raise TypeError(f"indices must be integers or slices, not {type(i).__name__}") from None
        if j < 0:
            j += k
        if not 0 <= j < k:
            raise IndexError(f"index {i} out of range for {k} {self._items}")
        return self._one(j)

    def __iter__(self):
        return (self._one(j) for j in range(len(self)))

    def __eq__(self, other):
        """As a list's: ``views == []`` for an empty batch."""
        if isinstance(other, ListLike):
            other = list(other)
        return list(self) == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # mutable memory, as a list's

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)


class Views(ListLike):
    """The matrices of a packed batch as a read-only sequence, each view made when it is first
    touched: what a call on a list returns, so that 20,000 results cost no Python object each
    until the caller reads them. Indexing, slicing, ``len``, iteration (all views at once,
    through the vectorized :meth:`PackedBatch.unpack`) and ``list(views)`` work as on a list;
    ``views.batch`` is the packed batch behind them. The views are of the caller's kind of
    array (numpy, cupy, torch, JAX)."""

    __slots__ = ("batch", "_all", "vector")
    _items = "matrices"

    def __init__(self, batch: PackedBatch, vector: np.ndarray | None = None):
        # The batch is this sequence's own (an output buffer): marked as a list's, so that a
        # call given these views returns its outputs as a list too.
        batch.__dict__["_vb_views"] = True
        if vector is not None:  # (and which problems are 1-D, for a later call's outputs)
            batch.__dict__["_vb_vector"] = vector
        self.batch = batch
        self._all: list | None = None
        # Problems given as 1-D arrays (a right-hand side as SciPy takes it): their views
        # are 1-D too (MatrixList.vector).
        self.vector = vector

    def __len__(self) -> int:
        return self.batch.k

    def _one(self, j: int):
        if self._all is not None:
            return self._all[j]
        m = self.batch.matrix(j)
        return m.reshape(-1) if self.vector is not None and self.vector[j] else m

    def __iter__(self):
        if self._all is None:
            self._all = self.flat(self.batch.unpack())
        return iter(self._all)

    def flat(self, mats: list) -> list:
        """``mats`` (this batch's matrices, in any array kind) with the 1-D ones made 1-D."""
        if self.vector is None:
            return mats
        return [m.reshape(-1) if v else m for m, v in zip(mats, self.vector.tolist())]

    def part(self, start: int, stop: int) -> "Views":
        """Problems ``start:stop``, as views of the same memory."""
        vec = None if self.vector is None else self.vector[start:stop]
        return Views(self.batch.part(start, stop), vec)

    def __repr__(self) -> str:
        return f"Views({len(self)} matrices of {self.batch!r})"


def tight_offsets(sizes: np.ndarray, ld: np.ndarray | None = None) -> np.ndarray:
    """Offsets that place matrix ``i`` right after matrix ``i - 1``, each taking ``sizes[i]``
    elements (``tight_offsets(n, ld)``: ``ld[i] * n[i]`` each, a square batch)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if ld is not None:
        sizes = sizes * np.asarray(ld, dtype=np.int64)
    out = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=out[1:])
    return out


_TIGHT: dict = {}  # read-only shape arrays (by identity) -> their layout (tight_template)
# Layouts kept at most (all dropped past it): each holds what backends derived from it, ~1.5 MB
# for 20,000 matrices on the CPU. A stream of CPU lists of 20,000 matrices of new sizes held
# +429 MiB with 16 (as before layouts held a cache), +488 with 64 (2-core VM).
TIGHT_KEPT = 16


def tight_layout(m: np.ndarray, n: np.ndarray, order: str) -> tuple[np.ndarray, np.ndarray, int]:
    """``(offset, ld, total elements)`` of matrices of shapes ``(m, n)`` packed back to back
    (for read-only ``m`` and ``n``, made once: :func:`tight_template`)."""
    if _frozen(m, n):
        t, total = tight_template(m, n, order)
        return t.offset, t.ld, total
    return _layout(m, n, order)


def _frozen(m, n) -> bool:
    return not getattr(getattr(m, "flags", None), "writeable", True) and \
        not getattr(getattr(n, "flags", None), "writeable", True)


def _layout(m, n, order: str) -> tuple[np.ndarray, np.ndarray, int]:
    ld = np.maximum(n if order == "C" else m, 1).astype(np.int64)
    size = ld * (m if order == "C" else n)
    off = tight_offsets(size)
    return off, ld, int(off[-1] + size[-1]) if len(size) else 0


def tight_template(m: np.ndarray, n: np.ndarray, order: str) -> tuple["PackedBatch", int]:
    """Matrices of shapes ``(m, n)`` packed back to back: a batch over no buffer yet (its
    ``with_data`` gives one over a buffer of the returned total elements). For read-only ``m``
    and ``n`` (a validated list's, an op's shape rule that keeps its arrays, as the sparse
    solve's scratch does) it is made once, so every batch laid out from those arrays shares
    one cache, as with_data twins do: a list staged again with the same sizes finds what a
    backend derived from its layout. (That cache is shared by batches of any dtype: its
    entries name the itemsize where they depend on it.) Made every call, the layout alone was
    ~0.3 ms of every solve of the 1000 Laplacians (40,517 fronts; H100 host, 2026-11-25)."""
    frozen = _frozen(m, n)
    if frozen:
        hit = _TIGHT.get((id(m), id(n), order))
        if hit is not None and hit[0] is m and hit[1] is n:
            return hit[2]
    off, ld, total = _layout(m, n, order)
    if frozen:
        off.flags.writeable = ld.flags.writeable = False
    t = PackedBatch.model_construct(data=None, m=m, n=n, offset=off, ld=ld, order=order)
    out = t, total
    if frozen:
        t.cache()  # (made here: every batch made from it shares it)
        if len(_TIGHT) >= TIGHT_KEPT:
            _TIGHT.clear()
        _TIGHT[id(m), id(n), order] = (m, n, out)  # (holding m and n keeps their ids theirs)
    return out


def _extent_end(m, n, off, ld, order) -> np.ndarray:
    """One past the last element each matrix touches (meaningless for empty ones)."""
    if order == "C":
        return off + (m - 1) * ld + n
    return off + (n - 1) * ld + m


def _overlap(off, end, live) -> tuple[int, int] | None:
    """The first two of the matrices ``live`` (indices), by offset, whose extents
    ``[off, end)`` overlap, or None. On extents, so it is conservative for matrices interleaved
    through ld gaps. (Sorted by offset, any overlap shows between neighbours.)"""
    by_off = live[np.argsort(off[live], kind="stable")]
    clash = np.flatnonzero(off[by_off[1:]] < end[by_off[:-1]])
    return (int(by_off[clash[0]]), int(by_off[clash[0] + 1])) if len(clash) else None


def first_time(seen: dict, key: Any, most: int) -> bool:
    """Whether ``key`` is new to ``seen`` (then remembered, the oldest of more than ``most``
    forgotten): what a cache that keeps something the second time it comes asks."""
    if key in seen:
        return False
    seen[key] = None
    if len(seen) > most:
        seen.pop(next(iter(seen)), None)
    return True


def _describe_uniform(mats: list, square: bool) -> dict | None:
    """MatrixList's common case without a Python step per array: every array of one numpy or
    cupy type, one supported dtype, 2-D (and square where asked). Each attribute is read for
    all arrays by one ``map`` (no interpreter frame per array). ``None`` where any of that does
    not hold: the general pass then finds and names each problem. Measured on the H100 host
    (2026-11-25, 2,000 cupy arrays, docs/decisions.md#host-list-form): the per-array loop
    took 0.79 ms and the gather's own loop over the addresses about as much again; this pass
    reads both, addresses included, in ~1.5 ms. cupy's shapes and strides, ~0.2 us an array
    each to read, are derived from cheaper reads where they can be (:func:`_shapes`,
    :func:`addresses`)."""
    types = set(map(type, mats))
    if len(types) != 1:
        return None
    kind = array_kind(mats[0])  # (answered per type)
    if kind is None:
        return None
    dtypes = set(map(_DTYPE, mats))
    if len(dtypes) != 1:
        return None
    dtype = np.dtype(dtypes.pop())
    if dtype not in SUPPORTED_DTYPES:
        return None
    if set(map(_NDIM, mats)) != {2}:
        return None
    mn = _shapes(mats, kind == "cupy")
    m, n = mn[:, 0].copy(), mn[:, 1].copy()
    if square and not np.array_equal(m, n):
        return None
    addr = None
    if kind == "cupy":
        addr = addresses(mats, dtype.itemsize, m, n)
        addr.flags.writeable = False
    n.flags.writeable = False
    if square or np.array_equal(m, n):
        m = n
    else:
        m.flags.writeable = False
    return {"mats": mats, "kind": kind, "dtype": dtype, "m": m, "n": n, "frontend": None,
            "source": mats, "addr": addr}


_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_NDIM = attrgetter("ndim")
_SIZE = attrgetter("size")
_STRIDES = attrgetter("strides")
_PTR = attrgetter("data.ptr")
# cupy's contiguity flags as its arrays hold them (the public ``flags`` builds an object a read)
_C_CONTIGUOUS = attrgetter("_c_contiguous")
_F_CONTIGUOUS = attrgetter("_f_contiguous")


def _shapes(mats: list, device: bool) -> np.ndarray:
    """Each 2-D array's rows and columns (k x 2, int64). A cupy array builds its shape tuple
    at every read, ~0.2 us; its ``len`` and ``size`` are plain reads, ~0.05 each, so its
    columns come from those, and only an array without rows (whose size says nothing of its
    columns) is asked its shape (docs/decisions.md#host-list-reads)."""
    k = len(mats)
    if not device:
        return np.fromiter(chain.from_iterable(map(_SHAPE, mats)), dtype=np.int64,
                           count=2 * k).reshape(k, 2)
    mn = np.empty((k, 2), dtype=np.int64)
    m = mn[:, 0] = np.fromiter(map(len, mats), dtype=np.int64, count=k)
    mn[:, 1] = np.fromiter(map(_SIZE, mats), dtype=np.int64, count=k) // np.maximum(m, 1)
    for i in np.flatnonzero(m == 0).tolist():
        mn[i, 1] = mats[i].shape[1]
    return mn


def addresses(mats: list, itemsize: int, m: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Each device array's address and strides in elements (3 x k, int64): what the gather and
    scatter kernels read (:attr:`MatrixList.addr`, computed the same way). ``m`` and ``n`` are
    the arrays' rows and columns. A contiguous array's strides follow from its shape and
    flags, which cost a third of reading them (cupy); only the others are read. A stride along
    an axis of one element, or of an empty array, reaches no element: it is then derived, not
    read, and may differ from the array's own."""
    k = len(mats)
    addr = np.empty((3, k), dtype=np.int64)
    addr[0] = np.fromiter(map(_PTR, mats), dtype=np.int64, count=k)
    if not k or not hasattr(type(mats[0]), "_c_contiguous"):  # (another cupy, in case)
        st = np.fromiter(chain.from_iterable(map(_STRIDES, mats)), dtype=np.int64, count=2 * k)
        addr[1:] = st.reshape(k, 2).T // itemsize
        return addr
    c = np.fromiter(map(_C_CONTIGUOUS, mats), dtype=bool, count=k)
    # (all C: an array flagged F as well has one axis of more than one element, whose stride
    # the C rule gives right, so F need not be read)
    f = np.zeros(k, bool) if c.all() else np.fromiter(map(_F_CONTIGUOUS, mats), bool, count=k)
    # (c and f both: an empty array, or one axis of more than one element, of stride 1)
    addr[1] = np.where(c & ~f, n, 1)
    addr[2] = np.where(f & ~c, m, 1)
    for i in np.flatnonzero(~(c | f)).tolist():
        s = mats[i].strides
        addr[1, i], addr[2, i] = s[0] // itemsize, s[1] // itemsize
    return addr


def in_place_layout(ml: "MatrixList") -> tuple | None:
    """A device list's arrays as one packed layout over the memory they already occupy:
    ``(base, offset, ld, order, span)``, the lowest address (bytes), each matrix's offset from
    it and leading dimension (elements), the order, and the elements from ``base`` to the end
    of the last matrix. Written in place there, a list needs no copy. None where its arrays
    cannot be read so: one without a unit stride along the order's axis (the same for all, as
    :attr:`MatrixList.packed_order` chooses), a stride of zero or less, an address that is not
    a multiple of the itemsize, or two matrices whose extents overlap (a matrix written twice
    at once). Empty matrices occupy nothing."""
    a = ml.addr
    if a is None or not ml.k:
        return None
    isz = ml.dtype.itemsize
    order = ml.packed_order
    inner, outer = (ml.m, ml.n) if order == "F" else (ml.n, ml.m)
    unit, ld = (a[1], a[2]) if order == "F" else (a[2], a[1])
    live = inner * outer > 0
    if not live.any():
        return None
    # (one column, or one row, has no leading dimension to respect: its own length is one)
    ld = np.where(live & (outer > 1), ld, np.maximum(inner, 1))
    ok = (unit == 1) | (inner <= 1)
    ok &= ld >= np.maximum(inner, 1)
    ptr = a[0]
    ok &= ptr % isz == 0
    if not ok[live].all():
        return None
    base = int(ptr[live].min())
    offset = np.where(live, (ptr - base) // isz, 0)
    end = _extent_end(ml.m, ml.n, offset, ld, order)
    at = np.flatnonzero(live)
    if _overlap(offset, end, at) is not None:
        return None
    offset.flags.writeable = ld.flags.writeable = False
    return base, offset, ld, order, int(end[at].max())


def extents(x: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The byte ranges ``[start, end)`` a device operand's matrices occupy (a packed batch: its
    whole buffer), or None where it holds no device memory (a host operand, anything else).
    Raises ValueError for a device list whose addresses were not read."""
    t = type(x)
    if t is PackedBatch and x.kind != "numpy":
        ptr = x.data.data.ptr
        return np.array([ptr]), np.array([ptr + x.data.nbytes])
    if t is not MatrixList or x.kind == "numpy":
        return None
    a = x.addr
    if a is None:
        raise ValueError("a device list without its addresses")
    isz, live = x.dtype.itemsize, x.m * x.n > 0
    down, right = (x.m - 1) * a[1], (x.n - 1) * a[2]
    lo = a[0] + isz * (np.minimum(down, 0) + np.minimum(right, 0))
    hi = a[0] + isz * (np.maximum(down, 0) + np.maximum(right, 0) + 1)
    return lo[live], hi[live]


def overlaps(a: tuple, b: tuple) -> bool:
    """Whether a range of ``b`` meets one of ``a`` (ranges of :func:`extents`; ``a``'s
    disjoint, as :func:`in_place_layout` requires of a list)."""
    if not len(a[0]) or not len(b[0]):
        return False
    order = np.argsort(a[0], kind="stable")
    start, end = a[0][order], a[1][order]
    # (a's ranges are disjoint: the last to start before b's end ends last of those that do)
    i = np.searchsorted(start, b[1], side="left") - 1
    hit = i >= 0
    return bool((end[i[hit]] > b[0][hit]).any())


def _one_kind(mats: Any, ndim: int) -> tuple | None:
    """``(array type, dtype)`` of a non-empty list (or tuple) of plain numpy arrays or of cupy
    arrays, all of one dtype and ``ndim`` dimensions; else None (a numpy subclass, a foreign
    framework's array, mixed types, dtypes or dimensions)."""
    if type(mats) not in (list, tuple) or not mats:
        return None
    types = set(map(type, mats))
    if len(types) != 1:
        return None
    t = types.pop()
    if t is not np.ndarray and array_kind(mats[0]) != "cupy":
        return None
    dtypes = set(map(_DTYPE, mats))
    if len(dtypes) != 1 or set(map(_NDIM, mats)) != {ndim}:
        return None
    return t, dtypes.pop()


def list_signature(mats: Any) -> tuple | None:
    """A list operand's part of a call's key (runtime/runtime.py): its arrays' type, dtype and
    shapes. A later list of the same signature is the same call on other data: it is staged
    without being validated again (:meth:`MatrixList.twin`). None where the list is not of
    one plain numpy or cupy array type and one supported dtype, all 2-D: it is then validated
    on every call (adopted frameworks, 1-D right-hand sides, anything the general pass
    names). Reading the shapes is the floor of any list call: ~0.05 us an array for numpy,
    ~0.1 for cupy by ``len`` and ``size`` (docs/decisions.md#host-list-reads)."""
    one = _one_kind(mats, 2)
    if one is None or one[1] not in SUPPORTED_DTYPES:
        return None
    t, dtype = one
    return t, dtype, _shapes(mats, t is not np.ndarray).tobytes()


def index_signature(mats: Any) -> tuple | None:
    """A list of 1-D integer arrays in a call's key (GETRS's pivots, which an op's
    ``Buffer.convert`` checks and packs on every call): its arrays' type, dtype and lengths;
    None for anything else."""
    one = _one_kind(mats, 1)
    if one is None or np.dtype(one[1]).kind not in "iu":
        return None
    return *one, "1-D", tuple(map(len, mats))


class MatrixList(BaseModel):
    """A validated list of 2-D arrays: one kind (numpy or cupy), one dtype; ``m`` and ``n``
    hold each array's rows and columns. With ``square=True`` (an operation's shape rule that
    needs it, checked in the same pass so one error lists every bad problem) each must be
    square."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    mats: list  # numpy or cupy arrays (a foreign array's DLPack view)
    kind: str
    dtype: Any
    m: Any
    n: Any
    frontend: str | None = None  # the framework of the caller's arrays (frontends.py)
    source: Any = None  # the caller's own arrays, when they were adopted (else mats)
    # Each array's address and strides in elements (int64, 3 x k), read in the validating pass
    # when every array is of one numpy or cupy type (None otherwise: read when needed).
    addr: Any = None
    # Which problems the caller gave as 1-D arrays (right-hand sides as SciPy takes them, read
    # as one column or one row: operands.operand); None when none was. Their outputs are 1-D.
    vector: Any = None

    @model_validator(mode="before")
    @classmethod
    def _describe(cls, values: Any) -> dict:
        mats = values["mats"] if isinstance(values, dict) else values
        square = bool(values.get("square", False)) if isinstance(values, dict) else False
        if not isinstance(mats, (list, tuple)):
            got = type(mats).__name__
            raise InputError([(None, f"expected a list of 2-D arrays, got {got}")])
        source = mats
        mats = list(mats)
        fast = _describe_uniform(mats, square)
        if fast is not None:
            return fast
        problems: list[tuple[int | None, str]] = []
        m = np.zeros(len(mats), dtype=np.int64)
        n = np.zeros(len(mats), dtype=np.int64)
        kind0 = dtype0 = label0 = fe0 = None
        first_dtype_at = first_kind_at = 0
        adopted = False
        for i, a in enumerate(mats):
            kind = array_kind(a)
            fe = None
            if kind is None and frontend_of(a) is not None:
                try:
                    a, fe = adopt(a)
                except ValueError as exc:
                    problems.append((i, str(exc)))
                    continue
                mats[i] = a
                adopted = True
                kind = array_kind(a)
            if kind is None:
                problems.append((i, f"expected a numpy, cupy, torch or JAX array (or one that "
                                    f"speaks DLPack), got {type(a).__name__}"))
                continue
            label = fe or kind
            if label != label0:
                if label0 is None:
                    kind0, label0, fe0, first_kind_at = kind, label, fe, i
                else:
                    problems.append(
                        (i, f"is a {label} array but problem {first_kind_at} is {label0} "
                            "(one batch, one kind)")
                    )
            dt = a.dtype
            if dtype0 is None or dt != dtype0:  # (numpy reads `dtype != None` as `!= float64`)
                bad = _dtype_problem(np.dtype(dt))
                if bad:
                    problems.append((i, bad))
                elif dtype0 is None:
                    dtype0, first_dtype_at = np.dtype(dt), i
                else:
                    problems.append(
                        (i, f"dtype {dt} differs from problem {first_dtype_at}'s {dtype0} "
                            "(a batch has one dtype)")
                    )
            shape = a.shape
            if len(shape) != 2:
                problems.append((i, f"not 2-D: shape {tuple(shape)}"))
            elif square and shape[0] != shape[1]:
                problems.append((i, f"not square: shape {tuple(shape)}"))
            else:
                m[i], n[i] = shape
        if problems:
            raise InputError(problems)
        n.flags.writeable = False
        if square or np.array_equal(m, n):
            m = n  # one array: a square batch is recognised by identity, at no cost
        else:
            m.flags.writeable = False
        return {
            "mats": mats,
            "kind": kind0 or "numpy",
            "dtype": dtype0 or np.dtype(np.float64),
            "m": m,
            "n": n,
            "frontend": fe0,
            "source": list(source) if adopted else mats,
        }

    def twin(self, mats: Any) -> "MatrixList":
        """This list's validated description over other arrays of the same
        :func:`list_signature` (the caller has checked it): the arrays and, for device arrays,
        their addresses are the new ones; sizes, dtype and kind are this list's (the same
        arrays, so a plan or layout keyed by them is found by identity)."""
        mats = list(mats)
        d = {**self.__dict__, "mats": mats, "source": mats}
        if self.kind != "numpy":
            addr = addresses(mats, self.dtype.itemsize, self.m, self.n)
            addr.flags.writeable = False
            d["addr"] = addr
        return constructed(MatrixList, d, self.__pydantic_fields_set__)

    def part(self, index: np.ndarray) -> "MatrixList":
        """The problems ``index`` of this list (a distributed call's shard), described from
        this list's validation: no array is read again."""
        idx = index.tolist()
        mats = [self.mats[i] for i in idx]
        m, n = self.m[index], self.n[index]
        m.flags.writeable = n.flags.writeable = False
        d = {**self.__dict__, "mats": mats, "m": m, "n": n,
             "source": mats if self.source is self.mats else [self.source[i] for i in idx],
             "addr": None if self.addr is None else self.addr[:, index],
             "vector": None if self.vector is None else np.asarray(self.vector)[index]}
        return constructed(MatrixList, d, self.__pydantic_fields_set__)

    @property
    def k(self) -> int:
        return len(self.mats)

    @property
    def packed_order(self) -> str:
        """The order a packed copy of these arrays takes so that copying them reads and writes
        along their unit strides: ``"F"`` where every array is column-major (Fortran-ordered,
        a batch's views), else ``"C"``. A row-major buffer gathered from column-major arrays
        read each warp's elements from 32 columns: a list of 2,000 matrices of up to 512 took
        11 ms more than the packed call (H100, 2026-11-25)."""
        a = self.addr
        if a is None:
            return "C"
        rs, cs = a[1], a[2]
        # (an empty array has nothing to read: its strides, which a device list may derive
        # rather than read, do not choose the order)
        empty = self.m * self.n == 0
        col = bool(np.all((rs == 1) | (self.m <= 1) | empty))
        row = bool(np.all((cs == 1) | (self.n <= 1) | empty))
        return "F" if col and not row else "C"


def staged_order(x: Any) -> str | None:
    """The order an operand is staged in: a packed batch's own, a list's packed copy's
    (:attr:`MatrixList.packed_order`); None for anything else (an absent operand)."""
    t = type(x)
    return x.order if t is PackedBatch else x.packed_order if t is MatrixList else None


def _pack_host(ml: "MatrixList", layout: "PackedBatch", data: np.ndarray, total: int) -> bool:
    """Plain numpy arrays into ``data`` (``layout``'s buffer) back to back by one
    ``np.concatenate``: of the matrices or their transposes where all have one shape, else of
    each flattened in the layout's order as it is copied. A Python step per array (a view and
    a copy into it) was most of packing such a list: 20,000 of 8 x 8, 1.39 / 0.98 us an array
    column- / row-major, 0.40 / 0.21 by one call; and at every size measured one call was as
    fast or faster (2,000 of U[1, 32]: 3.13 / 2.41 ms against 1.16 / 0.57; 200 of 50-150
    rows: 3.51 / 1.38 against 3.16 / 1.15; 2-core VM). False for subclasses (an
    ``np.matrix`` stays 2-D when flattened) and a layout with space no matrix fills (an empty
    matrix of a nonzero other dimension), which the caller's loop places one by one. What
    depends on the sizes alone is kept with the layout: found again, it is ~5 of the ~9 us
    this took for 10 matrices of 8 x 8."""
    mats = ml.mats
    k = len(mats)
    c = layout.cache()
    facts = c.get("host-pack")
    if facts is None:
        m, n = ml.m, ml.n
        one = bool(k) and (m == m[0]).all() and (n == n[0]).all()
        facts = c["host-pack"] = (
            bool(k) and total == int((m * n).sum()),
            (int(m[0]), int(n[0])) if one else None, total <= _PACK_SMALL * k)
    if not facts[0] or set(map(type, mats)) != {np.ndarray}:
        return False
    order = layout.order
    if ml.vector is None and facts[1] is not None:
        m0, n0 = facts[1]
        if order == "F":
            np.concatenate([a.T for a in mats], axis=0, out=data.reshape(k * n0, m0))
        else:
            np.concatenate(mats, axis=0, out=data.reshape(k * m0, n0))
        return True
    # Column-major: the transposes, which concatenate flattens as it copies (axis=None), where
    # a.T.ravel() copied each one first: 1.17 against 1.6 us an array, 20,000 of n <= 8.
    # Row-major, small: views of the arrays flattened (ravel without keywords: reshape(-1,
    # order=...) took 0.6 us an array, ravel 0.17; axis=None 0.8 against 0.5). Larger: the
    # arrays as they are, flattened as they are copied; ravel copies one not stored row by
    # row first (200 Fortran-ordered of 50-150 rows: 5.90 against 3.81 ms; 2-core VM).
    if order == "F":
        np.concatenate([a.T for a in mats], axis=None, out=data)
    elif facts[2]:
        np.concatenate([a.ravel() for a in mats], out=data)
    else:
        np.concatenate(mats, axis=None, out=data)
    return True


# The most elements a matrix may have on average for a row-major pack to flatten each array
# first (16 x 16): views where they are stored row by row, and cheaper than concatenate's own.
_PACK_SMALL = 256


class _Layout:
    """A layout's token: one per packed batch's cache (which its with_data twins share), and
    one for every live batch of an equal layout (:func:`layout_token`). A key holding it
    cannot be matched by a later layout, as an id could. ``arrays``: what an equal layout must
    equal (None: a batch that shares with none)."""

    __slots__ = ("__weakref__", "arrays", "entries")

    def __init__(self, arrays: tuple | None = None):
        self.arrays = arrays
        self.entries: dict | None = None  # (a backend's per-layout entries, made by it)


def layout_token(batch: "PackedBatch") -> _Layout:
    """The token of ``batch``'s layout, found on first use: that of a live batch of an equal
    layout (sizes, offsets, leading dimensions, order, dtype, buffer size, array kind and
    framework, for a batch of numbers), else a new one. A runtime keys its kept calls by it,
    so a batch packed afresh each call finds the kept call of the last one and replays it: a
    new layout's call validated, planned and built its device tables again (44 of a 90 ms
    in-place POTRF of 2 x 10^5 problems of U[1, 256] on an H200;
    docs/decisions.md#host-equal-layouts)."""
    c = batch.cache()
    t = c.get("layout")
    if t is None:
        t = c["layout"] = _equal_layout(batch)
    return t


def own_token(batch: "PackedBatch") -> _Layout:
    """A token of ``batch``'s own (and its with_data twins'), never another's: for an operand
    whose values validation reads, which a batch of an equal layout must not skip."""
    c = batch.cache()
    t = c.get("own")
    if t is None:
        t = c["own"] = _Layout()
    return t


_TOKENS: dict = {}  # a layout's digest -> weak references to the live tokens of that digest
_TOKENS_LOCK = threading.Lock()
_TOKENS_KEPT = 256


def _equal_layout(batch: "PackedBatch") -> _Layout:
    data = batch.data
    # Shared only by matrices of numbers: a backend's template (no data) may cache what is
    # not the layout's, and an index operand's values are checked by validation (a frontal
    # solve's rows), which a kept call's run skips.
    if data is None or data.dtype.kind not in "fc":
        return _Layout()
    n, off, ld = batch.n, batch.offset, batch.ld
    m = n if batch.m is None else batch.m
    k = len(n)
    # (a digest to find candidates by, then compared in full; the array kind and framework
    # too, which validation checks against the call's other operands and the write)
    key = (k, batch.order, data.dtype.str, int(data.size), array_kind(data), batch.frontend,
           int(n.sum()), int(m.sum()), int(off[-1]) if k else 0, int(ld[-1]) if k else 0)
    arrays = (n, m, ld, off)
    with _TOKENS_LOCK:
        refs = _TOKENS.get(key)
        if refs is not None:
            for r in refs:
                t = r()
                if t is not None and all(map(_same, t.arrays, arrays)):
                    return t
        t = _Layout(arrays)
        refs = [r for r in refs or () if r() is not None][-3:] + [weakref.ref(t)]
        _TOKENS.pop(key, None)
        while len(_TOKENS) >= _TOKENS_KEPT:
            _TOKENS.pop(next(iter(_TOKENS)))
        _TOKENS[key] = refs
    return t


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or np.array_equal(a, b)


def pack(mats: Any, order: Literal["F", "C"] = "C", backend: Any = None) -> PackedBatch:
    """Copy a list of arrays into one new buffer, once.

    Row-major (``order="C"``) is the default because that is how numpy and cupy arrays are
    usually laid out, so each matrix is one contiguous copy. A list of cupy arrays is gathered on
    the GPU by one kernel of ``backend`` (the CUDA backend: :func:`vbatch.pack` passes it), never
    one copy per matrix.
    """
    ml = mats if isinstance(mats, MatrixList) else validated(MatrixList, mats=mats)
    layout, total = tight_template(ml.m, ml.n, order)
    offset, ld = layout.offset, layout.ld
    if ml.kind == "numpy":
        data = np.empty(total, dtype=ml.dtype)
        if not _pack_host(ml, layout, data, total):
            fortran = order == "F"
            for i, a in enumerate(ml.mats):
                r, c = int(ml.m[i]), int(ml.n[i])
                if r and c:
                    flat = data[offset[i] : offset[i] + r * c]
                    view = flat.reshape(r, c, order="F" if fortran else "C")
                    view[...] = a
    else:
        if backend is None:
            raise ValueError(f"a list of {ml.kind} arrays is gathered on its device: pass the "
                             "backend (vbatch.pack does)")
        data = backend.gather(ml.mats, ml.m, ml.n, offset, ld, ml.dtype, order, ml.addr)
    return layout.with_data(data)
