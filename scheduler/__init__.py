"""Ready tasks become launch groups (levels, size windows, crossover, streams). Pure logic."""

from vbatch.core.graph import TaskGraph, alap, asap, chain_edges
from vbatch.scheduler.plan import Launch, Plan, Tasks, make_plan, plan_cholesky
from vbatch.scheduler.policy import POLICIES, Policy, get_policy

__all__ = [
    "TaskGraph",
    "alap",
    "asap",
    "chain_edges",
    "Launch",
    "Plan",
    "Tasks",
    "make_plan",
    "plan_cholesky",
    "POLICIES",
    "Policy",
    "get_policy",
]
