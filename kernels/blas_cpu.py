"""The ``blas`` kernel family on the CPU: GEMM joins, diagonal blocks, copies, on views.

A task is ``(q, r0, mm, k0, kk, nn, c0, src)`` (:mod:`vbatch.ops.blas`); its kind's ``params``
name the op's buffers it reads and writes, and whether each is seen transposed. A task whose
``src`` is set first copies its rows of X in from its kind's source (:func:`_bring_in`), then
runs as any other. Each task is one call of
scipy's BLAS (through :mod:`vbatch.kernels.lapack`: ctypes, the GIL released) on numpy views of
the operands, or a numpy copy. The CPU plans triangular ops with a base larger than any problem
(``blas_nb``), so a ``trsm`` is one ``dtrsm`` per problem (and ``potrs`` two): the recursion into
GEMMs is what a GPU needs, and a CPU's BLAS blocks for its caches itself.

Small tasks (at most ``SMALL_FLOPS``) of packed operands run instead as compiled loops where
numba is installed, a thread's share of a launch in one call (``_gemm_small``, ``_diag_small``,
``_copy_small``): around a BLAS call, the views and ctypes cost ~30 us a task.

A view is a numpy array over the buffer: packed outputs and inputs through their batch, a list's
inputs as the caller's arrays. BLAS takes column-major operands, so a view whose rows are
contiguous is passed as its transpose with the opposite ``trans`` flag (and a product whose
output is row-contiguous is computed transposed).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from vbatch.core import jit
from vbatch.kernels.cpu import INFO, Data, split
from vbatch.core.jit import njit, strides
from vbatch.kernels.lapack import Scalars, routines
from vbatch.ops.blas import COPY, GEMM, TRMM, TRSM

OP = "blas"
# Larger than any problem: one diagonal task per problem, a whole dtrsm/dtrmm.
WHOLE = 1 << 30
# Tasks of at most this many flops run as compiled loops, a thread's share of a launch in one
# call, where numba is installed: the Python and ctypes around one BLAS call cost ~30 us a task
# (a multifrontal solve is ~200,000 tasks of a few hundred flops), while the loops run at 5-16
# GFLOP/s. Measured on the 2-core VM (vbatch's gemm and trsm on packed n x n batches of either
# order, us a problem, loops / BLAS): GEMM n = 32 29-38 / 58-83, 64 53-55 / 91-93, 80 76-151 /
# 105-115; TRSM (n right-hand sides) n = 64 67-86 / 113-114, 80 107-127 / 120-130
# (docs/decisions.md#cpu-small-loops).
SMALL_FLOPS = 1 << 19


def plan_defaults(dtype) -> dict:
    return {"blas_nb": WHOLE, "streams": 1}


@dataclass
class State:
    work: dict


def prepare(backend, plan, launches) -> State:
    t = plan.tasks
    work = {}
    for lc in launches:
        sl = slice(lc.lo, lc.hi)
        a = t.args[sl]
        kd = plan.kinds[int(t.kind[lc.lo])]
        cost = kd.flops(a, t.rows[sl], t.cols[sl], t.width[sl]) + 1.0
        tasks = list(zip(t.problem[sl].tolist(), *(a[:, i].tolist() for i in range(a.shape[1]))))
        # A small task is a compiled loop's even where it would be "wide" (longer than its
        # share of a launch of few tasks: with 16 threads, a launch of 9 copies made every
        # copy wide, and the BLAS path ran them all).
        small = cost <= SMALL_FLOPS if jit.AVAILABLE else None
        work[lc.index] = split(tasks, cost, np.zeros(len(tasks), dtype=bool),
                               backend.threads.size, small, _tabled)
    return State(work)


def _tabled(tasks: list) -> list:
    """A chunk of small tasks as one table (an int64 array of task rows, run by the compiled
    loops)."""
    return [np.array(tasks, dtype=np.int64)]


def finish(backend, ex) -> np.ndarray:
    return ex.info


# ------------------------------------------------------------------ views
def _matrix(view, q: int) -> np.ndarray:
    """Problem ``q`` of a staged buffer as a numpy array (the buffer's own orientation)."""
    return view.batch._view(q)


def _view(ex, name: str, q: int, t: int) -> np.ndarray:
    """The view's matrix, transposed when ``t``'s bit 0 says (its conjugate bit is the
    caller's: :func:`_op` passes it to BLAS)."""
    m = _matrix(ex.buffers[name], q)
    return m.T if t & 1 else m


class _Args:
    """One thread's ctypes argument slots (BLAS takes every argument by reference)."""

    def __init__(self, dtype):
        self.i = (ctypes.c_int * 8)()
        self.s = Scalars(dtype, 2)
        self.ia = ctypes.addressof(self.i)
        self.f = routines(dtype)

    def ints(self, *vals) -> list[int]:
        for k, v in enumerate(vals):
            self.i[k] = v
        return [self.ia + 4 * k for k in range(len(vals))]


_local = threading.local()


def _args(dtype) -> _Args:
    d = _local.__dict__.setdefault("args", {})
    a = d.get(np.dtype(dtype))
    if a is None:
        a = d[np.dtype(dtype)] = _Args(dtype)
    return a


def _blas(m: np.ndarray):
    """``(trans, address, ld)``: ``m`` as BLAS sees it, column-major itself (``b"N"``) or the
    transpose of a column-major matrix (``b"T"``); ``None`` when it is neither (a copy is
    needed)."""
    isz = m.itemsize
    r, c = m.shape
    s0, s1 = m.strides
    # (one row is column-major whatever its row stride: HERK takes no transposed operand)
    if (s0 == isz or r <= 1) and (c <= 1 or s1 >= max(r, 1) * isz):
        return b"N", m.ctypes.data, max(s1 // isz if c > 1 else r, 1)
    if s1 == isz and (r <= 1 or s0 >= max(c, 1) * isz):
        return b"T", m.ctypes.data, max(s0 // isz if r > 1 else c, 1)
    return None


def _op(m: np.ndarray, conj) -> tuple:
    """``(trans, address, ld, owner)``: ``m`` (conjugated when ``conj``) as BLAS reads it:
    column-major (``b"N"``), the transpose (``b"T"``) or the conjugate transpose (``b"C"``) of a
    column-major matrix, ``owner`` the array at ``address``: ``m`` itself, or a column-major
    copy where BLAS has no such form (a conjugate without a transpose, or neither order)."""
    conj = bool(conj) and m.dtype.kind == "c"
    b = _blas(m)
    if b is not None and not (conj and b[0] == b"N"):
        return (b"C" if conj else b[0], b[1], b[2], m)
    x = np.asfortranarray(m.conj() if conj else m)
    return _blas(x) + (x,)


def _scalar(ex, which: str):
    if which == "conj_alpha":  # (HER2K's second product)
        return np.conj(ex.scalars.get("alpha", 1.0))
    return {"alpha": ex.scalars.get("alpha", 1.0), "beta": ex.scalars.get("beta", 0.0),
            "minus": -1.0, "one": 1.0, "zero": 0.0}[which]


# ------------------------------------------------------------------ tasks
def run(backend, ex, lc, whole: bool, tasks: list) -> None:
    kd = next(k for k in ex.plan.kinds if k.name == lc.task_kind)
    p = kd.param
    fn = {COPY: _copy, GEMM: _gemm, TRSM: _diag, TRMM: _diag}[lc.kind]
    skip = p.get("skip_failed", 0)
    src = lc.kind != COPY and p["src"]  # (a copy's own src is what it copies)
    for task in tasks:
        if isinstance(task, np.ndarray):  # a table of small tasks (_tabled)
            calls = _small_calls(lc.kind, p, task, lambda name: _layout(ex, name),
                                 lambda which: _scalar(ex, which))
            if calls is not None:
                for kernel, args in calls:
                    kernel(*(ex.info if a is INFO else a for a in args))
                continue
            rows = [tuple(r) for r in task.tolist()]  # (a symmetric copy: the views' path)
        else:
            rows = (task,)
        for row in rows:
            if src:  # (also for a problem skipped below: POSV's failed ones keep B)
                _bring_in(ex, lc.kind, p, row)
            if skip and ex.info[row[0]]:
                continue
            fn(ex, lc.kind, p, *row)


def calls(backend, ex, lc, whole: bool, tasks: list, names: list) -> list | None:
    """The chunk ``tasks`` of ``lc`` as compiled loops' calls on buffers laid out as ``ex``'s,
    the call's arrays as :class:`~vbatch.kernels.cpu.Data` (their place in ``names``) and
    ``INFO`` (CpuBackend.replayer); None where it is not one table of small tasks."""
    if len(tasks) != 1 or not isinstance(tasks[0], np.ndarray):
        return None
    p = next(k for k in ex.plan.kinds if k.name == lc.task_kind).param
    if lc.kind == COPY and p["sym"] and ex.buffers[p["src"]].batch is ex.buffers[p["dst"]].batch:
        return None  # (mirrored in place: the views' path)

    def lay(name):
        return (Data(names.index(name)),) + _layout(ex, name)[1:]

    return _small_calls(lc.kind, p, tasks[0], lay, lambda which: _scalar(ex, which))


def _bring_in(ex, lk, p, task) -> None:
    """The rows of X that ``task`` writes first (its ``src`` arg): ``X[r0:r0+mm, c0:c0+nn] :=
    scale S`` (a diagonal block's X, a join's output)."""
    dst, t = (p["x"], p["tx"]) if lk in (TRSM, TRMM) else (p["o"], p["tc"])
    q, r0, mm, _, _, nn, c0, fresh = task
    if fresh:
        _assign(_view(ex, dst, q, t)[r0:r0 + mm, c0:c0 + nn],
                _view(ex, p["src"], q, t)[r0:r0 + mm, c0:c0 + nn], _scalar(ex, p["scale"]))


def _copy(ex, lk, p, q, r0, mm, k0, kk, nn, c0, src=0) -> None:
    source = _view(ex, p["src"], q, p["t"])[:mm, :nn]
    dst = _view(ex, p["dst"], q, p["t"])[:mm, :nn]
    alpha = _scalar(ex, p["alpha"])
    if p["sym"]:  # src's one triangle, mirrored (a square block); Hermitian: conjugated
        tri = np.tril if p["sym"] == "lower" else np.triu
        herm = p["t"] & 2 and source.dtype.kind == "c"
        mirror = tri(source, -1 if p["sym"] == "lower" else 1).T
        whole = tri(source) + (mirror.conj() if herm else mirror)
        if herm:
            whole[np.diag_indices(mm)] = whole.diagonal().real
        np.multiply(whole, dst.dtype.type(alpha), out=dst)
        return
    _assign(dst, source, alpha)


def _assign(dst: np.ndarray, src: np.ndarray, alpha: float) -> None:
    """``dst := alpha src`` (src not read when alpha is 0, as BLAS)."""
    if alpha == 0.0:
        dst[...] = 0  # BLAS: with alpha = 0, B is not read
    elif alpha == 1.0:
        if not np.shares_memory(src, dst):
            np.copyto(dst, src)
    else:
        np.multiply(src, dst.dtype.type(alpha), out=dst)


def _gemm(ex, lk, p, q, r0, mm, k0, kk, nn, c0, src=0) -> None:
    out = _view(ex, p["o"], q, p["tc"])
    o = out[r0:r0 + mm, c0:c0 + nn]
    alpha, beta = _scalar(ex, p["alpha"]), _scalar(ex, p["beta"])
    if p["c"]:
        c = _view(ex, p["c"], q, p["tc"])[r0:r0 + mm, c0:c0 + nn]
        if not np.shares_memory(c, o):
            np.copyto(o, c)  # BLAS updates in place: C into the output first
    elif beta != 0.0:
        raise ValueError("a GEMM task without C must have beta = 0")
    if not p["c"]:
        beta = 0.0
    a = _view(ex, p["a"], q, p["ta"])[r0:r0 + mm, k0:k0 + kk]
    b = _view(ex, p["b"], q, p["tb"])[k0:k0 + kk, c0:c0 + nn]
    ca, cb = p["ta"] & 2, p["tb"] & 2
    uplo = p["uplo"]
    # A Hermitian product (HERK, HER2K, a Cholesky's update) leaves a real diagonal, as BLAS.
    herm = uplo and (ca != cb) and o.dtype.kind == "c"
    if kk == 0 or alpha == 0.0:
        if beta == 0.0:
            _zero(o, uplo)
        elif beta != 1.0:
            _scale(o, beta, uplo)
    elif uplo:
        # B is A's own rows transposed (a SYRK) when the block starts on the diagonal; a
        # blocked Cholesky's block update is such a SYRK on its top nn rows and a GEMM below.
        syrk = p["a"] == p["b"] and (p["ta"] ^ p["tb"]) & 1 and r0 == c0
        if syrk and uplo == "lower" and mm > nn:
            _syrk(a[:nn], ca, cb, o[:nn], alpha, beta, uplo)
            _gemm_into(o[nn:], a[nn:], b, alpha, beta, ca, cb)
        elif syrk and mm == nn:
            _syrk(a, ca, cb, o, alpha, beta, uplo)
        else:  # (SYR2K's products) the whole product, then its triangle
            m = _tri_mask(o.shape, uplo)
            prod = np.matmul(a.conj() if ca else a, b.conj() if cb else b)
            o[m] = alpha * prod[m] + (beta * o[m] if beta != 0.0 else 0.0)
    else:
        _gemm_into(o, a, b, alpha, beta, ca, cb)
    if herm:  # (the block starts on o's diagonal)
        d = np.arange(min(mm, nn))
        o[d, d] = o[d, d].real


def _gemm_into(o: np.ndarray, a: np.ndarray, b: np.ndarray, alpha, beta, ca=0, cb=0) -> None:
    """``o := alpha op(a) op(b) + beta o`` by the BLAS, on views (``o`` contiguous in one
    dimension), ``op`` conjugating where ``ca``/``cb``."""
    mm, nn = o.shape
    kk = a.shape[1]
    args = _args(o.dtype)
    bo = _blas(o)
    if bo is None:
        raise ValueError("a GEMM output view must be contiguous in one dimension")
    if bo[0] == b"N":  # O = op(A) op(B), column-major
        x, cx, y, cy, m_, n_ = a, ca, b, cb, mm, nn
    else:  # O^T = op(B)^T op(A)^T: O's storage is column-major O^T
        x, cx, y, cy, m_, n_ = b.T, cb, a.T, ca, nn, mm
    ox, oy = _op(x, cx), _op(y, cy)
    args.s.put(0, alpha)
    args.s.put(1, beta)
    pm, pn, pk, plx, ply, plo = args.ints(m_, n_, kk, ox[2], oy[2], bo[2])
    args.f["gemm"](ox[0], oy[0], pm, pn, pk, args.s.at(0), ox[1], plx, oy[1], ply,
                   args.s.at(1), bo[1], plo)


def _tri_mask(shape, uplo: str) -> np.ndarray:
    r, c = np.indices(shape)
    return r >= c if uplo == "lower" else r <= c


def _zero(o: np.ndarray, uplo: str) -> None:
    if not uplo:
        o[...] = 0
    else:
        o[_tri_mask(o.shape, uplo)] = 0


def _scale(o: np.ndarray, beta, uplo: str) -> None:
    if not uplo:
        o *= beta
    else:
        m = _tri_mask(o.shape, uplo)
        o[m] *= beta


def _syrk(a: np.ndarray, ca, cb, o: np.ndarray, alpha, beta, uplo: str) -> None:
    """``o := alpha op(a) op(a)^T + beta o`` in one triangle of o (the SYRK case: B is A's
    transpose), ``op`` conjugating where ``ca``/``cb`` says: one of them, a HERK (``x x^H``
    for x = a or conj(a)); both, a SYRK of conj(a)."""
    args = _args(o.dtype)
    bo = _blas(o)
    cplx = o.dtype.kind == "c"
    herm = cplx and bool(ca) != bool(cb)
    x = (a if cb else a.conj()) if herm else (a.conj() if cplx and ca else a)
    lower = uplo == "lower"
    if bo[0] == b"T":  # o's storage holds o^T: the other triangle, of (x x^H)^T = x' x'^H
        lower = not lower
        if herm:
            x = x.conj()
    b = _blas(x)
    if b is None or (herm and b[0] == b"T"):  # (HERK's "C" would give conj(x) conj(x)^H)
        x = np.asfortranarray(x)
        b = _blas(x)
    n, k = x.shape
    args.s.put(0, alpha)
    args.s.put(1, beta)
    pn, pk, pla, plo = args.ints(n, k, b[2], bo[2])
    args.f["herk" if herm else "syrk"](b"L" if lower else b"U", b[0], pn, pk, args.s.at(0),
                                       b[1], pla, args.s.at(1), bo[1], plo)


def _diag(ex, lk, p, q, r0, mm, k0, kk, nn, c0, src=0) -> None:
    """``X[o:o+w] := T[o:o+w, o:o+w]^{-1} X[o:o+w]`` (TRSM) or ``T X`` (TRMM), on views (T
    conjugated where its view says)."""
    o, w = r0, mm
    t = _view(ex, p["t"], q, p["tt"])[o:o + w, o:o + w]
    x = _view(ex, p["x"], q, p["tx"])[o:o + w, :nn]
    bx = _blas(x)
    if bx is None:
        raise ValueError("a right-hand side view must be contiguous in one dimension")
    lower = bool(p["lower"])
    if bx[0] == b"N":  # X column-major: op(T_s) X = ...
        side, (m_, n_) = b"L", (w, nn)
    else:  # X stored as X^T (nn x w): X^T := X^T op(T^T)^{-1}
        side, (m_, n_), t, lower = b"R", (nn, w), t.T, not lower
    bt = _op(t, p["tt"] & 2)
    if bt[0] != b"N":  # the stored matrix is T's transpose: its triangle is the other one
        lower = not lower
    args = _args(x.dtype)
    args.s.put(0, 1.0)
    fn = args.f["trsm" if lk == TRSM else "trmm"]
    pm, pn, plt, plx = args.ints(m_, n_, bt[2], bx[2])
    fn(side, b"L" if lower else b"U", bt[0], b"U" if p["unit"] else b"N", pm, pn,
       args.s.at(0), bt[1], plt, bx[1], plx)


# ------------------------------------------------------------------ compiled small tasks
def _layout(ex, name: str):
    """A staged operand as the compiled loops read it (:func:`jit.packed`)."""
    return jit.packed(ex.buffers[name].batch)


def _small_calls(lk, p, rows: np.ndarray, lay, scalar) -> list | None:
    """The compiled loops that run the table of small tasks ``rows`` of a launch of kind
    ``lk`` (params ``p``), as ``[(kernel, args), ...]`` in order: the rows' X brought in from
    their ``src``, then the tasks. ``lay(name)`` gives an operand's layout (:func:`_layout`),
    ``scalar(which)`` a scalar's value; ``INFO`` stands for the per-problem status. None for a
    symmetric copy in place (the views' path reads the source whole first)."""
    skip = bool(p.get("skip_failed", 0))
    calls = []
    if lk != COPY and p["src"]:
        fresh = rows[rows[:, 7] != 0]  # (also for a problem skipped: POSV's failed keep B)
        if len(fresh):
            dst, t = (p["x"], p["tx"]) if lk in (TRSM, TRMM) else (p["o"], p["tc"])
            calls.append((_copy_small, (fresh, *lay(p["src"]), *lay(dst), bool(t & 1),
                                        scalar(p["scale"]), 0, False)))
    if lk == GEMM:
        o = lay(p["o"])
        c = lay(p["c"]) if p["c"] else o
        beta = scalar(p["beta"]) if p["c"] else 0.0
        uplo = {"": 0, "lower": 1, "upper": 2}[p["uplo"]]
        ca, cb = bool(p["ta"] & 2), bool(p["tb"] & 2)
        calls.append((_gemm_small, (rows, INFO, skip, *lay(p["a"]), bool(p["ta"] & 1), ca,
                                    *lay(p["b"]), bool(p["tb"] & 1), cb, *c, *o,
                                    bool(p["tc"] & 1), bool(p["c"]), scalar(p["alpha"]), beta,
                                    uplo, bool(uplo) and ca != cb)))
    elif lk in (TRSM, TRMM):
        calls.append((_diag_small, (rows, INFO, skip, *lay(p["t"]), bool(p["tt"] & 1),
                                    bool(p["tt"] & 2), *lay(p["x"]), bool(p["tx"] & 1),
                                    bool(p["lower"]), bool(p["unit"]), lk == TRSM)))
    else:
        src, dst = lay(p["src"]), lay(p["dst"])
        sym = {"": 0, "lower": 1, "upper": 2}[p["sym"]]
        if sym and type(src[0]) is np.ndarray and np.may_share_memory(src[0], dst[0]):
            return None
        calls.append((_copy_small, (rows, *src, *dst, bool(p["t"] & 1), scalar(p["alpha"]),
                                    sym, bool(p["t"] & 2))))
    return calls


@njit(cache=True, nogil=True, error_model="numpy")
def _gemm_small(rows, info, skip, A, ao, al, ac, ta, ca, B, bo, bl, bc, tb, cb, C, co, cl, cc,
                D, oo, ol, oc, tc, has_c, alpha, beta, uplo, herm):
    """``D := alpha op(A) op(B) + beta C`` on every task row ``(q, r0, mm, k0, kk, nn, c0)``:
    rows ``[r0, r0 + mm)`` and columns ``[c0, c0 + nn)`` of ``D`` (the output), inner range
    ``[k0, k0 + kk)``; ``op`` transposes (``ta``, ``tb``) and conjugates (``ca``, ``cb``);
    ``uplo`` 1/2 writes only the lower/upper triangle of the ``mm x nn`` block, the other one
    taking C's entries as they are (the views' path copies C into D first); ``herm``: the
    block's diagonal is real (a Hermitian product's). As BLAS: A and B are not read when alpha
    is 0, nor C when beta is 0."""
    # (sums in double precision, of D's kind: real or complex)
    acc = np.zeros(max(rows[:, 2].max(), rows[:, 5].max(), 1) if rows.shape[0] else 1) + \
        D[:0].sum()
    for t in range(rows.shape[0]):
        q, r0, mm, k0, kk, nn, cs = rows[t, 0], rows[t, 1], rows[t, 2], rows[t, 3], \
            rows[t, 4], rows[t, 5], rows[t, 6]
        if skip and info[q] != 0:
            continue
        ar, ak = strides(al, ac, q, ta)
        bk, bj = strides(bl, bc, q, tb)
        cr, cj = strides(cl, cc, q, tc)
        orr, oj = strides(ol, oc, q, tc)
        a0 = ao[q] + r0 * ar + k0 * ak
        b0 = bo[q] + k0 * bk + cs * bj
        c0 = co[q] + r0 * cr + cs * cj
        o0 = oo[q] + r0 * orr + cs * oj
        if ar == 1 or bj != 1:
            _gemm_block(A, a0, ar, ak, ca, B, b0, bk, bj, cb, C, c0, cr, cj, D, o0, orr, oj,
                        mm, kk, nn, has_c, alpha, beta, uplo, herm, acc)
        else:  # A's rows contiguous, B's: D^T = op(B)^T op(A)^T, the inner loop along B's rows
            _gemm_block(B, b0, bj, bk, cb, A, a0, ak, ar, ca, C, c0, cj, cr, D, o0, oj, orr,
                        nn, kk, mm, has_c, alpha, beta, (3 - uplo) % 3, herm, acc)


@njit(cache=True, nogil=True, inline="always")
def _gemm_block(A, a0, ar, ak, ca, B, b0, bk, bj, cb, C, c0, cr, cj, D, o0, orr, oj, mm, kk,
                nn, has_c, alpha, beta, uplo, herm, acc):
    """One task of :func:`_gemm_small`, strides in elements. A column of D is a sum of A's
    columns, so the inner loop runs down a column of A (a dot product per entry ran along A's
    rows: 0.5 GFLOP/s at 16^3). Indices are unsigned: a signed one is checked for wrapping
    around on every access, which kept LLVM from vectorizing the loop (4.6x at 32^3)."""
    ua0, uar, uak = np.uint64(a0), np.uint64(ar), np.uint64(ak)
    ub0, ubk, ubj = np.uint64(b0), np.uint64(bk), np.uint64(bj)
    uc0, ucr, ucj = np.uint64(c0), np.uint64(cr), np.uint64(cj)
    uo0, uor, uoj = np.uint64(o0), np.uint64(orr), np.uint64(oj)
    for jj in range(nn):
        j = np.uint64(jj)
        lo = j if uplo == 1 else np.uint64(0)
        hi = np.uint64(min(mm, jj + 1) if uplo == 2 else mm)
        if has_c and uplo != 0:
            for i in range(np.uint64(mm)):
                if i < lo or i >= hi:
                    D[uo0 + i * uor + j * uoj] = C[uc0 + i * ucr + j * ucj]
        for i in range(lo, hi):
            acc[i] = 0.0
        if alpha != 0.0:
            for kx in range(np.uint64(kk)):
                b = B[ub0 + kx * ubk + j * ubj]
                if cb:
                    b = b.conjugate()
                ak0 = ua0 + kx * uak
                if ca:  # (a branch outside the loops that vectorize)
                    for i in range(lo, hi):
                        acc[i] += A[ak0 + i * uar].conjugate() * b
                elif ar == 1:
                    for i in range(lo, hi):
                        acc[i] += A[ak0 + i] * b
                else:
                    for i in range(lo, hi):
                        acc[i] += A[ak0 + i * uar] * b
        for i in range(lo, hi):
            v = alpha * acc[i]
            if has_c and beta != 0.0:
                v += beta * C[uc0 + i * ucr + j * ucj]
            if herm and i == j:
                v = v.real
            D[uo0 + i * uor + j * uoj] = v


@njit(cache=True, nogil=True, error_model="numpy")
def _diag_small(rows, info, skip, T, to, tl, tcol, tt, ct, X, xo, xl, xcol, tx, lower, unit,
                solve):
    """Every task row ``(q, o, w, -, -, nn)``: ``X[o:o+w, :nn] := T_s^{-1} X`` (``solve``) or
    ``T_s X``, ``T_s`` the lower (``lower``) or upper triangle of the view's ``T[o:o+w,
    o:o+w]`` (conjugated when ``ct``), with ones on its diagonal when ``unit``.

    A zero on T's diagonal gives infinities and NaNs in its problem's X, as the BLAS's
    ``trsm`` does (numpy's error model: no exception for a division by zero, which would fail
    the whole batch). Right-looking, a pivot row ``p`` at a time: a solve divides row p by its
    diagonal entry, then takes T[i, p] times it from the rows below (lower) or above it; a
    product adds T[i, p] times row p to those rows, then scales row p, pivots taken in the
    order that leaves each row p as it was until its own step. The update runs along X's rows
    where they are contiguous, else down X's columns (and T's): inner loops over contiguous
    memory, unsigned indices (see :func:`_gemm_block`)."""
    for t in range(rows.shape[0]):
        q, o, w, nn = rows[t, 0], rows[t, 1], rows[t, 2], rows[t, 5]
        if skip and info[q] != 0:
            continue
        tr, tc = strides(tl, tcol, q, tt)
        xr, xc = strides(xl, xcol, q, tx)
        ut0 = np.uint64(to[q] + o * tr + o * tc)
        ux0 = np.uint64(xo[q] + o * xr)
        utr, utc, uxr, uxc = np.uint64(tr), np.uint64(tc), np.uint64(xr), np.uint64(xc)
        uw, unn = np.uint64(w), np.uint64(nn)
        down = lower == solve  # pivots in increasing order
        if xc == 1:  # X's rows contiguous: whole rows at a time
            for step in range(uw):
                p = step if down else uw - np.uint64(1) - step
                lo, hi = (p + np.uint64(1), uw) if lower else (np.uint64(0), p)
                xp = ux0 + p * uxr
                d = 1.0 if unit else T[ut0 + p * utr + p * utc]
                if ct:
                    d = d.conjugate()
                if solve and d != 1.0:
                    for j in range(unn):
                        X[xp + j] = X[xp + j] / d
                sign = -1.0 if solve else 1.0
                for i in range(lo, hi):
                    f = sign * T[ut0 + i * utr + p * utc]
                    if ct:
                        f = f.conjugate()
                    xi = ux0 + i * uxr
                    for j in range(unn):
                        X[xi + j] += f * X[xp + j]
                if not solve and d != 1.0:
                    for j in range(unn):
                        X[xp + j] = d * X[xp + j]
            continue
        for j in range(unn):  # a column of X at a time
            xj = ux0 + j * uxc
            for step in range(uw):
                p = step if down else uw - np.uint64(1) - step
                lo, hi = (p + np.uint64(1), uw) if lower else (np.uint64(0), p)
                d = 1.0 if unit else T[ut0 + p * utr + p * utc]
                if ct:
                    d = d.conjugate()
                v = X[xj + p * uxr]
                if solve:
                    v = v / d
                    X[xj + p * uxr] = v
                    v = -v
                tp = ut0 + p * utc
                if ct:
                    for i in range(lo, hi):
                        X[xj + i * uxr] += T[tp + i * utr].conjugate() * v
                elif utr == 1 and uxr == 1:
                    for i in range(lo, hi):
                        X[xj + i] += T[tp + i] * v
                else:
                    for i in range(lo, hi):
                        X[xj + i * uxr] += T[tp + i * utr] * v
                if not solve:
                    X[xj + p * uxr] = d * v


@njit(cache=True, nogil=True, error_model="numpy")
def _copy_small(rows, S, so, sl, scol, D, do, dl, dcol, t, alpha, sym, herm):
    """``dst[r0:r0+mm, c0:c0+nn] := alpha src[...]`` for every task row ``(q, r0, mm, -, -, nn,
    c0)`` (a copy's: ``(q, 0, m, -, -, n, 0)``); src is not read when alpha is 0. ``sym`` 1/2:
    src is symmetric, its lower/upper triangle read (entry (j, i) for (i, j) outside it);
    ``herm``: Hermitian, that entry conjugated and the diagonal's imaginary part 0."""
    for r in range(rows.shape[0]):
        q, r0, mm, nn, c0 = rows[r, 0], rows[r, 1], rows[r, 2], rows[r, 5], rows[r, 6]
        sr, sc = strides(sl, scol, q, t)
        dr, dc = strides(dl, dcol, q, t)
        s0 = np.uint64(so[q] + r0 * sr + c0 * sc)
        d0 = np.uint64(do[q] + r0 * dr + c0 * dc)
        usr, usc, udr, udc = np.uint64(sr), np.uint64(sc), np.uint64(dr), np.uint64(dc)
        for j in range(np.uint64(nn)):
            if sym == 0 and alpha != 0.0:  # (unsigned indices: see _gemm_block)
                for i in range(np.uint64(mm)):
                    D[d0 + i * udr + j * udc] = alpha * S[s0 + i * usr + j * usc]
                continue
            for i in range(np.uint64(mm)):
                mirror = (sym == 1 and i < j) or (sym == 2 and i > j)
                at = s0 + j * usr + i * usc if mirror else s0 + i * usr + j * usc
                s = S[at]
                if herm and mirror:
                    s = s.conjugate()
                elif herm and i == j:
                    s = s.real
                D[d0 + i * udr + j * udc] = 0.0 if alpha == 0.0 else alpha * s
