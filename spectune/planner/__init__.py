"""Planner: roofline cost model, acceptance models, tree builders, search and export (CPU only)."""
