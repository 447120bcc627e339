"""Turn a PolicyTable into what serving engines read, checked against each engine's rules.

Engines key speculation by batch size only and run one configuration for the whole server. A
table planned with `spectune plan --engine X` already holds, in every bucket, exactly what X
runs (planner.engine_plan chose it), and its export reads it as written: nothing is lost and
the `approximations` list is empty. A table planned for spectune's own executor (a full policy
per (batch, context) bucket) is first fitted to the engine by the same planner code
(planner.engine_plan.fit_table, with the table's objective), and the list says what that costs;
it also says everything else an export gives up: pruning, grafting, a shared verify budget
(ECHO's super-tree, which no engine runs: the per-request budget is exported), CUDA-graph
padding that moves a batch into another adaptive slot. The list is printed by the CLI and
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
and the scenario's closed form (planner.objective.scenario_objective) for the fit, so both write
the same files for the same table.
"""

from __future__ import annotations

import math
from dataclasses import replace

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
from spectune.specs.scenario import Scenario
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
    trtllm, trtllm-1.4, a profile file, or an EngineProfile). A table the engine cannot run as
    written (not planned with --engine) is first fitted by planner.engine_plan.fit_table with
    `evaluate` (the planner's objective), and a note says what that costs; without `evaluate`
    each exporter maps it deterministically (recorded chains, the smallest-batch bucket's
    shape) and notes that. `vllm_tree` picks vllm-0.11 for 'vllm'.
    `model_path` / `draft_model_path` override the models' Hugging Face repo ids."""
    if engine == "vllm" and vllm_tree:
        engine = "vllm-0.11"
    prof = load_engine(engine)
    for b in table.buckets:
        check_runnable(b.policy, f"{prof.name} ({prof.versions})")
    notes: list[str] = []
    if evaluate is not None and prof.engine != "spectune":
        table, note = _engine_runnable(table, prof, evaluate)
        notes += [note] if note else []
    if prof.engine == "sglang":
        return export_sglang(
            table,
            context=context,
            notes=notes,
            profile=prof,
            model_path=model_path,
            draft_model_path=draft_model_path,
        )
    if prof.engine == "vllm":
        return export_vllm(
            table,
            context=context,
            notes=notes,
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
            notes=notes,
            profile=prof,
            model_path=model_path,
            draft_model_path=draft_model_path,
        )
    raise SpecError(
        f"engine profile {prof.name!r} ({prof.engine}) has no export: spectune's own executor "
        f"reads the policy file itself; export for one of {', '.join(ENGINES)}"
    )


def _engine_runnable(
    table: PolicyTable, profile: EngineProfile, evaluate: Evaluate
) -> tuple[PolicyTable, str]:
    """The table as written when the engine runs it so (a plan made with --engine), else the
    configuration planner.engine_plan.fit_table chooses with the objective, and a note."""
    from spectune.planner.engine_plan import fit_table, runnable_reason

    reason = runnable_reason(table, profile)
    if not reason:
        return table, ""
    fitted, config, loss = fit_table(table, profile, evaluate)
    return fitted, (
        f"{profile.name} cannot run the table as written ({reason}); the planner chose "
        f"{config.label} (planner.engine_plan): predicted tok/s "
        f"{100 * (math.exp(loss) - 1):+.1f}% vs the table's policies (geometric mean over "
        f"buckets); plan with --engine {profile.name} to search within it"
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
    model (built when an engine needs one), and its closed form to fit a table not planned
    for the engine. Returns the export and a note ('' when none) when the objective could not
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
    and why not. A pair warning raised as an error (--strict) stays an error."""
    from spectune.planner.objective import scenario_objective
    from spectune.specs.compat import PairWarning

    if not table.scenario.workload:
        return None, "the policy file names no workload: engine knobs from the batch-1 bucket"
    try:
        return scenario_objective(table.scenario.resolve()), ""
    except PairWarning:
        raise
    except (SpecError, OSError) as e:
        return None, f"cannot rebuild the objective ({e}): engine knobs from the batch-1 bucket"


def table_shaper(table: PolicyTable) -> TreeShaper:
    """Static trees for engines with a fixed tree (Sequoia's shape for the policy's depth,
    top-k and budget under the acceptance of the table's Scenario: its workload for its
    (target, drafter) pair, Scenario.resolve_pair; seed 0). The scenario is resolved on the
    first call: a table without a workload fails only where a shape is needed."""
    import numpy as np

    from spectune.planner.acceptance import AcceptanceModel, acceptance_model
    from spectune.planner.trees import build_tree

    models: list[AcceptanceModel] = []

    def shape(policy: TreePolicy) -> DraftTree:
        if not models:
            models.append(acceptance_model(table.scenario.resolve_pair()[2]))
        static = TreePolicy("static", policy.depth, policy.topk, policy.budget)
        tree: DraftTree = build_tree(static, models[0], np.random.default_rng(0))
        return tree

    return shape


def for_pair(table: PolicyTable, scenario: Scenario) -> PolicyTable:
    """`table` exported for `scenario`'s (target, drafter) pair when it differs from the one
    it was planned for: the same buckets and policies, the scenario's names, so the engine
    loads the new checkpoints and tree shapes and the engine fit take the new pair's
    acceptance (Scenario.resolve_pair checks the pair first: SpecError when it cannot run
    together). The buckets' recorded predictions stay those of the planned pair."""
    if (scenario.target, scenario.drafter) == (table.scenario.target, table.scenario.drafter):
        return table
    scenario.resolve_pair()
    drafter = scenario.drafter if scenario.has_drafter else ""
    return replace(table, target=scenario.target, drafter=drafter, scenario=scenario)


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
    "for_pair",
    "model_paths",
    "schedule_for",
    "table_objective",
    "table_shaper",
    "to_yaml",
    "tree_choices",
]
