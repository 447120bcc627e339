"""DraftTree: validation, derived arrays against slow reference computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from strategies import draft_trees, parents_arrays

from spectune.specs import DraftTree, SpecError


def _slow_depth(parents: np.ndarray) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def _slow_ancestors(parents: np.ndarray, i: int) -> set[int]:
    out = {i}
    while parents[i] >= 0:
        i = int(parents[i])
        out.add(i)
    return out


@given(draft_trees())
def test_derived_arrays_match_slow_reference(tree: DraftTree) -> None:
    p = tree.parents
    n = tree.num_nodes
    assert tree.depth.tolist() == _slow_depth(p)
    words = tree.ancestor_bitmask
    assert words.shape == (n, (n + 63) // 64) and words.dtype == np.uint64
    for i in range(n):
        bits = {
            w * 64 + b
            for w in range(words.shape[1])
            for b in range(64)
            if (int(words[i, w]) >> b) & 1
        }
        assert bits == _slow_ancestors(p, i)
    for i in range(n):
        kids = [j for j in range(n) if p[j] == i]
        assert tree.first_child[i] == (kids[0] if kids else -1)
        assert tree.num_children[i] == len(kids)
        for a, b in zip(kids, [*kids[1:], -1][: len(kids)], strict=True):
            assert tree.next_sibling[a] == b
        for r, k in enumerate(kids):
            assert tree.sibling_rank[k] == r
    for leaf, path in zip(tree.leaves, tree.leaf_paths(), strict=True):
        assert path[0] == 0 and path[-1] == leaf
        assert all(p[path[k + 1]] == path[k] for k in range(len(path) - 1))
        assert np.isclose(tree.path_logprob[leaf], tree.logprobs[path].sum())
    assert (tree.positions(100) == 100 + tree.depth).all()


@given(parents_arrays(min_nodes=2, max_nodes=40))
def test_networkx_view_is_the_same_tree(parents: np.ndarray) -> None:
    g = DraftTree.from_parents(parents).to_networkx()
    assert g.number_of_nodes() == parents.size
    assert sorted(g.edges) == sorted((int(parents[i]), i) for i in range(1, parents.size))
    assert g.nodes[0]["source"] == "root"


@given(draft_trees(min_nodes=2, max_nodes=60))
def test_subtree_keeps_structure(tree: DraftTree) -> None:
    keep = tree.depth <= 2
    sub = tree.subtree(keep)
    assert sub.num_nodes == int(keep.sum())
    assert (sub.tokens == tree.tokens[keep]).all()
    assert (sub.depth == tree.depth[keep]).all()


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ([0, 0], "node 0 is the root"),
        ([-1, 1], "node 1 has parent 1"),
        ([-1, 0, 3, 1], "node 2 has parent 3"),
        ([-1, -1], "node 1 has parent -1"),
        ([], "non-empty"),
    ],
)
def test_invalid_parents_are_clear_errors(parents: list[int], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        DraftTree.from_parents(parents)


def test_mismatched_lengths_and_bad_logprobs() -> None:
    with pytest.raises(SpecError, match="tokens must have shape"):
        DraftTree.from_parents([-1, 0], tokens=[1, 2, 3])
    with pytest.raises(SpecError, match="logprobs"):
        DraftTree.from_parents([-1, 0], logprobs=[0.0, 0.5])


def test_chain_and_bitmask_words_above_64() -> None:
    t = DraftTree.chain(129)
    assert t.num_nodes == 130 and t.max_depth == 129
    assert t.ancestor_bitmask.shape == (130, 3)
    last = t.ancestor_bitmask[-1]
    assert int(last[0]) == 2**64 - 1 and int(last[1]) == 2**64 - 1 and int(last[2]) == 0b11
    assert t.ancestor_bitmask.flags.writeable is False
