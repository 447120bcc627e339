"""The GPU-only probes import on CPU and parse their arguments (their measurements run on the
device: benchmarks/results/attention_batch_h200, gemm_m1_h200)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", ["probe_attention_batch.py", "probe_gemm_m1.py"])
def test_probe_help(script: str) -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--out" in res.stdout
