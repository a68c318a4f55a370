"""POTRF on the CPU: what each launch kind of a batched (partial) Cholesky does to one problem.

Buffers: ``a`` (input) and ``l`` (output; ``a`` itself in place). A task is ``(q, j, w, b)``:
problem ``q``, panel columns ``[j, j + w)`` of block column ``b`` (a blocked factorization's
panel is brought up to date from the columns ``[b, j)``, the block update having applied those
left of ``b`` to it in the output); for ``schur``, ``(q, p, n - p, 0)``.

* ``fused``:  the panel of the output is copied from the input, brought up to date (``syrk`` on
  the diagonal block, ``gemm`` below it), its diagonal block factored (``potrf``) and the rows
  below solved (``trsm``);
* ``update``, ``trsm``: the same, in two launches (separated plans): the update factors the
  diagonal block too;
* ``schur``: the trailing block copied and updated by ``syrk`` (partial factorizations).

Where a problem fits in one panel (the default panel width is 512) its fused task is the whole
problem: ``lacpy`` of the lower triangle, one ``potrf`` and, for a partial factorization,
``trsm`` and ``syrk`` for the Schur complement in the same task (its schur task is then dropped),
so a tiny problem costs a few ctypes calls. Where numba is installed, small whole problems of a
packed input run instead as one compiled loop a chunk (``_potrf_small``, ``SMALL_FLOPS``).

``info`` follows reference LAPACK: the first pivot that is not > 0, NaN included (OpenBLAS's
``potrf`` misses NaN; a vectorized scan of the diagonals at the end catches it). A failed
problem's columns before the failing one hold its factor, as the partial factorization of those
columns would, and the failing pivot holds the value LAPACK tested (a_jj less the squares of
row j of L before it): on a failed ``potrf`` the diagonal block is restored, its leading
columns refactored, the rows below solved against them and the pivot reduced by its row.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from vbatch.core import jit
from vbatch.kernels.cpu import INFO, Data, split
from vbatch.core.jit import njit, strides
from vbatch.kernels.lapack import Calls
from vbatch.ops.cholesky import FUSED, SCHUR, TRSM, UPDATE

OP = "potrf"
# Whole problems of at most this many flops (the factorization and its Schur complement) of
# packed operands run as one compiled loop per thread's share of a launch, where numba is
# installed: a whole problem costs 4 ctypes calls and their Python out of place (~8 us), ~10 in
# place (~30 us, as a multifrontal factorization's fronts are). Measured on the 2-core VM,
# problems of order n, either order, two runs, us a problem, loop / LAPACK: out of place n = 64
# 29-53 / 32-40, 80 40-68 / 39-59, 96 48-95 / 40-73; in place n = 96 39-89 / 53-99, 128 72-166 /
# 87-208 (n^3/3 = 87k, 171k, 295k, 699k flops; docs/decisions.md#cpu-small-loops).
SMALL_FLOPS = 1 << 19  # in place
SMALL_FLOPS_COPY = 1 << 17  # out of place


def plan_defaults(dtype) -> dict:
    # A problem that fits in one panel is one LAPACK potrf, the fastest single-core code;
    # wider problems are blocked, and their tasks get the BLAS's threads when they dominate a
    # launch. The sweep of nb 64 / 256 / 512 / 1024 on the 2-core VM
    # (docs/decisions.md#cpu-panel-512, 2026-11-21) put 512 at or near the best everywhere. No
    # shared-memory limit: always fused.
    # Not blocked: a panel of 512 is one LAPACK potrf, which blocks for the caches itself.
    return {"nb": 512, "fused_max_rows": int(np.iinfo(np.int64).max), "streams": 1, "block": 0,
            "block_above": 0, "block_few": 0, "block_few_above": 0}


# What `python -m vbatch tune` measures (vbatch.runtime.tune): the panel width, from the sweep's
# candidates (docs/decisions.md#cpu-panel-512), on batches a few seconds' work in all.
TUNE = (("nb", (64, 128, 256, 512, 1024)),)
TUNE_WORKLOADS = (("uniform", 500, 128), ("uniform", 100, 512), ("skewed", 200, 512))


def check_options(dtype, options: dict) -> None:
    from vbatch.ops.cholesky import check_block

    check_block(int(options["nb"]), options.get("block", 0))


@dataclass
class State:
    """Per plan: each launch's work, each problem's n and npiv."""

    work: list
    n: list
    p: list
    p_arr: np.ndarray


def _launch_flops(kind: str, j, w, m, b=0) -> np.ndarray:
    """Operation counts of one launch's tasks (j: first panel column, w: width, m = n - j,
    b: the block column, whose update reads the columns [b, j))."""
    j, w, m, b = (np.asarray(x, dtype=np.float64) for x in (j, w, m, b))
    upd = 2.0 * m * w * (j - b)
    pot = w**3 / 3
    trs = w * w * np.maximum(m - w, 0)
    return {FUSED: upd + pot + trs, UPDATE: upd + pot, TRSM: trs}[kind]


def prepare(backend, plan, launches) -> State:
    t = plan.tasks
    k = plan.k
    code = {kd.name: i for i, kd in enumerate(plan.kinds)}
    is_schur = t.kind == code.get("potrf.schur", -1)
    panel = t.kind == code.get("potrf.panel", -1)
    p = np.bincount(t.problem[panel], weights=t.width[panel], minlength=k).astype(np.int64)
    n = np.zeros(k, dtype=np.int64)
    first = panel & (t.cols == 0)
    n[t.problem[first]] = t.rows[first]
    n[t.problem[is_schur]] = t.cols[is_schur] + t.rows[is_schur]
    folded = np.zeros(k, dtype=bool)  # schur done by the problem's one fused task
    work = {}
    for lc in launches:
        q = t.problem[lc.lo:lc.hi]
        a0, a1 = t.args[lc.lo:lc.hi, 0], t.args[lc.lo:lc.hi, 1]
        a2 = t.args[lc.lo:lc.hi, 2]
        if lc.kind == SCHUR:
            keep = ~folded[q]
            q, a0, a1, a2 = q[keep], a0[keep], a1[keep], a2[keep]
            cost = a1.astype(np.float64) ** 2 * a0 + 1.0
            whole = np.zeros(len(q), dtype=bool)
        else:
            m = n[q] - a0
            cost = _launch_flops(lc.kind, a0, a1, m, a2) + 1.0
            whole = (lc.kind == FUSED) & (a0 == 0) & (a1 == p[q])
            if lc.kind == FUSED:
                tr = (n[q] - p[q]).astype(np.float64)
                cost = cost + np.where(whole, tr * tr * a1, 0.0)
                folded[q[whole & (tr > 0)]] = True
        tasks = list(zip(q.tolist(), a0.tolist(), a1.tolist(), a2.tolist()))
        # a small problem is the compiled loop's even where it would be "wide" (few problems,
        # many threads: on 16 cores every problem of a 20-problem batch was wide)
        small = whole & (cost <= SMALL_FLOPS) if jit.AVAILABLE else None
        work[lc.index] = split(tasks, cost, whole, backend.threads.size, small,
                               lambda ts: [_tabled(ts, n)])
    return State(work, n.tolist(), p.tolist(), p)


@dataclass
class Small:
    """A chunk's small whole problems, decided once per plan: ``table`` their ``(q, n, p)``
    rows for the loop in place; ``copy`` those within the out-of-place limit and ``rest`` the
    others' tasks (LAPACK's path out of place). Deciding per call cost ~15 us of numpy a
    chunk."""

    table: np.ndarray
    copy: np.ndarray
    rest: list


def _tabled(tasks: list, n: np.ndarray) -> Small:
    """A chunk of small whole problems as one :class:`Small`."""
    table = np.array([(q, int(n[q]), p) for q, _, p, _ in tasks], dtype=np.int64).reshape(-1, 3)
    nn, pp = table[:, 1].astype(np.float64), table[:, 2].astype(np.float64)
    uu = nn - pp
    copy = pp**3 / 3 + pp * pp * uu + pp * uu * uu <= SMALL_FLOPS_COPY
    rest = [t for t, c in zip(tasks, copy.tolist()) if not c]
    return Small(table, table[copy], rest)


# ------------------------------------------------------------------ running tasks
def run(backend, ex, lc, whole: bool, tasks: list) -> None:
    kind = lc.kind
    a, out = ex.buffers["a"], ex.buffers["l"]
    c = backend.calls(out.dtype, out.order)
    if tasks and isinstance(tasks[0], Small):  # small whole problems (_tabled)
        sm, tasks = tasks[0], tasks[1:]
        if a is out:
            _small(ex, a, out, sm.table)
        else:  # out of place, LAPACK's path is cheaper: its crossover is lower
            if len(sm.copy):
                _small(ex, a, out, sm.copy)
            tasks = sm.rest + tasks
    if whole and a is not out:
        _whole(backend, ex, c, a, out, tasks)
    else:
        for q, j, w, b in tasks:
            _task(backend, ex, c, a, out, kind, q, j, w, b)


def calls(backend, ex, lc, whole: bool, tasks: list, names: list) -> list | None:
    """The chunk ``tasks`` of ``lc`` as the compiled loop's call on buffers laid out as
    ``ex``'s (CpuBackend.replayer), or None where the loop does not take all of it. Its
    ``info`` is complete: the loop tests every pivot (NaN included), which is what
    :func:`finish` adds to LAPACK's."""
    if len(tasks) != 1 or not isinstance(tasks[0], Small):
        return None
    a, out = ex.buffers["a"], ex.buffers["l"]
    inplace = a is out
    sm = tasks[0]
    if not inplace and sm.rest:
        return None
    return [(_potrf_small, (sm.table if inplace else sm.copy, INFO,
                            Data(names.index("a")), *jit.packed(a.batch)[1:],
                            Data(names.index("l")), *jit.packed(out.batch)[1:], inplace))]


def _small(ex, a, out, table: np.ndarray) -> None:
    _potrf_small(table, ex.info, *jit.packed(a.batch), *jit.packed(out.batch), a is out)


@njit(cache=True, nogil=True, error_model="numpy")
def _potrf_small(rows, info, A, ao, al, acol, L, lo, ll, lcol, inplace):
    """Whole problems ``(q, n, p)``: the Cholesky factor of the leading ``p`` columns and, for
    ``p < n``, the Schur complement in the trailing block, as the fused task does with LAPACK.
    Left-looking, a column at a time: column ``j`` is the input's minus the earlier columns'
    products (:func:`_column`), so a pivot that is not > 0 (NaN included; +inf passes, as in
    reference LAPACK) stops with the columns before it factored, that pivot (as tested) on the
    diagonal, the rest as it was (the input's, copied out of place), and ``info`` at that
    column. Zeros above the diagonal of the factored columns, and (on success) above the
    trailing block and in the block above it. Only the input's lower triangle is read."""
    # (in double precision, of A's kind: real or complex)
    col = np.zeros(max(rows[:, 1].max(), 1) if rows.shape[0] else 1) + A[:0].sum()
    z = col[:0].sum()  # (a zero of col's type: _column's sums in its precision)
    for t in range(rows.shape[0]):
        q, n, p = rows[t, 0], rows[t, 1], rows[t, 2]
        if info[q] != 0:
            continue
        ar, ac = strides(al, acol, q, False)
        lr, lc = strides(ll, lcol, q, False)
        a0, uar, uac = np.uint64(ao[q]), np.uint64(ar), np.uint64(ac)
        l0, ulr, ulc = np.uint64(lo[q]), np.uint64(lr), np.uint64(lc)
        un = np.uint64(n)
        done = p  # columns factored
        d = 0.0
        for jj in range(p):
            j = np.uint64(jj)
            _column(A, a0, uar, uac, L, l0, ulr, ulc, j, un, j, col, z)
            d = col[j].real  # (a Hermitian matrix's diagonal is real: its imaginary part unread)
            if not d > 0.0:
                info[q] = jj + 1
                done = jj
                break
            piv = np.sqrt(d)
            for i in range(j + np.uint64(1), un):
                L[l0 + i * ulr + j * ulc] = col[i] / piv
            L[l0 + j * ulr + j * ulc] = piv
        for j in range(np.uint64(done)):  # zeros above the factored columns' diagonal
            for i in range(j):
                L[l0 + i * ulr + j * ulc] = 0.0
        if done < p:
            ud = np.uint64(done)
            if not inplace:  # the columns from the failed one on as they were (the input's)
                for j in range(ud, un):
                    for i in range(j, un):
                        L[l0 + i * ulr + j * ulc] = A[a0 + i * uar + j * uac]
            # LAPACK's leading block ends with the pivot it tested; zeros above it
            L[l0 + ud * ulr + ud * ulc] = d
            for i in range(ud):
                L[l0 + i * ulr + ud * ulc] = 0.0
            continue
        for j in range(np.uint64(p), un):  # the Schur complement, lower triangle; zeros above
            for i in range(j):
                L[l0 + i * ulr + j * ulc] = 0.0
            _column(A, a0, uar, uac, L, l0, ulr, ulc, j, un, np.uint64(p), col, z)
            for i in range(j, un):
                L[l0 + i * ulr + j * ulc] = col[i]
            L[l0 + j * ulr + j * ulc] = col[j].real  # (a Hermitian diagonal is real, as ZHERK's)


@njit(cache=True, nogil=True, inline="always")
def _column(A, a0, ar, ac, L, l0, lr, lc, j, n, kend, col, z):
    """``col[i] := A[i, j] - sum_{k < kend} L[i, k] conj(L[j, k])`` for ``i`` in ``[j, n)``, in
    double precision (unsigned indices: see blas_cpu._gemm_block). Where L's columns are
    contiguous, as sums of its columns (the inner loop down a column, vectorized); else as a
    dot product per entry, along L's rows."""
    if lr == 1:
        for i in range(j, n):
            col[i] = A[a0 + i * ar + j * ac]
        for k in range(kend):
            f = (z + L[l0 + j + k * lc]).conjugate()
            lk = l0 + k * lc
            for i in range(j, n):
                col[i] -= L[lk + i] * f
        return
    lj = l0 + j * lr
    for i in range(j, n):
        s = z + A[a0 + i * ar + j * ac]
        li = l0 + i * lr
        for k in range(kend):
            s -= (z + L[li + k * lc]) * L[lj + k * lc].conjugate()
        col[i] = s


def _whole(backend, ex, c: Calls, a, out, tasks: list) -> None:
    """Problems factored entirely by one task, out of place: copy the lower triangle,
    ``potrf``, and for a partial factorization ``trsm`` and ``syrk`` (the Schur complement). The
    common case, so its Python is kept to a few ctypes calls per problem: the output buffer
    starts as zeros, so nothing above the diagonal needs writing."""
    f = c.f
    lacpy, potrf = f["lacpy"], f["potrf"]
    ii, pn, plds, pld, pinfo = c._i, c._ia, c._ia + 4, c._ia + 8, c._ia + 12
    lo = c.lo
    ns = ex.states[OP].n
    sb, so, sl, db, do, dl = a.base, a.off, a.ld, out.base, out.off, out.ld
    for q, _, p, _ in tasks:
        n = ns[q]
        ld = dl[q]
        ii[0], ii[1], ii[2] = n, sl[q], ld
        d = db + do[q]
        lacpy(lo, pn, pn, sb + so[q], plds, d, pld)
        ii[0] = p
        potrf(lo, pn, d, pld, pinfo)
        if ii[3]:
            # The general path redoes the problem from the input, leaving the columns before
            # the failing one factored.
            _task(backend, ex, c, a, out, FUSED, q, 0, p, 0)
            continue
        if p < n:
            c.trsm_right_lower_t(c.at(d, ld, p, 0), d, n - p, p, ld)
            c.syrk_lower(c.at(d, ld, p, p), c.at(d, ld, p, 0), n - p, p, ld)


def _task(backend, ex, c: Calls, a, out, kind: str, q: int, j: int, w: int, b: int = 0) -> None:
    if ex.info[q]:
        return  # failed at an earlier step: stop, like LAPACK
    n = ex.states[OP].n[q]
    ld, lds = out.ld[q], a.ld[q]
    src = a.base + a.off[q]
    dst = out.base + out.off[q]
    out_of_place = a is not out
    if kind == SCHUR:
        _schur(c, src, dst, n, j, ld, lds, out_of_place)
        return
    m = n - j
    diag = c.at(dst, ld, j, j)
    if kind in (FUSED, UPDATE):
        # The panel: rows [j, n) of columns [j, j + w), lower trapezoid (only the lower
        # triangle of the input is read).
        # A panel of a later block column (b > 0) is in the output already, up to date with
        # the columns left of b (the block update).
        if out_of_place and not b:
            c.copy("L", c.at(src, lds, j, j), diag, m, w, lds, ld)
        if j > b:
            c.syrk_lower(diag, c.at(dst, ld, j, b), w, j - b, ld)
            c.gemm_nt(c.at(dst, ld, j + w, j), c.at(dst, ld, j + w, b), c.at(dst, ld, j, b),
                      m - w, w, j - b, ld)
        if not _potf2(backend, ex, c, q, j, w, m, ld, src, lds, diag, out_of_place):
            return
    if kind in (FUSED, TRSM):
        c.trsm_right_lower_t(c.at(dst, ld, j + w, j), diag, m - w, w, ld)
    if kind == FUSED and j == 0 and w == ex.states[OP].p[q] and w < n:
        # The problem's one panel: its Schur complement too (its schur task was dropped).
        _schur(c, src, dst, n, w, ld, lds, out_of_place)


def _schur(c: Calls, src, dst, n, p, ld, lds, out_of_place) -> None:
    """A22 - L21 L21^H in the trailing block, its diagonal real; zeros above it and in the
    (1, 2) block."""
    tr = n - p
    if out_of_place:
        c.copy("L", c.at(src, lds, p, p), c.at(dst, ld, p, p), tr, tr, lds, ld)
    c.syrk_lower(c.at(dst, ld, p, p), c.at(dst, ld, p, 0), tr, p, ld)
    if p == 0:  # (zherk, which p = 0 does not call, makes a complex diagonal real)
        s = c.view(dst, tr, ld)
        if s.dtype.kind == "c":
            s[np.diag_indices(tr)] = s.diagonal().real
    c.zero("U", c.at(dst, ld, p, p), tr, tr, ld)
    c.zero("A", c.at(dst, ld, 0, p), p, tr, ld)


def _potf2(backend, ex, c: Calls, q, j, w, m, ld, src, lds, diag, out_of_place) -> bool:
    """Factor the diagonal block; zeros above it and above the panel. On a failed pivot, leave
    the columns before it factored (rows below solved too), the tested pivot in its place, and
    record ``info``."""
    # The block before potrf, to come back to on failure: the input itself when nothing
    # updated it and it is not the output, else a copy.
    if out_of_place and j == 0:
        keep, keep_ld = src, lds
    else:
        buf = backend.scratch(w * w, ex.buffers["l"].dtype)
        keep, keep_ld = buf.ctypes.data, max(w, 1)
        c.copy("L", diag, keep, w, w, ld, keep_ld)
    c.zero("A", c.at(diag, ld, -j, 0), j, w, ld)  # X(0, j): above the panel
    f = c.potrf_lower(diag, w, ld)
    if not f:
        c.zero("U", diag, w, w, ld)
        return True
    # LAPACK's leading f x f block ends with the pivot it tested (a_gg less the squares of row
    # g of L before it), which its potrf leaves in place: kept as is, since recomputing it
    # rounds otherwise and can turn a pivot that failed at -1e-14 positive.
    tested = c.view(diag, f, ld)[f - 1, f - 1].real
    # Factor the g = f - 1 columns that can be, from the block as it was.
    g = f - 1
    while g > 0:
        c.copy("L", keep, diag, w, w, keep_ld, ld)
        r = c.potrf_lower(diag, g, ld)
        if not r:
            break
        f, g = r, r - 1  # a pivot that passed in the first try failed now (rounding)
        tested = c.view(diag, f, ld)[f - 1, f - 1].real
    if g > 0:
        c.trsm_right_lower_t(c.at(diag, ld, g, 0), diag, m - g, g, ld)
    d = c.view(diag, g + 1, ld)
    if tested > 0:  # (a LAPACK that does not leave it: the same sum, never above 0)
        k = c.view(keep, g + 1, keep_ld)
        tested = min((k[g, g] - d[g, :g] @ d[g, :g].conj()).real, 0.0)
    d[g, g] = tested  # (the rows below it in that column are unspecified)
    c.zero("U", diag, g + 1, g + 1, ld)
    ex.info[q] = j + f
    return False


# ------------------------------------------------------------------ the end of a call
def finish(backend, ex) -> np.ndarray:
    """``info``: LAPACK's, or the first pivot that is not > 0 (NaN included) if earlier."""
    out = ex.buffers["l"]
    info = ex.info
    diag, owner, first = _pivots(ex.plan, out, ex.states[OP].p_arr)
    if len(diag):
        bad = np.flatnonzero(~(out.batch.data[diag].real > 0))
        if len(bad):
            q, at = np.unique(owner[bad], return_index=True)
            col = (bad[at] - first[q] + 1).astype(np.int32)
            cur = info[q]
            info[q] = np.where((cur == 0) | (col < cur), col, cur)
    return info


def _pivots(plan, out, p):
    """Element index of every pivot L(i, i), i < p (offset + i (ld + 1) in either layout), the
    problem owning each, and each problem's first. Per output layout: cached on the buffer's
    batch (its layout never changes), or on the plan for a list's output, which is laid out
    from the plan's sizes alone."""
    b = out.batch
    cache = plan.cache if out.from_list else b.cache()
    key = ("potrf-pivots", id(plan), b.order)
    hit = cache.get(key)
    if hit is None or hit[3]() is not plan:  # (a later plan may take a dead one's id)
        first = np.zeros(plan.k + 1, dtype=np.int64)
        np.cumsum(p, out=first[1:])
        owner = np.repeat(np.arange(plan.k), p)
        diag = (np.repeat(b.offset, p) + (np.arange(int(first[-1])) - first[owner])
                * np.repeat(b.ld + 1, p))
        hit = cache[key] = (diag, owner, first, weakref.ref(plan))
    return hit[:3]
