"""Planner: run the policy search here (a small `spectune plan`: the same objective, the same
predicted tokens/s) or load a policy file; the policy per batch bucket, predicted served tok/s
incl. prefill against batch size next to the engine defaults and no speculation (with each
bucket's recorded score), one bucket's score at its points (and a link to it in What-if), the
Pareto front of a multi-objective study, and the files to download (the ones `spectune export`
writes). A table is shown for the Scenario it was planned for, and the page says where the
sidebar differs."""

from __future__ import annotations

import json

import streamlit as st

from spectune.dashboards import charts, data, plans, ui, uploads
from spectune.specs.errors import SpecError
from spectune.specs.io import parse_int_list

scn, trace = ui.scenario(), ui.trace()
st.title("Planner")

SOURCES = ("Run a plan here", "Load a policy file", "Open a stored study")
source = st.radio("Policy table", SOURCES, horizontal=True, key="planner.source")

plan: plans.Plan | None = None
if source == "Run a plan here":
    with ui.friendly_errors("scenario"):
        st.caption("Closed-form objective of `spectune plan`, one Optuna study per bucket: "
                   + ui.scenario_label(scn, trace))  # fmt: skip
        ui.pair_warnings(scn, trace)
    with st.form("planner.form"):
        c1, c2, c3 = st.columns(3)
        batch_text = c1.text_input("Batch bucket upper edges",
                                   ui.initial("planner.batch_edges", "1,2,4,8,16,32,64,128,256"),
                                   key="planner.batch_edges")  # fmt: skip
        ctx_text = c1.text_input("Context bucket upper edges",
                                 ui.initial("planner.context_edges", "32768"),
                                 key="planner.context_edges")  # fmt: skip
        trials = c2.slider("Trials per bucket", 4, 64, ui.initial("planner.trials", 8), key="planner.trials",
                           help="the references (off, SGLang and EAGLE defaults) come first")  # fmt: skip
        seed = int(c2.number_input("Seed", 0, 1_000_000, ui.initial("planner.seed", 0),
                                   key="planner.seed") or 0)  # fmt: skip
        multi = c3.checkbox("Multi-objective (served tok/s vs step latency)", key="planner.multi")
        max_ms = c3.number_input("Max step latency, ms (0: none)", 0.0, 1000.0,
                                 ui.initial("planner.max_ms", 0.0), key="planner.max_ms")  # fmt: skip
        st.form_submit_button("Run plan")  # the form's values change only when it is submitted
    batch_text, ctx_text = batch_text or "", ctx_text or ""  # None only while state is kept
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
    url = st.text_input("Storage URL", ui.initial("planner.storage", "sqlite:///spectune.db"),
                        key="planner.storage",
                        help="sqlite:///FILE.db or postgresql://USER:PW@HOST/DB") or ""  # fmt: skip
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
    held = st.session_state.get(ui.LOADED_KEY)
    if table is not None:
        plan = st.session_state[ui.LOADED_KEY] = plans.Plan(table)
    elif isinstance(held, plans.Plan):
        plan = held
        st.caption("Showing the policy file loaded before; upload another to replace it.")
    else:
        st.info("Upload a policy.json to see its table, curves and engine exports.")

if plan is not None:
    st.session_state[ui.PLAN_KEY] = plan  # the Load page can simulate the table shown here
    table = plan.table
    pscn, note = plans.scenario_for_table(table, scn)
    if note:
        st.warning(note)
    with ui.friendly_errors("scenario"):
        st.caption(f"Table for {ui.scenario_label(pscn, trace)}")
        ui.pair_warnings(pscn, trace)
    differs = plans.scenario_changes(pscn, scn)
    if differs:
        st.info(f"This table was planned for another scenario than the sidebar's ({differs}); "
                "its curves and exports are for the table's.")  # fmt: skip

    st.subheader("Policy per bucket")
    ui.table(plans.table_rows(table), plans.TABLE_COLUMNS, key="planner.table",
             help=plans.TABLE_HELP)  # fmt: skip

    st.subheader(f"Predicted {data.SERVED_TOK_S} against batch size")
    ctx_ranges = sorted({b.context for b in table.buckets})
    ctx_labels = [f"{lo}-{hi} (scored at {(lo + hi + 1) // 2})" for lo, hi in ctx_ranges]
    ctx_pick = ctx_labels[0]
    if len(ctx_labels) > 1:
        ctx_pick = st.select_slider(
            "Context bucket", ctx_labels, value=ctx_labels[0], key="planner.context",
            help="the curves are drawn at the context each bucket is scored at: the middle of "
            "its range, as `spectune plan` scores it",
        )  # fmt: skip
    ctx_range = ctx_ranges[ctx_labels.index(ctx_pick)]
    context = (ctx_range[0] + ctx_range[1] + 1) // 2
    top = max(b.batch[1] for b in table.buckets)
    batches = tuple(sorted({b for b in ui.BATCH_SIZES if b <= top}
                           | {x for b in table.buckets for x in b.batch}))  # fmt: skip
    with ui.friendly_errors("curves"):
        curves = {"planned policy": ui.table_curve(pscn, table, batches, context, trace)}
        curves.update(ui.batch_curves(pscn, dict(data.REFERENCE_POLICIES), batches, context,
                                      trace))  # fmt: skip
        ui.chart(charts.batch_chart(batches, curves, data.SERVED_TOK_S,
                                    plans.bucket_segments(table, ctx_range)),
                 key="planner.chart")  # fmt: skip
        st.caption(
            f"Context {context} tokens. Lines: {data.SERVED_TOK_S} at each batch size with the "
            "policy the table picks for it and with the references; grey bars: each bucket's "
            f"score as the table records it ({data.BUCKET_SCORE_HELP}). {data.SERVED_TOK_S}: "
            f"{data.SERVED_HELP}."
        )
        curve_cols = {"batch": ("batch", "%d"),
                      **{k: (f"{k}, {data.SERVED_TOK_S}", "%.0f") for k in curves}}  # fmt: skip
        ui.table([{"batch": b, **{k: float(v[i]) for k, v in curves.items()}}
                  for i, b in enumerate(batches)], curve_cols, key="planner.curves")  # fmt: skip

    st.subheader("One bucket")
    names = [plans.bucket_name(b.batch, b.context) for b in table.buckets]
    pick = names.index(st.selectbox("Bucket", names, key="planner.bucket"))
    chosen = table.buckets[pick]
    with ui.friendly_errors("bucket"):
        score = ui.bucket_score(pscn, chosen.policy, chosen.batch, chosen.context, trace)
        st.markdown(f"Policy **{data.policy_label(chosen.policy)}**; {data.SERVED_TOK_S}:")
        m = st.columns(3)
        m[0].metric(data.BUCKET_SCORE_FILE,
                    f"{chosen.predicted.tokens_per_s:,.0f}" if chosen.predicted else "none",
                    help=data.BUCKET_SCORE_HELP)  # fmt: skip
        m[1].metric(data.BUCKET_SCORE_HERE, f"{score.score:,.0f}",
                    help=f"{data.BUCKET_SCORE_HELP}, from the objective of this scenario now "
                    "(differs from the file's only when the file was planned with other specs or "
                    "code)")  # fmt: skip
        m[2].metric("speedup vs no speculation", f"{score.speedup:.2f}x")
        ui.table(
            [{"batch": b, "context": c, "served": s_, "decode": d_}
             for (b, c), s_, d_ in zip(score.points, score.served_tokens_per_s,
                                       score.decode_tokens_per_s, strict=True)],
            {"batch": ("batch", "%d"), "context": ("context, tokens", "%d"),
             "served": (data.SERVED_TOK_S, "%.0f"), "decode": (data.DECODE_TOK_S, "%.0f")},
            key="planner.points",
        )  # fmt: skip
        if st.button("Open this bucket in What-if", key="planner.open_whatif",
                     help="What-if with the table's policy at the bucket's largest batch and "
                     "its scored context"):  # fmt: skip
            ui.open_in_whatif(chosen.batch[1], score.points[0][1])

    st.subheader("Pareto front")
    rows = plans.pareto_rows(plan.results)
    if rows:
        with ui.friendly_errors("Pareto front"):
            ui.chart(charts.pareto_chart(rows, plans.chosen_points(plan.results, pscn, trace),
                                         f"{data.SERVED_TOK_S} (bucket score)"),
                     key="planner.pareto_chart")  # fmt: skip
        ui.table(rows, plans.PARETO_COLUMNS, key="planner.pareto")
    else:
        st.info("Tick 'Multi-objective' and run the plan to see each bucket's Pareto front "
                f"of {data.SERVED_TOK_S} against step latency.")  # fmt: skip

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
