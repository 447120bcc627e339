"""A retrieval drafter on the GPU: n-gram lookup (prompt lookup) over each request's own tokens.

Each request keeps its last H tokens (its context, then what it emitted: accepted drafts and
bonus tokens) in a ring `history` int64[B, H + 1] (column H is a write sink). For a tree leaf,
the lookup key is the leaf's token after its parent's (a bigram; the leaf's token alone when no
bigram occurs), and the proposal is the G tokens that followed the key's latest occurrence in
the history (prompt lookup decoding; vLLM's ngram proposer does the same on the host). Without
any occurrence it proposes the G tokens after the newest one in ring order, so every leaf gets G
real tokens of the request.

Work per step: 2 x B x L x H token compares (L leaves looked up), their reductions and a gather;
at B = 64, L = 8, H = 4096 that is 4 M compares, a few tens of microseconds on an H100.

With random weights the tokens carry no signal, so, like synthetic acceptance (synthetic.py),
the retrieved tokens are real but whether they are accepted is drawn: a request's suffix-match
length m from the retrieval profile's match probabilities (a common random number, draws.py),
and the j-th chain token is accepted given the previous with rho[m][j] (the workload's retrieval
acceptance, or one fitted to a recorded trace's retrieval candidates).
"""

from __future__ import annotations

import numpy as np
import torch

from spectune.executor.draws import MATCH, ROOT_ID, CommonDraws


class RetrievalDrafter:
    """N-gram lookup over a token ring per request, and the retrieval profile's draws.

    profile: planner.acceptance.RetrievalProfile (rho float64[M, J], match_probs float64[M]);
    width: G, tokens proposed per leaf (the policy's graft budget); other: a token id no draft
    may hold (kept out of the history)."""

    def __init__(
        self,
        profile: object,
        batch: int,
        history: int,
        width: int,
        other: int,
        draws: CommonDraws,
        device: torch.device,
    ):
        self.batch, self.size, self.width, self.other = batch, history, width, other
        self.draws, self.device = draws, device
        gen = torch.Generator(device="cpu").manual_seed(3)
        toks = torch.randint(0, other, (batch, history + 1), generator=gen)
        self.history = toks.to(device)  # [B, H + 1] (column H: the write sink)
        self.ptr = torch.zeros((batch,), dtype=torch.int64, device=device)  # next write slot
        rho = np.asarray(profile.rho, dtype=np.float64)  # type: ignore[attr-defined]
        probs = np.asarray(profile.match_probs, dtype=np.float64)  # type: ignore[attr-defined]
        table = np.zeros((rho.shape[0] + 1, width))  # row 0: no match
        n = min(width, rho.shape[1])
        table[1:, :n] = rho[:, :n]
        self.rho = torch.tensor(table, dtype=torch.float32, device=device)
        live = np.flatnonzero(table.max(axis=0) > 0)
        #: longest chain that can be grafted (positions past it have rho 0)
        self.max_chain = int(live[-1]) + 1 if live.size else 0
        cum = np.concatenate([[1.0 - probs.sum()], probs]).cumsum()
        self.cum = torch.tensor(np.minimum(cum, 1.0), dtype=torch.float32, device=device)
        self.pos = torch.arange(history, device=device)

    def chain_accept(self) -> torch.Tensor:
        """float32[B, G]: this step's rho row of each request (drawn match length; 0: no match)."""
        root = torch.full((self.batch, 1), ROOT_ID, dtype=torch.int64, device=self.device)
        u = self.draws.uniform(root, MATCH)[:, 0]
        m = torch.searchsorted(self.cum, u[:, None], right=True)[:, 0].clamp(
            max=self.rho.shape[0] - 1
        )
        return self.rho[m]

    def lookup(self, prev: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """int64[B, L, G]: the G tokens after the latest occurrence of (prev, last) in each
        request's history, else of `last` alone, else the G most recent tokens.

        prev, last: int64[B, L] the key of each leaf (its parent's token and its own)."""
        h = self.history[:, : self.size]  # [B, H] ring contents
        age = (self.pos[None, :] - self.ptr[:, None]) % self.size  # 0 = oldest
        one = h[:, None, :] == last[:, :, None]  # [B, L, H]
        before = torch.roll(h, 1, dims=1)
        two = one & (before[:, None, :] == prev[:, :, None]) & (age[:, None, :] > 0)
        score = torch.where(two, age[:, None, :] + 2 * self.size, -1)
        score = torch.maximum(score, torch.where(one, age[:, None, :] + self.size, -1))
        best = score.max(dim=2)
        newest = (self.ptr - 1) % self.size  # no match: continue from the newest token
        at = torch.where(best.values >= 0, best.indices, newest[:, None])
        j = torch.arange(1, self.width + 1, device=self.device)
        idx = (at[:, :, None] + j) % self.size  # [B, L, G]
        b, nl = last.shape
        return torch.gather(h, 1, idx.reshape(b, nl * self.width)).view(b, nl, self.width)

    def record(self, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Append the first count[b] of tokens[b] (int64[B, A]: the accepted drafts, then the
        bonus) to each request's ring (fixed shape: the rest goes to the sink column)."""
        a = tokens.shape[1]
        j = torch.arange(a, device=self.device)
        dest = torch.where(
            j[None, :] < count[:, None], (self.ptr[:, None] + j) % self.size, self.size
        )
        clean = torch.where((tokens >= 0) & (tokens < self.other), tokens, 0)
        self.history.scatter_(1, dest, clean)
        self.ptr.copy_((self.ptr + count) % self.size)
