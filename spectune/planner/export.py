"""Turn a PolicyTable into what serving engines read, checked against each engine's rules.

Engines key speculation by batch size only and hold one tree shape for the whole server, while
a spectune table has a full policy per (batch, context) bucket. Each exporter therefore keeps
what the engine can express (draft length per batch range, on/off) and says, in an
`approximations` list, everything else it had to give up: other context buckets, per-bucket
top-k and budget, pruning, grafting, tree vs chain. The list is printed by the CLI and written
into the export (comments in text/YAML files, a sidecar `*.spectune.json` next to JSON files
whose engines reject unknown keys).

  sglang: server arguments + the adaptive config (keys: batch-size lower bounds,
          candidate_steps; 0 = off). With top-k 1, num_draft_tokens must be steps + 1.
  vllm:   speculative_config with num_speculative_tokens_per_batch_size ([lo, hi, K], inclusive,
          first lo = 1, K <= num_speculative_tokens). vLLM 0.33 verifies chains only, so each
          bucket gets its best chain; `tree=True` adds speculative_token_tree for older vLLM.
  trtllm: speculative_config YAML: draft_len_schedule (batch <= key gets the value; the
          smallest key maps to max_draft_len), dynamic-tree limits
          (max_draft_len <= max_total_draft_tokens <= topK * max_draft_len) or eagle_choices.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spectune.specs.errors import SpecError
from spectune.specs.io import write_text_atomic
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy
from spectune.specs.tree import DraftTree

ENGINES = ("sglang", "vllm", "trtllm")
VLLM_MAX_BATCH = 4096

TreeShaper = Callable[[TreePolicy], DraftTree]
"""Builds the static tree an engine with a fixed tree should use for a policy."""


@dataclass(frozen=True)
class Export:
    """Files for one engine (name -> text) and what could not be expressed exactly."""

    engine: str
    files: Mapping[str, str]
    approximations: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write every file atomically under out_dir; returns the paths."""
        out = Path(out_dir)
        paths = []
        for name, text in self.files.items():
            p = out / name
            write_text_atomic(p, text)
            paths.append(p)
        return paths


# ---- shared helpers ---------------------------------------------------------------------------


def batch_plan(table: PolicyTable, context: int | None = None) -> tuple[list[Bucket], list[str]]:
    """The buckets of one context range, in batch order, and notes on what that drops."""
    ctx_ranges = sorted({b.context for b in table.buckets})
    if context is None:
        chosen = ctx_ranges[0]
    else:
        inside = [r for r in ctx_ranges if r[0] <= context <= r[1]]
        if not inside:
            raise SpecError(f"--context {context} is in no context bucket of the table")
        chosen = inside[0]
    rows = sorted((b for b in table.buckets if b.context == chosen), key=lambda b: b.batch)
    if rows[0].batch[0] > 1:
        raise SpecError(f"the table's buckets for context {chosen} do not start at batch 1")
    for a, b in itertools.pairwise(rows):
        if b.batch[0] != a.batch[1] + 1:
            raise SpecError(f"batch buckets {a.batch} and {b.batch} leave a gap or overlap")
    notes = []
    if len(ctx_ranges) > 1:
        differ = [
            f"{b.batch[0]}-{b.batch[1]}@ctx{b.context[0]}-{b.context[1]}"
            for b in table.buckets
            if b.context != chosen and b.policy != table.lookup(b.batch[1], chosen[1])
        ]
        if differ:
            notes.append(
                f"the engine keys speculation by batch size only: used the policies of context "
                f"{chosen[0]}-{chosen[1]}; other contexts chose differently at "
                + ", ".join(differ[:6])
                + (" ..." if len(differ) > 6 else "")
            )
    return rows, notes


def primary_policy(rows: Sequence[Bucket]) -> TreePolicy | None:
    """The policy whose tree shape fills the engine's global knobs: the smallest batch with
    speculation on (where the tree matters most)."""
    for b in rows:
        if b.policy is not None:
            return b.policy
    return None


Evaluate = Callable[[TreePolicy | None, int, int], float]
"""tokens/s of a policy at (batch, context): the planner's objective, to fit engine knobs."""


@dataclass(frozen=True)
class EngineShape:
    """What an engine with one global tree shape runs: top-k and tree tokens (root included)
    for every batch size, and a draft depth per batch range (0 = off)."""

    topk: int
    budget: int
    depths: tuple[int, ...]

    def policy(self, depth: int) -> TreePolicy | None:
        if depth == 0:
            return None
        if self.topk == 1:
            return TreePolicy("dynamic-topk", depth, 1, depth + 1)
        cap = 1 + self.topk + (depth - 1) * self.topk * self.topk
        return TreePolicy("dynamic-topk", depth, self.topk, max(2, min(self.budget, cap)))


def _row_score(evaluate: Evaluate, policy: TreePolicy | None, b: Bucket) -> float:
    ctx = (b.context[0] + b.context[1] + 1) // 2
    vals = [max(evaluate(policy, x, ctx), 1e-300) for x in sorted({b.batch[0], b.batch[1]})]
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))


def fit_engine_shape(
    rows: Sequence[Bucket], evaluate: Evaluate, *, cap_by_first: bool = False
) -> tuple[EngineShape, float]:
    """The global (top-k, budget) and per-range depths that maximise the geometric mean of
    predicted tokens/s over the batch ranges, for engines that vary only the draft depth with
    the batch size (SGLang adaptive steps, TensorRT-LLM draft_len_schedule). Candidates: each
    bucket's own (top-k, budget) and chains. Ranges the plan turns off stay off; others may go
    off too when that is faster. cap_by_first: depths may not exceed the first range's
    (TensorRT-LLM maps the smallest schedule key to max_draft_len).
    Returns the shape and its mean log-ratio to the plan's own predictions (0 = no loss)."""
    on = [b.policy for b in rows if b.policy is not None]
    max_depth = max(p.depth for p in on) + 1
    cands = list(dict.fromkeys([(p.topk, p.budget) for p in on] + [(1, 0)]))
    best: tuple[float, EngineShape] | None = None
    for topk, budget in cands:
        probe = EngineShape(topk, budget, ())
        depths: list[int] = []
        total = 0.0
        for i, b in enumerate(rows):
            if b.policy is None:
                depths.append(0)
                total += math.log(_row_score(evaluate, None, b))
                continue
            hi = depths[0] if cap_by_first and i > 0 and depths[0] > 0 else max_depth
            options = range(1, hi + 1) if i == 0 and cap_by_first else range(0, hi + 1)
            scored = [(_row_score(evaluate, probe.policy(d), b), d) for d in options]
            score, d = max(scored)
            depths.append(d)
            total += math.log(score)
        if best is None or total > best[0]:
            best = (total, EngineShape(topk, budget, tuple(depths)))
    assert best is not None
    own = sum(math.log(_row_score(evaluate, b.policy, b)) for b in rows)
    return best[1], (best[0] - own) / len(rows)


def _rng(b: Bucket) -> str:
    return f"{b.batch[0]}-{b.batch[1]}"


def _global_shape_notes(rows: Sequence[Bucket], p: TreePolicy, what: str) -> list[str]:
    notes = []
    other = [
        b
        for b in rows
        if b.policy is not None and (b.policy.topk, b.policy.budget) != (p.topk, p.budget)
    ]
    if other:
        notes.append(
            f"{what}: one top-k and verify budget for all batch sizes (top-k {p.topk}, budget "
            f"{p.budget}); buckets "
            + ", ".join(
                f"{_rng(b)} (top-k {b.policy.topk}, budget {b.policy.budget})"
                for b in other
                if b.policy is not None
            )
            + " wanted others"
        )
    pruned = [b for b in rows if b.policy is not None and b.policy.prune_threshold > 0]
    if pruned:
        notes.append(
            f"{what} has no confidence pruning: dropped prune thresholds of buckets "
            + ", ".join(_rng(b) for b in pruned)
        )
    grafted = [b for b in rows if b.policy is not None and b.policy.graft_budget > 0]
    if grafted:
        notes.append(
            f"{what} cannot graft retrieved tokens into the tree: dropped graft budgets of "
            "buckets " + ", ".join(_rng(b) for b in grafted)
        )
    return notes


def tree_choices(tree: DraftTree) -> list[list[int]]:
    """A tree as paths of sibling ranks (EAGLE/Medusa 'choices'): node i -> the ranks of the
    nodes from the root's child down to i. Siblings rank in index order. Root excluded."""
    parents = tree.parents
    n = tree.num_nodes
    rank = [0] * n
    seen: dict[int, int] = {}
    for i in range(1, n):
        par = int(parents[i])
        rank[i] = seen.get(par, 0)
        seen[par] = rank[i] + 1
    paths: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        paths[i] = [*paths[int(parents[i])], rank[i]]
    return sorted(paths[1:], key=lambda p: (len(p), p))


def check_choices(choices: Sequence[Sequence[int]]) -> None:
    """Every path's prefix is a path too, no duplicates."""
    have = {tuple(c) for c in choices}
    if len(have) != len(choices):
        raise SpecError("tree choices contain a duplicate path")
    for c in choices:
        if not c or min(c) < 0:
            raise SpecError(f"tree choice {list(c)} must be a non-empty list of ranks >= 0")
        if len(c) > 1 and tuple(c[:-1]) not in have:
            raise SpecError(f"tree choice {list(c)} has no parent path {list(c[:-1])}")
        if c[-1] > 0 and (*c[:-1], c[-1] - 1) not in have:
            raise SpecError(f"tree choice {list(c)} skips sibling rank {c[-1] - 1}")


def _header(table: PolicyTable, engine: str, notes: Sequence[str], prefix: str) -> str:
    lines = [
        f"spectune export --engine {engine}: {table.target} + {table.drafter} on "
        f"{table.hardware} (tp {table.tp}), workload {table.workload or '-'}",
    ]
    if notes:
        lines.append("approximations:")
        lines += [f"  - {n}" for n in notes]
    else:
        lines.append("approximations: none (the engine expresses this table exactly)")
    return "".join(f"{prefix}{line}\n" for line in lines)


def _sidecar(table: PolicyTable, engine: str, notes: Sequence[str], config: Any) -> str:
    meta = {
        "schema": "spectune.export/v1",
        "engine": engine,
        "source": {
            "target": table.target,
            "drafter": table.drafter,
            "hardware": table.hardware,
            "tp": table.tp,
            "workload": table.workload,
        },
        "approximations": list(notes),
        "config": config,
    }
    return json.dumps(meta, indent=2) + "\n"


def _engine_shape(
    rows: Sequence[Bucket],
    p: TreePolicy,
    evaluate: Evaluate | None,
    engine: str,
    *,
    cap_by_first: bool = False,
) -> tuple[EngineShape, list[str]]:
    """One global tree shape and a depth per batch range, fitted with the objective when there
    is one, else the smallest-batch policy's shape; plus notes on what that gives up."""
    notes: list[str] = []
    if evaluate is not None:
        shape, loss = fit_engine_shape(rows, evaluate, cap_by_first=cap_by_first)
        kind = "chains" if shape.topk == 1 else f"top-k {shape.topk}, {shape.budget} tree tokens"
        notes.append(
            f"{engine} varies only the draft depth with the batch size: fitted one shape for "
            f"all batch sizes ({kind}; depths "
            + ", ".join(f"{_rng(b)}: {d}" for b, d in zip(rows, shape.depths, strict=True))
            + f") among the buckets' own shapes and chains; predicted tokens/s "
            f"{100 * (math.exp(loss) - 1):+.1f}% vs the per-bucket plan (geometric mean)"
        )
        # the fitted shape replaces the smallest-batch one: keep only the prune/graft notes
        notes += [n for n in _global_shape_notes(rows, p, engine) if "one top-k" not in n]
    else:
        depths = [0 if b.policy is None else b.policy.depth for b in rows]
        shape = EngineShape(p.topk, p.budget, tuple(depths))
        notes += _global_shape_notes(rows, p, engine)
    if any(b.policy is not None and b.policy.builder == "static" for b in rows):
        notes.append(
            f"{engine} grows EAGLE-2 dynamic top-k trees; static-builder buckets are "
            "approximated by top-k and tree tokens"
        )
    return shape, notes


# ---- SGLang -----------------------------------------------------------------------------------


def check_sglang(args: Mapping[str, Any], adaptive: Mapping[str, Any] | None) -> None:
    """SGLang's rules for EAGLE arguments and the adaptive config."""
    steps = args["speculative_num_steps"]
    topk = args["speculative_eagle_topk"]
    tokens = args["speculative_num_draft_tokens"]
    if steps < 1 or topk < 1 or tokens < 2:
        raise SpecError("sglang: steps and top-k must be >= 1 and num_draft_tokens >= 2")
    if topk == 1 and tokens != steps + 1:
        raise SpecError(
            f"sglang: with --speculative-eagle-topk 1, --speculative-num-draft-tokens must be "
            f"steps + 1 = {steps + 1}, got {tokens}"
        )
    if tokens - 1 > topk + (steps - 1) * topk * topk:
        raise SpecError(
            f"sglang: {tokens - 1} draft tokens exceed what {steps} steps of top-k {topk} draft"
        )
    if adaptive is None:
        return
    keys = [k for k in adaptive if k != "strategy"]
    if "1" not in keys:
        raise SpecError(
            "sglang adaptive config: keys are batch-size lower bounds and must include '1'"
        )
    for k in keys:
        if not k.isdigit() or int(k) < 1:
            raise SpecError(f"sglang adaptive config: key {k!r} is not a batch size >= 1")
        cand = adaptive[k].get("candidate_steps")
        if not isinstance(cand, list) or not cand or cand != sorted(set(cand)):
            raise SpecError(
                f"sglang adaptive config[{k}]: candidate_steps must be a sorted non-empty list"
            )
        if min(cand) < 0 or max(cand) > steps:
            raise SpecError(
                f"sglang adaptive config[{k}]: candidate_steps must lie in 0..{steps} "
                f"(--speculative-num-steps), got {cand}"
            )


def export_sglang(
    table: PolicyTable, *, context: int | None = None, evaluate: Evaluate | None = None
) -> Export:
    rows, notes = batch_plan(table, context)
    p = primary_policy(rows)
    if p is None:
        notes.append(
            "speculation is off for every batch size: run SGLang without --speculative-algorithm"
        )
        text = _header(table, "sglang", notes, "# ") + "# (no speculative arguments)\n"
        return Export(
            "sglang",
            {"sglang_args.txt": text, "sglang.spectune.json": _sidecar(table, "sglang", notes, {})},
            tuple(notes),
        )
    shape, shape_notes = _engine_shape(rows, p, evaluate, "sglang")
    notes += shape_notes
    steps = max(shape.depths)
    if steps == 0:  # the fit turned every range off
        return export_sglang(_all_off(table), context=context)
    topk = shape.topk
    tokens = steps + 1 if topk == 1 else shape.budget
    if topk == 1 and shape.budget not in (0, steps + 1):
        notes.append(f"top-k 1 forces num_draft_tokens = steps + 1 = {steps + 1}")
    adaptive: dict[str, Any] = {"strategy": "ema"}
    for b, d in zip(rows, shape.depths, strict=True):
        adaptive[str(b.batch[0])] = {"candidate_steps": [d]}
    varying = len({d for d in shape.depths})
    args = {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": table.drafter,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": tokens,
    }
    use_adaptive = varying > 1
    check_sglang(args, adaptive if use_adaptive else None)
    argv = [f"--{k.replace('_', '-')} {v}" for k, v in args.items()]
    if use_adaptive:
        argv += ["--speculative-adaptive", "--speculative-adaptive-config sglang_adaptive.json"]
        notes.append(
            "adaptive mode: one candidate step count per batch range, so the EMA "
            "controller keeps the planned depth (0 = off)"
        )
    text = _header(table, "sglang", notes, "# ") + " \\\n  ".join(argv) + "\n"
    files = {"sglang_args.txt": text}
    if use_adaptive:
        files["sglang_adaptive.json"] = json.dumps(adaptive, indent=2) + "\n"
    config = {"server_args": args, "adaptive": adaptive if use_adaptive else None}
    files["sglang.spectune.json"] = _sidecar(table, "sglang", notes, config)
    return Export("sglang", files, tuple(notes), config)


def _all_off(table: PolicyTable) -> PolicyTable:
    return replace(table, buckets=tuple(replace(b, policy=None) for b in table.buckets))


# ---- vLLM ------------------------------------------------------------------------------------


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
                f"{_rng(b)}: {b.predicted.tokens_per_s:.0f} -> "
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
                "vllm.spectune.json": _sidecar(table, "vllm", notes, None),
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
        notes += _global_shape_notes(rows, p, "vllm static tree")
    check_vllm(cfg, choices)
    files = {
        "vllm_speculative_config.json": json.dumps(cfg, indent=2) + "\n",
        "vllm.spectune.json": _sidecar(table, "vllm", notes, cfg),
    }
    return Export("vllm", files, tuple(notes), cfg)


# ---- TensorRT-LLM ------------------------------------------------------------------------------


def check_trtllm(cfg: Mapping[str, Any]) -> None:
    """TensorRT-LLM's rules for an Eagle3 speculative_config."""
    d = cfg["max_draft_len"]
    if d < 1:
        raise SpecError("trtllm: max_draft_len must be > 0 for Eagle")
    sched = cfg.get("draft_len_schedule")
    if sched:
        if min(sched) < 1 or min(sched.values()) < 0:
            raise SpecError("trtllm: draft_len_schedule keys must be >= 1 and values >= 0")
        if 1 not in sched:
            raise SpecError("trtllm: draft_len_schedule must include batch size 1")
        if sched[min(sched)] != d:
            raise SpecError(
                f"trtllm: draft_len_schedule[{min(sched)}] must equal max_draft_len {d}"
            )
        if max(sched.values()) > d:
            raise SpecError(f"trtllm: draft_len_schedule values must be <= max_draft_len {d}")
    choices = cfg.get("eagle_choices")
    if choices is not None:
        if cfg.get("use_dynamic_tree"):
            raise SpecError("trtllm: eagle_choices and use_dynamic_tree are mutually exclusive")
        check_choices(choices)
        if max(len(c) for c in choices) != d:
            raise SpecError("trtllm: the deepest eagle_choices path must equal max_draft_len")
    if cfg.get("use_dynamic_tree"):
        k = cfg["dynamic_tree_max_topK"]
        t = cfg["max_total_draft_tokens"]
        if k < 1:
            raise SpecError("trtllm: dynamic_tree_max_topK must be >= 1")
        if not d <= t <= k * d:
            raise SpecError(
                f"trtllm: need max_draft_len ({d}) <= max_total_draft_tokens ({t}) <= "
                f"dynamic_tree_max_topK * max_draft_len ({k * d})"
            )


def export_trtllm(
    table: PolicyTable,
    *,
    context: int | None = None,
    static_tree: bool | None = None,
    shaper: TreeShaper | None = None,
    evaluate: Evaluate | None = None,
) -> Export:
    rows, notes = batch_plan(table, context)
    p = primary_policy(rows)
    if p is None:
        notes.append(
            "speculation is off for every batch size: run TensorRT-LLM without speculative_config"
        )
        text = _header(table, "trtllm", notes, "# ") + "{}\n"
        return Export("trtllm", {"trtllm_extra_llm_api_options.yaml": text}, tuple(notes))
    use_static = p.builder == "static" if static_tree is None else static_tree
    if use_static and shaper is None:
        notes.append("no tree shaper available for eagle_choices: exported a dynamic tree")
        use_static = False
    shape, shape_notes = _engine_shape(
        rows, p, None if use_static else evaluate, "trtllm", cap_by_first=True
    )
    notes += shape_notes
    if max(shape.depths) == 0:
        return export_trtllm(_all_off(table), context=context)
    depths = list(shape.depths)
    d_max = depths[0] if depths[0] > 0 else max(depths)
    if depths[0] == 0:
        notes.append(
            "batch 1 plans no speculation, but TensorRT-LLM maps the smallest schedule "
            f"key to max_draft_len: batch {_rng(rows[0])} speculates {d_max} tokens"
        )
    clamped = [f"{_rng(b)} ({d})" for b, d in zip(rows, depths, strict=True) if d > d_max]
    if clamped:
        notes.append(
            f"draft lengths above the batch-1 value {d_max} were cut to it: " + ", ".join(clamped)
        )
    sched_vals = [min(d, d_max) for d in depths]
    sched_vals[0] = d_max
    keys_vals: list[tuple[int, int]] = []
    for b, v in zip(rows, sched_vals, strict=True):
        if keys_vals and keys_vals[-1][1] == v:
            keys_vals[-1] = (b.batch[1], v)
        else:
            keys_vals.append((b.batch[1], v))
    schedule = dict(keys_vals)
    if 1 not in schedule:
        schedule = {1: sched_vals[0], **schedule}
    if keys_vals[-1][1] > 0:
        notes.append(
            f"batches above {keys_vals[-1][0]} get 0 draft tokens in TensorRT-LLM's "
            "draft_len_schedule (the table would keep the last bucket's policy)"
        )
    cfg: dict[str, Any] = {
        "decoding_type": "Eagle3",
        "speculative_model_dir": table.drafter,
        "max_draft_len": d_max,
    }
    if use_static:
        assert shaper is not None
        shape_policy = TreePolicy("static", d_max, p.topk, p.budget)
        choices = tree_choices(shaper(shape_policy))
        cfg["max_draft_len"] = max(len(c) for c in choices)
        schedule = {k: min(v, cfg["max_draft_len"]) for k, v in schedule.items()}
        schedule[1] = cfg["max_draft_len"]
        cfg["eagle_choices"] = choices
        notes.append(
            f"one static tree (eagle_choices, {len(choices)} draft tokens) for every "
            "batch size; TensorRT-LLM marks eagle_choices deprecated"
        )
    elif shape.topk > 1:
        t = min(max(shape.budget - 1, d_max), shape.topk * d_max)
        if t != shape.budget - 1:
            notes.append(
                f"max_total_draft_tokens {shape.budget - 1} moved to {t} to satisfy "
                "max_draft_len <= max_total_draft_tokens <= topK * max_draft_len"
            )
        cfg.update(
            use_dynamic_tree=True, dynamic_tree_max_topK=shape.topk, max_total_draft_tokens=t
        )
    cfg["draft_len_schedule"] = schedule
    check_trtllm(cfg)
    text = _header(table, "trtllm", notes, "# ") + to_yaml({"speculative_config": cfg})
    return Export("trtllm", {"trtllm_extra_llm_api_options.yaml": text}, tuple(notes), cfg)


def to_yaml(obj: Any, indent: int = 0) -> str:
    """A small YAML writer for nested mappings of scalars and lists (no dependency)."""
    pad = "  " * indent
    out = []
    for k, v in obj.items():
        if isinstance(v, Mapping):
            out.append(f"{pad}{k}:\n{to_yaml(v, indent + 1)}")
        else:
            out.append(f"{pad}{k}: {_yaml_scalar(v)}\n")
    return "".join(out)


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid YAML double-quoted scalar


def export_policy(
    table: PolicyTable,
    engine: str,
    *,
    context: int | None = None,
    vllm_tree: bool = False,
    trtllm_static_tree: bool | None = None,
    shaper: TreeShaper | None = None,
    evaluate: Evaluate | None = None,
) -> Export:
    """Export a table for one engine. `evaluate` (the planner's objective) lets engines with
    one global tree shape get the shape that loses least; without it they take the
    smallest-batch bucket's shape."""
    if engine == "sglang":
        return export_sglang(table, context=context, evaluate=evaluate)
    if engine == "vllm":
        return export_vllm(table, context=context, tree=vllm_tree, shaper=shaper)
    if engine == "trtllm":
        return export_trtllm(
            table,
            context=context,
            static_tree=trtllm_static_tree,
            shaper=shaper,
            evaluate=evaluate,
        )
    raise SpecError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
