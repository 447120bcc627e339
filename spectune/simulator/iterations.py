"""What every server iteration did, for the time breakdown, occupancy (Little's law), the
speculation statistics and the Chrome trace. One row per iteration, appended as a tuple (cheap
in the hot loop) and turned into arrays once at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

COLUMNS = (
    "replica",  # replica index
    "start_s",  # iteration start
    "dt_s",  # iteration length
    "decoding",  # sequences that decoded (verified a tree or one token)
    "prefilling",  # sequences that fed a prefill chunk
    "in_system",  # requests routed to the replica and not finished, at the start
    "fed_tokens",  # tokens in the target forward
    "emitted_tokens",  # output tokens produced
    "draft_s",
    "forward_s",
    "extend_s",
    "overhead_s",
    "preempted",  # requests preempted (recomputation) at this iteration
    "policy",  # index into IterationLog.policies, -1: speculation off
)


@dataclass
class IterationLog:
    rows: list[tuple[float, ...]] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    # speculation totals over decoding sequences that verified a tree
    spec_verifies: int = 0  # sequence-steps that verified a draft tree
    spec_tree_tokens: int = 0  # tree tokens verified (roots included)
    spec_accepted: int = 0  # draft tokens accepted

    def policy_index(self, text: str) -> int:
        try:
            return self.policies.index(text)
        except ValueError:
            self.policies.append(text)
            return len(self.policies) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        a = (
            np.array(self.rows, dtype=np.float64)
            if self.rows
            else np.zeros((0, len(COLUMNS)), dtype=np.float64)
        )
        return {name: a[:, i] for i, name in enumerate(COLUMNS)}
