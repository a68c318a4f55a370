"""Nested dissection through METIS, the two halves of a large graph ordered side by side.

The analysis of a large matrix is METIS-bound: one ``METIS_NodeND`` call took 84% of the
300^2 Laplacian's analysis and 83% of the 40^3 one's (cProfile, 2-core VM, 2026-11-25: 282 of
335 ms, 361 of 433 ms). METIS cannot be run in threads: pymetis holds the GIL for the call,
and METIS called through ctypes (which releases it) draws from GKlib's one process-wide random
state, so two calls at once gave a different order on every run (the 300^2 Laplacian's fill
2,352,472 to 2,409,348 over four runs). So a large graph is split once and its two halves are
ordered by METIS in two worker processes:

1. the graph is bisected (``METIS_PartGraphRecursive``, 2 parts, least edge cut);
2. a least vertex cover of the cut edges becomes the vertex separator (Konig's theorem: a
   maximum matching of the cut's bipartite graph); every path between the two halves'
   remaining vertices crosses it. Fiduccia-Mattheyses moves then shrink it (``_refine``):
   the cover is least for that cut, not among separators (300^2 Laplacian: 331 vertices,
   311 refined, METIS's own 300);
3. each half is ordered by ``METIS_NodeND`` in a process of its own (``python -I -S``: no site,
   no numpy, only ctypes and pymetis's extension module, whose C entry points METIS exports;
   started in ~20 ms), the two at once;
4. the order is the first half's, the second's, then the separator: nested dissection's own
   numbering of one level.

Only one level: separators below the top, found this way, cost fill that METIS's own refined
ones do not (the notes below). Graphs below ``PARALLEL_MIN`` vertices take one
``METIS_NodeND`` call in this process (the order pymetis's ``nested_dissection`` gives); above
it, a half whose worker cannot run (one core, no Python interpreter to start, a worker that
fails) is ordered in this process, so the order is the same on every machine.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np

from vbatch.core.jit import missing, njit

# Below this many vertices a graph is ordered in one call: METIS takes ~24 ms for the 100^2
# Laplacian (10,000 vertices; 2-core VM), about what starting the workers and the split's
# numpy work cost. Split, the 300^2 Laplacian (90,000 vertices) took 0.17 s against 0.29 s.
PARALLEL_MIN = 50_000

# Measured on the 2-core VM (2026-11-25; fill = entries of L, flops of the factorization,
# against one METIS_NodeND call; the halves ordered in threads, which the random state makes
# irreproducible, so each figure is one run): 300^2 Laplacian, one split fill +2.2 to +3.8%,
# flops +6.5 to +7%; two levels (4 pieces) fill +6.7%, flops +16%; 40^3 Laplacian, one split
# fill -0.8 to -2.5%, flops -3 to 0%; two levels fill +14%, flops +28%.

_METIS_OK = 1
_lib = None
# One METIS call at a time in this process: the calls release the GIL (ctypes), and two at
# once would share GKlib's random state (runtimes analysing in several threads).
_METIS_LOCK = threading.Lock()


def _library() -> str:
    try:
        import pymetis._internal as ext
    except ImportError:
        raise missing("pymetis", "vbatch.sparse's nested-dissection ordering") from None
    return ext.__file__


def _metis():
    """pymetis's METIS through ctypes (idx_t is 64-bit there: a call with 32-bit arrays
    returns METIS_ERROR_MEMORY)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(_library())
        for name in ("METIS_NodeND", "METIS_PartGraphRecursive", "METIS_SetDefaultOptions"):
            getattr(lib, name).restype = ctypes.c_int
        _lib = lib
    return _lib


def _p(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _options() -> np.ndarray:
    opts = np.zeros(40, np.int64)  # METIS_NOPTIONS
    _metis().METIS_SetDefaultOptions(_p(opts))
    return opts


def node_nd(xadj: np.ndarray, adjncy: np.ndarray) -> np.ndarray:
    """METIS's nested-dissection order of the graph (CSR, no self loops), ``perm[new] = old``:
    METIS's first output, which matches SuperLU's MMD in fill (analysis._nd's note)."""
    n = len(xadj) - 1
    if n == 0:
        return np.zeros(0, np.int64)
    nv = np.array([n], np.int64)
    xadj = np.ascontiguousarray(xadj, np.int64)
    adjncy = np.ascontiguousarray(adjncy, np.int64)
    perm = np.empty(n, np.int64)
    iperm = np.empty(n, np.int64)
    lib, opts = _metis(), _options()
    with _METIS_LOCK:
        rc = lib.METIS_NodeND(_p(nv), _p(xadj), _p(adjncy), None, _p(opts), _p(perm), _p(iperm))
    if rc != _METIS_OK:
        raise RuntimeError(f"METIS_NodeND failed (status {rc}) on a graph of {n} vertices")
    return perm


def _bisect(xadj: np.ndarray, adjncy: np.ndarray) -> np.ndarray:
    """Each vertex's side (0 or 1) in METIS's least-edge-cut bisection."""
    n = len(xadj) - 1
    nv, ncon, nparts = (np.array([v], np.int64) for v in (n, 1, 2))
    cut = np.zeros(1, np.int64)
    part = np.empty(n, np.int64)
    lib, opts = _metis(), _options()
    with _METIS_LOCK:
        rc = lib.METIS_PartGraphRecursive(_p(nv), _p(ncon), _p(xadj), _p(adjncy), None, None,
                                          None, _p(nparts), None, None, _p(opts), _p(cut),
                                          _p(part))
    if rc != _METIS_OK:
        raise RuntimeError(f"METIS_PartGraphRecursive failed (status {rc}) on {n} vertices")
    return part


def _cover(a: np.ndarray, b: np.ndarray, na: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """A least vertex cover of the bipartite graph of edges ``a[e] - b[e]`` (``a`` in
    ``range(na)``, ``b`` in ``range(nb)``), by Konig's theorem: a maximum matching, then the
    vertices reachable from the first side's unmatched ones along alternating paths; the
    cover is the first side's unreached vertices and the second side's reached ones."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import breadth_first_order, maximum_bipartite_matching

    g = sp.csr_matrix((np.ones(len(a), np.int32), (a, b)), shape=(na, nb))  # (repeats summed)
    match = maximum_bipartite_matching(g, perm_type="column")  # a -> its b, or -1
    # Directed: a -> b along non-matching edges, b -> a along matching ones, and a source
    # (vertex na + nb) -> every unmatched a.
    ga, gb = g.nonzero()
    matched = match[ga] == gb
    free = np.flatnonzero(match < 0)
    src = np.concatenate([ga[~matched], na + gb[matched], np.full(len(free), na + nb)])
    dst = np.concatenate([na + gb[~matched], ga[matched], free])
    d = sp.csr_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(na + nb + 1,) * 2)
    reached = np.zeros(na + nb + 1, bool)
    reached[breadth_first_order(d, na + nb, directed=True, return_predecessors=False)] = True
    return np.flatnonzero(~reached[:na]), np.flatnonzero(reached[na:na + nb])


def _induced(xadj: np.ndarray, adjncy: np.ndarray, src: np.ndarray,
             keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The subgraph on the vertices where ``keep`` holds: its CSR, and its vertices' numbers
    in the graph (``src``: each adjacency entry's own vertex)."""
    verts = np.flatnonzero(keep)
    new = np.full(len(keep), -1, np.int64)
    new[verts] = np.arange(len(verts))
    edge = keep[src] & keep[adjncy]
    sx = np.zeros(len(verts) + 1, np.int64)
    np.cumsum(np.bincount(new[src[edge]], minlength=len(verts)), out=sx[1:])
    return sx, new[adjncy[edge]], verts  # (entries stay in row order: CSR as it was)


def _split(xadj: np.ndarray, adjncy: np.ndarray):
    """A vertex separator from METIS's bisection (the least cover of its cut edges, then
    refined), and the two halves without it: ``None`` where a half is left empty (nothing to
    gain)."""
    n = len(xadj) - 1
    part = _bisect(xadj, adjncy)
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(xadj))
    cross = (part[src] == 0) & (part[adjncy] == 1)  # each cut edge once, side 0 first
    bu, iu = np.unique(src[cross], return_inverse=True)
    bv, iv = np.unique(adjncy[cross], return_inverse=True)
    cu, cv = _cover(iu, iv, len(bu), len(bv))
    where = part.astype(np.int8)
    where[bu[cu]] = 2
    where[bv[cv]] = 2
    _refine(xadj, adjncy, where, REFINE_PASSES, REFINE_PATIENCE, REFINE_BALANCE)
    sep = np.flatnonzero(where == 2)
    halves = [where == t for t in (0, 1)]
    if not halves[0].any() or not halves[1].any():
        return None
    return sep, [_induced(xadj, adjncy, src, h) for h in halves]


# The separator's refinement (``_refine``): passes at most, non-improving moves a pass may
# make before it stops, and the largest side as a fraction of the vertices. The cover of an
# edge bisection's cut is least for that cut, not among separators: on the 300^2 Laplacian it
# was 331 vertices where METIS's own top separator is 300, and the root front's 331^3 cost the
# split's order 13% more flops than one METIS call (H100 host, 2026-11-25). 1.1: METIS's own
# unbalance allowance for ordering separators (ORDER_UNBALANCE_FRACTION in its source).
REFINE_PASSES = 16
REFINE_PATIENCE = 1024
REFINE_BALANCE = 0.55


@njit(cache=True, inline="always")
def _count_sides(xadj, adjncy, where, v, ed):
    """``ed[v]``: how many of ``v``'s neighbours lie on side 0, on side 1."""
    ed[v, 0] = 0
    ed[v, 1] = 0
    for e in range(xadj[v], xadj[v + 1]):
        w = where[adjncy[e]]
        if w < 2:
            ed[v, w] += 1


@njit(cache=True)
def _refine(xadj, adjncy, where, passes, patience, balance):
    """Fiduccia-Mattheyses on a vertex separator (``where``: 0 and 1 the sides, 2 the
    separator; no edge joins 0 and 1), in place: a separator vertex moves to a side and pulls
    its neighbours from the other side into the separator; each pass moves each vertex at most
    once, always the move that shrinks the separator most (ties: the lighter largest side, then
    the lower vertex), keeping every side at most ``balance`` of the vertices, and ends at its
    best state (least separator, then best balance), after ``patience`` moves without one.
    Deterministic: the same graph and start give the same separator on every machine."""
    n = len(where)
    maxside = max(int(balance * n), (where == 0).sum(), (where == 1).sum())
    ed = np.zeros((n, 2), np.int64)  # a separator vertex's neighbours on side 0, side 1
    locked = np.zeros(n, np.bool_)
    logv = np.empty(n + 1, np.int64)  # moves: vertex, its place before
    logw = np.empty(n + 1, np.int8)
    for _ in range(passes):
        pw = np.zeros(3, np.int64)
        for v in range(n):
            pw[where[v]] += 1
        seps = np.flatnonzero(where == 2)
        cap = len(seps) + n // 8 + 16
        sl = np.empty(cap, np.int64)  # the separator as a list, with each vertex's slot
        slot = np.full(n, -1, np.int64)
        ns = 0
        for v in seps:
            sl[ns] = v
            slot[v] = ns
            ns += 1
            _count_sides(xadj, adjncy, where, v, ed)
        best, bestbal, bestat, nlog, idle = pw[2], abs(pw[0] - pw[1]), 0, 0, 0
        while idle < patience:
            pick, to, gain, heavy = -1, -1, -(1 << 62), 1 << 62
            for i in range(ns):
                v = sl[i]
                if locked[v]:
                    continue
                for t in range(2):
                    o = 1 - t
                    if pw[t] + 1 > maxside:
                        continue
                    g = 1 - ed[v, o]
                    h = max(pw[t] + 1, pw[o] - ed[v, o])
                    if g > gain or (g == gain and (h < heavy or (h == heavy and v < pick))):
                        pick, to, gain, heavy = v, t, g, h
            if pick < 0 or nlog + 1 + ed[pick, 1 - to] > n:
                break
            o = 1 - to
            # pick leaves the separator for side `to`
            i = slot[pick]
            ns -= 1
            sl[i] = sl[ns]
            slot[sl[i]] = i
            slot[pick] = -1
            where[pick] = to
            pw[2] -= 1
            pw[to] += 1
            locked[pick] = True
            logv[nlog] = pick
            logw[nlog] = 2
            nlog += 1
            for e in range(xadj[pick], xadj[pick + 1]):
                w = adjncy[e]
                if where[w] == 2:
                    ed[w, to] += 1
            # its neighbours on the other side join the separator
            for e in range(xadj[pick], xadj[pick + 1]):
                u = adjncy[e]
                if where[u] != o:
                    continue
                where[u] = 2
                pw[o] -= 1
                pw[2] += 1
                logv[nlog] = u
                logw[nlog] = o
                nlog += 1
                if ns == cap:  # (grown: a separator larger than the slots made)
                    cap *= 2
                    grown = np.empty(cap, np.int64)
                    grown[:ns] = sl[:ns]
                    sl = grown
                sl[ns] = u
                slot[u] = ns
                ns += 1
                _count_sides(xadj, adjncy, where, u, ed)
                for f in range(xadj[u], xadj[u + 1]):  # u left side o
                    x = adjncy[f]
                    if where[x] == 2:
                        ed[x, o] -= 1
            bal = abs(pw[0] - pw[1])
            if pw[2] < best or (pw[2] == best and bal < bestbal):
                best, bestbal, bestat, idle = pw[2], bal, nlog, 0
            else:
                idle += 1
        for j in range(nlog - 1, bestat - 1, -1):  # back to the pass's best state
            where[logv[j]] = logw[j]
        for j in range(nlog):
            locked[logv[j]] = False
        if bestat == 0:
            break


# The worker: reads graphs, each n, the entry count, xadj and adjncy (int64, little-endian),
# until its input ends, and writes for each METIS_NodeND's status and perm. Its C stdout (where
# METIS prints its errors) goes to stderr, so that only the answers travel on the pipe. Every
# METIS call seeds GKlib's random state afresh, so a graph's order does not depend on the
# calls before it: the same as in this process.
_WORKER = r"""
import ctypes, os, sys
out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
lib = ctypes.CDLL(sys.argv[1])
inp = sys.stdin.buffer
I = ctypes.c_int64
while True:
    head = inp.read(16)
    if len(head) < 16:
        break
    n, m = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
    xadj = (I * (n + 1)).from_buffer(bytearray(inp.read(8 * (n + 1))))
    adjncy = (I * max(m, 1)).from_buffer(bytearray(inp.read(8 * m).ljust(8, b"\0")))
    opts = (I * 40)()
    lib.METIS_SetDefaultOptions(opts)
    perm, iperm = (I * max(n, 1))(), (I * max(n, 1))()
    rc = lib.METIS_NodeND(ctypes.byref(I(n)), xadj, adjncy, None, opts, perm, iperm)
    out.write(int(rc).to_bytes(8, "little", signed=True))
    out.write(bytes(perm)[: 8 * n])
out.flush()
"""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _workers_possible() -> bool:
    """Whether worker processes can help here: two cores usable by this process, and an
    executable that is a Python interpreter (a frozen or embedded application's would start
    the application itself)."""
    cores = _cores()
    exe = sys.executable or ""
    name = os.path.basename(exe).lower()
    return (cores >= 2 and not getattr(sys, "frozen", False)
            and name.startswith(("python", "pypy")) and os.path.isfile(exe))


def _start():
    # (stderr, where METIS's messages go, to nowhere: a worker blocked writing a full stderr
    # pipe that nobody reads until its stdout ends would never end it)
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WORKER, _library()],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)


def _graph_bytes(xadj: np.ndarray, adjncy: np.ndarray) -> bytes:
    n, m = len(xadj) - 1, len(adjncy)
    return b"".join((n.to_bytes(8, "little"), m.to_bytes(8, "little"),
                     xadj.astype("<i8", copy=False).tobytes(),
                     adjncy.astype("<i8", copy=False).tobytes()))


def _send(proc, xadj: np.ndarray, adjncy: np.ndarray) -> bool:
    """The half's graph to its worker; False (the worker ended) if it could not be sent."""
    n, m = len(xadj) - 1, len(adjncy)
    try:
        proc.stdin.write(n.to_bytes(8, "little") + m.to_bytes(8, "little"))
        proc.stdin.write(xadj.astype("<i8", copy=False).tobytes())
        proc.stdin.write(adjncy.astype("<i8", copy=False).tobytes())
        proc.stdin.flush()  # (communicate() closes it)
        return True
    except OSError:
        return False


def _receive(proc, n: int, timeout: float) -> np.ndarray | None:
    """The worker's order, or None (it failed, or outlived ``timeout`` seconds)."""
    try:
        data, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0 or len(data) != 8 + 8 * n:
        return None
    if int.from_bytes(data[:8], "little", signed=True) != _METIS_OK:
        return None
    perm = np.frombuffer(data, "<i8", count=n, offset=8).astype(np.int64)
    if not np.array_equal(np.sort(perm), np.arange(n)):
        return None
    return perm


def _reap(proc) -> None:
    """A worker ended for good: killed if it runs, its pipes closed, its status collected."""
    if proc.poll() is None:
        proc.kill()
    for f in (proc.stdin, proc.stdout):
        if f is not None and not f.closed:
            try:
                f.close()
            except OSError:
                pass
    proc.wait()


def nested_dissection(xadj: np.ndarray, adjncy: np.ndarray,
                      parallel_min: int | None = None) -> np.ndarray:
    """The nested-dissection order (``perm[new] = old``) of the graph (CSR of ``A + A^T``
    without the diagonal). A graph of at least ``parallel_min`` vertices (default
    ``PARALLEL_MIN``) is split once and its halves ordered in two worker processes at once;
    where workers cannot run (one core, no Python interpreter to start) or one fails, its half
    is ordered in this process: the order is the same on every machine. A smaller graph takes
    one METIS call."""
    xadj = np.ascontiguousarray(xadj, np.int64)
    adjncy = np.ascontiguousarray(adjncy, np.int64)
    n = len(xadj) - 1
    least = PARALLEL_MIN if parallel_min is None else int(parallel_min)
    if n < max(least, 2):
        return node_nd(xadj, adjncy)
    got = _split(xadj, adjncy)
    if got is None:
        return node_nd(xadj, adjncy)
    sep, halves = got
    procs: list = [None, None]
    try:
        if _workers_possible():
            for i, (hx, ha, _) in enumerate(halves):
                try:
                    procs[i] = _start()
                except OSError:
                    continue
                if not _send(procs[i], hx, ha):  # ended before reading: ordered here
                    _reap(procs[i])
                    procs[i] = None
        orders = []
        for proc, (hx, ha, _) in zip(procs, halves):
            # (METIS takes ~5 s for 10^6 vertices on one core: a worker still running after
            # minutes is stuck, and its half is ordered here)
            got = None if proc is None else _receive(proc, len(hx) - 1, 60 + len(ha) * 3e-5)
            orders.append(node_nd(hx, ha) if got is None else got)
        return np.concatenate([halves[0][2][orders[0]], halves[1][2][orders[1]], sep])
    finally:
        for proc in procs:
            if proc is not None:
                _reap(proc)


# A batch of graphs whose METIS orders go to worker processes: at least this many, of this
# many vertices in all (METIS takes ~2.5 ms for a 600-vertex Laplacian, a worker ~20 ms to
# start: the batch of 1000 Laplacians has 33 patterns, ~22,000 vertices, and METIS was ~70% of
# its analysis, waiting on one call at a time; 2-core VM, 2026-11-25).
MANY_MIN_GRAPHS = 8
MANY_MIN_VERTICES = 8_000
MANY_WORKERS = 8


def batch_workers() -> int:
    """The worker processes a batch's METIS orders may use here: up to ``MANY_WORKERS``, one
    core left to this process, none where fewer than two could run. One worker is one METIS
    call after another plus its start: the 1000 Laplacians' 33 patterns took 46-60 ms in one
    worker against 30 ms in this process (2-core VM, 2026-11-26)."""
    nw = min(MANY_WORKERS, _cores() - 1)
    return nw if nw >= 2 and _workers_possible() else 0


def orders_of(graphs: list) -> list:
    """METIS's nested-dissection order of each graph ``(xadj, adjncy)`` (CSR, no self loops),
    the same as :func:`nested_dissection` gives each: a batch of many small graphs is shared
    among worker processes (:func:`batch_workers`); graphs of
    ``PARALLEL_MIN`` vertices or more, and any whose worker failed, are ordered here. Returns
    futures (``concurrent.futures``), in the graphs' order, so that the caller can work
    meanwhile."""
    import concurrent.futures as cf

    graphs = [(np.ascontiguousarray(x, np.int64), np.ascontiguousarray(a, np.int64))
              for x, a in graphs]
    small = [i for i, (x, _) in enumerate(graphs) if len(x) - 1 < PARALLEL_MIN]
    verts = sum(len(graphs[i][0]) - 1 for i in small)
    nw = min(batch_workers(), len(small) // 2)
    futs = [cf.Future() for _ in graphs]

    def here(idx: list) -> None:  # in a thread of this process, one graph after another
        for i in idx:
            try:
                futs[i].set_result(nested_dissection(*graphs[i]))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                futs[i].set_exception(exc)

    if len(small) < MANY_MIN_GRAPHS or verts < MANY_MIN_VERTICES or nw < 2:
        threading.Thread(target=here, args=(list(range(len(graphs))),), daemon=True).start()
        return futs
    # Largest first, each to the least loaded worker (the work grows faster than n).
    loads = [0.0] * nw
    mine: list[list[int]] = [[] for _ in range(nw)]
    for i in sorted(small, key=lambda i: -len(graphs[i][1])):
        w = loads.index(min(loads))
        mine[w].append(i)
        loads[w] += len(graphs[i][0]) + len(graphs[i][1])

    def run(idx: list) -> None:
        try:
            ordered(idx)
        except BaseException as exc:  # noqa: BLE001 - delivered through the futures
            for i in idx:
                if not futs[i].done():
                    futs[i].set_exception(exc)

    def ordered(idx: list) -> None:
        got = None
        try:
            proc = _start()
        except OSError:
            proc = None
        if proc is not None:
            try:
                data, _ = proc.communicate(
                    b"".join(_graph_bytes(*graphs[i]) for i in idx),
                    timeout=60 + sum(len(graphs[i][1]) for i in idx) * 3e-5)
                if proc.returncode == 0:
                    got = data
            except (OSError, subprocess.TimeoutExpired):
                pass
            finally:
                _reap(proc)
        at = 0
        for i in idx:
            n = len(graphs[i][0]) - 1
            perm = None
            if got is not None and len(got) >= at + 8 + 8 * n:
                ok = int.from_bytes(got[at:at + 8], "little", signed=True) == _METIS_OK
                p = np.frombuffer(got, "<i8", count=n, offset=at + 8).astype(np.int64)
                if ok and np.array_equal(np.sort(p), np.arange(n)):
                    perm = p
            at += 8 + 8 * n
            futs[i].set_result(perm if perm is not None else node_nd(*graphs[i]))

    big = [i for i, (x, _) in enumerate(graphs) if len(x) - 1 >= PARALLEL_MIN]
    threads = [threading.Thread(target=run, args=(idx,), daemon=True) for idx in mine if idx]
    threads.append(threading.Thread(target=here, args=(big,), daemon=True))
    for t in threads:
        t.start()
    return futs
