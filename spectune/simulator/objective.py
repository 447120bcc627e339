"""A simulation-based objective for planner.search: score a policy at (batch, context) by
simulating a saturated server rather than by the closed-form steady state.

The server runs closed-loop at concurrency = max batch = `batch` (capped at what the KV cache
holds at that context), every prompt `context` tokens long, outputs from the workload (or fixed), so it captures what the closed form leaves out:
prefill interleaving, request turnover, policy switches with the live batch and the variance of
accepted lengths. Every call with the same arguments replays the same arrivals, lengths and
acceptance draws (common random numbers), so trials differ only by their policy, and results are
cached per (policy, batch, context).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from spectune.planner.capacity import auto_max_batch, kv_budget
from spectune.simulator.arrivals import ClosedLoop
from spectune.simulator.engine import (
    SimConfig,
    SimResult,
    default_cost_model,
    default_sampler,
    simulate,
)
from spectune.simulator.lengths import LengthDist
from spectune.specs import HardwareSpec, ModelSpec, SpecError, TreePolicy
from spectune.specs.workload import Workload

METRICS = ("goodput", "throughput")


class SimObjective:
    """Callable (policy | None, batch, context) -> saturated output tokens/s (see
    steady_throughput), times the share of tokens from requests meeting the SLO for 'goodput'; `latency(policy, batch, context)` gives the run's p50 TPOT in seconds for
    multi-objective searches."""

    def __init__(self, base: SimConfig, metric: str, waves: float) -> None:
        if metric not in METRICS:
            raise SpecError(f"objective metric must be one of {METRICS}, got {metric!r}")
        self.base = base
        self.metric = metric
        self.waves = waves
        self._runs: dict[tuple[TreePolicy | None, int, int], SimResult] = {}
        self._cost: Any = base.cost_model
        self._sampler: Any = base.sampler
        self._pools: dict[Any, Any] = {}  # outcome pools, drawn once per policy

    def run(self, policy: TreePolicy | None, batch: int, context: int) -> SimResult:
        key = (policy, int(batch), int(context))
        res = self._runs.get(key)
        if res is None:
            if batch < 1:
                raise SpecError(f"batch must be >= 1, got {batch}")
            b = self._fitting_batch(int(batch), int(context), policy is not None, policy)
            cfg = replace(
                self.base,
                policy=policy,
                arrivals=ClosedLoop(b),
                max_batch=b,
                clamp_max_batch=True,
                requests=max(b, round(b * self.waves)),
                prompt=LengthDist.fixed(max(1, int(context))),
                baseline=False,
                keep_iterations=True,
                cost_model=self._cost,
                sampler=self._sampler,
                pool_cache=self._pools,
            )
            if self._cost is None:
                self._cost = default_cost_model(cfg)
                cfg = replace(cfg, cost_model=self._cost)
            if policy is not None and self._sampler is None:
                self._sampler = default_sampler(cfg)
                cfg = replace(cfg, sampler=self._sampler)
            res = simulate(cfg)
            self._runs[key] = res
        return res

    def _fitting_batch(
        self,
        batch: int,
        context: int,
        speculating: bool = True,
        policy: TreePolicy | None = None,
    ) -> int:
        """`batch`, or about the largest batch the KV cache holds at this context (a server
        cannot run more; clients beyond it would only queue, so they are not simulated); a
        plain server (`speculating` False) holds no drafter, a hierarchical `policy` loads the
        intermediate stage too. The run clamps it again against the lengths it actually drew."""
        from spectune.simulator.engine import intermediate_stage

        b = self.base
        kv = kv_budget(
            b.hardware,
            b.target,
            b.drafter,
            tp=b.tp,
            memory_fraction=b.memory_fraction,
            max_batch_tokens=b.max_batch_tokens,
            block_size=b.block_size,
            speculating=speculating,
            also=intermediate_stage(replace(b, policy=policy)),
        )
        if b.output is not None:
            out = b.output.mean_tokens
        elif b.workload is not None:
            out = b.workload.output_len_mean_tokens
        else:
            raise SpecError("the objective needs output lengths: a workload or output_tokens")
        return min(batch, auto_max_batch(kv, max(1, context), out, cap=batch))

    def __call__(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        res = self.run(policy, batch, context)
        tok_s = steady_throughput(res)
        if self.metric == "throughput":
            return tok_s
        m = res.metrics
        return tok_s * (m.goodput_tok_s / m.throughput_tok_s if m.throughput_tok_s else 0.0)

    def latency(self, policy: TreePolicy | None, batch: int, context: int) -> float:
        return self.run(policy, batch, context).metrics.tpot.p50


def steady_throughput(res: SimResult) -> float:
    """Output tokens/s of a closed-loop run while the server is saturated: from the first
    request's finish (past the synchronised first prefill) to the start of the drain (the first
    iteration with fewer requests in system than the batch). Falls back to the whole run's
    throughput when that window is empty. Short runs are dominated by their drain otherwise,
    where few requests remain, which flatters speculation."""
    log = res.spec.log
    m = res.metrics
    if log is None or not log.rows:
        return m.throughput_tok_s
    it = log.arrays()
    first_finish = float(np.nanmin(res.spec.requests.finish_s))
    full = it["in_system"] >= res.max_batch
    drain = int(np.argmin(full)) if not full.all() else full.size
    window = np.zeros(full.size, dtype=bool)
    window[:drain] = True
    window &= it["start_s"] >= first_finish
    dt = float(it["dt_s"][window].sum())
    if dt <= 0:
        return m.throughput_tok_s
    return float(it["emitted_tokens"][window].sum()) / dt


def goodput_objective(
    hardware: HardwareSpec,
    target: ModelSpec,
    drafter: ModelSpec | None,
    workload: Workload,
    *,
    tp: int = 1,
    output_tokens: int | None = None,
    waves: float = 3.0,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    metric: str = "goodput",
    seed: int = 0,
    tree_pool: int = 8192,
    **config: Any,
) -> SimObjective:
    """The simulator's objective for planner.search. `waves` batches of requests are simulated
    per call (requests = waves x batch); outputs are `output_tokens` long, or drawn from the
    workload. Extra keyword arguments are SimConfig fields (cost_model, acceptance, sampler,
    max_batch_tokens, ...)."""
    base = SimConfig(
        hardware=hardware,
        target=target,
        drafter=drafter,
        arrivals=ClosedLoop(1),
        workload=workload,
        tp=tp,
        output=LengthDist.fixed(output_tokens) if output_tokens else None,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        seed=seed,
        tree_pool=tree_pool,
        **config,
    )
    return SimObjective(base, metric, waves)
