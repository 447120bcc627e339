"""DraftTree: the one tree layout every part of spectune speaks.

A tree of N nodes in parents-array form. Node 0 is the root: the last verified token, which is
part of the verify batch (so a verify budget of N counts it, as SGLang's num_draft_tokens does).
Nodes 1..N-1 are draft tokens; every parent index precedes its child, so arrays in index order
are a topological order. Derived arrays (depth, ancestor bitmask, first-child/next-sibling, ...)
are computed on first use with vectorised pointer jumping and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from spectune.specs.errors import SpecError

if TYPE_CHECKING:
    import networkx as nx

BUILDERS = ("static", "dynamic-topk", "delayed")
"""The tree builders a TreePolicy may name: Sequoia's static shape and EAGLE-2's dynamic top-k
(deterministic top-k children), and delayed expansion (one sampled path, then i.i.d. sampled
branches from a later node; Dynamic Delayed Tree Expansion, 2025)."""

VERIFY_RULES = ("token", "traversal", "spectr", "greedy")
"""How the target verifies a tree (TreePolicy.verify):
token      token-level recursive rejection, top-down (SpecInfer multi-draft; EAGLE's rule, which
           for deterministic top-k drafts is the target-only walk). Greedy at temperature 0.
traversal  Traversal Verification (Weng et al. 2025, arXiv 2505.12398): bottom-up, sequence-level.
spectr     SpecTr's k-sequential rule (Sun et al. 2023) at every node; needs i.i.d. drafts.
greedy     the target's argmax walk at any temperature (lossy above 0)."""

IID_BUILDERS = ("delayed",)
"""Builders whose children are sampled i.i.d. from the drafter (the others take the top-k)."""

SOURCE_ROOT = 0
SOURCE_MODEL = 1
SOURCE_RETRIEVAL = 2
SOURCE_NAMES = {SOURCE_ROOT: "root", SOURCE_MODEL: "model", SOURCE_RETRIEVAL: "retrieval"}

MAX_TREE_NODES = 1 << 16


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A draft token tree.

    parents:  int32[N]   parents[0] == -1; 0 <= parents[i] < i for i >= 1
    tokens:   int64[N]   token id of each node (root: the last verified token)
    logprobs: float64[N] draft log-probability of each node given its parent (root: 0.0)
    source:   int8[N]    SOURCE_ROOT for node 0, SOURCE_MODEL or SOURCE_RETRIEVAL for the others
    """

    parents: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    source: np.ndarray

    def __post_init__(self) -> None:
        p = np.asarray(self.parents)
        if p.ndim != 1 or p.size == 0:
            raise SpecError(f"parents must be a non-empty 1-D array, got shape {p.shape}")
        if p.size > MAX_TREE_NODES:
            raise SpecError(f"a tree has at most {MAX_TREE_NODES} nodes, got {p.size}")
        if not np.issubdtype(p.dtype, np.integer):
            raise SpecError(f"parents must be integers, got dtype {p.dtype}")
        n = p.size
        for name in ("tokens", "logprobs", "source"):
            a = np.asarray(getattr(self, name))
            if a.shape != (n,):
                raise SpecError(f"{name} must have shape ({n},) like parents, got {a.shape}")
        if p[0] != -1:
            raise SpecError(f"node 0 is the root and must have parent -1, got {int(p[0])}")
        idx = np.arange(n)
        bad = np.flatnonzero((p[1:] < 0) | (p[1:] >= idx[1:])) + 1
        if bad.size:
            i = int(bad[0])
            raise SpecError(
                f"node {i} has parent {int(p[i])}: every node after the root needs a parent "
                f"that precedes it (0 <= parent < index); only node 0 may be a root"
            )
        src = np.asarray(self.source)
        if n and src[0] != SOURCE_ROOT:
            raise SpecError("source[0] must be SOURCE_ROOT (0)")
        if n > 1 and not np.isin(src[1:], (SOURCE_MODEL, SOURCE_RETRIEVAL)).all():
            raise SpecError(
                "source of a draft node must be SOURCE_MODEL (1) or SOURCE_RETRIEVAL (2)"
            )
        lp = np.asarray(self.logprobs, dtype=np.float64)
        if np.isnan(lp).any() or (lp > 1e-9).any():
            raise SpecError("logprobs must be <= 0 and not NaN")
        # Normalise dtypes once; the dataclass is frozen, so go through object.__setattr__.
        object.__setattr__(self, "parents", p.astype(np.int32, copy=False))
        object.__setattr__(self, "tokens", np.asarray(self.tokens).astype(np.int64, copy=False))
        object.__setattr__(self, "logprobs", lp)
        object.__setattr__(self, "source", src.astype(np.int8, copy=False))
        for name in ("parents", "tokens", "logprobs", "source"):
            getattr(self, name).setflags(write=False)

    # ---- constructors -----------------------------------------------------------------------
    @classmethod
    def from_parents(
        cls,
        parents: Any,
        tokens: Any = None,
        logprobs: Any = None,
        source: Any = None,
    ) -> DraftTree:
        """Build from a parents list; missing arrays default to token = index, log-prob 0, model."""
        p = np.asarray(parents, dtype=np.int64)
        n = p.size
        if source is None:
            source = np.full(n, SOURCE_MODEL, dtype=np.int8)
            if n:
                source[0] = SOURCE_ROOT
        return cls(
            parents=p,
            tokens=np.arange(n) if tokens is None else np.asarray(tokens),
            logprobs=np.zeros(n) if logprobs is None else np.asarray(logprobs, dtype=np.float64),
            source=np.asarray(source),
        )

    @classmethod
    def chain(cls, draft_len: int) -> DraftTree:
        """A root followed by `draft_len` draft tokens in a line."""
        return cls.from_parents(np.arange(-1, draft_len))

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """N, including the root (the verify batch size of this tree)."""
        return int(self.parents.size)

    def __len__(self) -> int:
        return self.num_nodes

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    # ---- derived arrays ---------------------------------------------------------------------
    @cached_property
    def depth(self) -> np.ndarray:
        """int32[N]: edges from the root (root 0)."""
        depth = np.zeros(self.num_nodes, dtype=np.int32)
        anc = self.parents.astype(np.int64)
        while (live := anc >= 0).any():  # one step up per iteration: O(max depth) numpy ops
            depth += live
            anc = np.where(live, self.parents[np.maximum(anc, 0)], -1)
        depth.setflags(write=False)
        return depth

    def positions(self, context_len: int) -> np.ndarray:
        """int64[N]: sequence position of each node (context_len + depth; the root is at
        context_len when the context holds the tokens before it)."""
        return context_len + self.depth.astype(np.int64)

    @cached_property
    def ancestor_matrix(self) -> np.ndarray:
        """bool[N, N]: [i, j] is True when j is i itself or an ancestor of i."""
        n = self.num_nodes
        m = np.eye(n, dtype=bool)
        rows = np.arange(n)
        anc = self.parents.astype(np.int64)
        while (live := anc >= 0).any():
            m[rows[live], anc[live]] = True
            anc = np.where(live, self.parents[np.maximum(anc, 0)], -1)
        m.setflags(write=False)
        return m

    @cached_property
    def ancestor_bitmask(self) -> np.ndarray:
        """uint64[N, W], W = ceil(N / 64): bit (j % 64) of word j // 64 in row i is set when node
        j is i or an ancestor of i (the attention mask row of tree token i)."""
        n = self.num_nodes
        words = (n + 63) // 64
        padded = np.zeros((n, words * 64), dtype=bool)
        padded[:, :n] = self.ancestor_matrix
        packed = np.packbits(
            padded, axis=1, bitorder="little"
        )  # uint8[N, 8W], byte k = bits 8k..8k+7
        out = packed.view("<u8").astype(np.uint64)
        out.setflags(write=False)
        return out

    @cached_property
    def first_child(self) -> np.ndarray:
        """int32[N]: lowest-index child of each node, -1 for a leaf."""
        fc = np.full(self.num_nodes, -1, dtype=np.int32)
        kids = np.arange(1, self.num_nodes)
        # reversed assignment leaves the smallest child index in place
        fc[self.parents[kids][::-1]] = kids[::-1]
        fc.setflags(write=False)
        return fc

    @cached_property
    def next_sibling(self) -> np.ndarray:
        """int32[N]: next-higher-index node with the same parent, -1 for the last child/root."""
        ns = np.full(self.num_nodes, -1, dtype=np.int32)
        kids = np.arange(1, self.num_nodes)
        order = kids[np.argsort(self.parents[kids], kind="stable")]  # grouped by parent, by index
        same = self.parents[order[:-1]] == self.parents[order[1:]]
        ns[order[:-1][same]] = order[1:][same]
        ns.setflags(write=False)
        return ns

    @cached_property
    def num_children(self) -> np.ndarray:
        """int32[N]: children of each node."""
        out = np.bincount(self.parents[1:], minlength=self.num_nodes).astype(np.int32)
        out.setflags(write=False)
        return out

    @cached_property
    def sibling_rank(self) -> np.ndarray:
        """int32[N]: 0 for a parent's first child (by index), 1 for the second, ...; root 0."""
        rank = np.zeros(self.num_nodes, dtype=np.int32)
        kids = np.arange(1, self.num_nodes)
        order = kids[np.argsort(self.parents[kids], kind="stable")]
        par = self.parents[order]
        starts = np.r_[0, np.flatnonzero(par[1:] != par[:-1]) + 1]
        group_start = np.repeat(starts, np.diff(np.r_[starts, order.size]))
        rank[order] = np.arange(order.size) - group_start
        rank.setflags(write=False)
        return rank

    @cached_property
    def path_logprob(self) -> np.ndarray:
        """float64[N]: sum of draft log-probs from the root down to each node."""
        return self.ancestor_matrix.astype(np.float64) @ self.logprobs

    @cached_property
    def leaves(self) -> np.ndarray:
        """int32[L]: nodes without children, in index order."""
        return np.flatnonzero(self.num_children == 0).astype(np.int32)

    def path_to(self, node: int) -> np.ndarray:
        """int32[depth+1]: node indices from the root down to `node`."""
        if not 0 <= node < self.num_nodes:
            raise IndexError(f"node {node} out of range for a tree of {self.num_nodes} nodes")
        return np.flatnonzero(self.ancestor_matrix[node]).astype(np.int32)

    def leaf_paths(self) -> list[np.ndarray]:
        """Root-to-leaf index paths, one per leaf, in leaf index order."""
        return [self.path_to(int(leaf)) for leaf in self.leaves]

    def subtree(self, keep: np.ndarray) -> DraftTree:
        """The tree restricted to nodes where `keep` (bool[N]) is set; keep must be closed under
        parents (a kept node's parent is kept) and keep the root. Indices are renumbered in order."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (self.num_nodes,) or not keep[0]:
            raise SpecError("keep must be bool[N] and keep the root")
        if not keep[self.parents[1:][keep[1:]]].all():
            raise SpecError("keep must contain the parent of every kept node")
        new_index = np.cumsum(keep) - 1
        par = self.parents[keep]
        new_par = np.where(par >= 0, new_index[np.maximum(par, 0)], -1)
        return DraftTree(new_par, self.tokens[keep], self.logprobs[keep], self.source[keep])

    def to_networkx(self) -> nx.DiGraph:
        """A networkx DiGraph (edges parent -> child) with node attributes token, logprob,
        depth and source name, for drawing."""
        import networkx as nx

        g = nx.DiGraph()
        for i in range(self.num_nodes):
            g.add_node(
                i,
                token=int(self.tokens[i]),
                logprob=float(self.logprobs[i]),
                depth=int(self.depth[i]),
                source=SOURCE_NAMES[int(self.source[i])],
            )
        g.add_edges_from((int(self.parents[i]), i) for i in range(1, self.num_nodes))
        return g

    def to_dict(self) -> dict[str, list[Any]]:
        return {
            "parents": self.parents.tolist(),
            "tokens": self.tokens.tolist(),
            "logprobs": self.logprobs.tolist(),
            "source": [SOURCE_NAMES[int(s)] for s in self.source],
        }
