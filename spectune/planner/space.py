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

`engine_space` restricts the space to what a serving engine runs (an `EngineProfile`):
vLLM 0.33 a chain length per batch range, SGLang one (steps, top-k, draft tokens) or an adaptive
per-batch draft length with top-k 1, TensorRT-LLM one dynamic or static tree with a draft-length
schedule, spectune's own executor everything. `engine_policy` maps a policy to what the engine
runs, and `check_engine_*` refuse what it cannot run, naming what it supports. The search draws
per bucket within that space; planner.engine_plan then makes the buckets' winners into the one
configuration the engine runs for the whole server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spectune.specs.engine import EngineProfile
from spectune.specs.errors import SpecError
from spectune.specs.io import help_field
from spectune.specs.policy import BUILDERS, MAX_DEPTH, TreePolicy
from spectune.specs.tree import IID_BUILDERS, VERIFY_RULES

OFF = "off"
TOPK_BUILDERS = ("static", "dynamic-topk")
"""The builders searched by default (deterministic top-k drafts: what every engine runs)."""
LOSSLESS_RULES = ("token", "traversal", "spectr")
"""Rules searched above temperature 0 (greedy is lossy there; at 0 every rule is greedy)."""

HIERARCHICAL_CHAIN = (2, 12)
"""Chain lengths (TreePolicy.chain) searched when the scenario names an intermediate model:
around SpecMQuant's 6 for W4A16 Llama-3-70B (AI9Stars/SpecMQuant run_hierspec.sh)."""

# Known engine defaults (shared/REFERENCES.md): both engines build EAGLE-2 dynamic top-k trees.
SGLANG_DEFAULT = TreePolicy("dynamic-topk", depth=5, topk=4, budget=8)
EAGLE_DEFAULT = TreePolicy("dynamic-topk", depth=7, topk=10, budget=60)
ENGINE_DEFAULTS: Mapping[str, TreePolicy] = {"sglang": SGLANG_DEFAULT, "eagle": EAGLE_DEFAULT}
# What every plan must not lose to: no speculation and the engine defaults.
REFERENCES: Mapping[str, TreePolicy | None] = {"off": None, **ENGINE_DEFAULTS}


@dataclass(frozen=True)
class PolicySpace:
    """Which policies the search may draw. Integer ranges are inclusive."""

    builders: tuple[str, ...] = help_field(TOPK_BUILDERS, help="tree builders to choose from")
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
    chain: tuple[int, int] = help_field(
        (0, 0),
        help="hierarchical chain length (TreePolicy.chain), [lo, hi] with lo >= 1 when hi > 0; "
        "(0, 0): no hierarchical draws (it needs an intermediate model and its acceptance)",
    )
    verify_rules: tuple[str, ...] = help_field(
        ("token",), help="verification rules to choose from (spectr only with i.i.d. drafts)"
    )
    delay: tuple[int, int] = help_field(
        (0, 6), help="delayed builder: path tokens before branching, [lo, hi] (cut to depth - 1)"
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
        bad = [r for r in self.verify_rules if r not in VERIFY_RULES]
        if bad or not self.verify_rules:
            raise SpecError(f"field 'verify_rules' must name rules from {VERIFY_RULES}")
        if not 0 <= self.delay[0] <= self.delay[1]:
            raise SpecError("field 'delay' must be [lo, hi] with 0 <= lo <= hi")
        if not 0.0 < self.prune[0] <= self.prune[1] < 1.0:
            raise SpecError("field 'prune' must be [lo, hi] with 0 < lo <= hi < 1")
        lo, hi = self.chain
        if (lo, hi) != (0, 0) and not 1 <= lo <= hi <= MAX_DEPTH:
            raise SpecError(
                f"field 'chain' must be (0, 0) (no hierarchical policies) or [lo, hi] with "
                f"1 <= lo <= hi <= {MAX_DEPTH}, got {self.chain!r}"
            )

    @property
    def hierarchical(self) -> bool:
        """Whether the search draws hierarchical policies (chain > 0)."""
        return self.chain[1] > 0

    def at_temperature(self, temperature: float) -> PolicySpace:
        """This space for a workload sampled at `temperature`: above 0 it adds the delayed
        builder (i.i.d. drafts only help when drafts are sampled) and the lossless rules."""
        if temperature <= 0:
            return self
        builders = self.builders + tuple(b for b in IID_BUILDERS if b not in self.builders)
        return replace(self, builders=builders, verify_rules=LOSSLESS_RULES)

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
    if builder == "delayed":  # largest with no delay: topk rollouts of depth tokens
        return 1 + topk * depth
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
    chain: int = 0,
    verify: str = "token",
    delay: int = 0,
) -> TreePolicy:
    """The policy these parameters build, with the budget cut to what the tree can hold, the
    graft budget cut to the draft slots, and the shared budget off when the policy never runs
    above batch 1 (`max_batch`; None: unknown, kept as given) or is hierarchical (`chain`).
    The delayed builder: delay cut to depth - 1, no pruning, grafting, shared budget or chain;
    on a top-k builder spectr and traversal are 'token' (spectr needs i.i.d. drafts; traversal
    with one-hot draft rows accepts as the walk does) and delay is 0."""
    if builder in IID_BUILDERS:
        delay = max(0, min(delay, depth - 1))
        prune_threshold, graft_budget, shared_budget, chain = 0.0, 0, False, 0
        budget = max(2, min(budget, 1 + delay + topk * (depth - delay)))
    else:  # top-k drafts: traversal and spectr verify as the walk does (trees.build.simulated)
        delay = 0
        verify = "token" if verify in ("spectr", "traversal") else verify
    budget = max(2, min(budget, max_tree_nodes(builder, depth, topk)))
    graft_budget = max(0, min(graft_budget, budget - 1))
    shared = bool(shared_budget) and (max_batch is None or max_batch > 1) and not chain
    return TreePolicy(
        builder,
        depth,
        topk,
        budget,
        float(prune_threshold),
        graft_budget,
        shared,
        chain,
        verify,
        delay,
    )


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
    chain = 0
    if space.hierarchical and trial.suggest_categorical("hier", (False, True)):
        chain = trial.suggest_int("chain", *space.chain)
    shared = False
    if not chain and shares(space, max_batch):
        shared = bool(trial.suggest_categorical("shared_budget", (False, True)))
    verify = "token"
    if len(space.verify_rules) > 1:
        verify = str(trial.suggest_categorical("verify", space.verify_rules))
    delay = trial.suggest_int("delay", *space.delay) if mode in IID_BUILDERS else 0
    return canonical_policy(
        mode, depth, topk, budget, prune, graft, shared, max_batch, chain, verify, delay
    )


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
    if space.hierarchical:
        params["hier"] = policy.chain > 0
        if policy.chain:
            params["chain"] = clamp(policy.chain, space.chain)
    if not policy.chain and shares(space, max_batch):
        params["shared_budget"] = policy.shared_budget
    if len(space.verify_rules) > 1:
        rule = policy.verify if policy.verify in space.verify_rules else space.verify_rules[0]
        params["verify"] = rule
    if builder in IID_BUILDERS:
        params["delay"] = clamp(policy.delay, space.delay)
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
        chain=int(params["chain"]) if params.get("hier") else 0,
        verify=str(params.get("verify", "token")),
        delay=int(params.get("delay", 0)),
    )


def grid(
    space: PolicySpace,
    depths: Sequence[int],
    topks: Sequence[int],
    budgets: Sequence[int],
    chains: Sequence[int] = (0,),
) -> Iterator[TreePolicy | None]:
    """Every distinct canonical policy of a restricted grid (no pruning, no grafting, a
    per-request budget; `chains`: 0 for trees the target verifies, N > 0 for hierarchical
    policies of chain N where the space draws them), plus off when the space allows it. The
    benchmark's exhaustive reference."""
    if space.allow_off:
        yield None
    seen: set[TreePolicy] = set()
    chains = [c for c in chains if c == 0 or space.chain[0] <= c <= space.chain[1]]
    for builder, d, k, b, c in itertools.product(space.builders, depths, topks, budgets, chains):
        p = canonical_policy(builder, d, k, b, chain=c)
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


def seed_policies(space: PolicySpace) -> tuple[TreePolicy, ...]:
    """SEED_POLICIES, plus, where the space draws hierarchical policies, the paper's setting
    (EAGLE tree 3 steps x top-10, 30 tokens, chain >= 6: AI9Stars/SpecMQuant run_hierspec.sh)
    and a smaller tree with a shorter chain, chains clamped into the space."""
    if not space.hierarchical:
        return SEED_POLICIES
    lo, hi = space.chain
    hier = tuple(
        canonical_policy("dynamic-topk", d, k, b, chain=max(lo, min(hi, c)))
        for d, k, b, c in ((3, 10, 30, 6), (3, 8, 16, 4))
    )
    return SEED_POLICIES + hier


def neighbours(
    policy: TreePolicy | None, space: PolicySpace, max_batch: int | None = None
) -> list[TreePolicy]:
    """Policies one step away inside the space: depth and top-k +-1, budget +-1 and x/÷1.25,
    pruning on/off/x2/÷2, grafting on/off, the other builder, the shared budget on/off (where
    `shares`), and where the space is hierarchical the chain +-1 and hierarchical on/off. The
    search's local refinement walks these around its best policies."""
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
    chained = [(c, p.chain, p.verify, p.delay) for c in cands]
    if space.hierarchical:
        same = (p.builder, p.depth, p.topk, p.budget, p.prune_threshold, p.graft_budget, False)
        steps = (p.chain - 1, p.chain + 1, 0) if p.chain else (space.chain[0],)
        chained += [(same, c, p.verify, p.delay) for c in steps]
    here = (p.builder, p.depth, p.topk, p.budget, p.prune_threshold, p.graft_budget, sh)
    chained += [(here, p.chain, r, p.delay) for r in space.verify_rules if r != p.verify]
    if p.builder in IID_BUILDERS:
        chained += [(here, p.chain, p.verify, x) for x in (p.delay - 1, p.delay + 1)]
    out: list[TreePolicy] = []
    for (builder, d, k, b, t, g, shared), chain, rule, delay in chained:
        inside = (
            space.depth[0] <= d <= space.depth[1]
            and space.topk[0] <= k <= space.topk[1]
            and space.budget[0] <= b <= space.budget[1]
            and (t == 0.0 or space.prune[0] <= t <= space.prune[1])
            and space.graft[0] <= g <= space.graft[1]
            and (chain == 0 or space.chain[0] <= chain <= space.chain[1])
            and space.delay[0] <= delay <= space.delay[1]
        )
        if inside:
            sh_ok = shared and shares(space, max_batch)
            q = canonical_policy(builder, d, k, b, t, g, sh_ok, None, chain, rule, delay)
            if q != p and q not in out:
                out.append(q)
    return out


# ---- what an engine can run -------------------------------------------------------------------


def engine_space(profile: EngineProfile, base: PolicySpace | None = None) -> PolicySpace:
    """The part of `base` (default: the whole space) that `profile`'s engine runs.

    Serving engines grow EAGLE-2 dynamic top-k trees (or chains), with no confidence pruning,
    no grafting and no shared verify budget; a static tree only where the engine accepts one as
    a list of paths. Chain-only engines (vLLM 0.33) get top-k 1. Depth and top-k are capped by
    the profile. spectune's own executor runs the whole space."""
    space = base or PolicySpace()
    if profile.engine == "spectune":
        return space
    builders = tuple(
        b
        for b in space.builders
        if (b == "dynamic-topk" and (profile.dynamic_tree or not profile.trees))
        or (b == "static" and profile.static_tree_choices)
    ) or ("dynamic-topk",)
    topk_hi = 1 if not profile.trees else space.topk[1]
    if profile.max_topk:
        topk_hi = min(topk_hi, profile.max_topk)
    depth_hi = min(space.depth[1], profile.max_steps) if profile.max_steps else space.depth[1]
    return replace(
        space,
        builders=builders,
        depth=(min(space.depth[0], depth_hi), depth_hi),
        topk=(min(space.topk[0], topk_hi), topk_hi),
        allow_prune=False,
        graft=(0, 0),
        allow_shared=False,
        chain=(0, 0),
        verify_rules=("token",),
    )


def engine_policy(policy: TreePolicy | None, profile: EngineProfile) -> TreePolicy | None:
    """The policy `profile`'s engine runs for `policy`: a chain's budget is depth + 1, the
    budget is cut to the engine's draft-token bound, and pruning, grafting and the shared
    budget are dropped (no engine but spectune's executor runs them), and the verification
    rule becomes 'token' (SGLang, vLLM and TensorRT-LLM verify token by token: greedy at
    temperature 0, recursive rejection above). Raises SpecError when the engine cannot run the
    policy's shape at all (a tree on a chain-only engine, a static tree on an engine without
    tree paths, i.i.d. delayed rollouts anywhere but spectune's executor)."""
    check_engine_policy(policy, profile)
    if policy is None or profile.engine == "spectune":
        return policy
    tokens = 1 + min(policy.budget - 1, profile.max_draft_tokens(policy.depth, policy.topk))
    if policy.topk == 1:
        tokens = policy.depth + 1
    return TreePolicy(policy.builder, policy.depth, policy.topk, max(2, tokens))


def check_engine_policy(policy: TreePolicy | None, profile: EngineProfile) -> None:
    """SpecError naming what the engine supports when it cannot run `policy`'s tree shape
    (pruning, grafting and a shared budget are dropped by `engine_policy`, not refused)."""
    if policy is None:
        return
    who = f"{profile.name} ({profile.versions})"
    check_runnable(policy, who)
    if profile.engine == "spectune":
        return
    if policy.builder in IID_BUILDERS:
        raise SpecError(
            f"{who} drafts top-k trees or chains, not i.i.d. sampled rollouts; the policy "
            f"{policy.label} runs on spectune's executor only"
        )
    if policy.topk > 1 and not profile.trees:
        raise SpecError(
            f"{who} verifies chains only (top-k 1); the policy {policy.label} is a tree. "
            "Plan with this engine's space (chains), or export for an engine that runs trees"
        )
    if profile.max_topk and policy.topk > profile.max_topk:
        raise SpecError(f"{who} runs top-k up to {profile.max_topk}; got {policy.label}")
    if profile.max_steps and policy.depth > profile.max_steps:
        raise SpecError(f"{who} runs up to {profile.max_steps} draft steps; got {policy.label}")
    if policy.topk > 1 and not (profile.static_tree_choices or profile.dynamic_tree):
        raise SpecError(f"{who} runs neither static nor dynamic trees; got {policy.label}")


def check_runnable(policy: TreePolicy | None, who: str = "this runner") -> None:
    """SpecError when `policy` is hierarchical (chain > 0): the planner prices, simulates and
    searches hierarchical drafting, but neither spectune's executor nor any engine export
    runs it (no engine has an intermediate-model stage)."""
    if policy is not None and policy.chain:
        raise SpecError(
            f"{who} cannot run the hierarchical policy {policy.label} (an intermediate model "
            "turning the tree into a chain): spectune plans, prices and simulates it, but "
            "neither its executor nor SGLang, vLLM or TensorRT-LLM runs an intermediate "
            "stage. Plan without an intermediate model (no --intermediate; PolicySpace.chain "
            "(0, 0)) to get a runnable policy, or run it with the paper's code "
            "(AI9Stars/SpecMQuant)"
        )


def check_engine_drafter(drafter_kind: str, profile: EngineProfile) -> None:
    """SpecError when the engine does not run this kind of drafter (DRAFTERS in specs.engine)."""
    if drafter_kind not in profile.drafters:
        raise SpecError(
            f"{profile.name} ({profile.versions}) does not run a {drafter_kind} drafter; it "
            f"runs {', '.join(profile.drafters)}"
        )


def check_engine_schedule(
    policies: Sequence[TreePolicy | None], profile: EngineProfile, *, adaptive: bool = True
) -> None:
    """SpecError when the engine cannot run these per-batch-range policies (batch order) as
    one configuration: engines whose schedule varies only the draft length need one top-k and
    budget for every range where speculation is on; SGLang's adaptive schedule needs top-k 1
    (`adaptive` False: the caller exports one static setting and checks no schedule);
    an engine without a schedule needs one policy everywhere; a schedule whose entries cannot
    be 0 cannot turn a range off."""
    if profile.engine == "spectune":
        return
    on = [p for p in policies if p is not None]
    who = f"{profile.name} ({profile.versions})"
    depths = {p.depth for p in on}
    varies = len(set(policies)) > 1
    if not varies or not on:
        return
    if not profile.has_schedule:
        raise SpecError(
            f"{who} has no per-batch-size schedule: one speculative setting for every batch; "
            f"the plan varies it ({', '.join(p.label if p else 'off' for p in policies)})"
        )
    if profile.schedule_varies == "steps":
        shapes = {(p.topk, p.budget if p.topk > 1 else 0) for p in on}
        if len(shapes) > 1:
            raise SpecError(
                f"{who} varies only the draft length with the batch size: one top-k and tree "
                f"size for all ranges; the plan uses {sorted(shapes)}"
            )
    if profile.schedule_topk1_only and adaptive and (len(depths) > 1 or None in policies):
        topk = max(p.topk for p in on)
        if topk > 1:
            raise SpecError(
                f"{who} runs its adaptive per-batch schedule only with top-k 1 (with top-k "
                f"{topk} it warns and falls back to static parameters); plan chains for a "
                "per-batch schedule, or one tree setting for every batch"
            )
    if profile.schedule_min_steps > 0 and None in policies:
        raise SpecError(f"{who} cannot turn speculation off for a batch range (its floor is 1)")


def engine_default(profile: EngineProfile) -> TreePolicy | None:
    """The speculative config `profile`'s engine runs when the user sets nothing (its
    default_steps / default_topk / default_draft_tokens, from the engine's source), as a policy;
    None when the engine has no default (it requires the user to choose, e.g. vLLM's
    num_speculative_tokens) or is spectune's own executor."""
    if profile.engine == "spectune" or profile.default_steps <= 0:
        return None
    topk = max(1, profile.default_topk)
    tokens = profile.default_draft_tokens or profile.default_steps + 1
    return engine_policy(
        canonical_policy("dynamic-topk", profile.default_steps, topk, tokens), profile
    )


def engine_references(profile: EngineProfile | None) -> Mapping[str, TreePolicy | None]:
    """What a plan for `profile` must not lose to: no speculation and the engine's own default
    config (named after the profile). spectune's executor (or no profile) is compared with the
    SGLang and EAGLE defaults (REFERENCES)."""
    if profile is None or profile.engine == "spectune":
        return REFERENCES
    default = engine_default(profile)
    return {OFF: None} if default is None else {OFF: None, profile.name: default}
