"""`spectune check` (the CI gate), the measurement schema and the calibration fit: CPU only."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spectune.cli import main
from spectune.planner.costmodel import CostModel
from spectune.specs import SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import check_folder
from spectune.validate.measure import (
    PHASE_KEYS,
    format_table,
    measurement_doc,
    validate_measurement,
)

HW, TARGET, DRAFTER = "h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b"


def _cm(cal: Calibration | None = None) -> CostModel:
    return CostModel(load_hardware(HW), load_model(TARGET), load_model(DRAFTER), calibration=cal)


def _doc(
    scale_verify: float = 1.0, scale_speedup: float = 1.0, cal: Calibration | None = None
) -> dict[str, Any]:
    """A measurement whose numbers are the cost model's own predictions (times the scales)."""
    cm, c = _cm(cal), 4096
    runs = []
    for b, (d, k, n), acc in ((1, (5, 4, 8), 3.0), (32, (3, 2, 6), 2.2), (64, (2, 1, 3), 1.6)):
        verify = _scalar(cm.verify_time(b, n, c)) * scale_verify
        step = _scalar(cm.iteration(TreePolicy("dynamic-topk", d, k, n), b, c).total_s)
        ar = _scalar(cm.iteration(None, b, c).total_s)
        ph = dict.fromkeys(PHASE_KEYS, 0.0)
        ph.update(verify=verify * 1e3, step=step * 1e3)
        tps = b * (acc + 1) / step
        runs.append(
            {
                "batch": b,
                "label": "policy",
                "nodes": n,
                "phases_ms": ph,
                "accepted_mean": acc,
                "tokens_per_step": acc + 1,
                "tokens_per_s": tps * scale_speedup,
                "ar_step_ms": ar * 1e3,
                "ar_phases_ms": {
                    "verify": _scalar(cm.verify_time(b, 1, c)) * 1e3 * scale_verify,
                    "overhead": 0.0,
                },
                "ar_tokens_per_s": b / ar,
                "speedup": tps * scale_speedup * ar / b,
                "policy": {
                    "builder": "dynamic-topk",
                    "depth": d,
                    "topk": k,
                    "budget": n,
                    "prune_threshold": 0.0,
                    "graft_budget": 0,
                },
            }
        )
    return measurement_doc(
        gpu="NVIDIA H100 80GB HBM3",
        hardware=HW,
        target=TARGET,
        drafter=DRAFTER,
        workload="mt-bench",
        context=c,
        steps=30,
        attention="test",
        runs=runs,
    )


def _write(tmp: Path, doc: dict[str, Any], cal: Calibration | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "run.json").write_text(json.dumps(doc))
    if cal is not None:
        cal.save(tmp / f"calibration-{HW}.json")
    return tmp


def test_check_passes_on_its_own_predictions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _write(tmp_path / "ok", _doc())
    assert main(["check", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "verify-latency MAPE 0.0%" in out


def test_check_fails_on_speedup_drift(tmp_path: Path) -> None:
    assert main(["check", str(_write(tmp_path / "s", _doc(scale_speedup=1.2)))]) == 1
    assert main(["check", str(_write(tmp_path / "s2", _doc(scale_speedup=1.05)))]) == 0


def test_check_fails_on_latency_drift(tmp_path: Path) -> None:
    assert main(["check", str(_write(tmp_path / "v", _doc(scale_verify=1.3)))]) == 1
    assert main(["check", str(_write(tmp_path / "v2", _doc(scale_verify=1.05)))]) == 0


def test_check_uses_the_calibration_beside_the_measurement(tmp_path: Path) -> None:
    cal = Calibration(hardware=HW, launch_s=20e-6, weight_bw_efficiency=0.6)
    assert main(["check", str(_write(tmp_path / "c", _doc(cal=cal), cal))]) == 0
    res = check_folder(_write(tmp_path / "nocal", _doc(cal=cal)))  # same numbers, no calibration
    assert res.verify_mape > 0.1


def test_check_errors(tmp_path: Path) -> None:
    assert main(["check", str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["check", str(tmp_path / "empty")]) == 2
    bad = _doc()
    del bad["runs"][0]["phases_ms"]["verify"]
    assert main(["check", str(_write(tmp_path / "bad", bad))]) == 2


def test_check_needs_no_torch(tmp_path: Path) -> None:
    folder = _write(tmp_path / "nt", _doc())
    code = (
        "import sys; sys.modules['torch'] = None; from spectune.cli import main; "
        f"rc = main(['check', {str(folder)!r}]); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_measurement_schema() -> None:
    doc = _doc()
    validate_measurement(doc)
    assert "speedup" in format_table(doc)
    for broken in (
        {**doc, "schema": "x"},
        {**doc, "context": "4096"},
        {**doc, "runs": [{**doc["runs"][0], "policy": {"builder": "nope"}}]},
    ):
        with pytest.raises((SpecError, TypeError)):
            validate_measurement(broken)


def test_execute_without_gpu_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = str(tmp_path / "m.json")  # --out must be a regular file (never /dev/null: it is replaced)
    assert main(["execute", "--policy", "dynamic-topk:5,4,8", "--batch", "1", "--out", out]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert main(["execute", "--policy", "static:5,4", "--batch", "1"]) == 2


def test_fit_recovers_a_known_calibration() -> None:
    """Timings generated by the cost model under a known calibration are fitted back closely."""
    from spectune.validate.fit import _calibration, fit_calibration

    truth = _calibration(
        [0.7, 0.5, 0.3, 0.4, 4.0, 0.75, 300.0, 60.0, 170.0, 50.0], HW, Calibration()
    )
    cm = _cm(truth)
    run = _calibration_run(cm, (1, 16, 64))
    cal, report = fit_calibration(run)
    assert report["mape_verify_after"] < 0.02
    assert cal.hardware == HW


def _phase_doc(
    cm: CostModel,
    shapes: list[tuple[int, int, int, int]],
    c: int = 4096,
    builder: str = "dynamic-topk",
) -> dict[str, Any]:
    """A measurement whose per-phase times are the cost model's own, run by run (b, d, k, n),
    every run's trees built by `builder`."""
    runs = []
    for b, d, k, n in shapes:
        over = _scalar(cm.step_overhead_time(b, n, builder=builder, depth=d)) * 1e3
        ph = {
            "draft": _scalar(cm.draft_time(b, d, k, c, builder=builder)) * 1e3,
            "tree": over,
            "accept": 0.0,
            "compact": 0.0,
            "overhead": 0.0,
            "extend": _scalar(cm.draft_extend_time(b, d + 1, c)) * 1e3,
            "verify": _scalar(cm.iteration(TreePolicy(builder, d, k, n), b, c).verify_s) * 1e3,
            "step": _scalar(cm.iteration(TreePolicy(builder, d, k, n), b, c).total_s) * 1e3,
        }
        runs.append(
            {
                "batch": b,
                "label": "policy",
                "nodes": n,
                "phases_ms": ph,
                "ar_step_ms": _scalar(cm.iteration(None, b, c).total_s) * 1e3,
                "ar_phases_ms": {
                    "verify": _scalar(cm.verify_time(b, 1, c)) * 1e3,
                    "overhead": _scalar(cm.step_overhead_time(b, 1)) * 1e3,
                },
                "policy": {
                    "builder": builder,
                    "depth": d,
                    "topk": k,
                    "budget": n,
                    "prune_threshold": 0.0,
                    "graft_budget": 0,
                },
            }
        )
    return {"hardware": HW, "target": TARGET, "drafter": DRAFTER, "context": c, "runs": runs}


SHAPES = [(1, 2, 1, 3), (1, 7, 10, 60), (8, 4, 2, 8), (8, 6, 8, 32), (32, 5, 4, 16), (64, 3, 3, 4)]


def test_ragged_sync_is_the_paired_batch1_verify_difference() -> None:
    """_fit_ragged_sync: pruned runs at batch 1 measured 0.3 ms (one pair 5 ms) above the cost
    model's price while their dense twins are priced 0.2 ms low fit ragged_sync_s = 0.3 ms (the
    pair's difference cancels the dense error; the median ignores the outlier); runs above
    batch 1 and runs without a twin do not count; the cost model then adds it to ragged verifies
    only; a negative difference clips at 0; no pair leaves it unchanged."""
    from spectune.validate.fit import _fit_ragged_sync

    cal = Calibration()
    cm = _cm(cal)
    c = 4096
    doc = _phase_doc(cm, SHAPES, c)
    base = doc["runs"][0]

    def run(pol: TreePolicy, b: int, extra_ms: float) -> dict[str, Any]:
        tokens = 17.0 if _ragged_policy(pol, b) else float(pol.budget)
        step = cm.iteration(pol, b, c, tokens=tokens, tokens_cv=0.2)
        ph = {**base["phases_ms"], "verify": _scalar(step.verify_s) * 1e3 + extra_ms}
        return {**base, "batch": b, "nodes": pol.budget, "verified_mean": tokens,
                "verified_cv": 0.2, "policy": dataclasses.asdict(pol), "phases_ms": ph}  # fmt: skip

    def tree(budget: int, prune: float = 0.0, graft: int = 0, echo: bool = False) -> TreePolicy:
        return TreePolicy("dynamic-topk", 6, 8, budget, prune, graft, shared_budget=echo)

    runs = [
        run(tree(32), 1, 0.2), run(tree(32, 0.05), 1, 0.5), run(tree(32, 0.05, 8), 1, 0.5),
        run(tree(24), 1, 0.0), run(tree(24, 0.05), 1, 5.0),  # an outlier pair
        run(tree(16, 0.05), 1, 9.0),  # no dense twin
        run(tree(32, 0.05), 8, 9.0), run(tree(32, echo=True), 8, 9.0),  # above batch 1
    ]  # fmt: skip
    paired = {**doc, "runs": [*doc["runs"], *runs]}
    fitted, report = _fit_ragged_sync(cal, [paired], _cm)
    assert report is not None and report["pairs"] == 3
    assert fitted.ragged_sync_s == pytest.approx(0.3e-3, rel=1e-6)
    cm2 = _cm(fitted)
    for pol, b, extra in ((tree(32, 0.05), 8, 0.3e-3), (tree(32, echo=True), 8, 0.3e-3),
                          (tree(32, echo=True), 1, 0.0), (tree(32), 8, 0.0)):  # fmt: skip
        before = _scalar(cm.iteration(pol, b, c, tokens=17.0, tokens_cv=0.2).verify_s)
        after = _scalar(cm2.iteration(pol, b, c, tokens=17.0, tokens_cv=0.2).verify_s)
        assert after - before == pytest.approx(extra, abs=1e-12)
    for r in runs[1:3]:
        r["phases_ms"]["verify"] -= 1.0  # pruned faster than its twin beyond the price
    runs[4]["phases_ms"]["verify"] -= 6.0
    assert _fit_ragged_sync(cal, [paired], _cm)[0].ragged_sync_s == 0.0
    assert _fit_ragged_sync(cal, [doc], _cm) == (cal, None)


def _ragged_policy(pol: TreePolicy, batch: int) -> bool:
    return pol.prune_threshold > 0 or (pol.shared_budget and batch > 1)


def test_overheads_recover_tree_build_costs() -> None:
    """The non-forward phases give back the fixed, per-request, per-tree and per-node costs."""
    from spectune.validate.fit import _overheads

    us = 1e-6
    truth = Calibration(
        step_overhead_s=12 * us,
        per_request_overhead_s=0.5 * us,
        tree_build_s=90 * us,
        tree_build_per_node_s=0.04 * us,
    )
    over = _overheads([_phase_doc(_cm(truth), SHAPES)])
    assert over["step_overhead_s"] == pytest.approx(12 * us, rel=1e-6)
    assert over["per_request_overhead_s"] == pytest.approx(0.5 * us, rel=1e-6)
    assert over["tree_build_s"] == pytest.approx(90 * us, rel=1e-6)
    assert over["tree_build_per_node_s"] == pytest.approx(0.04 * us, rel=1e-6)


def test_overheads_recover_a_cost_per_tree_level() -> None:
    """Dynamic trees of depths 2-7 built at 20 us a level give that cost back beside the fixed
    and per-node ones; runs of one depth leave it unfitted (it is the fixed cost's twin there)."""
    from spectune.validate.fit import _overheads

    us = 1e-6
    truth = Calibration(
        step_overhead_s=12 * us,
        per_request_overhead_s=0.5 * us,
        tree_build_s=40 * us,
        tree_build_per_node_s=0.04 * us,
        tree_build_per_level_s=20 * us,
    )
    over = _overheads([_phase_doc(_cm(truth), SHAPES)])
    assert over["tree_build_per_level_s"] == pytest.approx(20 * us, rel=1e-6)
    assert over["tree_build_s"] == pytest.approx(40 * us, rel=1e-6)
    assert over["tree_build_per_node_s"] == pytest.approx(0.04 * us, rel=1e-6)
    one_depth = [(1, 5, 4, 8), (8, 5, 4, 16), (32, 5, 4, 8), (64, 5, 2, 8)]
    over = _overheads([_phase_doc(_cm(truth), one_depth)])
    assert "tree_build_per_level_s" not in over
    assert over["tree_build_s"] == pytest.approx((40 + 5 * 20) * us, rel=1e-6)


def test_fit_recovers_a_known_draft_step_cost() -> None:
    """Drafting phases made with a 60 us fixed cost per draft step and a 90 GB/s selection rate
    (and a known tree cost) are fitted back to them, from starts of 40 us and 170 GB/s, next to
    a verify grid: runs of different batch x top-k tell the per-row selection from the fixed
    step."""
    from spectune.validate.fit import _calibration, fit_calibration

    truth = _calibration(
        [0.7, 0.5, 0.3, 0.4, 4.0, 0.75, 300.0, 60.0, 90.0, 50.0], HW, Calibration()
    )
    truth = dataclasses.replace(truth, tree_build_s=150e-6, tree_build_per_node_s=0.05e-6)
    cm = _cm(truth)
    run = _calibration_run(cm, (1, 64))
    cal, report = fit_calibration(run, [_phase_doc(cm, SHAPES)], max_nfev=80)  # ~15 s
    assert cal.draft_step_s == pytest.approx(60e-6, rel=0.05)
    assert cal.draft_select_bytes_per_s == pytest.approx(90e9, rel=0.1)
    assert cal.tree_build_per_node_s == pytest.approx(0.05e-6, rel=1e-6)
    assert report["mape_draft_after"] < 0.01 and report["mape_step_after"] < 0.01


def test_fit_recovers_a_known_spec_verify_cost() -> None:
    """Speculative runs whose verify phase pays 90 us beyond its forward (features captured,
    target tokens drawn: Calibration.spec_verify_s), beside a verify grid and plain steps that
    do not, are fitted back to it from the fit's start of 50 us; made without it, the fit
    finds (about) none."""
    from spectune.validate.fit import _calibration, fit_calibration

    for made in (90.0, 0.0):
        truth = _calibration(
            [0.7, 0.5, 0.3, 0.4, 4.0, 0.75, 300.0, 60.0, 170.0, made], HW, Calibration()
        )
        truth = dataclasses.replace(truth, tree_build_s=150e-6, tree_build_per_node_s=0.05e-6)
        cm = _cm(truth)
        cal, report = fit_calibration(
            _calibration_run(cm, (1, 64)), [_phase_doc(cm, SHAPES)], max_nfev=80
        )
        assert cal.spec_verify_s == pytest.approx(made * 1e-6, abs=3e-6)
        assert report["mape_verify_after"] < 0.01 and report["mape_step_after"] < 0.01


def test_fit_recovers_a_known_static_draft_step_cost() -> None:
    """Static-builder runs made with a 35 us fixed cost per draft step and a 40 us fixed tree
    cost, beside dynamic runs at 80 us and 150 us, are fitted back to both builders' figures
    (the static per-step cost from a start of 20 us). The split attention launch is made at
    the fit's start (5 us): the drafter pays it in every draft step, so a different value
    trades against both per-step costs for longer than this test's 100 evaluations before the
    verify grid separates them (made at 4 us, recovered exactly at max_nfev 180, in 110 s)."""
    from spectune.validate.fit import _calibration, _overheads, fit_calibration

    truth = _calibration(
        [0.7, 0.5, 0.3, 0.4, 5.0, 0.75, 300.0, 80.0, 120.0, 50.0], HW, Calibration()
    )
    truth = dataclasses.replace(
        truth,
        tree_build_s=150e-6,
        tree_build_per_node_s=0.05e-6,
        static_draft_step_s=35e-6,
        static_tree_build_s=40e-6,
    )
    cm = _cm(truth)
    docs = [_phase_doc(cm, SHAPES), _phase_doc(cm, SHAPES, builder="static")]
    over = _overheads(docs)
    assert over["static_tree_build_s"] == pytest.approx(40e-6, rel=1e-6)
    assert over["tree_build_s"] == pytest.approx(150e-6, rel=1e-6)
    assert "static_tree_build_s" not in _overheads(docs[:1])  # nothing measured: default stays
    run = _calibration_run(cm, (1, 64))
    cal, report = fit_calibration(run, docs, max_nfev=100)
    assert cal.static_draft_step_s == pytest.approx(35e-6, rel=0.05)
    assert cal.draft_step_s == pytest.approx(80e-6, rel=0.05)
    assert cal.attention_split_s == pytest.approx(5e-6, rel=0.05)
    assert report["mape_step_after"] < 0.01


def _calibration_run(cm: CostModel, batches: tuple[int, ...]) -> dict[str, Any]:
    """A calibration-run document whose verify grid (batches x tokens 1, 64 x contexts 512,
    4096) is timed by the cost model itself."""
    verify = [
        {"batch": b, "tokens": n, "context": c, "seconds": _scalar(cm.verify_time(b, n, c))}
        for b in batches
        for n in (1, 64)
        for c in (512, 4096)
    ]
    return {"hardware": HW, "target": TARGET, "drafter": DRAFTER, "verify": verify}


def _scalar(x: object) -> float:
    """The one value of a cost-model result (a 0-d or 1-element array)."""
    import numpy as np

    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def test_fit_recovers_the_slot_cost() -> None:
    """Drafting phases of several top-k made under draft_slot_s 12 us are fitted back to it
    from a start of 2 us; without speculative runs it keeps the base's value."""
    from spectune.validate.fit import _calibration, fit_calibration

    truth = _calibration(
        [0.7, 0.5, 0.3, 0.4, 4.0, 0.75, 300.0, 60.0, 170.0, 50.0], HW, Calibration()
    )
    truth = dataclasses.replace(
        truth, tree_build_s=150e-6, tree_build_per_node_s=0.05e-6, draft_slot_s=12e-6
    )
    cm = _cm(truth)
    cal, report = fit_calibration(_calibration_run(cm, (1, 64)), [_phase_doc(cm, SHAPES)],
                                  max_nfev=60)  # fmt: skip
    assert cal.draft_slot_s == pytest.approx(12e-6, rel=0.15)
    assert "draft_slot_us" in report["params"]
    base = Calibration(draft_slot_s=4e-6)
    bare, report = fit_calibration(_calibration_run(cm, (1, 64)), base=base, max_nfev=5)
    assert bare.draft_slot_s == 4e-6
    assert "draft_slot_us" not in report["params"]


def _class_rows(cm: CostModel, run: dict[str, Any]) -> dict[str, Any]:
    """`run` with each verify row's kernel time by class as the cost model prices it (what
    executor.calibrate.kernel_classes measures on a GPU)."""
    rows = []
    for r in run["verify"]:
        parts = cm.verify_breakdown(r["batch"], r["tokens"], r["context"])
        linear = sum(_scalar(parts[k]) for k in ("qkv_o", "mlp", "lm_head"))
        rows.append({**r, "linear_s": linear, "attention_s": _scalar(parts["attention"])})
    return {**run, "verify": rows}


def test_kernel_time_by_class_is_reported_not_fitted() -> None:
    """Verify rows with their kernel time by class give three more rows each (linear,
    attention, other), which the report prices before and after the fit while the fit itself
    is the same as without them (validate.fit.WEIGHTS: a diagnostic until the cost model's
    operator classes match the executor's kernels)."""
    from spectune.validate.fit import _calibration, _rows, fit_calibration

    truth = _calibration(
        [0.88, 0.6, 0.35, 0.4, 4.0, 0.8, 120.0, 60.0, 170.0, 50.0], HW, Calibration()
    )
    cm = _cm(truth)
    plain = _calibration_run(cm, (1, 4, 16, 64))
    run = _class_rows(cm, plain)
    kinds = [k for k, _, _ in _rows(run, [])]
    n = len(run["verify"])
    assert kinds.count("verify_linear") == kinds.count("verify_attention") == n
    assert kinds.count("verify_other") == n  # elementwise + launches: above OTHER_FLOOR
    cal, report = fit_calibration(run)
    cal_plain, _ = fit_calibration(plain)
    assert cal == cal_plain
    assert report["mape_verify_after"] < 0.01
    for kind in ("linear", "attention", "other"):
        # priced both ways; a whole-forward fit need not split the forward as the truth does
        assert 0 <= report[f"mape_verify_{kind}_after"] < 1
        assert 0 < report[f"mape_verify_{kind}_before"] < 1


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"linear_s": float("nan"), "attention_s": 0.001}, "linear_s"),
        ({"linear_s": -0.001, "attention_s": 0.001}, "linear_s"),
        ({"linear_s": 0.001}, "attention_s"),
        ({"linear_s": 0.006, "attention_s": 0.006}, "exceed the forward"),
    ],
)
def test_calibration_run_refuses_bad_kernel_classes(fields: dict[str, float], match: str) -> None:
    from spectune.validate.measure import RUN_SCHEMA, validate_calibration_run

    row = {"batch": 1, "tokens": 1, "context": 512, "seconds": 0.01, **fields}
    doc = {"schema": RUN_SCHEMA, "hardware": HW, "target": TARGET, "drafter": DRAFTER,
           "verify": [row]}  # fmt: skip
    with pytest.raises(SpecError, match=match):
        validate_calibration_run(doc, "run.json")


def _static_doc(widths: list[int] | None, workload: str = "mt-bench") -> dict[str, Any]:
    """_doc's runs as static 5/4/8 trees, `widths` recorded as their draft_widths."""
    doc = _doc()
    doc["workload"] = workload
    for r in doc["runs"]:
        r["policy"] = {**r["policy"], "builder": "static", "depth": 5, "topk": 4, "budget": 8}
        r["nodes"] = 8
        if widths is not None:
            r["draft_widths"] = widths
    return doc


def test_check_and_fit_price_a_static_run_over_its_drafted_widths() -> None:
    """A static run's draft phase is priced over the widths it drafted: the recorded ones,
    else the planner's shape for the document's workload; a dynamic run over top-k."""
    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import draft_widths
    from spectune.validate.check import price_run
    from spectune.validate.fit import _rows, predict_row

    cm = _cm()
    policy = TreePolicy("static", 5, 4, 8)
    recorded = _static_doc([2, 1, 1, 1])
    run = recorded["runs"][0]
    step, _ = price_run(cm, recorded, run, {})
    want = cm.draft_time(run["batch"], 5, 4, 4096, builder="static", widths=(2, 1, 1, 1))
    assert _scalar(step.draft_s) == pytest.approx(_scalar(want))
    drafts = [a for kind, a, _ in _rows({}, [recorded]) if kind == "draft"]
    assert [a["draft_widths"] for a in drafts] == [(2, 1, 1, 1)] * 3
    assert predict_row(cm, "draft", drafts[0]) == pytest.approx(_scalar(want))
    # without a record: the shape the executor drafts for the workload's acceptance
    derived = _static_doc(None)
    shape = draft_widths(policy, acceptance_model("mt-bench"))
    assert shape is not None and shape != (4, 4, 4, 4)
    step, _ = price_run(cm, derived, derived["runs"][0], {})
    want = cm.draft_time(run["batch"], 5, 4, 4096, builder="static", widths=shape)
    assert _scalar(step.draft_s) == pytest.approx(_scalar(want))
    # a workload the planner cannot build, or a dynamic run: the top-k frontier
    for doc in (_static_doc(None, workload=""), _doc()):
        r = doc["runs"][0]
        step, _ = price_run(cm, doc, r, {})
        pol = TreePolicy(**r["policy"])
        plain = cm.draft_time(r["batch"], pol.depth, pol.topk, 4096, builder=pol.builder)
        assert _scalar(step.draft_s) == pytest.approx(_scalar(plain))


@pytest.mark.parametrize(
    "widths", [[0], [1.5], ["2"], [True], "1,2", [1] * 65, [float("nan")], [2**40]]
)
def test_measurement_refuses_bad_draft_widths(widths: object) -> None:
    doc = _static_doc(None)
    doc["runs"][1]["draft_widths"] = widths
    with pytest.raises(SpecError, match=r"runs\[1\].*draft_widths"):
        validate_measurement(doc)
    validate_measurement(_static_doc([1, 2, 3]))
