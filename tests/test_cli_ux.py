"""The command line as a new user meets it: complete --help, the deployment at the end of
`spectune plan`, exports as simulate policies, capacity, --csv / --plot, fit-workload's
held-out check, and exit code 2 on bad values of the new options."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.cli import build_parser, main
from spectune.planner.deploy import BatchWeights, deployment
from spectune.planner.export.runs import EngineRun, engine_runs, load_export
from spectune.specs import PolicyTable, SpecError, TreePolicy

_NO_DEFAULT = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return dict(sub.choices)  # type: ignore[arg-type]


def _missing_defaults(p: argparse.ArgumentParser) -> list[str]:
    """Options with a default (not None) whose help, as the parser's formatter renders it,
    says nothing of it."""
    formatter = p._get_formatter()
    out = []
    for a in p._actions:
        if isinstance(a, _NO_DEFAULT) or (not a.option_strings and a.nargs != "?"):
            continue
        if a.default is None or a.default is argparse.SUPPRESS or a.default in ("", [], ()):
            continue
        shown = formatter._expand_help(a) if a.help else ""
        if "default" not in shown:
            out.append(a.option_strings[-1] if a.option_strings else a.dest)
    return out


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_subcommand_help_is_complete(name: str) -> None:
    """Each subcommand has a description, a help line, and every option a help text; each
    option with a default says it."""
    p = _subparsers()[name]
    if p.prog.endswith(name) and any(a.dest == "rest" for a in p._actions):
        pytest.skip(f"{name} is unavailable here (optional dependency missing)")
    assert p.description and len(p.description.split()) >= 5, f"{name}: no description"
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        assert a.help, f"{name} {a.option_strings or a.dest}: no help"
    assert not _missing_defaults(p), f"{name}: defaults not shown for {_missing_defaults(p)}"
    text = p.format_help()
    assert "usage:" in text


def test_help_checker_catches_a_missing_default() -> None:
    """The completeness check above can fail: an option with a silent default is found."""
    p = argparse.ArgumentParser(description="a parser for this test only")
    p.add_argument("--x", type=int, default=3, help="some number")
    p.add_argument("--y", type=int, default=3, help="another (default 3)")
    assert _missing_defaults(p) == ["--x"]
    from spectune.cli import finish_help

    finish_help(p, "the module docstring")  # what build_parser does to every subcommand
    assert _missing_defaults(p) == []
    assert "(default 3)" in p.format_help() and p.description == "a parser for this test only"


# ---- spectune plan: the deployment -----------------------------------------------------------


PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A small default plan (3 batch buckets, 1 context), its terse and its verbose output."""
    import contextlib
    import io

    d = tmp_path_factory.mktemp("plan")
    out = d / "policy.json"
    common = ["plan", "--trials", "6", "--quiet", "--batch-edges", "1,8,64"]
    common += ["--context-edges", "4096", "--out", str(out)]
    texts = []
    for extra in ([], ["--verbose", "--batch-weights", "1:0.2,8:0.5,64:0.3"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            extra_out = ["--csv", str(d / "p.csv"), "--plot", str(d / "p.png")] if not extra else []
            assert main([*common, *extra, *extra_out]) == 0
        texts.append(buf.getvalue())
    return out, texts[0], texts[1]


def test_plan_ends_with_the_deployment_per_engine(planned: tuple[Path, str, str]) -> None:
    out, text, verbose = planned
    deploy = text[text.index("\nDeploy (") :]
    assert "served tok/s incl. prefill" in deploy
    for engine, launch in (
        ("sglang", "python -m sglang.launch_server"),
        ("vllm", "vllm serve"),
        ("trtllm", "trtllm-serve"),
    ):
        assert f"  {engine}: batch " in deploy
        assert f"launch: {launch}" in deploy
        assert f"spectune export --engine {engine} {out} --out export-{engine}" in deploy
    assert "vs no speculation" in deploy and "vs sglang's default 5/4/8" in deploy
    assert "uniform over batch sizes 1..64" in deploy
    assert "--batch-weights" in verbose and "1: 20%, 8: 50%, 64: 30%" in verbose
    # the legend explains the notation, min_gain reads as a requirement
    for text_ in (text, verbose):
        assert "dynamic-topk:7,6,32" in text_ and "static:2,9,30,0,29" in text_
        assert "5/4/8" in text_ and "< min_gain" not in text_


def test_plan_notes_collapse_by_kind(planned: tuple[Path, str, str]) -> None:
    _, text, verbose = planned
    table = PolicyTable.load(planned[0])
    assert "      note: " not in text.split("\nDeploy")[0]  # no note under a row
    per_row = verbose.count(" note: ")
    if per_row:
        assert "--verbose shows each under its row" in text
        kinds = text.split("--verbose shows each under its row):\n")[1].split("\n")
        listed = [k for k in kinds if k.startswith("  ") and "bucket" in k]
        assert 1 <= len(listed) <= per_row
    assert len(table.buckets) == 3


def test_plan_csv_and_plot(planned: tuple[Path, str, str]) -> None:
    out = planned[0]
    import csv

    with open(out.parent / "p.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3
    table = PolicyTable.load(out)
    first = rows[0]
    assert first["policy"] == (table.buckets[0].policy.label if table.buckets[0].policy else "off")
    assert float(first["served_tok_per_s_incl_prefill"]) == pytest.approx(
        table.buckets[0].predicted.tokens_per_s, rel=1e-4
    )
    assert (out.parent / "p.png").read_bytes()[:8] == PNG


def test_deployment_gain_is_the_weighted_served_ratio(planned: tuple[Path, str, str]) -> None:
    """The gains are the ratios of weighted means of served tok/s, computed here by hand from
    the one objective, with the engine's own overheads."""
    from spectune.planner.tokens_per_s import SERVED, served_objective, tokens_per_s

    table = PolicyTable.load(planned[0])
    w = BatchWeights.of([(64, 3.0), (1, 2.0), (8, 5.0)], "test")
    assert w.sizes == (1, 8, 64) and w.weights == pytest.approx((0.2, 0.5, 0.3))
    d = deployment(table, "sglang", w)
    obj = served_objective(table.scenario.replace(engine="sglang").resolve())

    def mean(p_of: Any) -> float:
        return sum(
            wt * float(tokens_per_s(obj, SERVED, p_of(b), b, d.context)[0])
            for b, wt in zip(w.sizes, w.weights, strict=True)
        )

    run = mean(d.policy_at)
    assert d.mean_tokens_per_s == pytest.approx(run)
    assert d.gain_vs_off == pytest.approx(run / mean(lambda b: None) - 1)
    assert d.default is not None
    assert d.gain_vs_default == pytest.approx(run / mean(lambda b: d.default) - 1)
    assert deployment(table, "vllm", w).gain_vs_default is None  # vLLM has no default


@pytest.mark.parametrize(
    "value",
    [
        "",
        "nan",
        "1:nan",
        "1:inf",
        "1:-1",
        "0:1",
        "65537:1",
        "1:0",
        "1:1,1:2",
        "a:b",
        "1",
        ",".join(f"{i}:1" for i in range(1, 66)),
    ],
)
def test_batch_weights_bad_values_exit_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", f"--batch-weights={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--batch-weights" in err


# ---- what an engine runs, read back from its config ---------------------------------------
def _chain(d: int) -> TreePolicy:
    return TreePolicy("dynamic-topk", d, 1, d + 1)


def test_engine_runs_in_each_engines_semantics() -> None:
    sglang = {
        "server_args": {
            "speculative_num_steps": 6,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 7,
        },
        "adaptive": {
            "1": {"candidate_steps": [6]},
            "9": {"candidate_steps": [3]},
            "33": {"candidate_steps": [0]},
        },
        "max_running_requests": 64,
    }
    assert engine_runs("sglang", sglang) == (
        EngineRun((1, 8), _chain(6)),
        EngineRun((9, 32), _chain(3)),
        EngineRun((33, 64), None),
    )
    static = {
        **sglang,
        "adaptive": None,
        "server_args": {
            "speculative_num_steps": 5,
            "speculative_eagle_topk": 4,
            "speculative_num_draft_tokens": 8,
        },
    }
    assert engine_runs("sglang", static) == (
        EngineRun((1, 64), TreePolicy("dynamic-topk", 5, 4, 8)),
    )
    vllm = {
        "speculative_config": {
            "num_speculative_tokens": 5,
            "num_speculative_tokens_per_batch_size": [[1, 4, 5], [5, 16, 2]],
        },
        "max_num_seqs": 32,
    }
    # the last range's K carries past its end (vLLM 0.33)
    assert engine_runs("vllm", vllm) == (
        EngineRun((1, 4), _chain(5)),
        EngineRun((5, 32), _chain(2)),
    )
    assert engine_runs("vllm", {"speculative_config": None, "max_num_seqs": 8}) == (
        EngineRun((1, 8), None),
    )
    trt = {
        "max_batch_size": 64,
        "speculative_config": {"max_draft_len": 4, "draft_len_schedule": {4: 4, 16: 2}},
    }
    # upper bounds: batch <= key; past the largest key, 0
    assert engine_runs("trtllm", trt, "trtllm") == (
        EngineRun((1, 4), _chain(4)),
        EngineRun((5, 16), _chain(2)),
        EngineRun((17, 64), None),
    )
    lower = {
        "max_batch_size": 64,
        "speculative_config": {"max_draft_len": 4, "draft_len_schedule": {1: 4, 8: 2}},
    }
    assert engine_runs("trtllm", lower, "trtllm-stage1") == (
        EngineRun((1, 7), _chain(4)),
        EngineRun((8, 64), _chain(2)),
    )
    tree = {
        "max_batch_size": 8,
        "speculative_config": {
            "max_draft_len": 5,
            "use_dynamic_tree": True,
            "dynamic_tree_max_topK": 4,
            "max_total_draft_tokens": 7,
        },
    }
    assert engine_runs("trtllm", tree, "trtllm") == (
        EngineRun((1, 8), TreePolicy("dynamic-topk", 5, 4, 8)),
    )
    with pytest.raises(SpecError, match="max_running_requests"):
        engine_runs("sglang", {"server_args": {}})


def test_every_exported_plan_reads_back(planned: tuple[Path, str, str], tmp_path: Path) -> None:
    """An export of the plan read back covers batch 1 to the plan's largest, contiguous; the
    sidecar reads back to the same runs as the export's config."""
    from spectune.planner.export import export_table

    table = PolicyTable.load(planned[0])
    for engine in ("sglang", "vllm"):
        ex, _ = export_table(table, engine)
        runs = engine_runs(ex.engine, ex.config, engine)
        assert runs[0].batch[0] == 1 and runs[-1].batch[1] == 64
        assert all(b.batch[0] == a.batch[1] + 1 for a, b in itertools.pairwise(runs))
        ex.write(tmp_path / engine)
        back = load_export(tmp_path / engine / f"{engine}.spectune.json")
        assert [(b.batch, b.policy) for b in back.buckets] == [(r.batch, r.policy) for r in runs]
        assert back.scenario.engine == engine and back.target == table.target


# ---- simulate --policy EXPORT, capacity ---------------------------------------------------
def test_simulate_runs_an_export(
    planned: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectune.planner.export import export_table

    table = PolicyTable.load(planned[0])
    ex, _ = export_table(table, "vllm")
    ex.write(tmp_path)
    side = tmp_path / "vllm.spectune.json"
    csv_path = tmp_path / "s.csv"
    args = ["simulate", "--policy", str(side), "--qps", "4", "--requests", "40", "--quiet"]
    assert main([*args, "--csv", str(csv_path), "--json"]) == 0
    captured = capsys.readouterr()
    runs = json.loads(captured.out)["runs"]
    assert len(runs) == 1 and runs[0]["mean_accepted"] > 1
    assert "served_tok_per_s_incl_prefill" in csv_path.read_text().split("\n")[0]
    # a sidecar whose config is broken is a one-line error naming the file, exit 2
    doc = json.loads(side.read_text())
    doc["config"] = {"num_speculative_tokens": "many"}
    bad = tmp_path / "bad.spectune.json"
    bad.write_text(json.dumps(doc))
    assert main(["simulate", "--policy", str(bad), "--requests", "5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.spectune.json" in err and "num_speculative_tokens" in err


def test_capacity_finds_a_rate_within_the_slos(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["capacity", "--requests", "60", "--tolerance", "0.2", "--json", "--quiet"]
    assert main([*args, "--slo-ttft-ms", "200", "--slo-tpot-ms", "30"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for name in ("policy", "off"):
        c = doc[name]
        assert 0 < c["max_qps"] <= c["saturated_qps"] * (1 + 1e-9)
        met = [p for p in c["probes"] if p["meets"]]
        assert max(p["qps"] for p in met) == c["max_qps"]
        for p in met:  # every rate reported as meeting does meet both SLOs at p90
            assert p["ttft_s"] <= 0.2 and (p["tpot_s"] is None or p["tpot_s"] <= 0.03)
        if c["fail_qps"] is not None:
            assert c["fail_qps"] > c["max_qps"]
            assert (c["fail_qps"] - c["max_qps"]) <= 0.2 * c["fail_qps"] + 1e-9


def test_capacity_tight_slo_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    """A TTFT bound no run can meet gives no rate, and each probe prints a progress line."""
    args = ["capacity", "--requests", "20", "--policy", "off", "--slo-ttft-ms", "0.001"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "no rate meets the SLOs" in captured.out
    assert "req/s -> TTFT p90" in captured.err and "misses" in captured.err


# ---- --csv / --plot ---------------------------------------------------------------------------
def test_cost_csv_plot_and_bad_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c, p = tmp_path / "c.csv", tmp_path / "c.png"
    assert (
        main(["cost", "--batch", "1,8", "--tokens", "1,16", "--csv", str(c), "--plot", str(p)]) == 0
    )
    head, *rows = c.read_text().strip().split("\n")
    assert len(rows) == 4 and "verify_s" in head and "verify_attention_s" in head
    assert p.read_bytes()[:8] == PNG
    capsys.readouterr()
    for argv in (
        ["cost", "--csv", str(tmp_path)],  # a folder
        ["cost", "--plot", str(tmp_path / "x.jpg")],  # not a png
        ["simulate", "--plot", str(c / "under-a-file.png")],  # parent is a file
    ):
        assert main(argv) == 2, argv
        assert "Traceback" not in capsys.readouterr().err


def test_a_failed_plot_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    from spectune.cli.outputs import write_plot

    def boom(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("render failed")

    monkeypatch.setattr(Figure, "savefig", boom)
    out = tmp_path / "x.png"
    with pytest.raises(RuntimeError):
        write_plot(str(out), lambda ax: ax.plot([1, 2]), title="t", xlabel="x", ylabel="y")
    assert list(tmp_path.iterdir()) == []


# ---- fit-workload: held-out check --------------------------------------------------------
def test_fit_workload_validates_on_held_out_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectune.specs.trace import TraceHeader, make_step, write_trace
    from spectune.specs.tree import DraftTree

    header = TraceHeader("toy", "toy-drafter", "toy-set", max_depth=2, max_topk=2)
    steps = []
    for i in range(6):
        t = DraftTree.from_parents(
            [-1, 0, 0, 1], tokens=[5, 10, 11, 20], logprobs=[0.0, -0.1 - 0.1 * i, -2.5, -0.3]
        )
        steps.append(make_step(f"r{i}", 0, 7, t, [10, 20 if i % 2 else 7, 0, 0]))
    trace = tmp_path / "toy.jsonl.gz"
    write_trace(trace, header, steps)
    out = tmp_path / "wl.json"
    argv = ["fit-workload", str(trace), "--out", str(out), "--budgets", "4", "--folds", "3"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert "3-fold cross-validation by request" in captured.out
    assert "fold 3/3 done" in captured.err and "fitting" in captured.err
    doc = json.loads(captured.out.strip().split("\n")[-1])
    (row,) = doc["check"]
    assert doc["folds"] == 3 and row["folds"] == 3
    assert math.isfinite(row["held_out_error"])
    assert row["held_out_error"] == pytest.approx(
        row["predicted_held_out"] / row["replayed"] - 1, abs=1e-3
    )
    assert main([*argv[:-1], "7"]) == 0  # more folds than requests: one request per fold
    captured = capsys.readouterr()
    assert "--folds 7 > 6 requests: 6-fold" in captured.err
    assert "6-fold cross-validation by request" in captured.out
    assert np.isfinite(row["predicted_in_sample"])


def test_batch_weights_from_the_workload(tmp_path: Path) -> None:
    """--batch-weights, else the workload's own batch_weights (read from its file), else equal
    weights on powers of two; a bad distribution in a workload file names the field."""
    import dataclasses

    from spectune.cli.plan_report import batch_weights
    from spectune.specs.io import write_json_atomic
    from spectune.specs.workload import load_workload
    from spectune.traces.fit import workload_to_dict

    wl = dataclasses.replace(load_workload("mt-bench"), name="mine", batch_weights=((8, 3), (1, 1)))
    path = tmp_path / "wl.json"
    write_json_atomic(path, workload_to_dict(wl))
    loaded = load_workload(str(path))
    got = batch_weights(argparse.Namespace(batch_weights=None), 64, loaded)
    assert got.sizes == (1, 8) and got.weights == pytest.approx((0.25, 0.75))
    assert "workload mine" in got.source
    flag = batch_weights(argparse.Namespace(batch_weights=[(2, 1.0)]), 64, loaded)
    assert flag.sizes == (2,) and flag.source == "--batch-weights"
    plain = batch_weights(argparse.Namespace(batch_weights=None), 48, load_workload("mt-bench"))
    assert plain.sizes == (1, 2, 4, 8, 16, 32, 48)
    doc = workload_to_dict(wl)
    doc["batch_weights"] = [[1, 1], [1, 2]]
    write_json_atomic(path, doc)
    with pytest.raises(SpecError, match="batch_weights"):
        load_workload(str(path))


def test_min_gain_never_reads_as_a_contradiction() -> None:
    """A gain short of min_gain is rounded down (4.96% is +4.9%, never +5.0%), and the summary
    of kept references states the requirement."""
    from spectune.cli.plan_report import Note, summarize_notes
    from spectune.planner.search import _below

    assert _below(0.04996) == "+4.9%" and _below(0.05) == "+5.0%" and _below(0.029) == "+2.9%"
    notes = [
        Note(
            "b1",
            "kept sglang",
            f"kept sglang: the best searched policy (x) is predicted {g} "
            "over it, >= 5% required (min_gain)",
        )
        for g in (_below(0.04996), _below(0.001))
    ] + [Note("b2", "kv cap", "the KV cache holds 15 requests at context 24576; larger ...")]
    lines = summarize_notes(notes, 0.05)
    assert lines[0] == (
        "kept sglang in 2 buckets: the best searched policy was predicted +0.1% to +4.9% over "
        "it, >= 5% required (--min-gain)"
    )
    assert lines[1] == "KV cache caps the batch in 1 bucket: it holds 15 requests at context 24576"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, dict):
        return [path] + [p for k, v in obj.items() for p in _leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [path] + [p for i, v in enumerate(obj) for p in _leaves(v, (*path, i))]
    return [path]


def _sidecars() -> list[dict[str, Any]]:
    from spectune.planner.export import export_policy
    from spectune.specs.policy import Bucket

    chain = TreePolicy("dynamic-topk", 4, 1, 5)
    table = PolicyTable(
        "llama-3.1-8b",
        "eagle3-llama-3.1-8b",
        "h100-sxm",
        (Bucket((1, 8), (0, 4096), chain), Bucket((9, 64), (0, 4096), None)),
        workload="mt-bench",
    )
    out = []
    for engine in ("sglang", "vllm"):
        ex = export_policy(table, engine)
        out.append(json.loads(ex.files[f"{engine}.spectune.json"]))
    return out


SIDECARS = _sidecars()


@settings(max_examples=150, deadline=None)
@given(which=st.integers(0, len(SIDECARS) - 1), pick=st.integers(0, 10_000), value=_JSON)
def test_a_mutated_sidecar_is_a_table_or_a_spec_error(which: int, pick: int, value: Any) -> None:
    """Any one value of an export's sidecar replaced by arbitrary JSON: the reader returns a
    table covering batch 1 onward without gaps, or refuses with a SpecError naming the file."""
    import copy

    from spectune.planner.export.runs import sidecar_table

    doc = copy.deepcopy(SIDECARS[which])
    paths = [p for p in _leaves(doc) if p]
    path = paths[pick % len(paths)]
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    try:
        table = sidecar_table(doc, "side.spectune.json")
    except SpecError as e:
        assert "side.spectune.json" in str(e) or "field" in str(e)
        return
    assert table.buckets[0].batch[0] == 1
    for a, b in itertools.pairwise(table.buckets):
        assert b.batch[0] == a.batch[1] + 1


@pytest.mark.parametrize("true_max,saturated", [(37.3, 1e9), (0.01, 1e9), (500.0, 120.0)])
def test_max_rate_brackets_the_answer(
    true_max: float, saturated: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doubling + bisection search on a server that meets its SLOs exactly up to
    `true_max` req/s: the answer lies within the tolerance below it, never above the
    saturated rate, and every probe is on the right side."""
    from spectune.simulator import slo_capacity as sc

    def probe(config: Any, qps: float, *_a: Any) -> tuple[Any, None]:
        ok = qps <= true_max
        return sc.Probe(qps, 0.1 if ok else 9.0, 0.01, ok, 100.0 * qps), None

    monkeypatch.setattr(sc, "probe", probe)
    monkeypatch.setattr(sc, "saturated_rate", lambda config: saturated)
    seen: list[Any] = []
    got = sc.max_rate(None, slo_ttft_s=1.0, slo_tpot_s=1.0, rel_tol=0.02, progress=seen.append)  # type: ignore[arg-type]
    assert [p.qps for p in seen] == [p.qps for p in got.probes]
    ceiling = min(true_max, saturated)
    assert got.max_qps <= ceiling
    if true_max < sc.MIN_QPS:
        assert got.max_qps == 0.0
    elif saturated < true_max:
        assert got.max_qps == saturated and got.fail_qps == math.inf
    else:
        assert got.fail_qps > true_max and got.fail_qps - got.max_qps <= 0.02 * got.fail_qps
    assert all(p.meets == (p.qps <= true_max) for p in got.probes)


def test_plot_without_matplotlib_exits_2_before_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    import spectune.cli.plan as plan

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("work started before --plot was checked")

    monkeypatch.setattr(plan, "build_scorer", boom)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "p.png"
    assert main(["plan", "--out", str(tmp_path / "p.json"), "--plot", str(out)]) == 2
    assert "matplotlib" in capsys.readouterr().err and not out.exists()


def test_plan_verbose_shows_every_note_and_approximation(planned: tuple[Path, str, str]) -> None:
    _, text, verbose = planned
    assert "--verbose lists them" in text
    assert "approximation: " in verbose and "--verbose lists them" not in verbose
    assert "    batch 8: " in verbose  # per-batch predictions of each engine
    assert "notes (" not in verbose  # every note sits under its row instead
