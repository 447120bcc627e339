"""Hugging Face config.json -> ModelSpec: published configs of every supported family, bounds,
unknown and missing keys, dtype and quantization, and the spec files of docs/examples."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.specs import MODEL_PRESETS, SpecError, load_hardware, load_model
from spectune.specs.hf_config import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    HFConfigWarning,
    hf_config_path,
)
from spectune.specs.model import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "data" / "hf_configs"
EXAMPLES = ROOT / "docs" / "examples"

# folder -> the ModelSpec fields its published config.json implies (values worked by hand from
# the config: e.g. deepseek-v3 first_k_dense_replace 3 -> dense_layers 3)
EXPECTED: dict[str, dict[str, object]] = {
    "llama-3.1-8b-instruct": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
        family="llama-3", weight_dtype="bfloat16", dtype_bytes=2, tie_embeddings=False,
    ),
    "qwen2.5-32b-instruct": dict(
        layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, ffn=27648, vocab=152064,
        family="qwen2", weight_dtype="bfloat16",
    ),
    "qwen3-8b": dict(
        layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
        family="qwen3",
    ),
    "qwen3-30b-a3b": dict(
        layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, vocab=151936, experts=128,
        experts_topk=8, expert_ffn=768, dense_layers=0, family="qwen3",
    ),
    "mixtral-8x7b-instruct-v0.1": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=32000, experts=8,
        experts_topk=2, expert_ffn=14336, family="mistral",
    ),
    "deepseek-v3": dict(
        layers=61, hidden=7168, heads=128, kv_heads=128, ffn=18432, vocab=129280, experts=256,
        experts_topk=8, expert_ffn=2048, shared_experts=1, dense_layers=3, q_lora_rank=1536,
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        dtype_bytes=1, quantization="fp8 fmt e4m3 block 128x128", family="deepseek-v3",
    ),
    "gpt-oss-120b": dict(
        layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, vocab=201088, experts=128,
        experts_topk=4, expert_ffn=2880, quantization="mxfp4", weight_dtype="", dtype_bytes=2,
        family="gpt-oss",
    ),
    "gemma-2-9b-it": dict(
        layers=42, hidden=3584, heads=16, kv_heads=8, head_dim=256, ffn=14336, vocab=256000,
        tie_embeddings=True, weight_dtype="float32", dtype_bytes=2, family="gemma",
    ),
    "eagle3-llama3.1-instruct-8b": dict(
        arch="eagle3-head", draft_method="eagle3", layers=1, hidden=4096, heads=32, kv_heads=8,
        ffn=14336, vocab=128256, draft_vocab=32000, family="llama-3", weight_dtype="float16",
    ),
}  # fmt: skip


def _load(folder: str) -> ModelSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConfigWarning)
        return load_model(FIXTURES / folder)


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_published_config_reads_field_for_field(folder: str) -> None:
    spec = _load(folder)
    got = {k: getattr(spec, k) for k in EXPECTED[folder]}
    assert got == EXPECTED[folder]
    assert spec.name == folder and "config.json" in spec.source


@pytest.mark.parametrize(
    ("folder", "preset"),
    [
        ("llama-3.1-8b-instruct", "llama-3.1-8b"),
        ("qwen3-8b", "qwen3-8b"),
        ("qwen3-30b-a3b", "qwen3-30b-a3b"),
        ("deepseek-v3", "deepseek-v3"),
        ("eagle3-llama3.1-instruct-8b", "eagle3-llama-3.1-8b"),
    ],
)
def test_configs_price_like_the_presets_built_from_them(folder: str, preset: str) -> None:
    spec, ref = _load(folder), MODEL_PRESETS[preset]
    assert spec.total_params() == ref.total_params()
    assert spec.active_params_per_token() == ref.active_params_per_token()
    assert spec.kv_bytes_per_token() == ref.kv_bytes_per_token()


def test_published_parameter_counts() -> None:
    # model cards: Mixtral 46.7B, gpt-oss-120b 117B, Gemma-2-9B 9.24B parameters
    assert _load("mixtral-8x7b-instruct-v0.1").total_params() / 1e9 == pytest.approx(46.7, 0.01)
    assert _load("gpt-oss-120b").total_params() / 1e9 == pytest.approx(117, rel=0.01)
    assert _load("gemma-2-9b-it").total_params() / 1e9 == pytest.approx(9.24, rel=0.01)


def test_unpriceable_formats_warn_and_fp8_is_priced() -> None:
    with pytest.warns(HFConfigWarning, match=r"cannot price 'mxfp4'"):
        load_model(FIXTURES / "gpt-oss-120b")
    with pytest.warns(HFConfigWarning, match="float32 checkpoint priced as 16-bit"):
        load_model(FIXTURES / "gemma-2-9b-it")
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFConfigWarning)
        assert load_model(FIXTURES / "deepseek-v3").dtype_bytes == 1  # fp8: priced, no warning


def _write(tmp: Path, cfg: object, name: str = "config.json") -> Path:
    p = tmp / name
    p.write_text(json.dumps(cfg))
    return p


BASE = json.loads((FIXTURES / "llama-3.1-8b-instruct" / "config.json").read_text())


def test_any_json_with_hf_keys_is_read_as_hf(tmp_path: Path) -> None:
    """The issue's case: a config.json saved under another name was rejected ('unknown field
    architectures'); it is read as a Hugging Face config now, unknown keys ignored."""
    p = _write(tmp_path, {**BASE, "some_future_key": {"x": [1, 2]}}, "qwen-like.json")
    assert hf_config_path(p) == p
    spec = load_model(p)
    assert (spec.name, spec.hidden) == ("qwen-like", 4096)
    own = _write(tmp_path, {"name": "m", "layers": 2, "hidden": 64, "heads": 2, "kv_heads": 2,
                            "head_dim": 32, "ffn": 128, "vocab": 100}, "mine.json")  # fmt: skip
    assert hf_config_path(own) is None and load_model(own).layers == 2


@pytest.mark.parametrize(
    "key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
)
def test_missing_required_key_names_key_and_file(tmp_path: Path, key: str) -> None:
    cfg = {k: v for k, v in BASE.items() if k != key}
    with pytest.raises(SpecError, match=rf"config\.json: missing key '{key}'"):
        load_model(_write(tmp_path, cfg))


def test_missing_moe_key_and_bad_type(tmp_path: Path) -> None:
    moe = json.loads((FIXTURES / "qwen3-30b-a3b" / "config.json").read_text())
    del moe["num_experts_per_tok"]
    with pytest.raises(SpecError, match="missing key 'num_experts_per_tok'"):
        load_model(_write(tmp_path, moe))
    with pytest.raises(SpecError, match=r"key 'hidden_size' .* must be an integer, got '4k'"):
        load_model(_write(tmp_path, {**BASE, "hidden_size": "4k"}))
    with pytest.raises(SpecError, match="needs key 'head_dim'"):
        load_model(_write(tmp_path, {**BASE, "hidden_size": 4100}))


def test_reading_is_bounded(tmp_path: Path) -> None:
    deep: object = 1
    for _ in range(MAX_NESTING + 1):
        deep = {"k": deep}
    with pytest.raises(SpecError, match="nested deeper than"):
        load_model(_write(tmp_path, {**BASE, "rope_scaling": deep}))
    big = tmp_path / "config.json"
    big.write_text(json.dumps(BASE) + " " * MAX_CONFIG_BYTES)
    with pytest.raises(SpecError, match=r"larger than a config\.json"):
        load_model(big)
    pathological = tmp_path / "deep" / "config.json"
    pathological.parent.mkdir()
    pathological.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecError, match=r"nested deeper|not valid JSON|top level"):
        load_model(pathological.parent)


def test_text_config_of_a_multimodal_config(tmp_path: Path) -> None:
    text = {k: BASE[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "intermediate_size", "vocab_size")}  # fmt: skip
    spec = load_model(_write(tmp_path, {"model_type": "llava", "text_config": text}))
    assert (spec.layers, spec.hidden, spec.kv_heads) == (32, 4096, 8)


def test_cli_takes_a_config_folder_and_names_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = FIXTURES / "qwen3-8b"
    assert main(["cost", "--target", str(folder), "--drafter", "none", "--batch", "1",
                 "--tokens", "1", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["rows"][0]["verify_s"] > 0
    bad = _write(tmp_path, {k: v for k, v in BASE.items() if k != "vocab_size"})
    assert main(["cost", "--target", str(bad), "--drafter", "none"]) == 2
    assert "missing key 'vocab_size'" in capsys.readouterr().err


def test_example_spec_files_load() -> None:
    gpu = load_hardware(EXAMPLES / "gpu-h100-sxm.json")
    assert gpu.hbm_bytes_per_s == pytest.approx(3.35e12)
    model = load_model(EXAMPLES / "model-qwen2.5-32b.json")
    assert model.total_params() == _load("qwen2.5-32b-instruct").total_params()
    toml = load_model(EXAMPLES / "model-eagle3-head.toml")
    assert toml.is_head and toml.draft_vocab == 32000
