"""Every reader of user files under hostile input: nesting, huge integers, NaN and infinities,
wrong types, truncated or garbage gzip, decompression bombs. A reader either returns a valid
object or raises SpecError naming the file (and the field); never another exception, never
unbounded memory."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.simulator.arrivals import load_trace
from spectune.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    Calibration,
    PolicyTable,
    SpecError,
    load_hardware,
    load_model,
    load_workload,
)
from spectune.specs.io import (
    MAX_ABS_INT,
    SPEC_LIMITS,
    TRACE_LIMITS,
    Limits,
    check_values,
    iter_lines,
    loads_json,
    loads_toml,
    parse_document,
    read_bytes_bounded,
)
from spectune.specs.trace import read_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "traces" / "smollm2-mtbench.jsonl.gz"

# Hostile scalars: what a JSON document may carry that no spec field can take.
HOSTILE_LITERALS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "9" * 400,
    "9" * 20,
    "1e31",
    "[" * 5000 + "]" * 5000,
    '"' + "x" * 70_000 + '"',
    "[]",
    "{}",
    "null",
    "true",
    '"fast"',
    "-1",
    "0",
]


def _plain(obj: Any) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(obj)))
    return d


def _with_literal(doc: dict[str, Any], key: str, literal: str) -> str:
    return json.dumps({**doc, key: "__X__"}).replace('"__X__"', literal)


def _only_spec_error(fn: Any, *args: Any) -> Any:
    """fn(*args), or None where it raised SpecError (a non-empty message); any other exception
    fails the test."""
    try:
        return fn(*args)
    except SpecError as e:
        assert str(e).strip()
        return None


# ---- the bounded JSON/TOML loader -------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=30,
)


def _in_bounds(v: Any, depth: int = 0) -> bool:
    if isinstance(v, dict):
        return depth < SPEC_LIMITS.max_depth and all(_in_bounds(x, depth + 1) for x in v.values())
    if isinstance(v, list):
        return depth < SPEC_LIMITS.max_depth and all(_in_bounds(x, depth + 1) for x in v)
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return True
    if isinstance(v, int):
        return abs(v) <= MAX_ABS_INT
    return math.isfinite(v) and abs(v) <= 1e30


@given(json_values)
def test_loads_json_accepts_exactly_the_bounded_documents(value: Any) -> None:
    text = json.dumps(value)  # NaN / Infinity written as Python's extensions
    if _in_bounds(value):
        assert loads_json(text, "doc.json") == value
    else:
        with pytest.raises(SpecError, match=r"^doc\.json: "):
            loads_json(text, "doc.json")


@given(st.binary(max_size=400))
def test_arbitrary_bytes_are_a_spec_error_or_a_document(data: bytes) -> None:
    for name in ("x.json", "x.toml"):
        try:
            doc = parse_document(name, data)
        except SpecError as e:
            assert str(e).startswith(name)
        else:
            assert isinstance(doc, dict)


@given(st.text(max_size=200))
def test_arbitrary_text_is_a_spec_error_or_a_document(text: str) -> None:
    for fn in (loads_json, loads_toml):
        try:
            fn(text, "t")
        except SpecError as e:
            assert str(e).startswith("t: ")


@given(st.integers(min_value=SPEC_LIMITS.max_depth + 1, max_value=200_000))
def test_deep_nesting_is_refused(depth: int) -> None:
    with pytest.raises(SpecError, match="nested too deeply"):
        loads_json('{"a": ' + "[" * depth + "]" * depth + "}", "deep.json")
    with pytest.raises(SpecError, match=r"deep\.toml"):
        loads_toml("a = " + "[" * min(depth, 5000) + "]" * min(depth, 5000), "deep.toml")


@given(
    st.integers(min_value=MAX_ABS_INT + 1, max_value=10**4000)
    | st.integers(max_value=-MAX_ABS_INT - 1, min_value=-(10**4000))
)
def test_huge_integers_are_refused_with_their_field(v: int) -> None:
    with pytest.raises(SpecError, match=r"big\.json: .*(field 'runs'\[0\]\['batch'\]|integer)"):
        loads_json('{"runs": [{"batch": ' + str(v) + "}]}", "big.json")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-2e308"])
def test_non_finite_numbers_are_refused_with_their_field(literal: str) -> None:
    with pytest.raises(SpecError, match=r"m\.json: field 'runs'\[3\]\['speedup'\]"):
        loads_json('{"runs": [0, 1, 2, {"speedup": ' + literal + "}]}", "m.json")
    with pytest.raises(SpecError, match=r"m\.toml: field 'x'"):
        loads_toml(f"x = {literal.lower().replace('infinity', 'inf')}", "m.toml")


def test_counts_and_strings_are_bounded() -> None:
    small = Limits(max_items=10, max_string=5)
    with pytest.raises(SpecError, match="more than 10 values"):
        check_values(list(range(11)), "w", small)
    with pytest.raises(SpecError, match=r"field 'k': string over 5"):
        check_values({"k": "abcdef"}, "w", small)
    with pytest.raises(SpecError, match="key"):
        check_values({"abcdef": 1}, "w", small)


# ---- specs ------------------------------------------------------------------------------------
SPEC_KINDS = {
    "hardware": (_plain(HARDWARE_PRESETS["h100-sxm"]), load_hardware),
    "model": (_plain(MODEL_PRESETS["llama-3.1-8b"]), load_model),
    "workload": (_plain(WORKLOAD_PRESETS["mt-bench"]), load_workload),
    "calibration": (
        {"schema": "spectune.calibration/v1", **_plain(Calibration())},
        Calibration.load,
    ),
}


@pytest.mark.parametrize("kind", SPEC_KINDS)
@given(data=st.data())
@settings(max_examples=40)
def test_spec_files_with_a_hostile_field(
    kind: str, data: st.DataObject, tmp_path_factory: Any
) -> None:
    base, load = SPEC_KINDS[kind]
    key = data.draw(st.sampled_from(sorted(base)))
    literal = data.draw(st.sampled_from(HOSTILE_LITERALS))
    path = tmp_path_factory.mktemp(kind) / f"{kind}.json"
    path.write_text(_with_literal(base, key, literal))
    try:
        spec = load(path)
    except SpecError as e:
        msg = str(e)
        assert f"{kind}.json" in msg and "\n" not in msg
        if literal in ("NaN", "Infinity", "1e400") or literal.startswith("9" * 20):
            assert key in msg  # the field is named
    else:  # accepted: every number it holds is finite
        for v in dataclasses.asdict(spec).values():
            if isinstance(v, float):
                assert math.isfinite(v)


@pytest.mark.parametrize(
    "field,value",
    [
        ("hbm_bytes_per_s", 1e-300),
        ("hbm_bytes_per_s", 1e29),
        ("peak_bf16_flops", 1.0),
        ("gemm_efficiency", 1e-200),
        ("sm_count", 10**15),
        ("launch_s", 1e6),
    ],
)
def test_hardware_values_out_of_physical_range_are_refused(
    field: str, value: float, tmp_path: Path
) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({**SPEC_KINDS["hardware"][0], field: value}))
    with pytest.raises(SpecError, match=rf"gpu\.json: .*{field}"):
        load_hardware(path)


def test_spec_files_of_the_wrong_kind(tmp_path: Path) -> None:
    (tmp_path / "d.json").mkdir()
    cases = {
        "binary.json": os.urandom(3000),
        "array.json": b"[1, 2]",
        "empty.json": b"",
        "bad.toml": b"name = \n",
        "spec.yaml": b"name: x\n",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
    for name in [*cases, "d.json", "missing.json"]:
        with pytest.raises(SpecError, match=name.replace(".", r"\.")):
            load_hardware(tmp_path / name)


# ---- policies ---------------------------------------------------------------------------------
def _policy_doc() -> dict[str, Any]:
    d: dict[str, Any] = json.loads((ROOT / "measurements/h200/policy-planned.json").read_text())
    return d


@given(data=st.data())
@settings(max_examples=60)
def test_policy_files_with_a_hostile_value(data: st.DataObject, tmp_path_factory: Any) -> None:
    doc = _policy_doc()
    i = data.draw(st.integers(0, len(doc["buckets"]) - 1))
    where = data.draw(st.sampled_from(["top", "bucket", "policy", "predicted"]))
    literal = data.draw(st.sampled_from(HOSTILE_LITERALS))
    marker = '"__X__"'
    if where == "top":
        key = data.draw(st.sampled_from(["target", "tp", "temperature", "buckets", "schema"]))
        text = json.dumps({**doc, key: "__X__"})
    else:
        b = dict(doc["buckets"][i])
        if where == "bucket":
            b[data.draw(st.sampled_from(["batch", "context", "policy"]))] = "__X__"
        else:
            inner = dict(b.get(where) or {"builder": "static", "depth": 2, "topk": 2, "budget": 4})
            inner[data.draw(st.sampled_from(sorted(inner)))] = "__X__"
            b[where] = inner
        buckets = [*doc["buckets"][:i], b, *doc["buckets"][i + 1 :]]
        text = json.dumps({**doc, "buckets": buckets})
    path = tmp_path_factory.mktemp("p") / "policy.json"
    path.write_text(text.replace(marker, literal))
    table = _only_spec_error(PolicyTable.load, path)
    if table is not None:
        for b in table.buckets:
            if b.predicted:
                assert all(math.isfinite(v) for v in dataclasses.asdict(b.predicted).values())


def test_policy_file_errors_name_the_file(tmp_path: Path) -> None:
    for name, blob in {
        "binary.json": os.urandom(500),
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "array.json": b"[]",
        "nan.json": json.dumps(_policy_doc()).replace('"tp": 1', '"tp": NaN').encode(),
    }.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(SpecError, match=name.replace(".", r"\.")):
            PolicyTable.load(tmp_path / name)


# ---- acceptance traces (spectune.trace/v1) ----------------------------------------------------
def _trace_lines(n: int = 6) -> list[str]:
    with gzip.open(TRACE, "rt") as fh:
        return [next(fh) for _ in range(n)]


def _read_all(path: Path) -> Any:
    return read_trace(path)


@given(cut=st.integers(min_value=10, max_value=4000))
@settings(max_examples=30)
def test_truncated_gzip_trace(cut: int, tmp_path_factory: Any) -> None:
    blob = gzip.compress("".join(_trace_lines()).encode())
    path = tmp_path_factory.mktemp("t") / "cut.jsonl.gz"
    path.write_bytes(blob[: min(cut, len(blob) - 1)])
    with pytest.raises(SpecError, match=r"cut\.jsonl\.gz"):
        read_trace(path)


@given(blob=st.binary(min_size=1, max_size=3000), gz_suffix=st.booleans(), gz_content=st.booleans())
@settings(max_examples=40)
def test_garbage_traces(
    blob: bytes, gz_suffix: bool, gz_content: bool, tmp_path_factory: Any
) -> None:
    name = "g.jsonl.gz" if gz_suffix else "g.jsonl"
    path = tmp_path_factory.mktemp("t") / name
    path.write_bytes(gzip.compress(blob) if gz_content else b"\x1f\x8b\x08\x00" + blob)
    with pytest.raises(SpecError, match=name.replace(".", r"\.")):
        read_trace(path)


@given(data=st.data())
@settings(max_examples=60)
def test_trace_steps_with_a_hostile_field(data: st.DataObject, tmp_path_factory: Any) -> None:
    header, *steps = _trace_lines(3)
    step = json.loads(steps[0])
    key = data.draw(st.sampled_from(sorted(step)))
    literal = data.draw(st.sampled_from(HOSTILE_LITERALS))
    if isinstance(step[key], list) and data.draw(st.booleans()):
        lst = list(step[key])
        lst[data.draw(st.integers(0, len(lst) - 1))] = "__X__"
        text = json.dumps({**step, key: lst})
    else:
        text = json.dumps({**step, key: "__X__"})
    path = tmp_path_factory.mktemp("t") / "s.jsonl"
    path.write_text(header + text.replace('"__X__"', literal) + "\n")
    try:
        read_trace(path)
    except SpecError as e:
        assert "s.jsonl:2" in str(e)


def test_trace_bomb_stops_at_the_decompressed_limit(tmp_path: Path) -> None:
    """Small gzips of newlines, of zeros and of a 60 MB line stop at TRACE_LIMITS without holding
    more than a chunk and a line of memory."""
    header = _trace_lines(1)[0].encode()
    over = TRACE_LIMITS.max_bytes + (1 << 20)
    bombs = {
        "newlines.jsonl.gz": header + b"\n" * over,
        "zeros.jsonl.gz": b"\0" * over,
        "oneline.jsonl.gz": header + b"[" + b"1," * (over // 2) + b"1]\n",
    }
    for name, raw in bombs.items():
        path = tmp_path / name
        path.write_bytes(gzip.compress(raw, compresslevel=1))
        assert path.stat().st_size < over // 50
        tracemalloc.start()
        try:
            with pytest.raises(SpecError, match=name.replace(".", r"\.")):
                read_trace(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 * TRACE_LIMITS.max_line_bytes, (name, peak)  # a chunk split, a line


def test_trace_of_valid_steps_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid steps repeated past the decompressed limit (a smaller one here, for speed)."""
    import spectune.specs.trace as trace_mod

    monkeypatch.setattr(
        trace_mod, "TRACE_LIMITS", dataclasses.replace(TRACE_LIMITS, max_bytes=1 << 20)
    )
    header, step = _trace_lines(2)
    path = tmp_path / "steps.jsonl.gz"
    path.write_bytes(gzip.compress((header + step * ((2 << 20) // len(step))).encode()))
    with pytest.raises(SpecError, match=r"steps\.jsonl\.gz: more than 1048576 bytes"):
        read_trace(path)


def test_line_reader_bounds_lines_and_bytes(tmp_path: Path) -> None:
    small = Limits(max_bytes=100, max_line_bytes=10)
    (tmp_path / "long.txt").write_bytes(b"x" * 50 + b"\n")
    with pytest.raises(SpecError, match=r"long\.txt:1: line longer"):
        list(iter_lines(tmp_path / "long.txt", small))
    (tmp_path / "many.txt").write_bytes(b"abc\n" * 40)
    with pytest.raises(SpecError, match=r"many\.txt: more than 100 bytes"):
        list(iter_lines(tmp_path / "many.txt", small))
    (tmp_path / "big.json").write_bytes(b" " * 200)
    with pytest.raises(SpecError, match=r"big\.json: more than 100 bytes"):
        read_bytes_bounded(tmp_path / "big.json", small)
    (tmp_path / "utf.txt").write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(SpecError, match=r"utf\.txt:2: not UTF-8"):
        list(iter_lines(tmp_path / "utf.txt", small))


# ---- arrival traces ---------------------------------------------------------------------------
cells = st.sampled_from(
    ["nan", "inf", "-inf", "1e400", "9" * 400, "-3", "0", "2.5", "abc", "", "1e15", "7"]
)


@given(rows=st.lists(st.tuples(cells, cells, cells), min_size=1, max_size=5), gz=st.booleans())
@settings(max_examples=60)
def test_arrival_csv_cells(
    rows: list[tuple[str, str, str]], gz: bool, tmp_path_factory: Any
) -> None:
    text = "arrival_s,prompt_tokens,output_tokens\n" + "".join(",".join(r) + "\n" for r in rows)
    name = "a.csv.gz" if gz else "a.csv"
    path = tmp_path_factory.mktemp("a") / name
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    try:
        trace = load_trace(path)
    except SpecError as e:
        assert name in str(e)
    else:
        assert (trace.prompt_tokens >= 1).all() and (trace.output_tokens >= 1).all()
        assert all(math.isfinite(x) for x in trace.arrival_s)


@given(
    obj=st.dictionaries(
        st.sampled_from(["arrival_s", "prompt_tokens", "output_tokens", "x"]),
        st.sampled_from(HOSTILE_LITERALS),
        min_size=1,
        max_size=4,
    )
)
@settings(max_examples=60)
def test_arrival_jsonl_values(obj: dict[str, str], tmp_path_factory: Any) -> None:
    line = "{" + ", ".join(f'"{k}": {v}' for k, v in obj.items()) + "}"
    path = tmp_path_factory.mktemp("a") / "a.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(SpecError, match=r"a\.jsonl"):
        load_trace(path)


@given(blob=st.binary(min_size=1, max_size=2000), cut=st.integers(min_value=1, max_value=600))
@settings(max_examples=30)
def test_arrival_garbage_and_truncated_gzip(blob: bytes, cut: int, tmp_path_factory: Any) -> None:
    d = tmp_path_factory.mktemp("a")
    (d / "g.csv.gz").write_bytes(b"\x1f\x8b\x08\x00" + blob)
    with pytest.raises(SpecError, match=r"g\.csv\.gz"):
        load_trace(d / "g.csv.gz")
    rows = "arrival_s,prompt_tokens,output_tokens\n" + "0.5,10,10\n" * 200
    whole = gzip.compress(rows.encode())
    (d / "t.csv.gz").write_bytes(whole[: len(whole) - min(cut, len(whole) - 1)])
    with pytest.raises(SpecError, match=r"t\.csv\.gz"):
        load_trace(d / "t.csv.gz")


def test_arrival_bomb_stops_at_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows repeated past the decompressed limit (4 MiB here, for speed) stop there, holding
    the rows read as 32-byte records, never as text; zeros stop at the first long line."""
    import spectune.simulator.arrivals as arrivals

    monkeypatch.setattr(
        arrivals, "TRACE_LIMITS", dataclasses.replace(TRACE_LIMITS, max_bytes=4 << 20)
    )
    path = tmp_path / "bomb.csv.gz"
    row = b"0.5,100,100\n"
    head = b"arrival_s,prompt_tokens,output_tokens\n"
    path.write_bytes(gzip.compress(head + row * ((5 << 20) // len(row)), 1))
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match=r"bomb\.csv\.gz: more than 4194304 bytes"):
            load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20
    zeros = tmp_path / "zeros.csv.gz"
    zeros.write_bytes(gzip.compress(head + b"\0" * (5 << 20), 1))
    with pytest.raises(SpecError, match=r"zeros\.csv\.gz(:2)?: (more than|line longer)"):
        load_trace(zeros)


def test_arrival_trace_request_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import spectune.simulator.arrivals as arrivals

    monkeypatch.setattr(arrivals, "MAX_TRACE_REQUESTS", 10)
    path = tmp_path / "rows.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "0.5,9,9\n" * 11)
    with pytest.raises(SpecError, match=r"rows\.csv: more than 10 requests"):
        load_trace(path)
