"""Turn a PolicyTable into what serving engines read, checked against each engine's rules.

Engines key speculation by batch size only and hold one tree shape for the whole server, while
a spectune table has a full policy per (batch, context) bucket. Each exporter therefore keeps
what the engine can express (draft length per batch range, on/off) and says, in an
`approximations` list, everything else it had to give up: other context buckets, per-bucket
top-k and budget, pruning, grafting, tree vs chain, a shared verify budget (ECHO's super-tree,
which no engine runs: the per-request budget is exported). The list is printed by the CLI and
written into the export (comments in text/YAML files, a sidecar `*.spectune.json` next to JSON
files whose engines reject unknown keys).

  sglang: server arguments + the adaptive config (keys: batch-size lower bounds,
          candidate_steps; 0 = off). With top-k 1, num_draft_tokens must be steps + 1.
  vllm:   speculative_config with num_speculative_tokens_per_batch_size ([lo, hi, K], inclusive,
          first lo = 1, K <= num_speculative_tokens). vLLM 0.33 verifies chains only, so each
          bucket gets its best chain; `tree=True` adds speculative_token_tree for older vLLM.
  trtllm: speculative_config YAML: draft_len_schedule (batch <= key gets the value; the
          smallest key maps to max_draft_len), dynamic-tree limits
          (max_draft_len <= max_total_draft_tokens <= topK * max_draft_len) or eagle_choices.
"""

from __future__ import annotations

from spectune.planner.export.base import (
    ENGINES,
    EngineShape,
    Evaluate,
    Export,
    TreeShaper,
    batch_plan,
    check_choices,
    fit_engine_shape,
    tree_choices,
)
from spectune.planner.export.sglang import check_sglang, export_sglang
from spectune.planner.export.trtllm import check_trtllm, export_trtllm, to_yaml
from spectune.planner.export.vllm import check_vllm, export_vllm
from spectune.specs.errors import SpecError
from spectune.specs.policy import PolicyTable


def export_policy(
    table: PolicyTable,
    engine: str,
    *,
    context: int | None = None,
    vllm_tree: bool = False,
    trtllm_static_tree: bool | None = None,
    shaper: TreeShaper | None = None,
    evaluate: Evaluate | None = None,
) -> Export:
    """Export a table for one engine. `evaluate` (the planner's objective) lets engines with
    one global tree shape get the shape that loses least; without it they take the
    smallest-batch bucket's shape."""
    if engine == "sglang":
        return export_sglang(table, context=context, evaluate=evaluate)
    if engine == "vllm":
        return export_vllm(table, context=context, tree=vllm_tree, shaper=shaper)
    if engine == "trtllm":
        return export_trtllm(
            table,
            context=context,
            static_tree=trtllm_static_tree,
            shaper=shaper,
            evaluate=evaluate,
        )
    raise SpecError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "EngineShape",
    "Evaluate",
    "Export",
    "TreeShaper",
    "batch_plan",
    "check_choices",
    "check_sglang",
    "check_trtllm",
    "check_vllm",
    "export_policy",
    "export_sglang",
    "export_trtllm",
    "export_vllm",
    "fit_engine_shape",
    "to_yaml",
    "tree_choices",
]
