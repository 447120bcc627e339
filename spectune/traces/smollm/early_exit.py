"""Self-speculative early-exit drafter: the first `exit_layer` layers of the target, then its
final norm and LM head, expanded as a beam-limited token tree.

Drafting one step (EAGLE-2-style expansion): the root (last verified token) goes through the
first layers; its top `topk` tokens by exit log-prob are depth-1 candidates. At every further
depth the `beam` candidates with the best path log-prob are expanded (one batched pass over
just them, each attending to the committed prefix and its own expanded ancestors), each giving
its top `topk` children. Finally the `pool_size - 1` candidates with the best path log-prob are
kept (a path log-prob never exceeds the parent's, so the kept set is a tree). The drafter
writes K/V of its first layers into the target's cache past the committed length (scratch that
the verify pass overwrites): the first layers of committed tokens are shared with the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from spectune.traces.smollm.model import KVCache, SmolLM


@dataclass(frozen=True)
class Candidates:
    """Draft candidates in generation order; node 0 is the root.

    parents: int64[M]; tokens: int64[M]; logprobs: float64[M] (given the parent);
    depth: int64[M]; path_logprob: float64[M]
    """

    parents: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    depth: np.ndarray
    path_logprob: np.ndarray


class EarlyExitDrafter:
    def __init__(
        self, model: SmolLM, exit_layer: int, max_depth: int, topk: int, beam: int, pool_size: int
    ) -> None:
        if not 1 <= exit_layer <= model.config.layers:
            raise ValueError(f"exit_layer must be in 1..{model.config.layers}")
        self.model = model
        self.exit_layer = exit_layer
        self.max_depth = max_depth
        self.topk = topk
        self.beam = beam
        self.pool_size = pool_size

    @property
    def name(self) -> str:
        return f"early-exit-l{self.exit_layer}"

    def draft(self, cache: KVCache, root: int) -> Candidates:
        """Candidates after `root` (the first uncommitted token) for the cache's sequence."""
        c = cache.length
        parents, tokens, lps, depth, plp = [-1], [root], [0.0], [0], [0.0]
        expanded: list[int] = []  # candidate index per scratch slot c + j
        frontier = [0]
        for level in range(self.max_depth):
            n = len(frontier)
            write_at = c + len(expanded)
            mask = torch.zeros(n, write_at + n, dtype=torch.bool)
            mask[:, :c] = True
            anc = [self._ancestors(parents, f) for f in frontier]
            slot = {node: j for j, node in enumerate(expanded)}
            for i, a in enumerate(anc):
                for node in a:
                    mask[i, c + slot[node]] = True
                mask[i, write_at + i] = True
            logits = self.model.forward(
                torch.as_tensor([tokens[f] for f in frontier], dtype=torch.long),
                torch.as_tensor([c + depth[f] for f in frontier], dtype=torch.long),
                mask,
                cache,
                write_at,
                layers=self.exit_layer,
            )
            logp = torch.log_softmax(logits, dim=-1)
            top = torch.topk(logp, self.topk, dim=-1)
            expanded.extend(frontier)
            new: list[int] = []
            for i, f in enumerate(frontier):
                for lp, tok in zip(top.values[i].tolist(), top.indices[i].tolist(), strict=True):
                    parents.append(f)
                    tokens.append(int(tok))
                    lps.append(min(float(lp), 0.0))
                    depth.append(level + 1)
                    plp.append(plp[f] + lps[-1])
                    new.append(len(tokens) - 1)
            if level + 1 == self.max_depth:
                break
            frontier = sorted(new, key=lambda i: (-plp[i], i))[: self.beam]
        return self._keep_best(
            Candidates(
                np.asarray(parents),
                np.asarray(tokens),
                np.asarray(lps),
                np.asarray(depth),
                np.asarray(plp),
            )
        )

    @staticmethod
    def _ancestors(parents: list[int], node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(node)
            node = parents[node]
        return out[1:]  # strict ancestors (the node itself is a new token)

    def _keep_best(self, cand: Candidates) -> Candidates:
        """The root plus the pool_size - 1 best candidates by path log-prob, closed under
        parents, reindexed breadth-first (by depth, then path log-prob)."""
        m = cand.parents.size
        order = sorted(range(1, m), key=lambda i: (-cand.path_logprob[i], int(cand.depth[i]), i))
        keep = np.zeros(m, dtype=bool)
        keep[0] = True
        keep[order[: self.pool_size - 1]] = True
        for i in np.flatnonzero(keep)[::-1].tolist():  # parents of ties at equal path log-prob
            p = int(cand.parents[i])
            while p > 0 and not keep[p]:
                keep[p] = True
                p = int(cand.parents[p])
        idx = sorted(
            np.flatnonzero(keep).tolist(),
            key=lambda i: (int(cand.depth[i]), -cand.path_logprob[i], i),
        )
        new = {old: j for j, old in enumerate(idx)}
        return Candidates(
            np.asarray([-1] + [new[int(cand.parents[i])] for i in idx[1:]]),
            cand.tokens[idx],
            cand.logprobs[idx],
            cand.depth[idx],
            cand.path_logprob[idx],
        )
