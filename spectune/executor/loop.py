"""The speculative-decoding loop, phase by phase, and the same target without speculation.

One speculative step for B sequences at context C, as SpecRunner's methods:
    draft     the tree source's drafter steps: the root (1 token/seq), then the frontier
    build     the source's verify trees [B, N] (+ ancestor mask), handed to the verifier's
              attention plan                                                 (phase "tree")
    verify    the verifier's target forward over the trees (tree attention), logits + argmax
              on every node; target tokens drawn from the acceptance model (synthetic.py)
    accept    greedy verification: longest root path whose tokens match, + the bonus token
    compact   the accepted path's K/V moved to contiguous positions C .. C+d (all layers)
    extend    drafter pass over the accepted tokens (padded to d+1) -> next root hidden state
The context is held at C from step to step (the compacted tokens are overwritten by the next
tree), so every step is measured at the requested context. All state between phases lives in
persistent buffers, so each phase is one CUDA graph, captured once per (batch, policy), and
nothing syncs with the host inside a step (but the ragged verify's one read of its size).

Parts (one concept each): tree sources (sources/: dynamic EAGLE-2 top-k, static Sequoia shape,
dynamic-depth pruning of either, ECHO's shared verify budget, grafting of retrieved chains),
verifiers (verifiers/: dense over every slot, ragged over the kept nodes of trees that differ in
size per request), accept.py (accept + compact), graphs.py (phase graphs), retrieval.py (the
grafting policies' n-gram lookup), draws.py (common random numbers: every policy at one batch
sees the same acceptance draws, and `run(seed=...)` repeats a measurement on a fresh stream).
With grafting, chains reach below the draft depth: the accepted path, the compaction and the
draft extend are sized for depth + the longest chain the retrieval profile can accept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from spectune.executor.accept import PathAcceptor
from spectune.executor.drafter import Drafter, Eagle3Head
from spectune.executor.draws import CommonDraws
from spectune.executor.graphs import PhaseGraphs
from spectune.executor.model import Decoder, KVCache
from spectune.executor.retrieval import RetrievalDrafter
from spectune.executor.sources import Drafting, DraftRoot, is_ragged, make_source
from spectune.executor.synthetic import SyntheticAcceptance
from spectune.executor.tree_build import TreeBatch
from spectune.executor.verifiers import DenseVerifier, RaggedVerifier, Verifier
from spectune.kernels.ragged_plan import RaggedTreePlan
from spectune.kernels.timing import PhaseTimer
from spectune.kernels.tree_attention_plan import TreeAttentionPlan
from spectune.planner.trees import draft_widths
from spectune.specs import TreePolicy

SPEC_PHASES = ("draft", "tree", "verify", "accept", "compact", "extend")
AR_PHASES = ("verify",)


@dataclass(frozen=True)
class PhaseResult:
    """Median seconds per phase (+ 'overhead', 'step'), accepted draft tokens per step and,
    for ragged verifies (pruned or shared-budget trees), the tokens verified per sequence per
    step."""

    phases_s: dict[str, float]
    accepted: list[float]  # mean accepted draft tokens per sequence, one entry per timed step
    batch: int
    nodes: int  # tree slots per sequence (the budget, or the whole pool if smaller)
    verified: list[float] = field(default_factory=list)  # mean kept tokens/seq per step (ragged)
    extend_tokens: int = 0  # tokens per sequence the draft extend runs over (padded; 0: none)
    spread: list[float] = field(default_factory=list)  # std/mean of kept tokens/seq per step
    # tokens per sequence of each drafting step after the first where they are not the top-k
    # frontier: a static shape's drafted nodes per level (planner.trees.draft_widths)
    draft_widths: tuple[int, ...] | None = None

    @property
    def verified_mean(self) -> float:
        """Mean tokens verified per sequence per step (root included): `nodes` unless pruned."""
        if not self.verified:
            return float(self.nodes)
        return sum(self.verified) / len(self.verified)

    @property
    def verified_cv(self) -> float:
        """Mean over steps of the spread (std / mean over the batch's requests) of the tokens
        verified per sequence: 0 for equal trees (a dense verify)."""
        if not self.spread:
            return 0.0
        return sum(self.spread) / len(self.spread)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per sequence per step (accepted + bonus)."""
        return sum(self.accepted) / max(len(self.accepted), 1) + 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.tokens_per_step / self.phases_s["step"]


def _kernels_usable(device: torch.device) -> bool:
    """spectune.kernels' Triton paths run here: on CUDA, or on CPU under the interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


class SpecRunner:
    """Speculative decoding of `batch` sequences at `context` with `policy`: any policy the
    planner emits (dynamic top-k or static; pruned or not; per-request or shared verify budget;
    with or without grafting).

    use_kernels: spectune.kernels' tree attention, walk and compaction (on CUDA, or on CPU under
    the Triton interpreter), else span attention and the torch walk and compaction (a ragged
    verify always runs the kernels). seed: the common random draws' stream (draws.py).
    """

    def __init__(
        self,
        target: Decoder,
        drafter: Drafter,
        acceptance: object,
        policy: TreePolicy,
        batch: int,
        context: int,
        target_cache: KVCache,
        draft_cache: KVCache,
        *,
        use_graphs: bool = True,
        use_kernels: bool = True,
        seed: int = 0,
    ):
        self.target, self.drafter, self.policy = target, drafter, policy
        self.acceptance = acceptance
        self.batch, self.context = batch, context
        self.tcache, self.dcache = target_cache, draft_cache
        dev = self.device = target.device
        use_kernels = use_kernels and _kernels_usable(dev)
        self.root = DraftRoot(
            token=torch.randint(0, drafter.vocab - 1, (batch,), dtype=torch.int64, device=dev),
            hidden=torch.zeros((batch, drafter.spec.hidden), dtype=target.dtype, device=dev),
        )
        other = target.spec.vocab - 1  # a token no draft holds (drafts skip the last id)
        self.draws = CommonDraws(batch, dev, seed)
        syn = SyntheticAcceptance(acceptance, policy.depth, policy.topk, dev, self.draws)
        drafting = Drafting(drafter, draft_cache, syn, batch, context, self.root, other, dev)
        self.retrieval: RetrievalDrafter | None = None
        self.max_depth = policy.depth
        if policy.graft_budget > 0:
            self.retrieval = RetrievalDrafter(
                acceptance.retrieval,  # type: ignore[attr-defined]
                batch, max(context, 2 * policy.graft_budget + 2), policy.graft_budget, other,
                self.draws, dev,
            )  # fmt: skip
            self.max_depth += self.retrieval.max_chain
        self.ragged = is_ragged(policy, batch)
        self.source = make_source(policy, acceptance, drafting, self.retrieval, self.max_depth)
        self.nodes = self.source.nodes
        capture = target.eagle_capture_layers() if isinstance(drafter, Eagle3Head) else ()
        self.verifier = self._verifier(capture, other, use_kernels)
        self.verifier.draws = self.draws
        self.acceptor = PathAcceptor(
            self.source.tree, self.verifier.target_tok, self.root.token, target_cache,
            context, self.max_depth, use_kernels, rule=policy.verify,
        )  # fmt: skip
        self.graphs = PhaseGraphs(
            [self.draft, self.build, self.verify, self.accept, self.compact, self.extend],
            dev,
            use_graphs,
            eager=(2,) if self.verifier.eager else (),
        )
        if self.graphs.captured:
            self.verifier.graphs_captured(self.graphs.pool)
        self.warmed = False  # run() warms the verifier up once

    def _verifier(self, capture: tuple[int, ...], other: int, use_kernels: bool) -> Verifier:
        """Ragged over the kept nodes when trees differ in size per request (pruned or shared
        budget), else dense over every slot (with the tree-attention plan when the kernels are
        used)."""
        t, src = self.target, self.source
        cap = self.tcache.capacity
        if self.ragged:
            assert src.counts is not None
            plan = RaggedTreePlan(self.batch, self.nodes, self.context, cap, t.heads, self.device)
            return RaggedVerifier(
                t, self.tcache, src.tree, src.counts, self.context, capture, other, plan
            )
        dense = (
            TreeAttentionPlan(self.batch, self.nodes, self.context, cap, t.heads, self.device)
            if use_kernels
            else None
        )
        return DenseVerifier(t, self.tcache, src.tree, self.context, capture, other, dense)

    @property
    def tree(self) -> TreeBatch:
        """This step's verify trees [B, N] (the source's persistent TreeBatch)."""
        return self.source.tree

    @property
    def counts(self) -> torch.Tensor | None:
        """int64[B] kept nodes per sequence of pruned trees, else None."""
        return self.source.counts

    # ---- one step --------------------------------------------------------------------------------
    def draft(self) -> None:
        """Drafter steps over the root, then over the growing frontier (the tree source's);
        the common random draws move to the next step first."""
        self.draws.advance()
        self.source.draft()

    def build(self) -> None:
        """Phase "tree": this step's trees, handed to the verifier's attention plan."""
        self.source.build()
        self.verifier.load()

    def verify(self) -> None:
        """Target forward over the trees; argmax, drawn target tokens, EAGLE-3 features."""
        self.verifier.verify()

    def accept(self) -> None:
        """The longest matching root path of each tree and its bonus token (the next root);
        a grafting source records the emitted tokens (its retrieval history)."""
        self.acceptor.accept()
        if self.retrieval is not None:
            acc = self.acceptor
            tok = torch.gather(self.source.tree.tokens, 1, acc.path)  # [B, D+1], root first
            emitted = torch.cat((tok[:, 1:], tok[:, :1]), dim=1)
            emitted.scatter_(1, acc.num_acc[:, None], self.root.token[:, None])  # the bonus
            self.source.observe(emitted, acc.num_acc + 1)

    def compact(self) -> None:
        """The accepted path's K/V to contiguous positions after the context."""
        self.acceptor.compact()

    def extend(self) -> None:
        """Drafter pass over the accepted tokens (padded to max_depth + 1) -> the next root
        hidden."""
        b, c, a = self.batch, self.context, self.max_depth + 1
        path, hidden3 = self.acceptor.path, self.verifier.hidden3
        tokens = torch.gather(self.source.tree.tokens, 1, path)
        h3 = torch.gather(hidden3, 1, path[:, :, None].expand(b, a, hidden3.shape[-1]))
        pos = c + torch.arange(a, device=self.device).expand(b, a)
        causal = torch.ones((a, a), dtype=torch.bool, device=self.device).tril().expand(b, a, a)
        out = self.drafter.draft_extend(tokens, h3, pos, self.dcache, c, causal)
        num_acc = self.acceptor.num_acc
        last = torch.gather(out, 1, num_acc[:, None, None].expand(b, 1, out.shape[-1]))
        self.root.hidden.copy_(last[:, 0])

    # ---- timing ----------------------------------------------------------------------------------
    def run(self, steps: int, warmup: int = 3, seed: int | None = None) -> PhaseResult:
        """Time `steps` steps after `warmup` (at least the verifier's min_warmup; a ragged
        verifier then captures the verify graphs of the token buckets seen). The timed steps
        are steps 1.. of draw stream `seed` (None: the runner's), whatever the warm-up, so
        every policy run at this batch sees the same draws; a runner may run again with
        another seed (a repeat)."""
        fns = self.graphs.phases()
        first = not self.warmed  # a repeat needs no verifier warm-up or bucket captures
        for _ in range(max(warmup, self.verifier.min_warmup if first else 0)):
            for fn in fns:
                fn()
        if first:
            self.verifier.before_timing()
            self.warmed = True
        self.draws.reset(seed)
        counts = self.source.counts if self.ragged else None
        hist = torch.zeros((steps, self.batch), dtype=torch.int64, device=self.device)
        kept = torch.zeros((steps, self.batch), dtype=torch.int64, device=self.device)
        timer = PhaseTimer(SPEC_PHASES, steps, self.device)

        def record(step: int) -> None:
            hist[step].copy_(self.acceptor.num_acc)
            if counts is not None:
                kept[step].copy_(counts)

        timer.run(fns, after_step=record)
        accepted = hist.float().mean(dim=1).tolist()
        verified, spread = [], []
        if counts is not None:
            k = kept.float()
            mean = k.mean(dim=1)
            verified = mean.tolist()
            spread = (k.std(dim=1, unbiased=False) / mean.clamp(min=1.0)).tolist()
        return PhaseResult(
            timer.medians_s(),
            accepted,
            self.batch,
            self.nodes,
            verified,
            self.max_depth + 1,
            spread,
            draft_widths(self.policy, self.acceptance, self.batch),  # type: ignore[arg-type]
        )


class ARRunner:
    """The same target without speculation: one token per sequence per step (the baseline)."""

    def __init__(
        self,
        target: Decoder,
        batch: int,
        context: int,
        cache: KVCache,
        *,
        use_graphs: bool = True,
        use_kernels: bool = False,
    ):
        self.target, self.batch, self.context, self.cache = target, batch, context, cache
        dev = target.device
        self.device = dev
        self.token = torch.randint(0, target.spec.vocab, (batch, 1), dtype=torch.int64, device=dev)
        self.pos = torch.full((batch, 1), context, dtype=torch.int64, device=dev)
        self.mask = torch.ones((batch, 1, 1), dtype=torch.bool, device=dev)
        # the same attention kernel as the speculative runs, so the baseline is like for like
        self.plan = (
            TreeAttentionPlan(batch, 1, context, cache.capacity, target.heads, dev)
            if use_kernels
            else None
        )
        if self.plan is not None:
            self.plan.set_mask(self.mask)
        self.graphs = PhaseGraphs([self.verify], dev, use_graphs)

    def verify(self) -> None:
        hidden, _ = self.target.forward(
            self.token, self.pos, self.cache, self.context, self.mask, plan=self.plan
        )
        self.token.copy_(self.target.lm_head(hidden).argmax(dim=-1))

    def run(self, steps: int, warmup: int = 3) -> PhaseResult:
        fns = self.graphs.phases()
        for _ in range(warmup):
            fns[0]()
        timer = PhaseTimer(AR_PHASES, steps, self.device)
        timer.run(fns)
        return PhaseResult(timer.medians_s(), [0.0] * steps, self.batch, 1)
