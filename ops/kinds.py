"""Task kinds: the one table the scheduler and every backend read.

An operation (``ops/<op>.py``) turns a submission into tasks; each task has a *kind*. A kind says:

* ``args``: the names of its integer arguments (a task row is ``problem, *args``);
* ``shape(rows, cols, width)``: per task, the sizes the planner groups by and prints (a POTRF
  panel: its height, its first column, its width), computed from the args and the problem sizes
  by the op when it builds the graph;
* ``window``: which tasks of this kind may share one vbatched launch at one level (implicit
  sorting: the tasks of a launch group differ in size by less than one window);
* ``launches``: how a group of its tasks is issued, as one or several *launch kinds* in order
  (POTRF's panel: one fused launch below the crossover, else update, potf2, trsm);
* ``flops``, ``bytes``: per task, for the roofline floor and for balancing work.

Launch kinds are what backends implement (one function per launch kind on the CPU, one kernel
selection per launch kind on CUDA); their names are global, so two ops never share one.

Kinds register here when their op module is imported: ``KINDS[name]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    bytes: Callable[..., np.ndarray] = field(default=None)  # type: ignore[assignment]
    doc: str = ""


KINDS: dict[str, TaskKind] = {}
LAUNCH_KINDS: dict[str, str] = {}  # launch kind -> the task kind that issues it


def register(kind: TaskKind, launch_kinds: tuple[str, ...]) -> TaskKind:
    """Add ``kind`` (and the launch kinds it issues) to the table; names must be new."""
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"task kind {kind.name!r} is registered twice")
    for lk in launch_kinds:
        owner = LAUNCH_KINDS.get(lk)
        if owner is not None and owner != kind.name:
            raise ValueError(f"launch kind {lk!r} belongs to {owner!r}, not {kind.name!r}")
    KINDS[kind.name] = kind
    for lk in launch_kinds:
        LAUNCH_KINDS[lk] = kind.name
    return kind


def single(launch_kind: str) -> Callable[[Group, dict], list[tuple[str, str]]]:
    """``launches`` for a kind issued as one launch of ``launch_kind``."""

    def launches(group: Group, options: dict) -> list[tuple[str, str]]:
        return [(launch_kind, "single")]

    return launches


def by_rows(rows: np.ndarray, options: dict) -> np.ndarray:
    """The usual window: ``ceil(rows / nb)`` (sizes within one panel width of each other)."""
    nb = int(options["nb"])
    return -(-np.asarray(rows, dtype=np.int64) // nb)
