"""Turn search results into the policy file (a PolicyTable): one bucket per searched (batch,
context) range with its chosen policy, the closed form's prediction and the best chain for
chain-only engines (a shared verify budget, ECHO, is recorded in the policy itself), and the
Scenario it was planned for. `spectune plan`, the dashboards and the validation layer's planned
tables all write tables this way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spectune.planner.objective import ClosedFormObjective
from spectune.planner.search import BucketResult
from spectune.specs.policy import Bucket, ChainChoice, PolicyTable, Prediction
from spectune.specs.scenario import Scenario
from spectune.specs.workload import load_workload


def build_table(
    results: Sequence[BucketResult],
    closed: ClosedFormObjective,
    scenario: Scenario,
    provenance: Mapping[str, Any],
) -> PolicyTable:
    """The policy file of a search's results for `scenario`; `closed` gives each bucket's
    accepted length (the objective the search scored with, or the scenario's closed form)."""
    buckets = tuple(
        Bucket(
            batch=r.bucket.batch,
            context=r.bucket.context,
            policy=r.policy,
            predicted=Prediction(
                tokens_per_s=round(r.tokens_per_s, 3),
                speedup=round(r.speedup, 4),
                accepted_len=round(_accepted_len(closed, r), 4),
            ),
            chain=None
            if r.chain is None
            else ChainChoice(
                r.chain.draft_tokens, round(r.chain.tokens_per_s, 3), round(r.chain.speedup, 4)
            ),
        )
        for r in results
    )
    return PolicyTable(
        target=scenario.target,
        drafter=scenario.drafter,
        hardware=scenario.gpu,
        buckets=buckets,
        tp=scenario.tp,
        workload=scenario.workload,
        temperature=_temperature(scenario.workload),
        provenance=dict(provenance),
        scenario=scenario,
    )


def _accepted_len(closed: ClosedFormObjective, r: BucketResult) -> float:
    """Tokens per verify step of the bucket's policy: a per-request policy has one value; a
    shared verify budget's depends on the batch, so it is the mean over the bucket's points
    (at the batch each runs as, see ClosedFormObjective.fitting_batch)."""
    if r.policy is None or not r.policy.shared_budget:
        return closed.expected_tokens(r.policy)
    vals = [
        closed.expected_tokens(r.policy, int(closed.fitting_batch(b, c)[0]))
        for b, c in r.bucket.points()
    ]
    return sum(vals) / len(vals)


def _temperature(workload: str) -> float:
    """The workload's sampling temperature, recorded in the policy file."""

    return float(load_workload(workload).temperature)
