"""Test gating in one place: GPU tests run only where CUDA is present; kernel tests elsewhere run
under the Triton CPU interpreter (TRITON_INTERPRET=1, set before triton is imported)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


HAS_CUDA = _cuda_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _restore_main_module():
    """Put back the process's `__main__` after each test. Streamlit's AppTest runs a dashboard
    script as `__main__` and leaves it there; multiprocessing's spawn start method (the TP tests'
    ranks) re-runs the parent's `__main__` file in every child, so a later spawn in the same
    xdist worker would start each rank by running the dashboard app."""
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None and sys.modules.get("__main__") is not main:
        sys.modules["__main__"] = main
