"""Acceptance models: how likely each node of a draft tree is to be accepted by the target.

One interface (`AcceptanceModel`, see base) and one file per model: positional (Sequoia,
Medusa, chain statistics), confidence-calibrated (EAGLE-2), retrieval (prompt lookup, REST,
suffix trees) and trace replay (recorded steps, exact). `acceptance_model(workload)` builds the
model a Workload describes.
"""

from __future__ import annotations

from spectune.planner.acceptance.base import (
    AcceptanceModel,
    CandidateBank,
    RetrievalProfile,
    children_table,
    model_sibling_rank,
    path_products,
)
from spectune.planner.acceptance.confidence import ConfidenceAcceptance
from spectune.planner.acceptance.positional import PositionalAcceptance
from spectune.planner.acceptance.replay import ReplayStep, TraceReplay, map_to_pool
from spectune.planner.acceptance.retrieval import RetrievalAcceptance, chain_conditionals
from spectune.specs.workload import Workload, load_workload


def acceptance_model(workload: Workload | str) -> AcceptanceModel:
    """The acceptance model a workload (or a workload preset name / file) describes.
    Models are cached per workload, so repeated calls share their candidate banks."""
    wl = load_workload(workload) if isinstance(workload, str) else workload
    model = _CACHE.get(wl)
    if model is None:
        model = (
            PositionalAcceptance.from_workload(wl)
            if wl.acceptance == "positional"
            else ConfidenceAcceptance(wl)
        )
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[wl] = model
    return model


_CACHE: dict[Workload, AcceptanceModel] = {}

__all__ = [
    "AcceptanceModel",
    "CandidateBank",
    "ConfidenceAcceptance",
    "PositionalAcceptance",
    "ReplayStep",
    "RetrievalAcceptance",
    "RetrievalProfile",
    "TraceReplay",
    "acceptance_model",
    "chain_conditionals",
    "children_table",
    "map_to_pool",
    "model_sibling_rank",
    "path_products",
]
