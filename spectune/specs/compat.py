"""Which drafters can run with which targets: one check for every place that pairs them.

A drafter is a draft head that reads the target's hidden states (EAGLE, EAGLE-3, Medusa, an MTP
module), a full draft model, or nothing (n-gram / prompt lookup, `None`). The rules:

- every head must match its target's width (`hidden`: it reads the target's hidden states) and
  vocabulary (`vocab`: it proposes target token ids; an EAGLE-3 head's reduced `draft_vocab`
  maps into that vocabulary and may be smaller);
- a draft model must share the target's tokenizer: the same `vocab` and, where both name one,
  the same `family`;
- an MTP module runs only with the target it was trained with (`base_model`);
- heads and draft models whose `family` is named must name the target's family;
- the target must be a full model, not a draft head.

`check_pair` raises one SpecError listing every mismatched field; `pair_problems` returns them
(the dashboards offer only drafters with none).

Hierarchical drafting (planner.hierarchical) adds an intermediate model between a tree drafter
and the target: `check_intermediate` applies the draft-model rules to (target, intermediate)
(a full model sharing the target's tokenizer: same `vocab`, same `family`) and the drafter
rules to (intermediate, its tree drafter). `PairWarning` is the warning category for
acceptance that does not belong to the pair it is applied to (specs.workload): the CLI's
--strict turns it into an error, which is why it is also a SpecError.
"""

from __future__ import annotations

import warnings

from spectune.specs.errors import SpecError
from spectune.specs.model import ModelSpec

HEAD_KINDS = ("eagle", "eagle3", "medusa", "mtp")


class PairWarning(UserWarning, SpecError):
    """Acceptance applied to a (drafter, target) pair it was not measured or fitted for."""


def drafter_kind(drafter: ModelSpec | None) -> str:
    """The kind acceptance presets key on; no model drafter is n-gram / prompt lookup."""
    return "ngram" if drafter is None else drafter.drafter_kind


def pair_problems(target: ModelSpec, drafter: ModelSpec | None) -> list[str]:
    """Every reason `drafter` cannot draft for `target` (empty: compatible)."""
    out: list[str] = []
    if target.is_head:
        out.append(
            f"target {target.name!r} is a draft head ({target.drafter_kind}); the target must "
            "be a full model"
        )
    if drafter is None:
        return out
    kind = drafter.drafter_kind
    if kind in HEAD_KINDS:
        if drafter.hidden != target.hidden:
            out.append(
                f"field 'hidden': the {kind} head has {drafter.hidden}, the target "
                f"{target.hidden} (a head reads the target's hidden states)"
            )
        if drafter.vocab != target.vocab:
            reduced = (
                f" (its reduced draft_vocab {drafter.draft_vocab} maps into those {drafter.vocab})"
                if drafter.draft_vocab
                else ""
            )
            out.append(
                f"field 'vocab': the {kind} head maps to {drafter.vocab} tokens, the target "
                f"has {target.vocab}{reduced}"
            )
    else:
        if drafter.vocab != target.vocab:
            out.append(
                f"field 'vocab': the draft model has {drafter.vocab} tokens, the target "
                f"{target.vocab} (a draft model must share the target's tokenizer and vocabulary)"
            )
    if drafter.family and target.family and drafter.family != target.family:
        out.append(
            f"field 'family': the drafter is {drafter.family!r}, the target {target.family!r} "
            "(different tokenizers)"
        )
    if kind == "mtp":
        if not drafter.base_model:
            out.append("field 'base_model': an MTP module must name the target it was trained with")
        elif drafter.base_model.lower() != target.name.lower():
            out.append(
                f"field 'base_model': the MTP module belongs to {drafter.base_model!r} and runs "
                f"only with its own target, not {target.name!r}"
            )
    return out


def check_pair(target: ModelSpec, drafter: ModelSpec | None) -> None:
    """SpecError naming every mismatched field when `drafter` cannot draft for `target`; a
    PairWarning when a head of the right shape was trained for another target."""
    problems = pair_problems(target, drafter)
    if problems:
        who = f"drafter {drafter.name!r}" if drafter is not None else "no drafter"
        raise SpecError(f"{who} cannot run with target {target.name!r}: " + "; ".join(problems))
    if drafter is None or not drafter.is_head or not drafter.base_model:
        return
    if drafter.base_model.lower() != target.name.lower():
        warnings.warn(
            f"drafter {drafter.name!r} is a {drafter.drafter_kind} head trained for "
            f"{drafter.base_model!r}; it fits {target.name!r} in shape, but not that target's "
            f"hidden states: the acceptance presets price a {drafter.drafter_kind} head trained "
            f"for {target.name!r}, not this one",
            PairWarning,
            stacklevel=2,
        )


def intermediate_problems(
    target: ModelSpec, intermediate: ModelSpec, drafter: ModelSpec | None
) -> list[str]:
    """Every reason `intermediate` cannot stand between `drafter` (growing the trees it
    verifies) and `target` (verifying its chains); empty: compatible."""
    out: list[str] = []
    if intermediate.is_head:
        out.append(
            f"intermediate {intermediate.name!r} is a draft head ({intermediate.drafter_kind}); "
            "the intermediate must be a full model that verifies trees"
        )
    else:
        out += [f"as a draft model of the target, {p}" for p in pair_problems(target, intermediate)]
    if drafter is None:
        out.append("no drafter: hierarchical drafting needs a drafter to grow the trees")
    else:
        out += [
            f"as the drafter of the intermediate, {p}"
            for p in pair_problems(intermediate, drafter)
            if not p.startswith("target ")
        ]
    return out


def check_intermediate(
    target: ModelSpec, intermediate: ModelSpec, drafter: ModelSpec | None
) -> None:
    """SpecError naming every mismatched field when `intermediate` cannot serve between
    `drafter` and `target` (intermediate_problems); a PairWarning when the drafter is a head
    trained for another model than the intermediate (as check_pair)."""
    problems = intermediate_problems(target, intermediate, drafter)
    if problems:
        raise SpecError(
            f"intermediate {intermediate.name!r} cannot run between "
            f"{drafter.name if drafter else 'no drafter'!r} and target {target.name!r}: "
            + "; ".join(problems)
        )
    if not intermediate.is_head:
        check_pair(intermediate, drafter)


def compatible(target: ModelSpec, drafter: ModelSpec | None) -> bool:
    """True when `drafter` can draft for `target` (what the dashboards' picker offers)."""
    return not pair_problems(target, drafter)
