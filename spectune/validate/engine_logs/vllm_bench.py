"""vLLM benchmark results: `vllm bench serve` and `vllm bench latency`.

- `vllm bench serve --save-result` (vllm/benchmarks/serve.py `main`, 0.10.1 to 0.33.0; before
  that benchmarks/benchmark_serving.py) writes one JSON object with `json.dump` (several,
  newline-separated, with --append-result): `{"date", "endpoint_type", "backend", "label",
  "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
  "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
  "output_throughput", "total_token_throughput", "mean_ttft_ms", "mean_tpot_ms",
  "mean_itl_ms", ...}` and, in 0.33.0 when the server exposes spec-decoding counters
  (`benchmark()` scrapes /metrics before and after: `fetch_spec_decode_metrics`),
  `"spec_decode_acceptance_rate"` (percent), `"spec_decode_acceptance_length"`,
  `"spec_decode_num_drafts"`, `"spec_decode_draft_tokens"`, `"spec_decode_accepted_tokens"`,
  `"spec_decode_per_position_acceptance_rates"`. 0.10.1 and 0.11.0 write no spec fields.
- `vllm bench latency --output-json F` (vllm/benchmarks/latency.py `main`, 0.10.1 to 0.33.0)
  writes `{"avg_latency": s, "latencies": [s], "percentiles": {"10": s, ...}}` with
  `json.dump(indent=4)`; batch size and lengths are command-line arguments the file does not
  record, so they come from the user's scenario.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from spectune.specs import SpecError
from spectune.validate.engine_logs.base import (
    EngineObservation,
    JsonFormat,
    StatedConfig,
    finite,
    json_number,
    opt_int,
)

_MAX_POSITIONS = 1024


class VLLMBenchServe(JsonFormat):
    """`vllm bench serve` results."""

    format_id = "vllm-bench-serve"
    engine = "vllm"
    source = "vllm 0.10.1/0.11.0/0.33.0 vllm/benchmarks/serve.py main, benchmark"

    def sniff_keys(self, keys: frozenset[str]) -> bool:
        return {"model_id", "completed", "output_throughput"} <= keys and (
            "burstiness" in keys or "endpoint_type" in keys
        )

    def parse_doc(self, name: str, line: int, doc: dict[str, Any]) -> Iterator[EngineObservation]:
        where = f"{name}:{line}"
        rates = doc.get("spec_decode_per_position_acceptance_rates") or []
        if not isinstance(rates, list) or len(rates) > _MAX_POSITIONS:
            raise SpecError(
                f"{where}: field 'spec_decode_per_position_acceptance_rates' must be a list"
            )
        per_pos = []
        for i, r in enumerate(rates):
            if isinstance(r, bool) or not isinstance(r, int | float):
                raise SpecError(
                    f"{where}: spec_decode_per_position_acceptance_rates[{i}] not a number"
                )
            per_pos.append(
                finite(float(r), f"spec_decode_per_position_acceptance_rates[{i}]", where)
            )
        rate = json_number(doc, "spec_decode_acceptance_rate", where)
        length = json_number(doc, "spec_decode_acceptance_length", where)
        model = doc.get("model_id")
        yield EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant="0.33.0" if "spec_decode_acceptance_length" in doc else "0.10.1",
            file=name,
            line=line,
            kind="benchmark",
            time=str(doc["date"]) if "date" in doc else None,
            concurrency=opt_int(json_number(doc, "max_concurrency", where, integer=True)),
            gen_tokens_per_s=json_number(doc, "output_throughput", where, required=True),
            accept_length=length if length is not None and length >= 1.0 else None,
            accept_rate=None if rate is None else rate / 100.0,
            per_position_accept=tuple(per_pos),
            drafts=opt_int(json_number(doc, "spec_decode_num_drafts", where, integer=True)),
            draft_tokens=opt_int(json_number(doc, "spec_decode_draft_tokens", where, integer=True)),
            accepted_tokens=opt_int(
                json_number(doc, "spec_decode_accepted_tokens", where, integer=True)
            ),
            completed=opt_int(json_number(doc, "completed", where, integer=True)),
            duration_s=json_number(doc, "duration", where),
            mean_ttft_ms=json_number(doc, "mean_ttft_ms", where),
            mean_tpot_ms=json_number(doc, "mean_tpot_ms", where),
            mean_itl_ms=json_number(doc, "mean_itl_ms", where),
            config=StatedConfig(target_model=model if isinstance(model, str) else None),
            extra=tuple(
                (k, str(doc[k])) for k in ("backend", "request_rate", "num_prompts") if k in doc
            ),
        )


class VLLMBenchLatency(JsonFormat):
    """`vllm bench latency` results (one indented JSON document)."""

    format_id = "vllm-bench-latency"
    engine = "vllm"
    source = "vllm 0.10.1/0.11.0/0.33.0 vllm/benchmarks/latency.py main"

    def sniff_keys(self, keys: frozenset[str]) -> bool:
        return {"avg_latency", "latencies", "percentiles"} <= keys

    def parse_doc(self, name: str, line: int, doc: dict[str, Any]) -> Iterator[EngineObservation]:
        where = f"{name}:{line}"
        avg = json_number(doc, "avg_latency", where, required=True)
        if avg is not None and avg <= 0:
            raise SpecError(f"{where}: field 'avg_latency' must be positive, got {avg}")
        yield EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant="0.10.1",
            file=name,
            line=line,
            kind="benchmark",
            latency_s=avg,
        )
