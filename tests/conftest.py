"""Shared test setup: GPU-marked tests skip only on a real "no usable GPU"."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from vbatch.runtime.device import cuda_status

# JAX (tests/test_frontends.py) would otherwise take 75% of the GPU's memory when it starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# CI has 2 cores and a 15-minute budget for the whole suite; locally VBATCH_HYPOTHESIS=dev
# explores more.
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("VBATCH_HYPOTHESIS", "ci"))


def pytest_collection_modifyitems(config, items):
    usable, why = cuda_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Every backend runs the same conformance tests; "cuda" only where a GPU is usable.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
