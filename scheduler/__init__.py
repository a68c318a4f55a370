"""Ready tasks become launch groups (size window, policy, crossover, streams). Pure logic."""

from vbatch.scheduler.plan import (
    FUSED_VARIANT,
    SEPARATED_VARIANT,
    Launch,
    Plan,
    make_plan,
    step_kinds,
)
from vbatch.scheduler.policy import POLICIES, Policy, get_policy

__all__ = [
    "FUSED_VARIANT",
    "SEPARATED_VARIANT",
    "Launch",
    "Plan",
    "make_plan",
    "step_kinds",
    "POLICIES",
    "Policy",
    "get_policy",
]
