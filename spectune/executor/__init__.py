"""Runs policies on a real GPU: real-shape models, the spec-decoding loop, calibration (needs torch)."""
