"""SGLang: `python -m sglang.launch_server` arguments and, for a per-batch draft length, the
adaptive config (keys: batch-size lower bounds; candidate_steps; 0 = off).

SGLang runs its adaptive schedule only with top-k 1 (with top-k > 1 it warns and falls back to
static parameters), forces num_draft_tokens = steps + 1 with top-k 1, requires
--speculative-num-steps to be one of the adaptive candidates, resets max running requests to 48
when speculation is on and none is set, and routes a batch to its adaptive slot after padding it
to the CUDA-graph batch size. The export therefore runs either one static (steps, top-k, draft
tokens) for every batch, or adaptive chains; it always sets --tp-size, --max-running-requests
(the plan's largest batch) and --cuda-graph-max-bs-decode, and says where SGLang's padding moves
a batch into the next range.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spectune.planner.export.base import (
    HERE,
    Export,
    ModelPaths,
    batch_plan,
    header,
    launch_script,
    max_batch,
    model_paths,
    range_label,
    shape_notes,
    sidecar,
)
from spectune.planner.space import check_engine_drafter, check_engine_policy, engine_policy
from spectune.specs.engine import EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy

ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE", "mtp": "NEXTN", "draft-model": "STANDALONE"}
ADAPTIVE_FILE = "sglang_adaptive.json"


def check_sglang(args: Mapping[str, Any], adaptive: Mapping[str, Any] | None) -> None:
    """SGLang's rules for EAGLE arguments and the adaptive config (0.5.23)."""
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
    if topk != 1:
        raise SpecError(
            f"sglang runs --speculative-adaptive only with --speculative-eagle-topk 1 (with "
            f"{topk} it warns and falls back to static parameters)"
        )
    keys = list(adaptive)
    if "1" not in keys:
        raise SpecError(
            "sglang adaptive config: keys are batch-size lower bounds and must include '1'"
        )
    cands: set[int] = set()
    for k in keys:
        if not k.isdigit() or int(k) < 1:
            raise SpecError(
                f"sglang adaptive config: key {k!r} is not a batch size >= 1 (SGLang skips it)"
            )
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
        cands.update(cand)
    if steps not in cands:
        raise SpecError(
            f"sglang: --speculative-num-steps {steps} must be one of the adaptive candidate "
            f"steps {sorted(cands)}"
        )


def graph_batches(profile: EngineProfile, max_bs: int) -> list[int]:
    """The decode CUDA-graph batch sizes SGLang captures with speculation on and a max batch
    of `max_bs` (the profile's list cut at max_bs, plus max_bs)."""
    out = [b for b in profile.cuda_graph_batches if b <= max_bs]
    if not out or out[-1] != max_bs:
        out.append(max_bs)
    return out


def adaptive_routing(rows: Sequence[Bucket], graphs: Sequence[int]) -> list[tuple[int, int, int]]:
    """Where SGLang's adaptive routing differs from the plan: (batch, planned range index,
    routed range index) for each batch whose CUDA-graph padding lands in a later range."""
    los = [b.batch[0] for b in rows]
    out = []
    for i, b in enumerate(rows):
        for x in range(b.batch[0], b.batch[1] + 1):
            padded = next((g for g in graphs if g >= x), x)
            j = max(k for k, lo in enumerate(los) if lo <= padded)
            if j != i:
                out.append((x, i, j))
    return out


def _choose(
    rows: Sequence[Bucket], policies: Sequence[TreePolicy | None], notes: list[str]
) -> tuple[TreePolicy | None, list[int] | None]:
    """What SGLang runs for the table as written: one static policy for every batch (second
    item None), or chains with a draft length per range (first item the chain of the largest
    length). A table whose trees vary with the batch size (not planned for SGLang, and no
    objective to fit it with, planner.engine_plan.fit_table) runs its recorded best chains, or
    else the first tree for every batch, and a note says so."""
    on = [p for p in policies if p is not None]
    if len(set(policies)) == 1:
        return on[0], None
    if all(p.topk == 1 for p in on):
        depths = [0 if p is None else p.depth for p in policies]
        return TreePolicy("dynamic-topk", max(depths), 1, max(depths) + 1), depths
    if all(b.chain is not None for b in rows):
        depths = [
            0 if p is None else p.depth if p.topk == 1 else _chain_len(b)
            for b, p in zip(rows, policies, strict=True)
        ]
        notes.append(
            "sglang runs a per-batch schedule only with top-k 1: tree buckets use their best "
            "chain (recorded by the planner) so the draft length can follow the batch size"
        )
        m = max(depths)
        return (TreePolicy("dynamic-topk", m, 1, m + 1) if m else None), depths
    first = on[0]
    notes.append(
        "sglang runs a per-batch schedule only with top-k 1 and the policy file records no "
        f"chains: one static setting ({first.label}) for every batch size"
    )
    return first, None


def _chain_len(b: Bucket) -> int:
    assert b.chain is not None
    return b.chain.draft_tokens


def export_sglang(
    table: PolicyTable,
    *,
    context: int | None = None,
    notes: Sequence[str] = (),
    profile: EngineProfile | str = "sglang",
    model_path: str | None = None,
    draft_model_path: str | None = None,
) -> Export:
    """`notes`: what was given up before (export_policy's fit), first in the list."""
    prof = load_engine(profile)
    rows, more = batch_plan(table, context)
    notes = [*notes, *more]
    paths = model_paths(table, model_path, draft_model_path)
    check_engine_drafter(paths.drafter_kind, prof)
    m = max_batch(rows)
    for b in rows:
        check_engine_policy(b.policy, prof)
    policies = [engine_policy(b.policy, prof) for b in rows]
    first = next((b.policy for b in rows if b.policy is not None), None)
    if first is not None:
        notes += [n for n in shape_notes(rows, first, "sglang") if "one top-k" not in n]
        if any(b.policy is not None and b.policy.builder == "static" for b in rows):
            notes.append(
                "sglang grows EAGLE-2 dynamic top-k trees; static-builder buckets are "
                "approximated by top-k and tree tokens"
            )
    static, depths = (None, None) if first is None else _choose(rows, policies, notes)
    graph_max = min(m, prof.cuda_graph_max_batch) if prof.cuda_graph_max_batch else m
    argv = ["python", "-m", "sglang.launch_server", "--model-path", paths.target]
    argv += ["--tp-size", str(table.tp), "--max-running-requests", str(m)]
    adaptive: dict[str, Any] | None = None
    args: dict[str, Any] = {}
    if static is None:
        notes.append(
            "speculation is off for every batch size: SGLang runs without --speculative-algorithm"
        )
    else:
        args = _spec_args(paths, static)
        if depths is not None:
            adaptive = {
                str(b.batch[0]): {"candidate_steps": [d]} for b, d in zip(rows, depths, strict=True)
            }
            _routing_notes(rows, graph_batches(prof, graph_max), notes)
        check_sglang(args, adaptive)
        for k, v in args.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        argv += ["--cuda-graph-max-bs-decode", str(graph_max)]
        if adaptive is not None:
            argv += ["--speculative-adaptive", "--speculative-adaptive-config"]
            argv.append(f"{HERE}/{ADAPTIVE_FILE}")
    if graph_max < m:
        notes.append(
            f"batches {graph_max + 1}-{m} run without CUDA graphs (SGLang captures decode "
            f"graphs up to {graph_max} on this GPU class)"
        )
    config = {
        "server_args": args,
        "adaptive": adaptive,
        "tp_size": table.tp,
        "max_running_requests": m,
        "cuda_graph_max_bs_decode": graph_max if args else None,
    }
    head = header(table, prof, notes, "# ")
    files = {"launch_sglang.sh": launch_script(argv, head)}
    if adaptive is not None:
        files[ADAPTIVE_FILE] = json.dumps(adaptive, indent=2) + "\n"
    files["sglang.spectune.json"] = sidecar(table, prof, notes, config, argv)
    return Export("sglang", files, tuple(notes), config, tuple(argv))


def _spec_args(paths: ModelPaths, p: TreePolicy) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if paths.drafter_kind == "ngram":
        args["speculative_algorithm"] = "NGRAM"
    else:
        args["speculative_algorithm"] = ALGORITHMS[paths.drafter_kind]
        args["speculative_draft_model_path"] = paths.drafter
    args["speculative_num_steps"] = p.depth
    args["speculative_eagle_topk"] = p.topk
    args["speculative_num_draft_tokens"] = p.depth + 1 if p.topk == 1 else p.budget
    return args


def _routing_notes(rows: Sequence[Bucket], graphs: Sequence[int], notes: list[str]) -> None:
    moved = adaptive_routing(rows, graphs)
    if not moved:
        return
    spans: dict[tuple[int, int], list[int]] = {}
    for x, i, j in moved:
        spans.setdefault((i, j), []).append(x)
    notes.append(
        "SGLang pads a batch to its CUDA-graph batch size before choosing the adaptive slot: "
        + "; ".join(
            f"batches {min(xs)}-{max(xs)} run range {range_label(rows[j])}'s draft length"
            for (i, j), xs in sorted(spans.items())
        )
    )


__all__ = ["ADAPTIVE_FILE", "adaptive_routing", "check_sglang", "export_sglang", "graph_batches"]
