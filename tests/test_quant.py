"""Quantized weight formats (specs.quant) priced by the cost model, their presets and readers,
and the acceptance of hierarchical drafting (planner.hierarchical)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.planner.acceptance import PositionalAcceptance
from spectune.planner.costmodel import CostModel
from spectune.planner.hierarchical import (
    HierAcceptance,
    chain_acceptance,
    hierarchical_outcome,
    sample_hierarchical,
)
from spectune.planner.operators import gemm_time
from spectune.specs import (
    Calibration,
    SpecError,
    TreePolicy,
    hardware_preset,
    load_hardware,
    load_model,
    model_preset,
)
from spectune.specs.quant import WEIGHT_FORMATS, check_format, linear_weight_bytes

H100 = hardware_preset("h100-sxm")
W4_70B = model_preset("llama-3.1-70b-gptq")


# ---- formats -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fmt", "group", "want"),
    [
        ("w4a16", 128, 0.5 + 2 / 128),  # 4 bits + one fp16 scale per 128
        ("w4a16", 0, 0.5),  # per-channel scales: not counted
        ("nvfp4", 0, 0.5 + 1 / 16),  # fp8 scale per 16
        ("mxfp4", 32, 0.5 + 1 / 32),  # e8m0 scale per 32
        ("fp8", 128, 1 + 4 / 128),  # fp32 scale per 128-block row
        ("w8a8-int8", 0, 1.0),
        ("", 0, 2.0),  # dense: dtype_bytes
    ],
)
def test_bytes_per_weight_worked_by_hand(fmt: str, group: int, want: float) -> None:
    assert linear_weight_bytes(fmt, group, 2) == pytest.approx(want)


@pytest.mark.parametrize(
    ("fmt", "group", "match"),
    [
        ("int4", 128, "weight_format"),
        ("W4A16", 128, "weight_format"),
        ("w4a16", -1, "quant_group_size"),
        ("w4a16", 96, "power of two"),
        ("w4a16", 8192, "quant_group_size"),
        ("w4a16", True, "quant_group_size"),
        ("nvfp4", 32, "fixes 'quant_group_size' at 16"),
        ("mxfp4", 16, "fixes 'quant_group_size' at 32"),
        ("", 128, "needs a quantized 'weight_format'"),
    ],
)
def test_hostile_formats_name_the_field(fmt: str, group: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        check_format(fmt, group, "model x")  # type: ignore[arg-type]


def test_a_bad_format_in_a_spec_file_names_field_and_file(tmp_path: Path) -> None:
    base = dataclasses.asdict(model_preset("llama-3.1-8b"))
    for bad, match in (
        ({"weight_format": "awq4"}, "weight_format"),
        ({"weight_format": "w4a16", "quant_group_size": 100}, "quant_group_size"),
        ({"weight_format": "w4a16", "quant_group_size": "128"}, "quant_group_size"),
    ):
        p = tmp_path / "m.json"
        p.write_text(json.dumps({**base, **bad}))
        with pytest.raises(SpecError, match=match) as e:
            load_model(p)
        assert "m.json" in str(e.value)


def test_hostile_hardware_and_calibration_fields(tmp_path: Path) -> None:
    hw = dataclasses.asdict(H100)
    for field, value in (
        ("peak_fp4_flops", 5.0),
        ("peak_int8_ops", -1.0),
        ("peak_fp4_flops", math.nan),
    ):
        p = tmp_path / "gpu.json"
        p.write_text(json.dumps({**hw, field: value}).replace("NaN", '"nan"'))
        with pytest.raises(SpecError, match=field):
            load_hardware(p)
    assert dataclasses.replace(H100, peak_fp4_flops=0.0).peak_fp4_flops == 0.0  # 0: none
    for field, value in (
        ("weight_only_flops_efficiency", 0.0),
        ("weight_only_flops_efficiency", 1.5),
        ("weight_only_flops_efficiency", math.nan),
        ("weight_only_bw_efficiency", 2.0),
        ("weight_only_tile_m", 0),
    ):
        with pytest.raises(SpecError, match=field):
            Calibration(**{field: value})


# ---- presets -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "base", "method"),
    [
        ("llama-3.1-8b-awq", "llama-3.1-8b", "awq"),
        ("llama-3.1-70b-awq", "llama-3.1-70b", "awq"),
        ("llama-3.1-8b-gptq", "llama-3.1-8b", "gptq"),
        ("llama-3.1-70b-gptq", "llama-3.1-70b", "gptq"),
    ],
)
def test_quantized_presets_keep_the_shape_and_cite_the_repo(
    name: str, base: str, method: str
) -> None:
    q, b = model_preset(name), model_preset(base)
    assert (q.weight_format, q.quant_group_size) == ("w4a16", 128)
    assert q.total_params() == b.total_params() and q.kv_bytes_per_token() == b.kv_bytes_per_token()
    assert q.hf_repo.startswith("hugging-quants/") and method.upper() in q.hf_repo
    assert q.hf_repo in q.source and method in q.quantization
    # linear layers at 0.516 bytes, embedding + LM head at 2: between a quarter and a third
    assert 0.25 < q.weight_bytes() / b.weight_bytes() < 0.36


def test_gptq_8b_weight_bytes_match_the_checkpoint() -> None:
    # hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4: safetensors 4.97 GB + 764 MB
    assert model_preset("llama-3.1-8b-gptq").weight_bytes() == pytest.approx(5.73e9, rel=0.02)


def test_hf_awq_config_reads_as_w4a16(tmp_path: Path) -> None:
    cfg = json.loads(
        (
            Path(__file__).parent / "data" / "hf_configs" / "llama-3.1-8b-instruct" / "config.json"
        ).read_text()
    )
    cfg["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "zero_point": True,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = load_model(p)
    assert (spec.weight_format, spec.quant_group_size) == ("w4a16", 128)
    assert spec.dtype_bytes == 2


# ---- the cost model ------------------------------------------------------------------------
def test_w4a16_gemm_roofline_worked_by_hand() -> None:
    cm = CostModel(H100, W4_70B)
    r, fmt = cm.rates, cm._target.fmt
    n, k = 28672 * 2, 8192  # gate+up of a 70B layer
    bw = 3.35e12 * 0.9  # HardwareSpec hbm bandwidth x hbm_efficiency
    mem = (n * k * (0.5 + 2 / 128) + 1 * (n + k) * 2) / bw
    assert float(gemm_time(r, 1, n, k, fmt)) == pytest.approx(mem, rel=1e-9)
    # 256 rows: compute-bound at the dequantizing share of the bf16 rate; 16-row tiles x
    # 448 column tiles = 7168 tiles over 132 SMs: 55 waves, i.e. 55 * 132 * 16 / 448 rows
    m_eff = 55 * 132 * 16 / 448
    flops = 2 * m_eff * n * k / (989e12 * (792.1 / 989) * 0.45)
    assert float(gemm_time(r, 256, n, k, fmt)) == pytest.approx(flops, rel=1e-9)


def test_crossover_where_w4a16_stops_being_memory_bound() -> None:
    cm_q = CostModel(H100, W4_70B)
    knee = cm_q.knee_tokens()
    want = 989e12 * (792.1 / 989) * 0.45 * (0.5 + 2 / 128) / (2 * 3.35e12 * 0.9)
    assert knee == pytest.approx(want)
    assert 20 < knee < 40  # Marlin-class: tens of rows, not hundreds
    bf16_knee = CostModel(H100, model_preset("llama-3.1-70b"), tp=2).knee_tokens()
    assert bf16_knee > 6 * knee
    r, fmt = cm_q.rates, cm_q._target.fmt
    n, k = 8192, 28672
    t1 = float(gemm_time(r, 1, n, k, fmt))
    assert float(gemm_time(r, 16, n, k, fmt)) == pytest.approx(t1, rel=0.02)  # flat below
    assert float(gemm_time(r, 4 * knee, n, k, fmt)) > 3 * t1  # linear above
    faster = CostModel(H100, W4_70B, calibration=Calibration(weight_only_flops_efficiency=0.9))
    assert faster.knee_tokens() == pytest.approx(2 * knee)


@settings(max_examples=30, deadline=None)
@given(
    fmt=st.sampled_from([f for f in WEIGHT_FORMATS if f]),
    batch=st.integers(1, 64),
    a=st.integers(1, 128),
    b=st.integers(1, 128),
    gpu=st.sampled_from(["a100-80g", "h100-sxm", "h200"]),
)
def test_verify_time_never_falls_as_tokens_grow(
    fmt: str, batch: int, a: int, b: int, gpu: str
) -> None:
    group = {"nvfp4": 16, "mxfp4": 32}.get(fmt, 128)
    m = dataclasses.replace(model_preset("llama-3.1-8b"), weight_format=fmt, quant_group_size=group)
    cm = CostModel(hardware_preset(gpu), m)
    lo, hi = sorted((a, b))
    assert float(cm.verify_time(batch, lo, 512)) <= float(cm.verify_time(batch, hi, 512)) * (
        1 + 1e-12
    )


def test_quantized_formats_take_units_where_the_gpu_has_them() -> None:
    m = dataclasses.replace(
        model_preset("llama-3.1-8b"), weight_format="nvfp4", quant_group_size=16
    )
    fp4_gpu = dataclasses.replace(H100, name="fp4-gpu", peak_fp4_flops=4 * 989e12)
    native = CostModel(fp4_gpu, m)._target.fmt
    fallback = CostModel(H100, m)._target.fmt
    assert (native.peak_flops, native.kernels, native.flops_scale) == (4 * 989e12, 2, 1.0)
    assert (fallback.peak_flops, fallback.kernels, fallback.tile_m) == (989e12, 1, 16)
    assert fallback.flops_scale == Calibration().weight_only_flops_efficiency
    int8 = CostModel(hardware_preset("a100-80g"), model_preset("llama-3.1-70b-w8a8"), tp=2)
    assert int8._target.fmt.peak_flops == 624e12 and int8._target.fmt.weight_bytes == 1.0
    # the LM head stays dense bf16 in every quantized checkpoint
    assert CostModel(H100, W4_70B)._target.head_fmt.weight_bytes == 2.0


def test_quantized_decode_is_priced_below_bf16_and_tree_verify_costs_more() -> None:
    q = CostModel(hardware_preset("a100-80g"), W4_70B)
    one, tree = float(q.verify_time(1, 1, 1024)), float(q.verify_time(1, 30, 1024))
    bf16 = CostModel(hardware_preset("a100-80g"), model_preset("llama-3.1-70b"), tp=2)
    # the paper's observation: a 30-token tree on a W4A16 70B costs far more than one token,
    # on bf16 weights barely more
    assert tree / one > 1.5
    assert float(bf16.verify_time(1, 30, 1024)) / float(bf16.verify_time(1, 1, 1024)) < 1.1
    assert q.memory_floor_time() < 0.6 * bf16.memory_floor_time() * 2


# ---- hierarchical acceptance ---------------------------------------------------------------
def _deterministic(alpha: float) -> HierAcceptance:
    """Every tree node accepted by the intermediate; the target accepts each chain token with
    probability alpha."""
    return HierAcceptance(tree=PositionalAcceptance([[1.0]]), chain=chain_acceptance(alpha))


@pytest.mark.parametrize(("depth", "chain"), [(2, 6), (3, 6), (4, 10), (1, 1)])
def test_hierarchical_outcome_worked_by_hand(depth: int, chain: int) -> None:
    alpha = 0.8
    policy = TreePolicy("dynamic-topk", depth, 1, depth + 1, chain=chain)
    h = hierarchical_outcome(policy, _deterministic(alpha), samples=256)
    rounds = math.ceil(chain / (depth + 1))
    length = rounds * (depth + 1)
    assert h.rounds == rounds and h.chain_tokens == length and h.target_tokens == length + 1
    assert h.round_accepted == depth + 1 and h.tree_tokens == depth + 1
    want = 1 + sum(alpha**i for i in range(1, length + 1))
    assert h.expected_tokens == pytest.approx(want, rel=0.02)


def test_hierarchical_sampler_agrees_with_the_outcome() -> None:
    models = HierAcceptance(tree=PositionalAcceptance([[0.7, 0.2]]), chain=chain_acceptance(0.85))
    policy = TreePolicy("dynamic-topk", 3, 2, 8, chain=5)
    h = hierarchical_outcome(policy, models)
    tok, nodes = sample_hierarchical(policy, models, np.random.default_rng(1), 4000)
    assert (nodes >= policy.chain + 1).all() and (tok >= 1).all() and (tok <= nodes).all()
    assert tok.mean() == pytest.approx(h.expected_tokens, rel=0.05)
    assert nodes.mean() == pytest.approx(h.target_tokens, rel=0.03)


def test_hostile_hierarchical_inputs() -> None:
    with pytest.raises(SpecError, match="not hierarchical"):
        hierarchical_outcome(TreePolicy("dynamic-topk", 3, 2, 8), _deterministic(0.8))
    for alpha in (0.0, 1.0, -0.5, math.nan):
        with pytest.raises(SpecError, match="alpha"):
            chain_acceptance(alpha)


def test_hierarchical_policy_simulates_near_its_closed_form() -> None:
    from spectune.planner.objective import ClosedFormObjective
    from spectune.simulator import SimConfig, simulate
    from spectune.simulator.arrivals import ClosedLoop
    from spectune.specs import load_workload

    models = HierAcceptance(tree=PositionalAcceptance([[0.7, 0.2]]), chain=chain_acceptance(0.85))
    target, head70 = W4_70B, model_preset("eagle-llama-3-70b")
    cm = CostModel(
        H100,
        target,
        head70,
        intermediate=model_preset("llama-3.1-8b-gptq"),
        intermediate_drafter=model_preset("eagle-llama-3.1-8b"),
    )
    policy = TreePolicy("dynamic-topk", 3, 2, 8, chain=5)
    obj = ClosedFormObjective(cm, models.tree, hierarchy=models)
    closed = obj(policy, 1, 256) / obj(None, 1, 256)
    cfg = SimConfig(
        H100,
        target,
        head70,
        ClosedLoop(1),
        policy,
        load_workload("mt-bench"),
        requests=12,
        cost_model=cm,
        acceptance=models.tree,
        hierarchy=models,
    )
    speedup = float(simulate(cfg).summary()["speedup_vs_off"])
    assert speedup == pytest.approx(closed, rel=0.15)
    with pytest.raises(SpecError, match="hierarchy"):
        simulate(dataclasses.replace(cfg, hierarchy=None))
