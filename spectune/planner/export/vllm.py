"""vLLM: `vllm serve MODEL --speculative-config JSON` with num_speculative_tokens_per_batch_size
(vLLM 0.33: chains, inclusive [lo, hi, K] ranges from batch 1, K = 0 turns a range off, K capped
at num_speculative_tokens) or, for releases with tree attention (vllm-0.11 profile), one static
speculative_token_tree and no per-batch schedule.

The export sets --tensor-parallel-size and --max-num-seqs (the plan's largest batch, which is
also where vLLM's dense schedule lookup ends), and the draft model's Hugging Face repo id or
path. vLLM rejects unknown keys in speculative_config, so what spectune has to say goes into a
sidecar `vllm.spectune.json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spectune.planner.export.base import (
    Export,
    TreeShaper,
    batch_plan,
    check_choices,
    header,
    launch_script,
    max_batch,
    model_paths,
    range_label,
    shape_notes,
    sidecar,
    tree_choices,
)
from spectune.planner.space import check_engine_drafter
from spectune.planner.tokens_per_s import SERVED
from spectune.specs.engine import EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.policy import Bucket, PolicyTable

METHODS = {
    "eagle3": "eagle3",
    "eagle": "eagle",
    "mtp": "mtp",
    "draft-model": "draft_model",
    "ngram": "ngram",
}


def check_vllm(cfg: Mapping[str, Any], tree: Sequence[Sequence[int]] | None = None) -> None:
    """vLLM 0.33's rules for num_speculative_tokens_per_batch_size; `tree` is the path list
    behind speculative_token_tree (older vLLM), when there is one."""
    k_max = cfg["num_speculative_tokens"]
    if k_max < 1:
        raise SpecError("vllm: num_speculative_tokens must be >= 1")
    ranges = cfg.get("num_speculative_tokens_per_batch_size")
    if ranges is not None:
        if tree is not None:
            raise SpecError("vllm: no release runs a token tree with a per-batch-size schedule")
        if not ranges or ranges[0][0] != 1:
            raise SpecError("vllm: num_speculative_tokens_per_batch_size must start at batch 1")
        prev_hi = 0
        for lo, hi, k in ranges:
            if lo != prev_hi + 1 or hi < lo:
                raise SpecError(
                    f"vllm: range [{lo}, {hi}] does not follow [.., {prev_hi}] "
                    "(inclusive, contiguous)"
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


def chain_lengths(rows: Sequence[Bucket], notes: list[str]) -> list[int]:
    """K per batch range: 0 where the plan turns speculation off, the policy's depth where it
    is a chain, the planner's best chain (`Bucket.chain`) where it is a tree; a tree without
    a recorded chain cannot run on a chain-only vLLM (SpecError)."""
    ks: list[int] = []
    losses = []
    for b in rows:
        if b.policy is None:
            ks.append(0)
        elif b.policy.topk == 1:
            ks.append(b.policy.depth)
        elif b.chain is not None:
            ks.append(b.chain.draft_tokens)
            if b.predicted is not None and b.predicted.tokens_per_s > 0:
                loss = 1 - b.chain.tokens_per_s / b.predicted.tokens_per_s
                losses.append(
                    f"{range_label(b)}: {b.predicted.tokens_per_s:.0f} -> "
                    f"{b.chain.tokens_per_s:.0f} {SERVED.label} ({-100 * loss:+.1f}%)"
                )
        else:
            raise SpecError(
                f"vLLM 0.33 verifies chains only (tree attention removed, vllm PR #42121) and "
                f"bucket {range_label(b)} plans the tree {b.policy.label} with no best chain "
                "recorded: re-plan for --engine vllm (chains), or export --engine vllm-0.11 "
                "(speculative_token_tree, no per-batch schedule)"
            )
    if losses:
        notes.append(
            "vLLM 0.33 verifies chains only (tree attention removed): tree buckets use their "
            "best chain; predicted loss of tree -> chain: " + "; ".join(losses)
        )
    return ks


def export_vllm(
    table: PolicyTable,
    *,
    context: int | None = None,
    tree: bool = False,
    notes: Sequence[str] = (),
    shaper: TreeShaper | None = None,
    profile: EngineProfile | str | None = None,
    model_path: str | None = None,
    draft_model_path: str | None = None,
) -> Export:
    """`tree` selects the vllm-0.11 profile (speculative_token_tree) when no profile is given;
    `notes`: what was given up before (export_policy's fit), first in the list."""
    prof = load_engine(profile or ("vllm-0.11" if tree else "vllm"))
    rows, more = batch_plan(table, context)
    notes = [*notes, *more]
    paths = model_paths(table, model_path, draft_model_path)
    check_engine_drafter(paths.drafter_kind, prof)
    m = max_batch(rows)
    argv = ["vllm", "serve", paths.target, "--tensor-parallel-size", str(table.tp)]
    argv += ["--max-num-seqs", str(m)]
    cfg: dict[str, Any] | None
    choices = None
    if prof.trees and prof.static_tree_choices and not prof.has_schedule:
        cfg, choices = _tree_config(rows, paths.drafter, shaper, notes, prof)
    else:
        cfg = _chain_config(rows, paths.drafter, m, notes)
    if cfg is not None:
        cfg = {"method": METHODS[paths.drafter_kind], **cfg}
        if paths.drafter_kind == "ngram":
            cfg.pop("model", None)
        check_vllm(cfg, choices)
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    head = header(table, prof, notes, "# ")
    files = {
        "launch_vllm.sh": launch_script(argv, head),
        "vllm_speculative_config.json": json.dumps(cfg, indent=2) + "\n",
        "vllm.spectune.json": sidecar(table, prof, notes, cfg, argv),
    }
    config = {"speculative_config": cfg, "tensor_parallel_size": table.tp, "max_num_seqs": m}
    return Export("vllm", files, tuple(notes), config, tuple(argv))


def _chain_config(
    rows: Sequence[Bucket], drafter: str, m: int, notes: list[str]
) -> dict[str, Any] | None:
    ks = chain_lengths(rows, notes)
    k_max = max(ks)
    if k_max == 0:
        notes.append(
            "speculation is off for every batch size: vLLM runs without speculative_config"
        )
        return None
    ranges: list[list[int]] = []
    for b, k in zip(rows, ks, strict=True):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b.batch[1]
        else:
            ranges.append([b.batch[0], b.batch[1], k])
    cfg: dict[str, Any] = {"model": drafter, "num_speculative_tokens": k_max}
    if len(ranges) > 1:
        cfg["num_speculative_tokens_per_batch_size"] = ranges
    return cfg


def _tree_config(
    rows: Sequence[Bucket],
    drafter: str,
    shaper: TreeShaper | None,
    notes: list[str],
    prof: EngineProfile,
) -> tuple[dict[str, Any] | None, list[list[int]] | None]:
    first = next((b.policy for b in rows if b.policy is not None), None)
    if first is None:
        notes.append(
            "speculation is off for every batch size: vLLM runs without speculative_config"
        )
        return None, None
    if shaper is None:
        raise SpecError("vllm tree export needs a tree shaper (the workload's acceptance model)")
    choices = tree_choices(shaper(first))
    depth = max(len(c) for c in choices)
    cfg = {
        "model": drafter,
        "num_speculative_tokens": depth,
        "speculative_token_tree": str([tuple(c) for c in choices]).replace(" ", ""),
    }
    if len({b.policy for b in rows}) > 1:
        notes.append(
            f"{prof.name} ({prof.versions}) has no per-batch-size schedule: one static tree of "
            f"{len(choices) + 1} tokens for every batch size; the other buckets' settings are "
            "dropped"
        )
    notes += shape_notes(rows, first, "vllm static tree")
    return cfg, choices
