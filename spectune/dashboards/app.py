"""The spectune dashboard: `spectune dashboard` runs `streamlit run` on this file.

It is the router (Streamlit's st.navigation): it draws the scenario sidebar for the pages that
predict (What-if, Planner, Load), keeps its choices while another page is shown, and runs the
page the user picked. Each page is one file under views/.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from spectune.dashboards import ui

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
page.run()
