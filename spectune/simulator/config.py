"""SimConfig: everything one simulated load level needs, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spectune.simulator.arrivals import ArrivalProcess
from spectune.simulator.lengths import LengthDist
from spectune.simulator.speculation import PolicySource, StepSampler
from spectune.simulator.steptime import CostModelLike
from spectune.specs import HardwareSpec, ModelSpec
from spectune.specs.io import help_field
from spectune.specs.workload import Workload

MAX_REQUESTS = 50_000
"""Requests one load level may simulate. The iteration log grows with the run (about 6 KB per
request at the default lengths): at the limit, `spectune simulate --requests 50000 --qps 16`
peaks at about 410 MB RSS in 36 s on one core. Simulate more by repeating with other seeds."""


@dataclass(frozen=True)
class SimConfig:
    """One simulated load level. Unset collaborators (cost model, acceptance model, tree
    builders, lengths) are derived from the specs and the workload."""

    hardware: HardwareSpec = field(metadata={"help": "GPU of every replica"})
    target: ModelSpec = field(metadata={"help": "target model"})
    drafter: ModelSpec | None = field(metadata={"help": "EAGLE-3 head or draft model; None: none"})
    arrivals: ArrivalProcess = field(metadata={"help": "Poisson, Gamma, ClosedLoop or a Trace"})
    policy: PolicySource = field(
        default=None, metadata={"help": "PolicyTable, one TreePolicy, or None (off)"}
    )
    workload: Workload | None = field(
        default=None, metadata={"help": "acceptance model and prompt/output lengths"}
    )
    requests: int = help_field(
        1000, help=f"requests to simulate, at most {MAX_REQUESTS} (a trace: at most its length)"
    )
    prompt: LengthDist | None = field(
        default=None, metadata={"help": "prompt lengths (None: the workload's)"}
    )
    output: LengthDist | None = field(
        default=None, metadata={"help": "output lengths (None: the workload's)"}
    )
    tp: int = help_field(1, help="tensor-parallel GPUs per replica")
    replicas: int = help_field(1, help="replicas behind the router")
    router: str = help_field("rr", help="'rr' (round-robin) or 'least' (least outstanding)")
    max_batch: int | None = help_field(None, help="max running sequences (None: from KV, <=256)")
    clamp_max_batch: bool = help_field(
        False, help="lower max_batch to what the KV cache holds instead of raising SpecError"
    )
    max_batch_tokens: int = help_field(8192, help="token budget per iteration (chunked prefill)")
    block_size: int = help_field(16, help="KV-cache page size, tokens")
    memory_fraction: float = help_field(0.9, help="share of HBM the engine may use")
    slo_ttft_s: float | None = help_field(None, help="goodput SLO on time to first token, s")
    slo_tpot_s: float | None = help_field(None, help="goodput SLO on time per output token, s")
    seed: int = help_field(0, help="seed of every random stream")
    baseline: bool = help_field(True, help="also run speculation off on the same arrivals")
    tree_pool: int = help_field(8192, help="step outcomes drawn per policy (see speculation.py)")
    shared_budget: bool = help_field(
        False,
        help="force the ECHO super-tree (one verify budget per iteration shared by the batch) "
        "for every policy; False: each policy's own TreePolicy.shared_budget decides",
    )
    fast_forward: bool = help_field(
        True, help="run uninterruptible decode iterations in one vectorised pass (replica.py)"
    )
    exact_mixed: bool = help_field(
        False, help="price prefill iterations with ragged_forward_time (slow; see steptime.py)"
    )
    context_quantum: int = help_field(16, help="contexts are priced in steps of this many tokens")
    keep_iterations: bool = help_field(False, help="keep the iteration log (Chrome trace)")
    cost_model: CostModelLike | None = field(
        default=None, metadata={"help": "a prebuilt CostModel"}
    )
    acceptance: Any = field(
        default=None, metadata={"help": "a prebuilt acceptance model (default: the workload's)"}
    )
    sampler: StepSampler | None = field(
        default=None,
        metadata={"help": "step sampler (default: planner.trees.sample_step on the acceptance)"},
    )
    hierarchy: Any = field(
        default=None,
        metadata={
            "help": "acceptance models of hierarchical policies (planner.hierarchical."
            "HierAcceptance); the cost model then needs an intermediate model"
        },
    )
    pool_cache: dict[Any, Any] | None = field(
        default=None,
        metadata={"help": "outcome pools shared between runs (pools depend on seed and policy)"},
    )
