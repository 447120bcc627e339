"""`simulate(config)`: one load level on one or more replicas, with speculation as configured
and, on the same arrivals and lengths (common random numbers), with speculation off.

Random streams are split from the seed by purpose (arrivals, lengths, acceptance per replica),
so the speculation-off run replays exactly the arrivals and lengths of the speculative one and
the result depends on the seed alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from spectune.planner.capacity import KVBudget, auto_max_batch, check_batch_fits, kv_budget
from spectune.simulator.arrivals import ClosedLoop, Trace
from spectune.simulator.config import MAX_REQUESTS, SimConfig
from spectune.simulator.iterations import IterationLog
from spectune.simulator.lengths import LengthDist
from spectune.simulator.metrics import compute_metrics
from spectune.simulator.replica import Replica
from spectune.simulator.requests import Requests
from spectune.simulator.result import RunResult, SimResult
from spectune.simulator.router import Router
from spectune.simulator.speculation import Speculator, StepSampler, tree_sampler
from spectune.simulator.steptime import CostModelLike, StepPricer
from spectune.specs import SpecError

STREAM_ARRIVALS, STREAM_LENGTHS, STREAM_ACCEPT = 1, 2, 3


# ---- collaborators -----------------------------------------------------------------------------
def default_cost_model(cfg: SimConfig) -> CostModelLike:
    from spectune.planner.costmodel import CostModel

    return CostModel(cfg.hardware, cfg.target, cfg.drafter, tp=cfg.tp)


def _acceptance(cfg: SimConfig) -> Any:
    """The run's acceptance model: the config's, else its workload's; None without either."""
    if cfg.acceptance is not None or cfg.workload is None:
        return cfg.acceptance
    from spectune.planner.acceptance import acceptance_model

    return acceptance_model(cfg.workload)


def default_sampler(cfg: SimConfig) -> StepSampler:
    acc = _acceptance(cfg)
    if acc is None:
        raise SpecError("speculation needs a workload (its acceptance model); pass one")
    return tree_sampler(acc, cfg.hierarchy)


def _lengths(cfg: SimConfig) -> tuple[LengthDist, LengthDist]:
    prompt, output = cfg.prompt, cfg.output
    w = cfg.workload
    if prompt is None or output is None:
        if w is None:
            raise SpecError("give prompt and output lengths or a workload that has them")
        fixed = getattr(w, "length_dist", "lognormal") == "fixed"
        src = f"workload {w.name}"
        if prompt is None:
            prompt = LengthDist(
                w.prompt_len_mean_tokens,
                0.0 if fixed else w.prompt_len_cv,
                1,
                w.prompt_len_max_tokens,
                src,
            )
        if output is None:
            output = LengthDist(
                w.output_len_mean_tokens,
                0.0 if fixed else w.output_len_cv,
                1,
                w.output_len_max_tokens,
                src,
            )
    return prompt, output


def make_requests(cfg: SimConfig) -> tuple[Requests, LengthDist, LengthDist]:
    """The run's requests: arrival times (0 for closed loop, filled in as clients send) and
    lengths, from their own random streams."""
    arr = cfg.arrivals
    if cfg.requests > MAX_REQUESTS:
        raise SpecError(f"requests must be <= {MAX_REQUESTS} per load level, got {cfg.requests}")
    if isinstance(arr, Trace):
        n = min(cfg.requests, len(arr)) if cfg.requests else len(arr)
        if n > MAX_REQUESTS:
            raise SpecError(
                f"{arr.source}: {n} requests; at most {MAX_REQUESTS} per load level (set requests)"
            )
        p = LengthDist(float(arr.prompt_tokens[:n].mean()), 0.0, source=arr.source)
        o = LengthDist(float(arr.output_tokens[:n].mean()), 0.0, source=arr.source)
        reqs = Requests(arr.arrival_s[:n], arr.prompt_tokens[:n], arr.output_tokens[:n])
        return reqs, p, o
    if cfg.requests < 1:
        raise SpecError(f"requests must be >= 1, got {cfg.requests}")
    prompt, output = _lengths(cfg)
    n = cfg.requests
    lrng = np.random.default_rng([cfg.seed, STREAM_LENGTHS])
    p_tok = prompt.sample(lrng, n)
    o_tok = output.sample(lrng, n)
    if isinstance(arr, ClosedLoop):
        times = np.zeros(n)
    else:
        times = arr.times(np.random.default_rng([cfg.seed, STREAM_ARRIVALS]), n)
    return Requests(times, p_tok, o_tok), prompt, output


def intermediate_stage(cfg: SimConfig) -> tuple[Any, ...]:
    """The intermediate model and its drafter (ModelSpecs of the cost model), which the server
    loads beside the drafter when the policy draws hierarchical steps (TreePolicy.chain);
    () otherwise."""
    from spectune.specs import PolicyTable

    pol = cfg.policy
    pols = [b.policy for b in pol.buckets] if isinstance(pol, PolicyTable) else [pol]
    if not any(p is not None and p.chain for p in pols):
        return ()
    cm = cfg.cost_model
    stage = (getattr(cm, "intermediate", None), getattr(cm, "intermediate_drafter", None))
    return tuple(m for m in stage if m is not None)


def resolve_capacity(cfg: SimConfig, reqs: Requests) -> tuple[KVBudget, int]:
    """KV budget and max batch, or SpecError for configurations that cannot run (a
    hierarchical policy's intermediate stage loaded too: intermediate_stage)."""
    kv = kv_budget(
        cfg.hardware,
        cfg.target,
        cfg.drafter,
        tp=cfg.tp,
        memory_fraction=cfg.memory_fraction,
        max_batch_tokens=cfg.max_batch_tokens,
        block_size=cfg.block_size,
        speculating=cfg.policy is not None,  # a plain server loads no drafter
        also=intermediate_stage(cfg),
    )
    mp, mo = float(reqs.prompt.mean()), float(reqs.output.mean())
    longest = int((reqs.prompt + reqs.output).max())
    if cfg.max_batch is None:
        check_batch_fits(kv, 1, mp, mo, longest)
        return kv, auto_max_batch(kv, mp, mo)
    if cfg.max_batch < 1:
        raise SpecError(f"max batch must be >= 1, got {cfg.max_batch}")
    if cfg.clamp_max_batch:
        check_batch_fits(kv, 1, mp, mo, longest)
        return kv, min(cfg.max_batch, auto_max_batch(kv, mp, mo, cap=cfg.max_batch))
    check_batch_fits(kv, cfg.max_batch, mp, mo, longest)
    return kv, cfg.max_batch


# ---- one run -----------------------------------------------------------------------------------
def run_once(
    cfg: SimConfig,
    reqs: Requests,
    kv: KVBudget,
    max_batch: int,
    pricer: StepPricer,
    speculator: Speculator,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Simulate the requests (fresh state) on cfg.replicas replicas."""
    t_wall = time.perf_counter()
    env = simpy.Environment()
    log = IterationLog()
    n = len(reqs)
    closed = cfg.arrivals if isinstance(cfg.arrivals, ClosedLoop) else None
    state = {"sent": 0, "done": 0}
    replicas: list[Replica] = []
    router = Router(cfg.router, replicas)

    def send() -> None:
        i = state["sent"]
        state["sent"] = i + 1
        reqs.arrival_s[i] = env.now if closed else reqs.arrival_s[i]
        replicas[router.pick()].submit(i)

    def think(k: int) -> Any:
        yield env.timeout(closed.think_s if closed else 0.0)
        for _ in range(k):
            if state["sent"] < n:
                send()

    def on_finish(k: int) -> None:
        state["done"] += k
        if progress is not None:
            progress(state["done"], n)
        if closed is None:
            return
        if closed.think_s == 0:
            for _ in range(k):
                if state["sent"] < n:
                    send()
        else:
            env.process(think(k))

    def next_arrival() -> float:
        # open loop: only arrivals reach a replica from outside (routers read its load then)
        i = state["sent"]
        return float(reqs.arrival_s[i]) if i < n else float("inf")

    for i in range(cfg.replicas):
        replicas.append(
            Replica(
                env,
                i,
                reqs,
                kv,
                max_batch=max_batch,
                max_batch_tokens=cfg.max_batch_tokens,
                pricer=pricer,
                speculator=speculator,
                rng=np.random.default_rng([cfg.seed, STREAM_ACCEPT, i]),
                log=log,
                on_finish=on_finish,
                fast_forward=cfg.fast_forward,
                horizon=env.peek if closed else next_arrival,
            )
        )

    def open_loop() -> Any:
        t = reqs.arrival_s
        for i in range(n):
            dt = t[i] - env.now
            if dt > 0:
                yield env.timeout(dt)
            send()

    if closed is not None:
        for _ in range(min(closed.concurrency, n)):
            send()
    else:
        env.process(open_loop())
    env.run()
    if state["done"] < n:  # pragma: no cover - a scheduling bug, not a user error
        raise RuntimeError(f"simulation stalled: {state['done']} of {n} requests finished")
    metrics = compute_metrics(reqs, log, cfg.replicas, cfg.slo_ttft_s, cfg.slo_tpot_s)
    return RunResult(
        metrics, reqs, log if cfg.keep_iterations else None, time.perf_counter() - t_wall
    )


def _fresh(reqs: Requests, closed: bool) -> Requests:
    return Requests(np.zeros(len(reqs)) if closed else reqs.arrival_s, reqs.prompt, reqs.output)


def simulate(
    config: SimConfig, progress: Callable[[str, int, int], None] | None = None
) -> SimResult:
    """Run one load level (and its speculation-off baseline unless config.baseline is False).
    `progress(phase, done, total)` is called as requests finish ('spec' then 'off')."""
    cfg = config
    if cfg.replicas < 1:
        raise SpecError(f"replicas must be >= 1, got {cfg.replicas}")
    if cfg.max_batch_tokens < 1:
        raise SpecError(f"max batch tokens must be >= 1, got {cfg.max_batch_tokens}")
    reqs, _, _ = make_requests(cfg)
    kv, max_batch = resolve_capacity(cfg, reqs)
    cost = cfg.cost_model if cfg.cost_model is not None else default_cost_model(cfg)
    pricer = StepPricer(
        cost,
        context_quantum=cfg.context_quantum,
        exact_mixed=cfg.exact_mixed,
        hierarchy=cfg.hierarchy,
        acceptance=_acceptance(cfg) if cfg.policy is not None else None,
    )
    closed = isinstance(cfg.arrivals, ClosedLoop)
    spec: RunResult | None = None
    if cfg.policy is not None:
        sampler = cfg.sampler if cfg.sampler is not None else default_sampler(cfg)
        speculator = Speculator(
            cfg.policy,
            sampler,
            pool_size=cfg.tree_pool,
            seed=cfg.seed,
            shared_budget=cfg.shared_budget,
            pools=cfg.pool_cache,
        )
        cb = (lambda d, t: progress("spec", d, t)) if progress else None
        spec = run_once(cfg, _fresh(reqs, closed), kv, max_batch, pricer, speculator, cb)
    off: RunResult | None = None
    if cfg.baseline or spec is None:
        cb = (lambda d, t: progress("off", d, t)) if progress else None
        off = run_once(cfg, _fresh(reqs, closed), kv, max_batch, pricer, Speculator(None, None), cb)
    if spec is None:
        assert off is not None
        return SimResult(cfg, off, off, max_batch, kv.tokens)
    return SimResult(cfg, spec, off, max_batch, kv.tokens)


__all__ = ["RunResult", "SimConfig", "SimResult", "make_requests", "simulate"]
