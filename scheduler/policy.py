"""Start policies: at which level each task runs. One small interface, two policies.

A policy maps a :class:`~vbatch.core.graph.TaskGraph` to one level per task, such that every
edge goes from a lower level to a higher one. The planner then groups each level's tasks of one
kind by size window (implicit sorting) into launches.

* **DSSE** (different starts, same end; the default): as late as possible. Every problem's last
  task runs at the last level, so small problems join the launches of large ones at their final
  steps: the fewest, fullest launches (Abdelfattah et al., "Implicit sorting / DSSE" in the
  vbatched Cholesky papers). For a blocked factorization of panel width nb, the panels running
  at one level then differ in height by less than nb for a full factorization, so each level is
  one launch group; and the problems active at a level are those with the most steps.
* **SSDE** (same start, different ends): as soon as possible. Every problem starts at level 0;
  at a level, panels of every height run, one group per size window.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from vbatch.core.graph import TaskGraph


@dataclass(frozen=True)
class Policy:
    name: str
    doc: str
    latest: bool  # as late as possible (else as soon as possible)

    def levels(self, graph: TaskGraph) -> np.ndarray:
        return graph.levels(self.latest)


POLICIES = {
    "dsse": Policy("dsse", "different starts, same end: every problem ends at the last level",
                   True),
    "ssde": Policy("ssde", "same start, different ends: every problem starts at level 0", False),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICIES)})") from None
