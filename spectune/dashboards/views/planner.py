"""Planner: run the policy search here (a small `spectune plan`: the same objective, the same
predicted tokens/s) or load a policy file; the policy per batch bucket, predicted tokens/s
against batch size next to the engine defaults and no speculation, the Pareto front of a
multi-objective study, and the files to download (the ones `spectune export` writes). A table
is shown for the Scenario it was planned for, and the page says where the sidebar differs."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from spectune.dashboards import data, plans, plots, ui, uploads
from spectune.specs.errors import SpecError
from spectune.specs.io import parse_int_list

PLAN_KEY = "planner.result"

scn, trace = ui.scenario(), ui.trace()
st.title("Planner")

SOURCES = ("Run a plan here", "Load a policy file", "Open a stored study")
source = st.radio("Policy table", SOURCES, horizontal=True, key="planner.source")

plan: plans.Plan | None = None
if source == "Run a plan here":
    with ui.friendly_errors("scenario"):
        st.caption("Closed-form objective of `spectune plan`, one Optuna study per bucket: "
                   + ui.scenario_label(scn, trace))  # fmt: skip
    with st.form("planner.form"):
        c1, c2, c3 = st.columns(3)
        batch_text = c1.text_input("Batch bucket upper edges", "1,2,4,8,16,32,64,128,256",
                                   key="planner.batch_edges")  # fmt: skip
        ctx_text = c1.text_input("Context bucket upper edges", "32768", key="planner.context_edges")
        trials = c2.slider("Trials per bucket", 4, 64, 8, key="planner.trials",
                           help="the references (off, SGLang and EAGLE defaults) come first")  # fmt: skip
        seed = int(c2.number_input("Seed", 0, 1_000_000, 0, key="planner.seed"))
        multi = c3.checkbox("Multi-objective (tokens/s vs step latency)", key="planner.multi")
        max_ms = c3.number_input("Max step latency, ms (0: none)", 0.0, 1000.0, 0.0,
                                 key="planner.max_ms")  # fmt: skip
        st.form_submit_button("Run plan")  # the form's values change only when it is submitted
    try:
        batch_edges = tuple(parse_int_list(batch_text, "batch bucket edges"))
        ctx_edges = tuple(parse_int_list(ctx_text, "context bucket edges"))
    except SpecError as e:
        st.error(str(e))
    else:
        with ui.friendly_errors("plan"):  # cached: runs again only when an input changed
            plan = ui.run_plan(
                scn, batch_edges, ctx_edges, int(trials), seed, bool(multi),
                float(max_ms) if max_ms else None, trace,
            )  # fmt: skip
elif source == "Open a stored study":
    st.caption("The Optuna storage of `spectune plan --storage URL` (add --multi-objective "
               "for a Pareto front); the policies are chosen from its trials by the planner's rule.")  # fmt: skip
    url = st.text_input("Storage URL", "sqlite:///spectune.db", key="planner.storage",
                        help="sqlite:///FILE.db or postgresql://USER:PW@HOST/DB")  # fmt: skip
    with ui.friendly_errors("storage"):
        prefixes = ui.study_prefixes(url)
        if not prefixes:
            st.info(f"No spectune plan studies in {url.split('@')[-1]}.")
        else:
            prefix = st.selectbox("Plan (study prefix)", prefixes, key="planner.study")
            plan = ui.load_study_plan(url, str(prefix))
else:
    table = ui.upload("Policy file (policy.json from `spectune plan`)", ("json",),
                      uploads.policy_from_upload, key="planner.upload")  # fmt: skip
    if table is None:
        st.info("Upload a policy.json to see its table, curves and engine exports.")
    else:
        plan = plans.Plan(table)

if plan is not None:
    st.session_state[PLAN_KEY] = plan  # the Load page can simulate the table shown here
    table = plan.table
    pscn, note = plans.scenario_for_table(table, scn)
    if note:
        st.warning(note)
    with ui.friendly_errors("scenario"):
        st.caption(f"Table for {ui.scenario_label(pscn, trace)}")
    differs = plans.scenario_changes(pscn, scn)
    if differs:
        st.info(f"This table was planned for another scenario than the sidebar's ({differs}); "
                "its curves and exports are for the table's.")  # fmt: skip

    st.subheader("Policy per bucket")
    st.dataframe(pd.DataFrame(plans.table_rows(table)), hide_index=True, key="planner.table")

    st.subheader("Predicted tokens/s against batch size")
    ctx_ranges = sorted({b.context for b in table.buckets})
    contexts = [c for c in ui.CONTEXTS if any(lo <= c <= hi for lo, hi in ctx_ranges)]
    # default: the context the first context bucket was tuned at (the middle of its range)
    mid = (ctx_ranges[0][0] + ctx_ranges[0][1] + 1) // 2
    contexts = contexts or [mid]
    start = min(contexts, key=lambda c: abs(c - mid))
    context = int(st.select_slider("Context length", contexts, value=start, key="planner.context",
                                   help="the planner scores each bucket at the middle of its "
                                   "context range"))  # fmt: skip
    top = max(b.batch[1] for b in table.buckets)
    batches = tuple(sorted({b for b in ui.BATCH_SIZES if b <= top}
                           | {x for b in table.buckets for x in b.batch}))  # fmt: skip
    with ui.friendly_errors("curves"):
        curves = {"planned policy": ui.table_curve(pscn, table, batches, context, trace)}
        curves.update(ui.batch_curves(pscn, dict(data.REFERENCE_POLICIES), batches, context,
                                      trace))  # fmt: skip
        ui.show(plots.batch_figure(batches, curves, context))
        st.dataframe(pd.DataFrame({"batch": batches, **curves}), hide_index=True,
                     key="planner.curves")  # fmt: skip

    st.subheader("Pareto front")
    rows = plans.pareto_rows(plan.results)
    if rows:
        with ui.friendly_errors("Pareto front"):
            ui.show(plots.pareto_figure(rows, plans.chosen_points(plan.results, pscn, trace)))
        st.dataframe(pd.DataFrame(rows), hide_index=True, key="planner.pareto")
    else:
        st.info("Tick 'Multi-objective' and run the plan to see each bucket's Pareto front "
                "of tokens/s against step latency.")  # fmt: skip

    st.subheader("Downloads")
    st.download_button("policy.json", json.dumps(table.to_dict(), indent=2) + "\n",
                       file_name="policy.json", mime="application/json", key="planner.dl.policy")  # fmt: skip
    exports, export_note = ui.engine_exports(table)
    if export_note:
        st.caption(export_note)
    cols = st.columns(len(exports))
    for col, (engine, exp) in zip(cols, exports.items(), strict=True):
        with col:
            st.markdown(f"**{engine}**")
            if isinstance(exp, str):
                st.error(f"{engine} cannot take this table: {exp}")
                continue
            for name, text in exp.files.items():
                st.download_button(name, text, file_name=name, key=f"planner.dl.{engine}.{name}")
            for a in exp.approximations:
                st.caption(f"approximated: {a}")
