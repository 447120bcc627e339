"""Generate the SGLang engine-fit fixtures: server logs whose numbers come from known parameters.

Every line is written by SGLang 0.5.23's own code (the PyPI wheel, installed without its GPU
dependencies as scripts/setup.d/engines.sh does):

- the launch line: sglang/srt/server_args.py `prepare_server_args` + `resolve_once` +
  `resolved_dict` on the flags of each configuration (model paths: stub folders holding the
  models' config.json, as tests/test_engines_judge.py resolves them; the printed paths are then
  set to the Hugging Face repos), passed through sglang/srt/sampling/watermarking/core.py
  `redact_watermark_secrets` and logged as sglang/srt/entrypoints/engine.py does
  (`logger.info(f"server_args={_server_args_for_logging(server_args)}")`);
- the decode lines: sglang/srt/managers/scheduler_components/metrics_reporter.py
  `SchedulerMetricsReporter.report_decode_stats`, compiled alone from the installed file
  (importing its module needs a GPU build), on a stand-in reporter whose counters are driven
  per decode step by `SchedulerMetricsReporter.update_spec_metrics` (compiled alone) as
  batch_result_processor.py does (`num_generated_tokens += batch + correct drafts`), and whose
  token-usage part is pool_stats_observer.py `PoolStats.get_decode_usage_msg_parts` (compiled
  alone); SGLang's log format `[%(asctime)s TP0] %(message)s`.

What they report is chosen so that a fit has a known answer (TRUTH, written to
sglang-fit-truth.json):

- acceptance: per request and decode step, the drafts accepted are drawn from a chain (position
  k accepted with probability CHAIN[k-1] given the previous one was, up to the configuration's
  steps), so the logged accept length is what the draws gave;
- time: each decode step takes spectune's CostModel.iteration(...).total_s for Llama-3.1-8B
  and its EAGLE-3 head on an H100 SXM (no engine overhead, draft extend over the accept
  length, CONTEXT cached tokens) plus TRUTH's EngineOverheads.iteration_s_for, times
  exp(0.01 N(0,1)) per interval; the clock the reporter reads advances by that, so the logged
  gen throughput is generated tokens over it.

Files: sglang-fit-s3k1.log, sglang-fit-s5k1.log (chains), sglang-fit-s5k4.log (a tree of 8
tokens), sglang-fit-off.log (speculation off), sglang-fit-truth.json.

    PYTHONPATH=. python tests/data/engines/generate_fit_sglang.py [--out DIR]   # repo root
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import logging
import math
import tempfile
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TARGET, DRAFTER, GPU = "llama-3.1-8b", "eagle3-llama-3.1-8b", "h100-sxm"
TARGET_REPO = "meta-llama/Llama-3.1-8B-Instruct"
DRAFTER_REPO = "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
CONTEXT = 1152.0  # fit-engine --input-len 1024 --output-len 256: 1024 + 256 / 2
CHAIN = (0.8, 0.75, 0.7, 0.65, 0.6)  # P(position k accepted | position k-1 accepted)
TREE_CHAIN = (0.88, 0.82, 0.76, 0.7, 0.64)  # a top-4 tree accepts more per position
CONFIGS = {"s3k1": (3, 1, 4), "s5k1": (5, 1, 6), "s5k4": (5, 4, 8), "off": (0, 1, 1)}
BATCHES = (1, 4, 16, 48)
INTERVALS = 2  # decode lines per batch size
LOG_INTERVAL = 40  # ServerArgs.decode_log_interval default
NOISE = 0.01
SEED = 11
SRC = "sglang/srt/managers/scheduler_components"


def truth() -> Any:
    from spectune.specs.engine import EngineOverheads

    return EngineOverheads(
        iteration_s=3e-4,
        per_request_s=1e-5,
        spec_iteration_s=7e-4,
        per_draft_step_s=1.2e-4,
        tree_s=2.5e-4,
        overlap=0.5,
        tp_growth=0.1,
    )


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def step_s(batch: int, steps: int, topk: int, tokens: int, accept_length: float) -> float:
    """CostModel price of one decode step plus the true engine overheads."""
    from spectune.planner.costmodel import CostModel
    from spectune.specs import TreePolicy, load_hardware, load_model

    cm = CostModel(load_hardware(GPU), load_model(TARGET), load_model(DRAFTER))
    if steps == 0:
        gpu = cm.iteration(None, batch, CONTEXT).total_s
    else:
        pol = TreePolicy("dynamic-topk", depth=steps, topk=topk, budget=tokens)
        gpu = cm.iteration(pol, batch, CONTEXT, tokens=tokens, accepted=accept_length).total_s
    engine = truth().iteration_s_for(batch, steps, topk > 1, 1, "eagle3" if steps else "")
    return float(np.asarray(gpu).reshape(-1)[0]) + float(engine)


def launch_line(judge: Any, steps: int, topk: int, tokens: int) -> str:
    """`server_args={...}` as SGLang 0.5.23 logs it, for these speculative flags."""
    from sglang.srt.sampling.watermarking.core import redact_watermark_secrets

    root = Path(tempfile.mkdtemp())
    target = judge._stub(root, "target", judge.LLAMA_8B)
    # a stated seed: SGLang draws one at resolution otherwise (the line would differ per run)
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, "--random-seed", "0"]
    if steps:
        draft = judge._stub(root, "draft", judge.EAGLE3_8B)
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft]
        argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk)]
        argv += ["--speculative-num-draft-tokens", str(tokens)]
    resolved = judge._resolve_sglang(argv)
    for key, value in list(resolved.items()):  # the stub folders stand for the published repos
        if value == target or value == str(Path(target)):
            resolved[key] = TARGET_REPO
        elif steps and value == draft:
            resolved[key] = DRAFTER_REPO
    return f"server_args={redact_watermark_secrets(resolved)}"


def write_log(
    gen: Any, judge: Any, config: str, out: Path, rng: np.random.Generator
) -> list[dict[str, float]]:
    """One SGLang log: the launch line, then INTERVALS decode lines per batch size; returns
    what each decode line reports (for the truth file)."""
    src = Path(__import__("sglang").__file__).parent.parent
    steps, topk, tokens = CONFIGS[config]
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("[%(asctime)s TP0] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger(f"sglang.fit.{config}")
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.info(launch_line(judge, steps, topk, tokens))

    clock = gen.Clock()

    class DisaggregationMode:  # sglang/srt/disaggregation/utils.py
        NULL, PREFILL, DECODE = "null", "prefill", "decode"

    spec_args = SimpleNamespace(speculative_num_steps=steps, speculative_num_draft_tokens=tokens)
    ns: dict[str, Any] = {
        "time": clock,
        "logger": logger,
        "RECORD_STEP_TIME": False,
        "LOG_FORWARD_ITERS": False,
        "ENABLE_METRICS_DEVICE_TIMER": False,
        "DisaggregationMode": DisaggregationMode,
        "get_spec": lambda: spec_args,
        "get_disagg": lambda: SimpleNamespace(language_only=False),
    }
    report = gen._compile_alone(src / f"{SRC}/metrics_reporter.py", "SchedulerMetricsReporter.report_decode_stats", dict(ns))  # fmt: skip
    update = gen._compile_alone(src / f"{SRC}/metrics_reporter.py", "SchedulerMetricsReporter.update_spec_metrics", dict(ns))  # fmt: skip
    usage_parts = gen._compile_alone(src / f"{SRC}/pool_stats_observer.py", "PoolStats.get_decode_usage_msg_parts", {})  # fmt: skip
    chain = TREE_CHAIN if topk > 1 else CHAIN
    max_tokens = 400_000
    lines = []
    for batch in BATCHES:
        used = int(CONTEXT) * batch
        pool = SimpleNamespace(
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            is_hisparse=False,
            full_num_used=used,
            full_token_usage=used / max_tokens,
        )
        pool.get_decode_usage_msg_parts = lambda pool=pool: usage_parts(pool)
        scheduler = SimpleNamespace(
            running_batch=SimpleNamespace(reqs=[object()] * batch, forward_iter=None),
            waiting_queue=[],
            forward_ct=0,
            spec_algorithm=SimpleNamespace(is_none=lambda: steps == 0, is_dspark=lambda: False),
            disaggregation_mode=DisaggregationMode.NULL,
            pool_stats_observer=SimpleNamespace(get_pool_stats=lambda pool=pool: pool),
            kv_events_publisher=SimpleNamespace(publish_kv_events=lambda: None),  # no KV events
        )
        rep = SimpleNamespace(
            scheduler=scheduler,
            current_scheduler_metrics_enabled=False,
            is_stats_logging_rank=True,
            enable_mfu_metrics=False,
            decode_log_interval=LOG_INTERVAL,
            forward_ct_decode=0,
            last_decode_stats_tic=clock.perf_counter(),
            last_gen_throughput=0.0,
            num_generated_tokens=0,
            spec_num_accept_tokens=0,
            spec_num_correct_drafts=0,
            spec_num_forward_ct=0,
            spec_num_block_accept_tokens=0,
            spec_num_cap_tokens=0,
            spec_total_num_accept_tokens=0,
            spec_total_num_forward_ct=0,
            _graph_backend_label="cuda graph",  # SchedulerMetricsReporter._init_metrics, device cuda
        )
        for _ in range(INTERVALS):
            generated = 0
            for _ in range(LOG_INTERVAL):  # one decode step of the whole batch
                correct = 0
                for _ in range(batch):
                    n = 0
                    while n < steps and rng.random() < chain[n]:
                        n += 1
                    correct += n
                new = batch + correct
                rep.num_generated_tokens += new  # batch_result_processor.py
                if steps:
                    update(rep, batch, correct, num_accept_tokens=new)
                generated += new
            rep.forward_ct_decode += LOG_INTERVAL
            accept_length = generated / (batch * LOG_INTERVAL)
            step = step_s(batch, steps, topk, tokens, accept_length)
            step *= math.exp(NOISE * rng.standard_normal())
            clock.now += LOG_INTERVAL * step
            report(rep, can_run_cuda_graph=True)
            lines.append({"batch": batch, "accept_length": accept_length, "step_s": step})
    out.write_text(buf.getvalue())
    return lines


def main(out: Path = HERE) -> None:
    gen = _load(HERE / "generate.py", "engines_generate")
    judge = _load(HERE.parent.parent / "test_engines_judge.py", "engines_judge")
    rng = np.random.default_rng(SEED)
    lines: dict[str, list[dict[str, float]]] = {}
    for config in CONFIGS:
        lines[config] = write_log(gen, judge, config, out / f"sglang-fit-{config}.log", rng)
    doc = {
        "about": "parameters behind sglang-fit-*.log (tests/data/engines/generate_fit_sglang.py)",
        "target": TARGET,
        "drafter": DRAFTER,
        "gpu": GPU,
        "input_len": 1024,
        "output_len": 256,
        "chain": list(CHAIN),
        "tree_chain": list(TREE_CHAIN),
        "noise": NOISE,
        "overheads": asdict(truth()),
        "lines": lines,
    }
    (out / "sglang-fit-truth.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder to write (default: here)")
    main(ap.parse_args().out)
