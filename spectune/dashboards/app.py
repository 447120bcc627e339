"""The spectune dashboard: `spectune dashboard` runs `streamlit run` on this file.

It is the router (Streamlit's st.navigation): it draws the scenario sidebar for the pages that
predict (What-if, Planner, Load), keeps its choices while another page is shown, names on every
page the scenario of the plan the Planner page holds (What-if and Load can use its table), and
runs the page the user picked. Each page is one file under views/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from spectune.dashboards import plans, ui

HERE = Path(__file__).parent

st.set_page_config(page_title="spectune", layout="wide")

PAGES = {
    "whatif": st.Page(
        HERE / "views" / "whatif.py", title="What-if", url_path="whatif", default=True
    ),
    "planner": st.Page(HERE / "views" / "planner.py", title="Planner", url_path="planner"),
    "load": st.Page(HERE / "views" / "load.py", title="Load", url_path="load"),
    "validation": st.Page(
        HERE / "views" / "validation.py", title="Validation", url_path="validation"
    ),
    "kernels": st.Page(HERE / "views" / "kernels.py", title="Kernels", url_path="kernels"),
}
SCENARIO_PAGES = ("What-if", "Planner", "Load")  # titles (the default page's url_path is "")

ui.keep_scenario_state()
page = st.navigation(list(PAGES.values()))
if page.title in SCENARIO_PAGES:
    st.sidebar.header("Scenario")
    st.session_state[ui.SCENARIO_KEY], st.session_state[ui.TRACE_KEY] = ui.scenario_sidebar()


def name_the_plan(slot: Any) -> None:
    """Name the scenario of the plan the Planner page holds in the sidebar slot (if any)."""
    plan = ui.planned()
    if plan is not None:
        with slot.container(), ui.friendly_errors("plan"):
            planned_for, _ = plans.scenario_for_table(plan.table, ui.scenario())
            st.caption(f"Plan on the Planner page: {ui.scenario_label(planned_for)}")


slot = st.sidebar.empty()
name_the_plan(slot)  # stays when a page stops early (st.stop)
page.run()
name_the_plan(slot)  # the plan the page may have replaced
