"""KV-cache capacity of one replica: HBM left after weights and an activation reserve, divided
by the KV bytes one token needs (target plus drafter), in pages of `block_size` tokens.

The simulator's admission and preemption count against it, and it catches impossible
configurations before any simulation (a model that does not fit, a request longer than the whole
cache, a maximum batch the cache cannot hold); the planner's closed form uses it to run no larger
batch than the cache holds at a bucket's context.

Turning speculation on costs capacity before any step is priced, and this module is where that
cost lives:
  - the drafter's weights and its own KV cache (one entry per token of every running request)
    take HBM, so a speculating server holds fewer requests than a plain one at the same context
    (`kv_budget(..., speculating=False)` is the plain server: no drafter loaded); an engine's
    own speculative buffers beyond those (EngineProfile.spec_extra_hbm_bytes: draft CUDA
    graphs, per-step scratch) are taken too;
  - an engine may cap the running requests once speculation is on: SGLang 0.5.23 sets max
    running requests to 48 when the user sets none (sglang/srt/arg_groups/speculative_hook.py;
    without speculation its KV estimator sizes the cap, up to thousands: sgl-project/sglang PR
    #34290 measures 4096 -> 48 on one GPU). `default_max_running` says what an engine runs
    with the user's settings left alone. spectune's exports set the cap themselves
    (--max-running-requests), so only an engine's default config runs under it.
Users see these costs as speculation losing throughput at high concurrency and short contexts
(sgl-project/sglang #4759: 1039 -> 321 tok/s with speculation, DeepSeek-R1 TP8, 100 requests
at once, #running-req held at 32 by the cap of that release; #5160: lower throughput at 128
concurrent requests; PR #3986's review of that cap: higher TTFT and lower throughput at request
rate 16 on ShareGPT). The
planner compares against the plain server's capacity, so it turns speculation off where the
capacity lost costs more than the accepted tokens give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spectune.specs import HardwareSpec, ModelSpec, SpecError
from spectune.specs.engine import EngineProfile

GIB = 1 << 30
WORKSPACE_BYTES = 1 * GIB  # CUDA graphs, cuBLAS/attention workspaces, allocator slack


@dataclass(frozen=True)
class KVBudget:
    """KV-cache pages of one replica (tp GPUs)."""

    blocks: int  # pages available for KV
    block_size: int  # tokens per page
    bytes_per_token: float  # target + drafter KV bytes of one token, all GPUs of the replica
    free_bytes: float  # HBM left for KV, all GPUs of the replica

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size


def activation_reserve_bytes(target: ModelSpec, max_batch_tokens: int, tp: int) -> float:
    """Peak activations of one forward pass over `max_batch_tokens` tokens, per GPU: a residual
    stream and q/k/v/o widths (4 x hidden) plus the MLP intermediate (2 x ffn) per token, and
    a fixed workspace. Logits are not held for every token, so the LM head is left out."""
    ffn = target.ffn or target.expert_ffn * max(target.experts_topk, 1)
    per_token = (4 * target.hidden + 2 * ffn) * target.dtype_bytes
    return max_batch_tokens * per_token / tp + WORKSPACE_BYTES


def kv_budget(
    hardware: HardwareSpec,
    target: ModelSpec,
    drafter: ModelSpec | None,
    *,
    tp: int = 1,
    memory_fraction: float = 0.9,
    max_batch_tokens: int = 8192,
    block_size: int = 16,
    speculating: bool = True,
    spec_extra_bytes: float = 0.0,
    also: tuple[ModelSpec, ...] = (),
) -> KVBudget:
    """KV pages of a replica of `tp` GPUs, or SpecError if the weights leave no room.

    `speculating` False: the server runs without speculation, so the drafter is not loaded and
    its weights and KV bytes stay free for the target's KV. Speculating, `spec_extra_bytes`
    (the engine's own speculative buffers, all GPUs of the replica) are taken as well, and the
    models in `also` (a hierarchical policy's intermediate and its drafter) are loaded beside
    the drafter: their weights and their KV per token."""
    if not 0 < memory_fraction <= 1:
        raise SpecError(f"memory fraction must be in (0, 1], got {memory_fraction}")
    if tp < 1 or block_size < 1:
        raise SpecError("tp and block size must be >= 1")
    if not speculating:
        drafter, spec_extra_bytes, also = None, 0.0, ()
    extra = tuple(m for m in dict.fromkeys(also) if m != drafter)
    usable = hardware.hbm_bytes * memory_fraction * tp - spec_extra_bytes
    weights = target.weight_bytes() + (drafter.weight_bytes() if drafter else 0.0)
    weights += sum(m.weight_bytes() for m in extra)
    reserve = activation_reserve_bytes(target, max_batch_tokens, tp) * tp
    free = usable - weights - reserve
    per_token = target.kv_bytes_per_token() + (drafter.kv_bytes_per_token() if drafter else 0.0)
    per_token += sum(m.kv_bytes_per_token() for m in extra)
    if free < per_token * block_size:
        names = " + ".join(m.name for m in (target, drafter, *extra) if m is not None)
        raise SpecError(
            f"{names} does not fit on {tp} x {hardware.name}: weights need "
            f"{weights / 1e9:.1f} GB and activations {reserve / 1e9:.1f} GB of "
            f"{usable / 1e9:.1f} GB usable ({memory_fraction:.0%} of "
            f"{hardware.hbm_bytes * tp / 1e9:.0f} GB), leaving no room for the KV cache; "
            f"use more GPUs (--tp), a larger GPU or fp8 weights"
        )
    blocks = int(free // (per_token * block_size))
    return KVBudget(blocks, block_size, per_token, free)


def check_batch_fits(
    budget: KVBudget, max_batch: int, mean_prompt: float, mean_output: float, longest: int
) -> None:
    """SpecError when one request can never fit, or when `max_batch` requests of the
    workload's mean length need more KV than the replica has."""
    if math.ceil(longest / budget.block_size) > budget.blocks:
        raise SpecError(
            f"a request of {longest} tokens (prompt + output) needs more KV than the whole "
            f"cache holds ({budget.tokens} tokens); shorten the lengths or add GPUs"
        )
    per_request = math.ceil((mean_prompt + mean_output) / budget.block_size)
    fits = budget.blocks // max(per_request, 1)
    if max_batch > fits:
        raise SpecError(
            f"--max-batch {max_batch} needs KV for {max_batch} x {mean_prompt + mean_output:.0f} "
            f"tokens (mean prompt + output) but the cache holds {budget.tokens} tokens "
            f"({budget.free_bytes / 1e9:.1f} GB); use --max-batch {max(fits, 1)} or less, "
            f"or leave --max-batch out to size it from the cache"
        )


def auto_max_batch(budget: KVBudget, mean_prompt: float, mean_output: float, cap: int = 256) -> int:
    """The largest batch (up to `cap`, a common engine default) whose mean-length requests fit."""
    per_request = math.ceil((mean_prompt + mean_output) / budget.block_size)
    return max(1, min(cap, budget.blocks // max(per_request, 1)))


def default_max_running(profile: EngineProfile | None, speculating: bool) -> int | None:
    """The running requests an engine admits when the user sets no cap (None: no cap of its
    own beyond the KV cache): its speculative cap with speculation on (SGLang 0.5.23: 48,
    EngineProfile.spec_max_running), else its plain default (EngineProfile.default_max_running;
    vLLM 0.33: max_num_seqs 1024 on H100/H200)."""
    if profile is None:
        return None
    cap = profile.spec_max_running if speculating and profile.spec_max_running else 0
    cap = cap or profile.default_max_running
    return cap or None
