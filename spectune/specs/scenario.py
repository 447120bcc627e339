"""One Scenario: what a plan is for, named once and resolved once.

A scenario names the target, the drafter, the GPU, the tensor-parallel degree, the workload,
an optional calibration file and the serving engine, plus how policies are scored (objective
and SLOs). `spectune plan` and `worker`, the simulator's scorer, the validation layer's planned
tables, the exports and the dashboards all start from a Scenario; a policy file records the
Scenario it was planned for, and whatever reads a policy file (simulate, execute, export, the
dashboards) takes it from there.

`Scenario` holds names (preset names or spec file paths) and is small, hashable and JSON-ready;
`Scenario.resolve()` loads every spec once into a `ResolvedScenario`. A drafter named "none"
means no drafter model (retrieval drafting only; `ResolvedScenario.drafter` is None).

An `intermediate` model makes hierarchical policies (TreePolicy.chain, arXiv 2505.22179)
plannable: the intermediate verifies trees grown by `intermediate_drafter` (default: the
drafter) and hands the target a chain. The pairs are checked as drafter pairs are
(specs.compat.check_intermediate), and resolving gives the two acceptances hierarchical
policies compose: the intermediate's drafter against the intermediate (`workload_for_pair`,
the drafter's own acceptance presets) and the intermediate's chains against the target
(`intermediate_workload`, the 'intermediate' acceptance preset).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spectune.specs.calibration import Calibration
from spectune.specs.compat import check_intermediate, check_pair
from spectune.specs.engine import EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.hardware import HardwareSpec, load_hardware
from spectune.specs.io import from_mapping, help_field
from spectune.specs.model import ModelSpec, load_model
from spectune.specs.workload import (
    Workload,
    intermediate_workload,
    load_workload,
    workload_for_pair,
)

OBJECTIVES = ("closed-form", "goodput", "throughput")
NO_DRAFTER = "none"
"""The drafter name of a scenario without a drafter model (retrieval drafting only)."""


@dataclass(frozen=True)
class Scenario:
    """What a plan is for. Names are preset names or paths of JSON/TOML spec files."""

    target: str = help_field("llama-3.1-8b", help="target model: preset name or spec file")
    drafter: str = help_field(
        "eagle3-llama-3.1-8b",
        help="drafter (draft head or draft model): preset name or spec file; 'none': "
        "retrieval drafting only",
    )
    gpu: str = help_field("h100-sxm", help="GPU: preset name or spec file")
    tp: int = help_field(1, help="tensor-parallel degree (GPUs per replica)")
    workload: str = help_field("mt-bench", help="workload: preset name or spec file")
    calibration: str | None = help_field(
        None, help="calibration file fitted on this GPU (`spectune calibrate`); none: defaults"
    )
    engine: str = help_field(
        "spectune", help="serving engine whose overheads and rules apply (an EngineProfile name)"
    )
    objective: str = help_field(
        "closed-form",
        help="how policies are scored: closed-form (cost model), goodput or throughput (simulator)",
    )
    slo_tpot_ms: float | None = help_field(
        None, help="TPOT SLO for the goodput objective, ms per output token"
    )
    slo_ttft_ms: float | None = help_field(
        None, help="TTFT SLO for the goodput objective, ms to first token"
    )
    intermediate: str | None = help_field(
        None,
        help="intermediate model of hierarchical drafting (verifies the drafter's trees, hands "
        "the target a chain): preset name or spec file; none: no hierarchical policies",
    )
    intermediate_drafter: str | None = help_field(
        None,
        help="the model growing the trees the intermediate verifies (e.g. the intermediate's "
        "own EAGLE head): preset name or spec file; none: the drafter",
    )

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or not 1 <= self.tp <= 64:
            raise SpecError(f"scenario tp must be an integer in 1..64, got {self.tp!r}")
        if self.objective not in OBJECTIVES:
            raise SpecError(
                f"scenario objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"
            )
        for name in ("slo_tpot_ms", "slo_ttft_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and 0 < float(v) < float("inf")):
                raise SpecError(f"scenario {name} must be a positive finite number, got {v!r}")
        for name in ("intermediate", "intermediate_drafter"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v.strip()):
                raise SpecError(f"scenario {name} must be a model name or file, got {v!r}")
        if self.intermediate_drafter is not None and self.intermediate is None:
            raise SpecError("scenario intermediate_drafter needs an intermediate model")

    @property
    def has_drafter(self) -> bool:
        """False for a scenario that drafts by retrieval only (drafter "none" or empty)."""
        return self.drafter not in ("", NO_DRAFTER)

    @property
    def label(self) -> str:
        """'TARGET + DRAFTER on GPU (tp N), workload W', with the names as given."""
        drafter = self.drafter if self.has_drafter else "no drafter"
        if self.intermediate:
            drafter += f" (intermediate {self.intermediate})"
        return f"{self.target} + {drafter} on {self.gpu} (tp {self.tp}), workload {self.workload}"

    def changes(self, other: Scenario) -> tuple[tuple[str, Any, Any], ...]:
        """(field, this value, the other's value) for every field where `other` differs."""
        return tuple(
            (f.name, getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what a policy file records)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "scenario") -> Scenario:
        """A Scenario from a mapping (a policy file's "scenario"); SpecError names the field."""
        return from_mapping(cls, data, where)

    def replace(self, **changes: Any) -> Scenario:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def resolve(self) -> ResolvedScenario:
        """Load every spec the scenario names (SpecError naming the field and file)."""
        cal = Calibration.load(self.calibration) if self.calibration else None
        target, drafter, workload = self.resolve_pair()
        inter = inter_drafter = trees = chains = None
        if self.intermediate:
            inter = load_model(self.intermediate)
            inter_drafter = (
                load_model(self.intermediate_drafter) if self.intermediate_drafter else drafter
            )
            check_intermediate(target, inter, inter_drafter)
            raw = load_workload(self.workload)
            trees = workload_for_pair(raw, inter, inter_drafter)
            chains = intermediate_workload(raw, target, inter)
        return ResolvedScenario(
            scenario=self,
            hardware=load_hardware(self.gpu),
            target=target,
            drafter=drafter,
            workload=workload,
            calibration=cal,
            engine=load_engine(self.engine),
            intermediate=inter,
            intermediate_drafter=inter_drafter,
            intermediate_trees=trees,
            intermediate_chains=chains,
        )

    def resolve_pair(self) -> tuple[ModelSpec, ModelSpec | None, Workload]:
        """The target, the drafter (None: retrieval only) and the workload with that pair's
        acceptance (specs.workload.workload_for_pair: the pair's preset, or the nearest with a
        PairWarning naming it), after check_pair: what acceptance needs, without the GPU,
        calibration and engine that resolve() also loads."""
        target = load_model(self.target)
        drafter = load_model(self.drafter) if self.has_drafter else None
        check_pair(target, drafter)
        return target, drafter, load_workload(self.workload, target=target, drafter=drafter)


@dataclass(frozen=True)
class ResolvedScenario:
    """A Scenario with its specs loaded: what cost models, objectives and exports are built from."""

    scenario: Scenario
    hardware: HardwareSpec
    target: ModelSpec
    drafter: ModelSpec | None  # None: retrieval drafting only (drafter "none")
    workload: Workload
    calibration: Calibration | None
    engine: EngineProfile = field(default_factory=lambda: load_engine("spectune"))
    intermediate: ModelSpec | None = None
    """hierarchical drafting's intermediate model (None: no hierarchical policies)"""
    intermediate_drafter: ModelSpec | None = None
    """the model growing the trees the intermediate verifies (the drafter unless named)"""
    intermediate_trees: Workload | None = None
    """acceptance of the intermediate drafter's trees against the intermediate"""
    intermediate_chains: Workload | None = None
    """acceptance of the intermediate's chains against the target"""

    @property
    def tp(self) -> int:
        return self.scenario.tp

    @property
    def label(self) -> str:
        """Scenario.label with the specs' own names (an uploaded or user file by its name)."""
        drafter = self.drafter.name if self.drafter is not None else "no drafter"
        if self.intermediate is not None:
            drafter += f" (intermediate {self.intermediate.name})"
        cal = self.scenario.calibration
        cal = f", calibration {os.path.basename(cal)}" if cal else ""
        return (
            f"{self.target.name} + {drafter} on {self.hardware.name} (tp {self.tp}), "
            f"workload {self.workload.name}{cal}"
        )
