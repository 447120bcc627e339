"""The closed-form steady-state objective: tokens/s of a policy at a batch size and context.

    tokens/s = batch * E[tokens per step] / spec_step_time        (speculation on)
    tokens/s = batch / ar_step_time                               (off)

E[tokens per step] is the expected accepted length plus the bonus token of the policy's tree
under the workload's acceptance model (planner.trees); the step time is the cost model's full
speculative iteration: drafting, verifying the tree, draft extend and per-step overhead.

`planner.search` takes any `Objective` (a function of policy, batch and context); this module
is the default one. The simulator offers a simulation-based one that the CLI hands in instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from spectune.specs.policy import TreePolicy

Objective = Callable[[TreePolicy | None, int, int], float]
"""Score of a policy (None = off) at (batch, context); larger is better (tokens/s)."""

Latency = Callable[[TreePolicy | None, int, int], float]
"""A second objective to minimise in multi-objective mode, in seconds."""


def _scalar(x: Any) -> float:
    """The one value of a cost-model answer (they broadcast, so scalars come back as arrays)."""
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


class _Acceptance(Protocol):
    def expected_tokens(self, tree: Any) -> float: ...


class ClosedFormObjective:
    """Steady-state tokens/s from a cost model and an acceptance model (no simulation).

    cost_model: a planner.costmodel.CostModel (spec_step_time, ar_step_time, retrieval_time)
    acceptance: a planner.acceptance.AcceptanceModel
    expected_tokens: E[tokens per step] of a policy; defaults to
        planner.trees.expected_tokens_for_policy(policy, acceptance, samples, seed)
    """

    def __init__(
        self,
        cost_model: Any,
        acceptance: Any,
        *,
        samples: int = 64,
        seed: int = 0,
        expected_tokens: Callable[[TreePolicy], float] | None = None,
    ) -> None:
        self.cost_model = cost_model
        self.acceptance = acceptance
        self.samples = samples
        self.seed = seed
        self._expected_fn = expected_tokens
        self._expected: dict[TreePolicy, float] = {}
        self._tokens: dict[TreePolicy, float] = {}

    def expected_tokens(self, policy: TreePolicy | None) -> float:
        """Tokens emitted per verify step (accepted drafts + the bonus token); 1 when off."""
        if policy is None:
            return 1.0
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

    def tree_tokens(self, policy: TreePolicy) -> float:
        """Mean tokens verified per sequence (root included): the budget, or fewer when the
        prune threshold drops nodes (mean over trees built with the workload's acceptance)."""
        if policy.prune_threshold <= 0.0 or self._expected_fn is not None:
            return float(policy.budget)
        if policy not in self._tokens:
            from spectune.planner.trees import build_tree

            rng = np.random.default_rng(self.seed)
            n = max(1, self.samples // 8)
            sizes = [build_tree(policy, self.acceptance, rng).num_nodes for _ in range(n)]
            self._tokens[policy] = float(np.mean(sizes))
        return self._tokens[policy]

    def step_times(self, policy: TreePolicy | None, batch: Any, context: int) -> np.ndarray:
        """Seconds of one decoding iteration of the whole batch; batch: int[P] (or a scalar)
        -> float64[P], one cost-model call for all of them."""
        cm = self.cost_model
        b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
        if policy is None:
            return np.broadcast_to(np.asarray(cm.ar_step_time(b, context), np.float64), b.shape)
        accepted = self.expected_tokens(policy)
        tokens = self.tree_tokens(policy)
        t = cm.spec_step_time(b, policy.depth, policy.topk, tokens, context, accepted)
        t = np.broadcast_to(np.asarray(t, dtype=np.float64), b.shape)
        if policy.graft_budget > 0 and hasattr(cm, "retrieval_time"):
            t = t + np.asarray(cm.retrieval_time(b), dtype=np.float64)
        return t

    def step_time(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        """Seconds of one decoding iteration of the whole batch."""
        return float(self.step_times(policy, batch, context)[0])

    def __call__(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        return batch * self.expected_tokens(policy) / self.step_time(policy, batch, context)

    def many(self, policy: TreePolicy | None, batches: Any, context: int) -> np.ndarray:
        """tokens/s at several batch sizes (float64[P]) in one cost-model call."""
        b = np.atleast_1d(np.asarray(batches, dtype=np.float64))
        return b * self.expected_tokens(policy) / self.step_times(policy, b, context)

    def step_latency(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        """The multi-objective latency: seconds per iteration (the longest gap a streaming
        client sees between token bursts)."""
        return self.step_time(policy, batch, context)


def closed_form_objective(
    target: str,
    drafter: str,
    gpu: str,
    workload: str,
    *,
    tp: int = 1,
    samples: int = 64,
    seed: int = 0,
) -> ClosedFormObjective:
    """Build the default objective from preset names or spec file paths."""
    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.costmodel import CostModel
    from spectune.specs import load_hardware, load_model
    from spectune.specs.workload import load_workload

    cm = CostModel(load_hardware(gpu), load_model(target), load_model(drafter), tp=tp)
    model = acceptance_model(load_workload(workload))
    return ClosedFormObjective(cm, model, samples=samples, seed=seed)
