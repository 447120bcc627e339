"""Turn a PolicyTable into what serving engines read, checked against each engine's rules.

Engines key speculation by batch size only and hold one tree shape for the whole server, while
a spectune table has a full policy per (batch, context) bucket. Each exporter therefore keeps
what the engine can express (draft length per batch range, on/off) and says, in an
`approximations` list, everything else it had to give up: other context buckets, per-bucket
top-k and budget, pruning, grafting, tree vs chain, a shared verify budget (ECHO's super-tree,
which no engine runs: the per-request budget is exported). The list is printed by the CLI and
written into the export (comments in text/YAML files, a sidecar `*.spectune.json` next to JSON
files whose engines reject unknown keys).

Each export targets an `EngineProfile` (specs.engine: an engine over a version range) and runs
as planned: the engine loads the models' Hugging Face repo ids (or the user's paths), the
launch command (`launch_<engine>.sh`, beside the config) sets tensor parallelism and the max
running requests / batch size of the plan, and every engine-imposed cap is set or said. What
the engine cannot run at all raises SpecError naming what it supports.

  sglang: launch_server arguments; a static (steps, top-k, draft tokens), or adaptive chains
          with the adaptive config (keys: batch-size lower bounds, candidate_steps; 0 = off).
  vllm:   speculative_config with num_speculative_tokens_per_batch_size ([lo, hi, K], inclusive,
          first lo = 1, K = 0 off); vLLM 0.33 verifies chains only; the vllm-0.11 profile
          exports one speculative_token_tree instead.
  trtllm: extra_llm_api_options YAML: draft_len_schedule in the key semantics of the profile's
          version, dynamic-tree limits or eagle_choices (not in 1.4).

`export_table` is what `spectune export` and the dashboards' Planner page both call: the table
exported with what its Scenario gives, static tree shapes from the workload's acceptance model
and the scenario's closed form (planner.objective.scenario_objective) to fit the one global
shape, so both write the same files for the same table.
"""

from __future__ import annotations

from spectune.planner.export.base import (
    ENGINES,
    HERE,
    EngineShape,
    Evaluate,
    Export,
    ModelPaths,
    TreeShaper,
    batch_plan,
    check_choices,
    fit_engine_shape,
    model_paths,
    tree_choices,
)
from spectune.planner.export.sglang import check_sglang, export_sglang
from spectune.planner.export.trtllm import check_trtllm, export_trtllm, schedule_for, to_yaml
from spectune.planner.export.vllm import check_vllm, export_vllm
from spectune.planner.space import check_runnable
from spectune.specs.engine import EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.policy import PolicyTable, TreePolicy
from spectune.specs.tree import DraftTree


def export_policy(
    table: PolicyTable,
    engine: str | EngineProfile,
    *,
    context: int | None = None,
    vllm_tree: bool = False,
    trtllm_static_tree: bool | None = None,
    shaper: TreeShaper | None = None,
    evaluate: Evaluate | None = None,
    model_path: str | None = None,
    draft_model_path: str | None = None,
) -> Export:
    """Export a table for one engine profile (a preset name such as sglang, vllm, vllm-0.11,
    trtllm, trtllm-1.4, a profile file, or an EngineProfile). `evaluate` (the planner's
    objective) lets engines with one global tree shape get the shape that loses least; without
    it they take the smallest-batch bucket's shape. `vllm_tree` picks vllm-0.11 for 'vllm'.
    `model_path` / `draft_model_path` override the models' Hugging Face repo ids."""
    if engine == "vllm" and vllm_tree:
        engine = "vllm-0.11"
    prof = load_engine(engine)
    for b in table.buckets:
        check_runnable(b.policy, f"{prof.name} ({prof.versions})")
    if prof.engine == "sglang":
        return export_sglang(
            table,
            context=context,
            evaluate=evaluate,
            profile=prof,
            model_path=model_path,
            draft_model_path=draft_model_path,
        )
    if prof.engine == "vllm":
        return export_vllm(
            table,
            context=context,
            shaper=shaper,
            profile=prof,
            model_path=model_path,
            draft_model_path=draft_model_path,
        )
    if prof.engine == "trtllm":
        return export_trtllm(
            table,
            context=context,
            static_tree=trtllm_static_tree,
            shaper=shaper,
            evaluate=evaluate,
            profile=prof,
            model_path=model_path,
            draft_model_path=draft_model_path,
        )
    raise SpecError(
        f"engine profile {prof.name!r} ({prof.engine}) has no export: spectune's own executor "
        f"reads the policy file itself; export for one of {', '.join(ENGINES)}"
    )


def export_table(
    table: PolicyTable,
    engine: str | EngineProfile,
    *,
    context: int | None = None,
    vllm_tree: bool = False,
    trtllm_static_tree: bool | None = None,
    model_path: str | None = None,
    draft_model_path: str | None = None,
) -> tuple[Export, str]:
    """export_policy with the table's Scenario: tree shapes from its workload's acceptance
    model (built when an engine needs one), and its closed form to fit the engines' one
    global shape. Returns the export and a note ('' when none) when the objective could not
    be built, so the engine knobs come from the batch-1 bucket."""
    evaluate, note = table_objective(table)
    return (
        export_policy(
            table,
            engine,
            context=context,
            vllm_tree=vllm_tree,
            trtllm_static_tree=trtllm_static_tree,
            shaper=table_shaper(table),
            evaluate=evaluate,
            model_path=model_path,
            draft_model_path=draft_model_path,
        ),
        note,
    )


def table_objective(table: PolicyTable) -> tuple[Evaluate | None, str]:
    """The planner's closed form for the table's Scenario (what it was planned with), or None
    and why not."""
    from spectune.planner.objective import scenario_objective

    if not table.scenario.workload:
        return None, "the policy file names no workload: engine knobs from the batch-1 bucket"
    try:
        return scenario_objective(table.scenario.resolve()), ""
    except (SpecError, OSError) as e:
        return None, f"cannot rebuild the objective ({e}): engine knobs from the batch-1 bucket"


def table_shaper(table: PolicyTable) -> TreeShaper:
    """Static trees for engines with a fixed tree (Sequoia's shape for the policy's depth,
    top-k and budget under the table's workload acceptance; seed 0). The workload is loaded
    on the first call: a table without one fails only where a shape is needed."""
    import numpy as np

    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import build_tree
    from spectune.specs.workload import load_workload

    def shape(policy: TreePolicy) -> DraftTree:
        model = acceptance_model(load_workload(table.scenario.workload))
        static = TreePolicy("static", policy.depth, policy.topk, policy.budget)
        tree: DraftTree = build_tree(static, model, np.random.default_rng(0))
        return tree

    return shape


__all__ = [
    "ENGINES",
    "HERE",
    "EngineShape",
    "Evaluate",
    "Export",
    "ModelPaths",
    "TreeShaper",
    "batch_plan",
    "check_choices",
    "check_sglang",
    "check_trtllm",
    "check_vllm",
    "export_policy",
    "export_sglang",
    "export_table",
    "export_trtllm",
    "export_vllm",
    "fit_engine_shape",
    "model_paths",
    "schedule_for",
    "table_objective",
    "table_shaper",
    "to_yaml",
    "tree_choices",
]
