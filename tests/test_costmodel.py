"""Cost model: one contract suite run against dense, MoE, MLA, tensor-parallel and draft-model
set-ups; hand-worked roofline figures; calibration files; the `spectune cost` command."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectune.cli import main
from spectune.planner.costmodel import BREAKDOWN_KEYS, CostModel
from spectune.planner.operators import expected_experts
from spectune.specs import Calibration, SpecError, TreePolicy, hardware_preset, model_preset

H100 = hardware_preset("h100-sxm")
H100_BW = 3.35e12 * 0.90  # datasheet HBM bytes/s x default achievable fraction


@functools.cache
def cost_model(gpu: str, target: str, drafter: str | None, tp: int) -> CostModel:
    return CostModel(
        hardware_preset(gpu), model_preset(target), model_preset(drafter) if drafter else None, tp
    )


batches = st.integers(1, 300)
tokens = st.integers(1, 300)
contexts = st.integers(0, 65536)
# The contract's properties run once per subclass; the cost model is pure, so the same
# test function under several executors is expected here.
contract_property = settings(suppress_health_check=[HealthCheck.differing_executors])


class CostModelContract:
    """What every CostModel set-up must satisfy. Subclasses name the set-up."""

    gpu = "h100-sxm"
    target = "llama-3.1-8b"
    drafter: str | None = "eagle3-llama-3.1-8b"
    tp = 1

    @property
    def cm(self) -> CostModel:
        return cost_model(self.gpu, self.target, self.drafter, self.tp)

    def test_broadcasts_to_float64_arrays(self) -> None:
        b = np.array([1, 8, 64])[:, None, None]
        n = np.array([1, 4, 16, 64])[None, :, None]
        c = np.array([0, 4096])[None, None, :]
        for t in (
            self.cm.verify_time(b, n, c),
            self.cm.draft_step_time(b, n, c),
            self.cm.draft_time(b, 3, n, c),
            self.cm.draft_extend_time(b, n, c),
            self.cm.iteration(
                TreePolicy("dynamic-topk", 4, 2, 8), b, c, tokens=n, accepted=2.5
            ).total_s,
        ):
            assert t.dtype == np.float64
            assert t.shape == (3, 4, 2)
            assert np.all(np.isfinite(t)) and np.all(t >= 0)
        assert self.cm.iteration(None, b, c).total_s.shape == (3, 1, 2)
        cm = self.cm
        for scalar in (
            cm.verify_time(1, 1, 0),
            cm.draft_step_time(1, 4, 0),
            cm.draft_time(1, 3, 4, 0),
            cm.draft_extend_time(1, 2.5, 0),
            cm.step_overhead_time(1, 8),
            cm.iteration(TreePolicy("dynamic-topk", 3, 4, 8), 1, 0, accepted=2.5).total_s,
            cm.iteration(None, 1, 0).total_s,
            cm.retrieval_time(1),
        ):
            assert isinstance(scalar, np.ndarray) and scalar.shape == ()

    def test_breakdown_sums_to_total(self) -> None:
        b, n, c = (
            np.array([1, 7, 64, 300]),
            np.array([1, 16, 64, 8]),
            np.array([0, 512, 4096, 9000]),
        )
        parts = self.cm.verify_breakdown(b, n, c)
        assert tuple(parts) == BREAKDOWN_KEYS
        total = np.sum(np.stack(list(parts.values())), axis=0)
        np.testing.assert_allclose(total, self.cm.verify_time(b, n, c), rtol=1e-12)
        if self.tp == 1:
            assert np.all(parts["comm"] == 0)
        else:
            assert np.all(parts["comm"] > 0)

    @contract_property
    @given(batches, tokens, contexts)
    def test_never_below_memory_floor(self, b: int, n: int, c: int) -> None:
        assert self.cm.verify_time(b, n, c) >= self.cm.memory_floor_time()

    @contract_property
    @given(batches, tokens, contexts, st.integers(0, 200))
    def test_monotone_in_tokens(self, b: int, n: int, c: int, dn: int) -> None:
        cm = self.cm
        assert cm.verify_time(b, n + dn, c) >= cm.verify_time(b, n, c)
        assert cm.draft_step_time(b, n + dn, c) >= cm.draft_step_time(b, n, c)

    @contract_property
    @given(batches, tokens, contexts, st.integers(0, 20000))
    def test_monotone_in_context(self, b: int, n: int, c: int, dc: int) -> None:
        cm = self.cm
        assert cm.verify_time(b, n, c + dc) >= cm.verify_time(b, n, c)
        assert cm.draft_step_time(b, n, c + dc) >= cm.draft_step_time(b, n, c)

    @contract_property
    @given(batches, tokens, contexts, st.integers(0, 100))
    def test_monotone_in_batch(self, b: int, n: int, c: int, db: int) -> None:
        cm = self.cm
        assert cm.verify_time(b + db, n, c) >= cm.verify_time(b, n, c)
        assert cm.iteration(None, b + db, c).total_s >= cm.iteration(None, b, c).total_s

    def test_ragged_forward_equals_uniform_batch(self) -> None:
        # 8 is a CUDA-graph batch size, so the uniform batch is not padded
        t = self.cm.ragged_forward_time([16] * 8, [1000] * 8, cuda_graph=True)
        assert isinstance(t, float)
        assert t == pytest.approx(float(self.cm.verify_time(8, 16, 1000)), rel=1e-9)
        # eager (the default) costs more launch time; longer sequences cost more
        assert self.cm.ragged_forward_time([16] * 8, [1000] * 8) > t
        assert self.cm.ragged_forward_time([16] * 7 + [500], [1000] * 8) > t

    def test_flat_then_linear_in_tokens(self) -> None:
        cm = self.cm
        n = np.array([1, 8, 32])  # tokens far below the knee (~180-260 for these GPUs)
        parts = cm.verify_breakdown(1, n, 0)
        dense = parts["qkv_o"] + parts["lm_head"]
        assert np.all(dense / dense[0] < 1.15)  # far below the knee: weight reads dominate
        # (lm_head also holds the per-token logits pass over the whole vocabulary, which every
        # rank runs after the gather: DeepSeek-V3 at tp 8, 32 tokens, +10%)
        assert np.all(parts["qkv_o"] / parts["qkv_o"][0] < 1.1)
        if cm.target.is_moe:  # ... but each new token may route to experts not yet read
            assert parts["mlp"][2] > 2 * parts["mlp"][0]
        else:
            flat = cm.verify_time(1, n, 0)
            assert np.all(flat / flat[0] < 1.1)
        # well past the knee (16 and 32 knees of tokens, as 4-token trees): linear in tokens
        knee = cm.knee_tokens(experts=True)  # MoE: each expert sees k/E of the tokens
        far = cm.verify_time(np.round(np.array([4, 8]) * knee), 4, 0)
        assert 1.8 < far[1] / far[0] < 2.2

    def test_iteration_is_the_sum_of_its_phases(self) -> None:
        cm = self.cm
        b, c, acc = np.array([1, 16]), 2048, 3.2
        policy = TreePolicy("dynamic-topk", 5, 4, 16)
        step = cm.iteration(policy, b, c, accepted=acc)
        parts = (
            cm.draft_time(b, 5, 4, c)
            + cm.verify_time(b, 16, c)
            + cm.draft_extend_time(b, acc, c)
            + cm.step_overhead_time(b, 16)
        )
        np.testing.assert_allclose(step.total_s, parts)
        off = cm.iteration(None, b, c)
        np.testing.assert_allclose(
            off.total_s, cm.verify_time(b, 1, c) + cm.step_overhead_time(b, 1)
        )
        assert np.all(step.total_s > off.total_s)

    def test_draft_phases(self) -> None:
        cm = self.cm
        assert cm.draft_time(4, 0, 4, 1000) == 0
        assert cm.draft_extend_time(4, 0, 1000) == 0
        if cm.drafter is None:
            assert cm.draft_time(4, 3, 4, 1000) == pytest.approx(float(cm.retrieval_time(4)))
            return
        fixed = cm.calibration.draft_step_s  # top-k / sort / pool bookkeeping of each step
        # the selection reads each drafted row's logits: 4 rows in the first step, 4 x 4 later
        row = float(cm.draft_select_time(1))
        vocab_bytes = cm.drafter.lm_vocab * 2
        assert row == pytest.approx(vocab_bytes / cm.calibration.draft_select_bytes_per_s)
        one = cm.draft_time(4, 1, 4, 1000)
        first = float(cm.draft_step_time(4, 1, 1000, from_target=True))
        assert one == pytest.approx(first + fixed + 4 * row)
        five = cm.draft_time(4, 5, 4, 1000)
        later = cm.draft_step_time(4, 4, 1000) + fixed + 16 * row
        assert five == pytest.approx(float(one + 4 * later))
        # wider steps select over more rows: the per-row cost grows with batch x top-k
        wide = cm.draft_parts(64, 7, 10, 1000)["bookkeeping"]
        narrow = cm.draft_parts(64, 7, 1, 1000)["bookkeeping"]
        assert float(wide - narrow) == pytest.approx(64 * 6 * 9 * row)
        # a drafter step is cheaper than a target step of the same shape
        assert cm.draft_step_time(8, 4, 1000) < cm.verify_time(8, 4, 1000)

    def test_bad_inputs_are_spec_errors(self) -> None:
        with pytest.raises(SpecError, match="tokens must be >= 0"):
            self.cm.verify_time(1, -1, 0)
        with pytest.raises(SpecError, match="context must be finite"):
            self.cm.verify_time(1, 1, np.nan)
        with pytest.raises(SpecError, match="batch"):
            self.cm.iteration(None, -2, 0)
        with pytest.raises(SpecError, match="batch must be numbers"):
            self.cm.iteration(None, "eight", 0)
        with pytest.raises(SpecError, match="equal length"):
            self.cm.ragged_forward_time([1, 2], [3])


class TestDenseLlama8B(CostModelContract):
    pass


class TestMoEQwen30B(CostModelContract):
    target = "qwen3-30b-a3b"
    drafter = None


class TestMLADeepSeekV3(CostModelContract):
    gpu = "h200"  # 671 GB of fp8 weights do not fit 8 x 80 GB
    target = "deepseek-v3"
    drafter = None
    tp = 8


class TestTensorParallelLlama70B(CostModelContract):
    target = "llama-3.1-70b"
    drafter = "eagle3-llama-3.1-70b"
    tp = 2


class TestDraftModelLlama1B(CostModelContract):
    drafter = "llama-3.2-1b"


@functools.cache
def _fitted_form() -> CostModel:
    """Llama-3.1-8B + EAGLE-3 under the form `spectune calibrate` fits: half a partial wave
    charged (FIT_WAVE_TAIL) and a ragged verify's sync."""
    cal = Calibration(gemm_wave_tail=0.5, ragged_sync_s=0.2e-3)
    return CostModel(
        H100, model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b"), calibration=cal
    )


class TestFittedFormLlama8B(CostModelContract):
    @property
    def cm(self) -> CostModel:
        return _fitted_form()


# ---- numbers worked by hand -----------------------------------------------------------------


def test_llama_8b_batch_1_decode_is_weight_streaming() -> None:
    cm = cost_model("h100-sxm", "llama-3.1-8b", None, 1)
    assert cm.target.weight_bytes() == pytest.approx(16.06e9, rel=1e-3)
    # one token streams every weight but the embedding table (a lookup reads one row):
    # 32 layers x (q,k,v,o 41.9M + MLP 176.2M) + LM head 525.3M = 7.504e9 params = 15.01 GB
    streamed = 2 * (32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) + 128256 * 4096)
    assert streamed == pytest.approx(15.01e9, rel=1e-3)
    assert cm.memory_floor_time() == pytest.approx(streamed / H100_BW, rel=1e-9)  # 4.98 ms
    parts = cm.verify_breakdown(1, 1, 0)
    gemms = parts["qkv_o"] + parts["mlp"] + parts["lm_head"]
    assert gemms == pytest.approx(streamed / H100_BW, rel=0.01)
    # whole step: weight bytes / achievable bandwidth (5.33 ms) plus launches: public ~6-7 ms
    t = float(cm.verify_time(1, 1, 0))
    assert 1.0 < t / (16.06e9 / H100_BW) < 1.3
    assert 6e-3 < t < 7e-3


def test_llama_8b_batch_64_decode_reads_34_gb_of_kv() -> None:
    cm = cost_model("h100-sxm", "llama-3.1-8b", None, 1)
    kv = 64 * 4096 * (32 * 2 * 8 * 128 * 2)  # 64 seqs x 4096 tokens x 128 KiB = 34.4 GB
    assert kv == pytest.approx(34.36e9, rel=1e-3)
    attn = float(cm.verify_breakdown(64, 1, 4095)["attention"])  # 4095 cached + 1 new
    assert attn == pytest.approx(kv / H100_BW, rel=0.01)  # 11.4 ms
    assert cm.iteration(None, 64, 4095).total_s > 2.5 * cm.iteration(None, 1, 4095).total_s


def test_gemm_wave_tail_by_hand() -> None:
    """gemm_effective_rows: past the SMs, the partial last wave costs gemm_wave_tail of a whole
    one (worked by hand on the H100: 132 SMs, 64 x 128 tiles); below them, the padded rows."""
    from spectune.planner.operators import Rates, gemm_effective_rows

    n = 28672  # 224 column tiles
    for tail in (1.0, 0.5, 0.0):
        r = Rates.resolve(H100, Calibration(gemm_wave_tail=tail))
        # M = 136 pads to 192 rows: 3 x 224 = 672 tiles = 5.09 waves -> 6 waves = 792 tiles,
        # i.e. 792 / 224 * 64 = 226.3 rows
        whole = 6 * 132 / 224 * 64
        assert float(gemm_effective_rows(r, 136, n)) == pytest.approx(192 + tail * (whole - 192))
        # fewer tiles than SMs (N = 4096: 32 column tiles, 3 x 32 = 96): the padded rows only
        assert float(gemm_effective_rows(r, 136, 4096)) == 192
    with pytest.raises(SpecError, match="gemm_wave_tail"):
        Calibration(gemm_wave_tail=1.5)


def test_fitted_calibrations_charge_half_a_partial_wave() -> None:
    from spectune.validate.fit import FIT_WAVE_TAIL, PARAMS, _calibration

    x = [start for _, _, _, start in PARAMS]
    assert _calibration(x, "h100-sxm", Calibration()).gemm_wave_tail == FIT_WAVE_TAIL == 0.5


def test_knee_at_the_ridge_point() -> None:
    cm = cost_model("h100-sxm", "llama-3.1-8b", None, 1)
    # bf16 weight GEMM turns compute-bound when 2*T FLOPs per weight = ridge * 2 bytes:
    # T = 989e12 * (792.1/989) / (3.35e12 * 0.9) = 262.7 tokens over the whole batch
    assert cm.knee_tokens() == pytest.approx(792.1e12 / H100_BW, rel=1e-6)
    gemm = lambda t: float(cm.verify_breakdown(1, t, 0)["mlp"])  # noqa: E731
    assert gemm(128) == pytest.approx(gemm(1), rel=0.05)
    assert gemm(1024) / gemm(512) == pytest.approx(2.0, rel=0.1)
    # batch of 16 x 16 tree tokens sits at the same knee as batch 1 x 256
    assert gemm(256) == pytest.approx(float(cm.verify_breakdown(16, 16, 0)["mlp"]), rel=1e-9)
    ds = cost_model("h200", "deepseek-v3", None, 8)
    assert ds.knee_tokens() == pytest.approx(1979e12 * 792.1 / 989 / (2 * 4.8e12 * 0.9), rel=1e-6)


def test_moe_expert_union() -> None:
    assert expected_experts(1, 128, 8) == pytest.approx(8.0)
    assert expected_experts(2, 128, 8) == pytest.approx(128 * (1 - (120 / 128) ** 2))  # 15.5
    assert expected_experts(10_000, 128, 8) == pytest.approx(128.0)
    assert expected_experts(0, 128, 8) == 0.0
    # Monte Carlo: T tokens each pick 8 distinct of 128 experts uniformly
    rng = np.random.default_rng(0)
    union = [
        len({e for _ in range(16) for e in rng.choice(128, 8, replace=False)}) for _ in range(2000)
    ]
    assert np.mean(union) == pytest.approx(float(expected_experts(16, 128, 8)), rel=0.01)
    # Qwen3-30B-A3B batch-1 decode streams top-8 experts of each of 48 layers, not all 128
    cm = cost_model("h100-sxm", "qwen3-30b-a3b", None, 1)
    one = float(cm.verify_breakdown(1, 1, 0)["mlp"])
    many = float(cm.verify_breakdown(1, 200, 0)["mlp"])
    routed_one = 48 * 8 * 3 * 2048 * 768 * 2 / H100_BW
    assert one == pytest.approx(routed_one, rel=0.05)
    assert many / one == pytest.approx(float(expected_experts(200, 128, 8)) / 8, rel=0.1)


def test_tensor_parallel_all_reduce_by_hand() -> None:
    cm = cost_model("h100-sxm", "llama-3.1-70b", None, 2)
    link = 450e9 * 0.80  # NVLink 4 one direction x ring bus efficiency
    lat = H100.interconnect_latency_s
    # 80 layers x 2 all-reduces of [1, 8192] bf16: ring moves 2*(tp-1)/tp of the bytes
    ar = 160 * (2 * 1 / 2 * 8192 * 2 / link + lat)
    gather = 1 / 2 * 128256 * 2 / link + lat  # logits all-gather
    copy = 2 * 128256 * 2 / float(cm.rates.elementwise_bytes_per_s)  # its [L, V] layout copy
    launches = (160 + 2) * cm.rates.launch_s  # each collective's kernel and the copy's
    got = float(cm.verify_breakdown(1, 1, 0)["comm"])
    assert got == pytest.approx(ar + gather + copy + launches, rel=1e-9)
    # weights split over 2 GPUs: half the per-GPU floor of tp=1
    one = cost_model("h100-sxm", "llama-3.1-70b", None, 1)
    assert cm.memory_floor_time() == pytest.approx(one.memory_floor_time() / 2, rel=1e-9)


def test_mla_reads_the_latent_cache_once_per_rank() -> None:
    cm = cost_model("h200", "deepseek-v3", None, 8)
    kv = 32 * 4095 * 61 * (512 + 64) * 2 + 0.0  # latent + RoPE key per token, all 61 layers
    attn = float(cm.verify_breakdown(32, 1, 4094)["attention"])
    assert attn == pytest.approx(kv / (4.8e12 * 0.9), rel=0.05)


def test_cuda_graph_padding_and_eager_launches() -> None:
    cm = cost_model("h100-sxm", "llama-3.1-8b", None, 1)
    b5, b8 = cm.verify_breakdown(5, 4, 100), cm.verify_breakdown(8, 4, 100)
    assert float(b5["mlp"]) == float(b8["mlp"])  # batch 5 replays the batch-8 graph
    assert float(b5["attention"]) < float(b8["attention"])  # padding rows read no KV
    l256, l257 = (float(cm.verify_breakdown(b, 1, 0)["launch"]) for b in (256, 257))
    assert l257 > l256  # above the largest captured batch, kernels launch eagerly


def test_eagle3_head_first_step_runs_fc() -> None:
    cm = cost_model("h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b", 1)
    fc_bytes = 3 * 4096 * 4096 * 2
    extra = cm.draft_step_time(1, 1, 0, from_target=True) - cm.draft_step_time(1, 1, 0)
    assert float(extra) == pytest.approx(fc_bytes / H100_BW + H100.launch_s, rel=0.02)
    # head weights minus fc (0.37e9 params): one draft step at batch 1 ~ 0.25 ms + launches
    assert 0.25e-3 < float(cm.draft_step_time(1, 1, 0)) < 0.4e-3


def test_construction_errors() -> None:
    with pytest.raises(SpecError, match="tp=3 must divide the attention heads"):
        CostModel(H100, model_preset("llama-3.1-8b"), tp=3)
    with pytest.raises(SpecError, match="tp must be a positive integer"):
        CostModel(H100, model_preset("llama-3.1-8b"), tp=0)
    with pytest.raises(SpecError, match="draft head"):
        CostModel(H100, model_preset("eagle3-llama-3.1-8b"))
    with pytest.raises(SpecError, match="fitted on 'a100-80g'"):
        CostModel(H100, model_preset("llama-3.1-8b"), calibration=Calibration(hardware="a100-80g"))
    # tp above the KV heads replicates them (vLLM/SGLang) and stays valid
    CostModel(H100, model_preset("llama-3.1-8b"), tp=16)


# ---- calibration ----------------------------------------------------------------------------


def test_calibration_defaults_reproduce_hardware_figures() -> None:
    cal = Calibration()
    plain = cost_model("h100-sxm", "llama-3.1-8b", None, 1)
    same = CostModel(H100, model_preset("llama-3.1-8b"), calibration=cal)
    assert float(same.verify_time(8, 8, 1000)) == float(plain.verify_time(8, 8, 1000))


def test_calibration_changes_prices_and_round_trips(tmp_path: Path) -> None:
    cal = Calibration(
        hardware="h100-sxm",
        gemm_tokens=(64.0, 256.0, 1024.0),
        gemm_flops_efficiency=(0.4, 0.6, 0.75),
        weight_bw_efficiency=0.8,
        launch_s=2e-6,
        source="test",
    )
    path = tmp_path / "cal.json"
    cal.save(path)
    assert Calibration.load(path) == cal
    cm = CostModel(H100, model_preset("llama-3.1-8b"), calibration=cal)
    base = cost_model("h100-sxm", "llama-3.1-8b", None, 1)
    assert cm.memory_floor_time() == pytest.approx(base.memory_floor_time() * 0.9 / 0.8)
    assert cm.verify_time(1, 512, 0) > base.verify_time(1, 512, 0)  # 0.6-0.75 < 0.80 of peak


def test_draft_step_and_tree_node_costs_by_hand() -> None:
    """The fixed cost per draft step and the tree-building cost per node, worked by hand."""
    us = 1e-6
    cal = Calibration(
        draft_step_s=80 * us,
        tree_build_s=100 * us,
        tree_build_per_node_s=0.05 * us,
        step_overhead_s=10 * us,
        per_request_overhead_s=1 * us,
    )
    target, head = model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b")
    cm = CostModel(H100, target, head, calibration=cal)
    bare = CostModel(H100, target, head, calibration=replace(cal, draft_step_s=0.0))
    # 7 draft steps (1 over the root + 6 over the top-10 frontier) x 80 us = 560 us
    extra = cm.draft_time(1, 7, 10, 4096) - bare.draft_time(1, 7, 10, 4096)
    assert float(extra) == pytest.approx(560 * us)
    assert cm.draft_time(1, 0, 10, 4096) == 0  # no drafting, no bookkeeping
    # B=8, 16-node trees: 10 fixed + 8 x 1 per request + 100 tree + 8 x 16 x 0.05 = 124.4 us
    assert float(cm.step_overhead_time(8, 16)) == pytest.approx(124.4 * us)
    assert float(cm.step_overhead_time(8, 1)) == pytest.approx(18 * us)  # no tree: 10 + 8
    # both reach the whole speculative step
    policy = TreePolicy("dynamic-topk", 5, 4, 16)
    step = cm.iteration(policy, 8, 4096, accepted=3.0).total_s
    step = step - bare.iteration(policy, 8, 4096, accepted=3.0).total_s
    assert float(step) == pytest.approx(5 * 80 * us)


def test_tree_level_cost_by_hand() -> None:
    """A dynamic tree pays tree_build_per_level_s once per level, a static one not at all, and
    the iteration carries it; a negative cost is refused."""
    us = 1e-6
    cal = Calibration(
        tree_build_s=40 * us,
        static_tree_build_s=15 * us,
        tree_build_per_node_s=0.05 * us,
        tree_build_per_level_s=20 * us,
        step_overhead_s=10 * us,
        per_request_overhead_s=1 * us,
    )
    target, head = model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b")
    cm = CostModel(H100, target, head, calibration=cal)
    # B=8, a depth-3 dynamic 4-node chain: 10 + 8 x 1 + 40 + 3 x 20 + 8 x 4 x 0.05 = 119.6 us
    assert float(cm.step_overhead_time(8, 4, depth=3)) == pytest.approx(119.6 * us)
    # the static builder: 10 + 8 + 15 + 1.6 = 34.6 us whatever the depth
    assert float(cm.step_overhead_time(8, 4, builder="static", depth=3)) == pytest.approx(34.6 * us)
    assert cal.tree_build_cost_s("dynamic-topk", 7) == pytest.approx((40 + 7 * 20) * us)
    flat = CostModel(H100, target, head, calibration=replace(cal, tree_build_per_level_s=0.0))
    for d in (3, 7):
        policy = TreePolicy("dynamic-topk", d, 2, d + 1)
        extra = cm.iteration(policy, 8, 4096).total_s - flat.iteration(policy, 8, 4096).total_s
        assert float(extra) == pytest.approx(d * 20 * us)
    with pytest.raises(SpecError, match="tree_build_per_level_s"):
        Calibration(tree_build_per_level_s=-1 * us)


def test_static_builder_fixed_costs_by_hand() -> None:
    """The static builder's own per-step and tree costs, worked by hand, and the uncalibrated
    estimate (STATIC_STEP_FRACTION of the dynamic per-step cost, STATIC_TREE_BUILD_S)."""
    us = 1e-6
    cal = Calibration(
        draft_step_s=80 * us,
        static_draft_step_s=40 * us,
        tree_build_s=100 * us,
        static_tree_build_s=15 * us,
        tree_build_per_node_s=0.05 * us,
        step_overhead_s=10 * us,
        per_request_overhead_s=1 * us,
    )
    target, head = model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b")
    cm = CostModel(H100, target, head, calibration=cal)
    dyn = cm.iteration(TreePolicy("dynamic-topk", 5, 4, 8), 8, 4096, accepted=3.0).total_s
    sta = cm.iteration(TreePolicy("static", 5, 4, 8), 8, 4096, accepted=3.0).total_s
    # 5 draft steps x (80 - 40) us + tree (100 - 15) us = 285 us less per iteration
    assert float(dyn - sta) == pytest.approx(285 * us)
    # B=8, 8-node static trees: 10 fixed + 8 x 1 per request + 15 tree + 8 x 8 x 0.05 = 36.2 us
    assert float(cm.step_overhead_time(8, 8, builder="static")) == pytest.approx(36.2 * us)
    assert float(cm.draft_time(1, 5, 4, 4096, builder="static")) == pytest.approx(
        float(cm.draft_time(1, 5, 4, 4096)) - 5 * 40 * us
    )
    plain = Calibration(draft_step_s=80 * us, tree_build_s=100 * us)
    assert plain.draft_step_cost_s("static") == pytest.approx(0.83 * 80 * us)
    assert plain.tree_build_cost_s("static") == pytest.approx(36 * us)  # STATIC_TREE_BUILD_S
    cheap = Calibration(draft_step_s=80 * us, tree_build_s=20 * us)
    assert cheap.tree_build_cost_s("static") == pytest.approx(20 * us)  # never above dynamic
    with pytest.raises(SpecError, match="builder"):
        cm.draft_time(1, 5, 4, 4096, builder="sequoia")


def test_calibration_file_errors_name_field_and_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"launch_s": "fast"}))
    with pytest.raises(SpecError, match=r"bad\.json.*'launch_s'"):
        Calibration.load(path)
    path.write_text(json.dumps({"weight_bw_efficency": 0.9}))
    with pytest.raises(SpecError, match="did you mean 'weight_bw_efficiency'"):
        Calibration.load(path)
    path.write_text(json.dumps({"weight_bw_efficiency": 1.5}))
    with pytest.raises(SpecError, match=r"bad\.json.*fraction"):
        Calibration.load(path)
    with pytest.raises(SpecError, match="M/eff falls"):
        Calibration(gemm_tokens=(64.0, 128.0), gemm_flops_efficiency=(0.2, 0.8))
    with pytest.raises(SpecError, match="same length"):
        Calibration(gemm_tokens=(64.0,), gemm_flops_efficiency=(0.2, 0.8))


# ---- CLI ------------------------------------------------------------------------------------


def test_cli_cost_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["cost", "--json", "--batch", "1,8", "--tokens", "1,4", "--context", "128"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 4
    keys = {"batch", "tokens", "context", "verify_s", "draft_step_s", "ar_step_s", "breakdown"}
    for row in rows:
        assert set(row) == keys
        assert set(row["breakdown"]) == set(BREAKDOWN_KEYS)
        assert sum(row["breakdown"].values()) == pytest.approx(row["verify_s"], rel=1e-9)
        assert row["draft_step_s"] > 0
    assert [(r["batch"], r["tokens"]) for r in rows] == [(1, 1), (1, 4), (8, 1), (8, 4)]


def test_cli_cost_table_and_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["cost"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b" in out and len(out.splitlines()) == 2 + 9
    cal = tmp_path / "c.json"
    Calibration(hardware="h100-sxm", launch_s=1e-6).save(cal)
    args = ["cost", "--json", "--drafter", "none", "--batch", "4", "--tokens", "2"]
    assert main([*args, "--calibration", str(cal)]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["draft_step_s"] == 0.0 and row["context"] == 4096


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "h100"], "unknown GPU 'h100'"),
        (["--target", "llama-9b"], "unknown model"),
        (["--tp", "3"], "tp=3 must divide"),
        (["--target", "deepseek-v3", "--tp", "0"], "tp"),
    ],
)
def test_cli_cost_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cost", *argv]) == 2
    assert message in capsys.readouterr().err


# ---- fitting a calibration from measurements ---------------------------------------------------


def test_fit_calibration_recovers_a_known_gpu() -> None:
    from spectune.planner.operators import Rates, attention_time, gemm_time
    from spectune.validate.microbench import invert_microbenchmarks

    true = Calibration(
        hardware="h100-sxm",
        gemm_tokens=(64.0, 256.0, 1024.0, 4096.0),
        gemm_flops_efficiency=(0.5, 0.65, 0.72, 0.78),
        weight_bw_efficiency=0.85,
        elementwise_bw_efficiency=0.8,
        interconnect_efficiency=0.7,
        allreduce_latency_s=12e-6,
        attention_bw_efficiency=0.85,
        attention_flops_efficiency=0.5,
        launch_s=3e-6,
        gemm_fixed_s=4e-6,
        attention_fixed_s=6e-6,
        step_overhead_s=80e-6,
        per_request_overhead_s=3e-6,
    )
    r = Rates.resolve(H100, true)
    rows: list[dict[str, float | str]] = [{"kind": "launch", "seconds": 3e-6}]
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        for m in (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
            t = float(gemm_time(r, m, n, k, r.dense_format(2))) + 3e-6
            rows.append({"kind": "gemm", "m": m, "n": n, "k": k, "weight_bytes": 2, "seconds": t})
    for kv_bytes, flops in ((1e7, 1e8), (1e8, 1e9), (1e9, 1e10), (1e8, 1e11), (1e9, 1e12)):
        t = float(attention_time(r, kv_bytes, flops, 0.0)) + 3e-6
        rows.append({"kind": "attention", "kv_bytes": kv_bytes, "flops": flops, "seconds": t})
    for size in (1e6, 1e7, 1e8, 1e9):
        rows.append({"kind": "copy", "bytes": size, "seconds": 3e-6 + size / (3.35e12 * 0.8)})
    for tp in (2, 4, 8):
        for size in (1e5, 1e7):
            ring = 2 * (tp - 1) / tp * size / (450e9 * 0.7)
            rows.append({"kind": "allreduce", "bytes": size, "tp": tp, "seconds": 12e-6 + ring})
    for bs in (1, 8, 64):
        rows.append({"kind": "step_overhead", "batch": bs, "seconds": 80e-6 + 3e-6 * bs})
    fit = invert_microbenchmarks(rows, H100)
    assert fit.hardware == "h100-sxm" and "measurements" in fit.source
    assert fit.launch_s == pytest.approx(3e-6)
    assert fit.elementwise_bw_efficiency == pytest.approx(0.8, rel=1e-6)
    assert fit.weight_bw_efficiency == pytest.approx(0.85, rel=0.03)
    assert fit.gemm_fixed_s == pytest.approx(4e-6, rel=0.1)
    assert fit.attention_bw_efficiency == pytest.approx(0.85, rel=1e-6)
    assert fit.attention_fixed_s == pytest.approx(6e-6, rel=1e-6)
    assert fit.attention_flops_efficiency == pytest.approx(0.5, rel=1e-6)
    assert fit.interconnect_efficiency == pytest.approx(0.7, rel=1e-6)
    assert fit.allreduce_latency_s == pytest.approx(12e-6, rel=1e-6)
    assert fit.step_overhead_s == pytest.approx(80e-6, rel=1e-6)
    assert fit.per_request_overhead_s == pytest.approx(3e-6, rel=1e-6)
    # the fitted model prices whole forward passes like the true one
    llama = model_preset("llama-3.1-8b")
    truth = CostModel(H100, llama, calibration=true)
    fitted = CostModel(H100, llama, calibration=fit)
    batch, tree = np.array([1, 1, 8, 32, 64, 64]), np.array([1, 64, 16, 16, 8, 64])
    gemms = ("qkv_o", "mlp", "lm_head")
    want = np.sum([truth.verify_breakdown(batch, tree, 1024)[c] for c in gemms], axis=0)
    got = np.sum([fitted.verify_breakdown(batch, tree, 1024)[c] for c in gemms], axis=0)
    np.testing.assert_allclose(got, want, rtol=0.05)


def test_fit_calibration_errors() -> None:
    from spectune.validate.microbench import invert_microbenchmarks

    with pytest.raises(SpecError, match="no measurement rows"):
        invert_microbenchmarks([], H100)
    with pytest.raises(SpecError, match="row 0: unknown kind 'gem'"):
        invert_microbenchmarks([{"kind": "gem", "seconds": 1.0}], H100)
    with pytest.raises(SpecError, match=r"row 1 \(gemm\): field 'k'"):
        invert_microbenchmarks(
            [{"kind": "launch", "seconds": 1e-6}, {"kind": "gemm", "m": 1, "n": 2, "seconds": 1.0}],
            H100,
        )
    with pytest.raises(SpecError, match="two or more distinct sizes"):
        invert_microbenchmarks([{"kind": "copy", "bytes": 1e6, "seconds": 1e-5}], H100)


def test_same_answer_in_another_process() -> None:
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from spectune.planner.costmodel import CostModel\n"
        "from spectune.specs import hardware_preset, model_preset\n"
        "cm = CostModel(hardware_preset('h100-sxm'), model_preset('qwen3-30b-a3b'))\n"
        "print(repr(cm.verify_time(np.array([1, 8, 64]), 16, 4096).tolist()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = cost_model("h100-sxm", "qwen3-30b-a3b", None, 1)
    assert out.stdout.strip() == repr(here.verify_time(np.array([1, 8, 64]), 16, 4096).tolist())


# ---- hierarchical drafting -------------------------------------------------------------------
def _hier_cost_model() -> CostModel:
    return CostModel(
        H100,
        model_preset("llama-3.1-70b-gptq"),
        model_preset("eagle-llama-3-70b"),
        intermediate=model_preset("llama-3.1-8b-gptq"),
        intermediate_drafter=model_preset("eagle-llama-3.1-8b"),
    )


def test_hierarchical_iteration_prices_rounds_and_one_chain_verify() -> None:
    cm = _hier_cost_model()
    p = TreePolicy("dynamic-topk", 3, 10, 30, chain=6)
    rounds, tree, acc, chain = 2.5, 24.0, 3.2, 8.0
    step = cm.iteration(p, 4, 1024, tokens=chain + 1, accepted=acc, rounds=rounds, tree_tokens=tree)
    assert float(step.verify_s) == pytest.approx(float(cm.verify_time(4, chain + 1, 1024)))
    one_round = float(cm.intermediate_verify_time(4, tree, 1024))
    assert float(step.intermediate_s) == pytest.approx(rounds * one_round)
    # the drafter is the intermediate's head: R rounds of its 3-step tree
    twice = cm.iteration(p, 4, 1024, tokens=chain + 1, accepted=acc, rounds=2 * rounds)
    assert float(twice.draft_s) == pytest.approx(2 * float(step.draft_s))
    assert float(twice.extend_s) == pytest.approx(2 * float(step.extend_s))
    parts = (step.draft_s, step.intermediate_s, step.verify_s, step.extend_s, step.overhead_s)
    assert float(step.total_s) == pytest.approx(float(sum(parts)))
    assert "intermediate verify" in step.phases()
    # defaults: chain + 1 target tokens, full-depth rounds, the budget as the tree
    d = cm.iteration(p, 1, 1024)
    assert float(d.verify_s) == pytest.approx(float(cm.verify_time(1, 7, 1024)))
    assert float(d.intermediate_s) == pytest.approx(
        2 * float(cm.intermediate_verify_time(1, 30, 1024))
    )
    # a tree policy has no intermediate phase
    assert float(cm.iteration(TreePolicy("dynamic-topk", 3, 10, 30), 1, 1024).intermediate_s) == 0


def test_hierarchical_iteration_hostile_inputs() -> None:
    p = TreePolicy("dynamic-topk", 3, 10, 30, chain=6)
    with pytest.raises(SpecError, match="intermediate model"):
        CostModel(H100, model_preset("llama-3.1-70b-gptq")).iteration(p, 1, 1024)
    cm = _hier_cost_model()
    with pytest.raises(SpecError, match="hierarchical"):
        cm.iteration(TreePolicy("dynamic-topk", 3, 10, 30), 1, 1024, rounds=2)
    for name, kw in (("rounds", {"rounds": -1}), ("tree_tokens", {"tree_tokens": float("nan")})):
        with pytest.raises(SpecError, match=name):
            cm.iteration(p, 1, 1024, **kw)
    with pytest.raises(SpecError, match="draft head"):
        CostModel(
            H100, model_preset("llama-3.1-8b"), intermediate=model_preset("eagle3-llama-3.1-8b")
        )


def test_w4a16_tree_verify_grows_faster_than_bf16() -> None:
    q = CostModel(H100, model_preset("llama-3.1-70b-gptq"))
    b = CostModel(H100, model_preset("llama-3.1-70b"), tp=2)
    ratio_q = float(q.verify_time(1, 64, 1024)) / float(q.verify_time(1, 1, 1024))
    ratio_b = float(b.verify_time(1, 64, 1024)) / float(b.verify_time(1, 1, 1024))
    assert ratio_q > 1.5 > 1.1 > ratio_b


def test_draft_slot_cost_by_hand() -> None:
    """Calibration.draft_slot_s: each later draft step costs draft_slot_s per frontier slot,
    whatever the batch; the first step and a depth-1 phase add none."""
    us = 1e-6
    target, head = model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b")
    cal = Calibration(draft_slot_s=12 * us)
    cm = CostModel(H100, target, head, calibration=cal)
    bare = CostModel(H100, target, head, calibration=replace(cal, draft_slot_s=0.0))
    for b in (1, 64):
        # 7/10: 6 later steps x 10 slots x 12 us = 720 us; 3/1: 2 x 1 x 12 = 24 us
        extra = cm.draft_time(b, 7, 10, 4096) - bare.draft_time(b, 7, 10, 4096)
        assert float(extra) == pytest.approx(720 * us)
        extra = cm.draft_time(b, 3, 1, 4096) - bare.draft_time(b, 3, 1, 4096)
        assert float(extra) == pytest.approx(24 * us)
    assert float(cm.draft_time(8, 1, 10, 4096)) == pytest.approx(
        float(bare.draft_time(8, 1, 10, 4096))
    )
    policy = TreePolicy("dynamic-topk", 5, 4, 16)
    step = cm.iteration(policy, 8, 4096).draft_s - bare.iteration(policy, 8, 4096).draft_s
    assert float(step) == pytest.approx(4 * 4 * 12 * us)


def test_kernel_fixed_costs_do_not_shrink_with_tp() -> None:
    """gemm_fixed_s and attention_fixed_s add the same time per kernel at tp 1 and tp 2: a
    target forward at tp 2 runs the same kernels on half the bytes, so the fixed part of its
    price is the tp-1 one (4 weight GEMMs + 1 attention per layer, and the LM head's GEMM)."""
    us = 1e-6
    target = model_preset("llama-3.1-8b")
    fixed = Calibration(gemm_fixed_s=3 * us, attention_fixed_s=10 * us)
    for tp in (1, 2):
        cm = CostModel(H100, target, tp=tp, calibration=fixed)
        bare = CostModel(H100, target, tp=tp, calibration=Calibration())
        extra = cm.verify_time(1, 16, 4096) - bare.verify_time(1, 16, 4096)
        # 32 layers x (4 x 3 + 10) us + the LM head's 3 us = 707 us
        assert float(extra) == pytest.approx((32 * (4 * 3 + 10) + 3) * us)


def test_static_draft_widths_price_each_step_by_hand() -> None:
    """A static shape's later draft steps run over its drafted nodes per level: each step is
    one drafter forward over that many tokens per sequence, the selection reads B x (1 +
    sum) rows, the slot cost is per drafted node and the builder's fixed cost per step."""
    us = 1e-6
    cal = Calibration(draft_step_s=80 * us, static_draft_step_s=40 * us, draft_slot_s=2 * us)
    cm = CostModel(
        H100, model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b"), calibration=cal
    )
    b, c, widths = 8, 4096, (2, 3, 3, 1)
    parts = cm.draft_parts(b, 5, 4, c, builder="static", widths=widths)
    later = sum(float(cm.draft_step_time(b, w, c)) for w in widths)
    assert float(parts["later"]) == pytest.approx(later)
    assert float(parts["first"]) == pytest.approx(
        float(cm.draft_step_time(b, 1, c, from_target=True))
    )
    rows = b * (1 + 9)  # the first step's B rows, then B x each step's tokens
    fixed = 5 * 40 * us + float(cm.draft_select_time(rows)) + 9 * 2 * us
    assert float(parts["bookkeeping"]) == pytest.approx(fixed)
    # top-k frontier widths are the default: the same price as no widths
    same = cm.draft_time(b, 5, 4, c, builder="static", widths=(4, 4, 4, 4))
    assert float(same) == pytest.approx(float(cm.draft_time(b, 5, 4, c, builder="static")))
    # fewer drafted nodes than the frontier cost less; the shape's step count, not depth, counts
    assert float(cm.draft_time(b, 5, 4, c, builder="static", widths=widths)) < float(same)
    short = cm.draft_parts(b, 5, 4, c, builder="static", widths=(1,))["bookkeeping"]
    assert float(short) == pytest.approx(2 * 40 * us + float(cm.draft_select_time(2 * b)) + 2 * us)
    # iteration passes them to the draft phase only
    policy = TreePolicy("static", 5, 4, 8)
    step = cm.iteration(policy, b, c, draft_widths=widths)
    plain = cm.iteration(policy, b, c)
    assert float(step.draft_s) == pytest.approx(
        float(parts["first"] + parts["later"] + parts["bookkeeping"])
    )
    assert float(step.total_s - step.draft_s) == pytest.approx(float(plain.total_s - plain.draft_s))


@pytest.mark.parametrize(
    ("widths", "policy"),
    [
        ((0, 2), TreePolicy("static", 5, 4, 8)),
        ((1.5,), TreePolicy("static", 5, 4, 8)),
        ((float("nan"),), TreePolicy("static", 5, 4, 8)),
        ((float("inf"),), TreePolicy("static", 5, 4, 8)),
        (("a",), TreePolicy("static", 5, 4, 8)),
        ((1,) * 65, TreePolicy("static", 5, 4, 8)),
        ((1, 1), None),
    ],
)
def test_draft_widths_refused_with_what_is_wrong(widths: tuple, policy: TreePolicy | None) -> None:
    cm = CostModel(H100, model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b"))
    with pytest.raises(SpecError, match="draft_widths"):
        cm.iteration(policy, 8, 4096, draft_widths=widths)


def test_a_speculative_verify_pays_its_fixed_cost_and_a_plain_step_does_not() -> None:
    """Calibration.spec_verify_s: what a speculative verify phase runs beyond its forward
    (features captured, target tokens drawn) is added to every speculative verify, the
    hierarchical target verify included, and to no step without speculation."""
    extra = 80e-6
    cm0 = cost_model("h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b", 1)
    cm = CostModel(
        cm0.hardware, cm0.target, cm0.drafter, calibration=Calibration(spec_verify_s=extra)
    )
    b = np.array([1, 8, 64])
    for policy in (TreePolicy("dynamic-topk", 5, 4, 8), TreePolicy("static", 3, 1, 4)):
        with_, without = cm.iteration(policy, b, 4096), cm0.iteration(policy, b, 4096)
        assert with_.verify_s - without.verify_s == pytest.approx([extra] * 3, abs=1e-12)
        assert with_.total_s - without.total_s == pytest.approx([extra] * 3, abs=1e-12)
        assert with_.draft_s == pytest.approx(without.draft_s, abs=0)
    plain, plain0 = cm.iteration(None, b, 4096), cm0.iteration(None, b, 4096)
    assert plain.total_s == pytest.approx(plain0.total_s, abs=0)
    assert cm.verify_time(b, 8, 4096) == pytest.approx(cm0.verify_time(b, 8, 4096), abs=0)
    h0 = _hier_cost_model()
    h = CostModel(
        h0.hardware, h0.target, h0.drafter, calibration=Calibration(spec_verify_s=extra),
        intermediate=h0.intermediate, intermediate_drafter=h0.intermediate_drafter,
    )  # fmt: skip
    p = TreePolicy("dynamic-topk", 3, 10, 30, chain=6)
    assert float(h.iteration(p, 4, 1024).verify_s - h0.iteration(p, 4, 1024).verify_s) == (
        pytest.approx(extra, abs=1e-12)
    )
    with pytest.raises(SpecError, match="spec_verify_s"):
        Calibration(spec_verify_s=-1e-6)


def test_the_fit_prices_spec_verify_on_run_verify_rows_only() -> None:
    """validate.fit's spec_verify_us becomes Calibration.spec_verify_s, which the measured runs'
    verify rows pay and the grid's forwards and the plain steps do not: the contrast that
    identifies it."""
    from spectune.validate.fit import PARAMS, _calibration, predict_row

    names = [n for n, *_ in PARAMS]
    x = [start for _, _, _, start in PARAMS]
    x[names.index("spec_verify_us")] = 70.0
    cal = _calibration(x, "h100-sxm", Calibration())
    assert cal.spec_verify_s == pytest.approx(70e-6)
    x[names.index("spec_verify_us")] = 0.0
    cal0 = _calibration(x, "h100-sxm", Calibration())
    cms = [
        CostModel(H100, model_preset("llama-3.1-8b"), model_preset("eagle3-llama-3.1-8b"),
                  calibration=c)
        for c in (cal, cal0)
    ]  # fmt: skip
    run = {"batch": 8, "context": 4096, "policy": TreePolicy("dynamic-topk", 5, 4, 8)}
    grid = {"batch": 8, "tokens": 8, "context": 4096}
    rows = {"verify": ("verify", run), "step": ("step", run), "grid": ("verify", grid),
            "ar": ("ar", grid)}  # fmt: skip
    diff = {k: predict_row(cms[0], *r) - predict_row(cms[1], *r) for k, r in rows.items()}
    assert diff["verify"] == pytest.approx(70e-6) and diff["step"] == pytest.approx(70e-6)
    assert diff["grid"] == 0.0 and diff["ar"] == 0.0
