"""Kernels: the Triton kernel benchmarks (benchmarks/bench_kernels.py --out, under
benchmarks/results/) as an interactive roofline against the measured device-to-device copy
bandwidth; other files of the folder are listed last, folded."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from spectune.dashboards import artifacts, charts, ui

st.title("Kernels")
folder = artifacts.benchmarks_dir()
st.caption(f"Tree attention against PyTorch paths, from {folder}/*.json")

loaded = list(ui.benchmarks(str(folder)))
with st.expander("Add a benchmark result"):
    doc = ui.upload("Benchmark JSON (python benchmarks/bench_kernels.py --out FILE)", ("json",),
                    artifacts.benchmark_from_upload, key="kernels.upload")  # fmt: skip
    if doc is not None:
        loaded.append(artifacts.Loaded("uploaded", doc))

docs = [x for x in loaded if x.doc is not None]
skipped = [x for x in loaded if x.doc is None]
if not docs:
    st.info(
        f"No kernel benchmark results yet. On a GPU host run "
        f"`python benchmarks/bench_kernels.py --out {folder}/kernels-CARD.json`, or upload one above."
    )
else:
    names = [x.name for x in docs]
    pick = st.selectbox("Result file", names, key="kernels.file")
    chosen = docs[names.index(pick)].doc
    assert chosen is not None
    bw = float(chosen["copy_bytes_per_s"])
    peak, preset = artifacts.peak_flops_for(chosen)
    st.caption(f"device: {chosen.get('device', chosen.get('card', '?'))}")
    c = st.columns(2)
    c[0].metric("measured copy bandwidth", f"{bw / 1e12:.2f} TB/s",
                help="device-to-device copy, read + write bytes counted")  # fmt: skip
    c[1].metric("dense bf16 peak", f"{peak / 1e12:.0f} TFLOP/s" if peak else "unknown",
                help=f"hardware preset {preset}" if preset else None)  # fmt: skip
    rows = artifacts.roofline_rows(chosen)
    if rows:
        st.markdown(f"**Tree attention on {chosen.get('card', '?')}**: achieved TFLOP/s "
                    "under the roof of the measured copy bandwidth (hover a point for its shape)")  # fmt: skip
        ui.chart(charts.roofline_chart(rows, bw, peak), key="kernels.chart")
        ui.table(rows, artifacts.ROOFLINE_COLUMNS, key="kernels.table")
    else:
        st.info("This result holds no timed attention shapes.")
    for part in ("verify", "compact"):
        extra = chosen.get(part)
        if isinstance(extra, dict) and extra:
            st.markdown(f"**{part}**")
            st.dataframe(pd.DataFrame([{"metric": k, "value": str(v)} for k, v in extra.items()]),
                         hide_index=True, key=f"kernels.{part}")  # fmt: skip

if skipped:  # other results share the folder: listed last, folded
    with st.expander(f"{len(skipped)} other files in {folder} (not kernel benchmarks)"):
        for x in skipped:
            st.caption(x.error)
