"""The Streamlit dashboards under streamlit.testing's AppTest: every page runs with its default
inputs and with changed ones without an exception, the numbers it shows equal what the planner
(or the simulator, or `spectune check`) computes for the same inputs through their own APIs, and
bad uploads give one st.error line instead of a traceback.

Each AppTest run executes the real app (app.py, its navigation and the page file) in process.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("matplotlib")

from streamlit.testing.v1 import AppTest

from spectune.dashboards import artifacts, data, loadtest, plans, uploads
from spectune.planner.buckets import buckets_from_edges
from spectune.planner.objective import closed_form_objective, scenario_objective
from spectune.planner.search import SearchSettings, search
from spectune.planner.space import EAGLE_DEFAULT, SGLANG_DEFAULT, canonical_policy
from spectune.simulator import Poisson, SimConfig, simulate
from spectune.simulator.metrics import steady_metrics
from spectune.specs import (
    Bucket,
    PolicyTable,
    Scenario,
    SpecError,
    load_hardware,
    load_model,
    load_workload,
)

APP = Path(data.__file__).with_name("app.py")
TARGET, DRAFTER = "llama-3.1-8b", "eagle3-llama-3.1-8b"


def _app() -> AppTest:
    return AppTest.from_file(str(APP), default_timeout=180)


def _page(name: str) -> AppTest:
    """The app opened on one page (its url_path is its file name, so no What-if run first)."""
    at = _app().switch_page(f"views/{name}.py").run()
    _ok(at)
    return at


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


# The tables each page shows, told apart by their columns (st.dataframe keeps no key).
TABLES = {
    "whatif.numbers": ("quantity", "value", "unit"),
    "whatif.operators": ("operator", "ms"),
    "whatif.draft": ("step", "ms"),
    "planner.table": ("batch", "context", "policy", "builder"),
    "planner.curves": ("batch", "planned policy"),
    "planner.pareto": ("bucket", "step_ms"),
    "load.table": ("load", "qps", "throughput_tok_s"),
    "validation.gate": ("check", "what", "predicted"),
    "validation.table": ("predicted_tokens_per_s", "measured_tokens_per_s"),
    "validation.engines": ("engine", "quantity", "predicted", "measured", "error_pct"),
    "kernels.table": ("implementation", "tflops"),
}


def _frame(at: AppTest, key: str, last: bool = False) -> Any:
    found = [df.value for df in at.dataframe if set(TABLES[key]) <= set(df.value.columns)]
    if not found:
        raise AssertionError(f"no table {key!r}")
    return found[-1] if last else found[0]


def _numbers(at: AppTest) -> dict[str, float]:
    df = _frame(at, "whatif.numbers")
    return dict(zip(df["quantity"], df["value"], strict=True))


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


# ---- What-if ------------------------------------------------------------------------------------


SERVED, DECODE = data.SERVED_TOK_S, data.DECODE_TOK_S


def test_whatif_defaults_equal_the_planner() -> None:
    at = _app().run()
    _ok(at)
    assert at.title[0].value == "What-if"
    served = scenario_objective(Scenario().resolve())  # what `spectune plan` scores with
    obj = closed_form_objective(TARGET, DRAFTER, "h100-sxm", "mt-bench")  # decode: no turnover
    p, b, c = SGLANG_DEFAULT, 8, 4096
    got = _numbers(at)
    assert got[SERVED] == pytest.approx(served(p, b, c), rel=1e-12)
    assert got[f"{SERVED} without speculation"] == pytest.approx(served(None, b, c), rel=1e-12)
    assert got["speedup (served)"] == pytest.approx(served(p, b, c) / served(None, b, c), rel=1e-12)
    assert got[DECODE] == pytest.approx(obj(p, b, c), rel=1e-12)
    assert got[f"{DECODE} without speculation"] == pytest.approx(obj(None, b, c), rel=1e-12)
    assert got["speedup (decode)"] == pytest.approx(obj(p, b, c) / obj(None, b, c), rel=1e-12)
    assert got[DECODE] > got[SERVED]  # the served figure pays the prefill turnover
    assert got["expected tokens per step"] == pytest.approx(obj.expected_tokens(p), rel=1e-12)
    assert got["decode step time"] == pytest.approx(obj.step_time(p, b, c) * 1e3, rel=1e-12)
    assert got["served step time"] == pytest.approx(served.step_time(p, b, c) * 1e3, rel=1e-12)
    assert got["batch the KV cache holds"] == b
    # served step = the decode iteration (the cache holds the batch) + the prefill turnover
    assert got["decode step time"] + got["prefill turnover per served step"] == pytest.approx(
        got["served step time"], rel=1e-9
    )
    phases = [v for k, v in got.items() if k.endswith(" time") and "step time" not in k]
    assert sum(phases) == pytest.approx(got["decode step time"], rel=1e-9)
    cm = obj.cost_model
    ops = _frame(at, "whatif.operators")
    want = cm.verify_breakdown(b, p.budget, c)
    for name, ms in zip(ops["operator"], ops["ms"], strict=True):
        assert ms == pytest.approx(float(np.asarray(want[name]).reshape(-1)[0]) * 1e3, rel=1e-12)
    assert sum(ops["ms"]) == pytest.approx(got["verify time"], rel=1e-9)
    draft = _frame(at, "whatif.draft")
    assert sum(draft["ms"]) == pytest.approx(got["draft time"], rel=1e-9)
    first = cm.draft_step_time(b, 1, c, from_target=True)
    assert draft["ms"][0] == pytest.approx(float(np.asarray(first).reshape(-1)[0]) * 1e3, rel=1e-12)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[SERVED] == f"{served(p, b, c):,.0f}"
    assert metrics[DECODE] == f"{obj(p, b, c):,.0f}"
    assert metrics["speedup (served)"] == f"{served(p, b, c) / served(None, b, c):.2f}x"
    assert not any(m.label == "tokens/s" for m in at.metric)  # every tok/s names its kind
    assert len(at.image) >= 3  # phase bars, operator bars, the tree


def test_whatif_says_when_the_kv_cache_caps_the_served_batch() -> None:
    at = _app().run()
    at.sidebar.selectbox(key="scn.target").set_value("llama-3.1-70b")
    at.sidebar.select_slider(key="scn.tp").set_value(4)
    at.sidebar.selectbox(key="scn.gpu").set_value("h200").run()
    at.select_slider(key="whatif.batch").set_value(256)
    at.select_slider(key="whatif.context").set_value(32768).run()
    _ok(at)
    scn = Scenario("llama-3.1-70b", "eagle3-llama-3.1-70b", "h200", 4)
    served = scenario_objective(scn.resolve())
    fits = int(served.fitting_batch(256, 32768)[0])
    assert fits < 256
    got = _numbers(at)
    assert got["batch the KV cache holds"] == fits
    assert got[SERVED] == pytest.approx(served(SGLANG_DEFAULT, 256, 32768), rel=1e-12)
    assert any(f"KV cache holds {fits} requests" in i.value for i in at.info)


def test_whatif_takes_the_acceptance_of_the_sidebars_pair() -> None:
    """Another drafter in the sidebar: the page predicts with that pair's acceptance preset
    (Scenario.resolve, as `spectune plan` does); a pair without a preset of its own gets the
    nearest one, and the page says which."""
    at = _app().run()
    eagle3 = _numbers(at)["expected tokens per step"]
    at.sidebar.selectbox(key=f"scn.drafter.{TARGET}").set_value("llama-3.2-1b").run()
    _ok(at)
    got = _numbers(at)["expected tokens per step"]
    obj = scenario_objective(Scenario(drafter="llama-3.2-1b").resolve())
    assert got == pytest.approx(obj.expected_tokens(SGLANG_DEFAULT), rel=1e-12)
    assert got < eagle3 - 0.5  # a 1B draft model accepts less than the EAGLE-3 head
    assert not [w for w in at.warning if w.value.startswith("Acceptance:")]
    at.sidebar.selectbox(key="scn.target").set_value("smollm2-135m").run()
    _ok(at)
    warned = [w.value for w in at.warning if w.value.startswith("Acceptance:")]
    assert len(warned) == 1 and "using the nearest, ngram/llama-3/mt-bench/T=0" in warned[0]


def test_pair_notes_are_the_resolve_warnings() -> None:
    assert data.pair_notes(Scenario()) == ()
    notes = data.pair_notes(Scenario(target="smollm2-135m", drafter="none"))
    assert len(notes) == 1 and "ngram/smollm2/mt-bench/T=0" in notes[0]
    assert (
        "ngram/llama-3"
        in data.resolve(Scenario(target="smollm2-135m", drafter="none")).workload.source
    )


def test_whatif_changed_inputs_equal_the_planner() -> None:
    at = _app().run()
    at.sidebar.selectbox(key="scn.gpu").set_value("h200")
    at.sidebar.selectbox(key="scn.workload").set_value("ngram-code-edit")
    at.sidebar.select_slider(key="scn.tp").set_value(2)
    at.select_slider(key="whatif.batch").set_value(64)
    at.select_slider(key="whatif.context").set_value(16384)
    at.radio(key="whatif.builder").set_value("static")
    at.slider(key="whatif.depth").set_value(6)
    at.slider(key="whatif.topk").set_value(3)
    at.slider(key="whatif.budget").set_value(24)
    at.select_slider(key="whatif.prune").set_value(0.01)
    at.slider(key="whatif.graft").set_value(6)
    at.number_input(key="whatif.seed").set_value(3)
    at.run()
    _ok(at)
    obj = closed_form_objective(TARGET, DRAFTER, "h200", "ngram-code-edit", tp=2)
    p = canonical_policy("static", 6, 3, 24, 0.01, 6)
    got = _numbers(at)
    assert got[DECODE] == pytest.approx(obj(p, 64, 16384), rel=1e-12)
    served = scenario_objective(Scenario(gpu="h200", workload="ngram-code-edit", tp=2).resolve())
    assert got[SERVED] == pytest.approx(served(p, 64, 16384), rel=1e-12)
    assert got["expected tokens per step"] == pytest.approx(obj.expected_tokens(p), rel=1e-12)
    assert got["tree tokens verified"] == pytest.approx(obj.tree_tokens(p), rel=1e-12)
    assert "retrieval time" in got

    # a budget larger than the tree can hold is cut, and the page says so
    at.radio(key="whatif.builder").set_value("dynamic-topk")
    at.slider(key="whatif.depth").set_value(2)
    at.slider(key="whatif.topk").set_value(2)
    at.slider(key="whatif.budget").set_value(200)
    at.run()
    _ok(at)
    assert any("cut to" in i.value for i in at.info)
    p = canonical_policy("dynamic-topk", 2, 2, 200, 0.01, 6)
    assert _numbers(at)[DECODE] == pytest.approx(obj(p, 64, 16384), rel=1e-12)

    # speculation off: plain decoding
    at.toggle(key="whatif.on").set_value(False).run()
    _ok(at)
    got = _numbers(at)
    assert got[DECODE] == pytest.approx(obj(None, 64, 16384), rel=1e-12)
    assert got["speedup (served)"] == 1.0 and got["speedup (decode)"] == 1.0


def test_scenario_choices_survive_other_pages() -> None:
    at = _app().run()
    at.sidebar.selectbox(key="scn.gpu").set_value("a100-80g").run()
    at.switch_page("views/kernels.py").run()
    _ok(at)
    assert not at.sidebar.selectbox  # the Kernels page has no scenario
    at.switch_page("views/whatif.py").run()
    _ok(at)
    assert at.sidebar.selectbox(key="scn.gpu").value == "a100-80g"


def test_uploaded_gpu_spec_is_used_and_bad_specs_are_reported(tmp_path: Path) -> None:
    spec = (
        b'name = "my-gpu"\npeak_bf16_flops = 500e12\npeak_fp8_flops = 1000e12\n'
        b"hbm_bytes_per_s = 2.0e12\nhbm_bytes = 80e9\nsm_count = 100\nl2_bytes = 40e6\n"
        b"interconnect_bytes_per_s = 300e9\n"
    )
    at = _app().run()
    at.sidebar.file_uploader(key="upload.gpu").set_value(("my-gpu.toml", spec, "application/toml"))
    at.run()
    _ok(at)
    assert "my-gpu (uploaded)" in at.sidebar.selectbox(key="scn.gpu").options
    at.sidebar.selectbox(key="scn.gpu").set_value("my-gpu (uploaded)").run()
    _ok(at)
    (tmp_path / "my-gpu.toml").write_bytes(spec)
    scn = Scenario(gpu=str(tmp_path / "my-gpu.toml"))
    want = data.objective_for(scn, decode_only=True)(SGLANG_DEFAULT, 8, 4096)
    assert _numbers(at)[DECODE] == pytest.approx(want, rel=1e-12)

    bad = {
        "broken.json": b"{not json",
        "wrong.toml": b'name = "x"\npeak_bf16_flops = "fast"\n',
        "unknown.json": b'{"name": "x", "peak_flops": 1}',
        "huge.json": b"{" + b" " * (uploads.MAX_SPEC_BYTES + 1) + b"}",
        "list.json": b"[1, 2]",
        "latin1.json": '{"name": "é"}'.encode("latin-1"),
    }
    for name, blob in bad.items():
        at.sidebar.file_uploader(key="upload.model").set_value((name, blob, "application/json"))
        at.run()
        _ok(at)
        errs = _errors(at)
        assert errs and name in errs[0], (name, errs)


def _trace_file(path: Path, steps: int = 40) -> Path:
    """A small spectune.trace/v1 file: random pools (depth 3, top-k 3) and random targets."""
    from spectune.specs import DraftTree
    from spectune.specs.trace import TraceHeader, make_step, write_trace

    rng = np.random.default_rng(5)
    parents, depth_of = [-1], [0]
    for node in range(13):  # a full 3-ary tree of depth 2, then one more level under node 1
        if depth_of[node] < 2 or node == 1:
            for _ in range(3):
                parents.append(node)
                depth_of.append(depth_of[node] + 1)
    n = len(parents)
    recorded = []
    for i in range(steps):
        tokens = rng.permutation(1000)[:n]  # distinct, so siblings never share a token
        logp = np.log(rng.uniform(0.05, 0.9, n))
        logp[0] = 0.0
        pool = DraftTree.from_parents(parents, tokens=tokens, logprobs=logp)
        target = np.full(n, 5000 + i, dtype=np.int64)  # no child matches ...
        for node in range(n):
            kids = [k for k in range(n) if parents[k] == node]
            if kids and rng.random() < 0.7:  # ... except here: the most confident child
                target[node] = tokens[max(kids, key=lambda k: logp[k])]
        recorded.append(make_step(f"r{i % 4}", i, 100 + i, pool, target))
    header = TraceHeader("toy-target", "toy-drafter", "toy-prompts", max_depth=3, max_topk=3)
    write_trace(path, header, recorded)
    return path


def test_uploaded_acceptance_trace_drives_the_prediction(tmp_path: Path) -> None:
    from spectune.planner.acceptance import TraceReplay
    from spectune.planner.costmodel import CostModel
    from spectune.planner.objective import ClosedFormObjective
    from spectune.specs.trace import read_trace

    path = _trace_file(tmp_path / "toy.jsonl")
    at = _app().run()
    at.sidebar.file_uploader(key="upload.trace").set_value(
        ("toy.jsonl", path.read_bytes(), "application/jsonl")
    ).run()
    _ok(at)
    assert "acceptance from trace toy.jsonl" in at.caption[0].value
    _, steps = read_trace(path)
    cm = CostModel(load_hardware("h100-sxm"), load_model(TARGET), load_model(DRAFTER))
    obj = ClosedFormObjective(cm, TraceReplay(steps))
    got = _numbers(at)
    assert got["expected tokens per step"] == pytest.approx(
        obj.expected_tokens(SGLANG_DEFAULT), rel=1e-12
    )
    assert got[DECODE] == pytest.approx(obj(SGLANG_DEFAULT, 8, 4096), rel=1e-12)

    at.sidebar.toggle(key="scn.use_trace").set_value(False).run()
    _ok(at)
    want = closed_form_objective(TARGET, DRAFTER, "h100-sxm", "mt-bench")(SGLANG_DEFAULT, 8, 4096)
    assert _numbers(at)[DECODE] == pytest.approx(want, rel=1e-12)

    at.sidebar.file_uploader(key="upload.trace").set_value(
        ("bad.jsonl", b'{"schema": "nope"}\n', "application/jsonl")
    ).run()
    _ok(at)
    assert any("bad.jsonl" in e for e in _errors(at))


# ---- Planner ------------------------------------------------------------------------------------


def _planned(edges: tuple[int, ...], ctx: tuple[int, ...], trials: int, multi: bool = False) -> Any:
    obj = scenario_objective(Scenario().resolve())  # what `spectune plan` scores with
    s = SearchSettings(trials=trials, seed=0, multi_objective=multi)
    return obj, search(obj, buckets_from_edges(edges, ctx), s,
                       latency=obj.step_latency if multi else None)  # fmt: skip


def test_planner_defaults_equal_the_search() -> None:
    at = _page("planner")
    _ok(at)
    obj, results = _planned((1, 2, 4, 8, 16, 32, 64, 128, 256), (32768,), 8)
    table = _frame(at, "planner.table")
    assert list(table["policy"]) == [data.policy_label(r.policy) for r in results]
    assert list(table["served_tok_s"]) == pytest.approx([round(r.tokens_per_s, 3) for r in results])
    curves = _frame(at, "planner.curves")
    batches = [int(b) for b in curves["batch"]]
    assert batches[0] == 1 and batches[-1] == 256
    for b, planned, sg, eg, off in zip(batches, curves["planned policy"],
                                       curves["SGLang default 5/4/8"],
                                       curves["EAGLE default 7/10/60"],
                                       curves["no speculation"], strict=True):  # fmt: skip
        policy = next(r.policy for r in results if r.bucket.batch[0] <= b <= r.bucket.batch[1])
        assert planned == pytest.approx(obj(policy, b, 16384), rel=1e-9)
        assert sg == pytest.approx(obj(SGLANG_DEFAULT, b, 16384), rel=1e-9)
        assert eg == pytest.approx(obj(EAGLE_DEFAULT, b, 16384), rel=1e-9)
        assert off == pytest.approx(obj(None, b, 16384), rel=1e-9)
    downloads = {d.proto.label: d for d in at.get("download_button")}
    assert "policy.json" in downloads
    assert any(name.startswith("sglang") for name in downloads)
    assert any(name.startswith("vllm") for name in downloads)
    assert any(name.startswith("trtllm") for name in downloads)
    assert any("Pareto" in i.value for i in at.info)


def test_planner_multi_objective_run_shows_the_pareto_front() -> None:
    at = _page("planner")
    at.text_input(key="planner.batch_edges").set_value("1,8,64")
    at.text_input(key="planner.context_edges").set_value("4096,32768")
    at.slider(key="planner.trials").set_value(6)
    at.checkbox(key="planner.multi").check()
    at.button(key="FormSubmitter:planner.form-Run plan").click().run()
    _ok(at)
    _, results = _planned((1, 8, 64), (4096, 32768), 6, multi=True)
    assert list(_frame(at, "planner.table")["policy"]) == [
        data.policy_label(r.policy) for r in results
    ]
    pareto = _frame(at, "planner.pareto")
    assert len(pareto) == len(plans.pareto_rows(results))
    assert list(pareto["tokens_per_s"]) == pytest.approx(
        [r["tokens_per_s"] for r in plans.pareto_rows(results)]
    )
    at.select_slider(key="planner.context").set_value("4096-32768 (scored at 18432)").run()
    _ok(at)
    obj = scenario_objective(Scenario().resolve())
    curves = _frame(at, "planner.curves")
    for b, planned in zip(curves["batch"], curves["planned policy"], strict=True):
        policy = next(r.policy for r in results if r.bucket.batch[0] <= b <= r.bucket.batch[1]
                      and r.bucket.context[0] == 4096)  # fmt: skip
        assert planned == pytest.approx(obj(policy, int(b), 18432), rel=1e-9)

    at.text_input(key="planner.batch_edges").set_value("one,two")
    at.button(key="FormSubmitter:planner.form-Run plan").click().run()
    _ok(at)
    assert any("bucket edges" in e for e in _errors(at))


def test_planner_inputs_survive_another_page() -> None:
    at = _page("planner")
    at.text_input(key="planner.batch_edges").set_value("1,8")
    at.slider(key="planner.trials").set_value(4)
    at.button(key="FormSubmitter:planner.form-Run plan").click().run()
    _ok(at)
    at.switch_page("views/kernels.py").run()
    at.switch_page("views/planner.py").run()
    _ok(at)
    assert at.text_input(key="planner.batch_edges").value == "1,8"
    assert at.slider(key="planner.trials").value == 4
    assert list(_frame(at, "planner.table")["batch"]) == ["1-1", "2-8"]


def test_planner_loads_a_policy_file_and_reports_bad_ones() -> None:
    _, results = _planned((1, 16), (32768,), 4)
    table = PolicyTable(
        target=TARGET, drafter=DRAFTER, hardware="h100-sxm", workload="mt-bench",
        buckets=tuple(Bucket(r.bucket.batch, r.bucket.context, r.policy) for r in results),
    )  # fmt: skip
    blob = json.dumps(table.to_dict()).encode()
    at = _page("planner")
    at.radio(key="planner.source").set_value("Load a policy file").run()
    _ok(at)
    assert any("Upload a policy.json" in i.value for i in at.info)
    at.file_uploader(key="planner.upload").set_value(
        ("policy.json", blob, "application/json")
    ).run()
    _ok(at)
    assert list(_frame(at, "planner.table")["policy"]) == [
        data.policy_label(r.policy) for r in results
    ]
    downloads = {d.proto.label for d in at.get("download_button")}
    assert "policy.json" in downloads

    for name, bad in {
        "policy.json": b'{"schema": "spectune.policy/v1", "target": "x"}',
        "other.json": b'{"schema": "something/v9"}',
        "trunc.json": blob[: len(blob) // 2],
        "types.json": json.dumps({**table.to_dict(), "buckets": [{"batch": "all"}]}).encode(),
    }.items():
        at.file_uploader(key="planner.upload").set_value((name, bad, "application/json")).run()
        _ok(at)
        errs = _errors(at)
        assert errs and name in errs[0], (name, errs)


def test_planner_opens_a_stored_multi_objective_study(tmp_path: Path) -> None:
    from spectune.planner.table import build_table

    obj = closed_form_objective(TARGET, DRAFTER, "h100-sxm", "mt-bench")
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    scenario = Scenario(TARGET, DRAFTER, "h100-sxm", 1, "mt-bench", objective="closed-form")
    settings = SearchSettings(trials=6, seed=1, multi_objective=True)
    results = search(obj, buckets_from_edges((1, 16), (32768,)), settings, latency=obj.step_latency,
                     storage=url, study_prefix="toy", setup={"scenario": scenario.to_dict()})  # fmt: skip
    want = build_table(results, obj, scenario, {})

    at = _page("planner")
    at.radio(key="planner.source").set_value("Open a stored study").run()
    _ok(at)
    at.text_input(key="planner.storage").set_value(f"sqlite:///{tmp_path / 'missing.db'}").run()
    _ok(at)
    assert any("no such SQLite file" in e for e in _errors(at))
    assert not (tmp_path / "missing.db").exists()
    at.text_input(key="planner.storage").set_value(url).run()
    _ok(at)
    assert at.selectbox(key="planner.study").value == "toy"
    table = _frame(at, "planner.table")
    assert list(table["policy"]) == [data.policy_label(b.policy) for b in want.buckets]
    assert list(table["served_tok_s"]) == pytest.approx(
        [b.predicted.tokens_per_s for b in want.buckets]
    )
    pareto = _frame(at, "planner.pareto")
    assert list(pareto["tokens_per_s"]) == pytest.approx(
        [r["tokens_per_s"] for r in plans.pareto_rows(results)]
    )


def test_planner_run_here_predicts_what_the_cli_plans(tmp_path: Path) -> None:
    """'Run a plan here' scores with the objective of `spectune plan` (prefill turnover, KV
    capacity, the scenario's calibration): same scenario and settings, same table."""
    from spectune.cli import main

    out = tmp_path / "policy.json"
    args = ["plan", "--out", str(out), "--trials", "4", "--batch-edges", "1,8,64"]
    assert main([*args, "--context-edges", "32768", "--gpu", "h200", "--quiet"]) == 0
    cli = PolicyTable.load(out)

    at = _app().run()
    at.sidebar.selectbox(key="scn.gpu").set_value("h200").run()
    at.switch_page("views/planner.py").run()
    at.text_input(key="planner.batch_edges").set_value("1,8,64")
    at.slider(key="planner.trials").set_value(4)
    at.button(key="FormSubmitter:planner.form-Run plan").click().run()
    _ok(at)
    table = _frame(at, "planner.table")
    assert list(table["policy"]) == [data.policy_label(b.policy) for b in cli.buckets]
    assert list(table["served_tok_s"]) == [b.predicted.tokens_per_s for b in cli.buckets]
    assert at.session_state["planner.result"].table.scenario == cli.scenario


def test_planner_and_load_pages_take_a_loaded_plans_scenario() -> None:
    """A 70B / H200 / TP 4 plan loaded while the sidebar says 8B / H100: the Planner's curves
    and the Load page's simulation are for the plan's scenario, and both pages say so."""
    big = Scenario("llama-3.1-70b", "eagle3-llama-3.1-70b", "h200", 4, "mt-bench")
    table = PolicyTable(
        target=big.target, drafter=big.drafter, hardware=big.gpu, tp=big.tp, workload="mt-bench",
        buckets=(Bucket((1, 8), (0, 32768), EAGLE_DEFAULT), Bucket((9, 64), (0, 32768), None)),
        scenario=big,
    )  # fmt: skip
    at = _page("planner")
    at.radio(key="planner.source").set_value("Load a policy file").run()
    at.file_uploader(key="planner.upload").set_value(
        ("policy.json", json.dumps(table.to_dict()).encode(), "application/json")
    ).run()
    _ok(at)
    label = "llama-3.1-70b + eagle3-llama-3.1-70b on h200 (tp 4), workload mt-bench"
    assert any(label in c.value for c in at.caption)
    assert any("gpu h200 (table) vs h100-sxm (sidebar)" in i.value for i in at.info)
    curves = _frame(at, "planner.curves")
    obj = scenario_objective(big.resolve())
    for b, planned in zip(curves["batch"], curves["planned policy"], strict=True):
        assert planned == pytest.approx(obj(table.lookup(int(b), 16384), int(b), 16384), rel=1e-9)

    at.switch_page("views/load.py").run()
    at.radio(key="load.source").set_value("Planned table (Planner page)")
    at.multiselect(key="load.qps").set_value([2.0])
    at.slider(key="load.requests").set_value(20)
    at.button(key="FormSubmitter:load.form-Simulate").click().run()
    _ok(at)
    assert any(f"Simulating {label}" in c.value for c in at.caption)
    warned = [w.value for w in at.warning if "not the sidebar's" in w.value]
    assert warned and "target llama-3.1-70b (table) vs llama-3.1-8b (sidebar)" in warned[0]
    assert "tp 4 (table) vs 1 (sidebar)" in warned[0]
    cfg = SimConfig(
        hardware=load_hardware("h200"), target=load_model(big.target),
        drafter=load_model(big.drafter), arrivals=Poisson(2.0), policy=table,
        workload=load_workload(
            "mt-bench", target=load_model(big.target), drafter=load_model(big.drafter)
        ), requests=20, tp=4, seed=0, tree_pool=256, keep_iterations=True,
    )  # fmt: skip
    res = simulate(cfg)
    rows = _frame(at, "load.table")
    assert rows["throughput_tok_s"][0] == pytest.approx(_steady(res).throughput_tok_s, rel=1e-12)
    assert rows["mean_accepted"][0] == pytest.approx(res.spec.metrics.mean_accepted, rel=1e-12)


BIG = ("--target", "llama-3.1-70b", "--drafter", "eagle3-llama-3.1-70b", "--gpu", "h200",
       "--tp", "4")  # fmt: skip
BIG_LABEL = "llama-3.1-70b + eagle3-llama-3.1-70b on h200 (tp 4), workload mt-bench"


@pytest.fixture(scope="module")
def plan70(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 70B / H200 / TP 4 policy file written by `spectune plan` (two batch buckets, the
    second ending at 128, one context bucket scored at 2048)."""
    from spectune.cli import main

    out = tmp_path_factory.mktemp("plan70") / "policy.json"
    args = ["plan", *BIG, "--trials", "4", "--batch-edges", "8,128", "--context-edges", "4096"]
    assert main([*args, "--out", str(out), "--quiet"]) == 0
    return out


def test_a_loaded_70b_plan_shows_one_tokens_per_s_on_every_page(plan70: Path) -> None:
    """The plan's scenario on every page; the Planner's table, chart and bucket metrics and
    What-if give the policy file's served tok/s for the same bucket (one objective call)."""
    from spectune.planner.search import geomean

    table = PolicyTable.load(plan70)
    big = table.scenario
    at = _page("planner")
    at.radio(key="planner.source").set_value("Load a policy file").run()
    at.file_uploader(key="planner.upload").set_value(
        ("policy.json", plan70.read_bytes(), "application/json")
    ).run()
    _ok(at)
    assert any(BIG_LABEL in c.value for c in at.caption)
    rows = _frame(at, "planner.table")
    assert list(rows["served_tok_s"]) == [b.predicted.tokens_per_s for b in table.buckets]
    curves = _frame(at, "planner.curves")
    at_batch = dict(zip(curves["batch"], curves["planned policy"], strict=True))
    served = scenario_objective(big.resolve())
    for b in table.buckets:  # the chart's points give the table's score (geometric mean)
        lo, hi = b.batch
        assert geomean([at_batch[lo], at_batch[hi]]) == pytest.approx(
            b.predicted.tokens_per_s, rel=1e-6
        )
        assert at_batch[hi] == pytest.approx(served(b.policy, hi, 2048), rel=1e-12)
    chart = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert [layer["mark"]["type"] for layer in chart["layer"]] == ["line", "rule"]
    assert all("tooltip" in layer["encoding"] for layer in chart["layer"])

    last = table.buckets[-1]
    assert last.batch == (9, 128)
    at.selectbox(key="planner.bucket").set_value(plans.bucket_name(last.batch, last.context))
    at.run()
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    want = f"{last.predicted.tokens_per_s:,.0f}"
    assert metrics[data.BUCKET_SCORE_FILE] == want
    assert metrics[data.BUCKET_SCORE_HERE] == want

    at.button(key="planner.open_whatif").click().run()
    _ok(at)
    assert at.title[0].value == "What-if"
    assert at.radio(key="whatif.source").value == "Planned table (Planner page)"
    assert at.select_slider(key="whatif.batch").value == 128
    assert at.select_slider(key="whatif.context").value == 2048
    assert any(BIG_LABEL in c.value for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[data.BUCKET_SCORE_FILE] == want
    assert metrics[data.BUCKET_SCORE_HERE] == want
    assert metrics[SERVED] == f"{at_batch[128]:,.0f}"  # the Planner's curve at this batch
    assert _numbers(at)[SERVED] == pytest.approx(at_batch[128], rel=1e-12)

    for page in ("whatif", "planner", "validation", "kernels", "load"):
        at.switch_page(f"views/{page}.py").run()
        _ok(at)
        shown = [c.value for c in at.sidebar.caption]
        assert any(f"Plan on the Planner page: {BIG_LABEL}" in c for c in shown), (page, shown)
    at.radio(key="load.source").set_value("Planned table (Planner page)")
    at.multiselect(key="load.qps").set_value([1.0])
    at.slider(key="load.requests").set_value(40)
    at.button(key="FormSubmitter:load.form-Simulate").click().run()
    _ok(at)
    assert any(f"Simulating {BIG_LABEL}" in c.value for c in at.caption)


def test_bucket_score_is_the_policy_files_prediction(plan70: Path) -> None:
    table = PolicyTable.load(plan70)
    for b in table.buckets:
        got = data.bucket_score(table.scenario, b.policy, b.batch, b.context)
        assert got.score == pytest.approx(b.predicted.tokens_per_s, abs=1e-3)
        assert got.speedup == pytest.approx(b.predicted.speedup, abs=1e-4)
        assert got.points == ((b.batch[0], 2048), (b.batch[1], 2048))
        assert all(d >= s_ for d, s_ in zip(got.decode_tokens_per_s, got.served_tokens_per_s,
                                            strict=True))  # fmt: skip


def test_steady_metrics_trim_warm_up_and_drain() -> None:
    """Worked by hand: 11 requests arriving 1 s apart; the window runs from the arrival of
    request 2 (ceil(10% of 11) = 2) to the last arrival (t = 10 s). Iterations every 0.5 s
    emit 3 tokens; those starting in [2, 10) count: 16 iterations, 48 tokens over 8 s."""
    from spectune.simulator.iterations import IterationLog
    from spectune.simulator.requests import Requests

    reqs = Requests(np.arange(11.0), np.full(11, 100), np.full(11, 5))
    reqs.out[:] = 5
    reqs.first_token_s[:] = reqs.arrival_s + 0.25
    reqs.finish_s[:] = reqs.arrival_s + 0.25 + 4 * 0.1 * (1 + np.arange(11) % 2)
    log = IterationLog()
    for i in range(30):  # 0 .. 14.5 s, past the last arrival (the drain)
        log.rows.append((0, 0.5 * i, 0.5, 1, 0, 1, 3, 3, 0, 0.5, 0, 0, 0, 0))
    m = steady_metrics(reqs, log, slo_tpot_s=0.15)
    assert (m.start_s, m.end_s, m.requests) == (2.0, 10.0, 9)
    assert m.throughput_tok_s == pytest.approx(48 / 8)
    assert m.offered_tok_s == pytest.approx(9 * 5 / 8)
    assert m.ttft.p50 == pytest.approx(0.25)
    # requests 2..10: even ones have TPOT 0.1 s (5 of them), odd ones 0.2 s (4): SLO 0.15 s
    assert m.goodput_tok_s == pytest.approx(6.0 * 5 / 9)
    assert m.token_latency_s == pytest.approx((5 * 0.4 + 4 * 0.8) / (9 * 4))


def test_folders_resolve_from_the_repository_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(artifacts.ENV_MEASUREMENTS, raising=False)
    monkeypatch.delenv(artifacts.ENV_BENCHMARKS, raising=False)
    monkeypatch.chdir(tmp_path)
    root = Path(data.__file__).resolve().parents[2]
    assert artifacts.measurements_dir() == root / "measurements"
    assert artifacts.benchmarks_dir() == root / "benchmarks" / "results"
    monkeypatch.setenv(artifacts.ENV_MEASUREMENTS, str(tmp_path / "m"))
    assert artifacts.measurements_dir() == tmp_path / "m"


# ---- Load ---------------------------------------------------------------------------------------


def _simulated(policy: Any, qps: float, requests: int) -> Any:
    cfg = SimConfig(
        hardware=load_hardware("h100-sxm"), target=load_model(TARGET), drafter=load_model(DRAFTER),
        arrivals=Poisson(qps), policy=policy, workload=load_workload("mt-bench"),
        requests=requests, seed=0, tree_pool=256, keep_iterations=True,
    )  # fmt: skip
    return simulate(cfg)


def _steady(res: Any, off: bool = False) -> Any:
    run = res.off if off else res.spec
    return steady_metrics(run.requests, run.log, res.config.slo_ttft_s, res.config.slo_tpot_s)


def test_load_page_equals_the_simulator() -> None:
    at = _page("load")
    _ok(at)
    assert at.slider(key="load.requests").value == 1000  # enough for steady state
    assert any("Steady state" in c.value and "warm-up" in c.value for c in at.caption)
    rows = _frame(at, "load.table")
    assert list(rows["qps"]) == [1.0, 4.0, 16.0]
    res = _simulated(SGLANG_DEFAULT, 16.0, 1000)
    on, off = _steady(res), _steady(res, off=True)
    row = rows[rows["qps"] == 16.0].iloc[0]
    assert row["throughput_tok_s"] == pytest.approx(on.throughput_tok_s, rel=1e-12)
    assert row["off_throughput_tok_s"] == pytest.approx(off.throughput_tok_s, rel=1e-12)
    assert row["tpot_p99_ms"] == pytest.approx(on.tpot.p99 * 1e3, rel=1e-12)
    assert row["ttft_p50_ms"] == pytest.approx(on.ttft.p50 * 1e3, rel=1e-12)
    # below saturation a server serves what arrives, with or without speculation (the whole-run
    # figure of a short run counts its drain and shows a phantom gain)
    assert row["throughput_ratio_vs_off"] == pytest.approx(1.0, abs=0.05)
    assert row["throughput_tok_s"] == pytest.approx(row["offered_tok_s"], rel=0.05)
    short = _simulated(SGLANG_DEFAULT, 16.0, 100)
    assert short.throughput_ratio_vs_off > 1.3
    # every column has a label with its unit, and no latency is in seconds
    assert set(rows.columns) <= set(loadtest.COLUMNS)
    latency = [c for c in rows.columns if "ttft" in c or "tpot" in c]
    assert len(latency) == 8 and all(c.endswith("_ms") for c in latency)
    assert all(" ms" in loadtest.COLUMNS[c][0] for c in latency)
    charts = at.get("vega_lite_chart")
    assert len(charts) == 3
    for c in charts:
        spec = json.loads(c.proto.spec)
        assert (
            "tooltip" in spec["encoding"]
            and spec["encoding"]["color"]["legend"]["orient"] == "bottom"
        )

    at.radio(key="load.source").set_value("EAGLE default 7/10/60")
    at.multiselect(key="load.qps").set_value([2.0])
    at.slider(key="load.requests").set_value(40)
    at.button(key="FormSubmitter:load.form-Simulate").click().run()
    _ok(at)
    assert any("noisy" in w.value for w in at.warning)
    rows = _frame(at, "load.table")
    res = _simulated(EAGLE_DEFAULT, 2.0, 40)
    on, off = _steady(res), _steady(res, off=True)
    assert list(rows["qps"]) == [2.0]
    assert rows["throughput_tok_s"][0] == pytest.approx(on.throughput_tok_s, rel=1e-12)
    want = off.token_latency_s / on.token_latency_s
    assert rows["speedup_vs_off"][0] == pytest.approx(want, rel=1e-12)

    trace = b"arrival_s,prompt_tokens,output_tokens\n0,100,20\n0.2,300,10\n0.5,50,30\n"
    at.file_uploader(key="load.trace").set_value(("t.csv", trace, "text/csv")).run()
    _ok(at)
    replay = _frame(at, "load.table", last=True)
    assert replay["load"][0] == "trace t.csv"
    at.file_uploader(key="load.trace").set_value(("t.csv", b"a,b\n1,2\n", "text/csv")).run()
    _ok(at)
    assert any("t.csv" in e for e in _errors(at))

    at.multiselect(key="load.qps").set_value([])
    at.button(key="FormSubmitter:load.form-Simulate").click().run()
    _ok(at)
    assert any("request rate" in e for e in _errors(at))


def test_load_page_simulates_the_planned_table() -> None:
    at = _page("planner")
    table = at.session_state["planner.result"].table
    at.switch_page("views/load.py").run()
    _ok(at)
    at.radio(key="load.source").set_value("Planned table (Planner page)")
    at.multiselect(key="load.qps").set_value([8.0])
    at.slider(key="load.requests").set_value(30)
    at.button(key="FormSubmitter:load.form-Simulate").click().run()
    _ok(at)
    res = _simulated(table, 8.0, 30)
    rows = _frame(at, "load.table")
    assert rows["throughput_tok_s"][0] == pytest.approx(_steady(res).throughput_tok_s, rel=1e-12)
    assert rows["mean_accepted"][0] == pytest.approx(res.spec.metrics.mean_accepted, rel=1e-12)


# ---- Validation ---------------------------------------------------------------------------------


def _measurement(scale: float = 1.05) -> dict[str, Any]:
    """A measurement document in the executor's schema whose numbers are the cost model's
    predictions times `scale` (a GPU that runs 5% slower than predicted)."""
    obj = closed_form_objective(TARGET, DRAFTER, "h100-sxm", "mt-bench")
    cm, c = obj.cost_model, 2048
    runs = []
    for b in (1, 8, 32):
        for label, p in (("sglang", SGLANG_DEFAULT), ("off", None)):
            step = obj.step_time(p, b, c) * scale
            ar = obj.step_time(None, b, c) * scale
            tps = obj.expected_tokens(p)
            n = 1 if p is None else p.budget
            verify = float(np.asarray(cm.verify_time(b, n, c)).reshape(-1)[0]) * scale
            phases = dict.fromkeys(("draft", "tree", "verify", "accept", "compact", "extend",
                                    "overhead", "step"), 0.0)  # fmt: skip
            phases.update(verify=verify * 1e3, step=step * 1e3)
            runs.append({
                "batch": b, "label": label, "nodes": n, "phases_ms": phases,
                "policy": None if p is None else {
                    "builder": p.builder, "depth": p.depth, "topk": p.topk, "budget": p.budget,
                    "prune_threshold": p.prune_threshold, "graft_budget": p.graft_budget},
                "accepted_mean": tps - 1.0, "tokens_per_step": tps, "tokens_per_s": b * tps / step,
                "ar_step_ms": ar * 1e3, "ar_tokens_per_s": b / ar, "speedup": tps * ar / step,
            })  # fmt: skip
    return {"schema": "spectune.measurement/v1", "gpu": "NVIDIA H100 80GB HBM3",
            "hardware": "h100-sxm", "target": TARGET, "drafter": DRAFTER, "workload": "mt-bench",
            "context": c, "steps": 30, "attention": "test", "runs": runs}  # fmt: skip


def test_validation_without_measurements_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(artifacts.ENV_MEASUREMENTS, str(tmp_path / "none"))
    at = _page("validation")
    _ok(at)
    assert any("No measurements yet" in i.value for i in at.info)
    assert not at.dataframe


def test_validation_equals_check_and_planner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spectune.validate.check import check_folder

    doc = _measurement()
    (tmp_path / "h100.json").write_text(json.dumps(doc))
    (tmp_path / "notes.json").write_text("{oops")
    monkeypatch.setenv(artifacts.ENV_MEASUREMENTS, str(tmp_path))
    at = _page("validation")
    _ok(at)
    assert any("notes.json" in w.value for w in at.warning)

    gate = _frame(at, "validation.gate")
    (tmp_path / "notes.json").unlink()
    res = check_folder(tmp_path)
    want = [r.predicted for r in res.speedup]
    assert list(gate[gate["check"] == "speedup"]["predicted"]) == pytest.approx(want, rel=1e-12)
    want = [r.predicted * 1e3 for r in res.verify]
    assert list(gate[gate["check"] == "verify latency"]["predicted"]) == pytest.approx(
        want, rel=1e-12
    )

    table = _frame(at, "validation.table")
    obj = closed_form_objective(TARGET, DRAFTER, "h100-sxm", "mt-bench")
    for _, row in table.iterrows():
        p = SGLANG_DEFAULT if row["policy"] == "sglang" else None
        b = int(row["batch"])
        assert row["predicted_tokens_per_s"] == pytest.approx(obj(p, b, 2048), rel=1e-12)
        assert row["measured_tokens_per_s"] == pytest.approx(obj(p, b, 2048) / 1.05, rel=1e-9)
        assert row["error_tokens_per_s_pct"] == pytest.approx(5.0, rel=1e-6)

    at.radio(key="validation.quantity").set_value("step_ms")
    at.radio(key="validation.check").set_value("verify latency")
    at.run()
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["mean |error| of step time, ms"] == f"{100 * (1 / 1.05 - 1) * -1:.1f} %"

    bad = dict(doc, runs=[{"batch": "eight"}])
    at.file_uploader(key="validation.upload").set_value(
        ("bad.json", json.dumps(bad).encode(), "application/json")
    ).run()
    _ok(at)
    assert any("bad.json" in e for e in _errors(at))
    at.file_uploader(key="validation.upload").set_value(
        ("more.json", json.dumps(_measurement(0.9)).encode(), "application/json")
    ).run()
    _ok(at)
    assert len(_frame(at, "validation.table")) == 2 * len(doc["runs"])


# ---- Kernels ------------------------------------------------------------------------------------


def _bench() -> dict[str, Any]:
    rows = []
    for b, ctx, n in ((1, 4096, 16), (8, 32768, 64)):
        kv = 2.0 * b * (ctx + n) * 8 * 128 * 2
        flops = 4.0 * b * n * 32 * 128 * (ctx + n)
        floor = kv / 3.0e12 * 1e6
        rows.append({"batch": b, "ctx": ctx, "tree_tokens": n, "kv_bytes": kv, "flops": flops,
                     "floor_us": floor, "ours_us": floor * 1.3, "sdpa_gqa_us": floor * 3.0,
                     "flex_us": None, "flash_unmasked_us": floor * 1.1})  # fmt: skip
    return {"device": "NVIDIA H100 80GB HBM3", "card": "h100", "copy_bytes_per_s": 3.0e12,
            "attention": rows, "verify": {"walk_block1_us": 12.0}, "compact": {"moved_rows": 10}}  # fmt: skip


def test_kernels_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(artifacts.ENV_BENCHMARKS, str(tmp_path))
    at = _page("kernels")
    _ok(at)
    assert any("No kernel benchmark results yet" in i.value for i in at.info)

    doc = _bench()
    results = tmp_path / "results"  # another folder: the listing of the first is cached
    results.mkdir()
    (results / "kernels-h100.json").write_text(json.dumps(doc))
    (results / "costmodel.json").write_text(json.dumps({"rows": []}))
    monkeypatch.setenv(artifacts.ENV_BENCHMARKS, str(results))
    at = _page("kernels")
    _ok(at)
    table = _frame(at, "kernels.table")
    ours = table[table["implementation"] == "spectune tree attention"]
    for (_, row), r in zip(ours.iterrows(), doc["attention"], strict=True):
        assert row["tflops"] == pytest.approx(r["flops"] / (r["ours_us"] * 1e-6) / 1e12, rel=1e-12)
        assert row["copy_bw_fraction"] == pytest.approx(1 / 1.3, rel=1e-12)
    assert len(table) == 2 * 3  # FlexAttention's null time is left out
    (chart,) = at.get("vega_lite_chart")
    layers = json.loads(chart.proto.spec)["layer"]
    assert [layer["mark"]["type"] for layer in layers] == ["line", "point"]
    assert any("of copy bandwidth" in str(t) for t in layers[1]["encoding"]["tooltip"])
    assert any("costmodel.json" in c.value for c in at.caption)  # listed last, folded
    assert at.caption[-1].value.startswith("costmodel.json")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["measured copy bandwidth"] == "3.00 TB/s"
    peak = load_hardware("h100-sxm").peak_bf16_flops
    assert metrics["dense bf16 peak"] == f"{peak / 1e12:.0f} TFLOP/s"

    other = dict(doc, card="h200", device="NVIDIA H200")
    at.file_uploader(key="kernels.upload").set_value(
        ("h200.json", json.dumps(other).encode(), "application/json")
    ).run()
    at.selectbox(key="kernels.file").set_value("uploaded").run()
    _ok(at)
    assert any("NVIDIA H200" in c.value for c in at.caption)
    peak = load_hardware("h200").peak_bf16_flops
    assert {m.label: m.value for m in at.metric}["dense bf16 peak"] == f"{peak / 1e12:.0f} TFLOP/s"
    at.file_uploader(key="kernels.upload").set_value(
        ("x.json", b'{"copy_bytes_per_s": -1}', "application/json")
    ).run()
    _ok(at)
    assert any("x.json" in e for e in _errors(at))


# ---- the non-UI layer ---------------------------------------------------------------------------


def test_what_if_phases_sum_to_the_objectives_step() -> None:
    for scn in (Scenario(), Scenario(drafter="none")):
        _check_phases(scn)


def _check_phases(scn: Scenario) -> None:
    obj = data.objective_for(scn, decode_only=True)  # the What-if page is decode-only
    for policy in (
        SGLANG_DEFAULT,
        EAGLE_DEFAULT,
        canonical_policy("dynamic-topk", 6, 4, 32, 0.03, 8),
        None,
    ):
        for b in (1, 32, 256):
            w = data.what_if(scn, policy, b, 8192)
            assert sum(w.phases_s.values()) == pytest.approx(
                obj.step_time(policy, b, 8192), rel=1e-9
            )
            assert w.decode_tokens_per_s == pytest.approx(obj(policy, b, 8192), rel=1e-12)
            assert math.isclose(w.decode_speedup, w.decode_tokens_per_s / w.off_decode_tokens_per_s)
            served = data.objective_for(scn)  # served: the Planner's curves at this batch
            assert w.served_tokens_per_s == pytest.approx(served(policy, b, 8192), rel=1e-12)
            assert math.isclose(w.speedup, w.served_tokens_per_s / w.off_served_tokens_per_s)
            assert w.served_step_s == pytest.approx(served.step_time(policy, b, 8192), rel=1e-12)
            if w.served_batch == b:  # the cache holds the batch: served = decode + turnover
                assert w.step_s + w.turnover_s == pytest.approx(w.served_step_s, rel=1e-9)
            if policy is not None:
                draft = sum(w.draft_steps_s.values())
                assert draft == pytest.approx(w.phases_s["draft"], rel=1e-9)


def test_upload_parsing_is_data_only_and_limited() -> None:
    assert uploads.parse_mapping("a.toml", b'x = 1\n[y]\nz = "q"\n') == {"x": 1, "y": {"z": "q"}}
    for name, blob in (("a.py", b"x = 1"), ("a.pkl", b"\x80\x04."), ("a.yaml", b"x: 1")):
        with pytest.raises(SpecError, match="unsupported file type"):
            uploads.parse_mapping(name, blob)
    with pytest.raises(SpecError, match="limit"):
        uploads.parse_mapping("a.json", b"0" * 100, limit=10)
    with pytest.raises(SpecError, match=r"nested too deeply|not valid"):
        uploads.parse_mapping("deep.json", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(SpecError, match=r"expected a \.csv or \.jsonl"):
        uploads.trace_from_upload("trace.exe", b"MZ")


def test_validation_shows_engine_measurements_recursively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spectune.validate.check import check_folder

    src = Path(__file__).parent.parent / "measurements" / "engines"
    (tmp_path / "engines").mkdir()
    for name in ("vllm-qwen3-8b-eagle3-k5-h100.json", "trtllm-llama33-70b-draft-target-h200.json"):
        (tmp_path / "engines" / name).write_text((src / name).read_text())
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "m.json").write_text(json.dumps(_measurement()))
    monkeypatch.setenv(artifacts.ENV_MEASUREMENTS, str(tmp_path))
    at = _page("validation")
    _ok(at)
    assert not at.warning  # engine documents are not reported as bad executor measurements
    engines = _frame(at, "validation.engines")
    res = check_folder(tmp_path)
    assert list(engines["predicted"]) == pytest.approx([r.predicted for r in res.engine])
    m = res.engine_mape()[("vllm", "tokens_per_s")][0]
    metrics = {x.label: x.value for x in at.metric}
    assert metrics["vllm tokens_per_s MAPE"] == f"{100 * m:.1f} %"
    assert any("num_steps not stated" in c.value for c in at.caption)  # a skipped document
    assert _frame(at, "validation.table") is not None  # executor measurement from a subfolder


def test_draft_steps_label_a_static_shape_by_its_drafted_widths() -> None:
    """The What-if page's drafting parts for a static shape: one later step per width, the
    bookkeeping over 1 + len(widths) steps, the parts summing to the cost model's draft_time."""
    from spectune.planner.costmodel import CostModel
    from spectune.specs import TreePolicy, hardware_preset, model_preset

    cm = CostModel(
        hardware_preset("h100-sxm"), model_preset("llama-3.1-8b"),
        model_preset("eagle3-llama-3.1-8b"),
    )  # fmt: skip
    policy = TreePolicy("static", 5, 4, 8)
    steps = data._draft_steps(cm, policy, 8, 4096, (2, 1, 1))
    assert list(steps) == [
        "first step (1 token/seq)",
        "3 later steps (2/1/1 tokens/seq)",
        "top-k / sort / pool x 4 steps",
    ]
    want = cm.draft_time(8, 5, 4, 4096, builder="static", widths=(2, 1, 1))
    assert sum(steps.values()) == pytest.approx(float(want))
    plain = data._draft_steps(cm, policy, 8, 4096)
    assert "4 later steps (4 tokens/seq each)" in plain
