"""Engine-output parsers on fixtures the engines' own code printed (tests/data/engines/), on
malformed and hostile input, and on a file too large to hold in memory."""

from __future__ import annotations

import contextlib
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectune.specs import SpecError
from spectune.validate.engine_logs import (
    FORMATS,
    detect_format,
    iter_observations,
    parse_file,
    read_observations,
)
from spectune.validate.engine_logs.base import iter_lines

DATA = Path(__file__).parent / "data" / "engines"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def obs(name: str, speculative: bool = True):
    return read_observations([DATA / name], require_speculative=speculative)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("sglang-0.4.3.log", "sglang-log"),
        ("sglang-0.5.1.log", "sglang-log"),
        ("sglang-0.5.10.log", "sglang-log"),
        ("vllm-0.6.6.post1.log", "vllm-log"),
        ("vllm-0.8.5.log", "vllm-log"),
        ("vllm-0.11.0.log", "vllm-log"),
        ("vllm-0.33.0.log", "vllm-log"),
        ("vllm-0.8.5.metrics", "vllm-prometheus"),
        ("vllm-0.11.0.metrics", "vllm-prometheus"),
        ("vllm-0.33.0.metrics", "vllm-prometheus"),
        ("sglang-bench-serving.jsonl", "sglang-bench-serving"),
        ("sglang-bench-one-batch.jsonl", "sglang-bench-one-batch"),
        ("sglang-bench-one-batch-server.jsonl", "sglang-bench-one-batch-server"),
        ("vllm-bench-serve.json", "vllm-bench-serve"),
        ("vllm-bench-latency.json", "vllm-bench-latency"),
    ],
)
def test_detect_format(name: str, fmt: str) -> None:
    assert detect_format(DATA / name).format_id == fmt
    assert FORMATS[fmt].source  # every format cites the engine source it is taken from


@pytest.mark.parametrize(
    ("name", "variant"),
    [("sglang-0.4.3.log", "0.4.3"), ("sglang-0.5.1.log", "0.4.6"), ("sglang-0.5.10.log", "0.5.10")],
)
def test_sglang_decode_lines(name: str, variant: str) -> None:
    o = obs(name)
    # generate.py SGLANG_INTERVALS: (running, steps, accepted drafts, seconds)
    assert [x.batch for x in o] == [1, 8, 32]
    assert [x.accept_length for x in o] == [3.2, 3.0, 2.25]  # (88+40)/40, (640+320)/320, ...
    assert [x.gen_tokens_per_s for x in o] == [256.0, 960.0, 1440.0]
    assert [x.line for x in o] == [2, 3, 4]
    assert {x.variant for x in o} == {variant}
    assert all(x.queued == 0 and x.process == "TP0" and x.kind == "interval" for x in o)
    assert all(x.cuda_graph is (None if variant == "0.4.3" else True) for x in o)
    if variant == "0.5.10":  # accepted incl. bonus / (steps x 32 draft tokens)
        assert [x.accept_rate for x in o] == [0.10, 0.09, 0.07]
    c = o[0].config
    assert (c.target_model, c.method, c.num_steps, c.topk, c.num_draft_tokens, c.tp) == (
        MODEL,
        "EAGLE3",
        5,
        8,
        32,
        1,
    )
    assert c.draft_model == "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
    assert dict(o[0].extra)["#token"] == "1200"


@pytest.mark.parametrize("version", ["0.8.5", "0.11.0", "0.33.0"])
def test_vllm_v1_log(version: str) -> None:
    o = obs(f"vllm-{version}.log")
    # generate.py VLLM_INTERVALS: 100, 200, 400 drafts of 3 tokens
    assert [x.batch for x in o] == [4, 8, 16]
    assert [x.queued for x in o] == [0, 2, 5]
    assert [x.gen_tokens_per_s for x in o] == [96.0, 180.0, 300.0]
    # 0.8.5 printed 2.00, 1.80, 1.12 (no bonus token): corrected to the same lengths
    assert [x.accept_length for x in o] == [3.0, 2.8, 2.12]
    assert [x.accepted_tokens for x in o] == [200, 360, 450]
    assert [x.draft_tokens for x in o] == [300, 600, 1200]
    assert [x.per_position_accept for x in o] == [
        (0.9, 0.7, 0.4),
        (0.8, 0.5, 0.5),
        (0.75, 0.375, 0.0),
    ]
    assert [x.accept_rate for x in o] == [0.667, 0.6, 0.375]
    assert [x.line for x in o] == [3, 5, 7]  # the spec line; stats merged into it
    new = version != "0.8.5"
    assert [x.accepted_tokens_per_s for x in o] == ([40.0, 72.0, 90.0] if new else [None] * 3)
    assert [x.drafted_tokens_per_s for x in o] == ([60.0, 120.0, 240.0] if new else [None] * 3)
    assert {x.variant for x in o} == {"0.11.0" if new else "0.8.5"}
    c = o[0].config
    assert (c.engine_version, c.target_model, c.method, c.num_steps, c.tp) == (
        version,
        MODEL,
        "eagle3",
        3,
        1,
    )
    assert c.draft_model == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert (
        (o[0].process == "pid=" + o[0].process[4:]) if version == "0.33.0" else o[0].process is None
    )


def test_vllm_v0_log() -> None:
    o = obs("vllm-0.6.6.post1.log")
    assert [x.batch for x in o] == [4, 4]
    assert [x.gen_tokens_per_s for x in o] == [100.0, 106.7]
    assert [x.accept_length for x in o] == [4.1, 4.25]  # emitted / (drafted / k)
    assert [x.drafts for x in o] == [200, 400]
    assert [x.emitted_tokens for x in o] == [820, 1700]
    assert [x.accept_rate for x in o] == [0.62, 0.65]
    assert {x.kind for x in o} == {"counters"} and o[0].config.num_steps == 5


@pytest.mark.parametrize("version", ["0.8.5", "0.11.0", "0.33.0"])
def test_vllm_prometheus(version: str) -> None:
    (o,) = obs(f"vllm-{version}.metrics")
    # two intervals: 300 drafts, 900 draft tokens, 560 accepted; per position 250, 170, 140
    assert (o.drafts, o.draft_tokens, o.accepted_tokens) == (300, 900, 560)
    assert o.accept_length == pytest.approx(1 + 560 / 300)
    assert o.accept_rate == pytest.approx(560 / 900)
    assert o.per_position_accept == pytest.approx((250 / 300, 170 / 300, 140 / 300))
    assert (o.kind, o.process, o.config.target_model) == ("counters", "engine=0", MODEL)


def test_sglang_bench_serving() -> None:
    o = obs("sglang-bench-serving.jsonl")
    assert [x.concurrency for x in o] == [1, 8]
    assert [x.gen_tokens_per_s for x in o] == [238.41, 1544.2]
    assert [x.accept_length for x in o] == [3.1, 2.95]
    assert [x.mean_concurrency for x in o] == [0.97, 7.76]
    assert o[0].config.engine_version == "0.5.10" and o[0].config.topk == 8
    assert o[1].mean_tpot_ms == pytest.approx(8000 / 1544.2)


def test_sglang_one_batch_baseline() -> None:
    with pytest.raises(SpecError, match="none with speculative"):
        obs("sglang-bench-one-batch.jsonl")
    o = obs("sglang-bench-one-batch.jsonl", speculative=False)
    assert [x.batch for x in o] == [1, 16, 64]
    assert [x.decode_step_s for x in o] == [0.00612, 0.00705, 0.00911]
    assert o[2].gen_tokens_per_s == pytest.approx(64 / 0.00911)
    assert (o[0].input_len_tokens, o[0].output_len_tokens) == (1024, 16)


def test_sglang_one_batch_server() -> None:
    o = obs("sglang-bench-one-batch-server.jsonl")
    assert [x.batch for x in o] == [1, 8]
    assert [x.accept_length for x in o] == [3.42, None]  # -1: the server reported none
    assert [x.latency_s for x in o] == [1.2345, 1.9876]
    assert o[0].gen_tokens_per_s == round(256 / (1.2345 - 0.05), 2)


def test_vllm_bench_serve_and_latency() -> None:
    (o,) = obs("vllm-bench-serve.json")
    assert (o.concurrency, o.drafts, o.draft_tokens, o.accepted_tokens) == (4, 7448, 22344, 13034)
    assert o.accept_length == 2.75 and o.accept_rate == pytest.approx(0.58333333)
    assert o.per_position_accept == (0.8, 0.55, 0.4)
    assert o.gen_tokens_per_s == pytest.approx(20480 / 30.25)
    assert o.config.target_model == MODEL
    (lat,) = obs("vllm-bench-latency.json", speculative=False)
    assert lat.latency_s == pytest.approx((0.8312 + 0.8298 + 0.8405) / 3)
    assert lat.batch is None  # the file does not record it: the scenario gives it


# ------------------------------------------------------------------------------------ errors


def test_unknown_format(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text("hello\nworld\n")
    with pytest.raises(SpecError, match=r"x\.log: unknown format"):
        detect_format(p)
    j = tmp_path / "r.json"
    j.write_text('{"a": 1}\n')
    with pytest.raises(SpecError, match=r"r\.json:1: unknown benchmark-result JSON"):
        detect_format(j)
    e = tmp_path / "empty.log"
    e.write_text("\n\n")
    with pytest.raises(SpecError, match="empty file"):
        detect_format(e)


def test_truncated_log(tmp_path: Path) -> None:
    text = (DATA / "vllm-0.11.0.log").read_text()
    cut = text[: text.rindex("Per-position")]  # the file ends inside the last spec line
    p = tmp_path / "cut.log"
    p.write_text(cut)
    with pytest.raises(SpecError, match=r"cut\.log:7: .*truncated"):
        read_observations([p])
    text = (DATA / "sglang-0.5.10.log").read_text()
    p.write_text(text[: text.rindex("gen throughput")])
    with pytest.raises(SpecError, match=r"cut\.log:4: .*truncated"):
        read_observations([p])


def test_truncated_json(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    text = (DATA / "sglang-bench-serving.jsonl").read_text()
    p.write_text(text[:-40])
    with pytest.raises(SpecError, match=r"r\.jsonl:2: not valid JSON.*truncated"):
        read_observations([p])
    q = tmp_path / "lat.json"
    q.write_text((DATA / "vllm-bench-latency.json").read_text()[:-10])
    with pytest.raises(SpecError, match=r"lat\.json:1: not valid JSON"):
        detect_format(q)


def test_no_speculative_lines(tmp_path: Path) -> None:
    lines = (DATA / "sglang-0.4.3.log").read_text().splitlines()
    off = [ln.replace("accept len: 3.20, ", "").replace("accept len: 3.00, ", "") for ln in lines]
    off = [ln.replace("accept len: 2.25, ", "") for ln in off]
    p = tmp_path / "off.log"
    p.write_text("\n".join(off) + "\n")
    with pytest.raises(SpecError, match=r"off\.log: 3 sglang-log records, none with speculative"):
        read_observations([p])
    assert [o.batch for o in read_observations([p], require_speculative=False)] == [1, 8, 32]
    only_args = tmp_path / "start.log"
    only_args.write_text(lines[0] + "\n" + lines[1] + "\n")
    assert len(read_observations([only_args])) == 1


def test_mixed_engines(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="different engines"):
        read_observations([DATA / "sglang-0.5.10.log", DATA / "vllm-0.11.0.log"])
    p = tmp_path / "both.log"
    p.write_text((DATA / "sglang-0.5.10.log").read_text() + (DATA / "vllm-0.11.0.log").read_text())
    with pytest.raises(SpecError, match=r"both\.log:5: a vllm line in a sglang file"):
        read_observations([p])
    q = tmp_path / "mixed.jsonl"
    q.write_text(
        (DATA / "sglang-bench-serving.jsonl").read_text()
        + (DATA / "sglang-bench-one-batch.jsonl").read_text()
    )
    with pytest.raises(SpecError, match=r"mixed\.jsonl:3: a sglang-bench-one-batch result"):
        read_observations([q])


def test_same_engine_files_combine() -> None:
    o = read_observations([DATA / "vllm-0.11.0.log", DATA / "vllm-bench-serve.json"])
    assert [x.format for x in o] == ["vllm-log"] * 3 + ["vllm-bench-serve"]


def test_malformed_values(tmp_path: Path) -> None:
    p = tmp_path / "bad.log"
    p.write_text(
        "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: x, #token: 1, token usage: 0.0, "
        "accept len: 2.0, gen throughput (token/s): 1.0, #queue-req: 0\n"
    )
    with pytest.raises(SpecError, match=r"bad\.log:1: #running-req is not a number"):
        read_observations([p])
    p.write_text(
        "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 1, #token: 1, token usage: 0.0, "
        "accept len: 0.5, gen throughput (token/s): 1.0, #queue-req: 0\n"
    )
    with pytest.raises(SpecError, match="below 1"):
        read_observations([p])
    p.write_text("INFO SpecDecoding metrics: Mean acceptance length: 2.00, garbage\n")
    with pytest.raises(SpecError, match=r"bad\.log:1: unreadable vLLM speculative-decoding line"):
        read_observations([p])
    j = tmp_path / "bad.json"
    j.write_text('{"avg_latency": "fast", "latencies": [], "percentiles": {}}')
    with pytest.raises(SpecError, match="field 'avg_latency' must be a number"):
        read_observations([j], require_speculative=False)


def test_overlong_lines(tmp_path: Path) -> None:
    p = tmp_path / "long.log"
    head = "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 1, "
    p.write_text("x" * 600_000 + "\n" + head + "y" * 300_000 + "\n")
    lines = list(iter_lines(p, 1000))
    assert [(ln.number, ln.overlong, len(ln.text)) for ln in lines] == [
        (1, True, 1000),
        (2, True, 1000),
    ]
    with pytest.raises(SpecError, match=r"long\.log:2: decode line longer than"):
        read_observations([p])


# ------------------------------------------------------------------------- hostile input


_RAW = st.binary(max_size=2000)
_PIECES = st.sampled_from(
    [
        b"Decode batch. ",
        b"#running-req: ",
        b"accept len: ",
        b"gen throughput (token/s): ",
        b"#queue-req: ",
        b"SpecDecoding metrics: ",
        b"Speculative metrics: ",
        b"Mean acceptance length: ",
        b"Per-position acceptance rate: ",
        b"Avg generation throughput: ",
        b"Running: ",
        b" reqs, Waiting: ",
        b"vllm:spec_decode_num_drafts_total",
        b'{engine="0",position="',
        b'{"avg_latency": ',
        b'"model_id": ',
        b"server_args=ServerArgs(",
        b"Initializing a V1 LLM engine (v",
        b", ",
        b"\n",
        b"nan",
        b"1e999",
        b"-3",
        b"{",
        b"[[[[[[[[",
        b"\xff\xfe",
        b"0.5",
        b"12",
    ]
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        _RAW, st.lists(st.one_of(_PIECES, _RAW.map(lambda b: b[:20])), max_size=60).map(b"".join)
    )
)
def test_garbage_raises_only_spec_error(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "g.txt"
    p.write_bytes(data)
    try:
        for _ in iter_observations([p], require_speculative=False):
            pass
    except SpecError:
        pass


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(sorted(os.listdir(DATA))),
    cut=st.floats(0.0, 1.0),
    junk=st.binary(max_size=30),
)
def test_cut_fixtures_raise_only_spec_error(
    tmp_path: Path, name: str, cut: float, junk: bytes
) -> None:
    if name.endswith(".py"):
        return
    raw = (DATA / name).read_bytes()
    p = tmp_path / name
    p.write_bytes(raw[: int(len(raw) * cut)] + junk)
    with contextlib.suppress(SpecError):
        list(parse_file(p))


def test_huge_log_streams_in_bounded_memory(tmp_path: Path) -> None:
    """A 200 MB log (decode lines among filler) parses with a few MB of Python memory."""
    size = 200 * 1024 * 1024
    if shutil.disk_usage(tmp_path).free < 3 * size:
        pytest.skip("not enough free disk for the 200 MB file")
    lines = (DATA / "sglang-0.5.10.log").read_text().splitlines(keepends=True)
    # long request lines between the decode lines keep the line count (and the run time) low
    prompt = "[2025-01-01 00:00:00 TP0] Receive: obj=GenerateReqInput(text='" + "x" * 16000 + "')\n"
    filler = prompt * 8
    block = (filler + "".join(lines[1:])).encode()
    p = tmp_path / "huge.log"
    with p.open("wb") as f:
        f.write(lines[0].encode())
        for _ in range(size // len(block) + 1):
            f.write(block)
    assert p.stat().st_size >= size
    tracemalloc.start()
    try:
        count = 0
        for o in iter_observations([p]):
            count += 1
            assert o.accept_length is not None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 3 * (size // len(block) + 1)
    assert peak < 16 * 1024 * 1024
