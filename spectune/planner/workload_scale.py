"""Scaling a workload preset's acceptance so that a reference policy reproduces a published mean
accepted length.

The confidence presets in specs.workload were scaled with `fit_confidence_scale` (one scale m1
of the per-depth draft confidences, by bisection, so that EAGLE-2's default tree yields the
published tokens per step) and their retrieval profiles with `fit_retrieval_scale` (one scale
of the retrieval acceptances, so that a prompt-lookup chain yields PLD's published tokens per
step); tests/test_acceptance.py checks that they still reproduce their sources. This module
builds trees to count tokens per step, so it sits above planner.trees (and outside
planner.acceptance, which the tree builders import). Fitting a whole Workload to a recorded
trace is spectune.traces.fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from spectune.planner.acceptance import acceptance_model
from spectune.planner.acceptance.base import RetrievalProfile
from spectune.planner.acceptance.confidence import ConfidenceAcceptance
from spectune.planner.space import EAGLE_DEFAULT
from spectune.planner.trees import expected_tokens_for_policy
from spectune.specs.errors import SpecError
from spectune.specs.policy import TreePolicy
from spectune.specs.workload import Workload


def bisect(
    f: Callable[[float], float], target: float, lo: float, hi: float, tol: float = 1e-3
) -> float:
    """x in [lo, hi] with f(x) ~= target for an increasing f."""
    flo, fhi = f(lo), f(hi)
    if not flo <= target <= fhi:
        raise SpecError(
            f"target {target:.3f} is outside [{flo:.3f}, {fhi:.3f}] reachable by the fit"
        )
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return 0.5 * (lo + hi)


def confidence_means(m1: float, decay: float, levels: int = 8) -> tuple[float, ...]:
    """Per-depth mean draft confidences m1 * decay**d (d = 0 .. levels-1), capped at 0.97."""
    return tuple(min(0.97, m1 * decay**d) for d in range(levels))


def policy_tokens(wl: Workload, policy: TreePolicy, samples: int = 20000, seed: int = 0) -> float:
    """Mean expected tokens per step of `policy` on `wl` over `samples` trees (in chunks)."""
    # a fresh model per scaled workload: a bisection's many workloads stay out of the cache
    m = ConfidenceAcceptance(wl) if wl.acceptance == "confidence" else acceptance_model(wl)
    chunk = 2000
    vals = [
        expected_tokens_for_policy(policy, m, samples=chunk, seed=seed + i)
        for i in range(max(1, samples // chunk))
    ]
    return float(np.mean(vals))


def fit_confidence_scale(
    base: Workload, target_tokens: float, policy: TreePolicy = EAGLE_DEFAULT, samples: int = 20000
) -> float:
    """m1 such that confidence_mean = m1 * depth_decay**d makes `policy` yield target_tokens."""

    def f(m1: float) -> float:
        wl = dataclasses.replace(base, confidence_mean=confidence_means(m1, base.depth_decay))
        return policy_tokens(wl, policy, samples)

    return bisect(f, target_tokens, 0.05, 0.97, tol=1e-3)


def retrieval_chain_tokens(profile: RetrievalProfile, length: int) -> float:
    """Expected tokens per step of a retrieval-only drafter proposing one chain of `length`."""
    rho = np.zeros((profile.rho.shape[0], length))
    n = min(length, profile.rho.shape[1])
    rho[:, :n] = profile.rho[:, :n]
    return float(1.0 + (profile.match_probs[:, None] * np.cumprod(rho, axis=1)).sum())


def fit_retrieval_scale(
    rows: Callable[[float], tuple[tuple[float, ...], ...]],
    match_probs: Sequence[float],
    target_tokens: float,
    length: int = 10,
) -> float:
    """s such that retrieval_accept = rows(s) gives target_tokens for a `length`-token chain."""

    def f(s: float) -> float:
        wl_rows = rows(s)
        width = max(len(r) for r in wl_rows)
        rho = np.zeros((len(wl_rows), width))
        for i, r in enumerate(wl_rows):
            rho[i, : len(r)] = r
        return retrieval_chain_tokens(RetrievalProfile(rho, np.asarray(match_probs)), length)

    return bisect(f, target_tokens, 0.0, 2.0, tol=1e-4)
