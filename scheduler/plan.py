"""Ready tasks become launch groups; launch groups become an ordered plan of launches.

The planner is pure logic over numpy arrays. Its inputs are per-problem sizes ``n`` and factored
column counts ``p``, the panel width ``nb``, a start policy (:mod:`vbatch.scheduler.policy`) and the
crossover ``fused_max_rows``. Its output, :class:`Plan`, is a value: print it with
:meth:`Plan.table`, assert on it in tests, hand it to any backend.

How it works (state is a handful of int64 arrays, never a Python object per matrix or task):

1. ``S_i = ceil(p_i / nb)`` panel steps per problem; the policy gives ``start_i`` and a chain key.
2. Problems are sorted once by (chain key, ``S`` descending, ``n`` descending). In that order
   every group is a contiguous range ``[lo, hi)``: within a chain, the problems active at a step
   are those with the most steps, a prefix. A backend therefore needs only ``(step, lo, hi)`` per
   launch; the per-problem arrays are uploaded once.
3. For each global step and chain, the active range is one **launch group**: tasks of one kind,
   one dtype, with panel heights inside one ``nb`` window (implicit sorting). Per group the
   crossover picks the **fused** variant (update + potf2 + trsm in one launch) when the tallest
   panel has at most ``fused_max_rows`` rows, else **separated** launches, one per task kind in the
   task graph's topological order. An update with nothing to read (every problem at its first
   step) and a trsm with no rows below the diagonal block are left out.
4. Problems that factor only ``p < n`` columns get a final ``schur`` launch at step
   ``start_i + S_i``, after their last panel.
5. Chains are independent sub-DAGs: chain ``c`` goes to stream ``c mod streams``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from vbatch.ops.cholesky import FUSED, task_graph
from vbatch.scheduler.policy import get_policy

FUSED_VARIANT, SEPARATED_VARIANT = "fused", "separated"


@dataclass(frozen=True)
class Launch:
    """One vbatched launch: a task kind over the problems ``order[lo:hi]`` at global ``step``."""

    index: int
    group: int
    kind: str
    variant: str
    step: int
    lo: int
    hi: int
    rows: tuple[int, int]  # (min, max) panel height over the problems of the launch
    cols: tuple[int, int]  # (min, max) first panel column j, i.e. the update's inner dimension
    width: int  # the widest panel (<= nb); for schur, the widest trailing block
    stream: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Plan:
    """An ordered list of launches plus the per-problem arrays, in plan (sorted) order.

    ``order[q]`` is the original index of the problem at plan position ``q``; ``n``, ``npiv``,
    ``steps`` and ``start`` are indexed by plan position. Problems with nothing to do (``n == 0``)
    are not in ``order``.
    """

    policy: str
    nb: int
    fused_max_rows: int
    k: int
    order: np.ndarray
    n: np.ndarray
    npiv: np.ndarray
    steps: np.ndarray
    start: np.ndarray
    nsteps: int
    nstreams: int
    launches: tuple[Launch, ...]
    ngroups: int
    _counts: dict = field(default_factory=dict, repr=False, compare=False)
    # What a backend derives from this plan alone (for a batch whose layout follows from its
    # sizes, such as a list packed tightly), kept with it so a reused plan reuses that too.
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def counts(self) -> dict[str, int]:
        """Launches per kind."""
        if not self._counts:
            for lc in self.launches:
                self._counts[lc.kind] = self._counts.get(lc.kind, 0) + 1
        return dict(self._counts)

    def summary(self) -> str:
        c = self.counts()
        kinds = ", ".join(f"{v} {k}" for k, v in c.items()) or "none"
        return (
            f"{self.policy} plan, nb={self.nb}: {len(self.order)} of {self.k} problems, "
            f"{self.nsteps} steps, {self.ngroups} groups, {len(self.launches)} launches "
            f"({kinds}), {self.nstreams} stream{'s' if self.nstreams != 1 else ''}"
        )

    def table(self, limit: int | None = None) -> str:
        """The plan as a fixed-width table, one line per launch."""
        head = f"{'#':>4} {'grp':>4} {'step':>4} {'strm':>4} {'kind':<7} {'variant':<9} " \
               f"{'problems':>17} {'rows':>11} {'cols j':>11} {'w':>4}"
        lines = [self.summary(), head, "-" * len(head)]
        shown = self.launches if limit is None else self.launches[:limit]
        for lc in shown:
            probs = f"{lc.count} [{lc.lo}:{lc.hi})"
            rows = f"{lc.rows[0]}..{lc.rows[1]}"
            cols = f"{lc.cols[0]}..{lc.cols[1]}"
            lines.append(
                f"{lc.index:>4} {lc.group:>4} {lc.step:>4} {lc.stream:>4} {lc.kind:<7} "
                f"{lc.variant:<9} {probs:>17} {rows:>11} {cols:>11} {lc.width:>4}"
            )
        if limit is not None and len(self.launches) > limit:
            lines.append(f"... {len(self.launches) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def step_kinds(graph: nx.DiGraph) -> tuple[list[str], list[str]]:
    """Task kinds of one step in dependency order, and the kinds of the final phase."""
    step = [v for v, d in graph.nodes(data=True) if d["phase"] == "step"]
    within = graph.edge_subgraph(
        [(a, b) for a, b, d in graph.edges(data=True) if d["lag"] == 0 and a in step and b in step]
    ).copy()
    within.add_nodes_from(step)
    try:
        ordered = list(nx.topological_sort(within))
    except nx.NetworkXUnfeasible:
        cycle = " -> ".join(a for a, _ in nx.find_cycle(within))
        raise ValueError(f"task graph has a cycle inside one step: {cycle}") from None
    final = [v for v, d in graph.nodes(data=True) if d["phase"] == "final"]
    return ordered, final


def make_plan(
    n,
    npiv=None,
    *,
    nb: int = 32,
    policy: str = "dsse",
    fused_max_rows: int = 512,
    streams: int = 1,
    graph: nx.DiGraph | None = None,
) -> Plan:
    """Plan a batched (partial) Cholesky. See the module docstring for the rules."""
    if not isinstance(nb, (int, np.integer)) or nb < 1:
        raise ValueError(f"nb must be a positive int, got {nb!r}")
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    nb = int(nb)
    pol = get_policy(policy)
    kinds, final_kinds = step_kinds(graph if graph is not None else task_graph())

    n_all = np.asarray(n, dtype=np.int64)
    p_all = n_all if npiv is None else np.asarray(npiv, dtype=np.int64)
    k = len(n_all)
    s_all = -(-p_all // nb)
    smax = int(s_all.max()) if k else 0
    start_all = pol.start(s_all, smax)
    key_all = pol.chain(n_all, s_all, nb)

    live = np.flatnonzero(n_all > 0)
    # lexsort sorts by the last key first: chain key, then most steps, then largest, then index.
    order = live[np.lexsort((-n_all[live], -s_all[live], key_all[live]))]
    n_s, p_s, s_s, st_s, key_s = (a[order] for a in (n_all, p_all, s_all, start_all, key_all))
    trail_s = n_s - p_s
    end_s = st_s + s_s  # the global step of problem's final phase
    has_final = bool(final_kinds) and bool(np.any(trail_s > 0))
    # Panels occupy global steps [start, end); a final phase runs at step `end`.
    nsteps = int(end_s.max()) if len(order) else 0
    if has_final:
        nsteps = max(nsteps, int(end_s[trail_s > 0].max()) + 1)

    bounds = np.flatnonzero(np.diff(key_s)) + 1
    chains = list(zip(np.r_[0, bounds].astype(int), np.r_[bounds, len(order)].astype(int)))

    launches: list[Launch] = []
    group = 0

    def emit(kind, variant, t, lo, hi, rows, cols, width, stream):
        launches.append(
            Launch(len(launches), group, kind, variant, t, lo, hi, rows, cols, width, stream)
        )

    for t in range(nsteps):
        for c, (clo, chi) in enumerate(chains):
            stream = c % streams
            # Active at t: start <= t < end. Sorted by steps descending inside a chain, both
            # policies make that set a prefix of the chain (see policy.py), so counting it is
            # enough to know the range.
            cnt = int(np.count_nonzero((st_s[clo:chi] <= t) & (t < end_s[clo:chi])))
            if cnt:
                lo, hi = clo, clo + cnt
                j = (t - st_s[lo:hi]) * nb
                h = n_s[lo:hi] - j
                w = np.minimum(nb, p_s[lo:hi] - j)
                rows = (int(h.min()), int(h.max()))
                cols = (int(j.min()), int(j.max()))
                width = int(w.max())
                if rows[1] <= fused_max_rows:
                    emit(FUSED, FUSED_VARIANT, t, lo, hi, rows, cols, width, stream)
                else:
                    below = int((h - w).max())
                    for kind in kinds:
                        if kind == "update" and cols[1] == 0:
                            continue
                        if kind == "trsm" and below == 0:
                            continue
                        emit(kind, SEPARATED_VARIANT, t, lo, hi, rows, cols, width, stream)
                group += 1
            if has_final:
                # Problems whose final phase is at t form a contiguous range too: all of the chain
                # under DSSE (t == S_max), and those with exactly t steps under SSDE.
                fin = np.flatnonzero(end_s[clo:chi] == t)
                if len(fin):
                    lo, hi = clo + int(fin[0]), clo + int(fin[-1]) + 1
                    tr = trail_s[lo:hi]
                    if tr.max() > 0:
                        pf = p_s[lo:hi]
                        for kind in final_kinds:
                            emit(kind, SEPARATED_VARIANT, t, lo, hi,
                                 (int(tr.min()), int(tr.max())), (int(pf.min()), int(pf.max())),
                                 int(tr.max()), stream)
                        group += 1

    return Plan(
        policy=pol.name,
        nb=nb,
        fused_max_rows=int(fused_max_rows),
        k=k,
        order=order,
        n=n_s,
        npiv=p_s,
        steps=s_s,
        start=st_s,
        nsteps=nsteps,
        nstreams=min(streams, max(1, len(chains))),
        launches=tuple(launches),
        ngroups=group,
    )
