"""Hypothesis strategies shared by the test suites."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spectune.specs import DraftTree


@st.composite
def parents_arrays(
    draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 130, max_depth: int = 16
) -> np.ndarray:
    """A valid parents array: node 0 the root, each parent earlier, depth <= max_depth."""
    n = draw(st.integers(min_nodes, max_nodes))
    parents = [-1]
    depth = [0]
    for i in range(1, n):
        choices = [j for j in range(i) if depth[j] < max_depth]
        p = draw(st.sampled_from(choices[-8:] + choices[:2]))  # favours deep and bushy shapes
        parents.append(p)
        depth.append(depth[p] + 1)
    return np.array(parents, dtype=np.int32)


@st.composite
def draft_trees(
    draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 130, max_depth: int = 16, vocab: int = 50
) -> DraftTree:
    """A random DraftTree with random tokens and draft log-probs."""
    parents = draw(parents_arrays(min_nodes, max_nodes, max_depth))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n = parents.size
    logprobs = np.log(rng.uniform(0.01, 1.0, n))
    logprobs[0] = 0.0
    source = rng.choice([1, 2], size=n, p=[0.8, 0.2]).astype(np.int8)
    source[0] = 0
    return DraftTree(parents, rng.integers(0, vocab, n), logprobs, source)
