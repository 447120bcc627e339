"""Generate the engine-fit fixtures: vLLM server logs whose numbers come from known parameters.

The logs are printed by the installed vLLM's own logging code, exactly as generate.py prints
vllm-0.33.0.log (vllm/v1/metrics/loggers.py LoggingStatLogger.log, vllm/v1/spec_decode/metrics.py
SpecDecodingLogging.log fed SpecDecodingStats.observe_draft outcomes, vLLM's log format; the
launch line through VllmConfig.__str__ / SpeculativeConfig.__repr__ on a stand-in config). What
they report is chosen so that a fit has a known answer (TRUTH, written to vllm-fit-truth.json):

- acceptance: every draft of K tokens is accepted up to its first miss, position k accepted
  with probability CHAIN[k-1] given the previous one was (drawn with a fixed seed), so the
  logged per-position rates and mean acceptance length are what the draws gave;
- throughput: per interval, batch x (1 + accepted / drafts) / step_s output tokens/s, with
  step_s = spectune's CostModel.iteration(...).total_s for Llama-3.1-8B + its EAGLE-3 head on an
  H100 SXM (no engine overhead, draft extend over the accept length, context CONTEXT tokens)
  plus TRUTH's EngineOverheads.iteration_s_for(batch, K, chain, tp 1), times exp(0.01 N(0,1))
  measurement noise.

Files: vllm-fit-k2.log and vllm-fit-k4.log (speculation on, K = 2 and 4, batches 1 to 128),
vllm-fit-off.log (speculation off, the same batches), vllm-fit-truth.json.

    PYTHONPATH=. python tests/data/engines/generate_fit.py [--out DIR]   # from the repo root

vLLM 0.33.0 (PyPI wheel, installed without its GPU dependencies) is what wrote the committed
files; generate.py's README says how to install it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TARGET, DRAFTER, GPU = "llama-3.1-8b", "eagle3-llama-3.1-8b", "h100-sxm"
TARGET_REPO, DRAFTER_REPO = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
)
INPUT_LEN, OUTPUT_LEN = 1024, 256
CONTEXT = INPUT_LEN + OUTPUT_LEN / 2  # what fit-engine takes for --input-len/--output-len
CHAIN = (0.8, 0.75, 0.7, 0.65)  # P(position k accepted | position k-1 accepted)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
STEPS = (2, 4)
INTERVAL_S = 5.0
NOISE = 0.01
SEED = 7


def truth() -> Any:
    from spectune.specs.engine import EngineOverheads

    return EngineOverheads(
        iteration_s=5e-4,
        per_request_s=2e-5,
        spec_iteration_s=8e-4,
        per_draft_step_s=1.5e-4,
        tree_s=0.0,
        overlap=0.3,
        tp_growth=0.1,
    )


def _generate_module() -> Any:
    spec = importlib.util.spec_from_file_location("engines_generate", HERE / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def step_s(batch: int, steps: int, accept_length: float) -> float:
    """CostModel price of one iteration plus the true engine overheads."""
    from spectune.planner.costmodel import CostModel
    from spectune.specs import TreePolicy, load_hardware, load_model

    cm = CostModel(load_hardware(GPU), load_model(TARGET), load_model(DRAFTER))
    if steps == 0:
        gpu = cm.iteration(None, batch, CONTEXT).total_s
    else:
        pol = TreePolicy("dynamic-topk", depth=steps, topk=1, budget=steps + 1)
        gpu = cm.iteration(pol, batch, CONTEXT, tokens=steps + 1, accepted=accept_length).total_s
    engine = truth().iteration_s_for(batch, steps, False, 1)
    return float(np.asarray(gpu).reshape(-1)[0]) + float(engine)


def _launch(gen: Any, steps: int) -> None:
    from vllm.config import SpeculativeConfig, VllmConfig
    from vllm.logger import init_logger

    spec: Any = None
    if steps:
        stand_in = gen.Anything(
            method="eagle3",
            num_speculative_tokens=steps,
            draft_model_config=gen.Anything(model=DRAFTER_REPO),
        )
        spec = gen._Repr(SpeculativeConfig.__repr__(stand_in))
    cfg = gen.Anything(
        model_config=gen.Anything(model=TARGET_REPO),
        parallel_config=gen.Anything(tensor_parallel_size=1),
        speculative_config=spec,
    )
    init_logger("vllm.v1.engine.core").info(
        "Initializing a V1 LLM engine (v%s) with config: %s", "0.33.0", VllmConfig.__str__(cfg)
    )


def write_log(gen: Any, steps: int, out: Path, rng: np.random.Generator) -> None:
    """One vLLM log: the launch line, then an interval per batch size."""
    import vllm.v1.metrics.loggers as loggers
    import vllm.v1.spec_decode.metrics as metrics
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    buf = gen._vllm_capture()
    buf.seek(0)
    buf.truncate()
    clock = gen.Clock()
    loggers.time = clock
    metrics.time = clock
    _launch(gen, steps)
    stat_logger = gen._vllm_stat_logger(loggers)
    for batch in BATCHES:
        sched = SchedulerStats(num_running_reqs=batch, num_waiting_reqs=0)
        sched.kv_cache_usage = 0.25
        accept_length = 1.0
        if steps:
            stats = SpecDecodingStats.new(steps)
            drafts = 50 * batch
            accepted = 0
            for _ in range(drafts):
                n = 0
                while n < steps and rng.random() < CHAIN[n]:
                    n += 1
                stats.observe_draft(steps, n)
                accepted += n
            sched.spec_decoding_stats = stats
            accept_length = 1.0 + accepted / drafts
        tps = batch * accept_length / step_s(batch, steps, accept_length)
        tps *= math.exp(NOISE * rng.standard_normal())
        stat_logger.record(scheduler_stats=sched, iteration_stats=None)
        stat_logger.num_generation_tokens = round(tps * INTERVAL_S)
        clock.now += INTERVAL_S
        stat_logger.log()
    out.write_text(buf.getvalue())


def main(out: Path = HERE) -> None:
    gen = _generate_module()
    rng = np.random.default_rng(SEED)
    for steps in STEPS:
        write_log(gen, steps, out / f"vllm-fit-k{steps}.log", rng)
    write_log(gen, 0, out / "vllm-fit-off.log", rng)
    doc = {
        "about": "parameters behind vllm-fit-*.log (tests/data/engines/generate_fit.py)",
        "target": TARGET,
        "drafter": DRAFTER,
        "gpu": GPU,
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "chain": list(CHAIN),
        "noise": NOISE,
        "overheads": asdict(truth()),
    }
    (out / "vllm-fit-truth.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder to write (default: here)")
    main(ap.parse_args().out)
