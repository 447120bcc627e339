"""Streamlit what-if dashboards (needs the `dashboard` extra); `spectune dashboard` starts them.

app.py routes to one page per file under views/ (What-if, Planner, Load, Validation, Kernels).
Pages hold widgets and layout only; the numbers come from the non-UI modules: data (scenarios,
what-if, curves), plans (search, stored studies, exports), loadtest (simulated load),
artifacts (measurements, benchmark results), uploads (files parsed as data only), charts
(interactive Altair charts) and plots (matplotlib figures), reached through the cached wrappers
in ui.
"""
