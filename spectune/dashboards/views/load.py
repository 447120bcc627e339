"""Load: simulated serving at several request rates, speculation on and off on the same
arrivals: steady-state throughput (warm-up and drain trimmed), and TTFT / TPOT percentiles in
ms (spectune.simulator). The planned table of
the Planner page is simulated for the Scenario it was planned for, which the page shows (and
says where the sidebar's differs)."""

from __future__ import annotations

import streamlit as st

from spectune.dashboards import charts, data, loadtest, plans, ui, uploads

QPS_CHOICES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)

scn, trace = ui.scenario(), ui.trace()
st.title("Load")

sources = ["SGLang default 5/4/8", "EAGLE default 7/10/60", "Custom policy"]
plan = ui.planned()
if plan is not None:
    sources.append(ui.PLANNED_SOURCE)
source = st.radio("Speculation policy", sources, horizontal=True, key="load.source")
policy: loadtest.PolicySource
if source == "Custom policy":
    policy = ui.policy_controls("load")
elif source == ui.PLANNED_SOURCE and plan is not None:
    policy = plan.table
    sidebar = scn
    scn, note = plans.scenario_for_table(plan.table, sidebar)  # simulate what it was planned for
    if note:
        st.warning(note)
    differs = plans.scenario_changes(scn, sidebar)
    if differs:
        st.warning(f"Simulating the planned table's scenario, not the sidebar's: {differs}.")
else:
    policy = data.REFERENCE_POLICIES[source]
with ui.friendly_errors("scenario"):
    st.caption(f"Simulating {ui.scenario_label(scn, trace)}")
    ui.pair_warnings(scn, trace)

with st.form("load.form"):
    c1, c2, c3 = st.columns(3)
    qps = c1.multiselect("Request rates, requests/s", QPS_CHOICES, default=[1.0, 4.0, 16.0],
                         key="load.qps")  # fmt: skip
    requests = c2.slider("Requests per rate", 20, 5000, loadtest.LoadSettings().requests, step=10,
                         key="load.requests",
                         help="enough for steady state (warm-up and drain are trimmed); fewer "
                         "are faster and noisier")  # fmt: skip
    burst = c2.slider("Burstiness (cv of inter-arrival times; 1 = Poisson)", 0.5, 4.0, 1.0,
                      step=0.5, key="load.burst")  # fmt: skip
    seed = int(c3.number_input("Seed", 0, 1_000_000, 0, key="load.seed"))
    slo = c3.number_input("TPOT SLO for goodput, ms (0: the scenario's, if any)", 0.0, 1000.0,
                          0.0, key="load.slo")  # fmt: skip
    st.form_submit_button("Simulate")  # the form's values change only when it is submitted

settings = loadtest.LoadSettings(requests=int(requests), seed=seed, burstiness=float(burst),
                                 slo_tpot_ms=float(slo) if slo else None)  # fmt: skip
rows: list[dict[str, object]] = []
with ui.friendly_errors("simulation"):  # cached: simulates again only when an input changed
    rows = ui.load_sweep(scn, policy, tuple(qps), settings, trace)

if rows:
    st.caption(loadtest.STEADY_NOTE)
    if settings.requests < 300:
        st.warning(f"{settings.requests} requests per rate: the steady window holds few of "
                   "them, so throughput and percentiles are noisy; 1,000 give steadier figures.")  # fmt: skip
    c1, c2, c3 = st.columns(3)
    with c1:
        ui.chart(charts.load_chart(rows, [("throughput_tok_s", "throughput"),
                                          ("goodput_tok_s", "goodput")],
                                   loadtest.THROUGHPUT_LABEL), key="load.chart.throughput")  # fmt: skip
    with c2:
        ui.chart(charts.load_chart(rows, loadtest.LATENCY_COLUMNS[2:], "TPOT, ms"),
                 key="load.chart.tpot")  # fmt: skip
    with c3:
        ui.chart(charts.load_chart(rows, loadtest.LATENCY_COLUMNS[:2], "TTFT, ms"),
                 key="load.chart.ttft")  # fmt: skip
    ui.table(rows, loadtest.COLUMNS, key="load.table")

st.subheader("Replay a recorded arrival trace")
arrivals = ui.upload("Trace (CSV or JSONL, optionally .gz: arrival time, prompt tokens, output "
                     "tokens)", ("csv", "jsonl", "gz"), uploads.trace_from_upload,
                     key="load.trace")  # fmt: skip
if arrivals is not None:
    with ui.friendly_errors("trace replay"):
        row = ui.trace_replay(scn, policy, arrivals, settings, trace)
        ui.table([row], loadtest.COLUMNS, key="load.trace_table")
