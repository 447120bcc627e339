"""Validation: the planner's predictions against what the executor measured on a GPU
(measurement JSONs under measurements/, or uploaded): scatter with the y = x line, error table."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from spectune.dashboards import artifacts, plots, ui

QUANTITIES = {
    "tokens_per_s": "tokens/s",
    "step_ms": "step time, ms",
    "speedup": "speedup",
    "tokens_per_step": "tokens per step",
}

st.title("Validation")
folder = artifacts.measurements_dir()
st.caption(f"Predicted (closed-form cost model and acceptance) against measured, from {folder}/")

loaded = list(ui.measurements(str(folder)))
with st.expander("Add a measurement file"):
    doc = ui.upload("Measurement JSON (spectune.measurement/v1, from `spectune execute`)", ("json",),
                    artifacts.measurement_from_upload, key="validation.upload")  # fmt: skip
    if doc is not None:
        loaded.append(artifacts.Loaded("uploaded", doc))

for bad in (x for x in loaded if x.doc is None):
    st.warning(f"skipped {bad.error}")
docs = [x for x in loaded if x.doc is not None]
if not docs:
    st.info(
        f"No measurements yet. Run `spectune execute` on a GPU host and commit its JSON under "
        f"{folder}/, or upload one above."
    )
else:
    rows = []
    for x in docs:
        assert x.doc is not None
        with ui.friendly_errors(x.name):
            rows += ui.validation_rows(x.doc, x.name)
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
