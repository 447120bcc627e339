"""Uploaded files, parsed as data and never as code: JSON or TOML into plain dicts and then
into the specs' frozen dataclasses (HardwareSpec, ModelSpec, Workload, PolicyTable), arrival
traces through the simulator's CSV/JSONL reader, acceptance traces through the planner's
spectune.trace/v1 reader. Every file is checked against a size limit first and read within the
bounds of spectune.specs.io (nesting, numbers, strings, decompressed bytes), and every problem
becomes a SpecError that names the file, so a page shows one clear line instead of a traceback.
Nothing is unpickled, imported or evaluated, and nothing an upload names is opened on the
server: a policy's or a measurement's target, drafter, GPU and workload are preset names
(dashboards.plans.scenario_for_table uses the page's own, possibly uploaded, specs for any other
name; dashboards.artifacts.check_measurement rejects a measurement naming a file).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from spectune.specs import HardwareSpec, ModelSpec, PolicyTable, SpecError, Workload
from spectune.specs.io import SPEC_LIMITS, from_mapping, parse_document

MAX_SPEC_BYTES = 1 << 20  # specs, policies, measurements, benchmark results: 1 MiB
MAX_TRACE_BYTES = 32 << 20  # arrival and acceptance traces: 32 MiB

T = TypeVar("T")


def parse_mapping(name: str, data: bytes, limit: int = MAX_SPEC_BYTES) -> dict[str, Any]:
    """A JSON or TOML document (by the file name's suffix) as a dict, within the reading bounds
    of specs.io (nesting, numbers, strings) and `limit` bytes; SpecError otherwise."""
    return parse_document(name, data, dataclasses.replace(SPEC_LIMITS, max_bytes=limit))


def _build(cls: type[T], name: str, data: bytes) -> T:
    doc = parse_mapping(name, data)
    try:
        return from_mapping(cls, doc, name)
    except SpecError:
        raise
    except (TypeError, ValueError) as e:  # a field of the wrong shape deep inside
        raise SpecError(f"{name}: {e}") from None


def hardware_from_upload(name: str, data: bytes) -> HardwareSpec:
    return _build(HardwareSpec, name, data)


def model_from_upload(name: str, data: bytes) -> ModelSpec:
    return _build(ModelSpec, name, data)


def workload_from_upload(name: str, data: bytes) -> Workload:
    return _build(Workload, name, data)


def policy_from_upload(name: str, data: bytes) -> PolicyTable:
    doc = parse_mapping(name, data)
    try:
        return PolicyTable.from_dict(doc, name)
    except SpecError:
        raise
    except (TypeError, ValueError) as e:
        raise SpecError(f"{name}: {e}") from None


def trace_from_upload(name: str, data: bytes) -> Any:
    """An arrival trace (CSV or JSONL, optionally .gz) through the simulator's reader."""
    from spectune.simulator import load_trace

    if len(data) > MAX_TRACE_BYTES:
        raise SpecError(f"{name}: {len(data)} bytes is over the {MAX_TRACE_BYTES}-byte limit")
    base = Path(name).name.lower()
    suffix = next((s for s in (".csv.gz", ".jsonl.gz", ".csv", ".jsonl") if base.endswith(s)), None)
    if suffix is None:
        raise SpecError(f"{name}: expected a .csv or .jsonl trace (optionally .gz)")
    with tempfile.TemporaryDirectory(prefix="spectune-upload-") as tmp:
        path = Path(tmp) / f"upload{suffix}"
        path.write_bytes(data)
        try:
            trace = load_trace(path)
        except SpecError as e:
            raise SpecError(str(e).replace(str(path), name)) from None
    return dataclasses.replace(trace, source=name)


def acceptance_trace_from_upload(name: str, data: bytes) -> tuple[str, Any, str]:
    """A recorded acceptance trace (spectune.trace/v1 JSONL, optionally .gz) as the planner's
    TraceReplay model: (content key, model, label)."""
    import hashlib

    from spectune.planner.acceptance import TraceReplay
    from spectune.specs.trace import read_trace

    if len(data) > MAX_TRACE_BYTES:
        raise SpecError(f"{name}: {len(data)} bytes is over the {MAX_TRACE_BYTES}-byte limit")
    base = Path(name).name.lower()
    suffix = next((s for s in (".jsonl.gz", ".jsonl") if base.endswith(s)), None)
    if suffix is None:
        raise SpecError(f"{name}: expected a spectune.trace/v1 .jsonl or .jsonl.gz file")
    with tempfile.TemporaryDirectory(prefix="spectune-upload-") as tmp:
        path = Path(tmp) / f"trace{suffix}"
        path.write_bytes(data)
        try:
            header, steps = read_trace(path)
            model = TraceReplay(steps)
        except SpecError as e:
            raise SpecError(str(e).replace(str(path), name)) from None
        except (OSError, EOFError, ValueError, TypeError, KeyError) as e:
            raise SpecError(f"{name}: not a readable trace: {e}") from None
    label = f"{Path(name).name} ({header.model} / {header.drafter} on {header.prompt_set}, {len(steps)} steps)"
    return hashlib.sha256(data).hexdigest()[:16], model, label
