"""SGLang benchmark results: bench_serving, bench_one_batch and bench_one_batch_server.

All three append one JSON object per run to a JSONL file:
- `python -m sglang.bench_serving --output-file F`: sglang/bench_serving.py `benchmark()` (0.4.3
  to 0.5.10; sglang/benchmark/serving.py in 0.5.23) writes `{"backend", "dataset_name",
  "request_rate", "max_concurrency", ..., "duration", "completed", "total_input_tokens",
  "total_output_tokens", "output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
  ..., "concurrency", "accept_length"}` (`accept_length` from 0.5.1, read from the server's
  /server_info `internal_states[0].avg_spec_accept_length`; `server_info`, the whole
  /server_info answer with the server arguments and version, from 0.5.10).
- `python -m sglang.bench_one_batch --result-filename F`: `latency_test_run_once` (sglang/
  bench_one_batch.py; sglang/benchmark/one_batch.py in 0.5.23) writes `{"run_name",
  "batch_size", "input_len", "output_len", "prefill_latency", "prefill_throughput",
  "median_decode_latency", "median_decode_throughput", "total_latency", "overall_throughput"}`
  (seconds and tokens/s; plain decoding: the no-speculation baseline per batch size).
- `python -m sglang.bench_one_batch_server --result-filename F`: 0.4.3 `run_one_case` writes
  `{"run_name", "batch_size", "input_len", "output_len", "latency", "output_throughput",
  "overall_throughput"}`; 0.4.6.post5 and 0.5.1 add `last_gen_throughput`; 0.5.10
  (sglang/test/bench_one_batch_server_internal.py) and 0.5.23 (sglang/benchmark/
  one_batch_server.py) `BenchOneCaseResult.dump_to_jsonl` add `input_throughput`, `last_ttft`,
  `acc_length` (-1 when the server reports none) and `cache_hit_rate`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from spectune.specs import SpecError
from spectune.validate.engine_logs.base import (
    NO_CONFIG,
    EngineObservation,
    JsonFormat,
    StatedConfig,
    json_number,
    opt_int,
)


def server_info_config(info: Any) -> StatedConfig:
    """The configuration an SGLang /server_info answer states (its server arguments, version)."""
    if not isinstance(info, dict):
        return NO_CONFIG

    def text(key: str) -> str | None:
        v = info.get(key)
        return v if isinstance(v, str) else None

    def integer(key: str) -> int | None:
        v = info.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return StatedConfig(
        target_model=text("model_path"),
        draft_model=text("speculative_draft_model_path"),
        method=text("speculative_algorithm"),
        num_steps=integer("speculative_num_steps"),
        topk=integer("speculative_eagle_topk"),
        num_draft_tokens=integer("speculative_num_draft_tokens"),
        tp=integer("tp_size"),
        engine_version=text("version"),
    )


class SGLangBenchServing(JsonFormat):
    """`sglang.bench_serving` results (JSONL, one object per run)."""

    format_id = "sglang-bench-serving"
    engine = "sglang"
    source = (
        "sglang 0.4.3/0.5.1/0.5.10 sglang/bench_serving.py benchmark(); 0.5.23 "
        "sglang/benchmark/serving.py benchmark()"
    )

    def sniff_keys(self, keys: frozenset[str]) -> bool:
        return {"backend", "completed", "output_throughput", "concurrency"} <= keys and (
            "max_concurrency" in keys and "endpoint_type" not in keys and "model_id" not in keys
        )

    def parse_doc(self, name: str, line: int, doc: dict[str, Any]) -> Iterator[EngineObservation]:
        where = f"{name}:{line}"
        accept = json_number(doc, "accept_length", where)
        max_conc = json_number(doc, "max_concurrency", where, integer=True)
        yield EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant="0.5.10"
            if "server_info" in doc
            else "0.5.1"
            if "accept_length" in doc
            else "0.4.3",
            file=name,
            line=line,
            kind="benchmark",
            concurrency=opt_int(max_conc),
            mean_concurrency=json_number(doc, "concurrency", where),
            gen_tokens_per_s=json_number(doc, "output_throughput", where, required=True),
            accept_length=accept if accept is not None and accept >= 1.0 else None,
            completed=opt_int(json_number(doc, "completed", where, integer=True)),
            duration_s=json_number(doc, "duration", where),
            mean_ttft_ms=json_number(doc, "mean_ttft_ms", where),
            mean_tpot_ms=json_number(doc, "mean_tpot_ms", where),
            mean_itl_ms=json_number(doc, "mean_itl_ms", where),
            config=server_info_config(doc.get("server_info")),
            extra=tuple(
                (k, str(doc[k]))
                for k in ("backend", "dataset_name", "request_rate", "random_input_len")
                if k in doc
            ),
        )


class SGLangBenchOneBatch(JsonFormat):
    """`sglang.bench_one_batch` results: plain decoding of one static batch (JSONL)."""

    format_id = "sglang-bench-one-batch"
    engine = "sglang"
    source = (
        "sglang 0.4.3 to 0.5.10 sglang/bench_one_batch.py latency_test_run_once; 0.5.23 "
        "sglang/benchmark/one_batch.py latency_test_run_once"
    )

    def sniff_keys(self, keys: frozenset[str]) -> bool:
        return {"run_name", "batch_size", "prefill_latency", "total_latency"} <= keys

    def parse_doc(self, name: str, line: int, doc: dict[str, Any]) -> Iterator[EngineObservation]:
        where = f"{name}:{line}"
        batch = json_number(doc, "batch_size", where, integer=True, required=True)
        yield EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant="0.4.3",
            file=name,
            line=line,
            kind="benchmark",
            batch=opt_int(batch),
            input_len_tokens=opt_int(json_number(doc, "input_len", where, integer=True)),
            output_len_tokens=opt_int(json_number(doc, "output_len", where, integer=True)),
            latency_s=json_number(doc, "total_latency", where, required=True),
            decode_step_s=json_number(doc, "median_decode_latency", where),
            gen_tokens_per_s=json_number(doc, "median_decode_throughput", where),
            extra=(("run_name", str(doc.get("run_name"))),),
        )


class SGLangBenchOneBatchServer(JsonFormat):
    """`sglang.bench_one_batch_server` results: one batch through a live server (JSONL)."""

    format_id = "sglang-bench-one-batch-server"
    engine = "sglang"
    source = (
        "sglang 0.4.3/0.4.6.post5/0.5.1 sglang/bench_one_batch_server.py run_one_case; 0.5.10 "
        "sglang/test/bench_one_batch_server_internal.py and 0.5.23 "
        "sglang/benchmark/one_batch_server.py BenchOneCaseResult.dump_to_jsonl"
    )

    def sniff_keys(self, keys: frozenset[str]) -> bool:
        return {"run_name", "batch_size", "latency", "output_throughput"} <= keys and (
            "prefill_latency" not in keys
        )

    def parse_doc(self, name: str, line: int, doc: dict[str, Any]) -> Iterator[EngineObservation]:
        where = f"{name}:{line}"
        acc = json_number(doc, "acc_length", where)
        last = json_number(doc, "last_gen_throughput", where)
        batch = json_number(doc, "batch_size", where, integer=True, required=True)
        if "acc_length" in doc:
            variant = "0.5.10"
        elif "last_gen_throughput" in doc:
            variant = "0.4.6"
        else:
            variant = "0.4.3"
        if acc is not None and 0 <= acc < 1.0:
            raise SpecError(
                f"{where}: field 'acc_length' {acc} below 1 (it counts the bonus token)"
            )
        yield EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant=variant,
            file=name,
            line=line,
            kind="benchmark",
            batch=opt_int(batch),
            input_len_tokens=opt_int(json_number(doc, "input_len", where, integer=True)),
            output_len_tokens=opt_int(json_number(doc, "output_len", where, integer=True)),
            latency_s=json_number(doc, "latency", where, required=True),
            gen_tokens_per_s=json_number(doc, "output_throughput", where, required=True),
            accept_length=acc if acc is not None and acc >= 1.0 else None,
            extra=(
                ("run_name", str(doc.get("run_name"))),
                ("last_gen_throughput", "" if last is None or last < 0 else f"{last:g}"),
            ),
        )
