"""What-if: one scenario, one policy, one batch size and context. Both kinds of tokens/s
(served tok/s incl. prefill, as the Planner and `spectune plan` predict it; decode tok/s, one
iteration of running requests), where the time of a decoding iteration goes, what it yields
per step, and the tree it verifies. The policy is set with the sliders or taken from the
Planner page's table (its bucket for this batch and context, whose recorded score the page
shows next to the same score computed here)."""

from __future__ import annotations

import streamlit as st

from spectune.dashboards import data, plans, plots, ui

SET_BELOW = "Set below"

scn, trace = ui.scenario(), ui.trace()
st.title("What-if")

plan = ui.planned()
sources = [SET_BELOW] + ([ui.PLANNED_SOURCE] if plan is not None else [])
if st.session_state.get("whatif.source") not in sources:
    st.session_state.pop("whatif.source", None)
source = st.radio("Policy", sources, horizontal=True, key="whatif.source",
                  help="the sliders below, or the policy the Planner page's table picks for "
                  "this batch and context")  # fmt: skip
if source == ui.PLANNED_SOURCE and plan is not None:
    sidebar = scn
    scn, note = plans.scenario_for_table(plan.table, sidebar)  # predict what it was planned for
    if note:
        st.warning(note)
    differs = plans.scenario_changes(scn, sidebar)
    if differs:
        st.warning(f"Predicting for the planned table's scenario, not the sidebar's: {differs}.")
with ui.friendly_errors("scenario"):
    st.caption(ui.scenario_label(scn, trace))
    ui.pair_warnings(scn, trace)

c1, c2 = st.columns(2)
batch = int(c1.select_slider("Batch size (running sequences)",
                             ui.options_with(ui.BATCH_SIZES, "whatif.batch"),
                             value=ui.initial("whatif.batch", 8), key="whatif.batch"))  # fmt: skip
context = int(c2.select_slider("Context length (cached tokens per sequence)",
                               ui.options_with(ui.CONTEXTS, "whatif.context"),
                               value=ui.initial("whatif.context", 4096),
                               key="whatif.context"))  # fmt: skip

st.subheader("Policy")
with ui.friendly_errors("policy"):
    if source == ui.PLANNED_SOURCE and plan is not None:
        bucket = next((b for b in plan.table.buckets if b.contains(batch, context)), None)
        policy = plan.table.lookup(batch, context)
        if bucket is None:
            st.info(f"No bucket of the table holds batch {batch} at context {context}; its "
                    f"nearest bucket's policy is used: {data.policy_label(policy)}.")  # fmt: skip
        else:
            name = plans.bucket_name(bucket.batch, bucket.context)
            score = ui.bucket_score(scn, bucket.policy, bucket.batch, bucket.context, trace)
            st.markdown(f"**{data.policy_label(policy)}**, the table's policy for its bucket "
                        f"{name}; the bucket's {data.SERVED_TOK_S}:")  # fmt: skip
            b = st.columns(3)
            b[0].metric(data.BUCKET_SCORE_FILE,
                        f"{bucket.predicted.tokens_per_s:,.0f}" if bucket.predicted else "none",
                        help=data.BUCKET_SCORE_HELP)  # fmt: skip
            b[1].metric(data.BUCKET_SCORE_HERE, f"{score.score:,.0f}",
                        help=data.BUCKET_SCORE_HELP + "; "
                        + ", ".join(f"batch {p[0]}: {v:,.0f}" for p, v in
                                    zip(score.points, score.served_tokens_per_s, strict=True)))  # fmt: skip
            b[2].metric("bucket speedup", f"{score.speedup:.2f}x",
                        help="served, over no speculation")  # fmt: skip
    else:
        policy = ui.policy_controls("whatif")
    res = ui.what_if(scn, policy, batch, context, trace)

    st.subheader(f"At batch {batch}, context {context}")
    m = st.columns(5)
    m[0].metric(data.SERVED_TOK_S, f"{res.served_tokens_per_s:,.0f}",
                help=f"{data.SERVED_HELP}; the Planner's curves at this batch and context. "
                f"No speculation: {res.off_served_tokens_per_s:,.0f}")  # fmt: skip
    m[1].metric("speedup (served)", f"{res.speedup:.2f}x",
                help=f"over no speculation; decode: {res.decode_speedup:.2f}x")  # fmt: skip
    m[2].metric(data.DECODE_TOK_S, f"{res.decode_tokens_per_s:,.0f}",
                help=f"{data.DECODE_HELP}. No speculation: {res.off_decode_tokens_per_s:,.0f}")  # fmt: skip
    m[3].metric("expected tokens per step", f"{res.expected_tokens:.2f}",
                help="accepted draft tokens + the bonus token, per sequence")  # fmt: skip
    m[4].metric("decode step time", f"{res.step_s * 1e3:.2f} ms",
                help=f"one iteration of {batch} sequences; no speculation: "
                f"{res.off_step_s * 1e3:.2f} ms; served step (with prefill turnover"
                f"{'' if res.served_batch == batch else f', {res.served_batch} sequences'}): "
                f"{res.served_step_s * 1e3:.2f} ms")  # fmt: skip
    if res.served_batch < batch:
        st.info(f"The KV cache holds {res.served_batch} requests at context {context}: served "
                f"tok/s runs that many, decode tok/s all {batch}.")  # fmt: skip
    st.caption(data.DECODE_ONLY_NOTE + ". The bars below are one decode iteration.")

    left, right = st.columns(2)
    with left:
        ui.show(plots.breakdown_figure(res.phases_s, "one decode iteration of the batch, by phase"))
    with right:
        ui.show(plots.breakdown_figure(
            res.verify_breakdown_s,
            f"verify pass ({res.tree_tokens:g} tokens x {batch} sequences), by operator class",
        ))  # fmt: skip

    st.markdown("**Predicted numbers**")
    ui.table(res.table_rows(), {"quantity": ("quantity", "%s"), "value": ("value", "%.4g"),
                                "unit": ("unit", "%s")}, key="whatif.numbers")  # fmt: skip
    if res.draft_steps_s:
        st.markdown("**Drafting phase by step**")
        ui.table([{"step": k, "ms": v * 1e3} for k, v in res.draft_steps_s.items()],
                 {"step": ("step", "%s"), "ms": ("time, ms", "%.3f")}, key="whatif.draft")  # fmt: skip
    st.markdown("**Verify pass by operator class**")
    ui.table([{"operator": k, "ms": v * 1e3} for k, v in res.verify_breakdown_s.items()],
             {"operator": ("operator class", "%s"), "ms": ("time, ms", "%.3f")},
             key="whatif.operators")  # fmt: skip

    st.subheader("Draft tree")
    if policy is None:
        st.info("Speculation is off: each step verifies the last token only.")
    else:
        seed = int(st.number_input("Tree sample (seed)", 0, 10_000, 0, key="whatif.seed"))
        sample = ui.sample_tree(scn, policy, seed, trace)
        grafted = int((sample.tree.source == 2).sum())
        st.caption(
            f"{sample.tree.num_nodes} nodes ({grafted} grafted from retrieval), depth "
            f"{sample.tree.max_depth}; this tree's expected tokens per step "
            f"{sample.expected_tokens:.2f} (the policy's mean: {res.expected_tokens:.2f}). "
            "Opacity: probability that the node lies on the accepted path."
        )
        ui.show(plots.tree_figure(sample.tree, sample.accept_prob, data.policy_label(policy)))
