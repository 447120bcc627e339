"""The dashboard's pages: Streamlit scripts that app.py runs (one page per file)."""
