"""The test gating's rule (tests/conftest.py): which pytest processes run the GPU tests."""

from __future__ import annotations

import os

import pytest

from tests.conftest import gpu_session


@pytest.mark.parametrize(
    ("has_cuda", "markexpr", "interpret", "want"),
    [
        (True, "gpu", None, True),
        (True, " gpu ", "0", True),
        (True, "gpu", "1", False),  # asked for the interpreter
        (True, "", None, False),  # a plain `pytest` on a GPU machine: the interpreter suite
        (True, "not gpu", None, False),
        (True, "gpu and slow", None, False),
        (False, "gpu", None, False),  # no CUDA
        (False, "", None, False),
    ],
)
def test_gpu_session(has_cuda: bool, markexpr: str, interpret: str | None, want: bool) -> None:
    assert gpu_session(has_cuda, markexpr, interpret) is want


def test_this_process_interprets_unless_it_runs_gpu_tests(request: pytest.FixtureRequest) -> None:
    """Outside `pytest -m gpu` on CUDA, kernels are interpreted (CPU tensors work)."""
    markexpr = request.config.getoption("markexpr", "") or ""
    if markexpr.strip() != "gpu":
        assert os.environ.get("TRITON_INTERPRET") == "1"
