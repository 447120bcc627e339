"""Streamlit what-if dashboards, one page per file. Needs the `dashboard` extra."""
