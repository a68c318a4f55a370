"""Task kinds: the one table the scheduler and every backend read.

An operation (``ops/<op>.py``) turns a submission into tasks; each task has a *kind*. A kind says:

* ``args``: the names of its integer arguments (a task row is ``problem, *args``);
* ``shape(rows, cols, width)``: per task, the sizes the planner groups by and prints (a POTRF
  panel: its height, its first column, its width), computed from the args and the problem sizes
  by the op when it builds the graph;
* ``window``: which tasks of this kind may share one vbatched launch at one level (implicit
  sorting: the tasks of a launch group differ in size by less than one window);
* ``launches``: how a group of its tasks is issued, as one or several *launch kinds* in order
  (POTRF's panel: one fused launch below the crossover, else update, trsm);
* ``flops``: per task, for balancing work and the roofline floor; ``traffic``: per task, the
  matrix elements it must read and write at least (times the itemsize: its bytes), for the
  floor (:mod:`vbatch.runtime.trace`);
* ``ordered``: the kind's kernel orders the tasks of one launch itself (device counters), so
  its tasks keep the graph's order in a group.

Launch kinds are what backends implement (one function per launch kind on the CPU, one kernel
selection per launch kind on CUDA). They belong to a kernel *family* (``TaskKind.op``: the name of
the kernel modules ``kernels/<family>_cpu.py`` and ``_cuda.py`` that run them), so two families
never share one; the kinds of one family may share launch kinds (every BLAS kind's GEMM updates
are one ``blas.gemm`` launch kind).

A kind may carry ``params``: fixed choices its kernels read (which of the op's buffers is the
triangle, whether it is transposed, the sign of an update). Tasks of one kind share them, so a
launch group never mixes two settings: a parameterized kind is made once per setting
(:func:`kind`, memoized by name).

Kinds register here when their op module is imported: ``KINDS[name]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Group:
    """What a kind's ``launches`` sees of one launch group: its tasks' args and shapes."""

    args: np.ndarray  # (count, len(kind.args))
    rows: np.ndarray
    cols: np.ndarray
    width: np.ndarray


@dataclass(frozen=True)
class TaskKind:
    name: str
    op: str
    args: tuple[str, ...]
    # (rows, options) -> int window key per task; tasks of one kind, level and key form a group.
    window: Callable[[np.ndarray, dict], np.ndarray]
    # (group, options) -> [(launch kind, variant name)], in the order they must run.
    launches: Callable[[Group, dict], list[tuple[str, str]]]
    # (args, rows, cols, width) -> float per task
    flops: Callable[..., np.ndarray]
    # (args, rows, cols, width) -> elements read and written per task, at least; None: unknown
    traffic: Callable[..., np.ndarray] | None = None
    doc: str = ""
    params: tuple = ()  # sorted (name, value) pairs the family's kernels read
    # The kind's kernel orders its tasks itself: a launch's blocks take its tasks in table
    # order, and a task waits on device counters for the earlier tasks it needs. Its tasks keep
    # the graph's order inside a launch group (a topological order the op gives), not the
    # most-work-first order, and the graph has no edges between those of one window; the
    # planner puts a window's tasks on one level (the lowest any of them gets), so that they
    # are one launch whatever the policy. The multifrontal solve's sweeps and the factor's
    # small subtrees: one launch for a tree of any depth.
    ordered: bool = False

    @property
    def param(self) -> dict:
        return dict(self.params)


KINDS: dict[str, TaskKind] = {}
LAUNCH_KINDS: dict[str, str] = {}  # launch kind -> the kernel family that runs it


def register(kind: TaskKind, launch_kinds: tuple[str, ...]) -> TaskKind:
    """Add ``kind`` (and the launch kinds it issues) to the table; a kind's name must be new,
    and a launch kind belongs to one family."""
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"task kind {kind.name!r} is registered twice")
    for lk in launch_kinds:
        owner = LAUNCH_KINDS.get(lk)
        if owner is not None and owner != kind.op:
            raise ValueError(f"launch kind {lk!r} belongs to family {owner!r}, not {kind.op!r}")
    KINDS[kind.name] = kind
    for lk in launch_kinds:
        LAUNCH_KINDS[lk] = kind.op
    return kind


def kind(base: TaskKind, launch_kinds: tuple[str, ...], **params) -> TaskKind:
    """``base`` with ``params`` set: one registered kind per setting, made on first use."""
    pairs = tuple(sorted(params.items()))
    name = base.name + "[" + ",".join(f"{k}={v}" for k, v in pairs) + "]"
    hit = KINDS.get(name)
    if hit is None:
        from dataclasses import replace

        hit = register(replace(base, name=name, params=pairs), launch_kinds)
    return hit


def single(launch_kind: str) -> Callable[[Group, dict], list[tuple[str, str]]]:
    """``launches`` for a kind issued as one launch of ``launch_kind``."""

    def launches(group: Group, options: dict) -> list[tuple[str, str]]:
        return [(launch_kind, "single")]

    return launches


def by_rows(rows: np.ndarray, options: dict) -> np.ndarray:
    """The usual window: ``ceil(rows / nb)`` (sizes within one panel width of each other)."""
    nb = int(options["nb"])
    return -(-np.asarray(rows, dtype=np.int64) // nb)


def by_log2_past_32(rows: np.ndarray, options: dict) -> np.ndarray:
    """As :func:`by_log2`, with every size up to 32 in one window, and the windows numbered
    from the largest sizes down. Up to 32 a GEMM task is one tile, so one launch takes them all
    without blocks that exit: six launches (1, 2, 3-4, ... 17-32) cost a uniform Nmax 32 GEMM
    of 2000 problems ~0.09 ms of kernel time for work of a few microseconds (H200,
    2026-11-24). Largest first: the planner issues a level's groups in window order, round
    robin over the streams, and the launch of the longest blocks must start first (as the
    longest tasks do inside a group); numbered upward, the 257-512 launch of a uniform Nmax 512
    GEMM started behind a small one on its stream while the 129-256 launch took the device, and
    the call ran 4.89 ms against 4.33 (4.44 numbered from the largest)."""
    return 40 - np.maximum(by_log2(rows, options), 5)


def by_log2(rows: np.ndarray, options: dict) -> np.ndarray:
    """Sizes within a factor of two of each other: ``ceil(log2(rows))``. For kinds whose
    launches tile every task over one grid sized by the largest (a GEMM): blocks past a small
    task's tiles exit at once, and a factor-two window bounds them to three in four."""
    r = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    return np.ceil(np.log2(r)).astype(np.int64)
