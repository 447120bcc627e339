"""How `spectune plan` reports a plan: notes collapsed by kind, the legend of the policy
notation, the deployment per engine (planner.deploy), and the rows of --csv / --plot.

The table itself is cli.plan.print_table; this module holds what comes after it, so the search
side of `spectune plan` and its report change independently.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spectune.planner.deploy import BatchWeights, Deployment, deployment
from spectune.planner.search import BucketResult
from spectune.planner.tokens_per_s import SERVED
from spectune.specs import PolicyTable, SpecError
from spectune.specs.policy import policy_label

DEPLOY_ENGINES = ("sglang", "vllm", "trtllm")
"""The engines a plan for spectune's own executor is deployed to."""

LEGEND = """\
policy notation: BUILDER:DEPTH,TOPK,BUDGET[,PRUNE,GRAFT][,echo]; off = no speculation
  dynamic-topk:7,6,32   EAGLE-2 dynamic tree: 7 draft steps, the top 6 children of each node
                        expanded per step, the best 32 tree tokens per sequence verified
                        (root included)
  static:2,9,30,0,29    Sequoia's static tree shape for depth 2, top-k 9 and 30 tree tokens;
                        then prune threshold 0 (no pruning) and up to 29 slots grafted with
                        retrieved tokens
  ...,echo              ECHO: the batch shares one verify budget of batch x (BUDGET - 1) drafts
  ...,hier6             hierarchical (--intermediate): the intermediate model verifies the tree
                        round after round until it holds >= 6 tokens; the target verifies that
                        chain (no engine runs it)
  5/4/8                 an engine config as steps/top-k/draft tokens: SGLang's default
                        (EAGLE's is 7/10/60); chain N: N draft tokens, top-k 1"""


def hierarchy_lines(results: Sequence[BucketResult]) -> list[str]:
    """Where the search drew hierarchical policies (--intermediate): how many buckets chose
    one and, for each, its predicted gain over the best flat policy (no intermediate)."""
    rows = [r for r in results if r.flat is not None]
    if not rows:
        return []
    hier = [r for r in rows if r.policy is not None and r.policy.chain]
    out = [
        f"hierarchical policies chosen in {len(hier)} of {len(rows)} buckets (elsewhere none "
        "beat the best flat policy by --min-gain)" + (":" if hier else "")
    ]
    for r in hier:
        assert r.flat is not None
        out.append(
            f"  batch {format_range(r.bucket.batch):>7} context {format_range(r.bucket.context)}: "
            f"{policy_label(r.policy)} {r.tokens_per_s / r.flat[1] - 1:+.1%} over the best flat, "
            f"{policy_label(r.flat[0])} ({r.flat[1]:.0f} {SERVED.label})"
        )
    return out


def hierarchy_provenance(results: Sequence[BucketResult]) -> dict[str, Any]:
    """What a policy file records of the comparison with flat policies (--intermediate): per
    bucket the best flat policy, its tokens/s and the chosen policy's gain over it."""
    rows = []
    for r in results:
        if r.flat is None:
            continue
        rows.append(
            {
                "batch": list(r.bucket.batch),
                "context": list(r.bucket.context),
                "policy": policy_label(r.policy),
                "best_flat": policy_label(r.flat[0]),
                "best_flat_tokens_per_s": round(r.flat[1], 3),
                "gain_over_flat": round(r.tokens_per_s / r.flat[1] - 1, 4),
            }
        )
    return {"flat_comparison": rows} if rows else {}


def batch_weights_type(text: str) -> list[tuple[int, float]]:
    """argparse type of --batch-weights: 'BATCH:WEIGHT,...' (e.g. 1:0.2,8:0.5,64:0.3), batch
    sizes 1..65536 listed once, weights finite and >= 0 with a positive sum (normalised)."""
    import math

    pairs: list[tuple[int, float]] = []
    parts = [p.strip() for p in text.split(",") if p.strip()]
    why = ""
    if not parts or len(parts) > 64:
        why = "1 to 64 BATCH:WEIGHT pairs"
    for part in parts if not why else ():
        b, sep, w = part.partition(":")
        try:
            batch, weight = int(b), float(w)
        except ValueError:
            why = f"BATCH:WEIGHT pairs, got {part[:20]!r}"
            break
        if not sep or not 1 <= batch <= 1 << 16 or not math.isfinite(weight) or weight < 0:
            why = f"batch in 1..65536 and a finite weight >= 0, got {part[:20]!r}"
            break
        pairs.append((batch, min(weight, 1e30)))
    if not why and len({b for b, _ in pairs}) != len(pairs):
        why = "each batch size once"
    if not why and not sum(w for _, w in pairs) > 0:
        why = "weights with a positive sum"
    if why:
        raise argparse.ArgumentTypeError(f"expected {why} (e.g. 1:0.2,8:0.5,64:0.3)")
    return pairs


def batch_weights(args: argparse.Namespace, max_batch: int, workload: Any) -> BatchWeights:
    """--batch-weights, else the workload's own distribution (Workload.batch_weights, when it
    has one), else equal weights on the powers of two up to the plan's largest batch."""
    if args.batch_weights:
        return BatchWeights.of(args.batch_weights, "--batch-weights")
    own = workload.batch_weights
    if own:
        pairs = [(int(b), float(w)) for b, w in own]
        return BatchWeights.of(pairs, f"workload {workload.name}")
    return BatchWeights.uniform(max_batch)


def format_range(r: tuple[int, int]) -> str:
    """'8' or '5-8': an inclusive range of the table."""
    return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"


# ---- notes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """One note of the plan: the buckets it is about, its kind and its text."""

    where: str
    kind: str
    text: str


def note_kind(text: str) -> str:
    """The kind of a note: 'kept NAME' (a reference kept under --min-gain), 'kv cap', or the
    note's text up to its first ':' or ';'."""
    if text.startswith("the KV cache holds"):
        return "kv cap"
    m = re.match(r"([^:;]+)", text)
    return (m.group(1) if m else text).strip()


def bucket_notes(results: Sequence[BucketResult], kv_notes: dict[int, str]) -> list[Note]:
    """Every note of the plan, in table order; kv_notes: result index -> KV-cap note."""
    out = []
    for i, r in enumerate(results):
        where = f"batch {format_range(r.bucket.batch)} context {format_range(r.bucket.context)}"
        if r.note:
            out.append(Note(where, note_kind(r.note), r.note))
        if i in kv_notes:
            out.append(Note(where, "kv cap", kv_notes[i]))
    return out


def summarize_notes(notes: Sequence[Note], min_gain: float) -> list[str]:
    """One line per kind of note, with its count (the order of first appearance)."""
    kinds: dict[str, list[Note]] = {}
    for n in notes:
        kinds.setdefault(n.kind, []).append(n)
    lines = []
    for kind, group in kinds.items():
        count = f"{len(group)} bucket{'s' * (len(group) != 1)}"
        if kind.startswith("kept ") and kind != "kept the per-request budget":
            gains = [
                float(g) for n in group for g in re.findall(r"([+-]\d+(?:\.\d+)?)%", n.text)[:1]
            ]
            span = f"{min(gains):+.1f}% to {max(gains):+.1f}%" if gains else "less"
            lines.append(
                f"{kind} in {count}: the best searched policy was predicted {span} over it, "
                f">= {100 * min_gain:.0f}% required (--min-gain)"
            )
        elif kind == "kv cap":
            caps = sorted(
                {
                    m
                    for n in group
                    for m in re.findall(r"holds (\d+ requests at context \d+)", n.text)
                }
            )
            lines.append(f"KV cache caps the batch in {count}: it holds {'; '.join(caps)}")
        else:
            lines.append(f"{group[0].text} ({count})")
    return lines


# ---- deployment -----------------------------------------------------------------------------


def deploy_engines(engine: str) -> tuple[str, ...]:
    """The engines to deploy to: the one planned for, else every exportable engine."""
    from spectune.specs.engine import load_engine

    return DEPLOY_ENGINES if load_engine(engine).engine == "spectune" else (engine,)


def deployments(
    table: PolicyTable, engines: Sequence[str], weights: BatchWeights
) -> list[Deployment | tuple[str, str]]:
    """Each engine's deployment, or (engine, why not) where the export refuses the plan; one
    line for all of them where the plan holds a hierarchical policy, which none runs."""
    hier = [b.policy for b in table.buckets if b.policy is not None and b.policy.chain]
    if hier:
        return [
            (
                ", ".join(engines),
                f"the plan holds hierarchical policies ({hier[0].label}"
                f"{f' and {len(hier) - 1} more' if len(hier) > 1 else ''}), and no serving "
                "engine runs an intermediate model stage (`spectune export` refuses them); "
                "plan without --intermediate for a deployable table",
            )
        ]
    out: list[Deployment | tuple[str, str]] = []
    for e in engines:
        try:
            out.append(deployment(table, e, weights))
        except (SpecError, OSError) as err:  # the export refuses the plan, or a file is gone
            out.append((e, str(err)))
    return out


def _runs_text(d: Deployment) -> str:
    def one(p: Any) -> str:
        if p is not None and p.topk == 1 and p.budget == p.depth + 1:
            return f"chain {p.depth}"
        return policy_label(p)

    return "; ".join(f"batch {format_range(r.batch)}: {one(r.policy)}" for r in d.runs)


def print_deployments(
    deps: Sequence[Deployment | tuple[str, str]],
    policy_file: str,
    weights: BatchWeights,
    out: Any,
    *,
    verbose: bool,
) -> None:
    """The deployment section: per engine what it runs, its config, its launch command and
    the predicted gain over its default config and over speculation off."""
    first = next((d for d in deps if isinstance(d, Deployment)), None)
    ctx = f" at context {first.context}" if first else ""
    print(
        f"\nDeploy ({SERVED.label}{ctx}, weighted by batch size: {weights.label}; "
        f"{weights.source})",
        file=out,
    )
    for d in deps:
        if not isinstance(d, Deployment):
            print(f"  {d[0]}: cannot deploy this plan: {d[1]}", file=out)
            continue
        e = d.export.engine
        default = (
            "no default config"
            if d.default is None
            else f"default {d.default.depth}/{d.default.topk}/{d.default.budget}"
        )
        gain_d = d.gain_vs_default
        vs_default = (
            f"{100 * gain_d:+.1f}% vs {d.profile}'s {default}"
            if gain_d is not None
            else f"{d.profile} has {default} (it requires one)"
        )
        print(f"  {d.profile}: {_runs_text(d)}", file=out)
        print(
            f"    predicted {d.mean_tokens_per_s:,.0f} {SERVED.label}: {vs_default}, "
            f"{100 * d.gain_vs_off:+.1f}% vs no speculation",
            file=out,
        )
        print(f"    config: {json.dumps(d.export.config, separators=(',', ':'))}", file=out)
        here = f"export-{e}"
        print(f"    launch: {shlex.join(d.export.argv(here))}", file=out)
        print(
            f"    files:  spectune export --engine {d.profile} {policy_file} --out {here}",
            file=out,
        )
        if d.export.approximations:
            if verbose:
                for a in d.export.approximations:
                    print(f"    approximation: {a}", file=out)
            else:
                n = len(d.export.approximations)
                print(f"    {n} approximation{'s' * (n != 1)} (--verbose lists them)", file=out)
        if verbose:
            for b, t, o, df in zip(
                d.weights.sizes,
                d.tokens_per_s,
                d.off_tokens_per_s,
                d.default_tokens_per_s or [None] * len(d.tokens_per_s),
                strict=True,
            ):
                extra = "" if df is None else f", default {df:,.0f}"
                print(f"    batch {b}: {t:,.0f} (off {o:,.0f}{extra})", file=out)


# ---- --csv and --plot -----------------------------------------------------------------------


def csv_rows(results: Sequence[BucketResult]) -> list[dict[str, Any]]:
    """One row per bucket: its ranges, policy, served tok/s and the ratios of the table."""
    key = SERVED.label.replace(" ", "_").replace("/", "_per_").replace(".", "")
    rows = []
    for r in results:
        name, dflt = r.best_default
        rows.append(
            {
                "batch_lo": r.bucket.batch[0],
                "batch_hi": r.bucket.batch[1],
                "context_lo": r.bucket.context[0],
                "context_hi": r.bucket.context[1],
                "policy": policy_label(r.policy),
                key: r.tokens_per_s,
                "off_" + key: r.off_tokens_per_s,
                "speedup_vs_off": r.speedup,
                "default": name,
                "speedup_vs_default": r.tokens_per_s / dflt,
                "chain_draft_tokens": None if r.chain is None else r.chain.draft_tokens,
                "note": r.note,
            }
        )
    return rows


def draw_plan(results: Sequence[BucketResult]) -> Any:
    """Served tok/s of each bucket (the geometric mean over its batch ends, as the table) at
    the geometric middle of its batch range, one line per context range, plan vs off."""

    def draw(ax: Any) -> None:
        ctxs = sorted({r.bucket.context for r in results})
        for i, c in enumerate(ctxs):
            rs = sorted((r for r in results if r.bucket.context == c), key=lambda r: r.bucket.batch)
            xs = [(r.bucket.batch[0] * r.bucket.batch[1]) ** 0.5 for r in rs]
            color = f"C{i % 10}"
            label = f"context {c[0]}-{c[1]}"
            ax.plot(xs, [r.tokens_per_s for r in rs], "o-", color=color, label=f"plan, {label}")
            ax.plot(
                xs,
                [r.off_tokens_per_s for r in rs],
                "--",
                color=color,
                alpha=0.6,
                label=f"off, {label}",
            )
        ax.set_xscale("log", base=2)

    return draw
