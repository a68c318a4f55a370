"""The planner is pure logic: these tests need no backend at all."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vbatch.ops.cholesky import task_graph
from vbatch.scheduler import make_plan, step_kinds

STEP_KINDS = ["update", "potf2", "trsm"]


@st.composite
def batches(draw, max_n=200):
    """Sizes with the mandatory edge cases, optional partial npiv, and planner options."""
    nb = draw(st.sampled_from([1, 4, 8, 16, 32]))
    extra = draw(st.lists(st.integers(0, max_n), min_size=0, max_size=40))
    n = np.array([0, 1, max(nb - 1, 0), nb, nb + 1] + extra, dtype=np.int64)
    n = n[draw(st.permutations(range(len(n))))]
    if draw(st.booleans()):
        frac = draw(st.lists(st.floats(0, 1), min_size=len(n), max_size=len(n)))
        npiv = np.minimum(n, np.floor(n * np.array(frac)).astype(np.int64))
    else:
        npiv = None
    return dict(
        n=n,
        npiv=npiv,
        nb=nb,
        policy=draw(st.sampled_from(["dsse", "ssde"])),
        fused_max_rows=draw(st.sampled_from([0, 24, 64, 10**9])),
        streams=draw(st.sampled_from([1, 3])),
    )


def expand(plan):
    """Every task the plan runs: (launch index, kind, plan position, local step or None)."""
    for lc in plan.launches:
        kinds = STEP_KINDS if lc.kind == "fused" else [lc.kind]
        for q in range(lc.lo, lc.hi):
            s = None if lc.kind == "schur" else lc.step - int(plan.start[q])
            for kind in kinds:
                yield lc, kind, q, s


@given(batches())
def test_every_task_runs_once_in_dependency_order(b):
    plan = make_plan(b["n"], b["npiv"], nb=b["nb"], policy=b["policy"],
                     fused_max_rows=b["fused_max_rows"], streams=b["streams"])
    nb = b["nb"]
    n_all = b["n"]
    # Exactly the problems with something to do are planned.
    assert sorted(plan.order.tolist()) == np.flatnonzero(n_all > 0).tolist()
    assert np.array_equal(plan.n, n_all[plan.order])

    seen: dict[tuple, int] = {}
    stream_of: dict[int, int] = {}
    for lc, kind, q, s in expand(plan):
        S = int(plan.steps[q])
        if kind == "schur":
            assert lc.step == plan.start[q] + S, "schur before the problem's last panel"
            if plan.n[q] == plan.npiv[q]:
                continue  # a no-op member of a chain-wide schur launch
        else:
            assert 0 <= s < S, f"problem at plan position {q} launched at local step {s} of {S}"
        key = (q, kind, s)
        assert key not in seen, f"task {key} runs twice"
        seen[key] = lc.index
        assert stream_of.setdefault(q, lc.stream) == lc.stream, "a problem's chain changed stream"

    for q in range(len(plan.order)):
        n, p, S = int(plan.n[q]), int(plan.npiv[q]), int(plan.steps[q])
        assert S == -(-p // nb)
        last = -1
        for s in range(S):
            j, w = s * nb, min(nb, p - s * nb)
            for kind in STEP_KINDS:
                no_op = (kind == "update" and j == 0) or (kind == "trsm" and n - j - w == 0)
                needed = not no_op
                at = seen.get((q, kind, s))
                if needed:
                    assert at is not None, f"task {(q, kind, s)} never runs"
                if at is not None:
                    assert at > last or (at == last and kind != "update"), \
                        f"task {(q, kind, s)} is not after its predecessors"
                    last = at
        at = seen.get((q, "schur", None))
        assert (at is not None) == (p < n), f"schur of {q} (n={n}, p={p})"
        if at is not None:
            assert at > last


@given(batches())
def test_groups_stay_in_one_nb_window_and_respect_the_crossover(b):
    plan = make_plan(b["n"], b["npiv"], nb=b["nb"], policy=b["policy"],
                     fused_max_rows=b["fused_max_rows"], streams=b["streams"])
    nb = b["nb"]
    for lc in plan.launches:
        if lc.kind == "schur":
            continue
        q = np.arange(lc.lo, lc.hi)
        h = plan.n[q] - (lc.step - plan.start[q]) * nb
        windows = set((-(-h // nb)).tolist())
        assert len(windows) == 1, f"launch {lc.index} spans windows {windows} (heights {h})"
        assert lc.rows == (h.min(), h.max())
        assert (lc.kind == "fused") == (h.max() <= b["fused_max_rows"])


@given(batches())
def test_dsse_ends_together_ssde_starts_together(b):
    n, npiv, nb = b["n"], b["npiv"], b["nb"]
    dsse = make_plan(n, npiv, nb=nb, policy="dsse")
    live = dsse.steps > 0
    if live.any():
        ends = dsse.start[live] + dsse.steps[live]
        assert set(ends.tolist()) == {int(dsse.steps.max())}, "DSSE: not every matrix ends last"
    ssde = make_plan(n, npiv, nb=nb, policy="ssde")
    assert not np.any(ssde.start), "SSDE: a matrix does not start at step 0"


def test_dsse_full_factorization_is_one_group_per_step():
    """The point of DSSE: k = 5,000 mixed sizes, full factorization, one launch group per step."""
    rng = np.random.default_rng(7)
    n = rng.integers(1, 513, size=5000)
    plan = make_plan(n, nb=32, policy="dsse", fused_max_rows=10**9)
    assert plan.nsteps == 16 and plan.ngroups == 16 and len(plan.launches) == 16
    # The active set grows: each step's group is a prefix that contains the previous one.
    his = [lc.hi for lc in plan.launches]
    assert all(lc.lo == 0 for lc in plan.launches) and his == sorted(his) and his[-1] == 5000
    ssde = make_plan(n, nb=32, policy="ssde", fused_max_rows=10**9)
    assert ssde.ngroups == sum(range(1, 17))  # one group per distinct block count, per step


def test_separated_launches_follow_the_task_graph_order():
    plan = make_plan([100, 70], nb=32, fused_max_rows=0)
    per_step = {}
    for lc in plan.launches:
        per_step.setdefault(lc.step, []).append(lc.kind)
    assert per_step[0] == ["potf2", "trsm"]  # nothing to update at the first step
    assert per_step[1] == ["update", "potf2", "trsm"]
    assert per_step[3] == ["update", "potf2"]  # the last panel has no rows below its block


def test_streams_follow_independent_chains():
    # Partial factorizations with different trailing sizes form separate DSSE chains.
    plan = make_plan([64, 64, 200, 200], [64, 64, 40, 40], nb=32, streams=4)
    chains = {(lc.lo, lc.stream) for lc in plan.launches}
    assert len({s for _, s in chains}) == 2 and plan.nstreams == 2


def test_task_graph_is_left_looking_potrf():
    g = task_graph()
    kinds, final = step_kinds(g)
    assert kinds == STEP_KINDS and final == ["schur"]
    assert g.edges["trsm", "update"]["lag"] == 1


def test_a_cycle_inside_a_step_is_reported():
    g = nx.DiGraph(task_graph())
    g.add_edge("trsm", "potf2", lag=0)
    with pytest.raises(ValueError, match="cycle inside one step: .*potf2.*trsm"):
        make_plan([10], nb=4, graph=g)


def test_table_lists_every_launch():
    plan = make_plan([5, 40, 0, 33], [5, 20, 0, 33], nb=16, fused_max_rows=16)
    text = plan.table()
    lines = text.splitlines()
    assert lines[0] == plan.summary()
    assert len(lines) == 3 + len(plan.launches)
    for lc, line in zip(plan.launches, lines[3:]):
        assert line.split()[4] == lc.kind and f"[{lc.lo}:{lc.hi})" in line
    assert "more" in plan.table(limit=1).splitlines()[-1]


@pytest.mark.parametrize("bad, msg", [
    (dict(nb=0), "nb must be a positive int"),
    (dict(policy="lifo"), "unknown policy 'lifo'"),
    (dict(streams=0), "streams must be >= 1"),
])
def test_bad_planner_options(bad, msg):
    with pytest.raises(ValueError, match=msg):
        make_plan([4, 5], **bad)


def test_empty_batches():
    for n in ([], [0, 0]):
        plan = make_plan(n, nb=8)
        assert plan.launches == () and plan.nsteps == 0 and len(plan.order) == 0
