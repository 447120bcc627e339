"""Validation: the predictions against what the executor measured on a GPU (measurement JSONs
under measurements/, or uploaded). Two views: the CI gate's own re-prediction (`spectune
check`: verify latency and speedup with the measured accepted length and the committed
calibration), and the planner's end-to-end closed form (with the acceptance model)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from spectune.dashboards import artifacts, data, plots, ui

QUANTITIES = {
    "tokens_per_s": "tokens/s",
    "step_ms": "step time, ms",
    "speedup": "speedup",
    "tokens_per_step": "tokens per step",
}

st.title("Validation")
folder = artifacts.measurements_dir()
st.caption(f"Predicted against measured, from {folder}/")

loaded = list(ui.measurements(str(folder)))
with st.expander("Add a measurement file"):
    doc = ui.upload("Measurement JSON (spectune.measurement/v1, from `spectune execute`)", ("json",),
                    artifacts.measurement_from_upload, key="validation.upload")  # fmt: skip
    if doc is not None:
        loaded.append(artifacts.Loaded("uploaded.json", doc))

for bad in (x for x in loaded if x.doc is None):
    st.warning(f"skipped {bad.error}")
docs = {x.name: x.doc for x in loaded if x.doc is not None}
if not docs:
    st.info(
        f"No measurements yet. Run `spectune execute` on a GPU host and commit its JSON under "
        f"{folder}/, or upload one above."
    )
    st.stop()

gate_tab, planner_tab = st.tabs(["CI gate (spectune check)", "Planner end to end"])
with gate_tab, ui.friendly_errors("spectune check"):
    uploaded = {k: v for k, v in docs.items() if k == "uploaded.json"}
    g = ui.gate(str(folder), uploaded)
    c = st.columns(3)
    c[0].metric("verdict", "PASS" if g.passed else "FAIL", help="`spectune check` tolerances: 10 %")
    c[1].metric("verify-latency MAPE", f"{100 * g.verify_mape:.1f} %")
    c[2].metric("worst speedup error", f"{100 * g.worst_speedup_error:.1f} %")
    kind = st.radio("Check", ("speedup", "verify latency"), horizontal=True, key="validation.check")
    rows = [r for r in g.rows if r["check"] == kind]
    if rows:
        c1, _ = st.columns([1, 1])
        with c1:
            ui.show(
                plots.scatter_figure(rows, "", kind + (", ms" if kind == "verify latency" else ""))
            )
    st.dataframe(pd.DataFrame(list(g.rows)), hide_index=True, key="validation.gate")

with planner_tab:
    st.caption(f"The planner's closed form for each measurement's scenario. {data.DECODE_ONLY_NOTE}"
               ", as the executor measures.")  # fmt: skip
    rows = []
    for name, d in docs.items():
        assert d is not None
        with ui.friendly_errors(name):
            rows += ui.validation_rows(d, name)
    if rows:
        q = st.radio("Quantity", list(QUANTITIES), format_func=QUANTITIES.__getitem__,
                     horizontal=True, key="validation.quantity")  # fmt: skip
        c1, c2 = st.columns([1, 1])
        with c1:
            ui.show(plots.scatter_figure(rows, q, QUANTITIES[q]))
        with c2:
            errs = pd.Series([r[f"error_{q}_pct"] for r in rows], dtype=float).abs()
            st.metric(f"mean |error| of {QUANTITIES[q]}", f"{errs.mean():.1f} %")
            st.metric(f"worst |error| of {QUANTITIES[q]}", f"{errs.max():.1f} %")
        st.dataframe(pd.DataFrame(rows), hide_index=True, key="validation.table")
