"""Shared parts of the engine exporters: the Export result, choosing the batch ranges of one
context, fitting the one global tree shape engines allow, tree paths ('choices'), the model
paths engines load (Hugging Face repo ids of the presets, or the user's overrides), the launch
script written beside each config, and the metadata every exported file carries."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from spectune.specs.engine import EngineProfile
from spectune.specs.errors import SpecError
from spectune.specs.io import write_text_atomic
from spectune.specs.model import ModelSpec, load_model
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy
from spectune.specs.tree import DraftTree

ENGINES = ("sglang", "vllm", "trtllm")
HERE = "{here}"
"""Stands for the export folder in an Export's launch argv: the launch script writes "$HERE"
(its own folder, resolved at run time), so config files next to it are found from any cwd."""

TreeShaper = Callable[[TreePolicy], DraftTree]
"""Builds the static tree an engine with a fixed tree should use for a policy."""


@dataclass(frozen=True)
class Export:
    """Files for one engine (name -> text), what could not be expressed exactly, the resolved
    config, and the launch command (argv; HERE stands for the export folder). The launch
    command is also one of the files (`launch_<engine>.sh`)."""

    engine: str
    files: Mapping[str, str]
    approximations: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    launch: tuple[str, ...] = ()

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write every file atomically under out_dir (launch scripts executable); returns the
        paths."""
        out = Path(out_dir)
        paths = []
        for name, text in self.files.items():
            p = out / name
            write_text_atomic(p, text)
            if name.endswith(".sh"):
                p.chmod(p.stat().st_mode | 0o111)
            paths.append(p)
        return paths

    def argv(self, here: str | Path) -> list[str]:
        """The launch command with HERE replaced by the folder the files were written to."""
        return [a.replace(HERE, str(here)) for a in self.launch]


@dataclass(frozen=True)
class ModelPaths:
    """What the engine loads: the target and the drafter (Hugging Face repo id or a local
    path), and the drafter's kind (specs.engine.DRAFTERS)."""

    target: str
    drafter: str
    drafter_kind: str


def _hf_repo(name: str, what: str, flag: str) -> tuple[str, ModelSpec | None]:
    try:
        spec = load_model(name)
    except (SpecError, OSError) as e:
        raise SpecError(
            f"cannot find the {what} {name!r} of the policy file ({e}); pass {flag}"
        ) from None
    if not spec.hf_repo:
        raise SpecError(
            f"the {what} {name!r} names no Hugging Face repo (ModelSpec.hf_repo); pass {flag} "
            "with a repo id or a local checkpoint folder"
        )
    return spec.hf_repo, spec


def model_paths(
    table: PolicyTable, model_path: str | None = None, draft_model_path: str | None = None
) -> ModelPaths:
    """The target and drafter checkpoints an engine loads: the user's overrides, else the
    Hugging Face repo ids of the table's model presets (never a spectune preset name, which no
    engine can load). The drafter's kind comes from its ModelSpec (an EAGLE-3 head, or a
    draft model), 'eagle3' when only an override path is known."""
    target = model_path or _hf_repo(table.target, "target", "--model-path")[0]
    kind = "eagle3"
    try:
        dspec: ModelSpec | None = load_model(table.drafter)
    except (SpecError, OSError):
        dspec = None
    if dspec is not None:
        kind = "eagle3" if dspec.is_draft_head else "draft-model"
    drafter = draft_model_path or _hf_repo(table.drafter, "drafter", "--draft-model-path")[0]
    return ModelPaths(target, drafter, kind)


def max_batch(rows: Sequence[Bucket]) -> int:
    """The largest batch the plan covers: the engine's max running requests / batch size."""
    return max(b.batch[1] for b in rows)


def launch_script(argv: Sequence[str], header_text: str) -> str:
    """A bash script that runs `argv` from any directory (HERE -> its own folder)."""

    def quote(a: str) -> str:
        if HERE in a:
            return '"' + a.replace(HERE, "$HERE") + '"'
        return shlex.quote(a)

    words: list[list[str]] = []
    for a in argv:
        if not words or a.startswith("--"):
            words.append([quote(a)])
        else:
            words[-1].append(quote(a))
    lines = [
        "#!/usr/bin/env bash",
        header_text.rstrip("\n"),
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "exec " + " \\\n  ".join(" ".join(w) for w in words),
    ]
    return "\n".join(lines) + "\n"


# ---- shared helpers ---------------------------------------------------------------------------


def batch_plan(table: PolicyTable, context: int | None = None) -> tuple[list[Bucket], list[str]]:
    """The buckets of one context range, in batch order, and notes on what that drops. A
    shared verify budget (ECHO super-tree) is in no engine: its buckets come back with the
    per-request equivalent (same builder, depth, top-k, budget) and a note says so. Engines
    verify token by token only (greedy at temperature 0, recursive rejection above) and draft
    top-k trees: a bucket planned with another rule or with delayed i.i.d. rollouts comes back
    with its token-level top-k equivalent (`token_level`) and a note says so."""
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
    for a, b in pairwise(rows):
        if b.batch[0] != a.batch[1] + 1:
            raise SpecError(f"batch buckets {a.batch} and {b.batch} leave a gap or overlap")
    notes = []
    shared = [b for b in rows if b.policy is not None and b.policy.shared_budget]
    if shared:
        notes.append(
            "no engine shares one verify budget across the batch (ECHO super-tree): exported "
            "the per-request budget (same depth, top-k and budget per sequence) for buckets "
            + ", ".join(range_label(b) for b in shared)
        )
        rows = [per_request(b) for b in rows]
    ruled = [b for b in rows if b.policy is not None and b.policy.verify != "token"]
    if ruled:
        notes.append(
            "SGLang, vLLM and TensorRT-LLM verify token by token (greedy at temperature 0, "
            "recursive rejection sampling above); exported the token-level rule for buckets "
            + ", ".join(f"{range_label(b)} (planned {b.policy.verify})" for b in ruled if b.policy)
            + ": their predicted accepted lengths do not hold there"
        )
    delayed = [b for b in rows if b.policy is not None and b.policy.builder == "delayed"]
    if delayed:
        notes.append(
            "no engine drafts i.i.d. rollouts (delayed expansion): exported a dynamic top-k "
            "tree of the same depth, top-k and budget for buckets "
            + ", ".join(range_label(b) for b in delayed)
            + " (spectune's executor runs the planned policy)"
        )
    rows = [token_level(b) for b in rows]
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


def per_request(b: Bucket) -> Bucket:
    """The bucket with its policy's shared verify budget (ECHO) turned off."""
    if b.policy is None or not b.policy.shared_budget:
        return b
    return replace(b, policy=replace(b.policy, shared_budget=False))


def token_level(b: Bucket) -> Bucket:
    """The bucket with the 'token' rule and, for a delayed policy, the dynamic top-k tree of
    the same depth, top-k and budget (what serving engines run)."""
    p = b.policy
    if p is None or (p.verify == "token" and p.builder != "delayed"):
        return b
    if p.builder == "delayed":
        budget = min(p.budget, 1 + p.topk + (p.depth - 1) * p.topk * p.topk)
        if p.topk == 1:
            budget = p.depth + 1
        return replace(b, policy=TreePolicy("dynamic-topk", p.depth, p.topk, max(2, budget)))
    return replace(b, policy=replace(p, verify="token"))


def primary_policy(rows: Sequence[Bucket]) -> TreePolicy | None:
    """The policy whose tree shape fills the engine's global knobs: the smallest batch with
    speculation on (where the tree matters most)."""
    for b in rows:
        if b.policy is not None:
            return b.policy
    return None


Evaluate = Callable[[TreePolicy | None, int, int], float]
"""tokens/s of a policy at (batch, context): the planner's objective, to choose engine knobs for
a table not planned for the engine (planner.engine_plan.fit_table)."""


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


def range_label(b: Bucket) -> str:
    return f"{b.batch[0]}-{b.batch[1]}"


def shape_notes(rows: Sequence[Bucket], p: TreePolicy, what: str) -> list[str]:
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
                f"{range_label(b)} (top-k {b.policy.topk}, budget {b.policy.budget})"
                for b in other
                if b.policy is not None
            )
            + " wanted others"
        )
    pruned = [b for b in rows if b.policy is not None and b.policy.prune_threshold > 0]
    if pruned:
        notes.append(
            f"{what} has no confidence pruning: dropped prune thresholds of buckets "
            + ", ".join(range_label(b) for b in pruned)
        )
    grafted = [b for b in rows if b.policy is not None and b.policy.graft_budget > 0]
    if grafted:
        notes.append(
            f"{what} cannot graft retrieved tokens into the tree: dropped graft budgets of "
            "buckets " + ", ".join(range_label(b) for b in grafted)
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


def header(table: PolicyTable, profile: EngineProfile, notes: Sequence[str], prefix: str) -> str:
    lines = [
        f"spectune export --engine {profile.name}: {table.target} + {table.drafter} on "
        f"{table.hardware} (tp {table.tp}), workload {table.workload or '-'}",
        f"engine: {profile.engine} {profile.versions} (rules read at {profile.read_at})",
    ]
    if notes:
        lines.append("approximations:")
        lines += [f"  - {n}" for n in notes]
    else:
        lines.append("approximations: none (the engine expresses this table exactly)")
    return "".join(f"{prefix}{line}\n" for line in lines)


def sidecar(
    table: PolicyTable,
    profile: EngineProfile,
    notes: Sequence[str],
    config: Any,
    launch: Sequence[str] = (),
) -> str:
    meta = {
        "schema": "spectune.export/v1",
        "engine": profile.engine,
        "profile": profile.name,
        "versions": profile.versions,
        "launch": list(launch),
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


def engine_shape(
    rows: Sequence[Bucket], p: TreePolicy, engine: str
) -> tuple[EngineShape, list[str]]:
    """The one global tree shape (`p`'s top-k and tree tokens) and each range's draft depth as
    the table writes it, for engines that vary only the draft depth with the batch size; plus
    notes on what that gives up where the table's buckets want other shapes (a table not
    planned for the engine; planner.engine_plan.fit_table chooses by the objective)."""
    depths = [0 if b.policy is None else b.policy.depth for b in rows]
    shape = EngineShape(p.topk, p.budget, tuple(depths))
    notes = shape_notes(rows, p, engine)
    if any(b.policy is not None and b.policy.builder == "static" for b in rows):
        notes.append(
            f"{engine} grows EAGLE-2 dynamic top-k trees; static-builder buckets are "
            "approximated by top-k and tree tokens"
        )
    return shape, notes


def all_off(table: PolicyTable) -> PolicyTable:
    return replace(table, buckets=tuple(replace(b, policy=None) for b in table.buckets))
