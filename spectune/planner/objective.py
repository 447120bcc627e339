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

    def step_time(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        """Seconds of one decoding iteration of the whole batch."""
        cm = self.cost_model
        if policy is None:
            return float(np.asarray(cm.ar_step_time(batch, context)))
        accepted = self.expected_tokens(policy)
        t = float(
            np.asarray(
                cm.spec_step_time(
                    batch, policy.depth, policy.topk, policy.budget, context, accepted
                )
            )
        )
        if policy.graft_budget > 0 and hasattr(cm, "retrieval_time"):
            t += float(np.asarray(cm.retrieval_time(batch)))
        return t

    def __call__(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        return batch * self.expected_tokens(policy) / self.step_time(policy, batch, context)

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
