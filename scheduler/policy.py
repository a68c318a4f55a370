"""Start-step policies: when each problem's first panel step runs.

Both policies answer two questions with numpy arrays over the problems:

* ``start(steps, smax)``: the global step at which problem ``i`` takes its local step 0;
* ``chain(n, steps, nb)``: a key such that, at any global step, the active problems with one key
  have panel heights inside one ``nb`` window. Problems with the same key form one chain of launch
  groups; different keys never depend on each other, so their chains may run on different streams.

Why the keys hold. At global step ``t`` problem ``i`` is at local step ``s = t - start_i`` and its
panel height is ``h = n_i - s * nb``.

* **DSSE** (different starts, same end): ``start_i = S_max - S_i``, so
  ``h = r_i + (S_max - t) * nb`` with ``r_i = n_i - S_i * nb``. With key ``e_i = ceil(r_i / nb)``,
  ``h`` lies in ``((e_i - 1 + S_max - t) nb, (e_i + S_max - t) nb]``. For a full factorization
  ``r_i`` is in ``(-nb, 0]``, so every problem has key 0: one group per step, all ending together.
* **SSDE** (same start, different ends): ``start_i = 0``, ``h = n_i - t * nb``; the key is
  ``ceil(n_i / nb)``: one group per distinct block count per step.

DSSE is the default: it gives the fewest, fullest launches (Abdelfattah et al., "Implicit sorting
/ DSSE" in the vbatched Cholesky papers), and a plan whose active set is a prefix at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Policy:
    name: str
    doc: str

    def start(self, steps: np.ndarray, smax: int) -> np.ndarray:
        if self.name == "dsse":
            return smax - steps
        return np.zeros_like(steps)

    def chain(self, n: np.ndarray, steps: np.ndarray, nb: int) -> np.ndarray:
        if self.name == "dsse":
            return -(-(n - steps * nb) // nb)
        return -(-n // nb)


POLICIES = {
    "dsse": Policy("dsse", "different starts, same end: every problem ends at the last step"),
    "ssde": Policy("ssde", "same start, different ends: every problem starts at step 0"),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICIES)})") from None
