"""What every tree source shares: the drafting context and the interface the loop calls.

A tree source runs the first two phases of a speculative step for B sequences:
    draft   drafter forwards that fill the candidates of this step's trees
    build   this step's verify trees, laid out as a TreeBatch [B, N] (tree_build.py)
Its `tree` is one persistent TreeBatch that every phase after it reads (the verifier's attention
plan, the acceptance walk, the draft extend), so a phase is a fixed sequence of kernels that a
CUDA graph can replay. Pruned sources also keep `counts` (kept nodes per sequence).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from spectune.executor.drafter import Drafter
from spectune.executor.model import KVCache
from spectune.executor.select import Candidates
from spectune.executor.synthetic import SyntheticAcceptance
from spectune.executor.tree_build import TreeBatch


@dataclass
class DraftRoot:
    """What one step hands the next: token int64[B] (the last verified token, the bonus token of
    the accepted path; every tree's root) and hidden [B, h_draft] (the drafter's state after it,
    from the draft extend)."""

    token: torch.Tensor
    hidden: torch.Tensor


@dataclass
class Drafting:
    """What every source drafts with: the drafter and its cache, the synthetic acceptance banks,
    the batch at its context, the root it starts from, and `other`, a token id no draft may hold
    (the target's last id: the synthetic target token of a node none of whose children match)."""

    drafter: Drafter
    cache: KVCache
    synthetic: SyntheticAcceptance
    batch: int
    context: int
    root: DraftRoot
    other: int
    device: torch.device

    def topk_tokens(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Draft logits of hidden [B, W, h] and their top-k token ids [B, W, k] (never `other`)."""
        logits = self.drafter.logits(hidden)
        limit = min(logits.shape[-1], self.other)
        return torch.topk(logits[..., :limit], k, dim=-1).indices


class TreeSource(ABC):
    """Drafts and builds B trees of `nodes` slots each into the persistent `tree`."""

    nodes: int
    tree: TreeBatch
    counts: torch.Tensor | None = None  # int64[B] kept nodes per sequence (pruned sources)

    @abstractmethod
    def draft(self) -> None:
        """The draft phase: drafter forwards over the root and the growing frontier."""

    @abstractmethod
    def build(self) -> None:
        """The tree phase: this step's trees into `tree`."""

    @abstractmethod
    def full_tree(self) -> TreeBatch:
        """Every candidate node of this step with its path draft log-prob (TreeBatch.score):
        what pruning cuts. Only sources built with scores answer it."""

    def candidates(self) -> Candidates:
        """Every node drafted this step as a candidate set (select.py): what ECHO's shared
        budget chooses from. Dynamic and static (with scores) sources answer it."""
        raise NotImplementedError(f"{type(self).__name__} has no candidate set")

    def observe(self, tokens: torch.Tensor, count: torch.Tensor) -> None:  # noqa: B027
        """After accept: the first count[b] of tokens[b] (int64[B, A]) were emitted (accepted
        drafts, then the bonus). Sources with a retrieval drafter record them; others ignore."""
