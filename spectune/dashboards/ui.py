"""Streamlit pieces shared by the pages: the scenario sidebar (with the user's own spec files),
cached wrappers around dashboards.data / plans / loadtest / artifacts / uploads, the plan the
Planner page holds (for What-if and Load), and showing errors, figures, charts and tables with
labelled columns.

Cached wrappers are the only way pages reach the computations, so every page shows what the
non-UI functions return (and the tests compare those with the planner's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pandas as pd
import streamlit as st
from matplotlib.figure import Figure

from spectune.dashboards import artifacts, charts, data, loadtest, plans, uploads
from spectune.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    NO_DRAFTER,
    WORKLOAD_PRESETS,
    Scenario,
    SpecError,
    TreePolicy,
)
from spectune.specs.compat import compatible

T = TypeVar("T")

SCENARIO_PREFIX = "scn."
SCENARIO_KEY = "scenario"  # the sidebar's Scenario, for the pages
TRACE_KEY = "acceptance_trace"  # the key of the uploaded acceptance trace in use ('' : none)
CUSTOM_KEY = "custom_specs"
NO_DRAFTER_CHOICE = "none (retrieval drafting only)"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXTS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PRUNE_THRESHOLDS = (0.0, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3)
TP_SIZES = (1, 2, 4, 8)
PLAN_KEY = "planner.result"  # the Planner page's plans.Plan, for What-if and Load
WHATIF_PAGE = "views/whatif.py"
PLANNED_SOURCE = "Planned table (Planner page)"


# ---- errors and figures -------------------------------------------------------------------------


@contextmanager
def friendly_errors(what: str = "") -> Iterator[None]:
    """Show a SpecError (bad input or file) as one st.error line instead of a traceback."""
    try:
        yield
    except SpecError as e:
        st.error(f"{what}: {e}" if what else str(e))


def upload(label: str, kinds: Sequence[str], parse: Callable[[str, bytes], T], key: str,
           help: str | None = None) -> T | None:  # fmt: skip
    """A file uploader whose file is parsed as data by `parse`; a bad file shows st.error and
    gives None. Streamlit's own limit (server.maxUploadSize) and parse's limit both apply."""
    f = st.file_uploader(label, type=list(kinds), key=key, help=help)
    if f is None:
        return None
    try:
        return parse(f.name, f.getvalue())
    except SpecError as e:
        st.error(f"{f.name} was not loaded: {e}")
    except Exception as e:  # parsing never executes the file; anything else is still its fault
        st.error(f"{f.name} was not loaded: {type(e).__name__}: {e}")
    return None


def show(fig: Figure) -> None:
    st.pyplot(fig, clear_figure=False)


def chart(c: charts.AnyChart, key: str) -> None:
    """An interactive Altair chart (dashboards.charts), as wide as its column."""
    st.altair_chart(c, width="stretch", key=key)


def table(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, tuple[str, str]], key: str,
          help: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """A table whose columns carry readable labels with units and a number format each
    (`columns`: key -> (label, printf format, or "bool" for a tick)); the rows keep their keys
    (the tests read them)."""
    cfg: dict[str, Any] = {}
    for k, (label, fmt) in columns.items():
        tip = (help or {}).get(k)
        if fmt == "bool":
            cfg[k] = st.column_config.CheckboxColumn(label, help=tip)
        elif fmt in ("%s", ""):
            cfg[k] = st.column_config.TextColumn(label, help=tip)
        else:
            cfg[k] = st.column_config.NumberColumn(label, format=fmt, help=tip)
    st.dataframe(pd.DataFrame(list(rows)), hide_index=True, column_config=cfg, key=key)


# ---- the scenario sidebar -----------------------------------------------------------------------


KEPT_KEYS = ("planner.source", "planner.batch_edges", "planner.context_edges", "planner.trials",
             "planner.seed", "planner.multi", "planner.max_ms", "planner.storage")  # fmt: skip
"""Planner inputs kept while another page is shown (a plan read from a file is kept apart, as
LOADED_KEY: an uploader's file cannot be put back)."""
LOADED_KEY = "planner.loaded"


def keep_scenario_state() -> None:
    """Keep the sidebar's choices and the Planner's inputs while another page is shown
    (Streamlit drops the state of widgets that a run does not draw unless it is written
    back)."""
    for k in list(st.session_state):
        if isinstance(k, str) and (k.startswith(SCENARIO_PREFIX) or k in KEPT_KEYS):
            st.session_state[k] = st.session_state[k]


def initial(key: str, value: T) -> T | None:
    """A widget's default only while Session State holds no value for it (else Streamlit
    warns that both were given; the kept state wins either way)."""
    return None if key in st.session_state else value


def _custom() -> dict[str, dict[str, Any]]:
    if CUSTOM_KEY not in st.session_state:
        st.session_state[CUSTOM_KEY] = {"gpu": {}, "model": {}, "workload": {}}
    store: dict[str, dict[str, Any]] = st.session_state[CUSTOM_KEY]
    return store


def _remember_uploads() -> None:
    """Uploaded specs are kept as files (uploads.spec_file_from_upload) so that a Scenario
    names them by path like any user spec file; the sidebar lists them by their spec's name."""
    store = _custom()
    with st.sidebar.expander("Your own specs (JSON/TOML)"):
        st.caption("Fields of HardwareSpec, ModelSpec or Workload; parsed as data only.")
        kinds = ("json", "toml")
        gpu = upload("GPU spec", kinds, uploads.hardware_file_from_upload, key="upload.gpu")
        model = upload("Model spec (target or drafter)", kinds, uploads.model_file_from_upload,
                       key="upload.model")  # fmt: skip
        wl = upload("Workload spec", kinds, uploads.workload_file_from_upload,
                    key="upload.workload")  # fmt: skip
        for kind, found in (("gpu", gpu), ("model", model), ("workload", wl)):
            if found is not None:
                spec, path = found
                store[kind][f"{spec.name} (uploaded)"] = (path, spec)
        trace = upload("Acceptance trace (spectune.trace/v1 .jsonl or .jsonl.gz)", ("jsonl", "gz"),
                       acceptance_trace, key="upload.trace")  # fmt: skip
        if trace is not None:
            key, model, label = trace
            data.register_trace(key, model, label)
            store["trace"] = {"key": key, "label": label}


def scenario_sidebar() -> tuple[Scenario, str]:
    """GPU, target, drafter, TP and workload pickers (presets plus uploaded specs): the
    Scenario they name, and the key of the uploaded acceptance trace in use ('' : none)."""
    _remember_uploads()
    store = _custom()
    sb = st.sidebar
    # choice -> (the name a Scenario holds: preset name or spec file, the spec)
    gpus = {**{n: (n, HARDWARE_PRESETS[n]) for n in sorted(HARDWARE_PRESETS)}, **store["gpu"]}
    models = {**{n: (n, MODEL_PRESETS[n]) for n in sorted(MODEL_PRESETS)}, **store["model"]}
    workloads = {**{n: (n, WORKLOAD_PRESETS[n]) for n in sorted(WORKLOAD_PRESETS)},
                 **store["workload"]}  # fmt: skip
    targets = [n for n, (_, m) in models.items() if not m.is_head]
    d = data.DEFAULT_SCENARIO
    k = SCENARIO_PREFIX
    gpu = sb.selectbox("GPU", list(gpus), key=k + "gpu",
                       index=initial(k + "gpu", list(gpus).index(d.gpu)))  # fmt: skip
    target = sb.selectbox("Target model", targets, key=k + "target",
                          index=initial(k + "target", targets.index(d.target)))  # fmt: skip
    gpu = gpu if gpu in gpus else d.gpu  # a kept choice that is no option any more
    target = target if target in targets else d.target
    tm = models[target][1]
    heads = [n for n, (_, m) in models.items() if m.is_head and compatible(tm, m)]
    smaller = [n for n, (_, m) in models.items()
               if not m.is_head and n != target
               and m.total_params() < tm.total_params() and compatible(tm, m)]  # fmt: skip
    drafters = [*heads, *smaller, NO_DRAFTER_CHOICE]
    preferred = f"eagle3-{tm.name}"
    default = drafters.index(preferred) if preferred in drafters else 0
    dkey = f"{k}drafter.{target}"
    drafter = sb.selectbox("Drafter", drafters, key=dkey, index=initial(dkey, default))
    tp = sb.select_slider(
        "Tensor parallel GPUs", TP_SIZES, key=k + "tp", value=initial(k + "tp", 1)
    )
    drafter = drafter if drafter in drafters else drafters[default]
    wl = sb.selectbox("Workload", list(workloads), key=k + "workload",
                      index=initial(k + "workload", list(workloads).index(d.workload)))  # fmt: skip
    wl = wl if wl in workloads else d.workload
    trace = store.get("trace") or {}
    use_trace = bool(trace) and sb.toggle("Acceptance from the uploaded trace", value=True,
                                          key=k + "use_trace", help=trace.get("label"))  # fmt: skip
    scenario = Scenario(
        target=models[target][0],
        drafter=NO_DRAFTER if drafter == NO_DRAFTER_CHOICE else models[drafter][0],
        gpu=gpus[gpu][0],
        tp=int(tp),
        workload=workloads[wl][0],
    )
    return scenario, trace["key"] if use_trace else ""


def scenario() -> Scenario:
    """The scenario the app's sidebar picked (or the defaults when a page runs alone)."""
    s = st.session_state.get(SCENARIO_KEY)
    return s if isinstance(s, Scenario) else data.DEFAULT_SCENARIO


def trace() -> str:
    """The key of the uploaded acceptance trace the sidebar uses ('' : the workload's)."""
    key = st.session_state.get(TRACE_KEY)
    return key if isinstance(key, str) else ""


def planned() -> plans.Plan | None:
    """The plans.Plan the Planner page shows (None before it showed one)."""
    found = st.session_state.get(PLAN_KEY)
    return found if isinstance(found, plans.Plan) else None


def options_with(choices: Sequence[int], key: str) -> list[int]:
    """A slider's choices plus the value another page put in its state (a bucket's batch or
    scored context that is not one of the usual choices)."""
    held = st.session_state.get(key)
    extra = {int(held)} if isinstance(held, int) and held > 0 else set()
    return sorted(set(choices) | extra)


def open_in_whatif(batch: int, context: int) -> None:
    """Switch to What-if with the planned table's policy at (batch, context)."""
    st.session_state["whatif.source"] = PLANNED_SOURCE
    st.session_state["whatif.batch"] = int(batch)
    st.session_state["whatif.context"] = int(context)
    st.switch_page(WHATIF_PAGE)


def policy_controls(prefix: str, default: TreePolicy = data.SGLANG_DEFAULT) -> TreePolicy | None:
    """Speculation on/off and the policy sliders; a note when the values had to be cut."""
    on = st.toggle("Speculate", value=True, key=f"{prefix}.on")
    c1, c2, c3 = st.columns(3)
    builder = c1.radio("Tree builder", ("dynamic-topk", "static"), horizontal=True,
                       index=0 if default.builder == "dynamic-topk" else 1, key=f"{prefix}.builder",
                       help="dynamic-topk: EAGLE-2 expansion with rerank; static: Sequoia's optimal shape")  # fmt: skip
    depth = c1.slider("Depth (draft steps)", 1, 12, default.depth, key=f"{prefix}.depth")
    topk = c2.slider("Top-k per node", 1, 16, default.topk, key=f"{prefix}.topk")
    budget = c2.slider("Verify budget (tree tokens, root included)", 2, 256, default.budget,
                       key=f"{prefix}.budget")  # fmt: skip
    prune = c3.select_slider("Prune threshold (path probability)", PRUNE_THRESHOLDS,
                             value=default.prune_threshold, key=f"{prefix}.prune")  # fmt: skip
    graft = c3.slider("Graft budget (retrieved tokens)", 0, 64, default.graft_budget,
                      key=f"{prefix}.graft")  # fmt: skip
    shared = c3.checkbox("Shared verify budget (ECHO)", value=default.shared_budget,
                         key=f"{prefix}.shared",
                         help="ECHO super-tree: the batch shares batch x (budget - 1) draft "
                         "tokens, given to the most likely accepted candidates of any request; "
                         "no engine runs it yet")  # fmt: skip
    if not on:
        return None
    policy, note = data.make_policy(builder, depth, topk, budget, float(prune), graft, shared)
    if note:
        st.info(note)
    return policy


# ---- cached computations ------------------------------------------------------------------------


@st.cache_resource(show_spinner="Reading the trace...", max_entries=4)
def acceptance_trace(name: str, blob: bytes) -> tuple[str, Any, str]:
    """Parsed once per file content (a trace replay model takes seconds to build)."""
    return uploads.acceptance_trace_from_upload(name, blob)


@st.cache_data(show_spinner=False, max_entries=512)
def what_if(s: Scenario, policy: TreePolicy | None, batch: int, context: int,
            trace: str = "") -> data.WhatIf:  # fmt: skip
    return data.what_if(s, policy, batch, context, trace)


@st.cache_data(show_spinner=False, max_entries=256)
def bucket_score(s: Scenario, policy: TreePolicy | None, batch: tuple[int, int],
                 context: tuple[int, int], trace: str = "") -> data.BucketScore:  # fmt: skip
    return data.bucket_score(s, policy, batch, context, trace)


@st.cache_data(show_spinner=False, max_entries=128)
def sample_tree(s: Scenario, policy: TreePolicy, seed: int, trace: str = "") -> data.SampleTree:
    return data.sample_tree(s, policy, seed, trace)


@st.cache_data(show_spinner=False, max_entries=64)
def scenario_label(s: Scenario, trace: str = "") -> str:
    return data.scenario_label(s, trace)


def pair_warnings(s: Scenario, trace: str = "") -> None:
    """One warning per note about the scenario's (target, drafter) pair (data.pair_notes: the
    nearest acceptance preset used, a workload fitted for another pair); none while an uploaded
    trace gives the acceptance."""
    if not trace:
        for note in data.pair_notes(s):
            st.warning(f"Acceptance: {note}.")


@st.cache_data(show_spinner="Planning...", max_entries=16)
def run_plan(s: Scenario, batch_edges: tuple[int, ...], context_edges: tuple[int, ...],
             trials: int, seed: int, multi_objective: bool, max_step_ms: float | None,
             trace: str = "") -> plans.Plan:  # fmt: skip
    return plans.run_plan(s, batch_edges=batch_edges, context_edges=context_edges, trials=trials,
                         seed=seed, multi_objective=multi_objective, max_step_ms=max_step_ms,
                         trace=trace)  # fmt: skip


@st.cache_data(show_spinner=False, ttl=10)
def study_prefixes(url: str) -> list[str]:
    return plans.study_prefixes(url)


@st.cache_data(show_spinner="Reading the studies...", ttl=10, max_entries=8)
def load_study_plan(url: str, prefix: str) -> plans.Plan:
    return plans.load_study_plan(url, prefix)


@st.cache_data(show_spinner=False, max_entries=64)
def batch_curves(s: Scenario, policies: dict[str, TreePolicy | None],
                 batches: tuple[int, ...], context: int, trace: str = "") -> dict[str, Any]:  # fmt: skip
    return data.batch_curves(s, policies, batches, context, trace)


@st.cache_data(show_spinner=False, max_entries=64)
def table_curve(s: Scenario, table: Any, batches: tuple[int, ...], context: int,
                trace: str = "") -> Any:  # fmt: skip
    return data.table_curve(s, table, batches, context, trace)


@st.cache_data(show_spinner="Exporting...", max_entries=16)
def engine_exports(table: Any) -> tuple[dict[str, Any], str]:
    return plans.engine_exports(table)


@st.cache_data(show_spinner="Simulating...", max_entries=32)
def load_sweep(s: Scenario, policy: Any, qps: tuple[float, ...],
               settings: loadtest.LoadSettings, trace: str = "") -> list[dict[str, Any]]:  # fmt: skip
    return loadtest.sweep(s, policy, qps, settings, trace)


@st.cache_data(show_spinner="Simulating the trace...", max_entries=8)
def trace_replay(s: Scenario, policy: Any, arrivals: Any,
                 settings: loadtest.LoadSettings, trace: str = "") -> dict[str, Any]:  # fmt: skip
    return loadtest.replay(s, policy, arrivals, settings, trace)


@st.cache_data(show_spinner=False, ttl=30)
def measurements(folder: str) -> list[artifacts.Loaded]:
    from pathlib import Path

    return artifacts.read_measurements(Path(folder))


@st.cache_data(show_spinner=False, max_entries=64)
def validation_rows(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return artifacts.validation_rows(doc, name)


@st.cache_data(show_spinner=False, ttl=30)
def gate(folder: str, extra: dict[str, Any]) -> artifacts.Gate:
    from pathlib import Path

    return artifacts.gate(Path(folder), extra)


@st.cache_data(show_spinner=False, ttl=30)
def benchmarks(folder: str) -> list[artifacts.Loaded]:
    from pathlib import Path

    return artifacts.read_benchmarks(Path(folder))
