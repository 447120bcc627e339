"""Hardware and model specs: presets against hand-worked figures, loading and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    SpecError,
    load_hardware,
    load_model,
    model_preset,
)
from spectune.specs.policy import PolicyTable, TreePolicy


def test_llama_8b_parameter_and_kv_counts_by_hand() -> None:
    m = model_preset("llama-3.1-8b")
    attn = 4096 * 4096 * 2 + 2 * 4096 * 1024  # q, o + k, v
    mlp = 3 * 4096 * 14336
    emb = 128256 * 4096
    assert m.total_params() == 32 * (attn + mlp) + 2 * emb  # 8.03e9
    assert m.weight_bytes() == pytest.approx(16.06e9, rel=1e-3)
    assert m.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2  # 131072 bytes = 128 KiB


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama-3.1-70b", 70.6),
        ("qwen3-30b-a3b", 30.5),
        ("qwen3-235b-a22b", 235.1),
        ("deepseek-v3", 671.0),
        ("llama-3.2-1b", 1.24),
        ("eagle3-llama-3.1-8b", 0.42),
        ("smollm2-135m", 0.135),
    ],
)
def test_published_parameter_counts(name: str, billions: float) -> None:
    assert model_preset(name).total_params() / 1e9 == pytest.approx(billions, rel=0.02)


def test_moe_active_params_and_mla_kv() -> None:
    assert model_preset("qwen3-30b-a3b").active_params_per_token() / 1e9 == pytest.approx(
        3.3, rel=0.1
    )
    ds = model_preset("deepseek-v3")
    assert ds.kv_bytes_per_token() == 61 * (512 + 64) * 2
    assert ds.active_params_per_token() / 1e9 == pytest.approx(37.6, rel=0.05)


def test_every_preset_cites_a_source() -> None:
    for spec in [*HARDWARE_PRESETS.values(), *MODEL_PRESETS.values()]:
        assert spec.source and spec.source != "user-provided"


def test_unknown_preset_lists_closest_names() -> None:
    with pytest.raises(SpecError, match=r"Did you mean 'h100-sxm'"):
        load_hardware("h100")
    with pytest.raises(SpecError, match=r"llama-3.1-8b"):
        load_model("llama3.1-8b")


def test_load_model_json_and_toml(tmp_path: Path) -> None:
    fields = {
        "name": "tiny",
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "ffn": 128,
        "vocab": 1000,
    }
    (tmp_path / "m.json").write_text(json.dumps(fields))
    (tmp_path / "m.toml").write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items()))
    assert load_model(tmp_path / "m.json") == load_model(tmp_path / "m.toml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hiden": 64}, r"unknown field 'hiden' \(did you mean 'hidden'\?\)"),
        ({"layers": "two"}, r"field 'layers': expected an integer"),
        ({"heads": 5}, r"'heads' \(5\) must be a multiple of 'kv_heads'"),
        ({"layers": 0}, r"'layers' must be > 0"),
        ({"experts": 8}, r"experts_topk"),
    ],
)
def test_malformed_model_file_names_field_and_file(
    tmp_path: Path, change: dict, message: str
) -> None:
    fields = {
        "name": "tiny",
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "ffn": 128,
        "vocab": 1000,
        **change,
    }
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(fields))
    with pytest.raises(SpecError, match=message) as e:
        load_model(path)
    assert "bad.json" in str(e.value)


def test_missing_field_and_bad_syntax(tmp_path: Path) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text('name = "x"\npeak_bf16_flops = 1e15\n')
    with pytest.raises(SpecError, match=r"gpu.toml: missing required field 'peak_fp8_flops'"):
        load_hardware(path)
    path.write_text("name = ")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_hardware(path)


def test_policy_table_round_trip_and_lookup(tmp_path: Path) -> None:
    from spectune.specs.policy import Bucket, Prediction

    table = PolicyTable(
        target="llama-3.1-8b",
        drafter="eagle3-llama-3.1-8b",
        hardware="h100-sxm",
        buckets=(
            Bucket(
                (1, 8),
                (0, 8192),
                TreePolicy("dynamic-topk", 6, 8, 48, 0.01, 4),
                Prediction(1000.0, 2.1, 3.5),
            ),
            Bucket((9, 1024), (0, 8192), None),
        ),
    )
    path = tmp_path / "p.json"
    table.save(path)
    again = PolicyTable.load(path)
    assert again == table
    assert again.lookup(4, 100) == table.buckets[0].policy
    assert again.lookup(64, 100) is None
    assert again.lookup(4, 100_000) == table.buckets[0].policy  # nearest bucket past the range


def test_policy_parse_cli_form() -> None:
    assert TreePolicy.parse("static:5,4,8") == TreePolicy("static", 5, 4, 8)
    pruned = TreePolicy("dynamic-topk", 6, 8, 48, 0.02, 4)
    assert pruned.label == "dynamic-topk:6,8,48,0.02,4"
    assert TreePolicy.parse(pruned.label) == pruned
    with pytest.raises(SpecError, match="cannot parse policy"):
        TreePolicy.parse("static:5,4")
    with pytest.raises(SpecError, match="budget"):
        TreePolicy.parse("static:5,4,1")


def test_qwen3_small_draft_model_matches_its_published_size() -> None:
    """Qwen3-0.6B (tied embeddings): 0.596B parameters with norms, 0.44B without embeddings."""
    m = model_preset("qwen3-0.6b")
    assert m.vocab == model_preset("qwen3-30b-a3b").vocab  # usable as the MoE's draft model
    assert abs(m.total_params() / 1e9 - 0.596) < 0.01


def test_parse_int_list() -> None:
    """Comma lists for the CLI and the dashboards: spaces and a trailing comma are fine; words,
    negatives and empty text are SpecErrors naming what was parsed."""
    from spectune.specs.io import parse_int_list

    assert parse_int_list("1, 8,64,") == [1, 8, 64]
    for bad in ("", "1,x", "4,-1"):
        with pytest.raises(SpecError, match="batch edges"):
            parse_int_list(bad, "batch edges")


# ---- hierarchical policies --------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    ["dynamic-topk:3,10,30,hier6", "static:4,4,32,0.01,2,hier12", "dynamic-topk:2,1,3,hier2"],
)
def test_hierarchical_label_round_trips(text: str) -> None:
    p = TreePolicy.parse(text)
    assert p.chain > 0 and p.hierarchical and p.label == text
    assert TreePolicy.parse(p.label) == p


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"chain": -1}, "chain"),
        ({"chain": 65}, "chain"),
        ({"chain": True}, "chain"),
        ({"chain": 4, "shared_budget": True}, "share"),
    ],
)
def test_hostile_chain_is_an_error(kw: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        TreePolicy("dynamic-topk", 3, 4, 12, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["dynamic-topk:3,10,30,hierx", "dynamic-topk:3,10,30,hier0"])
def test_bad_hierarchical_labels_are_errors(text: str) -> None:
    with pytest.raises(SpecError, match="hierN"):
        TreePolicy.parse(text)


def test_policy_file_keeps_chain_only_when_hierarchical(tmp_path: Path) -> None:
    from spectune.specs.policy import Bucket

    hier = TreePolicy("dynamic-topk", 3, 10, 30, chain=6)
    tree = TreePolicy("dynamic-topk", 3, 10, 30)
    table = PolicyTable(
        "llama-3.1-70b-gptq",
        "eagle-llama-3-70b",
        "h100-sxm",
        (Bucket((1, 1), (0, 4096), hier), Bucket((2, 8), (0, 4096), tree)),
    )
    d = table.to_dict()
    assert d["buckets"][0]["policy"]["chain"] == 6 and "chain" not in d["buckets"][1]["policy"]
    p = tmp_path / "p.json"
    table.save(p)
    back = PolicyTable.load(p)
    assert back.lookup(1, 100) == hier and back.lookup(4, 100) == tree


def test_b200_preset_is_nvidias_per_board_sparse_figures_per_dense_gpu() -> None:
    """HGX B200 (8 GPUs, rates "with sparsity"): BF16 36, FP8 72, FP4 144 PFLOPS; 1.4 TB HBM3e;
    8 TB/s and 1.8 TB/s NVLink 5 (both directions) per GPU. One GPU dense = board / 8 / 2."""
    b200 = load_hardware("b200")
    assert b200.peak_bf16_flops == pytest.approx(36e15 / 8 / 2)
    assert b200.peak_fp8_flops == pytest.approx(72e15 / 8 / 2)
    assert b200.peak_fp4_flops == pytest.approx(144e15 / 8 / 2)
    assert b200.hbm_bytes_per_s == pytest.approx(8e12)
    assert 8 * b200.hbm_bytes == pytest.approx(1.44e12)
    assert 2 * b200.interconnect_bytes_per_s == pytest.approx(1.8e12)
