"""Validation: the predictions against what was measured: the executor's measurement JSONs and
the serving engines' measurements (spectune.engine-measurement/v1: parsed engine output and
published figures), found recursively under measurements/ (or uploaded). Three views: the CI
gate's own re-prediction (`spectune check`: verify latency and speedup with the measured
accepted length and the committed calibration), the planner's end-to-end closed form (with the
acceptance model), and the engines (`spectune check`'s engine rows: tokens/s and accept length
with each engine's profile, and the per-engine MAPE it gates on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from spectune.dashboards import artifacts, data, plots, ui

QUANTITIES = {
    "tokens_per_s": "tokens/s",
    "step_ms": "step time, ms",
    "speedup": "speedup",
    "tokens_per_step": "tokens per step",
}

ENGINE_SCHEMA = "spectune.engine-measurement/v1"


@st.cache_data(show_spinner=False)
def engine_check(folder: str) -> dict[str, Any]:
    """`spectune check`'s engine rows for every engine measurement under `folder` (recursive)."""
    from spectune.validate.check import check_folder

    res = check_folder(folder)
    rows = [
        {"file": r.file, "engine": r.engine, "figure": r.what, "quantity": r.quantity,
         "predicted": r.predicted, "measured": r.measured, "error_pct": 100 * r.error,
         "note": r.note}
        for r in res.engine
    ]  # fmt: skip
    mape = {f"{e} {q}": (100 * m, n) for (e, q), (m, n) in res.engine_mape().items()}
    return {"rows": rows, "mape": mape, "skipped": list(res.engine_skipped)}


def _is_engine(path: Path) -> bool:
    """Whether a file is an engine measurement document (its schema within the first 4 KB)."""
    try:
        with path.open("rb") as f:
            return ENGINE_SCHEMA.encode() in f.read(4096)
    except OSError:
        return False


def _executor_files(folder: Path) -> list[artifacts.Loaded]:
    """Executor measurements of `folder` and its subfolders (names relative to it); engine
    measurement documents are left to the Engines tab."""
    out: list[artifacts.Loaded] = []
    if not folder.is_dir():
        return out
    for d in sorted({p.parent for p in folder.rglob("*.json")}):
        rel = d.relative_to(folder)
        for x in ui.measurements(str(d)):
            if x.doc is None and _is_engine(d / x.name):
                continue
            name = x.name if str(rel) == "." else f"{rel}/{x.name}"
            out.append(artifacts.Loaded(name, x.doc, x.error))
    return out


def _has_engine_docs(folder: Path) -> bool:
    return folder.is_dir() and any(_is_engine(p) for p in folder.rglob("*.json"))


st.title("Validation")
folder = artifacts.measurements_dir()
st.caption(f"Predicted against measured, from {folder}/ and its subfolders")

loaded = _executor_files(folder)
engines = _has_engine_docs(folder)
with st.expander("Add a measurement file"):
    doc = ui.upload("Measurement JSON (spectune.measurement/v1, from `spectune execute`)", ("json",),
                    artifacts.measurement_from_upload, key="validation.upload")  # fmt: skip
    if doc is not None:
        loaded.append(artifacts.Loaded("uploaded.json", doc))

for bad in (x for x in loaded if x.doc is None):
    st.warning(f"skipped {bad.error}")
docs = {x.name: x.doc for x in loaded if x.doc is not None}
if not docs and not engines:
    st.info(
        f"No measurements yet. Run `spectune execute` on a GPU host and commit its JSON under "
        f"{folder}/, or upload one above."
    )
    st.stop()

gate_tab, planner_tab, engine_tab = st.tabs(
    ["CI gate (spectune check)", "Planner end to end", "Engines"]
)
with engine_tab, ui.friendly_errors("engine measurements"):
    if not engines:
        st.info(
            f"No engine measurements under {folder}/ (`spectune fit-engine --measurements-out`)."
        )
    else:
        e = engine_check(str(folder))
        cols = st.columns(max(len(e["mape"]), 1))
        for col, (label, (m, n)) in zip(cols, e["mape"].items(), strict=False):
            col.metric(f"{label} MAPE", f"{m:.1f} %", help=f"over {n} points; gate 10 % tokens/s")
        erows = [r for r in e["rows"] if r["quantity"] == "tokens_per_s"]
        if erows:
            c1, _ = st.columns([1, 1])
            with c1:
                ui.show(plots.scatter_figure(erows, "", "engine tokens/s"))
        st.dataframe(pd.DataFrame(e["rows"]), hide_index=True, key="validation.engines")
        for where, why in e["skipped"]:
            st.caption(f"not priced: {where}: {why}")

with gate_tab, ui.friendly_errors("spectune check"):
    if not docs:
        st.info("No executor measurements: see the Engines tab.")
        st.stop()
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
