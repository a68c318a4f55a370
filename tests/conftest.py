"""Shared test setup: GPU-marked tests skip only on a real "no usable GPU"."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from vbatch.runtime.config import Config
from vbatch.runtime.device import cuda_status

# JAX (tests/test_frontends.py) would otherwise take 75% of the GPU's memory when it starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The tests run on vbatch's defaults: no runtime option from the caller's environment
# (VBATCH_<FIELD>, runtime/config.py), and never the caller's tune file (~/.cache/vbatch), here
# and in the processes the tests start (they inherit this environment).
for _name in Config.model_fields:
    os.environ.pop(f"VBATCH_{_name.upper()}", None)
os.environ["VBATCH_TUNE_FILE"] = os.path.join(tempfile.mkdtemp(prefix="vbatch-tests-"),
                                              "no-tune.json")

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
