"""Dashboard uploads and measurement documents under hostile input: uploads stay data (any bytes
give a SpecError naming the upload or a valid object, and nothing an upload names is opened on
the server), and measurement / calibration-run documents that would let the CI gate pass
(NaN, zero, missing values, no runs) are refused."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.dashboards import uploads
from spectune.specs import SpecError
from spectune.validate.measure import validate_calibration_run, validate_measurement

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENT = json.loads((ROOT / "measurements/h200/execute-static.json").read_text())
RUN = json.loads((ROOT / "measurements/h200/calibrate-run.json").read_text())
POLICY = json.loads((ROOT / "measurements/h200/policy-planned.json").read_text())

UPLOADERS = {
    "gpu.json": uploads.hardware_from_upload,
    "model.json": uploads.model_from_upload,
    "workload.toml": uploads.workload_from_upload,
    "policy.json": uploads.policy_from_upload,
    "arrivals.csv.gz": uploads.trace_from_upload,
    "arrivals.jsonl": uploads.trace_from_upload,
    "trace.jsonl.gz": uploads.acceptance_trace_from_upload,
}


@pytest.mark.parametrize("name", UPLOADERS)
@given(blob=st.binary(max_size=2000))
@settings(max_examples=40)
def test_any_bytes_are_data_or_a_spec_error(name: str, blob: bytes) -> None:
    for data in (blob, gzip.compress(blob), b"\x1f\x8b\x08\x00" + blob):
        try:
            UPLOADERS[name](name, data)
        except SpecError as e:
            assert str(e).startswith(name) or name in str(e)


@pytest.mark.parametrize("name", ["gpu.json", "policy.json", "arrivals.jsonl", "trace.jsonl.gz"])
@pytest.mark.parametrize(
    "blob",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": ' + b"9" * 5000 + b"}",
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b"\xff\xfe\x00",
    ],
    ids=["deep", "hugeint", "nan", "bigfloat", "binary"],
)
def test_hostile_documents_are_refused(name: str, blob: bytes) -> None:
    data = gzip.compress(blob) if name.endswith(".gz") else blob
    with pytest.raises(SpecError, match=name.replace(".", r"\.")):
        UPLOADERS[name](name, data)


def test_upload_bombs_stop_at_the_decompressed_limit() -> None:
    from spectune.specs.io import TRACE_LIMITS

    zeros = gzip.compress(b"\0" * (TRACE_LIMITS.max_bytes + 1), compresslevel=1)
    assert len(zeros) < uploads.MAX_TRACE_BYTES
    for name in ("arrivals.csv.gz", "trace.jsonl.gz"):
        with pytest.raises(SpecError, match=name.replace(".", r"\.")):
            UPLOADERS[name](name, zeros)


def test_an_uploaded_policy_naming_a_file_is_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy whose target, drafter, GPU and workload are server paths: the page uses its own
    specs, and no spec loader is ever called with a path."""
    from spectune.dashboards import data, plans
    from spectune.specs import io

    secret = tmp_path / "server-spec.json"
    secret.write_text(json.dumps({"name": "x"}))
    doc = {**POLICY, "target": str(secret), "drafter": "/etc/passwd", "hardware": "../x.toml",
           "workload": str(secret)}  # fmt: skip
    table = uploads.policy_from_upload("policy.json", json.dumps(doc).encode())
    opened: list[str] = []
    real = io.read_mapping

    def spy(path: Any) -> Any:
        opened.append(str(path))
        return real(path)

    monkeypatch.setattr(io, "read_mapping", spy)
    fallback = data.DEFAULT_SCENARIO
    scn, note = plans.scenario_for_table(table, fallback)
    assert opened == []
    assert scn.target == fallback.target and scn.gpu == fallback.gpu
    assert scn.drafter == fallback.drafter and scn.workload == fallback.workload
    assert "names a file on this server" in note


def test_an_uploaded_measurement_naming_a_file_is_refused(tmp_path: Path) -> None:
    from spectune.dashboards import artifacts

    doc = {**MEASUREMENT, "hardware": str(tmp_path / "gpu.json")}
    with pytest.raises(SpecError, match=r"m\.json: field 'hardware' names a file"):
        artifacts.measurement_from_upload("m.json", json.dumps(doc).encode())


# ---- measurement and calibration-run documents ------------------------------------------------
HOSTILE = [float("nan"), float("inf"), -1.0, 0.0, "1", None, [], {}, True, 10**30]


def _set(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    node = d
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return d


RUN_FIELDS = [
    "batch",
    "nodes",
    "accepted_mean",
    "tokens_per_s",
    "ar_step_ms",
    "speedup",
    "policy",
    "phases_ms",
]


def _valid_run_value(key: str, value: Any) -> bool:
    """Whether a run may hold `value` at `key`: speculation off, a zero phase, no accepted
    tokens, and (up to the 1e30 bound on numbers) a huge rate or time are valid."""
    if key == "policy":
        return value is None or value is KeyError
    if value == 10**30 and not isinstance(value, bool):
        return key in ("tokens_per_s", "ar_step_ms", "speedup", "phases_ms.step",
                       "phases_ms.verify", "ar_phases_ms.verify")  # fmt: skip
    is_zero = isinstance(value, float) and value == 0.0
    return is_zero and key in ("phases_ms.verify", "accepted_mean")


@given(
    i=st.integers(0, len(MEASUREMENT["runs"]) - 1),
    key=st.sampled_from([*RUN_FIELDS, "phases_ms.step", "phases_ms.verify", "ar_phases_ms.verify"]),
    value=st.sampled_from([*HOSTILE, KeyError]),
)
def test_measurements_with_a_bad_value_are_refused(i: int, key: str, value: Any) -> None:
    doc = _set(MEASUREMENT, ["runs", i, *key.split(".")], value)
    if _valid_run_value(key, value):
        validate_measurement(doc, "m.json")
    else:
        with pytest.raises(SpecError, match=rf"m\.json: runs\[{i}\]"):
            validate_measurement(doc, "m.json")


@pytest.mark.parametrize(
    "key", ["schema", "gpu", "hardware", "target", "drafter", "context", "runs"]
)
@pytest.mark.parametrize("value", [KeyError, None, 3.5, [], "x"])
def test_measurement_top_fields(key: str, value: Any) -> None:
    if value == "x" and key in ("gpu", "hardware", "target", "drafter"):
        return
    doc = _set(MEASUREMENT, [key], value)
    with pytest.raises(SpecError, match=r"m\.json"):
        validate_measurement(doc, "m.json")


def test_measurement_without_runs_is_refused() -> None:
    with pytest.raises(SpecError, match="'runs' is empty"):
        validate_measurement({**MEASUREMENT, "runs": []}, "m.json")


@given(
    kind=st.sampled_from(["verify", "gemm"]),
    key=st.sampled_from(["batch", "tokens", "context", "m", "n", "k", "seconds"]),
    value=st.sampled_from([*HOSTILE, KeyError]),
)
def test_calibration_runs_with_a_bad_value_are_refused(kind: str, key: str, value: Any) -> None:
    row = RUN[kind][0]
    if key not in row:
        return
    doc = _set(RUN, [kind, 0, key], value)
    with pytest.raises(SpecError, match=rf"run\.json: {kind}\[0\]"):
        validate_calibration_run(doc, "run.json")


@pytest.mark.parametrize(
    "doc",
    [[RUN], {**RUN, "schema": "spectune.measurement/v1"}, {**RUN, "verify": [], "gemm": []},
     {k: v for k, v in RUN.items() if k != "hardware"}, {**RUN, "verify": "all"}],
    ids=["array", "schema", "no-rows", "no-hardware", "verify-string"],
)  # fmt: skip
def test_calibration_run_documents_are_refused(doc: Any) -> None:
    with pytest.raises(SpecError, match=r"run\.json"):
        validate_calibration_run(doc, "run.json")


def test_committed_documents_are_valid() -> None:
    """Every committed measurement and calibration run passes the stricter validation."""
    n = 0
    for p in sorted((ROOT / "measurements").rglob("*.json")):
        doc = json.loads(p.read_text())
        if not isinstance(doc, dict):
            continue
        if doc.get("schema") == "spectune.measurement/v1":
            validate_measurement(doc, str(p))
            n += 1
        elif doc.get("schema") == "spectune.calibration-run/v1":
            validate_calibration_run(doc, str(p))
            n += 1
    assert n >= 10 and math.isfinite(n)
