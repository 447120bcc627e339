"""Lossless greedy speculative decoding on CPU with real drafters, one candidate pool per step.

Each step: the early-exit drafter proposes model candidates after the root; the retrieval
drafters hang chains under the root and under the `retrieval_nodes` best model candidates
(a retrieved token equal to an existing child of its parent follows that child instead, so
siblings keep distinct tokens); the target verifies the whole pool in one tree-attention pass,
giving its greedy next token after every node (`target`). The accepted path is the walk from
the root along children whose token is the target's choice; the bonus token is the target's
token after the last accepted node. A `select` function may shrink the pool to the tree a
policy builds before verification; any such tree gives the same output as plain greedy
decoding, because every emitted token is the target's argmax after the verified prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL, SOURCE_ROOT, DraftTree
from spectune.traces.smollm.early_exit import EarlyExitDrafter
from spectune.traces.smollm.model import KVCache, SmolLM
from spectune.traces.smollm.retrieval import PromptLookup, Proposal, SuffixStore


@dataclass
class Pool:
    """A step's candidate pool: the tree plus per-node match lengths (retrieval nodes)."""

    tree: DraftTree
    match_len: np.ndarray  # int32[P]


@dataclass
class StepRecord:
    """What one step recorded: the pool (or the selected tree), targets and the outcome."""

    context_len: int
    pool: Pool
    target: np.ndarray  # int64[P]
    path: np.ndarray  # int32[k], root first
    emitted: list[int]  # accepted draft tokens + the bonus token


@dataclass
class Retrievers:
    """The retrieval drafters of one request: prompt lookup over its own sequence, and the
    suffix store shared by all requests (prompts and outputs seen so far)."""

    lookup: PromptLookup = field(default_factory=PromptLookup)
    store: SuffixStore = field(default_factory=SuffixStore)
    retrieval_nodes: int = 6  # model candidates (best path log-prob) that get a chain
    node_chain_len: int = 4  # chain length under a model candidate (under the root: max_len)

    def proposals(self, history: list[int], path: list[int], root: bool) -> list[Proposal]:
        out = []
        p = self.lookup.propose(path)
        if p is not None:
            out.append(p)
        s = self.store.propose(history + path)
        if s is not None:
            out.append(s)
        if not root:
            out = [
                Proposal(
                    q.tokens[: self.node_chain_len], q.logprobs[: self.node_chain_len], q.match_len
                )
                for q in out
            ]
            out = sorted(out, key=lambda q: -q.match_len)[:1]
        return out


def make_pool(
    drafter: EarlyExitDrafter | None,
    retrievers: Retrievers | None,
    history: list[int],
    cache: KVCache,
    root: int,
) -> Pool:
    """Draft candidates plus retrieval chains after `root`; `history` is the sequence up to and
    including the root."""
    if drafter is not None:
        cand = drafter.draft(cache, root)
        parents = cand.parents.tolist()
        tokens = cand.tokens.tolist()
        lps = cand.logprobs.tolist()
        plp = cand.path_logprob.tolist()
    else:
        parents, tokens, lps, plp = [-1], [root], [0.0], [0.0]
    n_model = len(parents)
    source = [SOURCE_ROOT] + [SOURCE_MODEL] * (n_model - 1)
    match = [0] * n_model
    if retrievers is not None:
        children: dict[tuple[int, int], int] = {
            (parents[i], tokens[i]): i for i in range(1, n_model)
        }
        hosts = [
            0,
            *sorted(range(1, n_model), key=lambda i: (-plp[i], i))[: retrievers.retrieval_nodes],
        ]
        for host in hosts:
            path = _path_tokens(parents, tokens, host)
            for prop in retrievers.proposals(history, path, root=host == 0):
                at = host
                for tok, lp in zip(prop.tokens, prop.logprobs, strict=True):
                    hit = children.get((at, tok))
                    if hit is None:
                        parents.append(at)
                        tokens.append(tok)
                        lps.append(min(lp, 0.0))
                        source.append(SOURCE_RETRIEVAL)
                        match.append(prop.match_len)
                        hit = len(parents) - 1
                        children[(at, tok)] = hit
                    at = hit
    tree = DraftTree(
        np.asarray(parents), np.asarray(tokens), np.asarray(lps), np.asarray(source, dtype=np.int8)
    )
    return Pool(tree, np.asarray(match, dtype=np.int32))


def _path_tokens(parents: list[int], tokens: list[int], node: int) -> list[int]:
    """Tokens on the path root..node, excluding the root."""
    out = []
    while node > 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def accept(tree: DraftTree, target: np.ndarray) -> np.ndarray:
    """int32[k]: the accepted path (root first): children whose token is the target's choice."""
    path = [0]
    first, nxt, tok = tree.first_child, tree.next_sibling, tree.tokens
    node = 0
    while True:
        child = int(first[node])
        while child >= 0 and tok[child] != target[node]:
            child = int(nxt[child])
        if child < 0:
            return np.asarray(path, dtype=np.int32)
        path.append(child)
        node = child


Select = Callable[[Pool], np.ndarray]  # pool -> bool[P] keep mask (closed under parents)


def speculative_generate(
    model: SmolLM,
    prompt: list[int],
    new_tokens: int,
    drafter: EarlyExitDrafter | None,
    retrievers: Retrievers | None = None,
    eos: int | None = None,
    select: Select | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
) -> list[int]:
    """Greedy continuation of `prompt` by speculative decoding (equal to greedy_generate)."""
    cache = model.new_cache(len(prompt) + new_tokens + 512)
    model.prefill(cache, prompt[:-1])
    seq = list(prompt)
    if retrievers is not None:
        retrievers.lookup.reset(seq)
        retrievers.store.add(prompt)
    out: list[int] = []
    while len(out) < new_tokens and not (eos is not None and eos in out):
        root = seq[-1]
        pool = make_pool(drafter, retrievers, seq, cache, root)
        tree = pool.tree
        if select is not None:
            keep = select(pool)
            tree = tree.subtree(keep)
        logits = model.verify_tree(cache, tree.tokens, tree.depth, tree.ancestor_matrix)
        target = torch.argmax(logits, dim=-1).numpy().astype(np.int64)
        path = accept(tree, target)
        context_len = cache.length
        cache.keep_path(context_len, path.tolist())
        emitted = [int(t) for t in tree.tokens[path[1:]]] + [int(target[path[-1]])]
        if on_step is not None:
            sel = Pool(tree, pool.match_len if select is None else pool.match_len[keep])
            on_step(StepRecord(context_len, sel, target, path, emitted))
        if retrievers is not None:
            retrievers.lookup.extend(emitted)
            retrievers.store.add(emitted, history=seq)
        seq.extend(emitted)
        out.extend(emitted)
    out = out[:new_tokens]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out
