"""What a serving benchmark's per-request figures measure: the decode batch behind a mean TPOT.

SGLang's `bench_serving` (python/sglang/bench_serving.py, read at sgl-project/sglang commit
0033168f0f58b2bc05aa0273bd475d9c01bafb1c) runs a closed loop: `--num-prompts` requests, at most
`--max-concurrency` in flight (an asyncio semaphore, taken in the order the requests were
created), each streaming its tokens. Its `calculate_metrics` reports

    Mean TPOT  = mean over requests with output_len > 1 of (latency - ttft) / (output_len - 1)
    Concurrency = sum of the requests' end-to-end latencies / benchmark duration

so Concurrency is a time average that counts every request's TTFT and the drain at the end of
the run (the last, long requests decoding nearly alone for a long time), while Mean TPOT
weights every request alike, and most requests decode beside a full cap. The decode batch a
Mean TPOT reflects is therefore the request-weighted mean batch (`mean_tpot_batch`), not the
Concurrency line: to first order in the step time's growth with batch,

    Mean TPOT ~ step(b*),  b* = mean over requests r of (mean over r's decode steps of the batch)

The random data set draws its lengths with numpy's global generator seeded by `--seed`
(default 1): `sample_random_requests` takes input lengths uniform on
[max(int(random_input_len * range_ratio), 1), random_input_len] and output lengths uniform on
[int(random_output_len * range_ratio), random_output_len], in that order, one array each
(`random_lengths`; `--random-range-ratio` 0 gives the SGLang Cookbook's lengths: its published
totals are reproduced exactly, tests/test_serving_bench.py). The replay is time-free: every decode
step advances every request in flight by one token, a request's prefill yields its first token,
and a finished request's slot goes to the next waiting one before the next step, as the
semaphore does. Prefill forwards that SGLang runs between decode steps are not steps of the
batch; what they add to TPOT is the caller's to state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spectune.specs import SpecError

TOOLS = ("sglang.bench_serving",)
"""Benchmarks whose random data set `random_lengths` reproduces."""

MAX_PROMPTS = 100_000  # the replay is O(prompts x cap) in numpy
MAX_LEN = 10_000_000


@dataclass(frozen=True)
class ServingBenchmark:
    """The benchmark run behind a document's points (its `serving_benchmark` field)."""

    tool: str  # one of TOOLS
    random_input_len: int  # --random-input-len: the largest prompt
    random_output_len: int  # --random-output-len: the largest output
    random_range_ratio: float  # --random-range-ratio: the smallest length / the largest, 0..1
    seed: int  # --seed


def serving_benchmark(doc: Mapping[str, Any], where: str) -> ServingBenchmark | None:
    """The document's `serving_benchmark`, validated (None where it has none); SpecError naming
    the field and `where`."""
    raw = doc.get("serving_benchmark")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: field 'serving_benchmark' must be an object")
    if raw.get("tool") not in TOOLS:
        raise SpecError(
            f"{where}: field 'serving_benchmark.tool' must be one of {', '.join(TOOLS)}, "
            f"got {raw.get('tool')!r}"
        )
    for k in ("random_input_len", "random_output_len"):
        v = raw.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LEN:
            raise SpecError(
                f"{where}: field 'serving_benchmark.{k}' must be an integer in 1..{MAX_LEN}"
            )
    ratio = raw.get("random_range_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        raise SpecError(f"{where}: field 'serving_benchmark.random_range_ratio' must be in [0, 1]")
    seed = raw.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise SpecError(f"{where}: field 'serving_benchmark.seed' must be an integer in 0..2^32-1")
    return ServingBenchmark(
        raw["tool"], raw["random_input_len"], raw["random_output_len"], float(ratio), seed
    )


def random_lengths(bench: ServingBenchmark, num_prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """(input lengths int64[num_prompts], output lengths int64[num_prompts]) as the benchmark's
    random data set draws them (module docstring)."""
    if not 1 <= num_prompts <= MAX_PROMPTS:
        raise SpecError(f"num_prompts must be in 1..{MAX_PROMPTS}, got {num_prompts}")
    rng = np.random.RandomState(bench.seed)  # the legacy global generator np.random.seed seeds
    lo_in = max(int(bench.random_input_len * bench.random_range_ratio), 1)
    inputs = rng.randint(lo_in, bench.random_input_len + 1, size=num_prompts)
    lo_out = int(bench.random_output_len * bench.random_range_ratio)
    outputs = rng.randint(lo_out, bench.random_output_len + 1, size=num_prompts)
    return inputs.astype(np.int64), outputs.astype(np.int64)


def mean_tpot_batch(output_lens: np.ndarray, cap: int) -> float:
    """The request-weighted mean decode batch of a closed-loop run (module docstring):
    `output_lens` int[N] in sending order, at most `cap` requests in flight. Requests with one
    output token or fewer decode no step and are left out, as Mean TPOT leaves them out."""
    out = np.asarray(output_lens, dtype=np.int64)
    if out.ndim != 1 or out.size == 0 or (out < 0).any():
        raise SpecError("output_lens must be a non-empty 1-D array of lengths >= 0")
    if cap < 1:
        raise SpecError(f"the concurrency cap must be >= 1, got {cap}")
    left = np.zeros(0, dtype=np.int64)  # decode steps left, per request in flight
    sums = np.zeros(0, dtype=np.float64)  # batch summed over its decode steps so far
    ids = np.zeros(0, dtype=np.int64)
    total = np.zeros(out.size)
    nxt = 0
    while nxt < out.size or left.size:
        while nxt < out.size and left.size < cap:  # slots go to the waiting, in order
            steps = max(int(out[nxt]) - 1, 0)
            if steps:
                left = np.append(left, steps)
                sums = np.append(sums, 0.0)
                ids = np.append(ids, nxt)
            nxt += 1  # a request with no decode step frees its slot at once
        if not left.size:  # the rest decoded no step
            break
        # every request in flight decodes until the next one finishes: one jump, not each step
        run = int(left.min())
        sums += run * left.size
        left -= run
        done = left == 0
        total[ids[done]] = sums[done]
        left, sums, ids = left[~done], sums[~done], ids[~done]
    decoding = out > 1
    return float(np.mean(total[decoding] / (out[decoding] - 1)))
