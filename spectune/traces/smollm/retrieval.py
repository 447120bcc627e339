"""Retrieval drafters: prompt lookup over the context, and a suffix store over the prompts and
past outputs of every request (SuffixDecoding / Token Recycling style). They propose chains of
tokens with the length of the suffix match that found them; the recorder grafts them into the
candidate pool.

- `PromptLookup`: the longest suffix (max_ngram down to 1 tokens) of the current sequence that
  occurred earlier in it; proposes the tokens that followed its most recent earlier occurrence.
  Score 0.0 (no probability of its own).
- `SuffixStore`: counts, for every n-gram (n <= max_ngram) seen in any prompt or output so far,
  which token followed it. A chain grows one token at a time from the longest matching suffix,
  taking the most frequent follower; its score is log(count / total) of that choice, and the
  chain stops when the longest match falls below `min_match` or the follower is unseen.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Proposal:
    """A retrieved chain: tokens[j] follows tokens[:j]; logprobs[j] <= 0 its score."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    match_len: int


class PromptLookup:
    """n-gram matching of the sequence's suffix against the sequence itself."""

    def __init__(self, max_ngram: int = 4, max_len: int = 6) -> None:
        self.max_ngram = max_ngram
        self.max_len = max_len
        self._pos: dict[tuple[int, ...], int] = {}  # n-gram -> end index of its latest occurrence
        self._seq: list[int] = []

    def reset(self, tokens: Sequence[int]) -> None:
        self._pos = {}
        self._seq = []
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the indexed sequence."""
        for t in tokens:
            self._seq.append(int(t))
            i = len(self._seq)
            # index n-grams ending one before the new token: their follower is known now
            for n in range(1, self.max_ngram + 1):
                if i - 1 - n < 0:
                    break
                self._pos[tuple(self._seq[i - 1 - n : i - 1])] = i - 1

    def propose(self, suffix_extra: Sequence[int] = ()) -> Proposal | None:
        """Chain after the sequence + `suffix_extra` (a draft path not yet in the sequence)."""
        ctx = self._seq + [int(t) for t in suffix_extra]
        for n in range(min(self.max_ngram, len(ctx)), 0, -1):
            end = self._pos.get(tuple(ctx[-n:]))
            if end is None:
                continue
            follow = self._seq[end : end + self.max_len]
            if follow:
                return Proposal(tuple(follow), (0.0,) * len(follow), n)
        return None


class SuffixStore:
    """Follower counts of every n-gram in the prompts and outputs seen so far."""

    def __init__(self, max_ngram: int = 4, max_len: int = 6, min_match: int = 2) -> None:
        self.max_ngram = max_ngram
        self.max_len = max_len
        self.min_match = min_match
        self._next: dict[tuple[int, ...], Counter[int]] = {}

    def add(self, tokens: Sequence[int], history: Sequence[int] = ()) -> None:
        """Count the followers in `tokens`, which continue `history` (already counted)."""
        seq = [int(t) for t in history[-self.max_ngram :]] + [int(t) for t in tokens]
        first = len(seq) - len(tokens)
        for i in range(max(first, 1), len(seq)):
            for n in range(1, self.max_ngram + 1):
                if i - n < 0:
                    break
                self._next.setdefault(tuple(seq[i - n : i]), Counter())[seq[i]] += 1

    def _longest(self, ctx: list[int]) -> tuple[int, Counter[int] | None]:
        for n in range(min(self.max_ngram, len(ctx)), 0, -1):
            c = self._next.get(tuple(ctx[-n:]))
            if c:
                return n, c
        return 0, None

    def propose(self, context: Sequence[int]) -> Proposal | None:
        ctx = [int(t) for t in context[-self.max_ngram :]]
        n0, counts = self._longest(ctx)
        if counts is None:
            return None
        toks: list[int] = []
        lps: list[float] = []
        n = n0
        while counts is not None and len(toks) < self.max_len:
            tok, cnt = counts.most_common(1)[0]
            toks.append(tok)
            lps.append(math.log(cnt / sum(counts.values())))
            ctx.append(tok)
            n, counts = self._longest(ctx)
            if n < self.min_match:
                break
        return Proposal(tuple(toks), tuple(lps), n0)
