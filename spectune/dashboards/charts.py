"""Interactive charts of the pages people explore (Planner, Load): Altair (Vega-Lite) specs with
tooltips, pan and zoom, drawn by Streamlit's st.altair_chart. No Streamlit here; each function
takes the rows a non-UI module returns and gives an alt.Chart (the tests read its data back).

Legends sit below the plot so they never cover a line; every axis names its quantity and unit,
and tokens/s axes name their kind (planner.tokens_per_s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd

AnyChart = alt.Chart | alt.LayerChart | alt.FacetChart
"""What these functions return (what Altair's `.interactive()` is typed to give)."""

LEGEND = alt.Legend(orient="bottom", columns=4, labelLimit=320, title=None)
STACKED = alt.Legend(orient="bottom", direction="vertical", labelLimit=200, title=None)
"""Legends for narrow charts (a third of the page): one entry per row, side by side."""
PALETTE = ("#1f4e9c", "#ff7f0e", "#2ca02c", "#7f7f7f", "#d62728", "#9467bd")
"""Distinct colours in order: the planned policy first, then the references."""
SPEC_ON, SPEC_OFF = "on (solid)", "off (dashed)"
HEIGHT_PX = 320


def _log_x(values: Sequence[float]) -> alt.Scale:
    """Log-2 x when the values span a factor of 8 or more (batch sizes, request rates)."""
    pos = [v for v in values if v > 0]
    if len(pos) > 1 and max(pos) / min(pos) >= 8:
        return alt.Scale(type="log", base=2)
    return alt.Scale(zero=False)


def batch_chart(
    batches: Sequence[int],
    curves: Mapping[str, Sequence[float]],
    y_title: str,
    buckets: Sequence[Mapping[str, Any]] = (),
) -> AnyChart:
    """Predicted tokens/s against batch size, one line per policy (the first drawn thicker),
    and, when given, each bucket's score as a horizontal segment over its batch range
    (`buckets`: rows with batch_lo, batch_hi, score, bucket, policy)."""
    long = pd.DataFrame(
        [
            {"batch": int(b), "policy": name, "tok_s": float(v)}
            for name, ys in curves.items()
            for b, v in zip(batches, ys, strict=True)
        ]
    )
    order = list(curves)
    x = alt.X("batch:Q", title="batch size (running requests)", scale=_log_x(list(batches)))
    y = alt.Y("tok_s:Q", title=y_title)
    color = alt.Color(
        "policy:N",
        scale=alt.Scale(domain=order, range=list(PALETTE[: len(order)])),
        legend=LEGEND,
    )
    tips = [
        alt.Tooltip("policy:N"),
        alt.Tooltip("batch:Q"),
        alt.Tooltip("tok_s:Q", title=y_title, format=",.0f"),
    ]
    width = alt.condition(alt.datum.policy == order[0], alt.value(3.0), alt.value(1.5))
    lines = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(x=x, y=y, color=color, strokeWidth=width, tooltip=tips)
    )
    layers: list[Any] = [lines]
    if buckets:
        seg = pd.DataFrame(list(buckets))
        layers.append(
            alt.Chart(seg)
            .mark_rule(strokeWidth=4, opacity=0.45, color="black")
            .encode(
                x=alt.X("batch_lo:Q", scale=_log_x(list(batches))),
                x2="batch_hi:Q",
                y="score:Q",
                tooltip=[
                    alt.Tooltip("bucket:N"),
                    alt.Tooltip("policy:N"),
                    alt.Tooltip("score:Q", title=f"bucket score, {y_title}", format=",.0f"),
                ],
            )
        )
    return alt.layer(*layers, height=HEIGHT_PX).interactive()


def pareto_chart(
    rows: Sequence[Mapping[str, Any]], chosen: Sequence[Mapping[str, Any]], y_title: str
) -> AnyChart:
    """Each bucket's Pareto front (tokens/s against step latency, ms) and the table's choice
    (a star)."""
    front = pd.DataFrame(list(rows))
    tips = [
        alt.Tooltip("bucket:N"),
        alt.Tooltip("policy:N"),
        alt.Tooltip("step_ms:Q", title="step latency, ms", format=".2f"),
        alt.Tooltip("tokens_per_s:Q", title=y_title, format=",.0f"),
    ]
    x = alt.X("step_ms:Q", title="step latency, ms", scale=alt.Scale(zero=False))
    y = alt.Y("tokens_per_s:Q", title=y_title, scale=alt.Scale(zero=False))
    color = alt.Color("bucket:N", legend=LEGEND)
    layers: list[Any] = [
        alt.Chart(front).mark_line(point=True).encode(x=x, y=y, color=color, tooltip=tips)
    ]
    if chosen:
        layers.append(
            alt.Chart(pd.DataFrame(list(chosen)))
            .mark_point(shape="diamond", size=160, filled=True, stroke="black")
            .encode(x=x, y=y, color=color, tooltip=tips)
        )
    return alt.layer(*layers, height=HEIGHT_PX).interactive()


def load_chart(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], y_title: str
) -> AnyChart:
    """Metrics against request rate: each (column, label) with speculation on (solid) and off
    (dashed, from the 'off_' column when the rows have it)."""
    long = []
    for r in rows:
        for col, label in columns:
            for on, key in ((SPEC_ON, col), (SPEC_OFF, f"off_{col}")):
                if key in r:
                    long.append({"qps": r["qps"], "metric": label, "speculation": on,
                                 "value": r[key]})  # fmt: skip
    df = pd.DataFrame(long)
    qps = [float(r["qps"]) for r in rows]
    return (
        alt.Chart(df)
        .mark_line(point=True)
        .encode(
            x=alt.X("qps:Q", title="request rate, requests/s", scale=_log_x(qps)),
            y=alt.Y("value:Q", title=y_title),
            color=alt.Color("metric:N", scale=alt.Scale(range=list(PALETTE)), legend=STACKED),
            strokeDash=alt.StrokeDash(
                "speculation:N",
                scale=alt.Scale(domain=[SPEC_ON, SPEC_OFF], range=[[1, 0], [5, 3]]),
                legend=alt.Legend(orient="bottom", direction="vertical", title="speculation"),
            ),
            tooltip=[
                alt.Tooltip("metric:N"),
                alt.Tooltip("speculation:N"),
                alt.Tooltip("qps:Q", title="requests/s", format=".3g"),
                alt.Tooltip("value:Q", title=y_title, format=",.3~f"),
            ],
        )
        .properties(height=HEIGHT_PX)
        .interactive()
    )


def roofline_chart(
    rows: Sequence[Mapping[str, Any]], copy_bytes_per_s: float, peak_flops: float
) -> AnyChart:
    """Achieved TFLOP/s against arithmetic intensity (FLOP per KV byte, log-log), one point per
    (shape, implementation) of dashboards.artifacts.roofline_rows, under the roof: measured copy
    bandwidth x intensity, capped by the card's dense bf16 peak when known (> 0)."""
    pts = pd.DataFrame(list(rows))
    xs = [float(x) for x in pts["intensity_flop_per_byte"] if x > 0] if len(pts) else [1.0]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
    roof = pd.DataFrame(
        {
            "intensity_flop_per_byte": grid,
            "tflops": [
                min(copy_bytes_per_s * x, peak_flops if peak_flops > 0 else float("inf")) / 1e12
                for x in grid
            ],
        }
    )
    x = alt.X(
        "intensity_flop_per_byte:Q",
        title="arithmetic intensity, FLOP per KV byte",
        scale=alt.Scale(type="log"),
    )
    y = alt.Y("tflops:Q", title="achieved TFLOP/s", scale=alt.Scale(type="log"))
    line = (
        alt.Chart(roof)
        .mark_line(color="black")
        .encode(x=x, y=y, tooltip=[alt.Tooltip("tflops:Q", title="roof, TFLOP/s", format=".3g")])
    )
    dots = (
        alt.Chart(pts)
        .mark_point(filled=True, size=70)
        .encode(
            x=x,
            y=y,
            color=alt.Color(
                "implementation:N", scale=alt.Scale(range=list(PALETTE)), legend=LEGEND
            ),
            shape=alt.Shape("implementation:N", legend=None),
            tooltip=[
                alt.Tooltip("shape:N"),
                alt.Tooltip("implementation:N"),
                alt.Tooltip("us:Q", title="time, us", format=".1f"),
                alt.Tooltip("tflops:Q", title="TFLOP/s", format=".3g"),
                alt.Tooltip("gb_per_s:Q", title="KV GB/s", format=",.0f"),
                alt.Tooltip("copy_bw_fraction:Q", title="of copy bandwidth", format=".0%"),
            ],
        )
    )
    return alt.layer(line, dots, height=HEIGHT_PX).interactive()
