"""The calibration fit is physically bounded and says what the data determined; a calibration
run's own speculative runs (one per tree builder) join the fit and the check; ECHO and grafting
runs are priced as the executor runs them. CPU only (numpy, scipy)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_prune_cost import DRAFTER, HW, TARGET, US, _cm, _doc, _run, _scalar

from spectune.specs import Calibration, TreePolicy, load_hardware
from spectune.specs.errors import SpecError
from spectune.validate.check import check_folder
from spectune.validate.fit import (
    FIT_KERNEL_COSTS,
    PARAMS,
    _calibration,
    _overheads,
    fit_calibration,
)
from spectune.validate.fit_bounds import CEILING_OF, bounded, ceilings, identified
from spectune.validate.measure import RUN_SCHEMA, spec_run_measurements, validate_document

H100 = load_hardware(HW)


def _truth(x: dict[str, float] | None = None, **kw: Any) -> Calibration:
    """The fit's own parametrisation at its start values (`x` overrides some), then `kw`."""
    start = {name: x0 for name, _, _, x0 in PARAMS} | (x or {})
    cal = _calibration([start[name] for name, *_ in PARAMS], HW, Calibration())
    return dataclasses.replace(cal, **kw)


def _calrun(doc: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A calibration-run document whose spec runs are `doc`'s (no verify grid of its own but one
    row, so it validates)."""
    cm = _cm(_truth())
    return {
        "schema": RUN_SCHEMA,
        "gpu": "NVIDIA H100 80GB HBM3",
        "hardware": HW,
        "target": TARGET,
        "drafter": DRAFTER,
        "verify": [
            {"batch": 1, "tokens": 1, "context": 512, "seconds": _scalar(cm.verify_time(1, 1, 512))}
        ],
        "spec_runs": {"context": doc["context"], "workload": "mt-bench", "steps": 20,
                      "runs": doc["runs"]},
        **extra,
    }  # fmt: skip


def test_ceilings_cut_every_efficiency_bound() -> None:
    run = {
        "copy_bytes_per_s": 0.8 * H100.hbm_bytes_per_s,
        "matmul_flops": 0.7 * H100.peak_bf16_flops,
    }
    ceil = ceilings(run, H100)
    assert ceil == pytest.approx({"copy": 0.8, "read": 0.8, "matmul": 0.7})
    assert ceilings({}, H100) == {"copy": 1.0, "read": 1.0, "matmul": 1.0}
    assert ceilings({"copy_bytes_per_s": 9 * H100.hbm_bytes_per_s}, H100)["copy"] == 1.0
    for name, lo, hi, x0 in bounded(PARAMS, ceil):
        if name in CEILING_OF:
            assert hi <= ceil[CEILING_OF[name]] + 1e-12
        assert lo < hi and lo <= x0 <= hi


def test_reads_are_bounded_by_the_read_rate_and_elementwise_by_the_copy_rate() -> None:
    run = {
        "copy_bytes_per_s": 0.8 * H100.hbm_bytes_per_s,
        "read_bytes_per_s": 0.9 * H100.hbm_bytes_per_s,
        "matmul_flops": 0.7 * H100.peak_bf16_flops,
    }
    ceil = ceilings(run, H100)
    assert ceil == pytest.approx({"copy": 0.8, "read": 0.9, "matmul": 0.7})
    hi = {name: h for name, _, h, _ in bounded(PARAMS, ceil)}
    assert hi["weight_bw_efficiency"] == pytest.approx(0.9)
    assert hi["attention_bw_efficiency"] == pytest.approx(0.9)
    assert hi["elementwise_bw_efficiency"] == pytest.approx(0.8)
    # a read measured below the copy rate (a poor reduction kernel) does not tighten the bound
    slow = ceilings(run | {"read_bytes_per_s": 0.5 * H100.hbm_bytes_per_s}, H100)
    assert slow["read"] == pytest.approx(0.8)


def test_fit_stays_under_the_measured_ceilings_and_reports_them() -> None:
    """Timings made by efficiencies above what the GPU measured: the fit cannot follow them
    past the ceilings (it reports them at the bound), and every fitted efficiency is at most
    1 of its ceiling."""
    cm = _cm(_truth({"weight_bw_efficiency": 0.95, "gemm_emax": 0.95}))
    doc = _doc(cm)
    run = _calrun(
        doc, copy_bytes_per_s=0.85 * H100.hbm_bytes_per_s, matmul_flops=0.75 * H100.peak_bf16_flops
    )
    validate_document(run, "run")
    cal, report = fit_calibration(run, max_nfev=20)
    b = report["bounds"]
    assert b["copy_fraction_of_peak"] == pytest.approx(0.85)
    for name in CEILING_OF:
        assert b[name]["of_ceiling"] <= 1.0 + 1e-9, name
    assert cal.weight_bw_efficiency is not None and cal.weight_bw_efficiency <= 0.85 + 1e-9
    assert max(cal.gemm_flops_efficiency) <= 0.75 + 1e-9
    assert "gemm_emax" in report["identified"]["at_bound"]
    ident = report["identified"]
    assert set(ident["determined"]) | set(ident["at_bound"]) | set(ident["weak"]) == set(
        report["params"]
    )
    json.dumps(report, allow_nan=False)  # the report is written as JSON (--report)


def test_identified_tells_determined_from_weak_and_bound() -> None:
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(50, 3))
    jac[:, 2] *= 1e-9  # the residuals hardly depend on the third parameter
    x = np.array([0.5, 0.5, 0.5])
    out = identified(["a", "b", "c"], x, jac, 0.01 * rng.normal(size=50), np.zeros(3), np.ones(3))
    assert out["determined"] == ["a", "b"] and out["weak"] == ["c"]
    at = identified(["a", "b", "c"], np.array([1.0, 0.5, 0.5]), jac, np.zeros(50), np.zeros(3),
                    np.ones(3))  # fmt: skip
    assert at["at_bound"] == ["a"] and at["rel_se"]["a"] is None


def test_spec_runs_of_every_builder_fit_their_fixed_costs() -> None:
    """A calibration run's spec runs (dense, static, pruned, grafted, shared budget) become a
    measurement of its GPU: the overhead fit recovers the planted tree, prune and retrieval
    costs, and check re-predicts them."""
    truth = _truth(
        step_overhead_s=12 * US,
        per_request_overhead_s=0.5 * US,
        tree_build_s=90 * US,
        tree_build_per_node_s=0.04 * US,
        static_tree_build_s=40 * US,
        prune_step_s=130 * US,
        retrieval_per_request_s=3 * US,
        retrieval_step_s=500 * US,
    )
    cm = _cm(truth)
    dense = TreePolicy("dynamic-topk", 6, 8, 32)
    policies = [
        (dense, 32.0),
        (TreePolicy("static", 5, 4, 8), 8.0),
        (dataclasses.replace(dense, prune_threshold=0.05), 14.0),
        (dataclasses.replace(dense, prune_threshold=0.05, graft_budget=8), 20.0),
        (TreePolicy("dynamic-topk", 5, 4, 8, shared_budget=True), 8.0),
    ]
    runs = [_run(cm, b, p, n, 4096, 2.5) for b in (1, 8, 32) for p, n in policies]
    for r in runs:
        r["label"] = TreePolicy(**r["policy"]).label
    doc = _doc(cm)
    run = _calrun({**doc, "runs": runs})
    (meas,) = spec_run_measurements(run)
    assert meas["hardware"] == HW and len(meas["runs"]) == len(runs)
    over = _overheads([meas])
    assert over["prune_step_s"] == pytest.approx(130 * US, rel=1e-6)
    assert over["retrieval_per_request_s"] == pytest.approx(3 * US, rel=1e-6)
    assert over["retrieval_step_s"] == pytest.approx(500 * US, rel=1e-6)
    assert over["static_tree_build_s"] == pytest.approx(40 * US, rel=1e-6)
    assert over["tree_build_s"] == pytest.approx(90 * US, rel=1e-6)
    _, report = fit_calibration(run, max_nfev=3)
    assert set(report["overheads"]["fitted"]) >= {
        "prune_step_s",
        "retrieval_per_request_s",
        "retrieval_step_s",
    }


def test_check_reads_calibration_spec_runs_and_prices_echo_ragged(tmp_path: Path) -> None:
    """check re-predicts a calibration run's spec runs; an ECHO run above batch 1 is priced
    with the ragged verify's cost (CostModel.iteration) and at its measured verified mean."""
    cal = _truth(hardware=HW, prune_step_s=130 * US)
    cm = _cm(cal)
    echo = TreePolicy("dynamic-topk", 5, 4, 8, shared_budget=True)
    step8 = cm.iteration(echo, 8, 4096, tokens=7.5)
    assert _scalar(step8.prune_s) == pytest.approx(130 * US)
    assert _scalar(cm.iteration(echo, 1, 4096).prune_s) == 0.0
    runs = [_run(cm, b, echo, 7.5 if b > 1 else 8.0, 4096, 2.0) for b in (1, 8)]
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "calibrate-run.json").write_text(json.dumps(_calrun({"context": 4096, "runs": runs})))
    cal.save(folder / f"calibration-{HW}.json")
    res = check_folder(folder)
    assert len(res.speedup) == 2
    assert res.worst_speedup_error < 1e-9
    assert any("N=7.5" in r.what for r in res.verify)


def test_the_gemm_stream_sets_the_read_ceiling_and_the_fixed_part() -> None:
    """GEMM rows that stream at 0.93 of the HBM peak with a 6 us fixed part and 0.2 of their math
    exposed, on a GPU whose copy runs at 0.85 and whose forwards stream at 0.95: the stream is a
    measured read, so the weight bandwidth may reach 0.93 (not the copy's 0.85, not the
    forwards' 0.95), and a GEMM's fixed time with its launch (gemm_fixed_s + launch_s: each
    benchmark call is timed with its launch in the graph) and gemm_exposed_compute are held at
    the line's."""
    from spectune.specs import load_model

    m = load_model(TARGET)
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    shapes = ((q + 2 * kv, m.hidden), (m.hidden, q), (2 * m.ffn, m.hidden), (m.hidden, m.ffn))
    rate, fixed, exposed = 0.93 * H100.hbm_bytes_per_s, 6e-6, 0.2
    gemm = [{"m": mm, "n": n, "k": k,
             "seconds": fixed + (n * k + mm * (n + k)) * 2 / rate
             + exposed * 2 * mm * n * k / H100.peak_bf16_flops}
            for n, k in shapes for mm in (1, 16, 64)]  # fmt: skip
    cm = _cm(_truth({"weight_bw_efficiency": 0.95}))
    run = _calrun(_doc(cm), copy_bytes_per_s=0.85 * H100.hbm_bytes_per_s, gemm=gemm)
    cal, report = fit_calibration(run, max_nfev=30)
    # the line's intercept is a GEMM timed alone; the fit holds the in-forward costs
    assert cal.launch_s == 0.0
    assert cal.gemm_fixed_s == FIT_KERNEL_COSTS["gemm_fixed_s"] < fixed
    assert cal.attention_fixed_s == FIT_KERNEL_COSTS["attention_fixed_s"]
    assert cal.elementwise_floor_s == FIT_KERNEL_COSTS["elementwise_floor_s"]
    assert cal.gemm_exposed_compute == pytest.approx(exposed, rel=1e-6)
    assert report["weight_stream"]["exposed"] == pytest.approx(exposed, rel=1e-6)
    assert report["bounds"]["read_fraction_of_peak"] == pytest.approx(0.93, rel=1e-6)
    assert cal.weight_bw_efficiency is not None
    assert 0.85 + 1e-3 < cal.weight_bw_efficiency <= 0.93 + 1e-9
    assert report["weight_stream"]["fixed_us"] == pytest.approx(6.0, rel=1e-6)
    free, _ = fit_calibration(run, max_nfev=30, hold_gemm_fixed=False)
    assert free.gemm_fixed_s == Calibration().gemm_fixed_s
    assert free.gemm_exposed_compute == Calibration().gemm_exposed_compute
    # held at the stream's rate, the weight bandwidth is not a fitted parameter
    held, rep = fit_calibration(run, max_nfev=30, hold_weight_bw=True)
    assert held.weight_bw_efficiency == pytest.approx(0.93, rel=1e-6)
    assert "weight_bw_efficiency" not in rep["params"]
    assert held.gemm_fixed_s == FIT_KERNEL_COSTS["gemm_fixed_s"]


def test_a_fit_holds_the_in_forward_kernel_costs() -> None:
    """A fitted calibration holds each kernel's fixed cost at what it keeps inside a forward
    (FIT_KERNEL_COSTS), with no separate launch; where the run's GEMMs were not measured
    base's gemm_fixed_s stands; a params table that fits launch_us
    sets launch_s."""
    from spectune.validate.fit import PARAMS, _calibration

    x = [p[3] for p in PARAMS]
    base = Calibration(gemm_fixed_s=1e-6)
    cal = _calibration(x, "h100-sxm", base, PARAMS, hold_gemm_fixed=True)
    assert cal.gemm_fixed_s == FIT_KERNEL_COSTS["gemm_fixed_s"]
    assert cal.launch_s == 0.0
    assert cal.elementwise_floor_s == FIT_KERNEL_COSTS["elementwise_floor_s"]
    alone = _calibration(x, "h100-sxm", base, PARAMS)
    assert alone.gemm_fixed_s == 1e-6
    assert alone.attention_fixed_s == FIT_KERNEL_COSTS["attention_fixed_s"]
    with_launch = (*PARAMS, ("launch_us", 0.0, 30.0, 2.0))
    assert _calibration([*x, 2.0], "h100-sxm", base, with_launch).launch_s == pytest.approx(2e-6)


def test_the_elementwise_floor() -> None:
    """Each memory-bound kernel takes at least the floor; no bytes, no kernel."""
    from spectune.planner.operators import Rates, elementwise_time
    from spectune.specs import load_hardware

    hw = load_hardware("h100-sxm")
    r0 = Rates.resolve(hw, Calibration(hardware="h100-sxm"))
    r = Rates.resolve(hw, Calibration(hardware="h100-sxm", elementwise_floor_s=2e-6))
    b = np.array([0.0, 1e3, 1e9])
    t0, t = elementwise_time(r0, b), elementwise_time(r, b)
    assert t0[0] == t[0] == 0.0
    assert t[1] == 2e-6 > t0[1]
    assert t[2] == t0[2] > 2e-6
    with pytest.raises(SpecError, match="elementwise_floor_s"):
        Calibration(elementwise_floor_s=-1e-6)
