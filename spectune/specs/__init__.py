"""Shared domain types: what every part of spectune speaks. Imports nothing else of ours."""

from spectune.specs.calibration import Calibration, load_calibration
from spectune.specs.errors import SpecError
from spectune.specs.hardware import HARDWARE_PRESETS, HardwareSpec, hardware_preset, load_hardware
from spectune.specs.io import read_mapping, write_json_atomic, write_text_atomic
from spectune.specs.model import MODEL_PRESETS, ModelSpec, load_model, model_preset
from spectune.specs.policy import Bucket, PolicyTable, Prediction, TreePolicy, policy_label
from spectune.specs.scenario import NO_DRAFTER, ResolvedScenario, Scenario
from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL, SOURCE_ROOT, DraftTree
from spectune.specs.workload import WORKLOAD_PRESETS, Workload, load_workload

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "NO_DRAFTER",
    "SOURCE_MODEL",
    "SOURCE_RETRIEVAL",
    "SOURCE_ROOT",
    "WORKLOAD_PRESETS",
    "Bucket",
    "Calibration",
    "DraftTree",
    "HardwareSpec",
    "ModelSpec",
    "PolicyTable",
    "Prediction",
    "ResolvedScenario",
    "Scenario",
    "SpecError",
    "TreePolicy",
    "Workload",
    "hardware_preset",
    "load_calibration",
    "load_hardware",
    "load_model",
    "load_workload",
    "model_preset",
    "policy_label",
    "read_mapping",
    "write_json_atomic",
    "write_text_atomic",
]
