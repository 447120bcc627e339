"""The forward probes' CPU parts: kernel time by class and by name over profiled calls, what a
GEMM plan's buckets run between them (benchmarks/probe_forward_kernels.py, probe_gemm_buckets.py),
and the pruned-verify probe on a tiny model (probe_pruned_verify.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from benchmarks.probe_forward_kernels import _by_name, by_class
from benchmarks.probe_gemm_buckets import _plan_pick
from spectune.kernels.gemm import PLAN_TIE


def test_by_class_and_by_name_take_medians_over_calls() -> None:
    calls = [
        [("_splitk_kernel", 0.0, 10.0), ("_tree_attention_kernel", 10.0, 4.0), ("_splitk_kernel", 14.0, 6.0)],
        [("_splitk_kernel", 0.0, 12.0), ("_tree_attention_kernel", 12.0, 5.0), ("_splitk_kernel", 17.0, 6.0)],
        [("_splitk_kernel", 0.0, 30.0), ("_tree_attention_kernel", 30.0, 3.0), ("_splitk_kernel", 33.0, 6.0)],
    ]  # fmt: skip
    cls = by_class(calls)
    assert cls == {"linear": 18.0, "attention": 4.0}
    assert by_class(calls, lambda name: "all") == {"all": 23.0}
    names = _by_name(calls)
    assert names["_splitk_kernel"] == [18.0, 2] and names["_tree_attention_kernel"] == [4.0, 1]
    assert list(names) == ["_splitk_kernel", "_tree_attention_kernel"]  # longest first


def test_plan_pick_follows_autotune_buckets_and_the_tie() -> None:
    """Between buckets a plan runs the next bucket's pick; a bucket keeps the previous pick
    within PLAN_TIE (kernels.gemm.pick_variant), so a near-tie does not flip the variant."""
    near = 1 + PLAN_TIE / 2
    times = {
        "splitk1": {1: 30.0, 16: 31.0 * near, 32: 40.0},
        "cublas": {1: 31.0, 16: 31.0, 32: 33.0},
    }
    assert _plan_pick(times, (1, 16, 32), 1) == "splitk1"
    assert _plan_pick(times, (1, 16, 32), 8) == "splitk1"  # within the tie at bucket 16: kept
    assert _plan_pick(times, (1, 16, 32), 24) == "cublas"  # past it at bucket 32
    assert _plan_pick(times, (1, 16, 32), 64) == "cublas"  # above every bucket


def test_pruned_verify_probe_runs_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/probe_pruned_verify.py --tiny: every policy's phases and the kept tokens land in
    --out (the GPU-only parts, graph replays and profiles, are skipped off CUDA)."""
    import json
    import sys

    from benchmarks import probe_pruned_verify as probe

    out = tmp_path / "pruned.json"
    monkeypatch.setattr(sys, "argv", ["probe", "--tiny", "--steps", "3", "--out", str(out)])
    probe.main()
    doc = json.loads(out.read_text())
    rows = {r["label"]: r for r in doc["rows"]}
    assert set(rows) == {label for label, _ in probe.POLICIES}
    pruned = rows["pruned 6/8/32 @0.05"]
    assert pruned["ragged"] and not rows["dense 6/8/32"]["ragged"]
    assert 1 <= pruned["verified_mean"] <= 32 and rows["dense 6/8/32"]["verified_mean"] == 32
    for r in rows.values():
        assert r["phases_ms"]["verify"] > 0 and r["phases_ms"]["step"] >= r["phases_ms"]["verify"]
