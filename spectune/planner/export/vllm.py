"""vLLM: speculative_config with num_speculative_tokens_per_batch_size (chains; vLLM 0.33) and,
for older releases, speculative_token_tree."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spectune.planner.export.base import (
    VLLM_MAX_BATCH,
    Export,
    TreeShaper,
    batch_plan,
    check_choices,
    primary_policy,
    range_label,
    shape_notes,
    sidecar,
    tree_choices,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import PolicyTable


def check_vllm(cfg: Mapping[str, Any], tree: Sequence[Sequence[int]] | None = None) -> None:
    """vLLM 0.33's rules for num_speculative_tokens_per_batch_size; `tree` is the path list
    behind speculative_token_tree (older vLLM), when there is one."""
    k_max = cfg["num_speculative_tokens"]
    if k_max < 1:
        raise SpecError("vllm: num_speculative_tokens must be >= 1")
    ranges = cfg.get("num_speculative_tokens_per_batch_size")
    if ranges is None:
        return
    if not ranges or ranges[0][0] != 1:
        raise SpecError("vllm: num_speculative_tokens_per_batch_size must start at batch 1")
    prev_hi = 0
    for lo, hi, k in ranges:
        if lo != prev_hi + 1 or hi < lo:
            raise SpecError(
                f"vllm: range [{lo}, {hi}] does not follow [.., {prev_hi}] (inclusive, contiguous)"
            )
        if not 0 <= k <= k_max:
            raise SpecError(
                f"vllm: K={k} for [{lo}, {hi}] must be in 0..num_speculative_tokens={k_max}"
            )
        prev_hi = hi
    if tree is not None:
        check_choices(tree)
        if max(len(c) for c in tree) != k_max:
            raise SpecError("vllm: the token tree's depth must equal num_speculative_tokens")


def export_vllm(
    table: PolicyTable,
    *,
    context: int | None = None,
    tree: bool = False,
    shaper: TreeShaper | None = None,
    max_batch: int = VLLM_MAX_BATCH,
) -> Export:
    rows, notes = batch_plan(table, context)
    ks = []
    for b in rows:
        if b.chain is not None:
            k = b.chain.draft_tokens
        else:
            k = 0 if b.policy is None else b.policy.depth
        ks.append(k)
    if any(b.chain is None and b.policy is not None for b in rows):
        notes.append(
            "the policy file records no best chain for some buckets (planned by an "
            "older spectune): used the tree's depth as the chain length"
        )
    if not tree:
        losses = []
        for b in rows:
            if b.policy is None or b.policy.topk == 1 or b.chain is None or b.predicted is None:
                continue
            loss = 1 - b.chain.tokens_per_s / b.predicted.tokens_per_s
            losses.append(
                f"{range_label(b)}: {b.predicted.tokens_per_s:.0f} -> "
                f"{b.chain.tokens_per_s:.0f} tok/s ({-100 * loss:+.1f}%)"
            )
        if losses:
            notes.append(
                "vLLM 0.33 verifies chains only (tree attention removed): each bucket "
                "uses its best chain; predicted loss of tree -> chain: " + "; ".join(losses)
            )
    ranges: list[list[int]] = []
    for b, k in zip(rows, ks, strict=True):
        hi = b.batch[1]
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = hi
        else:
            ranges.append([b.batch[0], hi, k])
    if ranges[-1][1] < max_batch:
        notes.append(
            f"batches {ranges[-1][1] + 1}-{max_batch} beyond the last bucket use its "
            f"setting (K={ranges[-1][2]})"
        )
        ranges[-1][1] = max_batch
    k_max = max(ks)
    if k_max == 0:
        notes.append("speculation is off for every batch size: run vLLM without speculative_config")
        return Export(
            "vllm",
            {
                "vllm_speculative_config.json": "null\n",
                "vllm.spectune.json": sidecar(table, "vllm", notes, None),
            },
            tuple(notes),
        )
    cfg: dict[str, Any] = {
        "method": "eagle3",
        "model": table.drafter,
        "num_speculative_tokens": k_max,
    }
    if len(ranges) > 1 or ranges[0][2] != k_max:
        cfg["num_speculative_tokens_per_batch_size"] = ranges
    choices = None
    if tree:
        p = primary_policy(rows)
        assert p is not None
        if shaper is None:
            raise SpecError(
                "vllm tree export needs a tree shaper (the workload's acceptance model)"
            )
        choices = tree_choices(shaper(p))
        depth = max(len(c) for c in choices)
        cfg["num_speculative_tokens"] = depth
        cfg.pop("num_speculative_tokens_per_batch_size", None)
        cfg["speculative_token_tree"] = str([tuple(c) for c in choices]).replace(" ", "")
        notes.append(
            "speculative_token_tree (vLLM releases before the May 2026 removal of tree "
            f"attention): one static tree of {len(choices) + 1} tokens for every batch "
            "size; per-batch-size settings dropped"
        )
        notes += shape_notes(rows, p, "vllm static tree")
    check_vllm(cfg, choices)
    files = {
        "vllm_speculative_config.json": json.dumps(cfg, indent=2) + "\n",
        "vllm.spectune.json": sidecar(table, "vllm", notes, cfg),
    }
    return Export("vllm", files, tuple(notes), cfg)
