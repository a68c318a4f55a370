"""A submission's tasks as arrays: the graph the planner schedules.

One row per task (never a Python object per task): its kind, the problem it works on, its integer
arguments, its shape summary. Edges are pairs of task rows; they may join tasks of one problem
(the steps of a factorization), of different problems (a multifrontal parent after its children)
and, through the runtime, of different submissions.

Levels: the planner runs the graph level by level, and a level's tasks of one kind and size
window share a launch. ``asap`` gives each task the length of the longest path reaching it (every
problem starts at level 0: SSDE); ``alap`` the latest level that still lets everything after it
finish by the last level (every problem ends together: DSSE). Both are a vectorized Kahn sweep,
one numpy pass per level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbatch.core.kinds import TaskKind


@dataclass(frozen=True)
class TaskGraph:
    """``kinds[kind[t]]`` is task ``t``'s kind; ``problem[t]`` its problem (the caller's index);
    ``args[t]`` its arguments (width = the widest kind's; unused columns are 0); ``rows``,
    ``cols``, ``width`` its shape summary; ``edges[e] = (before, after)``. ``k``: problems in the
    batch (some may have no task)."""

    kinds: tuple[TaskKind, ...]
    kind: np.ndarray
    problem: np.ndarray
    args: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    width: np.ndarray
    edges: np.ndarray
    k: int
    # When the edges are exactly chain_edges(*chains) (each problem's tasks in a row, nothing
    # across problems), levels have a closed form; None: use the general sweep.
    chains: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return len(self.kind)

    def levels(self, latest: bool) -> np.ndarray:
        """ASAP (``latest=False``) or ALAP levels of every task."""
        if self.chains is None:
            return alap(self.size, self.edges) if latest else asap(self.size, self.edges)
        first, length = self.chains
        pos = np.arange(self.size, dtype=np.int64) - np.repeat(first, length)
        if not latest:
            return pos
        last = int(length.max()) - 1 if len(length) else 0
        return last - (np.repeat(length, length) - 1 - pos)


def concat(graphs: list[TaskGraph], edges: np.ndarray | None = None
           ) -> tuple[TaskGraph, np.ndarray]:
    """One graph holding the tasks of ``graphs`` (over the same k problems) one after another,
    their edges, and ``edges`` between them (rows already offset). Returns the graph and each
    part's first row: how an op made of others (``posv``: a factorization, then solves) joins
    their graphs and orders one's tasks after the other's."""
    kinds: list[TaskKind] = []
    for g in graphs:
        for kd in g.kinds:
            if not any(kd is x for x in kinds):
                kinds.append(kd)
    width = max((g.args.shape[1] for g in graphs), default=0)
    first = np.zeros(len(graphs), dtype=np.int64)
    np.cumsum([g.size for g in graphs[:-1]], out=first[1:])
    parts = {f: [] for f in ("kind", "problem", "args", "rows", "cols", "width", "edges")}
    for g, f0 in zip(graphs, first.tolist()):
        code = np.array([next(i for i, x in enumerate(kinds) if x is kd) for kd in g.kinds],
                        dtype=np.int8)
        parts["kind"].append(code[g.kind] if len(code) else g.kind.astype(np.int8))
        parts["problem"].append(g.problem)
        a = np.zeros((g.size, width), dtype=np.int64)
        a[:, : g.args.shape[1]] = g.args
        parts["args"].append(a)
        for f in ("rows", "cols", "width"):
            parts[f].append(getattr(g, f))
        parts["edges"].append(g.edges.reshape(-1, 2) + f0)
    if edges is not None and len(edges):
        parts["edges"].append(np.asarray(edges, dtype=np.int64).reshape(-1, 2))
    cat = {f: np.concatenate(v) if v else np.zeros(0, np.int64) for f, v in parts.items()}
    k = max((g.k for g in graphs), default=0)
    return TaskGraph(kinds=tuple(kinds), kind=cat["kind"].astype(np.int8), problem=cat["problem"],
                     args=cat["args"].reshape(-1, width), rows=cat["rows"], cols=cat["cols"],
                     width=cat["width"], edges=cat["edges"].reshape(-1, 2), k=k), first


def sequence(graphs: list[TaskGraph]) -> TaskGraph:
    """One graph of ``graphs`` (over the same k problems, each made of chains: a problem's
    tasks in row order, one after another) run one after another per problem: a problem's
    tasks of one part wait for its tasks of the parts before (posv: its factorization, then
    its solves). The rows are ordered by problem, so the result is one chain per problem and
    keeps the closed-form levels."""
    if any(g.chains is None for g in graphs):
        raise ValueError("sequence() joins graphs made of chains")
    g, _ = concat(graphs)
    order = np.argsort(g.problem, kind="stable")
    cnt = np.bincount(g.problem, minlength=g.k).astype(np.int64)
    first = np.cumsum(cnt) - cnt
    return TaskGraph(kinds=g.kinds, kind=g.kind[order], problem=g.problem[order],
                     args=g.args[order], rows=g.rows[order], cols=g.cols[order],
                     width=g.width[order], edges=chain_edges(first, cnt), k=g.k,
                     chains=(first, cnt))


def chain_edges(first: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Edges ``t -> t + 1`` inside runs of consecutive task rows: run ``i`` holds rows
    ``first[i] .. first[i] + length[i] - 1`` (a problem's steps, in order)."""
    first = np.asarray(first, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    n_edges = np.maximum(length - 1, 0)
    if not n_edges.sum():
        return np.zeros((0, 2), dtype=np.int64)
    starts = np.repeat(first, n_edges)
    within = np.arange(int(n_edges.sum())) - np.repeat(np.cumsum(n_edges) - n_edges, n_edges)
    src = starts + within
    return np.stack([src, src + 1], axis=1)


def asap(size: int, edges: np.ndarray) -> np.ndarray:
    """Longest path (in edges) from a source to each task. Raises on a cycle."""
    level = np.zeros(size, dtype=np.int64)
    if not len(edges):
        return level
    src, dst = edges[:, 0], edges[:, 1]
    order = np.argsort(src, kind="stable")
    src_s, dst_s = src[order], dst[order]
    start = np.searchsorted(src_s, np.arange(size + 1))
    indeg = np.bincount(dst, minlength=size)
    frontier = np.flatnonzero(indeg == 0)
    done = 0
    lv = 0
    while len(frontier):
        level[frontier] = lv
        done += len(frontier)
        # the out-edges of the frontier, gathered through the CSR offsets
        counts = start[frontier + 1] - start[frontier]
        if not counts.sum():
            break
        idx = np.repeat(start[frontier], counts) + (
            np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
        targets = dst_s[idx]
        np.subtract.at(indeg, targets, 1)
        frontier = np.unique(targets[indeg[targets] == 0])
        lv += 1
    if done < size:
        raise ValueError(f"the task graph has a cycle ({size - done} tasks never become ready)")
    return level


def alap(size: int, edges: np.ndarray) -> np.ndarray:
    """The latest level of each task such that every path still ends by the last level."""
    height = asap(size, edges[:, ::-1] if len(edges) else edges)
    return (int(height.max()) if size else 0) - height
