"""What-if: one scenario, one policy, one batch size and context. Where the time of a
speculative step goes, what it yields per step, and the tree it verifies. Decode-only on
purpose (one iteration of running requests), and labelled so."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from spectune.dashboards import data, plots, ui

scn, trace = ui.scenario(), ui.trace()
st.title("What-if")
with ui.friendly_errors("scenario"):
    st.caption(ui.scenario_label(scn, trace))
st.caption(data.DECODE_ONLY_NOTE)

c1, c2 = st.columns(2)
batch = int(c1.select_slider("Batch size (running sequences)", ui.BATCH_SIZES, value=8,
                             key="whatif.batch"))  # fmt: skip
context = int(c2.select_slider("Context length (cached tokens per sequence)", ui.CONTEXTS,
                               value=4096, key="whatif.context"))  # fmt: skip

st.subheader("Policy")
with ui.friendly_errors("policy"):
    policy = ui.policy_controls("whatif")
    res = ui.what_if(scn, policy, batch, context, trace)

    m = st.columns(4)
    m[0].metric("tokens/s", f"{res.tokens_per_s:,.0f}",
                help="decode-only: batch x tokens per step / step time")  # fmt: skip
    m[1].metric("speedup vs no speculation", f"{res.speedup:.2f}x",
                help=f"no speculation: {res.off_tokens_per_s:,.0f} tokens/s")  # fmt: skip
    m[2].metric("expected tokens per step", f"{res.expected_tokens:.2f}",
                help="accepted draft tokens + the bonus token, per sequence")  # fmt: skip
    m[3].metric("step time", f"{res.step_s * 1e3:.2f} ms",
                help=f"no speculation: {res.off_step_s * 1e3:.2f} ms")  # fmt: skip

    left, right = st.columns(2)
    with left:
        ui.show(plots.breakdown_figure(res.phases_s, "one iteration of the batch, by phase"))
    with right:
        ui.show(plots.breakdown_figure(
            res.verify_breakdown_s,
            f"verify pass ({res.tree_tokens:g} tokens x {batch} sequences), by operator class",
        ))  # fmt: skip

    st.markdown("**Predicted numbers**")
    st.dataframe(pd.DataFrame(res.table_rows()), hide_index=True, key="whatif.numbers")
    if res.draft_steps_s:
        st.markdown("**Drafting phase by step**")
        st.dataframe(
            pd.DataFrame([{"step": k, "ms": v * 1e3} for k, v in res.draft_steps_s.items()]),
            hide_index=True,
            key="whatif.draft",
        )
    st.markdown("**Verify pass by operator class**")
    st.dataframe(
        pd.DataFrame([{"operator": k, "ms": v * 1e3} for k, v in res.verify_breakdown_s.items()]),
        hide_index=True,
        key="whatif.operators",
    )

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
