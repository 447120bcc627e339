"""Plain greedy decoding with the KV cache (the baseline speculative decoding must equal)."""

from __future__ import annotations

from spectune.traces.smollm.model import SmolLM


def greedy_generate(
    model: SmolLM, prompt: list[int], new_tokens: int, eos: int | None = None
) -> list[int]:
    """Greedy continuation of `prompt`: one prefill, then one cached forward per token."""
    cache = model.new_cache(len(prompt) + new_tokens + 1)
    logits = model.prefill(cache, prompt)
    out: list[int] = []
    nxt = int(logits[-1].argmax())
    while True:
        out.append(nxt)
        if len(out) >= new_tokens or (eos is not None and nxt == eos):
            return out
        nxt = int(model.prefill(cache, [nxt])[-1].argmax())
