"""SimPy discrete-event model of continuously batching servers with speculative decoding.

Arrivals (Poisson, bursty Gamma, closed loop, trace replay) feed one or more replicas behind a
router; each replica admits requests under its KV capacity, batches them continuously with
chunked prefill and preemption, and per iteration looks up the policy for its live batch,
draws each sequence's tree and accepted length from the planner's builders and acceptance
model, and charges the CostModel's time. The same run with speculation off, on the same
arrivals and lengths, gives the speedup.
"""

from spectune.planner.capacity import KVBudget, kv_budget
from spectune.simulator.arrivals import ClosedLoop, Gamma, Poisson, Trace, load_trace
from spectune.simulator.engine import RunResult, SimConfig, SimResult, simulate
from spectune.simulator.lengths import LENGTH_PRESETS, LengthDist, length_preset, parse_length
from spectune.simulator.metrics import Latency, Metrics
from spectune.simulator.objective import SimObjective, goodput_objective
from spectune.simulator.router import ROUTERS
from spectune.simulator.speculation import OutcomePool, StepSampler, tree_sampler
from spectune.simulator.trace_export import chrome_trace, write_chrome_trace

__all__ = [
    "LENGTH_PRESETS",
    "ROUTERS",
    "ClosedLoop",
    "Gamma",
    "KVBudget",
    "Latency",
    "LengthDist",
    "Metrics",
    "OutcomePool",
    "Poisson",
    "RunResult",
    "SimConfig",
    "SimObjective",
    "SimResult",
    "StepSampler",
    "Trace",
    "chrome_trace",
    "goodput_objective",
    "kv_budget",
    "length_preset",
    "load_trace",
    "parse_length",
    "simulate",
    "tree_sampler",
    "write_chrome_trace",
]
