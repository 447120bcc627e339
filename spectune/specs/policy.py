"""TreePolicy (one speculation setting) and PolicyTable (the versioned policy file).

The policy file is what `spectune plan` writes and every other command reads:

    {"schema": "spectune.policy/v1", "target": ..., "drafter": ..., "hardware": ..., "tp": 1,
     "workload": ..., "temperature": 0.0,
     "scenario": {"target": ..., "drafter": ..., "gpu": ..., "tp": 1, "workload": ...,
                  "calibration": null, "engine": ..., "objective": ..., "slo_tpot_ms": null,
                  "slo_ttft_ms": null},
     "buckets": [{"batch": [lo, hi], "context": [lo, hi], "policy": {...} | null,
                  "predicted": {"tokens_per_s": ..., "speedup": ..., "accepted_len": ...}}],
     "provenance": {...}}

Bucket ranges are inclusive. A null policy means speculation off for that bucket. "scenario" is
the Scenario the table was planned for (spectune.specs.scenario); the top-level target, drafter,
hardware, tp and workload repeat its names and must agree with it. Files written before it
existed load with a Scenario made from those top-level names (no calibration, the default
engine and objective).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spectune.specs.errors import SpecError
from spectune.specs.io import (
    from_mapping,
    help_field,
    loads_json,
    read_bytes_bounded,
    write_json_atomic,
)
from spectune.specs.scenario import NO_DRAFTER, Scenario
from spectune.specs.tree import BUILDERS, IID_BUILDERS, VERIFY_RULES

SCHEMA = "spectune.policy/v1"
MAX_BUDGET = 1024
MAX_DEPTH = 64
MAX_TOPK = 64
ECHO_SUFFIX = "echo"
"""The last comma-separated part of a policy label that turns shared_budget on."""
HIER_PREFIX = "hier"
"""A last label part 'hierN' makes the policy hierarchical with chain N (TreePolicy.chain)."""


@dataclass(frozen=True)
class TreePolicy:
    """How to build the draft tree each step."""

    builder: str = help_field(
        help="'static' (Sequoia-optimal shape), 'dynamic-topk' (EAGLE-2) or 'delayed' (one "
        "sampled path of `delay` tokens, then `topk` i.i.d. sampled branches)"
    )
    depth: int = help_field(help="draft steps (maximum tree depth below the root)")
    topk: int = help_field(help="children expanded per node per draft step")
    budget: int = help_field(help="verify budget: tree tokens per sequence, root included")
    prune_threshold: float = help_field(0.0, help="drop nodes whose path probability is below this")
    graft_budget: int = help_field(0, help="freed slots that retrieved tokens may fill")
    shared_budget: bool = help_field(
        False,
        help="ECHO super-tree: the batch shares one verify budget of batch * (budget - 1) draft "
        "tokens, given to the candidates with the highest P(accepted) over the whole batch "
        "(trees differ in size per request); False: budget - 1 per request. Same as False at "
        "batch 1. static: the shared allocation picks from the Sequoia shape for 2 x budget",
    )
    chain: int = help_field(
        0,
        help="hierarchical drafting (arXiv 2505.22179): 0 off; N > 0: the tree is verified by "
        "an intermediate model, round after round, until it has accepted at least N tokens, "
        "and the target verifies those as one chain (planner.hierarchical)",
    )
    verify: str = help_field(
        "token", help=f"verification rule, one of {VERIFY_RULES} (specs.tree.VERIFY_RULES)"
    )
    delay: int = help_field(
        0, help="delayed builder: path tokens drafted before the tree branches (< depth)"
    )

    def __post_init__(self) -> None:
        if self.builder not in BUILDERS:
            raise SpecError(f"field 'builder' must be one of {BUILDERS}, got {self.builder!r}")
        checks = (
            ("depth", 1, MAX_DEPTH),
            ("topk", 1, MAX_TOPK),
            ("budget", 2, MAX_BUDGET),
            ("graft_budget", 0, MAX_BUDGET),
        )
        for name, lo, hi in checks:
            v = getattr(self, name)
            if not lo <= v <= hi:
                raise SpecError(f"field {name!r} must be in {lo}..{hi}, got {v}")
        if not 0.0 <= self.prune_threshold < 1.0:
            raise SpecError(
                f"field 'prune_threshold' must be in [0, 1), got {self.prune_threshold}"
            )
        if self.graft_budget > self.budget - 1:
            raise SpecError("field 'graft_budget' cannot exceed budget - 1 (the draft slots)")
        if self.verify not in VERIFY_RULES:
            raise SpecError(f"field 'verify' must be one of {VERIFY_RULES}, got {self.verify!r}")
        if self.verify == "spectr" and self.builder not in IID_BUILDERS:
            raise SpecError(
                f"field 'verify': 'spectr' needs i.i.d. drafts (builder {IID_BUILDERS}), "
                f"got builder {self.builder!r}"
            )
        if not 0 <= self.delay < (self.depth if self.builder == "delayed" else 1):
            raise SpecError(
                f"field 'delay' must be 0 unless builder is 'delayed', and below depth "
                f"({self.depth}) there; got {self.delay}"
            )
        if self.builder in IID_BUILDERS and (
            self.prune_threshold or self.graft_budget or self.shared_budget or self.chain
        ):
            raise SpecError(
                f"builder {self.builder!r} takes no prune_threshold, graft_budget, "
                "shared_budget or chain (its rollouts are sampled, not ranked)"
            )
        if not isinstance(self.shared_budget, bool):
            raise SpecError(
                f"field 'shared_budget' must be true or false, got {self.shared_budget!r}"
            )
        if isinstance(self.chain, bool) or not 0 <= self.chain <= MAX_DEPTH:
            raise SpecError(f"field 'chain' must be in 0..{MAX_DEPTH}, got {self.chain!r}")
        if self.chain and self.shared_budget:
            raise SpecError(
                "field 'chain': a hierarchical policy verifies one chain per request; it cannot "
                "share a verify budget across the batch (set shared_budget false)"
            )

    @classmethod
    def parse(cls, text: str) -> TreePolicy:
        """Parse the CLI form 'BUILDER:DEPTH,TOPK,BUDGET[,PRUNE[,GRAFT]][,KEY=VALUE...]
        [,echo|,hierN]' (the inverse of `label`; a trailing ',echo' turns shared_budget on,
        ',hierN' sets chain N; keys: delay, verify)."""
        try:
            builder, _, rest = text.partition(":")
            parts = [p for p in rest.split(",") if p]
            keyed = dict(p.strip().split("=", 1) for p in parts if "=" in p)
            parts = [p for p in parts if "=" not in p]
            if set(keyed) - {"delay", "verify"}:
                raise ValueError(text)
            last = parts[-1].strip().lower() if parts else ""
            shared = last == ECHO_SUFFIX
            chain = 0
            if last.startswith(HIER_PREFIX):
                chain = int(last[len(HIER_PREFIX) :])
            if shared or chain:
                parts.pop()
            if builder in BUILDERS and 3 <= len(parts) <= 5:
                depth, topk, budget = (int(p) for p in parts[:3])
                delay = int(keyed.get("delay", 0))
                prune = float(parts[3]) if len(parts) > 3 else 0.0
                graft = int(parts[4]) if len(parts) > 4 else 0
                verify = keyed.get("verify", "token")
                return cls(builder, depth, topk, budget, prune, graft, shared, chain, verify, delay)
        except ValueError as e:
            if isinstance(e, SpecError):
                raise
        raise SpecError(
            f"cannot parse policy {text!r}; expected 'static:DEPTH,TOPK,BUDGET' or "
            "'dynamic-topk:DEPTH,TOPK,BUDGET[,PRUNE_THRESHOLD[,GRAFT_BUDGET]]', optionally "
            "followed by ',delay=N' / ',verify=RULE' and ',echo' (ECHO shared verify budget) "
            "or ',hierN' (hierarchical, chain N), e.g. static:5,4,8, dynamic-topk:6,8,32,echo, "
            "dynamic-topk:3,10,30,hier6 or delayed:8,4,24,delay=3,verify=traversal"
        )

    @property
    def label(self) -> str:
        """The CLI form 'builder:depth,topk,budget' plus ',prune,graft' when either is set,
        plus ',delay=N' for the delayed builder, ',verify=RULE' for a rule other than 'token',
        then ',echo' with a shared verify budget or ',hierN' when hierarchical (chain N)."""
        s = f"{self.builder}:{self.depth},{self.topk},{self.budget}"
        if self.prune_threshold or self.graft_budget:
            s += f",{self.prune_threshold:.3g},{self.graft_budget}"
        if self.builder == "delayed":
            s += f",delay={self.delay}"
        if self.verify != "token":
            s += f",verify={self.verify}"
        if self.shared_budget:
            s += f",{ECHO_SUFFIX}"
        if self.chain:
            s += f",{HIER_PREFIX}{self.chain}"
        return s

    @property
    def hierarchical(self) -> bool:
        """Whether an intermediate model turns the tree into a chain for the target."""
        return self.chain > 0


def policy_label(policy: TreePolicy | None) -> str:
    """'off', or the policy's CLI form (TreePolicy.label): how every report names a policy."""
    return "off" if policy is None else policy.label


@dataclass(frozen=True)
class Prediction:
    """What the planner predicted for a bucket's policy."""

    tokens_per_s: float = help_field(
        help="predicted served tok/s incl. prefill (planner.tokens_per_s.SERVED), geometric "
        "mean over the bucket's batch ends"
    )
    speedup: float = help_field(help="predicted speedup over no speculation")
    accepted_len: float = help_field(help="predicted tokens per verify step (accepted + bonus)")


@dataclass(frozen=True)
class ChainChoice:
    """The best chain (top-k 1) for a bucket, for engines that verify chains only (vLLM 0.33)."""

    draft_tokens: int = help_field(help="draft tokens per step of the best chain; 0 = off")
    tokens_per_s: float = help_field(help="predicted served tok/s incl. prefill of that chain")
    speedup: float = help_field(help="predicted speedup of that chain over no speculation")

    def __post_init__(self) -> None:
        if not 0 <= self.draft_tokens <= MAX_DEPTH:
            raise SpecError(
                f"field 'draft_tokens' must be in 0..{MAX_DEPTH}, got {self.draft_tokens}"
            )


@dataclass(frozen=True)
class Bucket:
    """A batch-size x context-length range (inclusive) and the policy chosen for it."""

    batch: tuple[int, int]
    context: tuple[int, int]
    policy: TreePolicy | None
    predicted: Prediction | None = None
    chain: ChainChoice | None = None

    def contains(self, batch: int, context: int) -> bool:
        return (
            self.batch[0] <= batch <= self.batch[1]
            and self.context[0] <= context <= self.context[1]
        )


@dataclass(frozen=True)
class PolicyTable:
    """The tuned policy per (batch, context) bucket, plus what it was tuned for.

    `scenario` is the Scenario the table was planned for; left out (None), it is made from
    target, drafter, hardware, tp and workload (an old file's names). Given, those names must
    agree with it."""

    target: str
    drafter: str
    hardware: str
    buckets: tuple[Bucket, ...]
    tp: int = 1
    workload: str = ""
    temperature: float = 0.0
    provenance: Mapping[str, Any] = field(default_factory=dict)
    scenario: Scenario = None  # type: ignore[assignment]  # None: made from the names above

    def __post_init__(self) -> None:
        named = Scenario(
            target=self.target,
            drafter=self.drafter or NO_DRAFTER,
            gpu=self.hardware,
            tp=self.tp,
            workload=self.workload,
        )
        if self.scenario is None:
            object.__setattr__(self, "scenario", named)
            return
        if not isinstance(self.scenario, Scenario):
            raise SpecError(f"field 'scenario' must be a Scenario, got {self.scenario!r}")
        for top, name in (
            ("target", "target"),
            ("drafter", "drafter"),
            ("hardware", "gpu"),
            ("tp", "tp"),
            ("workload", "workload"),
        ):
            want, got = getattr(named, name), getattr(self.scenario, name)
            if name == "drafter":  # "" and "none" both name no drafter
                want, got = want or NO_DRAFTER, got or NO_DRAFTER
            if want != got:
                raise SpecError(
                    f"field 'scenario.{name}' is {got!r} but field {top!r} is "
                    f"{getattr(self, top)!r}; they must agree"
                )

    def lookup(self, batch: int, context: int) -> TreePolicy | None:
        """The policy for a live batch size and context length (None: speculation off).
        Past the last bucket the nearest bucket is used, so a table always answers."""
        for b in self.buckets:
            if b.contains(batch, context):
                return b.policy

        def dist(b: Bucket) -> int:
            return max(b.batch[0] - batch, batch - b.batch[1], 0) + max(
                b.context[0] - context, context - b.context[1], 0
            )

        return min(self.buckets, key=dist).policy

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "target": self.target,
            "drafter": self.drafter,
            "hardware": self.hardware,
            "tp": self.tp,
            "workload": self.workload,
            "temperature": self.temperature,
            "scenario": self.scenario.to_dict(),
            "buckets": [
                {
                    "batch": list(b.batch),
                    "context": list(b.context),
                    "policy": _policy_dict(b.policy) if b.policy else None,
                    "predicted": asdict(b.predicted) if b.predicted else None,
                    **({"chain": asdict(b.chain)} if b.chain else {}),
                }
                for b in self.buckets
            ],
            "provenance": dict(self.provenance),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the policy file atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "policy") -> PolicyTable:
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: expected a JSON object at the top level")
        if data.get("schema") != SCHEMA:
            raise SpecError(
                f"{where}: field 'schema' must be {SCHEMA!r}, got {data.get('schema')!r}"
            )
        for key in ("target", "drafter", "hardware", "buckets"):
            if key not in data:
                raise SpecError(f"{where}: missing required field {key!r}")
        for key in ("target", "drafter", "hardware", "workload"):
            if key in data and not isinstance(data[key], str):
                raise SpecError(f"{where}: field {key!r} must be a string, got {data[key]!r:.60}")
        raw = data["buckets"]
        if not isinstance(raw, list) or not raw:
            raise SpecError(f"{where}: field 'buckets' must be a non-empty list")
        buckets = []
        for i, b in enumerate(raw):
            w = f"{where}: buckets[{i}]"
            if not isinstance(b, Mapping):
                raise SpecError(f"{w}: expected an object")
            unknown = set(b) - {"batch", "context", "policy", "predicted", "chain"}
            if unknown:
                raise SpecError(f"{w}: unknown field {sorted(unknown)[0]!r}")
            rng = {k: _range(b.get(k), f"{w}.{k}") for k in ("batch", "context")}
            pol = b.get("policy", None)
            policy = (
                None
                if pol is None
                else from_mapping(TreePolicy, _obj(pol, f"{w}.policy"), f"{w}.policy")
            )
            pred = b.get("predicted")
            prediction = (
                None
                if pred is None
                else from_mapping(Prediction, _obj(pred, f"{w}.predicted"), f"{w}.predicted")
            )
            ch = b.get("chain")
            chain = (
                None
                if ch is None
                else from_mapping(ChainChoice, _obj(ch, f"{w}.chain"), f"{w}.chain")
            )
            buckets.append(Bucket(rng["batch"], rng["context"], policy, prediction, chain))
        tp = data.get("tp", 1)
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise SpecError(f"{where}: field 'tp' must be a positive integer, got {tp!r}")
        temp = data.get("temperature", 0.0)
        if isinstance(temp, bool) or not isinstance(temp, int | float) or temp < 0:
            raise SpecError(f"{where}: field 'temperature' must be a number >= 0, got {temp!r}")
        prov = data.get("provenance", {})
        if not isinstance(prov, Mapping):
            raise SpecError(f"{where}: field 'provenance' must be an object")
        scenario = None
        if data.get("scenario") is not None:
            scenario = Scenario.from_dict(
                _obj(data["scenario"], f"{where}: scenario"), f"{where}: scenario"
            )
        try:
            return cls(
                target=str(data["target"]),
                drafter=str(data["drafter"]),
                hardware=str(data["hardware"]),
                buckets=tuple(buckets),
                tp=tp,
                workload=str(data.get("workload", "")),
                temperature=float(temp),
                provenance=dict(prov),
                scenario=scenario,  # type: ignore[arg-type]  # None: made from the names
            )
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from e

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PolicyTable:
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"{p}: no such policy file")
        return cls.from_dict(loads_json(read_bytes_bounded(p), str(p)), str(p))


def _policy_dict(policy: TreePolicy) -> dict[str, Any]:
    """A policy's fields for the policy file; 'chain' only when hierarchical, 'verify' only
    for a rule other than 'token', 'delay' only for the delayed builder (files of plans that
    use none of them read the same as before the fields existed)."""
    d = asdict(policy)
    if not policy.chain:
        del d["chain"]
    if policy.verify == "token":
        del d["verify"]
    if policy.builder != "delayed":
        del d["delay"]
    return d


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise SpecError(f"{where}: expected an object or null, got {v!r}")
    return v


def _range(v: Any, where: str) -> tuple[int, int]:
    ok = (
        isinstance(v, list | tuple)
        and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    )
    if not ok or v[0] < 0 or v[0] > v[1]:
        raise SpecError(f"{where}: expected [lo, hi] with 0 <= lo <= hi integers, got {v!r}")
    return int(v[0]), int(v[1])
