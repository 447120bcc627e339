"""What the dashboards compute, without any UI: every number a page shows comes from here.

Pages stay thin (widgets, layout, charts) and call these functions through cached wrappers
(dashboards.ui); the tests call the same functions and compare them, and what the pages show,
with the planner's and the simulator's own APIs. Nothing here prices, searches or simulates by
itself: it assembles the planner's cost model, acceptance model, closed-form objective, tree
builders, search and export, and the simulator's `simulate`.

A page predicts for a `spectune.specs.Scenario` (the sidebar's, or a policy file's), resolved
here once and priced by the planner's one closed-form objective for it
(planner.tokens_per_s.served_objective, the objective `spectune plan` scores with). tokens/s
has the two meanings planner.tokens_per_s names, and every page labels which it shows:
served tok/s incl. prefill (that objective: what a policy file records and the Planner plots)
and decode tok/s (its decode view: one iteration of running requests, what the executor
measures). A plan's bucket is scored as `spectune plan` scores it (bucket_score): the served
figure at the bucket's points, geometric mean. Beside the scenario a page may pass `trace`, the
key of an uploaded acceptance trace (register_trace) that replaces the workload's acceptance
model; it is dashboard state, not part of the scenario.

The folders the pages read (measurements/, benchmarks/results/) are found from the repository
root (repo_path), not from the directory the dashboard was started in.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spectune.planner.acceptance import AcceptanceModel, acceptance_model
from spectune.planner.buckets import BucketSpec
from spectune.planner.costmodel import CostModel
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.search import geomean
from spectune.planner.space import EAGLE_DEFAULT, SGLANG_DEFAULT, canonical_policy
from spectune.planner.tokens_per_s import DECODE, SERVED, decode_objective, served_objective
from spectune.planner.trees import build_tree
from spectune.specs import (
    DraftTree,
    PolicyTable,
    ResolvedScenario,
    Scenario,
    SpecError,
    TreePolicy,
)
from spectune.specs import policy_label as policy_label  # the pages' name for TreePolicy.label
from spectune.specs.compat import PairWarning

DEFAULT_SCENARIO = Scenario()
"""The scenario of a page opened without the sidebar (the defaults of `spectune plan`)."""

DECODE_ONLY_NOTE = (
    f"{DECODE.label}: one iteration of running requests, without the prefill of requests that "
    f"replace finished ones and without the KV-cache cap on the batch (the Planner's "
    f"{SERVED.label} includes both)"
)
SERVED_TOK_S = SERVED.label
"""The column, axis and metric label of served tokens/s (planner.tokens_per_s.SERVED)."""
DECODE_TOK_S = DECODE.label
"""The label of decode tokens/s (planner.tokens_per_s.DECODE)."""
SERVED_HELP = SERVED.description
DECODE_HELP = DECODE.description
BUCKET_SCORE_FILE = "bucket score, policy file"
BUCKET_SCORE_HERE = "bucket score, predicted here"
"""Metric labels of a bucket's score (served tok/s incl. prefill, which the line above them
names): as the policy file records it, and computed by this dashboard's objective."""
BUCKET_SCORE_HELP = (
    f"{SERVED.label} of the bucket as `spectune plan` scores and records it: the geometric "
    "mean over the bucket's batch ends, at the middle of its context range"
)

# The references every policy is compared with (planner.space): SGLang's and EAGLE's defaults.
REFERENCE_POLICIES: Mapping[str, TreePolicy | None] = {
    "SGLang default 5/4/8": SGLANG_DEFAULT,
    "EAGLE default 7/10/60": EAGLE_DEFAULT,
    "no speculation": None,
}


@functools.lru_cache(maxsize=64)
def _resolved(scenario: Scenario) -> tuple[ResolvedScenario, tuple[str, ...]]:
    """Scenario.resolve once per scenario, and the PairWarnings it gave (other warnings are
    passed on)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolved = scenario.resolve()
    notes = []
    for w in caught:
        if issubclass(w.category, PairWarning):
            notes.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return resolved, tuple(dict.fromkeys(notes))


def resolve(scenario: Scenario) -> ResolvedScenario:
    """The scenario's specs, loaded once per scenario (Scenario.resolve): the workload's
    acceptance is the one of the scenario's (target, drafter) pair."""
    return _resolved(scenario)[0]


def pair_notes(scenario: Scenario) -> tuple[str, ...]:
    """What resolving the scenario warned about its pair (specs.workload.workload_for_pair):
    the nearest acceptance preset used for a pair without one of its own, or a workload fitted
    for another pair. Pages show each beside what they predict."""
    return _resolved(scenario)[1]


# Acceptance models replayed from uploaded traces, by content hash (pages pass the key beside
# the scenario, so arguments stay small and hashable for the dashboards' caches).
_TRACES: dict[str, tuple[AcceptanceModel, str]] = {}


def register_trace(key: str, model: AcceptanceModel, label: str = "") -> None:
    """Make an acceptance model (a planner TraceReplay) available to pages as `trace=key`."""
    _TRACES[key] = (model, label or key)


def acceptance_for(scenario: Scenario, trace: str = "") -> AcceptanceModel:
    """The acceptance model: the registered trace `trace`, else the scenario's workload's."""
    if not trace:
        return acceptance_model(resolve(scenario).workload)
    found = _TRACES.get(trace)
    if found is None:
        raise SpecError("the acceptance trace of this scenario is gone; upload it again")
    return found[0]


def trace_label(trace: str) -> str:
    """The label of a registered acceptance trace (its key when it is gone)."""
    found = _TRACES.get(trace)
    return found[1] if found else trace


def scenario_label(scenario: Scenario, trace: str = "") -> str:
    """What a page says it predicts for: the resolved scenario's label, and the trace."""
    label = resolve(scenario).label
    return label + (f", acceptance from trace {trace_label(trace)}" if trace else "")


@functools.lru_cache(maxsize=64)
def _served(scenario: Scenario, trace: str) -> ClosedFormObjective:
    """One served objective per (scenario, trace), so that every page and chart reads the same
    instance and its caches of E[tokens per step] (deterministic values)."""
    acceptance = acceptance_for(scenario, trace) if trace else None
    return served_objective(resolve(scenario), acceptance=acceptance)


def objective_for(
    scenario: Scenario, trace: str = "", *, decode_only: bool = False
) -> ClosedFormObjective:
    """The planner's closed-form objective for a scenario: what `spectune plan` scores with
    (served tok/s incl. prefill, planner.tokens_per_s.served_objective), or its decode view
    (decode tok/s)."""
    served = _served(scenario, trace)
    return decode_objective(served) if decode_only else served


def repo_path(*parts: str, env: str = "") -> Path:
    """A folder of the repository (measurements, benchmarks/results, data): $`env` when set,
    else under the repository root that holds this package (the folder with pyproject.toml
    above spectune/), else under the working directory for an installed package without one.
    Never the directory the dashboard happened to be started in when the repository is here."""
    if env and os.environ.get(env):
        return Path(os.environ[env])
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "spectune").is_dir():
        return root.joinpath(*parts)
    return Path.cwd().joinpath(*parts)


def make_policy(
    builder: str,
    depth: int,
    topk: int,
    budget: int,
    prune_threshold: float = 0.0,
    graft_budget: int = 0,
    shared_budget: bool = False,
) -> tuple[TreePolicy, str]:
    """The policy these slider values build (planner.space.canonical_policy) and a note saying
    what was cut, if anything ('' otherwise). shared_budget: ECHO's one verify budget for the
    whole batch (priced at the page's batch size)."""
    p = canonical_policy(builder, depth, topk, budget, prune_threshold, graft_budget, shared_budget)
    notes = []
    if p.budget != budget:
        notes.append(
            f"verify budget cut to {p.budget}: the largest tree {builder} grows with depth "
            f"{depth} and top-k {topk}"
        )
    if p.graft_budget != graft_budget:
        notes.append(f"graft budget cut to {p.graft_budget}: the draft slots of the budget")
    return p, "; ".join(notes)


# ---- what-if ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WhatIf:
    """One policy (None: speculation off) at one (batch, context): both kinds of tokens/s, and
    where the time of one decoding iteration of the batch goes.

    Served figures are the planner's objective (planner.tokens_per_s.SERVED): the iteration at
    the batch the KV cache holds (`served_batch`) plus the prefill turnover of requests that
    replace finished ones (`turnover_s`), so served_step_s = iteration at served_batch +
    turnover_s. Decode figures (DECODE) and the phase breakdowns are one iteration at exactly
    `batch`: sum(phases_s) = step_s."""

    policy: TreePolicy | None
    batch: int
    context: int
    tree_tokens: float  # tokens verified per sequence, root included (mean when pruning)
    expected_tokens: float  # tokens emitted per sequence per step (accepted + bonus)
    phases_s: Mapping[str, float]  # StepBreakdown.phases (draft ... engine); sum = step_s
    verify_breakdown_s: Mapping[str, float]  # operator classes of the verify pass
    draft_steps_s: Mapping[str, float]  # the drafting phase by step; sums to phases_s["draft"]
    step_s: float  # one decode iteration of `batch` sequences
    off_step_s: float
    decode_tokens_per_s: float
    off_decode_tokens_per_s: float
    served_tokens_per_s: float
    off_served_tokens_per_s: float
    served_batch: int  # the batch the KV cache holds at this context (<= batch)
    served_step_s: float  # seconds per served iteration: at served_batch, with turnover
    turnover_s: float  # the prefill of replacement requests, per served iteration

    @property
    def speedup(self) -> float:
        """Served speedup over no speculation (what a plan's speedup means)."""
        return self.served_tokens_per_s / self.off_served_tokens_per_s

    @property
    def decode_speedup(self) -> float:
        return self.decode_tokens_per_s / self.off_decode_tokens_per_s

    def table_rows(self) -> list[dict[str, Any]]:
        """The numbers the What-if page shows, one row each (quantity, value, unit)."""
        rows = [
            (SERVED_TOK_S, self.served_tokens_per_s, "tok/s"),
            (f"{SERVED_TOK_S} without speculation", self.off_served_tokens_per_s, "tok/s"),
            ("speedup (served)", self.speedup, "x"),
            (DECODE_TOK_S, self.decode_tokens_per_s, "tok/s"),
            (f"{DECODE_TOK_S} without speculation", self.off_decode_tokens_per_s, "tok/s"),
            ("speedup (decode)", self.decode_speedup, "x"),
            ("expected tokens per step", self.expected_tokens, "tok/seq"),
            ("tree tokens verified", self.tree_tokens, "tok/seq"),
            ("batch the KV cache holds", float(self.served_batch), "seq"),
            ("served step time", self.served_step_s * 1e3, "ms"),
            ("prefill turnover per served step", self.turnover_s * 1e3, "ms"),
            ("decode step time", self.step_s * 1e3, "ms"),
            ("decode step time without speculation", self.off_step_s * 1e3, "ms"),
        ]
        rows += [(f"{k} time", v * 1e3, "ms") for k, v in self.phases_s.items()]
        return [{"quantity": q, "value": float(v), "unit": u} for q, v, u in rows]


def _f(x: Any) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def what_if(
    scenario: Scenario, policy: TreePolicy | None, batch: int, context: int, trace: str = ""
) -> WhatIf:
    """Both kinds of tokens/s, the time of each phase of one iteration, the verify pass per
    operator class and tokens per step at one (policy, batch, context). Served tok/s is the
    planner's objective called as the Planner's curves call it (one `many` per policy); the
    phases are the cost model's StepBreakdown of the decode iteration the objective prices
    (ClosedFormObjective.iteration), as StepBreakdown.phases lists them."""
    served = objective_for(scenario, trace)
    obj = decode_objective(served)
    cm = obj.cost_model
    if policy is None:
        tokens, expected = 1.0, 1.0
    else:
        tokens = obj.tree_tokens(policy, batch)  # a shared budget depends on the batch
        expected = obj.expected_tokens(policy, batch)
    phases = {k: _f(v) for k, v in obj.iteration(policy, batch, context).phases().items()}
    verify_parts = {k: _f(v) for k, v in cm.verify_breakdown(batch, tokens, context).items()}
    draft_steps = (
        {}
        if policy is None
        else _draft_steps(cm, policy, batch, context, obj.draft_widths(policy, batch))
    )
    fitted = served.fitting_batch(batch, context)  # float64[1]
    served_tokens = served.per_step(policy, fitted)[1]
    return WhatIf(
        policy=policy,
        batch=batch,
        context=context,
        tree_tokens=float(tokens),
        expected_tokens=float(expected),
        phases_s=phases,
        verify_breakdown_s=verify_parts,
        draft_steps_s=draft_steps,
        step_s=obj.step_time(policy, batch, context),
        off_step_s=obj.step_time(None, batch, context),
        decode_tokens_per_s=_f(obj.many(policy, [batch], context)),
        off_decode_tokens_per_s=_f(obj.many(None, [batch], context)),
        served_tokens_per_s=_f(served.many(policy, [batch], context)),
        off_served_tokens_per_s=_f(served.many(None, [batch], context)),
        served_batch=int(fitted[0]),
        served_step_s=served.step_time(policy, batch, context),
        turnover_s=_f(served.turnover_times(policy, fitted, context, served_tokens)),
    )


@dataclass(frozen=True)
class BucketScore:
    """A plan's bucket scored as `spectune plan` scores it: served tok/s of its policy at each
    of the bucket's points (planner.buckets.BucketSpec.points) and their geometric mean."""

    batch: tuple[int, int]
    context: tuple[int, int]
    policy: TreePolicy | None
    points: tuple[tuple[int, int], ...]  # (batch, context) pairs
    served_tokens_per_s: tuple[float, ...]  # at each point
    decode_tokens_per_s: tuple[float, ...]  # at each point, for reference
    score: float  # geometric mean of served_tokens_per_s
    off_score: float  # the same with speculation off

    @property
    def speedup(self) -> float:
        return self.score / self.off_score


def bucket_score(
    scenario: Scenario,
    policy: TreePolicy | None,
    batch: tuple[int, int],
    context: tuple[int, int],
    trace: str = "",
) -> BucketScore:
    """The bucket's score: the objective at its points in one `many` call per policy (as the
    search's Scorer calls it), geometric mean (planner.search.geomean). For a plan made for
    this scenario it is the policy file's predicted tokens_per_s (rounded there)."""
    served = objective_for(scenario, trace)
    spec = BucketSpec((int(batch[0]), int(batch[1])), (int(context[0]), int(context[1])))
    pts = spec.points()
    ctx = pts[0][1]
    bs = [b for b, _ in pts]
    on = [float(v) for v in served.many(policy, bs, ctx)]
    off = [float(v) for v in served.many(None, bs, ctx)]
    dec = [float(v) for v in decode_objective(served).many(policy, bs, ctx)]
    return BucketScore(
        batch=spec.batch,
        context=spec.context,
        policy=policy,
        points=pts,
        served_tokens_per_s=tuple(on),
        decode_tokens_per_s=tuple(dec),
        score=geomean(on),
        off_score=geomean(off),
    )


def _draft_steps(
    cm: CostModel,
    policy: TreePolicy,
    batch: int,
    context: int,
    widths: tuple[int, ...] | None = None,
) -> dict[str, float]:
    """The drafting phase by part, as the cost model prices it (CostModel.draft_parts; a
    static shape's later steps over its drafted nodes per level, `widths`), with the labels
    the page shows."""
    parts = {
        k: _f(v)
        for k, v in cm.draft_parts(
            batch, policy.depth, policy.topk, context, builder=policy.builder, widths=widths
        ).items()
    }
    if "retrieval" in parts:
        return {"retrieval lookup": parts["retrieval"]}
    steps = {"first step (1 token/seq)": parts["first"]}
    if widths:
        each = "/".join(str(w) for w in widths)
        steps[f"{len(widths)} later steps ({each} tokens/seq)"] = parts["later"]
    elif widths is None and policy.depth > 1:
        steps[f"{policy.depth - 1} later steps ({policy.topk} tokens/seq each)"] = parts["later"]
    n_steps = policy.depth if widths is None else 1 + len(widths)
    if parts["bookkeeping"] > 0:
        steps[f"top-k / sort / pool x {n_steps} steps"] = parts["bookkeeping"]
    return steps


@dataclass(frozen=True)
class SampleTree:
    """One drawn draft tree and each node's probability of lying on the accepted path."""

    tree: DraftTree
    accept_prob: np.ndarray  # float64[N]
    expected_tokens: float


def sample_tree(
    scenario: Scenario, policy: TreePolicy, seed: int = 0, trace: str = ""
) -> SampleTree:
    """The tree the planner's builder draws for this policy with this seed."""
    model = acceptance_for(scenario, trace)
    tree = build_tree(policy, model, np.random.default_rng(seed))
    return SampleTree(tree, np.asarray(model.node_accept_prob(tree)), model.expected_tokens(tree))


# ---- tokens/s against batch size ----------------------------------------------------------------


def batch_curves(
    scenario: Scenario,
    policies: Mapping[str, TreePolicy | None],
    batches: Sequence[int],
    context: int,
    trace: str = "",
) -> dict[str, np.ndarray]:
    """Predicted served tok/s incl. prefill at each batch size (float64[len(batches)]) for fixed
    policies: the planner's objective (as the Planner's table predicts)."""
    obj = objective_for(scenario, trace)
    return {name: np.asarray(obj.many(p, batches, context)) for name, p in policies.items()}


def table_curve(
    scenario: Scenario, table: PolicyTable, batches: Sequence[int], context: int, trace: str = ""
) -> np.ndarray:
    """Predicted served tok/s incl. prefill at each batch size with the table's policy for that
    batch (the policy PolicyTable.lookup gives, as a serving engine would switch)."""
    obj = objective_for(scenario, trace)
    out = np.empty(len(batches))
    groups: dict[TreePolicy | None, list[int]] = {}
    for i, b in enumerate(batches):
        groups.setdefault(table.lookup(int(b), context), []).append(i)
    for policy, idx in groups.items():
        out[idx] = obj.many(policy, [batches[i] for i in idx], context)
    return out
