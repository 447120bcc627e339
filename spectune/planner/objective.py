"""The closed-form steady-state objective: tokens/s of a policy at a batch size and context.

    tokens/s = batch * E[tokens per step] / (iteration + turnover)

E[tokens per step] is the expected accepted length plus the bonus token of the policy's tree
under the workload's acceptance model (planner.trees); 1 with speculation off. `iteration` is
the cost model's price of one whole decoding iteration of the batch,
CostModel.iteration(policy, batch, context, tokens=mean tree size as built (which the budget
only bounds), accepted=E[tokens per step]).total_s: drafting, verify, draft extend, overhead,
the policy's options (grafting's retrieval lookup, pruning's pass) and the engine's host time,
all from one StepBreakdown (`ClosedFormObjective.iteration`); nothing is added to it here.

A shared-budget policy (TreePolicy.shared_budget, ECHO's super-tree) gives the batch one verify
budget of batch * (budget - 1) draft tokens, so its E[tokens per step] and tree size depend on
the batch size: they are priced per (policy, batch) from planner.trees.sample_step with
shared_budget at that batch (whole batches drawn, per-request means taken), and at batch 1 a
shared policy is its per-request equivalent.

A hierarchical policy (TreePolicy.chain > 0) takes E[tokens per step], the target's chain
tokens, the intermediate's rounds, its accepted tokens per round and its tree size from
planner.hierarchical (the objective's `hierarchy` acceptance models), and the iteration prices
all of them (CostModel.iteration); its turnover also prefills the newcomers through the
intermediate model.

turnover is not part of one iteration but a steady-state term of this objective: the prefill a
saturated server does per step to replace finished requests. A step emits batch * E tokens, so
batch * E / output_tokens requests finish, and each newcomer prefills its prompt (`context`
tokens, the simulator objective's convention) through the target and, when speculating,
through the drafter (which keeps its own KV). It rides in the step's forward passes, so it is
priced with the cost model's phase methods as their marginal cost: verify (or draft-extend)
time with the prompt tokens spread over the batch minus the time without them. Without
`output_tokens` it is 0.

`planner.search` takes any `Objective` (a function of policy, batch and context); this module
is the default one. The simulator offers a simulation-based one that the CLI hands in instead.
`scenario_objective(resolved scenario)` is the one builder of the objective that plans are
scored with (turnover and KV cap on, the scenario's calibration); `spectune plan`, `worker`,
`export`, the validation layer and the dashboards all take it from there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from spectune.planner.capacity import KVBudget, auto_max_batch, kv_budget
from spectune.planner.hierarchical import (
    HierAcceptance,
    HierOutcome,
    hierarchical_outcome,
    scenario_hierarchy,
)
from spectune.planner.step import StepBreakdown
from spectune.specs.calibration import Calibration
from spectune.specs.errors import SpecError
from spectune.specs.policy import MAX_BUDGET, TreePolicy
from spectune.specs.scenario import ResolvedScenario, Scenario

if TYPE_CHECKING:
    from spectune.planner.costmodel import CostModel

Objective = Callable[[TreePolicy | None, int, int], float]
"""Score of a policy (None = off) at (batch, context); larger is better (tokens/s)."""

Latency = Callable[[TreePolicy | None, int, int], float]
"""A second objective to minimise in multi-objective mode, in seconds."""

SAMPLES = 1024
"""Trees averaged per policy for E[tokens per step]: the standard error is then ~0.5% (64 trees
gave 1-2%, enough to flip close calls between policies)."""

SHARED_DRAWS = 4
"""Most whole batches drawn to price a shared-budget policy at one batch size (up to SAMPLES / 4
trees, at least 2 draws). Each draw is paired: the same candidate pools (the same generator
state) built by the shared policy and by its per-request twin (`shared_twin`), and the mean
difference is added to the twin's value (SAMPLES trees). Any twin keeps the estimate unbiased;
the one drawing the same pools cancels most of the per-batch noise (the difference's spread is
10-80x smaller than the value's on MT-Bench at batch 2 to 32), so 4 pairs of sample_step calls
(~0.5 ms each whatever the batch) price a small batch to ~1%. 8 pairs gave the same default
plan for 15% more planning time."""


def shared_twin(policy: TreePolicy) -> TreePolicy:
    """The per-request policy whose candidate pools a shared-budget policy draws at batch > 1
    (planner.trees.build._pool): the same policy for dynamic-topk; for static, the Sequoia
    shape for min(2 x budget, MAX_BUDGET) tokens, from which the shared allocation picks."""
    if policy.builder == "static":
        return replace(policy, shared_budget=False, budget=min(2 * policy.budget, MAX_BUDGET))
    return replace(policy, shared_budget=False)


def _cv(sizes: np.ndarray) -> float:
    """std / mean of per-request tree sizes (0 for an empty or all-zero sample)."""
    mean = float(np.mean(sizes)) if np.size(sizes) else 0.0
    return float(np.std(sizes)) / mean if mean > 0 else 0.0


def _scalar(x: Any) -> float:
    """The one value of a cost-model answer (they broadcast, so scalars come back as arrays)."""
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


class _Acceptance(Protocol):
    def expected_tokens(self, tree: Any) -> float: ...


class ClosedFormObjective:
    """Steady-state tokens/s from a cost model and an acceptance model (no simulation).

    cost_model: a planner.costmodel.CostModel (iteration; verify_time and draft_extend_time
        for turnover)
    acceptance: a planner.acceptance.AcceptanceModel
    expected_tokens: E[tokens per step] of a policy; defaults to
        planner.trees.expected_tokens_for_policy(policy, acceptance, samples, seed)
    output_tokens: mean output length of a request (prefill turnover, see the module
        docstring); None leaves turnover out (pure decode steps)
    kv: the replica's KV-cache budget while speculating (drafter loaded); with
        `mean_output_tokens`, a batch larger than the cache holds at a context (prompt =
        context, plus the mean output) runs as the largest batch that fits, as a server (and
        the simulator's objective) would. None: no cap.
    kv_off: the budget of the same server without speculation (no drafter: more KV), which
        "off" runs with (planner.capacity); None: `kv`.
    hierarchy: the acceptance models of hierarchical policies (planner.hierarchical: the
        drafter's trees against the intermediate, the intermediate's chain against the
        target); None: a hierarchical policy is a SpecError
    kv_hier: the budget while a hierarchical policy runs (the intermediate and its drafter
        loaded as well); None: `kv`
    """

    def __init__(
        self,
        cost_model: Any,
        acceptance: Any,
        *,
        samples: int = SAMPLES,
        seed: int = 0,
        expected_tokens: Callable[[TreePolicy], float] | None = None,
        output_tokens: float | None = None,
        kv: KVBudget | None = None,
        mean_output_tokens: float | None = None,
        kv_off: KVBudget | None = None,
        hierarchy: HierAcceptance | None = None,
        kv_hier: KVBudget | None = None,
    ) -> None:
        self.cost_model = cost_model
        self.kv_hier = kv_hier if kv_hier is not None else kv
        self.hierarchy = hierarchy
        self.acceptance = acceptance
        self.samples = samples
        self.seed = seed
        self._expected_fn = expected_tokens
        self.output_tokens = output_tokens
        self.kv = kv
        self.kv_off = kv_off if kv_off is not None else kv
        self.mean_output_tokens = mean_output_tokens
        self._expected: dict[TreePolicy, float] = {}
        self._tokens: dict[TreePolicy, float] = {}
        self._spread: dict[TreePolicy, float] = {}  # per-request std / mean of those tokens
        self._shared: dict[tuple[TreePolicy, int], tuple[float, float, float]] = {}

    def _shares(self, policy: TreePolicy | None, batch: int | None) -> bool:
        """Whether the policy prices differently at this batch: a shared budget at batch > 1
        (a custom expected_tokens function knows no batch, so it prices per request)."""
        return (
            policy is not None
            and policy.shared_budget
            and batch is not None
            and batch > 1
            and self._expected_fn is None
        )

    def expected_tokens(self, policy: TreePolicy | None, batch: int | None = None) -> float:
        """Tokens emitted per verify step per request (accepted drafts + the bonus token); 1
        when off. `batch`: the batch size, which a shared-budget policy depends on (None or 1:
        its per-request equivalent)."""
        if policy is None:
            return 1.0
        if policy.chain:
            return self.hier_outcome(policy).expected_tokens
        if self._shares(policy, batch):
            assert batch is not None
            return self._shared_step(policy, int(batch))[0]
        if policy.shared_budget and self._expected_fn is None:
            policy = replace(policy, shared_budget=False)
        if policy not in self._expected:
            if self._expected_fn is not None:
                value = self._expected_fn(policy)
            else:
                from spectune.planner.trees import expected_tokens_for_policy

                value = expected_tokens_for_policy(
                    policy, self.acceptance, samples=self.samples, seed=self.seed
                )
            self._expected[policy] = float(value)
        return self._expected[policy]

    def tree_tokens(self, policy: TreePolicy, batch: int | None = None) -> float:
        """Mean tokens verified per sequence (root included) over trees built with the
        workload's acceptance (vectorised, as the simulator draws them): the budget, or fewer
        when pruning drops nodes or the acceptance model offers fewer candidates (a chain-only
        profile fills no branches). `batch` as for expected_tokens."""
        if policy.chain:
            return self.hier_outcome(policy).target_tokens
        if self._expected_fn is not None:
            return float(policy.budget)
        if self._shares(policy, batch):
            assert batch is not None
            return self._shared_step(policy, int(batch))[1]
        if policy.shared_budget:
            policy = replace(policy, shared_budget=False)
        if policy not in self._tokens:
            from spectune.planner.trees import sample_step

            rng = np.random.default_rng(self.seed)
            n = max(64, self.samples // 4)
            _, nodes, _ = sample_step(policy, self.acceptance, rng, n)
            self._tokens[policy] = float(np.mean(nodes))
            self._spread[policy] = float(np.std(nodes) / max(np.mean(nodes), 1.0))
        return self._tokens[policy]

    def tree_spread(self, policy: TreePolicy, batch: int | None = None) -> float:
        """Spread (std / mean) of the tokens verified per request over one batch's requests
        (batch > 1), from the same draws as tree_tokens: a shared budget's within each drawn
        batch, a pruned tree's over independent draws; 0 for other policies, whose verify the
        cost model prices at the mean. The cost model prices the ragged verify of ECHO's and
        of pruned trees from it (CostModel.iteration's tokens_cv)."""
        if policy.chain or batch is None or batch <= 1:
            return 0.0
        if policy.prune_threshold > 0 and not self._shares(policy, batch):
            self.tree_tokens(policy, batch)
            return self._spread.get(replace(policy, shared_budget=False), 0.0)
        if not self._shares(policy, batch):
            return 0.0
        assert batch is not None
        return self._shared_step(policy, int(batch))[2]

    def hier_outcome(self, policy: TreePolicy) -> HierOutcome:
        """Means of a hierarchical policy's step (planner.hierarchical), from the objective's
        `hierarchy` acceptance models."""
        if self.hierarchy is None:
            raise SpecError(
                f"policy {policy.label} is hierarchical (chain {policy.chain}); the objective "
                "needs the acceptance of the drafter against the intermediate and of the "
                "intermediate against the target (hierarchy=HierAcceptance(...))"
            )
        return hierarchical_outcome(
            policy, self.hierarchy, samples=max(256, self.samples), seed=self.seed
        )

    def _shared_step(self, policy: TreePolicy, batch: int) -> tuple[float, float, float]:
        """(E[tokens per step], tree tokens, their spread over the batch's requests) per request
        of a shared-budget policy at `batch` (> 1): whole batches drawn by sample_step(...,
        shared_budget=True), paired with the same pools drawn by its per-request twin
        (SHARED_DRAWS), the spread the mean over draws of each batch's std / mean; cached per
        (policy, batch)."""
        key = (policy, batch)
        hit = self._shared.get(key)
        if hit is None:
            from spectune.planner.trees import sample_step

            model = self.acceptance
            twin = shared_twin(policy)
            draws = min(SHARED_DRAWS, max(2, -(-(self.samples // 4) // batch)))
            d_expected = d_nodes = spread = 0.0
            for i in range(draws):
                seed = [self.seed, batch, i]
                _, n1, e1 = sample_step(policy, model, np.random.default_rng(seed), batch, True)
                _, n0, e0 = sample_step(twin, model, np.random.default_rng(seed), batch)
                d_expected += float(e1.sum() - e0.sum())
                d_nodes += float(n1.sum() - n0.sum())
                spread += _cv(n1) / draws
            hit = (
                self.expected_tokens(twin) + d_expected / (draws * batch),
                self.tree_tokens(twin) + d_nodes / (draws * batch),
                spread,
            )
            self._shared[key] = hit
        return hit

    def per_step(
        self, policy: TreePolicy | None, batch: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(E[tokens per step] float64[P], verify tokens per sequence float64[P]) at batch sizes
        float64[P]: one value broadcast for a per-request policy, one per batch size for a
        shared budget. Off: (1, 1)."""
        if policy is None:
            return np.ones(batch.shape), np.ones(batch.shape)
        if not policy.shared_budget or self._expected_fn is not None:
            shape = batch.shape
            return np.full(shape, self.expected_tokens(policy)), np.full(
                shape, self.tree_tokens(policy)
            )
        sizes = np.rint(batch).astype(np.int64).ravel()
        e = np.array([self.expected_tokens(policy, int(x)) for x in sizes])
        n = np.array([self.tree_tokens(policy, int(x)) for x in sizes])
        return e.reshape(batch.shape), n.reshape(batch.shape)

    def turnover_times(
        self, policy: TreePolicy | None, batch: np.ndarray, context: int, tokens: Any
    ) -> np.ndarray:
        """float64[P]: seconds per step of prefilling the requests that replace finished ones
        (module docstring); `tokens` is the verify tokens per sequence of the step (a scalar or
        float64[P])."""
        if not self.output_tokens or context <= 0:
            return np.zeros(batch.shape)
        cm = self.cost_model
        e, _ = self.per_step(policy, batch)
        spread = context / batch  # the newcomers' prompt tokens, spread over the batch
        t = np.asarray(cm.verify_time(batch, tokens + spread, context), np.float64) - np.asarray(
            cm.verify_time(batch, tokens, context), np.float64
        )
        if policy is not None and policy.chain:  # intermediate + its drafter prefill too
            t = t + np.asarray(cm.intermediate_verify_time(batch, 1 + spread, context))
            t = t - np.asarray(cm.intermediate_verify_time(batch, 1, context))
            t = t + np.asarray(cm.intermediate_extend_time(batch, 1 + spread, context))
            t = t - np.asarray(cm.intermediate_extend_time(batch, 1, context))
        elif policy is not None and getattr(cm, "drafter", None) is not None:
            t = t + np.asarray(cm.draft_extend_time(batch, e + spread, context), np.float64)
            t = t - np.asarray(cm.draft_extend_time(batch, e, context), np.float64)
        return batch * e / self.output_tokens * np.maximum(t, 0.0)

    def fitting_batch(
        self, batch: Any, context: int, speculating: bool = True, hierarchical: bool = False
    ) -> np.ndarray:
        """float64[P]: each batch size, or the largest batch whose requests' KV fits the cache
        at this context when that is smaller; `speculating` False: the cache of the server
        without a drafter (`kv_off`); `hierarchical`: with the intermediate loaded (`kv_hier`)."""
        b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
        kv = (self.kv_hier if hierarchical else self.kv) if speculating else self.kv_off
        if kv is None or self.mean_output_tokens is None:
            return b
        fits = auto_max_batch(kv, max(1, context), self.mean_output_tokens, cap=1 << 30)
        return np.minimum(b, float(fits))

    def iteration(self, policy: TreePolicy | None, batch: Any, context: int) -> StepBreakdown:
        """The cost model's breakdown of one decoding iteration of the whole batch at each batch
        size (int[P] or a scalar, capped by KV capacity -> fields float64[P]): the policy's tree
        as built (tree_tokens) verified, E[tokens per step] extended by the drafter."""
        b = self.fitting_batch(batch, context, policy is not None, _hier(policy))
        return self._iteration(policy, b, context)[0]

    def _iteration(
        self, policy: TreePolicy | None, b: np.ndarray, context: int
    ) -> tuple[StepBreakdown, Any]:
        """(breakdown at fitted batch sizes float64[P], verify tokens per sequence)."""
        if policy is None:
            return self.cost_model.iteration(None, b, context), 1.0
        accepted, tokens = self.per_step(policy, b)  # per batch size (a shared budget varies)
        if policy.chain:
            h = self.hier_outcome(policy)
            step = self.cost_model.iteration(
                policy,
                b,
                context,
                tokens=h.target_tokens,
                accepted=h.round_accepted,
                rounds=h.rounds,
                tree_tokens=h.tree_tokens,
            )
            return step, tokens
        sizes = np.rint(np.atleast_1d(b)).astype(np.int64).ravel()
        cv = np.array([self.tree_spread(policy, int(x)) for x in sizes]).reshape(np.shape(b))

        def price(batch: int) -> StepBreakdown:
            widths = self.draft_widths(policy, batch)  # None: the cost model's top-k default
            shape = {} if widths is None else {"draft_widths": widths}
            return self.cost_model.iteration(
                policy, b, context, tokens=tokens, accepted=accepted, tokens_cv=cv, **shape
            )  # fmt: skip

        step = price(1)
        if policy.builder == "static" and policy.shared_budget and (sizes > 1).any():
            # above batch 1 a shared budget drafts a larger static shape (trees.static_size)
            wide = price(2)
            step = StepBreakdown(
                **{
                    f.name: np.where(b > 1, getattr(wide, f.name), getattr(step, f.name))
                    for f in dataclasses.fields(step)
                }
            )
        return step, tokens

    def draft_widths(self, policy: TreePolicy, batch: int = 1) -> tuple[int, ...] | None:
        """Tokens per sequence of each drafting step after the first of `policy` at `batch`
        (planner.trees.draft_widths: a static shape's drafted nodes per level under this
        objective's acceptance model; None for the top-k builders). A custom expected_tokens
        function gives no acceptance model to shape the tree with: None."""
        if policy.builder != "static" or self._expected_fn is not None:
            return None
        from spectune.planner.trees import draft_widths

        return draft_widths(policy, self.acceptance, batch)

    def step_times(
        self, policy: TreePolicy | None, batch: Any, context: int, resident: bool = False
    ) -> np.ndarray:
        """Seconds per decoding iteration of the whole batch in steady state (the iteration's
        total plus turnover); batch: int[P] (or a scalar) -> float64[P], one cost-model call for
        all of them (batches capped by KV capacity; `resident`: the drafter stays loaded while
        `policy` is off, as in a batch range a speculating server's schedule turns off)."""
        b = self.fitting_batch(batch, context, policy is not None or resident, _hier(policy))
        step, tokens = self._iteration(policy, b, context)
        t = np.broadcast_to(step.total_s, b.shape)
        return t + self.turnover_times(policy, b, context, tokens)

    def step_time(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        """Seconds per decoding iteration of the whole batch (step_times at one batch size)."""
        return float(self.step_times(policy, batch, context)[0])

    def __call__(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        return float(self.many(policy, batch, context)[0])

    def many(
        self, policy: TreePolicy | None, batches: Any, context: int, resident: bool = False
    ) -> np.ndarray:
        """tokens/s at several batch sizes (float64[P]) in one cost-model call (`resident`: as
        for step_times)."""
        b = self.fitting_batch(batches, context, policy is not None or resident, _hier(policy))
        return b * self.per_step(policy, b)[0] / self.step_times(policy, b, context, resident)

    def step_latency(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        """The multi-objective latency: seconds per iteration (the longest gap a streaming
        client sees between token bursts)."""
        return self.step_time(policy, batch, context)


def _hier(policy: TreePolicy | None) -> bool:
    return policy is not None and policy.chain > 0


def scenario_cost_model(resolved: ResolvedScenario) -> CostModel:
    """The cost model of a scenario: its GPU, target, drafter and TP, priced with its
    calibration (defaults without one; one fitted on another GPU is a SpecError), its engine's
    per-iteration host overheads (zero for spectune's own executor) and, for an engine that pads
    a batch to its next CUDA-graph size (EngineProfile.schedule_pads_to_cuda_graph: SGLang), its
    own capture list (eager above the largest). A scenario naming an intermediate model also
    prices hierarchical policies (its intermediate and the intermediate's drafter)."""
    from spectune.planner.costmodel import CostModel

    calibration = resolved.calibration
    engine = resolved.engine
    if engine.cuda_graph_batches and engine.schedule_pads_to_cuda_graph:
        # an engine that pads a batch to its next captured size (SGLang): its own capture list
        base = calibration if calibration is not None else Calibration()
        calibration = replace(base, graph_batch_sizes=engine.cuda_graph_batches)
    return CostModel(
        resolved.hardware,
        resolved.target,
        resolved.drafter,
        tp=resolved.tp,
        calibration=calibration,
        engine=resolved.engine.overheads,
        intermediate=resolved.intermediate,
        intermediate_drafter=resolved.intermediate_drafter,
    )


def scenario_objective(
    resolved: ResolvedScenario,
    *,
    decode_only: bool = False,
    acceptance: Any = None,
    samples: int = SAMPLES,
    seed: int = 0,
) -> ClosedFormObjective:
    """The planner's closed-form objective for a scenario: what `spectune plan` scores with.

    Saturated servers replace finished requests (prefill turnover, as the simulator does) and
    run no larger batch than the KV cache holds at the context: a speculating server's cache
    loses the drafter's weights and KV and the engine's speculative buffers, a plain one ("off")
    keeps them (planner.capacity; a model that does not fit the GPUs at all is a SpecError); the cost model carries the scenario's calibration.
    `decode_only`: pure decode steps, no turnover and no KV cap (what-if phases, executor
    measurements, which time decode steps at a fixed batch). `acceptance`: another acceptance
    model (an uploaded trace's TraceReplay) in place of the workload's."""
    return _objective(
        scenario_cost_model(resolved),
        resolved,
        acceptance,
        turnover=not decode_only,
        kv_capacity=not decode_only,
        samples=samples,
        seed=seed,
    )


def _objective(
    cm: CostModel,
    resolved: ResolvedScenario,
    acceptance: Any,
    *,
    turnover: bool,
    kv_capacity: bool,
    samples: int,
    seed: int,
) -> ClosedFormObjective:
    """The one place a ClosedFormObjective is assembled from a scenario's specs."""
    from spectune.planner.acceptance import acceptance_model

    wl = resolved.workload
    out = float(wl.output_len_mean_tokens) if turnover else None
    kv = kv_off = kv_hier = None
    if kv_capacity:  # speculating (drafter and the engine's buffers) and plain (planner.capacity)
        hw, target, drafter, tp = resolved.hardware, resolved.target, resolved.drafter, resolved.tp
        extra = resolved.engine.spec_extra_hbm_bytes * tp
        kv = kv_budget(hw, target, drafter, tp=tp, spec_extra_bytes=extra)
        kv_off = kv_budget(hw, target, drafter, tp=tp, speculating=False)
        if resolved.intermediate is not None:  # hierarchical: the intermediate stage loaded too
            stage = tuple(m for m in (resolved.intermediate, resolved.intermediate_drafter) if m)
            kv_hier = kv_budget(hw, target, drafter, tp=tp, spec_extra_bytes=extra, also=stage)
    return ClosedFormObjective(
        cm,
        acceptance if acceptance is not None else acceptance_model(wl),
        samples=samples,
        seed=seed,
        output_tokens=out,
        kv=kv,
        mean_output_tokens=float(wl.output_len_mean_tokens),
        kv_off=kv_off,
        hierarchy=scenario_hierarchy(resolved),
        kv_hier=kv_hier,
    )


def closed_form_objective(
    target: str,
    drafter: str,
    gpu: str,
    workload: str,
    *,
    tp: int = 1,
    samples: int = SAMPLES,
    seed: int = 0,
    turnover: bool = False,
    calibration: Calibration | str | os.PathLike[str] | None = None,
    kv_capacity: bool = False,
) -> ClosedFormObjective:
    """The closed form from preset names or spec file paths, each term chosen: `turnover`
    charges the prefill of requests replacing finished ones (the workload's mean output
    length); off, steps are pure decode. `calibration`: a fitted Calibration or its file
    (`spectune calibrate`) for the cost model; one fitted on another GPU than `gpu` is a
    SpecError. `kv_capacity`: run no larger batch than the KV cache holds at the context (and
    a model that does not fit the GPUs at all is a SpecError). What `spectune plan` scores
    with is `scenario_objective` (both on, the scenario's calibration)."""
    cal_file = None if isinstance(calibration, Calibration | None) else os.fspath(calibration)
    scenario = Scenario(target, drafter, gpu, tp, workload, calibration=cal_file)
    resolved = scenario.resolve()
    if isinstance(calibration, Calibration):
        resolved = replace(resolved, calibration=calibration)
    return _objective(
        scenario_cost_model(resolved),
        resolved,
        None,
        turnover=turnover,
        kv_capacity=kv_capacity,
        samples=samples,
        seed=seed,
    )
