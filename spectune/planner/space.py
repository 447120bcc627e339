"""The policy space the planner searches, and the engine defaults it must beat.

A point of the space is a `TreePolicy` or None ("off": plain decoding). `PolicySpace` says which
builders and which ranges of depth, top-k, verify budget, prune threshold and graft budget are
allowed; `suggest_policy` draws one point from an Optuna trial, `policy_params` turns a policy
back into the trial parameters (to enqueue engine defaults or warm starts), and `grid` lists a
restricted space exhaustively (the benchmark's reference optimum).

Draws are canonicalised: a verify budget larger than the tree the builder can grow for that
depth and top-k is cut to that size, a graft budget larger than the draft slots is cut to them,
and a shared verify budget (ECHO super-tree) is drawn only where the bucket has batches above 1
(at batch 1 it is the per-request budget), so two draws that build the same tree are the same
policy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.specs.errors import SpecError
from spectune.specs.io import help_field
from spectune.specs.policy import BUILDERS, TreePolicy

OFF = "off"

# Known engine defaults (shared/REFERENCES.md): both engines build EAGLE-2 dynamic top-k trees.
SGLANG_DEFAULT = TreePolicy("dynamic-topk", depth=5, topk=4, budget=8)
EAGLE_DEFAULT = TreePolicy("dynamic-topk", depth=7, topk=10, budget=60)
ENGINE_DEFAULTS: Mapping[str, TreePolicy] = {"sglang": SGLANG_DEFAULT, "eagle": EAGLE_DEFAULT}
# What every plan must not lose to: no speculation and the engine defaults.
REFERENCES: Mapping[str, TreePolicy | None] = {"off": None, **ENGINE_DEFAULTS}


@dataclass(frozen=True)
class PolicySpace:
    """Which policies the search may draw. Integer ranges are inclusive."""

    builders: tuple[str, ...] = help_field(BUILDERS, help="tree builders to choose from")
    depth: tuple[int, int] = help_field((1, 12), help="draft steps, [lo, hi]")
    topk: tuple[int, int] = help_field((1, 16), help="children expanded per node, [lo, hi]")
    budget: tuple[int, int] = help_field(
        (2, 256), help="verify budget (tree tokens, root included), [lo, hi]; >= 2"
    )
    prune: tuple[float, float] = help_field(
        (1e-4, 0.5), help="prune threshold range when pruning is on (log-uniform)"
    )
    allow_prune: bool = help_field(True, help="whether the prune threshold may be non-zero")
    graft: tuple[int, int] = help_field((0, 64), help="graft budget, [lo, hi]")
    allow_off: bool = help_field(True, help="whether 'off' (no speculation) is a choice")
    allow_shared: bool = help_field(
        True,
        help="whether the batch may share one verify budget (ECHO super-tree) in buckets with "
        "batches above 1",
    )

    def __post_init__(self) -> None:
        for b in self.builders:
            if b not in BUILDERS:
                raise SpecError(f"field 'builders': unknown builder {b!r}; known: {BUILDERS}")
        if not self.builders:
            raise SpecError("field 'builders' must name at least one builder")
        for name, lo_min in (("depth", 1), ("topk", 1), ("budget", 2), ("graft", 0)):
            lo, hi = getattr(self, name)
            if not lo_min <= lo <= hi:
                raise SpecError(f"field {name!r} must be [lo, hi] with {lo_min} <= lo <= hi")
        if not 0.0 < self.prune[0] <= self.prune[1] < 1.0:
            raise SpecError("field 'prune' must be [lo, hi] with 0 < lo <= hi < 1")

    @property
    def modes(self) -> tuple[str, ...]:
        """The categorical choice of a trial: 'off' (if allowed) and the builders."""
        return ((OFF,) if self.allow_off else ()) + tuple(self.builders)


def max_tree_nodes(builder: str, depth: int, topk: int) -> int:
    """Largest tree (root included) a builder can grow with this depth and top-k.

    dynamic-topk (EAGLE-2): the first step adds topk nodes, each later step expands the topk best
    nodes of the last level into topk children each, so the candidate pool is
    topk + (depth - 1) * topk^2 draft nodes. static: a full topk-ary tree of this depth."""
    if topk == 1:
        return depth + 1
    if builder == "dynamic-topk":
        return 1 + topk + (depth - 1) * topk * topk
    full = 1
    level = 1
    for _ in range(depth):
        level *= topk
        full += level
        if full > 1 << 20:
            break
    return full


def canonical_policy(
    builder: str,
    depth: int,
    topk: int,
    budget: int,
    prune_threshold: float = 0.0,
    graft_budget: int = 0,
    shared_budget: bool = False,
    max_batch: int | None = None,
) -> TreePolicy:
    """The policy these parameters build, with the budget cut to what the tree can hold, the
    graft budget cut to the draft slots, and the shared budget off when the policy never runs
    above batch 1 (`max_batch`; None: unknown, kept as given)."""
    budget = max(2, min(budget, max_tree_nodes(builder, depth, topk)))
    graft_budget = max(0, min(graft_budget, budget - 1))
    shared = bool(shared_budget) and (max_batch is None or max_batch > 1)
    return TreePolicy(builder, depth, topk, budget, float(prune_threshold), graft_budget, shared)


def shares(space: PolicySpace, max_batch: int | None) -> bool:
    """Whether the search draws the shared-budget switch for a bucket whose largest batch is
    `max_batch` (None: unknown)."""
    return space.allow_shared and (max_batch is None or max_batch > 1)


def suggest_policy(
    trial: Any, space: PolicySpace, max_batch: int | None = None
) -> TreePolicy | None:
    """Draw one policy (or None for 'off') from an Optuna trial (define-by-run: the tree
    parameters exist only when speculation is on; the shared-budget switch only when the
    bucket's largest batch `max_batch` is above 1)."""
    mode = trial.suggest_categorical("mode", space.modes)
    if mode == OFF:
        return None
    depth = trial.suggest_int("depth", *space.depth)
    topk = trial.suggest_int("topk", *space.topk)
    budget = trial.suggest_int("budget", *space.budget, log=space.budget[1] > 4 * space.budget[0])
    prune = 0.0
    if space.allow_prune and trial.suggest_categorical("prune_on", (False, True)):
        prune = trial.suggest_float("prune_threshold", *space.prune, log=True)
    graft = 0
    if space.graft[1] > 0:
        graft = trial.suggest_int("graft_budget", *space.graft)
    shared = False
    if shares(space, max_batch):
        shared = bool(trial.suggest_categorical("shared_budget", (False, True)))
    return canonical_policy(mode, depth, topk, budget, prune, graft, shared, max_batch)


def policy_params(
    policy: TreePolicy | None, space: PolicySpace, max_batch: int | None = None
) -> dict[str, Any]:
    """Trial parameters that make `suggest_policy` return `policy` (for enqueue_trial).
    Values are clamped into the space, so a default outside it becomes its nearest point."""
    if policy is None:
        if not space.allow_off:
            raise SpecError("this policy space does not allow 'off'")
        return {"mode": OFF}

    def clamp(v: int, r: tuple[int, int]) -> int:
        return max(r[0], min(r[1], v))

    builder = policy.builder if policy.builder in space.builders else space.builders[0]
    params: dict[str, Any] = {
        "mode": builder,
        "depth": clamp(policy.depth, space.depth),
        "topk": clamp(policy.topk, space.topk),
        "budget": clamp(policy.budget, space.budget),
    }
    if space.allow_prune:
        params["prune_on"] = policy.prune_threshold > 0
        if policy.prune_threshold > 0:
            params["prune_threshold"] = min(
                max(policy.prune_threshold, space.prune[0]), space.prune[1]
            )
    if space.graft[1] > 0:
        params["graft_budget"] = clamp(policy.graft_budget, space.graft)
    if shares(space, max_batch):
        params["shared_budget"] = policy.shared_budget
    return params


def policy_from_params(params: Mapping[str, Any]) -> TreePolicy | None:
    """The policy a finished trial drew, from its parameters."""
    mode = params.get("mode", OFF)
    if mode == OFF:
        return None
    prune = float(params["prune_threshold"]) if params.get("prune_on") else 0.0
    return canonical_policy(
        str(mode),
        int(params["depth"]),
        int(params["topk"]),
        int(params["budget"]),
        prune,
        int(params.get("graft_budget", 0)),
        bool(params.get("shared_budget", False)),
    )


def grid(
    space: PolicySpace,
    depths: Sequence[int],
    topks: Sequence[int],
    budgets: Sequence[int],
) -> Iterator[TreePolicy | None]:
    """Every distinct canonical policy of a restricted grid (no pruning, no grafting, a
    per-request budget), plus off when the space allows it. The benchmark's exhaustive
    reference."""
    if space.allow_off:
        yield None
    seen: set[TreePolicy] = set()
    for builder, d, k, b in itertools.product(space.builders, depths, topks, budgets):
        p = canonical_policy(builder, d, k, b)
        if p not in seen:
            seen.add(p)
            yield p


# Diverse starting points enqueued after the engine defaults: short chains (large batches) and
# geometrically growing trees (small batches).
SEED_POLICIES: tuple[TreePolicy, ...] = (
    TreePolicy("dynamic-topk", 2, 1, 3),
    TreePolicy("dynamic-topk", 4, 1, 5),
    TreePolicy("dynamic-topk", 3, 2, 6),
    TreePolicy("dynamic-topk", 4, 4, 12),
    TreePolicy("dynamic-topk", 6, 8, 32),
)


def neighbours(
    policy: TreePolicy | None, space: PolicySpace, max_batch: int | None = None
) -> list[TreePolicy]:
    """Policies one step away inside the space: depth and top-k +-1, budget +-1 and x/÷1.25,
    pruning on/off/x2/÷2, grafting on/off, the other builder, the shared budget on/off (where
    `shares`). The search's local refinement walks these around its best policies."""
    if policy is None:
        return [
            canonical_policy(space.builders[0], d, 1, d + 1)
            for d in (1, 2)
            if space.depth[0] <= d <= space.depth[1] and space.topk[0] == 1
        ]
    p = policy
    cands: list[tuple[str, int, int, int, float, int, bool]] = []
    sh = p.shared_budget
    for d in (p.depth - 1, p.depth + 1):
        cands.append((p.builder, d, p.topk, p.budget, p.prune_threshold, p.graft_budget, sh))
    for k in (p.topk - 1, p.topk + 1):
        cands.append((p.builder, p.depth, k, p.budget, p.prune_threshold, p.graft_budget, sh))
    for b in (p.budget - 1, p.budget + 1, round(p.budget / 1.25), round(p.budget * 1.25)):
        cands.append((p.builder, p.depth, p.topk, b, p.prune_threshold, p.graft_budget, sh))
    if space.allow_prune:
        prunes = (
            [0.0, p.prune_threshold * 2, p.prune_threshold / 2] if p.prune_threshold else [0.01]
        )
        for t in prunes:
            cands.append((p.builder, p.depth, p.topk, p.budget, t, p.graft_budget, sh))
    if space.graft[1] > 0:
        g = 0 if p.graft_budget else max(space.graft[0], min(4, space.graft[1]))
        cands.append((p.builder, p.depth, p.topk, p.budget, p.prune_threshold, g, sh))
    if shares(space, max_batch):
        cands.append(
            (p.builder, p.depth, p.topk, p.budget, p.prune_threshold, p.graft_budget, not sh)
        )
    for other in space.builders:
        if other != p.builder:
            cands.append((other, p.depth, p.topk, p.budget, p.prune_threshold, p.graft_budget, sh))
    out: list[TreePolicy] = []
    for builder, d, k, b, t, g, shared in cands:
        inside = (
            space.depth[0] <= d <= space.depth[1]
            and space.topk[0] <= k <= space.topk[1]
            and space.budget[0] <= b <= space.budget[1]
            and (t == 0.0 or space.prune[0] <= t <= space.prune[1])
            and space.graft[0] <= g <= space.graft[1]
        )
        if inside:
            q = canonical_policy(builder, d, k, b, t, g, shared and shares(space, max_batch))
            if q != p and q not in out:
                out.append(q)
    return out
