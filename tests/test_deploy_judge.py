"""planner.export.runs against the engines' own code: what `spectune plan` prices as each
engine's deployment, and `spectune simulate --policy EXPORT` runs, is what the engine resolves
from the export (draft length per batch size). Uses the judge's stubs and plans; skips where an
engine is not installed, as the judge does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_engines_judge import (  # noqa: F401  (stubs: the judge's model-stub fixture)
    PLANS,
    _export,
    _resolve_sglang,
    _vllm_config,
    stubs,
    trtllm_lengths,
)


def _run_lengths(runs: Any, m: int) -> list[int]:
    """Draft length per batch size 1..m (index 0 unused) of planner.export.runs' reading."""
    out = [0]
    for x in range(1, m + 1):
        p = next((r.policy for r in runs if r.batch[0] <= x <= r.batch[1]), runs[-1].policy)
        out.append(0 if p is None else p.depth)
    return out


@pytest.mark.parametrize("plan", list(PLANS))
def test_engine_runs_read_configs_as_the_engines_do(
    plan: str,
    stubs: dict[str, str],  # noqa: F811  (the imported fixture)
    tmp_path: Path,
) -> None:
    """planner.export.runs, which `spectune plan` prices as each engine's deployment and
    `simulate --policy` runs for an export, reads every export the way the engine's own code
    resolves it: the same draft length at every batch size."""
    from spectune.planner.export.runs import engine_runs

    table = PLANS[plan]
    m = max(b.batch[1] for b in table.buckets)
    ex = _export(plan, "vllm", stubs, tmp_path / "vllm")
    sc = _vllm_config(ex.argv(tmp_path / "vllm")).speculative_config
    if sc is None:
        dense = [0] * (m + 1)
    elif sc.num_speculative_tokens_per_batch_size is None:
        dense = [0] + [sc.num_speculative_tokens] * m
    else:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        dense = list(
            build_dynamic_sd_schedule_lookup(
                sc.num_speculative_tokens_per_batch_size, m, sc.num_speculative_tokens
            )
        )
    assert _run_lengths(engine_runs("vllm", ex.config), m)[1:] == dense[1 : m + 1]
    ex = _export(plan, "sglang", stubs, tmp_path / "sglang")
    r = _resolve_sglang(ex.argv(tmp_path / "sglang"))
    if r["speculative_adaptive"]:
        from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

        params = AdaptiveSpeculativeParams(
            r["speculative_num_steps"], r["speculative_adaptive_config"]
        )
        want = [0] + [params.get_steps_for_batch(x) for x in range(1, m + 1)]
    else:
        want = [0] + [r["speculative_num_steps"] or 0] * m
    assert _run_lengths(engine_runs("sglang", ex.config), m)[1:] == want[1:]
    for profile in ("trtllm", "trtllm-1.4"):
        ex = _export(plan, profile, stubs, tmp_path / profile)
        spec = ex.config.get("speculative_config")
        got = _run_lengths(engine_runs("trtllm", ex.config, profile), m)
        assert got[1:] == trtllm_lengths(spec, profile, m)[1:]
