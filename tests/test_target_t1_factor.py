"""A drafter's own T=1 factor on its target (specs.acceptance_presets.TargetT1Factor): fitted to
that drafter's T=0/T=1 pairs on the target (Llama-3.3-70B: EAGLE-2 and EAGLE-3, EAGLE-3 paper
Table 1), applied at T=1 to that drafter kind on that target only; the cross-drafter rule
(pre-registered in commit 2f75d47) computed and rejected; the extrapolation warning of a T=1
lookup without a factor of its own."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_acceptance_presets import refused_with_figures, refused_with_file

from spectune.specs import MODEL_PRESETS, SpecError
from spectune.specs import acceptance_presets as aps
from spectune.specs.compat import PairWarning
from spectune.specs.workload import load_workload
from spectune.traces.published import check_figures, fit_presets
from spectune.traces.size_fits import (
    fit_target_t1_factors,
    target_t1_factor_to_dict,
    target_t1_factor_transfers,
)

M = MODEL_PRESETS
L33 = "llama-3.3-70b"
#: the EAGLE-3 paper's Table 1 rows L33 70B at T=1: each fixes its own drafter's factor there
E2_T1 = [f"eagle3paper-llama-3.3-70b-eagle-2-{d}-t1" for d in aps.DATASETS]
E3_T1 = [f"eagle3paper-llama-3.3-70b-eagle-3-{d}-t1" for d in aps.DATASETS]
FACTOR_FIT = E2_T1 + E3_T1
L33_T1_SOURCE = 'source = "EAGLE-3 paper (arXiv 2503.01840v3) Table 1, T=1, row L33 70B'
#: the cross-drafter errors of the rule keyed by target only (EAGLE-2's ratio on EAGLE-3's rows),
#: benchmarks/results/acceptance_cpu.txt at commit 185e87e: why the factor is keyed by drafter
CROSS_E2_ON_E3 = (-0.064, -0.132, -0.203, -0.064, -0.124)


def _figures() -> dict[str, aps.PublishedFigure]:
    return {f.id: f for f in aps.published_figures()}


def _t1_preset(target: str, drafter: str, dataset: str, temperature: float = 1.0) -> str:
    """The drafter's acceptance source in the pair workload (dataset, temperature) for target +
    drafter (without the retrieval profile's, the n-gram preset's)."""
    name = dataset if temperature == 0.0 else f"{dataset}-t1"
    model = dataclasses.replace(M["llama-3.1-70b"], name=target) if target not in M else M[target]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PairWarning)
        wl = load_workload(name, target=model, drafter=M[drafter] if drafter else None)
    return wl.source.split("; retrieval from")[0]


def test_stored_factors_are_the_ratio_of_their_pair_fits() -> None:
    figures = _figures()
    stored = aps.target_t1_factors()
    assert {f.fitted_to[0] for f in stored} == set(FACTOR_FIT)
    assert {i for i, f in figures.items() if f.t1_factor} == set(FACTOR_FIT)
    for f in stored:
        f1, f0 = figures[f.fitted_to[0]], figures[f.fitted_to[1]]
        assert (f1.role, f1.key.temperature, f0.key.temperature) == ("fit", 1.0, 0.0)
        assert (f1.method, f1.target, f1.tree, f1.key.dataset, f1.key.drafter) == (
            f0.method,
            f0.target,
            f0.tree,
            f0.key.dataset,
            f.drafter,
        )
        assert f.target == L33 and 0.8 < f.factor < 1.0
    by = {(f.drafter, f.dataset): f.factor for f in stored}
    for d in aps.DATASETS:  # EAGLE-3 loses less at T=1 on this target than EAGLE-2
        assert by[("eagle3", d)] > by[("eagle", d)] + 0.02
    again = {(f.drafter, f.dataset): f for f in fit_target_t1_factors(samples=2000)}
    for f in stored:
        assert again[(f.drafter, f.dataset)].factor == pytest.approx(f.factor, rel=0.01)
        assert again[(f.drafter, f.dataset)].fitted_to == f.fitted_to
    # the factors' figures fix no key's scale: llama-3's T=1 presets stay the Llama-3.1-8B fits
    for p in aps.acceptance_presets().values():
        assert not set(p.fitted_to) & set(FACTOR_FIT)
    assert fit_presets([figures[FACTOR_FIT[0]]], samples=100) == []  # it fixes no key


def test_the_factor_fit_rows_are_reproduced_by_construction() -> None:
    checks = check_figures([_figures()[i] for i in FACTOR_FIT], samples=1000)
    for c in checks:
        assert c.preset.fitted_to == (c.figure.id,) and abs(c.error) <= 0.02, c.figure.id


@pytest.mark.parametrize("dataset", aps.DATASETS)
@pytest.mark.parametrize("drafter", ["eagle3-llama-3.1-70b", "eagle-llama-3-70b"])
def test_a_drafter_takes_its_own_factor_at_t1_on_its_target(drafter: str, dataset: str) -> None:
    """Llama-3.3-70B at T=1: the kind's T=0 preset at 70.55B times the kind's own factor there,
    not the family's T=1 preset and not another drafter's factor; a variant of its name
    (-instruct) takes it too."""
    kind = M[drafter].drafter_kind
    size = M[L33].total_params() / 1e9
    p0, _ = aps.lookup(kind, "llama-3", dataset, 0.0, size)
    factor = aps.target_t1_factor(kind, L33, dataset)
    assert factor is not None and factor.drafter == kind
    own, note = aps.lookup(kind, "llama-3", dataset, 1.0, size, target=L33)
    assert note == "" and own.key.temperature == 1.0
    assert own.scale == pytest.approx(p0.scale * factor.factor, rel=1e-12)
    family, _ = aps.lookup(kind, "llama-3", dataset, 1.0, size)
    assert own.scale != pytest.approx(family.scale, rel=1e-3)
    source = _t1_preset(L33, drafter, dataset)
    assert "T=1 factor on its target" in source and factor.fitted_to[0] in source
    assert factor.fitted_to[0] in _t1_preset("llama-3.3-70b-instruct", drafter, dataset)


@pytest.mark.parametrize(
    ("target", "drafter", "temperature"),
    [
        pytest.param("llama-3.1-8b", "eagle3-llama-3.1-8b", 1.0, id="8b"),
        pytest.param(L33, "eagle3-llama-3.1-70b", 0.0, id="t0"),
        pytest.param(L33, "llama-3.1-8b", 1.0, id="draft-model"),
    ],
)
def test_no_factor_and_no_warning_elsewhere(target: str, drafter: str, temperature: float) -> None:
    """At T=0, on the size the family's T=1 presets are fitted at, and for a kind without a
    factor and without a size term (draft models), the family's preset applies silently."""
    source = _t1_preset(target, drafter, "gsm8k", temperature)  # PairWarning -> error
    assert "T=1 factor on its target" not in source
    kind = M[drafter].drafter_kind
    want, _ = aps.lookup(kind, "llama-3", "gsm8k", temperature, M[target].total_params() / 1e9)
    assert f"scale {want.scale:.4f}" in source


def _pair_workload(target: str, drafter: str, dataset: str, *, strict: bool = False) -> str:
    model = dataclasses.replace(M["llama-3.1-70b"], name=target) if target not in M else M[target]
    wl = load_workload(f"{dataset}-t1", target=model, drafter=M[drafter], strict=strict)
    return wl.source


@pytest.mark.parametrize(
    ("target", "drafter"),
    [
        pytest.param("llama-3.1-70b", "eagle3-llama-3.1-70b", id="eagle3-on-3.1-70b"),
        pytest.param("llama-3.3-70bx", "eagle3-llama-3.1-70b", id="other-name"),
        pytest.param("llama-3.1-70b", "eagle-llama-3-70b", id="eagle-on-3.1-70b"),
    ],
)
def test_t1_without_its_own_factor_on_another_size_warns_and_strict_refuses(
    target: str, drafter: str
) -> None:
    """eagle3 on Llama-3.1-70B at T=1: no T=1 figure of that drafter on that target, so the
    family's T=1 preset moved by the size rule, with a PairWarning quoting the error range; with
    strict=True (the CLI's --strict) the same is a SpecError."""
    with pytest.warns(PairWarning, match=r"T=1 acceptance of .* is extrapolated") as rec:
        source = _pair_workload(target, drafter, "gsm8k")
    (w,) = [r for r in rec if "extrapolated" in str(r.message)]
    assert "-28.9%..+7.7%" in str(w.message) and target in str(w.message)
    assert "T=1 factor on its target" not in source and "derived (size rule)" in source
    with pytest.raises(SpecError, match=r"extrapolated.*strict mode"):
        _pair_workload(target, drafter, "gsm8k", strict=True)


def test_the_warning_fires_for_eagle3_on_llama_3_1_70b_and_not_on_llama_3_3_70b() -> None:
    with pytest.warns(PairWarning, match="extrapolated"):
        _pair_workload("llama-3.1-70b", "eagle3-llama-3.1-70b", "mt-bench")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PairWarning)
        source = _pair_workload(L33, "eagle3-llama-3.1-70b", "mt-bench", strict=True)
    assert "eagle3paper-llama-3.3-70b-eagle-3-mt-bench-t1" in source


def test_the_cli_prints_the_warning_and_strict_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from spectune.cli import main

    argv = ["tree", "--target", "llama-3.1-70b", "--drafter", "eagle3-llama-3.1-70b"]
    argv += ["--workload", "gsm8k-t1"]
    assert main(argv) == 0
    assert "warning: workload 'gsm8k-t1'" in capsys.readouterr().err
    assert main([*argv, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "extrapolated" in err and "strict mode" in err
    assert main(["tree", "--target", L33, "--drafter", "eagle3-llama-3.1-70b", *argv[5:]]) == 0
    assert "extrapolated" not in capsys.readouterr().err


def test_the_quoted_range_is_the_benchmarks() -> None:
    """T1_EXTRAPOLATED_ERROR is the range benchmarks/bench_acceptance.py measures for the
    factor rows predicted without their factors (its last line, `t1_extrapolated`)."""
    path = Path(__file__).parents[1] / "benchmarks" / "results" / "acceptance_cpu.txt"
    doc = json.loads(path.read_text(encoding="utf-8").strip().splitlines()[-1])
    assert tuple(doc["t1_extrapolated"]) == aps.T1_EXTRAPOLATED_ERROR
    assert doc["ok"] is True


def test_the_cross_drafter_rule_is_computed_and_rejected() -> None:
    """Each drafter's T=1 rows on Llama-3.3-70B predicted with the other drafter's factor (the
    rule keyed by target only): EAGLE-2's ratio leaves EAGLE-3's rows 6-20% under, three past
    the 10% held-out gate, so every drafter takes its own; its own factor, as lookup applies it
    from the T=0 preset at 70B, carries that preset's T=0 error only."""
    transfers = target_t1_factor_transfers(samples=1000)
    by = {(t.check.figure.id, t.from_method): t for t in transfers}
    assert set(by) == {(i, m) for i in FACTOR_FIT for m in ("EAGLE-2", "EAGLE-3")}
    for d, want in zip(aps.DATASETS, CROSS_E2_ON_E3, strict=True):
        cross = by[(f"eagle3paper-llama-3.3-70b-eagle-3-{d}-t1", "EAGLE-2")]
        own = by[(f"eagle3paper-llama-3.3-70b-eagle-3-{d}-t1", "EAGLE-3")]
        assert own.own and not cross.own
        assert cross.check.error == pytest.approx(want, abs=0.02)
        assert abs(own.check.error) < abs(cross.check.error)
    misses = [t for t in transfers if not t.own and abs(t.check.error) > 0.10]
    assert len(misses) >= 3


# ---- malformed inputs ------------------------------------------------------------------------
def _row(**over: Any) -> dict[str, Any]:
    row = target_t1_factor_to_dict(aps.target_t1_factors()[0])
    return {**row, **over}


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([_row(factor=0.0, scale_t1=0.0)], id="zero"),
        pytest.param([_row(factor=float("nan"))], id="nan"),
        pytest.param([_row(factor=0.5)], id="not-the-ratio"),
        pytest.param([_row(dataset="wiki")], id="dataset"),
        pytest.param([_row(drafter="greedy")], id="drafter"),
        pytest.param([_row(), _row()], id="repeated"),
        pytest.param([_row(fitted_to=["a"])], id="fitted-to"),
        pytest.param([{"target": L33}], id="missing"),
        pytest.param("x", id="not-a-list"),
    ],
)
def test_malformed_factor_rows_name_the_file(
    rows: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = json.loads(aps.PRESETS_FILE.read_text(encoding="utf-8"))
    doc["target_t1_factors"] = rows
    bad = tmp_path / "presets.json"
    bad.write_text(json.dumps(doc), "utf-8")
    refused_with_file(
        monkeypatch, "PRESETS_FILE", bad, aps.target_t1_factors, r"presets.json: target_t1_factors"
    )


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        pytest.param("t1_factor = true", "t1_factor = 1", "t1_factor must be true", id="type"),
        pytest.param(
            f'role = "fit"\n{L33_T1_SOURCE}',
            f'role = "reported"\n{L33_T1_SOURCE}',
            "a t1_factor figure is a",
            id="role",
        ),
    ],
)
def test_malformed_t1_factor_figure_is_refused(
    old: str, new: str, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused_with_figures(old, new, rf"figures.toml: figure \d+ .*{match}", tmp_path, monkeypatch)


def test_factor_fit_refuses_a_partner_on_another_tree_and_two_figures_per_key() -> None:
    figures = list(aps.published_figures())
    f1 = next(f for f in figures if f.id == FACTOR_FIT[0])
    f0 = next(f for f in figures if f.id == f1.id[: -len("t1")] + "t0")
    other_tree = [f for f in figures if f.id != f0.id]
    other_tree.append(dataclasses.replace(f0, tree=dataclasses.replace(f0.tree, budget=60)))
    with pytest.raises(SpecError, match="must share the tree"):
        fit_target_t1_factors([f for f in other_tree if not f.t1_factor or f is f1], samples=100)
    twice = [*figures, dataclasses.replace(f1, id="copy")]
    with pytest.raises(SpecError, match="two t1_factor figures"):
        fit_target_t1_factors([f for f in twice if f.key.dataset == f1.key.dataset], samples=100)
    sampled = [*figures[:0], dataclasses.replace(f1, drafting="sampled"), f0]
    with pytest.raises(SpecError, match="drafts sampled"):
        fit_target_t1_factors(sampled, samples=100)


@settings(max_examples=80, deadline=None)
@given(name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-", min_size=0, max_size=24))
def test_a_name_matches_a_target_only_as_itself_or_a_variant(name: str) -> None:
    matches = aps.target_matches(name, L33)
    assert matches == (name == L33 or name.startswith(L33 + "-"))
    assert aps.target_matches(name.upper(), L33) == matches
    assert not aps.target_matches(name, "")
    if not matches:
        assert aps.target_t1_factor("eagle3", name, "gsm8k") is None
        assert math.isfinite(aps.lookup("eagle3", "llama-3", "gsm8k", 1.0, 70.0, name)[0].scale)
