"""Generate the engine-output fixtures of tests/data/engines/ with the engines' own code.

Each fixture is printed or written by the engine function that prints or writes it in
production, fed with known counts and a fixed clock, so the tests can assert exact values:

- vLLM logs: vllm.v1.metrics.loggers.LoggingStatLogger.log and
  vllm.v1.spec_decode.metrics.SpecDecodingLogging.log (the real classes, imported from the
  installed vLLM), through vLLM's own logging configuration; the launch line through the
  logger call of vllm/v1/engine/core.py with VllmConfig.__str__ and SpeculativeConfig.__repr__
  run on a stand-in config (fields other than model, speculative config and TP are placeholders).
- vLLM /metrics: vllm.v1.spec_decode.metrics.SpecDecodingProm's counters, exposed by
  prometheus_client.generate_latest.
- SGLang decode logs: the decode-stats function of each SGLang version (its source read from
  the installed package, compiled alone: importing sglang's scheduler needs a GPU build), run on
  a stand-in scheduler, through SGLang's logging format.
- Benchmark JSON: the result dicts the benchmark functions build, written as they write them
  (see tests/data/engines/README.md: the source lines are cited there).

Usage, from the repository root, with each engine version unpacked with
`pip install --no-deps --target DIR vllm==X` (or `pip download` + unzip; no torch, no CUDA):

    python tests/data/engines/generate.py --vllm 0.11.0=DIR --vllm 0.8.5=DIR \
        --sglang 0.4.3=DIR --sglang 0.5.10=DIR ...

vLLM needs its pure-Python dependencies importable (prometheus_client, msgspec, cachetools,
cbor2, psutil, setproctitle, pyzmq, transformers, aiohttp, blake3, fastapi, openai, ...); run
it from a virtual environment made with --system-site-packages so the CPU torch stays.
Each version runs in a subprocess of its own (one vllm or sglang package per process).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class Clock:
    """A monotonic clock the generator advances by hand (the engines' `time` module stand-in)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


class Anything:
    """A stand-in object: every attribute is another stand-in, printed as `placeholder`."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        return Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Anything()

    def __getitem__(self, key: Any) -> Any:
        return Anything()

    def __repr__(self) -> str:
        return "placeholder"

    __str__ = __repr__


# --------------------------------------------------------------------------------------- vLLM


def _vllm_capture() -> io.StringIO:
    """Send the vllm loggers' records to a buffer, keeping vLLM's own formatter."""
    import vllm.logger

    buf = io.StringIO()
    root = logging.getLogger("vllm")
    if not root.handlers:  # 0.33.0 configures logging at server start, not at import
        vllm.logger._configure_vllm_root_logger()
    for h in root.handlers:
        # vLLM's own handler only: a test harness's capture handlers (pytest's LogCaptureHandler
        # subclasses StreamHandler) keep their streams and their own format
        if type(h) is logging.StreamHandler:
            h.setStream(buf)
    return buf


def _vllm_launch_line(version: str, target: str, method: str, draft: str, k: int, tp: int) -> None:
    from vllm.config import SpeculativeConfig, VllmConfig
    from vllm.logger import init_logger

    spec = Anything(
        method=method, num_speculative_tokens=k, draft_model_config=Anything(model=draft)
    )
    spec_text = SpeculativeConfig.__repr__(spec)  # type: ignore[arg-type]
    cfg = Anything(
        model_config=Anything(model=target),
        parallel_config=Anything(tensor_parallel_size=tp),
        speculative_config=_Repr(spec_text),
    )
    text = VllmConfig.__str__(cfg)  # type: ignore[arg-type]
    init_logger("vllm.v1.engine.core").info(
        "Initializing a V1 LLM engine (v%s) with config: %s", version, text
    )


class _Repr:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


VLLM_INTERVALS = [
    # running, waiting, generation tokens in the interval, interval s, drafts per request-step
    # outcomes as (num_draft_tokens, num_accepted_tokens) per draft
    (4, 0, 480, 5.0, [(3, 3)] * 40 + [(3, 2)] * 30 + [(3, 1)] * 20 + [(3, 0)] * 10),
    (8, 2, 900, 5.0, [(3, 3)] * 100 + [(3, 1)] * 60 + [(3, 0)] * 40),
    (16, 5, 1500, 5.0, [(3, 2)] * 150 + [(3, 1)] * 150 + [(3, 0)] * 100),
]


def gen_vllm_log(version: str, out: Path) -> None:
    """vLLM V1 server log: launch line, then per interval the stats line and the spec line."""
    import vllm.v1.metrics.loggers as loggers
    import vllm.v1.spec_decode.metrics as metrics
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    buf = _vllm_capture()
    clock = Clock()
    loggers.time = clock  # type: ignore[attr-defined]
    metrics.time = clock  # type: ignore[attr-defined]
    _vllm_launch_line(
        version,
        "meta-llama/Llama-3.1-8B-Instruct",
        "eagle3",
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        3,
        1,
    )
    stat_logger = _vllm_stat_logger(loggers)
    for running, waiting, gen_tokens, seconds, drafts in VLLM_INTERVALS:
        stats = SpecDecodingStats.new(3)
        for n_draft, n_acc in drafts:
            stats.observe_draft(n_draft, n_acc)
        sched = SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting)
        sched.kv_cache_usage = 0.25
        sched.spec_decoding_stats = stats
        stat_logger.record(scheduler_stats=sched, iteration_stats=None)
        stat_logger.num_generation_tokens = gen_tokens
        clock.now += seconds
        stat_logger.log()
    out.write_text(buf.getvalue())


def _vllm_stat_logger(loggers: Any) -> Any:
    """LoggingStatLogger built by its own __init__ on a stand-in VllmConfig."""
    cfg = Anything(
        kv_transfer_config=None,
        ec_transfer_config=None,
        model_config=None,
        observability_config=Anything(cudagraph_metrics=False, enable_mfu_metrics=False),
        cache_config=Anything(num_gpu_blocks=None),
        device_config=Anything(device_type="cuda"),
    )
    return loggers.LoggingStatLogger(cfg, engine_index=0)


def gen_vllm_prometheus(version: str, out: Path) -> None:
    """/metrics text of SpecDecodingProm's counters after two known steps (engine 0)."""
    import prometheus_client
    import vllm.v1.spec_decode.metrics as metrics
    from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats

    registry = prometheus_client.CollectorRegistry()
    counter_cls = prometheus_client.Counter

    class RegistryCounter(counter_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, registry=registry, **kwargs)

    SpecDecodingProm._counter_cls = RegistryCounter  # type: ignore[attr-defined]
    metrics.prometheus_client.Counter = RegistryCounter
    labels = ["meta-llama/Llama-3.1-8B-Instruct", "0"]
    per_engine = "per_engine_labelvalues" in inspect.signature(SpecDecodingProm.__init__).parameters
    prom = SpecDecodingProm(
        Anything(num_speculative_tokens=3),
        ["model_name", "engine"],
        {0: labels} if per_engine else labels,
    )
    for _, _, _, _, drafts in VLLM_INTERVALS[:2]:
        stats = SpecDecodingStats.new(3)
        for n_draft, n_acc in drafts:
            stats.observe_draft(n_draft, n_acc)
        prom.observe(stats, engine_idx=0) if per_engine else prom.observe(stats)
    out.write_bytes(prometheus_client.generate_latest(registry))


def gen_vllm_v0_log(src: Path, out: Path) -> None:
    """vLLM 0.6.6.post1 (v0 engine) log: LoggingStatLogger.log and its
    _format_spec_decode_metrics_str (vllm/engine/metrics.py), compiled alone, on stand-in stats;
    v0's format `%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s` (vllm/logger.py)."""
    path = src / "vllm/engine/metrics.py"
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s metrics.py:467] %(message)s", "%m-%d %H:%M:%S")
    )
    logger = logging.getLogger("vllm-v0")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    ns: dict[str, Any] = {"logger": logger, "List": list, "np": __import__("numpy")}
    elapsed = _compile_alone(path, "local_interval_elapsed", ns)
    ns["get_throughput"] = _compile_alone(path, "get_throughput", ns)
    log = _compile_alone(path, "LoggingStatLogger.log", ns)
    fmt = _compile_alone(path, "LoggingStatLogger._format_spec_decode_metrics_str", ns)
    reset = _compile_alone(path, "LoggingStatLogger._reset", ns)
    ns["local_interval_elapsed"] = elapsed
    me = Anything(
        num_prompt_tokens=[],
        num_generation_tokens=[],
        last_local_log=0.0,
        local_interval=5.0,
        last_prompt_throughput=None,
        last_generation_throughput=None,
        maybe_update_spec_decode_metrics=lambda stats: None,
    )
    me._format_spec_decode_metrics_str = lambda m: fmt(me, m)
    me._reset = lambda *a: reset(me, *a)
    # cumulative worker counters: k = 5, (draft tokens, accepted, emitted) after each interval
    for now, running, gen_tokens, (drafted, accepted, emitted) in (
        (6.0, 4, 600, (1000, 620, 820)),
        (12.0, 4, 640, (2000, 1300, 1700)),
    ):
        steps = drafted // 5
        me.spec_decode_metrics = Anything(
            draft_acceptance_rate=accepted / drafted,
            system_efficiency=emitted / (steps * 6),
            num_spec_tokens=5,
            accepted_tokens=accepted,
            draft_tokens=drafted,
            emitted_tokens=emitted,
        )
        stats = Anything(
            now=now,
            num_prompt_tokens_iter=0,
            num_generation_tokens_iter=gen_tokens,
            num_running_sys=running,
            num_swapped_sys=0,
            num_waiting_sys=0,
            gpu_cache_usage_sys=0.1,
            cpu_cache_usage_sys=0.0,
            cpu_prefix_cache_hit_rate=-1,
            gpu_prefix_cache_hit_rate=-1,
        )
        log(me, stats)
    out.write_text(buf.getvalue())


def vllm_main(version: str) -> None:
    import os

    if version.startswith("0.6."):
        gen_vllm_v0_log(Path(os.environ["ENGINE_SRC"]), HERE / f"vllm-{version}.log")
        return
    gen_vllm_log(version, HERE / f"vllm-{version}.log")
    gen_vllm_prometheus(version, HERE / f"vllm-{version}.metrics")


# ------------------------------------------------------------------------------------- SGLang

SGLANG_FORMAT = "[%(asctime)s TP0] %(message)s"  # configure_logger(server_args, prefix=" TP0")
SGLANG_DATEFMT = "%Y-%m-%d %H:%M:%S"

# (running requests, decode steps in the interval, accepted drafts summed over requests and
# steps, seconds): accept len = (accepted + running x steps) / (running x steps)
SGLANG_INTERVALS = [(1, 40, 88, 0.5), (8, 40, 640, 1.0), (32, 40, 1600, 2.0)]
SGLANG_SPEC = dict(
    model_path="meta-llama/Llama-3.1-8B-Instruct",
    speculative_algorithm="EAGLE3",
    speculative_draft_model_path="jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
    speculative_num_steps=5,
    speculative_eagle_topk=8,
    speculative_num_draft_tokens=32,
    tp_size=1,
)


def _compile_alone(path: Path, qualname: str, namespace: dict[str, Any]) -> Any:
    """The function or class `qualname` ('Class.method' or 'Class') of an engine source file,
    compiled alone into `namespace` with its annotations dropped (so the module's imports, which
    need a GPU build, are not run). Classes keep their field declarations only."""
    import __future__

    tree = ast.parse(path.read_text())
    node: Any = tree
    for part in qualname.split("."):
        node = next(
            n for n in node.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part
        )
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = []
        for a in (*node.args.args, *node.args.kwonlyargs):
            a.annotation = None
        node.returns = None
    else:  # a dataclass: keep the fields, drop the methods
        node.body = [n for n in node.body if not isinstance(n, ast.FunctionDef)]
    module = ast.Module(body=[node], type_ignores=[])
    flags = __future__.annotations.compiler_flag
    exec(compile(module, str(path), "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[node.name]


def _sglang_server_args(src: Path) -> str:
    """`server_args=ServerArgs(...)`: the repr of SGLang's ServerArgs dataclass (its fields at
    their defaults, the speculative ones set), as engine.py logs it at launch."""
    import dataclasses
    import typing

    path = src / "sglang/srt/server_args.py"
    ns: dict[str, Any] = {"dataclasses": dataclasses, **vars(typing)}
    ns["field"] = dataclasses.field
    for node in ast.parse(path.read_text()).body:  # the module's literal constants
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                with contextlib.suppress(ValueError):
                    ns[target.id] = ast.literal_eval(node.value)
    for _ in range(100):  # other names its defaults use: placeholders
        try:
            args = _compile_alone(path, "ServerArgs", dict(ns))(**SGLANG_SPEC)
            break
        except NameError as e:
            ns[str(e).split("'")[1]] = Anything()
    return f"server_args={args!r}"


def gen_sglang_log(version: str, src: Path, out: Path) -> None:
    """SGLang decode lines from the version's own decode-stats function on a stand-in scheduler."""
    candidates = [
        ("sglang/srt/managers/scheduler.py", "Scheduler.log_decode_stats"),
        (
            "sglang/srt/managers/scheduler_metrics_mixin.py",
            "SchedulerMetricsMixin.log_decode_stats",
        ),
        (
            "sglang/srt/observability/scheduler_metrics_mixin.py",
            "SchedulerMetricsMixin.report_decode_stats",
        ),
    ]
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter(SGLANG_FORMAT, SGLANG_DATEFMT))
    logger = logging.getLogger(f"sglang.{version}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.info(_sglang_server_args(src))
    clock = Clock()

    class DisaggregationMode:
        NULL, PREFILL, DECODE = "null", "prefill", "decode"

    ns: dict[str, Any] = {
        "time": clock,
        "logger": logger,
        "RECORD_STEP_TIME": False,
        "LOG_FORWARD_ITERS": False,
        "DisaggregationMode": DisaggregationMode,
        "defaultdict": __import__("collections").defaultdict,
    }
    fn = None
    for rel, qual in candidates:
        try:
            fn = _compile_alone(src / rel, qual, ns)
            break
        except (FileNotFoundError, StopIteration):
            continue
    assert fn is not None, f"no decode-stats function found in {src}"
    max_tokens = 200_000
    for running, steps, accepted, seconds in SGLANG_INTERVALS:
        sched = _sglang_scheduler(running, max_tokens, DisaggregationMode.NULL)
        sched.spec_num_total_accepted_tokens = accepted + running * steps
        sched.spec_num_total_forward_ct = running * steps
        sched.spec_num_accepted_tokens = accepted + running * steps
        sched.spec_num_forward_ct = running * steps
        sched.num_generated_tokens = accepted + running * steps
        sched.last_decode_stats_tic = clock.now
        clock.now += seconds
        params = inspect.signature(fn).parameters
        kwargs = {"can_run_cuda_graph": True} if "can_run_cuda_graph" in params else {}
        fn(sched, **kwargs)
    out.write_text(buf.getvalue())


def _sglang_scheduler(running: int, max_tokens: int, mode: str) -> Any:
    """A stand-in Scheduler with the attributes the decode-stats functions read."""
    used = 1200 * running
    batch = Anything(reqs=[object()] * running)
    return Anything(
        running_batch=batch,
        waiting_queue=[],
        max_total_num_tokens=max_tokens,
        token_to_kv_pool=Anything(available_size=lambda: max_tokens - used),
        token_to_kv_pool_allocator=Anything(available_size=lambda: max_tokens - used),
        tree_cache=Anything(evictable_size=lambda: 0),
        spec_algorithm=Anything(is_none=lambda: False),
        enable_metrics=False,
        current_scheduler_metrics_enabled=False,
        is_stats_logging_rank=True,
        enable_mfu_metrics=False,
        is_hybrid=False,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        forward_ct_decode=0,
        forward_ct=0,
        disaggregation_mode=mode,
        device="cuda",
        cum_spec_accept_length=0,
        cum_spec_accept_count=0,
        spec_total_num_accepted_tokens=0,
        spec_total_num_forward_ct=0,
        server_args=Anything(
            decode_log_interval=40,
            speculative_num_steps=SGLANG_SPEC["speculative_num_steps"],
            speculative_num_draft_tokens=SGLANG_SPEC["speculative_num_draft_tokens"],
            language_only=False,
        ),
        _get_token_info=lambda: (used, used / max_tokens, 0, 0),
    )


def sglang_main(version: str) -> None:
    import os

    gen_sglang_log(version, Path(os.environ["ENGINE_SRC"]), HERE / f"sglang-{version}.log")


# --------------------------------------------------------------------------------- benchmarks


def gen_benchmarks() -> None:
    """Benchmark-result files, field for field as the cited functions build and write them."""
    inf = float("inf")
    # sglang/bench_serving.py benchmark() (0.5.10): one json.dumps(result) line per run, appended
    server_info = {
        **SGLANG_SPEC,
        "version": "0.5.10",
        "internal_states": [{"avg_spec_accept_length": 3.1, "last_gen_throughput": 412.5}],
    }
    runs = []
    for conc, tput, accept in ((1, 238.41, 3.1), (8, 1544.2, 2.95)):
        runs.append(
            {
                "tag": None,
                "backend": "sglang",
                "dataset_name": "sharegpt",
                "request_rate": inf,
                "max_concurrency": conc,
                "sharegpt_output_len": None,
                "random_input_len": 1024,
                "random_output_len": 1024,
                "random_range_ratio": 0.0,
                "server_info": {
                    **server_info,
                    "internal_states": [
                        {"avg_spec_accept_length": accept, "last_gen_throughput": tput}
                    ],
                },
                "duration": 42.0,
                "completed": 80,
                "total_input_tokens": 20480,
                "total_input_text_tokens": 20480,
                "total_input_vision_tokens": 0,
                "total_output_tokens": int(tput * 42.0),
                "total_output_tokens_retokenized": int(tput * 42.0),
                "request_throughput": 80 / 42.0,
                "input_throughput": 20480 / 42.0,
                "output_throughput": tput,
                "total_throughput": tput + 20480 / 42.0,
                "mean_e2e_latency_ms": 520.0,
                "median_e2e_latency_ms": 500.0,
                "std_e2e_latency_ms": 40.0,
                "p90_e2e_latency_ms": 580.0,
                "p95_e2e_latency_ms": 600.0,
                "p99_e2e_latency_ms": 640.0,
                "mean_ttft_ms": 30.5,
                "median_ttft_ms": 29.0,
                "std_ttft_ms": 3.0,
                "p90_ttft_ms": 34.0,
                "p95_ttft_ms": 35.0,
                "p99_ttft_ms": 38.0,
                "mean_tpot_ms": 1000.0 * conc / tput,
                "median_tpot_ms": 1000.0 * conc / tput,
                "std_tpot_ms": 0.2,
                "p90_tpot_ms": 4.6,
                "p95_tpot_ms": 4.7,
                "p99_tpot_ms": 4.9,
                "mean_itl_ms": 12.1,
                "median_itl_ms": 12.0,
                "std_itl_ms": 1.0,
                "p90_itl_ms": 13.0,
                "p95_itl_ms": 13.5,
                "p99_itl_ms": 14.0,
                "concurrency": conc * 0.97,
                "accept_length": accept,
            }
        )
    (HERE / "sglang-bench-serving.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    # sglang/bench_one_batch.py latency_test_run_once: measurement_results, json.dumps per line
    one = []
    for bs, step in ((1, 0.00612), (16, 0.00705), (64, 0.00911)):
        one.append(
            {
                "run_name": "baseline",
                "batch_size": bs,
                "input_len": 1024,
                "output_len": 16,
                "prefill_latency": 0.021 * bs**0.5,
                "prefill_throughput": 1024 * bs / (0.021 * bs**0.5),
                "median_decode_latency": step,
                "median_decode_throughput": bs / step,
                "total_latency": 0.021 * bs**0.5 + 15 * step,
                "overall_throughput": (1024 + 16) * bs / (0.021 * bs**0.5 + 15 * step),
            }
        )
    (HERE / "sglang-bench-one-batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one))
    # sglang/benchmark/one_batch_server.py BenchOneCaseResult.dump_to_jsonl (0.5.23)
    srv = []
    for bs, latency, acc in ((1, 1.2345, 3.42), (8, 1.9876, -1)):
        out_tok = bs * 256
        srv.append(
            {
                "run_name": "eagle3",
                "batch_size": bs,
                "input_len": 1024,
                "output_len": 256,
                "latency": round(latency, 4),
                "input_throughput": round(1024 * bs / 0.05, 2),
                "output_throughput": round(out_tok / (latency - 0.05), 2),
                "overall_throughput": round((1024 + 256) * bs / latency, 2),
                "last_ttft": round(0.05, 4),
                "last_gen_throughput": round(out_tok / latency, 2),
                "acc_length": round(acc, 2),
                "total_output_tokens": out_tok,
                "num_early_stopped": 0,
                "steady_state_output_throughput": None,
                "steady_state_window_s": None,
                "cache_hit_rate": None,
            }
        )
    (HERE / "sglang-bench-one-batch-server.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in srv)
    )
    # vllm/benchmarks/serve.py main() (0.33.0): json.dump(result_json) without --save-detailed
    serve = {
        "date": "20261126-080000",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": 80,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        "duration": 30.25,
        "completed": 80,
        "failed": 0,
        "total_input_tokens": 81920,
        "total_output_tokens": 20480,
        "request_throughput": 80 / 30.25,
        "request_goodput": None,
        "output_throughput": 20480 / 30.25,
        "total_token_throughput": 102400 / 30.25,
        "latencies": [1.5] * 2,
        "queue_times": [0.0] * 2,
        "max_output_tokens_per_s": 812.0,
        "max_concurrent_requests": 4,
        "rtfx": 0.0,
        "spec_decode_acceptance_rate": 58.333333333333336,
        "spec_decode_acceptance_length": 2.75,
        "spec_decode_num_drafts": 7448,
        "spec_decode_draft_tokens": 22344,
        "spec_decode_accepted_tokens": 13034,
        "spec_decode_per_position_acceptance_rates": [0.8, 0.55, 0.4],
        "mean_ttft_ms": 45.2,
        "median_ttft_ms": 44.0,
        "std_ttft_ms": 5.0,
        "p99_ttft_ms": 61.0,
        "mean_tpot_ms": 5.73,
        "median_tpot_ms": 5.7,
        "std_tpot_ms": 0.3,
        "p99_tpot_ms": 6.4,
        "mean_itl_ms": 15.6,
        "median_itl_ms": 15.0,
        "std_itl_ms": 2.0,
        "p99_itl_ms": 21.0,
        "mean_e2el_ms": 1500.0,
        "median_e2el_ms": 1490.0,
        "std_e2el_ms": 30.0,
        "p99_e2el_ms": 1580.0,
    }
    (HERE / "vllm-bench-serve.json").write_text(json.dumps(serve))
    # vllm/benchmarks/latency.py main(): json.dump(results, f, indent=4)
    lat = [0.8312, 0.8298, 0.8405]
    latency = {
        "avg_latency": sum(lat) / len(lat),
        "latencies": lat,
        "percentiles": {
            "10": 0.83,
            "25": 0.8305,
            "50": 0.8312,
            "75": 0.836,
            "90": 0.8386,
            "99": 0.8403,
        },
    }
    (HERE / "vllm-bench-latency.json").write_text(json.dumps(latency, indent=4))


# -------------------------------------------------------------------------------------- driver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", action="append", default=[], help="VERSION=DIR")
    ap.add_argument("--sglang", action="append", default=[], help="VERSION=DIR")
    ap.add_argument("--one", nargs=2, metavar=("ENGINE", "VERSION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        engine, version = args.one
        {"vllm": vllm_main, "sglang": sglang_main}[engine](version)
        return
    for engine, items in (("vllm", args.vllm), ("sglang", args.sglang)):
        for item in items:
            version, _, folder = item.partition("=")
            env_path = folder if engine == "vllm" and not version.startswith("0.6.") else ""
            subprocess.run(
                [sys.executable, __file__, "--one", engine, version],
                check=True,
                env={**_env(), "PYTHONPATH": env_path, "ENGINE_SRC": folder},
            )
    gen_benchmarks()


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


if __name__ == "__main__":
    main()
