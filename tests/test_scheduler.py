"""The planner is pure logic: these tests need no backend at all."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vbatch.ops.cholesky import potrf_graph
from vbatch.scheduler import plan_cholesky
from vbatch.core.kinds import TaskKind, by_rows, single
from vbatch.scheduler import TaskGraph, alap, asap, chain_edges, make_plan

STEP_KINDS = ["update", "trsm"]  # a separated panel's launches (update factors the diagonal)


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


def _plan(b):
    return plan_cholesky(b["n"], b["npiv"], nb=b["nb"], policy=b["policy"],
                         fused_max_rows=b["fused_max_rows"], streams=b["streams"])


def expand(plan):
    """Every step the plan runs: (launch, step kind, problem, panel column j or None)."""
    t = plan.tasks
    for lc in plan.launches:
        kinds = STEP_KINDS if lc.kind == "fused" else [lc.kind]
        for row in range(lc.lo, lc.hi):
            q = int(t.problem[row])
            j = None if lc.kind == "schur" else int(t.args[row, 0])
            for kind in kinds:
                yield lc, kind, q, j, row


@given(batches())
def test_every_task_runs_once_in_dependency_order(b):
    plan = _plan(b)
    nb, n_all = b["nb"], b["n"]
    p_all = n_all if b["npiv"] is None else b["npiv"]
    # Exactly the problems with something to do are planned.
    assert plan.problems().tolist() == np.flatnonzero(n_all > 0).tolist()

    seen: dict[tuple, int] = {}
    for lc, kind, q, j, _ in expand(plan):
        key = (q, kind, j)
        assert key not in seen, f"task {key} runs twice"
        seen[key] = lc.index

    launches = plan.launches
    for q in np.flatnonzero(n_all > 0).tolist():
        n, p = int(n_all[q]), int(p_all[q])
        last = -1
        for s in range(-(-p // nb)):
            j, w = s * nb, min(nb, p - s * nb)
            for kind in STEP_KINDS:
                no_op = kind == "trsm" and n - j - w == 0
                at = seen.get((q, kind, j))
                if not no_op:
                    assert at is not None, f"task {(q, kind, j)} never runs"
                if at is not None:
                    assert at > last or (at == last and kind != "update"), \
                        f"task {(q, kind, j)} is not after its predecessors"
                    if at != last and last >= 0:
                        _ordered(launches, last, at)
                    last = at
        at = seen.get((q, "schur", None))
        assert (at is not None) == (p < n), f"schur of {q} (n={n}, p={p})"
        if at is not None:
            assert at > last
            if last >= 0:
                _ordered(launches, last, at)


def _ordered(launches, a: int, b: int) -> None:
    """Launch b runs after launch a: same stream (in order), or b's group waits for a's group
    (directly or through a chain of waits and stream order)."""
    la, lb = launches[a], launches[b]
    if la.stream == lb.stream:
        return
    # b's group starts with the launch that carries the waits
    first = next(x for x in launches if x.group == lb.group)
    last_a = max(x.index for x in launches if x.group == la.group)
    assert last_a in first.waits, f"launch {b} on stream {lb.stream} does not wait for {a}"


@given(batches())
def test_groups_stay_in_one_nb_window_and_respect_the_crossover(b):
    plan = _plan(b)
    nb = b["nb"]
    t = plan.tasks
    for lc in plan.launches:
        h = t.rows[lc.lo:lc.hi]
        windows = set((-(-h // nb)).tolist())
        assert len(windows) == 1, f"launch {lc.index} spans windows {windows} (heights {h})"
        assert lc.rows == (h.min(), h.max())
        assert len(set(t.level[lc.lo:lc.hi].tolist())) == 1 and lc.step == t.level[lc.lo]
        if lc.kind != "schur":
            assert (lc.kind == "fused") == (h.max() <= b["fused_max_rows"])


@given(batches())
def test_dsse_ends_together_ssde_starts_together(b):
    n, npiv, nb = b["n"], b["npiv"], b["nb"]
    for policy in ("dsse", "ssde"):
        plan = plan_cholesky(n, npiv, nb=nb, policy=policy)
        t = plan.tasks
        for q in plan.problems().tolist():
            levels = t.level[t.problem == q]
            if policy == "dsse":
                assert levels.max() == plan.nsteps - 1, "DSSE: a problem does not end last"
            else:
                assert levels.min() == 0, "SSDE: a problem does not start at level 0"


def test_dsse_full_factorization_is_one_group_per_step():
    """The point of DSSE: k = 5,000 mixed sizes, full factorization, one launch group per step."""
    rng = np.random.default_rng(7)
    n = rng.integers(1, 513, size=5000)
    plan = plan_cholesky(n, nb=32, policy="dsse", fused_max_rows=10**9)
    assert plan.nsteps == 16 and plan.ngroups == 16 and len(plan.launches) == 16
    # The active set grows: each step's problems include the previous step's.
    sets = [set(plan.tasks.problem[lc.lo:lc.hi].tolist()) for lc in plan.launches]
    assert all(a <= b for a, b in zip(sets, sets[1:])) and len(sets[-1]) == 5000
    ssde = plan_cholesky(n, nb=32, policy="ssde", fused_max_rows=10**9)
    assert ssde.ngroups == sum(range(1, 17))  # one group per distinct block count, per step


def test_separated_launches_follow_the_task_order():
    plan = plan_cholesky([100, 70], nb=32, fused_max_rows=0)
    per_step = {}
    for lc in plan.launches:
        per_step.setdefault(lc.step, []).append(lc.kind)
    # The update factors the diagonal block too; at the first step it copies the panel.
    assert per_step[0] == ["update", "trsm"]
    assert per_step[1] == ["update", "trsm"]
    assert per_step[3] == ["update"]  # the last panel has no rows below its block


def test_streams_follow_independent_chains():
    # Partial factorizations with different trailing sizes form separate DSSE chains.
    plan = plan_cholesky([64, 64, 200, 200], [64, 64, 40, 40], nb=32, streams=4)
    assert len({lc.stream for lc in plan.launches}) == 2 and plan.nstreams == 2
    for lc in plan.launches:
        probs = set(plan.tasks.problem[lc.lo:lc.hi].tolist())
        assert probs in ({0, 1}, {2, 3})
        assert lc.stream == (0 if probs == {2, 3} else 1)


def test_potrf_graph_is_each_problems_panels_then_its_schur():
    g = potrf_graph([5, 40, 0, 33], [5, 20, 0, 0], nb=16)
    # problem 0: one panel; 1: panels j = 0, 16 then schur; 2: nothing; 3: schur only
    assert g.problem.tolist() == [0, 1, 1, 1, 3]
    assert [g.kinds[k].name for k in g.kind] == ["potrf.panel"] * 3 + ["potrf.schur"] * 2
    # (j, w, block column) for panels, (p, n - p, 0) for schur tasks
    assert g.args.tolist() == [[0, 5, 0], [0, 16, 0], [16, 4, 0], [20, 20, 0], [0, 33, 0]]
    assert g.rows.tolist() == [5, 40, 24, 20, 33]
    assert g.edges.tolist() == [[1, 2], [2, 3]]


@given(st.lists(st.integers(0, 6), max_size=30))
def test_closed_form_levels_equal_the_general_sweep(lengths):
    length = np.array(lengths, dtype=np.int64)
    first = np.cumsum(length) - length
    T = int(length.sum())
    edges = chain_edges(first, length)
    kind = TaskKind("t.k", "t", ("a",), by_rows, single("t"), lambda *a: np.zeros(len(a[0])))
    z = np.zeros(T, dtype=np.int64)
    g = TaskGraph((kind,), z.astype(np.int8), np.repeat(np.arange(len(length)), length),
                  z[:, None], z, z, z, edges, len(length), chains=(first, length))
    assert np.array_equal(g.levels(False), asap(T, edges))
    assert np.array_equal(g.levels(True), alap(T, edges))


def test_a_cycle_is_reported():
    with pytest.raises(ValueError, match="cycle"):
        asap(3, np.array([[0, 1], [1, 2], [2, 1]]))


def test_edges_between_problems_order_launches_across_streams():
    """A task of problem 1 after a task of problem 0 (a multifrontal parent after its child):
    the general graph path, with no chains. The parent's launch comes a level later and waits
    for the child's when they sit on different streams."""
    kind = TaskKind("t.k", "t", ("a",), lambda rows, o: rows, single("t"),
                    lambda *a: np.ones(len(a[0])))
    # problem 0: tasks 0 -> 1; problem 1: task 2 (rows 50, its own window) after task 0
    rows = np.array([10, 10, 50], dtype=np.int64)
    g = TaskGraph((kind,), np.zeros(3, np.int8), np.array([0, 0, 1]), np.zeros((3, 1), np.int64),
                  rows, rows, rows, np.array([[0, 1], [0, 2]]), 2)
    plan = make_plan(g, policy="ssde", streams=2)
    assert plan.tasks.level.tolist() == [0, 1, 1]
    lc = {int(plan.tasks.problem[x.lo]) * 10 + x.step: x for x in plan.launches}
    child, after, parent = lc[0], lc[1], lc[11]
    assert after.stream == child.stream and parent.stream != child.stream
    assert parent.waits == (child.index,)


def test_table_lists_every_launch():
    plan = plan_cholesky([5, 40, 0, 33], [5, 20, 0, 33], nb=16, fused_max_rows=16)
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
        plan_cholesky([4, 5], **bad)


def test_empty_batches():
    for n in ([], [0, 0]):
        plan = plan_cholesky(n, nb=8)
        assert plan.launches == () and plan.nsteps == 0 and len(plan.problems()) == 0


def test_blocked_graph_puts_a_block_update_before_each_later_block_column():
    g = potrf_graph(np.array([100, 40, 0, 32]), None, nb=16, block=32)
    names = [g.kinds[c].name.split("[")[0] for c in g.kind]
    rows = [(int(q), nm, g.args[i, :6].tolist()) for i, (q, nm) in enumerate(zip(g.problem,
                                                                                names))]
    assert not g.args[:, 6].any()  # (blas's src: no task here reads a source first)
    P, G = "potrf.panel", "blas.gemm"
    assert rows == [
        (0, P, [0, 16, 0, 0, 0, 0]), (0, P, [16, 16, 0, 0, 0, 0]),
        (0, G, [32, 68, 0, 32, 32, 32]),  # rows 32.., columns [32, 64) from the 32 before
        (0, P, [32, 16, 32, 0, 0, 0]), (0, P, [48, 16, 32, 0, 0, 0]),
        (0, G, [64, 36, 0, 64, 32, 64]),
        (0, P, [64, 16, 64, 0, 0, 0]), (0, P, [80, 16, 64, 0, 0, 0]),
        (0, G, [96, 4, 0, 96, 4, 96]), (0, P, [96, 4, 96, 0, 0, 0]),
        (1, P, [0, 16, 0, 0, 0, 0]), (1, P, [16, 16, 0, 0, 0, 0]),
        (1, G, [32, 8, 0, 32, 8, 32]), (1, P, [32, 8, 32, 0, 0, 0]),
        (3, P, [0, 16, 0, 0, 0, 0]), (3, P, [16, 16, 0, 0, 0, 0]),  # not more than one block
    ]
    # One chain per problem, in that order.
    assert g.edges.tolist() == [[i, i + 1] for i in range(9)] + [[10, 11], [11, 12], [12, 13],
                                                                 [14, 15]]
    # Unblocked, the graph is the panels alone, each of block column 0.
    flat = potrf_graph(np.array([100, 40, 0, 32]), None, nb=16)
    assert len(flat.kinds) == 2 and not flat.args[:, 2].any()
    assert flat.args[:, :2].tolist() == [r[2][:2] for r in rows if r[1] == P]


def test_block_few_blocks_the_few_problems_past_block():
    n = np.array([300, 10, 10, 300, 0, 40, 12])

    def blocked(n=n, npiv=None, **kw):
        g = potrf_graph(n, npiv, nb=16, block=32, **kw)
        return sorted(set(g.problem[g.kind == 2].tolist()))

    assert blocked(block_above=512) == []
    # t = 32: three problems factor more than t / 2 = 16 columns (300, 300, 40); at most
    # three: those past 32 are blocked.
    assert blocked(block_above=512, block_few=3) == [0, 3, 5]
    assert blocked(block_above=512, block_few=2) == []  # too many: block_above decides
    assert blocked(block_above=100, block_few=2) == [0, 3]
    assert blocked(block_above=100, block_few=0) == [0, 3]  # 0: off
    assert potrf_graph(n, None, nb=16, block=0, block_few=9).kind.max() < 2  # no blocking
    # block_few_above: t = 100, two problems past 50, both past 100.
    assert blocked(block_above=512, block_few=2, block_few_above=100) == [0, 3]
    assert blocked(block_above=512, block_few=1, block_few_above=100) == []
    assert blocked(block_above=200, block_few=9, block_few_above=250) == [0, 3]
    # Few past t but many past t / 2: the large ones do not run alone, nothing changes.
    assert blocked(np.array([300, 60, 60, 60]), block_above=512, block_few=3,
                   block_few_above=100) == []
    # A partial factorization counts the columns it factors.
    npiv = [30, 10, 10, 300, 0, 40, 12]
    assert blocked(npiv=npiv, block_above=512, block_few=2) == []
    assert blocked(npiv=npiv, block_above=512, block_few=3) == [3, 5]


@pytest.mark.parametrize("block", [15, 16, 40])
def test_a_block_that_is_not_whole_panels_is_refused(block):
    from vbatch import InputError

    with pytest.raises(InputError, match="block must be 0 or a multiple of nb = 16"):
        plan_cholesky([100], nb=16, block=block)


def test_only_problems_over_block_above_columns_are_blocked():
    g = potrf_graph(np.array([100, 64, 65, 200]), np.array([100, 64, 65, 64]), nb=16, block=32,
                    block_above=64)
    blocked = sorted({int(q) for q, c in zip(g.problem, g.kind) if g.kinds[c].name != "potrf.panel"
                      and g.kinds[c].name != "potrf.schur"})
    assert blocked == [0, 2]  # 100 and 65 columns; 64 columns are not more than 64
