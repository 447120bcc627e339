"""Test gating in one place. Triton compiles or interprets per process (TRITON_INTERPRET is read
when a kernel is defined), so one pytest process runs one kind of test:
- `pytest -m gpu` on a machine with CUDA: the GPU tests, kernels compiled;
- anything else (CI, a CPU machine, or a plain `pytest` on a GPU machine): every other test, its
  kernels under the Triton CPU interpreter (TRITON_INTERPRET=1, set before triton is imported),
  and the GPU tests skipped with the command that runs them."""

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
_GPU = pytest.StashKey[bool]()  # this process runs the GPU tests (pytest_configure)


def gpu_session(has_cuda: bool, markexpr: str, interpret: str | None) -> bool:
    """Whether this pytest process runs the GPU tests with compiled kernels: CUDA is present,
    the tests were selected with `-m gpu`, and TRITON_INTERPRET is not set to 1."""
    return has_cuda and markexpr.strip() == "gpu" and interpret != "1"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_GPU] = gpu_session(
        HAS_CUDA, config.getoption("markexpr", "") or "", os.environ.get("TRITON_INTERPRET")
    )
    if not config.stash[_GPU]:
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash[_GPU]:
        return
    why = (
        "runs with compiled kernels in a pytest process of its own: pytest -m gpu"
        if HAS_CUDA
        else "needs a CUDA GPU"
    )
    skip_gpu = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
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
