"""Triton kernels for tree verification (tree attention, verification, KV compaction), each with a
torch reference and a seeded input builder. Needs the `gpu` extra (torch, triton)."""
