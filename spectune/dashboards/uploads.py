"""Uploaded files, parsed as data and never as code: JSON or TOML into plain dicts and then
into the specs' frozen dataclasses (HardwareSpec, ModelSpec, Workload, PolicyTable), arrival
traces through the simulator's CSV/JSONL reader, acceptance traces through the planner's
spectune.trace/v1 reader. Every file is checked against a size limit first and read within the
bounds of spectune.specs.io (nesting, numbers, strings, decompressed bytes), and every problem
becomes a SpecError that names the file, so a page shows one clear line instead of a traceback.
Nothing is unpickled, imported or evaluated. A spec that parsed is kept as a file under the
temporary folder (spectune-uploads/, named by its content) so that a Scenario can name it by
path; apart from those files, which the server wrote itself, nothing an upload names is opened
on the server: a policy's or a measurement's target, drafter, GPU and workload must be presets
or such kept uploads (dashboards.plans.scenario_for_table, dashboards.artifacts.check_measurement).
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from spectune.specs import HardwareSpec, ModelSpec, PolicyTable, SpecError, Workload
from spectune.specs.io import SPEC_LIMITS, from_mapping, parse_document, write_text_atomic

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


def upload_folder() -> Path:
    """Where parsed uploads are kept (the server writes them; Scenarios name them by path)."""
    return Path(tempfile.gettempdir()) / "spectune-uploads"


def is_kept_upload(name: str) -> bool:
    """Whether `name` is a file this server kept from an upload (so a Scenario may name it)."""
    try:
        return Path(name).resolve().parent == upload_folder().resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _keep(name: str, data: bytes) -> str:
    """An uploaded spec, already parsed, kept as a file named by its content (so a Scenario
    names it by path like any user spec file, and the same upload is the same path)."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = upload_folder()
    folder.mkdir(exist_ok=True)
    path = folder / f"{digest}{Path(name).suffix.lower()}"
    if not path.is_file():
        write_text_atomic(path, data.decode("utf-8"))
    return str(path)


def hardware_file_from_upload(name: str, data: bytes) -> tuple[HardwareSpec, str]:
    """The uploaded GPU spec and the file it is kept as (a Scenario's `gpu`)."""
    return hardware_from_upload(name, data), _keep(name, data)


def model_file_from_upload(name: str, data: bytes) -> tuple[ModelSpec, str]:
    """The uploaded model spec and the file it is kept as (a Scenario's target or drafter)."""
    return model_from_upload(name, data), _keep(name, data)


def workload_file_from_upload(name: str, data: bytes) -> tuple[Workload, str]:
    """The uploaded workload and the file it is kept as (a Scenario's `workload`)."""
    return workload_from_upload(name, data), _keep(name, data)


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
