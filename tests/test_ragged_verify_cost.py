"""ECHO's ragged verify in the cost model: unequal per-request trees cost more query tiles than
equal ones of the same total (CostModel.ragged_verify_time, operators.spread_padded_rows), the
objective and check hand the per-request spread in, the calibration fit chooses the ragged
tile from shared-budget runs and says whether the data determined it. CPU only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.planner.acceptance import acceptance_model
from spectune.planner.costmodel import SHARED_TREE_CV, CostModel
from spectune.planner.objective import ClosedFormObjective, shared_twin
from spectune.planner.operators import pad_up, spread_padded_rows
from spectune.specs import SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import _tree_spread
from spectune.validate.fit import _fit_ragged_tile, predict_row
from spectune.validate.measure import validate_measurement

HW, TARGET, DRAFTER = "h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b"
ECHO = TreePolicy("dynamic-topk", 6, 8, 32, shared_budget=True)
TWIN = shared_twin(ECHO)
G = 4  # Llama-3.1-8B: 32 query heads over 8 KV heads
# H100 efficiencies of measurements/h100/calibration-h100-sxm.json: attention near its ridge
# at context 4096 and 128 rows per KV-head group, where extra tiles show
CAL = Calibration(
    attention_bw_efficiency=0.896,
    attention_flops_efficiency=0.393,
    weight_bw_efficiency=0.731,
    elementwise_bw_efficiency=0.446,
)


def _cm(cal: Calibration = CAL) -> CostModel:
    return CostModel(load_hardware(HW), load_model(TARGET), load_model(DRAFTER), calibration=cal)


def _monte_carlo(mean: float, cv: float, tile: int, cap: float, n: int = 400_000) -> float:
    """E[pad(G x n_i, tile)] over integer sizes of a normal law (>= 1, at most cap)."""
    rng = np.random.default_rng(0)
    sizes = np.clip(np.rint(rng.normal(mean, cv * mean, n)), 1, cap)
    return float(np.mean(pad_up(G * sizes, tile)))


@pytest.mark.parametrize(
    ("mean", "cv", "tile", "cap"),
    [(32, 0.2, 128, np.inf), (60, 0.16, 128, np.inf), (17, 0.5, 128, 32), (8, 0.22, 32, 225),
     (45.5, 0.3, 64, 100)],
)  # fmt: skip
def test_spread_rows_match_sampled_trees(mean: float, cv: float, tile: int, cap: float) -> None:
    """The closed form (normal law, continuity correction, cap) is the mean padded rows of
    sampled integer tree sizes of that law, to 1%."""
    got = float(spread_padded_rows(mean, cv, G, tile, cap))
    assert got == pytest.approx(_monte_carlo(mean, cv, tile, cap), rel=0.01)


@settings(max_examples=60, deadline=None)
@given(
    mean=st.floats(1.0, 300.0),
    tile=st.sampled_from([16, 32, 64, 128]),
    cv=st.floats(0.0, 0.6),
)
def test_spread_rows_bounds(mean: float, tile: int, cv: float) -> None:
    """cv = 0 is the uniform padding; any spread pads to at least the mean's rows and at least
    one tile; capping at the mean's own size never adds rows."""
    rows = float(spread_padded_rows(mean, cv, G, tile))
    assert rows >= G * mean - 1e-9 and rows >= tile - 1e-9
    assert float(spread_padded_rows(mean, 0.0, G, tile)) == float(pad_up(G * mean, tile))
    capped = float(spread_padded_rows(mean, cv, G, tile, cap=1.0))
    assert capped == pytest.approx(tile)


def test_spread_rows_broadcast_over_arrays() -> None:
    means = np.array([8.0, 32.0, 60.0])
    cvs = np.array([[0.0], [0.2]])
    rows = spread_padded_rows(means, cvs, G, 128)
    assert rows.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert rows[i, j] == pytest.approx(
                float(spread_padded_rows(means[j], cvs[i, 0], G, 128))
            )


@pytest.mark.parametrize("batch", [8, 32, 64])
def test_unequal_trees_cost_more_than_equal_ones_of_the_same_total(batch: int) -> None:
    """Trees of mean 32 (= one 128-row tile) with a spread: about half the requests take a
    second tile over their whole context, so the verify costs more than B equal trees of 32;
    without a spread the ragged verify is the dense one."""
    cm = _cm()
    dense = float(cm.verify_time(batch, 32, 4096))
    equal = float(cm.ragged_verify_time(batch, 32, 4096, tokens_cv=0.0))
    spread = float(cm.ragged_verify_time(batch, 32, 4096, tokens_cv=0.2))
    assert equal == pytest.approx(dense, rel=1e-12)
    assert spread > 1.04 * dense  # measured on H100: ECHO's verify x1.06-1.09 its twin's


def test_echo_is_priced_ragged_above_batch_1_and_as_its_twin_at_batch_1() -> None:
    """The iteration's verify of a shared budget is ragged at batch > 1 (more than its
    per-request twin's at the same mean), and at batch 1 every phase equals the twin's."""
    cm = _cm()
    for field in ("verify_s", "draft_s", "extend_s", "overhead_s", "total_s"):
        assert float(getattr(cm.iteration(ECHO, 1, 4096), field)) == pytest.approx(
            float(getattr(cm.iteration(TWIN, 1, 4096), field)), rel=1e-12
        )
    echo = cm.iteration(ECHO, 32, 4096, tokens=32.0)
    twin = cm.iteration(TWIN, 32, 4096, tokens=32.0)
    assert float(echo.verify_s) > 1.04 * float(twin.verify_s)
    default = cm.iteration(ECHO, 32, 4096, tokens=32.0, tokens_cv=SHARED_TREE_CV)
    assert float(default.verify_s) == float(echo.verify_s)
    equal = cm.iteration(ECHO, 32, 4096, tokens=32.0, tokens_cv=0.0)
    assert float(equal.verify_s) == pytest.approx(float(twin.verify_s), rel=1e-12)
    # tokens_cv prices only a shared budget's verify
    assert float(cm.iteration(TWIN, 32, 4096, tokens_cv=0.5).total_s) == float(twin.total_s)


def test_ragged_tile_is_a_validated_calibration_field() -> None:
    assert Calibration().ragged_tile_m == 128
    with pytest.raises(SpecError, match="ragged_tile_m"):
        Calibration(ragged_tile_m=0)
    small = _cm(dataclasses.replace(CAL, ragged_tile_m=16))
    big = _cm()
    # a tile of 16 rows pads nothing at 4 rows per token: no extra cost for unequal trees
    assert float(small.ragged_verify_time(32, 32, 4096, tokens_cv=0.2)) < float(
        big.ragged_verify_time(32, 32, 4096, tokens_cv=0.2)
    )


def test_objective_prices_echo_with_its_drawn_spread() -> None:
    """The objective's shared-budget draws give a spread (> 0 at batch > 1, 0 for per-request
    policies and at batch 1) and the iteration it scores with uses it."""
    from spectune.planner.acceptance import acceptance_model
    from spectune.specs import load_workload

    cm = _cm()
    obj = ClosedFormObjective(cm, acceptance_model(load_workload("mt-bench")), samples=256)
    cv = obj.tree_spread(ECHO, 32)
    assert 0.05 < cv < 0.6
    assert obj.tree_spread(ECHO, 1) == 0.0 and obj.tree_spread(TWIN, 32) == 0.0
    tokens = obj.tree_tokens(ECHO, 32)
    accepted = obj.expected_tokens(ECHO, 32)
    want = cm.iteration(ECHO, 32, 4096, tokens=tokens, accepted=accepted, tokens_cv=cv)
    got = obj.iteration(ECHO, 32, 4096)
    assert float(np.asarray(got.total_s).reshape(-1)[0]) == pytest.approx(float(want.total_s))


def test_check_prefers_the_measured_spread() -> None:
    doc = {"target": TARGET, "drafter": DRAFTER, "hardware": HW, "workload": "trace:x.jsonl.gz"}
    run = {"policy": dataclasses.asdict(ECHO), "batch": 8, "verified_cv": 0.31}
    assert _tree_spread(doc, run, {}) == 0.31
    # a workload the planner cannot build: the cost model's default
    assert _tree_spread(doc, {**run, "verified_cv": None}, {}) is None
    assert _tree_spread(doc, {**run, "batch": 1}, {}) is None  # batch 1: the twin, dense
    twin = {"policy": dataclasses.asdict(TWIN), "batch": 8}
    assert _tree_spread(doc, twin, {}) is None


def test_measurement_reader_bounds_verified_cv() -> None:
    run = {
        "batch": 8, "label": "x", "policy": None, "nodes": 1, "accepted_mean": 0.0,
        "tokens_per_s": 1.0, "ar_step_ms": 1.0, "speedup": 1.0, "verified_cv": -0.1,
        "phases_ms": {k: 1.0 for k in ("draft", "tree", "verify", "accept", "compact",
                                       "extend", "overhead", "step")},
    }  # fmt: skip
    doc = {"schema": "spectune.measurement/v1", "gpu": "x", "hardware": HW, "target": TARGET,
           "drafter": DRAFTER, "context": 64, "runs": [run]}  # fmt: skip
    with pytest.raises(SpecError, match="verified_cv"):
        validate_measurement(doc, "doc.json")
    run["verified_cv"] = 0.2
    validate_measurement(doc, "doc.json")


def _rows(policy: TreePolicy, tile: int, noise: float) -> tuple[list, np.ndarray]:
    """Verify and step rows of `policy` at batch 8/32/64, 'measured' by the cost model with
    ragged tile `tile` and a multiplicative noise (alternating sign)."""
    truth = _cm(dataclasses.replace(CAL, ragged_tile_m=tile))
    rows, meas = [], []
    for i, b in enumerate((8, 32, 64)):
        a = {"batch": b, "policy": policy, "context": 4096, "tokens": float(policy.budget),
             "accepted": None, "tokens_cv": 0.2}  # fmt: skip
        for kind in ("verify", "step"):
            rows.append((kind, a, 0.0))
            meas.append(predict_row(truth, kind, a) * (1 + noise * (-1) ** i))
    return rows, np.array(meas)


def test_fit_determines_the_ragged_tile_from_trees_across_a_tile() -> None:
    """6/8/32 shared-budget runs (trees straddling 128 rows) measured with a 128-row tile:
    the fit picks 128 and calls it determined; 5/4/8 runs (every tree in one tile) leave the
    tiles up to 64 equal, the choice weak, and the base tile stands."""
    rows, meas = _rows(ECHO, 128, 0.005)
    w = np.ones(len(rows))
    cal, rep = _fit_ragged_tile(
        dataclasses.replace(CAL, ragged_tile_m=32), rows, meas, w, 1e-4, _cm
    )
    assert rep is not None and rep["best"] == 128 and rep["determined"]
    assert cal.ragged_tile_m == 128
    small = TreePolicy("dynamic-topk", 5, 4, 8, shared_budget=True)
    rows, meas = _rows(small, 128, 0.01)
    cal, rep = _fit_ragged_tile(CAL, rows, meas, np.ones(len(rows)), 1e-4, _cm)
    assert rep is not None and not rep["determined"] and cal.ragged_tile_m == CAL.ragged_tile_m
    # no shared-budget rows: nothing to fit
    rows, meas = _rows(TWIN, 128, 0.0)
    assert _fit_ragged_tile(CAL, rows, meas, np.ones(len(rows)), 1e-4, _cm) == (CAL, None)


def test_pruned_verify_runs_at_the_token_bucket() -> None:
    """A pruned batch's packed verify runs at the next multiple of ragged_token_bucket tokens
    (at most B x budget): at batch 1 a 17.2-token tree verifies as 32; at batch 32, 17.4
    tokens each (557 in all) as 560; a dense tree is untouched."""
    cm = _cm()
    pruned = TreePolicy("dynamic-topk", 6, 8, 32, 0.05)
    one = float(np.asarray(cm.iteration(pruned, 1, 4096, tokens=17.2).verify_s))
    assert one == pytest.approx(float(cm.ragged_verify_time(1, 32, 4096, max_tokens=32)))
    many = float(np.asarray(cm.iteration(pruned, 32, 4096, tokens=17.4).verify_s))
    assert many == pytest.approx(float(cm.ragged_verify_time(32, 560 / 32, 4096, max_tokens=32)))
    dense = TreePolicy("dynamic-topk", 6, 8, 32)
    assert float(np.asarray(cm.iteration(dense, 1, 4096, tokens=17.2).verify_s)) == (
        pytest.approx(float(cm.verify_time(1, 17.2, 4096)))
    )
    coarse = _cm(dataclasses.replace(CAL, ragged_token_bucket=64))
    wide = float(np.asarray(coarse.iteration(pruned, 8, 4096, tokens=9.0).verify_s))
    assert wide == pytest.approx(float(coarse.ragged_verify_time(8, 16, 4096, max_tokens=32)))


def _h200() -> CostModel:
    """The H200 calibration of measurements/h200-newuser3 (fast HBM: tree attention over 128-row
    tiles turns compute-bound at batch 32, context 4096)."""
    from pathlib import Path

    path = Path(__file__).parent.parent / "measurements/h200-newuser3/calibration-h200.json"
    return CostModel(load_hardware("h200"), load_model(TARGET), load_model(DRAFTER),
                     calibration=Calibration.load(path))  # fmt: skip


def test_pruned_attention_pads_to_the_budgets_launch() -> None:
    """The packed verify's attention runs the launch planned for the budget's dense shape
    (kernels/ragged_plan.py RaggedBucket: max_q_len = the budget), so 32 requests keeping 16 of
    32 tokens pay 128 rows per KV-head group (4 x 32), as the dense 32-token verify does, not
    the 64 of a dense 16-token verify: where that attention is compute-bound (H200) the pruned
    verify costs more than the dense verify of its mean, by the attention alone."""
    cm = _h200()
    pruned = TreePolicy("dynamic-topk", 6, 8, 32, 0.05)
    got = float(np.asarray(cm.iteration(pruned, 32, 4096, tokens=16.0).verify_s))
    assert got == pytest.approx(float(cm.ragged_verify_time(32, 16, 4096, max_tokens=32)))
    small = cm.verify_breakdown(32, 16, 4096)
    # the same weight GEMMs (512 tokens), the attention of 128-row tiles over 4096 + 16 keys
    rows = cm.verify_breakdown(32, 32, 4096)["attention"] - small["attention"]
    assert got - float(cm.verify_time(32, 16, 4096)) == pytest.approx(float(rows), rel=0.05)
    assert float(rows) > 0.02 * got
    # a budget whose rows fit a smaller tile (8 tokens: 32 rows) pads to that tile only
    few = TreePolicy("dynamic-topk", 5, 4, 8, 0.05)
    got8 = float(np.asarray(cm.iteration(few, 32, 4096, tokens=8.0).verify_s))
    assert got8 == pytest.approx(float(cm.verify_time(32, 8, 4096)), rel=1e-9)


def test_pruned_step_spread_comes_from_check_and_the_objective() -> None:
    """check hands a pruned run's measured spread (verified_cv) to the cost model, else (an
    older document) the planner's for its workload, else (a recorded trace) none: every step at
    the mean; the objective hands its drawn trees' spread above batch 1 (0 at batch 1, where
    the executor measures none, and for dense trees)."""
    pol = TreePolicy("dynamic-topk", 6, 8, 32, 0.05)
    run = {"batch": 32, "policy": dataclasses.asdict(pol), "verified_mean": 16.0}
    doc = {"target": TARGET, "drafter": DRAFTER, "hardware": HW, "workload": "mt-bench"}
    assert _tree_spread(doc, {**run, "verified_cv": 0.3}, {}) == 0.3
    obj = ClosedFormObjective(_cm(), acceptance_model("mt-bench"), samples=256)
    cv = obj.tree_spread(pol, 32)
    assert 0.05 < cv < 1.0
    assert _tree_spread(doc, run, {}) == pytest.approx(cv, rel=0.3)  # its own draws
    assert _tree_spread({**doc, "workload": "trace:x.jsonl.gz"}, run, {}) is None
    assert _tree_spread(doc, {**run, "batch": 1}, {}) is None
    assert obj.tree_spread(pol, 1) == 0.0
    assert obj.tree_spread(TreePolicy("dynamic-topk", 6, 8, 32), 32) == 0.0
    # the spread pads rows where a request's tree can outgrow the tile: a 60-token budget's
    # requests above 32 tokens take a second 128-row tile; a 32-token budget's never do
    cm = _h200()
    for budget, more in ((60, True), (32, False)):
        wide = TreePolicy("dynamic-topk", 7, 10, budget, 0.05)
        even, spread = (
            float(np.asarray(cm.iteration(wide, 32, 4096, tokens=28.0, tokens_cv=v).verify_s))
            for v in (0.0, 0.3)
        )
        assert (spread > even) if more else spread == pytest.approx(even)


def test_token_bucket_default_is_the_executors() -> None:
    ragged_plan = pytest.importorskip("spectune.kernels.ragged_plan")
    assert Calibration().ragged_token_bucket == ragged_plan.TOKEN_BUCKET


def test_dense_attention_tile_is_the_executors() -> None:
    """operators.attention_row_tile picks the row tile that the executor's tree attention
    launch (kernels/tree_attention_config.default_config) runs, over rows and group counts."""
    torch = pytest.importorskip("torch")
    cfg = pytest.importorskip("spectune.kernels.tree_attention_config")
    from spectune.planner.operators import Rates, attention_row_tile

    rates = Rates.resolve(load_hardware(HW), Calibration())
    cuda = torch.device("cuda")  # only its type is read: the GPU configs, no GPU needed
    for rows in (1, 4, 16, 17, 32, 33, 64, 65, 128, 192, 240, 256, 512):
        for groups in (8, 16, 17, 512):
            want = cfg.default_config(rows, cuda, groups).block_m
            assert attention_row_tile(rates, rows, groups) == want, (rows, groups)


def test_dense_verify_pays_its_padded_attention_rows() -> None:
    """60 tree tokens x 4 query heads per KV head = 240 rows run as 256 at batch 64 (128-row
    tiles): the attention costs the FLOPs of 64 tokens' rows, and shrinking the largest tile
    to 16 removes that padding."""
    cm = _cm()
    fine = _cm(dataclasses.replace(CAL, attention_tile_max_m=16))
    padded = cm.iteration(TreePolicy("dynamic-topk", 7, 10, 60), 64, 4096)
    exact = fine.iteration(TreePolicy("dynamic-topk", 7, 10, 60), 64, 4096)
    assert float(np.asarray(padded.verify_s)) > float(np.asarray(exact.verify_s))
    # a tree whose rows fill the tiles (64 tokens: 256 rows) pays the same under both
    full = TreePolicy("dynamic-topk", 7, 10, 64)
    assert float(np.asarray(cm.iteration(full, 64, 4096).verify_s)) == pytest.approx(
        float(np.asarray(fine.iteration(full, 64, 4096).verify_s))
    )
    with pytest.raises(SpecError, match="attention_tile_max_m"):
        Calibration(attention_tile_m=32, attention_tile_max_m=16)


def test_attention_slots_are_the_kernels_resident_programs() -> None:
    """operators.attention_slots counts the programs per SM that the split chooser assumes
    (kernels/tree_attention_config.resident_programs of default_config's GPU configs)."""
    torch = pytest.importorskip("torch")
    cfg = pytest.importorskip("spectune.kernels.tree_attention_config")
    from spectune.planner.operators import Rates, attention_row_tile, attention_slots

    rates = Rates.resolve(load_hardware(HW), Calibration())
    cuda = torch.device("cuda")  # only its type is read
    for rows in (1, 16, 32, 64, 128, 256):
        for groups in (8, 512):
            c = cfg.default_config(rows, cuda, groups)
            tile = attention_row_tile(rates, rows, groups)
            for head_dim, kv_bytes in ((64, 2), (128, 2), (128, 1), (256, 2)):
                want = rates.sm_count * cfg.resident_programs(c, head_dim, kv_bytes)
                got = attention_slots(rates, tile, rows, head_dim, kv_bytes)
                assert got == want, (rows, groups, head_dim, kv_bytes)


def test_attention_splits_only_where_the_kernels_chooser_splits() -> None:
    """Every launch operators.attention_splits calls split, the kernels' chooser splits
    (choose_splits over the same slots and partial costs as plan_launch), over batch 1-64,
    1-64 tree tokens and five GQA shapes."""
    torch = pytest.importorskip("torch")
    cfg = pytest.importorskip("spectune.kernels.tree_attention_config")
    from spectune.planner.operators import (
        Rates,
        attention_row_tile,
        attention_slots,
        attention_splits,
    )

    rates = Rates.resolve(load_hardware(HW), Calibration())
    cuda = torch.device("cuda")
    split_seen = 0
    shapes = ((4, 8, 128), (8, 8, 128), (4, 2, 128), (8, 1, 128), (2, 8, 64))
    for group, kv_heads, head_dim in shapes:
        for batch in (1, 2, 3, 4, 8, 9, 16, 32, 64):
            for n in (1, 8, 16, 32, 60, 64):
                for prefix in (100, 1024, 2048, 4096):
                    rows = group * n
                    c = cfg.default_config(rows, cuda, batch * kv_heads)
                    slots = int(attention_slots(rates, c.block_m, rows, head_dim, 2))
                    blocks = -(-rows // c.block_m)
                    partial_bytes = 2 if c.half_partials else 4
                    partial = (cfg.PARTIAL_COST_SCALE * 2 * partial_bytes * batch * n * group
                               * kv_heads * head_dim / (2 * head_dim * 2 * slots))  # fmt: skip
                    splits, _ = cfg.choose_splits(
                        batch, kv_heads, blocks, prefix, n, c, slots, partial
                    )
                    tile = attention_row_tile(rates, rows, batch * kv_heads)
                    ours = attention_splits(
                        rates, batch * kv_heads * blocks, prefix, tile, rows, head_dim, 2
                    )
                    if ours:
                        split_seen += 1
                        assert splits > 1, (group, kv_heads, batch, n, prefix)
    assert split_seen > 0


def test_small_batches_pay_the_split_attention_launch() -> None:
    """Calibration.attention_split_s is paid per layer where the target's tree attention
    launch splits (batch 1 and 8 over a 4096-token prefix) and not where the programs fill the
    GPU (batch 64); the drafter pays it at every batch."""
    cal = dataclasses.replace(CAL, attention_split_s=10e-6)
    cm, base = _cm(cal), _cm(dataclasses.replace(CAL, attention_split_s=0.0))
    layers = load_model("llama-3.1-8b").layers
    for batch, paid in ((1, True), (8, True), (64, False)):
        extra = float(cm.verify_time(batch, 1, 4096) - base.verify_time(batch, 1, 4096))
        assert extra == pytest.approx(layers * 10e-6 if paid else 0.0, abs=1e-9), batch
    # the drafter attends through span_attention, which splits every prefix at any batch
    for batch in (1, 64):
        extra = float(cm.draft_step_time(batch, 4, 4096) - base.draft_step_time(batch, 4, 4096))
        assert extra == pytest.approx(load_model(DRAFTER).layers * 10e-6, abs=1e-9), batch
    # a prefix too short for the split chooser to split for sure runs whole
    assert float(cm.verify_time(1, 1, 100)) == pytest.approx(float(base.verify_time(1, 1, 100)))
    with pytest.raises(SpecError, match="attention_split_s"):
        Calibration(attention_split_s=-1e-6)
