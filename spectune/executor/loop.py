"""The speculative-decoding loop, phase by phase, and the same runner without speculation.

One speculative step for B sequences at context C (tree of N nodes, depth d, top-k k):
    draft     drafter step over the root (1 token/seq), then d-1 steps over the k-node frontier,
              filling the candidate pool (real logits + top-k; synthetic confidences)
    tree      keep the N-1 best pool entries (tree_build.select_tree) + ancestor mask
    verify    target forward over the N tree tokens (tree attention), logits + argmax on every
              node; target tokens drawn from the acceptance model (synthetic.py)
    accept    greedy verification: longest root path whose tokens match (kernels.walk_tree or torch)
    compact   move the accepted path's K/V to contiguous positions C .. C+d (all layers at once)
    extend    drafter pass over the accepted tokens (padded to d+1) -> next root hidden state
The context is held at C from step to step (the compacted tokens are overwritten by the next
tree), so every step is measured at the requested context. All state between phases lives in
persistent buffers, so each phase is one CUDA graph, captured once per (batch, policy), and
nothing syncs with the host inside a step.

Pruned policies (prune_threshold > 0, dynamic-depth pruning) verify only the kept nodes, as the
cost model prices them (mean kept tokens per sequence):
    tree      the same selection, then tree_build.prune_tree drops nodes whose path draft
              probability < threshold and compacts each row; the kept nodes of all sequences are
              packed into T = sum(counts) rows (attention.RaggedLayout), still one graph
    verify    reads T (the step's one host sync, timed in this phase, as engines do one per
              step), then replays the verify graph of the token bucket >= T (multiples of
              attention.TOKEN_BUCKET up to B x N, captured lazily per bucket; padding rows form
              a scratch sequence that reads and writes no real K/V); after warm-up a bucket may
              run at one up to ROUTE_REACH buckets larger whose weight GEMMs measured cheaper
              (attention.route_buckets); argmax and EAGLE-3 features are
              scattered back to the [B, N] layout, where pruned slots hold a token that never
              matches (tree_build.PRUNED), so accept / compact / extend run unchanged.
Grafting is not run: it fills freed slots with retrieved continuations and the executor has no
retrieval drafter.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from spectune.executor.attention import TOKEN_BUCKET, KernelLayout, RaggedLayout, route_buckets
from spectune.executor.drafter import Drafter, Eagle3Head
from spectune.executor.gemm import linear
from spectune.executor.model import Decoder, KVCache
from spectune.executor.static_draft import StaticPlan
from spectune.executor.synthetic import SyntheticAcceptance, draw_target_tokens
from spectune.executor.timing import PhaseTimer, graph_time
from spectune.executor.tree_build import (
    PRUNED,
    TreeBatch,
    pool_levels,
    pool_size,
    prune_tree,
    select_tree,
    stable_topk,
    tree_size,
)
from spectune.specs import SpecError, TreePolicy

SPEC_PHASES = ("draft", "tree", "verify", "accept", "compact", "extend")
AR_PHASES = ("verify",)
ROUTE_REACH = 4  # a pruned step may run up to 4 token buckets above its own (route_buckets)
PRUNED_WARMUP = 6  # warm-up steps of a pruned run: enough totals T to pre-capture their buckets


@dataclass(frozen=True)
class PhaseResult:
    """Median seconds per phase (+ 'overhead', 'step'), accepted draft tokens per step and,
    for pruned trees, the tokens verified per sequence per step."""

    phases_s: dict[str, float]
    accepted: list[float]  # mean accepted draft tokens per sequence, one entry per timed step
    batch: int
    nodes: int  # tree slots per sequence (the budget, or the whole pool if smaller)
    verified: list[float] = field(default_factory=list)  # mean kept tokens/seq per step (pruned)

    @property
    def verified_mean(self) -> float:
        """Mean tokens verified per sequence per step (root included): `nodes` unless pruned."""
        if not self.verified:
            return float(self.nodes)
        return sum(self.verified) / len(self.verified)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per sequence per step (accepted + bonus)."""
        return sum(self.accepted) / max(len(self.accepted), 1) + 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.tokens_per_step / self.phases_s["step"]


def _walk_kernel_ready() -> bool:
    try:
        from spectune.kernels import verify as _v
    except ImportError:
        return False
    return hasattr(_v, "walk_tree")


def verify_tokens(policy: TreePolicy, acceptance: object) -> int:
    """Tree nodes (root included) the runner verifies per sequence for this policy."""
    if policy.builder == "static":
        from spectune.planner.trees import static_shape

        return int(static_shape(acceptance, policy.budget, policy.depth, policy.topk).parents.size)  # type: ignore[arg-type]
    return tree_size(policy.depth, policy.topk, policy.budget)


def _walk_kernel_works(device: torch.device) -> bool:
    """Whether kernels.walk_tree compiles and agrees with the torch walk on a small tree here."""
    from spectune.kernels.verify import walk_tree

    par = torch.tensor([[-1, 0, 0, 1]], device=device)
    tok = torch.tensor([[9, 1, 2, 3]], device=device)
    tgt = torch.tensor([[1, 3, 0, 0]], device=device)
    try:
        res = walk_tree(
            tok.reshape(-1),
            par.to(torch.int32).reshape(-1),
            torch.tensor([0, 4], dtype=torch.int32, device=device),
            tgt.reshape(-1),
            max_nodes=4,
        )
    except Exception:  # a kernel that fails to build: the torch walk stands in
        return False
    return int(res.num_accepted[0]) == 2 and int(res.next_token[0]) == 0


class _Graphs:
    """Each phase function as a CUDA graph (one memory pool), or itself when not on CUDA; the
    phases at indices `eager` stay Python (they sync with the host and replay graphs of their
    own, captured into `pool`)."""

    def __init__(
        self,
        fns: list[Callable[[], None]],
        device: torch.device,
        use_graphs: bool,
        eager: Collection[int] = (),
    ):
        self.fns = fns
        self.graphs: list[torch.cuda.CUDAGraph | None] = []
        self.pool: Any = None
        if device.type != "cuda" or not use_graphs:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: allocator, cuBLAS handles, Triton compiles
            for _ in range(2):
                for fn in fns:
                    fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        self.pool = pool
        for i, fn in enumerate(fns):
            if i in eager:
                self.graphs.append(None)
                continue
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                fn()
            self.graphs.append(g)
        torch.cuda.synchronize()

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def phases(self) -> list[Callable[[], None]]:
        if self.graphs:
            return [
                fn if g is None else g.replay for fn, g in zip(self.fns, self.graphs, strict=True)
            ]
        return self.fns


class SpecRunner:
    """Speculative decoding of `batch` sequences at `context` with `policy` (dynamic top-k or
    static; with or without pruning; no grafting, no shared verify budget)."""

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
    ):
        if policy.graft_budget > 0:
            raise SpecError(
                f"graft_budget {policy.graft_budget}: the executor cannot graft (grafting fills "
                "pruned slots with retrieved n-gram/suffix continuations and the executor has no "
                "retrieval drafter); run the policy with graft_budget 0, or plan without "
                "grafting (PolicySpace graft=(0, 0), as spectune.validate.planned does)"
            )
        if policy.shared_budget:
            raise SpecError(
                f"policy {policy.label}: the executor does not run ECHO's shared verify budget "
                "yet (one budget of batch x (budget - 1) draft tokens split across the batch by "
                "P(accepted)); run its per-request equivalent (shared_budget false, no ',echo' "
                "suffix), or plan without it (PolicySpace allow_shared=False, as "
                "spectune.validate.planned does)"
            )
        self.prune = float(policy.prune_threshold)
        self.target, self.drafter, self.policy = target, drafter, policy
        self.batch, self.context = batch, context
        self.tcache, self.dcache = target_cache, draft_cache
        d, k = policy.depth, policy.topk
        self.static: StaticPlan | None = None
        if policy.builder == "static":  # the planner's Sequoia shape for this acceptance model
            from spectune.planner.trees import static_shape

            shape = static_shape(acceptance, policy.budget, d, k)  # type: ignore[arg-type]
            self.static = StaticPlan(shape.parents, shape.rank, target.device)
        self.nodes = self.static.nodes if self.static else tree_size(d, k, policy.budget)
        dev = target.device
        self.device = dev
        self.syn = SyntheticAcceptance(acceptance, d, k, dev)
        if use_kernels:  # on CPU only under the Triton interpreter (tests)
            from spectune.executor.attention import kernels_ready

            interpreted = os.environ.get("TRITON_INTERPRET") == "1"
            use_kernels = (dev.type == "cuda" or interpreted) and kernels_ready()
        self.layout = (
            KernelLayout(batch, self.nodes, context, target_cache.capacity, dev)
            if use_kernels
            else None
        )
        self.walk = use_kernels and _walk_kernel_ready() and _walk_kernel_works(dev)
        b, n, p = batch, self.nodes, pool_size(d, k)
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        f32: dict[str, Any] = {"dtype": torch.float32, "device": dev}
        hd = drafter.spec.hidden
        self.eagle = isinstance(drafter, Eagle3Head)
        self.capture_layers = target.eagle_capture_layers() if self.eagle else ()
        # persistent state (read and written by the phase graphs)
        self.root_token = torch.randint(0, drafter.vocab - 1, (b,), **i64)
        self.root_hidden = torch.zeros((b, hd), dtype=target.dtype, device=dev)
        self.pool_token = torch.zeros((b, p), **i64)
        self.pool_parent = torch.full((b, p), -1, **i64)
        self.pool_score = torch.zeros((b, p), **f32)
        self.pool_accept = torch.zeros((b, p), **f32)
        self.pool_lo = torch.zeros((b, p), **f32)
        self.pool_level = torch.tensor(pool_levels(d, k), **i64)
        self.slots = 1 + (d - 1) * k
        self.slot_mask = torch.zeros((b, self.slots, self.slots), dtype=torch.bool, device=dev)
        self.true = torch.ones((), dtype=torch.bool, device=dev)
        self.tree = self._select()
        if self.static is not None:  # fixed shape: parents, depths and mask never change
            st = self.static
            self.tree = TreeBatch(
                st.parents.expand(b, n).contiguous(),
                torch.zeros((b, n), **i64),
                st.depth.expand(b, n).contiguous(),
                torch.ones((b, n), **f32),
                torch.zeros((b, n), **f32),
                st.mask.expand(b, n, n).contiguous(),
            )
            self.static_pos = [
                torch.full((b, lv.nodes.numel()), context + i, **i64)
                for i, lv in enumerate(st.levels)
            ]
        self.drafted = self.tree  # the tree drafting writes (static: the full shape)
        self.ragged: RaggedLayout | None = None
        if self.prune > 0:
            if self.static is not None:  # draft the full shape (+ path log-probs), verify a cut
                t0 = self.tree
                self.drafted = TreeBatch(
                    t0.parents.clone(), t0.tokens.clone(), t0.depth.clone(), t0.accept.clone(),
                    t0.lo.clone(), t0.mask.clone(), torch.zeros((b, n), **f32),
                )  # fmt: skip
            self.counts = torch.full((b,), n, **i64)
            self.ragged = RaggedLayout(b, n, context, target_cache.capacity, dev)
            self.ragged.set_trees(self.tree.tokens, self.tree.depth, self.tree.mask, self.counts)
            self._bucket_graphs: dict[int, torch.cuda.CUDAGraph] = {}
            self._totals: list[int] = []  # T of every verify so far (host ints: already synced)
            self._route: dict[int, int] = {}  # bucket -> the bucket it runs at (_precapture)
        self.target_tok = torch.zeros((b, n), **i64)
        # [B*N + 1]: the last entry is the sink that packed padding rows scatter into
        self.argmax_flat = torch.zeros((b * n + 1,), **i64)
        self.argmax_tok = self.argmax_flat[: b * n].view(b, n)
        h3 = 3 * target.spec.hidden if self.eagle else 1
        self.hidden3_flat = torch.zeros((b * n + 1, h3), dtype=target.dtype, device=dev)
        self.hidden3 = self.hidden3_flat[: b * n].view(b, n, h3)
        self.num_acc = torch.zeros((b,), **i64)
        self.path = torch.zeros((b, d + 1), **i64)
        self.path32 = torch.zeros((b, d + 1), dtype=torch.int32, device=dev)  # kernels' dtype
        self.num_acc32 = torch.zeros((b,), dtype=torch.int32, device=dev)
        self.other = target.spec.vocab - 1  # a token no draft holds (drafts skip the last id)
        self._bucket_graphs_on = False  # the phases' warm-up runs the ragged verify eagerly
        self.graphs = _Graphs(
            [self.draft, self.build, self.verify, self.accept, self.compact, self.extend],
            dev,
            use_graphs,
            eager=(2,) if self.ragged is not None else (),
        )
        self._bucket_graphs_on = self.graphs.captured

    # ---- phases ----------------------------------------------------------------------------------
    def _topk_tokens(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Draft logits of hidden [B, W, h] and their top-k token ids [B, W, k]."""
        logits = self.drafter.logits(hidden)
        limit = min(logits.shape[-1], self.other)
        return torch.topk(logits[..., :limit], k, dim=-1).indices

    def draft(self) -> None:
        if self.static is not None:
            self._draft_static(self.static)
            return
        d, k, b, c = self.policy.depth, self.policy.topk, self.batch, self.context
        dev = self.device
        ones = torch.ones((b, 1, 1), dtype=torch.bool, device=dev)
        pos = torch.full((b, 1), c, dtype=torch.int64, device=dev)
        hid = self.drafter.draft_step(
            self.root_token[:, None], self.root_hidden[:, None], pos, self.dcache, c, 0, ones
        )
        tok = self._topk_tokens(hid, k)  # [B, 1, k]
        logc, acc, lo = self.syn.children(1, self.syn.draw_rows(1, (b, 1), dev), k)
        self.pool_token[:, :k] = tok[:, 0]
        self.pool_parent[:, :k] = -1
        self.pool_score[:, :k] = logc[:, 0]
        self.pool_accept[:, :k] = acc[:, 0]
        self.pool_lo[:, :k] = lo[:, 0]
        sm = self.slot_mask
        sm.zero_()
        sm[:, :, 0] = True  # every slot descends from the root; level-1 slots 1..k: root + self
        sm[:, 0, 0] = True
        if d > 1:
            idx = torch.arange(1, 1 + k, device=dev)
            sm[:, idx, idx] = self.true  # a device scalar: no host copy under graph capture
        frontier = torch.arange(k, device=dev).expand(b, k)
        fr_hidden = hid.expand(b, k, hid.shape[-1])
        for level in range(1, d):
            slot0 = 1 + (level - 1) * k
            tokens = torch.gather(self.pool_token, 1, frontier)
            pos = torch.full((b, k), c + level, dtype=torch.int64, device=dev)
            mask = sm[:, slot0 : slot0 + k, : slot0 + k]
            hid = self.drafter.draft_step(tokens, fr_hidden, pos, self.dcache, c, slot0, mask)
            ctok = self._topk_tokens(hid, k)  # [B, k, k]
            logc, acc, lo = self.syn.children(
                level + 1, self.syn.draw_rows(level + 1, (b, k), dev), k
            )
            score = torch.gather(self.pool_score, 1, frontier)[:, :, None] + logc
            base = k + (level - 1) * k * k
            span = slice(base, base + k * k)
            self.pool_token[:, span] = ctok.reshape(b, k * k)
            self.pool_parent[:, span] = frontier[:, :, None].expand(b, k, k).reshape(b, k * k)
            self.pool_score[:, span] = score.reshape(b, k * k)
            self.pool_accept[:, span] = acc.reshape(b, k * k)
            self.pool_lo[:, span] = lo.reshape(b, k * k)
            if level < d - 1:
                sel = stable_topk(score.reshape(b, k * k), k)  # [B, k]
                frontier = base + sel
                j = sel // k
                fr_hidden = torch.gather(hid, 1, j[:, :, None].expand(b, k, hid.shape[-1]))
                new = slot0 + k + torch.arange(k, device=dev)
                rows = torch.gather(sm, 1, (slot0 + j)[:, :, None].expand(b, k, self.slots))
                rows[:, torch.arange(k, device=dev), new] = self.true
                sm[:, new] = rows

    def _draft_static(self, st: StaticPlan) -> None:
        """Draft a fixed shape level by level: the rank-r child of each drafted node takes its
        r-th most probable token and the r-th entry of the node's bank row."""
        b, c, dev, t = self.batch, self.context, self.device, self.drafted
        t.tokens[:, 0] = self.root_token
        prev = self.root_hidden[:, None]
        mask_all = st.slot_mask.expand(b, st.slots, st.slots)
        for i, lv in enumerate(st.levels):
            w = lv.nodes.numel()
            tokens = t.tokens[:, lv.nodes]
            hidden = prev[:, lv.from_prev]
            mask = mask_all[:, lv.slot0 : lv.slot0 + w, : lv.slot0 + w]
            hid = self.drafter.draft_step(
                tokens, hidden, self.static_pos[i], self.dcache, c, lv.slot0, mask
            )
            top = self._topk_tokens(hid, lv.width)  # [B, W, width]
            logc, acc, lo = self.syn.children(
                i + 1, self.syn.draw_rows(i + 1, (b, w), dev), lv.width
            )
            t.tokens[:, lv.children] = top.reshape(b, -1)[:, lv.pick]
            t.accept[:, lv.children] = acc.reshape(b, -1)[:, lv.pick]
            t.lo[:, lv.children] = lo.reshape(b, -1)[:, lv.pick]
            if t.score is not None:  # pruning: path log-prob = parent's + own draft log-prob
                own = logc.reshape(b, -1)[:, lv.pick]
                t.score[:, lv.children] = t.score[:, lv.child_parents] + own
            prev = hid

    def build(self) -> None:
        if self.ragged is not None:
            self._build_pruned(self.ragged)
            return
        if self.static is not None:  # the shape is fixed; only the kernels' mask words are set
            if self.layout is not None:
                self.layout.set_mask(self.tree.mask)
            return
        t = self._select()
        for name in ("parents", "tokens", "depth", "accept", "lo", "mask"):
            getattr(self.tree, name).copy_(getattr(t, name))
        if self.layout is not None:
            self.layout.set_mask(self.tree.mask)

    def _select(self, with_score: bool = False) -> TreeBatch:
        """The dynamic top-k tree of this step from the drafted pool (tree_build.select_tree)."""
        return select_tree(
            self.pool_token,
            self.pool_parent,
            self.pool_score,
            self.pool_accept,
            self.pool_lo,
            self.pool_level,
            self.root_token,
            self.nodes,
            self.policy.depth,
            with_score=with_score,
        )

    def _build_pruned(self, lay: RaggedLayout) -> None:
        """Select (dynamic) or take the drafted shape (static), prune, compact, pack."""
        full = self.drafted if self.static is not None else self._select(with_score=True)
        t, counts = prune_tree(full, self.prune)
        for name in ("parents", "tokens", "depth", "accept", "lo", "mask"):
            getattr(self.tree, name).copy_(getattr(t, name))
        self.counts.copy_(counts)
        lay.set_trees(self.tree.tokens, self.tree.depth, self.tree.mask, self.counts)

    def verify(self) -> None:
        if self.ragged is not None:
            self._verify_ragged(self.ragged)
            return
        t = self.tree
        hidden, captured = self.target.forward(
            t.tokens,
            self.context + t.depth,
            self.tcache,
            self.context,
            t.mask,
            capture=self.capture_layers,
            kernel=self.layout,
        )
        logits = self.target.lm_head(hidden)  # [B, N, vocab]
        self.argmax_tok.copy_(logits.argmax(dim=-1))
        self.target_tok.copy_(draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, self.other))
        if captured:
            self.hidden3.copy_(torch.cat(captured, dim=-1))

    def _verify_ragged(self, lay: RaggedLayout) -> None:
        """Read T (one host sync), then run the verify of its token bucket (a CUDA graph)."""
        total = int(lay.total.item())
        self._totals.append(total)
        tokens = self._route.get(lay.bucket(total), lay.bucket(total))
        if not self._bucket_graphs_on:
            self.verify_packed(tokens)
            return
        g = self._bucket_graphs.get(tokens)
        if g is None:
            g = self._capture_bucket(tokens)
        g.replay()

    def _capture_bucket(self, tokens: int, warm: bool = True) -> torch.cuda.CUDAGraph:
        """The verify graph of one token bucket, in the phases' memory pool (one warm-up run
        first: Triton compiles and allocator growth stay outside the capture). `warm=False`
        for a bucket smaller than the step now in the layout: running it would read rows past
        the bucket (the layout's indptr covers all of this step's T rows); capture records
        without running, and every bucket shares the kernels' one compile."""
        assert self.ragged is not None
        self.ragged.view(tokens)
        cur = torch.cuda.current_stream()
        if warm:
            side = torch.cuda.Stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                self.verify_packed(tokens)
            cur.wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.graphs.pool):
            self.verify_packed(tokens)
        self._bucket_graphs[tokens] = g
        return g

    def verify_packed(self, tokens: int) -> None:
        """Target forward over the first `tokens` packed rows (kept nodes, then padding), LM
        head + argmax on each, results scattered to the [B, N] layout; target tokens drawn."""
        lay = self.ragged
        assert lay is not None
        view = lay.view(tokens)
        view.prepare()
        hidden, captured = self.target.forward_ragged(
            lay.tokens[:tokens], lay.pos[:tokens], self.tcache, view, capture=self.capture_layers
        )
        dest = lay.dest[:tokens]
        self.argmax_flat.fill_(PRUNED)
        self.argmax_flat.scatter_(0, dest, self.target.lm_head(hidden).argmax(dim=-1))
        t = self.tree
        self.target_tok.copy_(draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, self.other))
        if captured:
            self.hidden3_flat.index_copy_(0, dest, torch.cat(captured, dim=-1))

    def _precapture(self) -> None:
        """Capture the verify graphs of the token buckets around the totals seen in warm-up,
        so that few captures fall inside the timed steps (those that do are rare outliers the
        per-phase medians ignore)."""
        assert self.ragged is not None
        if not self._totals or not self._bucket_graphs_on:
            return
        lo, hi = min(self._totals), max(self._totals)
        spread = max(2 * TOKEN_BUCKET, hi - lo)
        first = self.ragged.bucket(max(lo - spread, 1))
        last = self.ragged.bucket(hi + spread)
        now = self.ragged.bucket(int(self.ragged.total.item()))  # the step in the layout
        reach = last + ROUTE_REACH * TOKEN_BUCKET
        sizes = sorted({self.ragged.bucket(t) for t in range(first, reach + 1)})
        self._route = route_buckets(self._gemm_cost_s(sizes), ROUTE_REACH)
        for tokens in (now, *sorted({self._route.get(b, b) for b in sizes if b <= last})):
            if tokens not in self._bucket_graphs:  # warm `now` first
                self._capture_bucket(tokens, warm=tokens >= now)
        torch.cuda.synchronize()

    def _gemm_cost_s(self, sizes: list[int]) -> dict[int, float]:
        """Seconds of the target's weight GEMMs of one verify at each token count: every layer's
        q|k|v, o, gate|up and down plus the LM head (the part of a verify whose library kernel
        choice jumps with M). MoE targets: none (their experts run grouped Triton GEMMs, and
        an empty dict routes every bucket to itself)."""
        layers = self.target.layers
        if self.target.spec.is_moe or not layers:
            return {}
        w = layers[0]
        dev = self.target.device
        x = torch.zeros((max(sizes), max(w.wqkv.shape[1], w.wo.shape[1], w.w_down.shape[1])),
                        dtype=self.target.dtype, device=dev)  # fmt: skip
        lm = self.target.lm
        cost = {}
        for m in sizes:

            def gemms(m: int = m) -> None:
                for wt in (w.wqkv, w.wo, w.w_gate_up, w.w_down):
                    linear(x[:m, : wt.shape[1]], wt)

            def head(m: int = m) -> None:
                linear(x[:m, : lm.shape[1]], lm)

            cost[m] = len(layers) * graph_time(gemms, dev, reps=5) + graph_time(head, dev, reps=5)
        return cost

    def accept(self) -> None:
        t, b, d = self.tree, self.batch, self.policy.depth
        if self.walk:
            from spectune.kernels.verify import walk_tree

            n = self.nodes
            qo = torch.arange(b + 1, dtype=torch.int32, device=self.device) * n
            res = walk_tree(
                t.tokens.reshape(-1).contiguous(),
                t.parents.to(torch.int32).reshape(-1).contiguous(),
                qo,
                self.target_tok.reshape(-1).contiguous(),
                max_nodes=n,
            )
            path = res.accepted_nodes[:, : d + 1].long()
            num = res.num_accepted.long()
            last = torch.gather(path, 1, num[:, None])
            self.path.copy_(torch.where(path >= 0, path, last))
            self.num_acc.copy_(num)
            self.root_token.copy_(res.next_token)
            self.path32.copy_(self.path)
            self.num_acc32.copy_(num)
            return
        num, path, bonus = greedy_accept(t.parents, t.tokens, t.depth, t.mask, self.target_tok, d)
        self.num_acc.copy_(num)
        self.path.copy_(path)
        self.root_token.copy_(bonus)
        self.path32.copy_(path)
        self.num_acc32.copy_(num)

    def compact(self) -> None:
        if self.layout is None:
            compact_kv(self.tcache, self.batch, self.context, self.path)
            return
        from spectune.kernels.kv_compact import compact_kv as kernel_compact_kv

        kv = self.tcache.kv[:, :, : self.batch]  # [L, 2, B, cap, KVH, D]
        lyr, _, b, cap, kvh, d = kv.shape
        kernel_compact_kv(
            kv[:, 0].reshape(lyr, b * cap, kvh, d),
            kv[:, 1].reshape(lyr, b * cap, kvh, d),
            self.layout.kv_indptr[:b],
            self.layout.prefix,
            self.path32,
            self.num_acc32,
        )

    def extend(self) -> None:
        b, c, a = self.batch, self.context, self.policy.depth + 1
        tokens = torch.gather(self.tree.tokens, 1, self.path)
        h3 = torch.gather(
            self.hidden3, 1, self.path[:, :, None].expand(b, a, self.hidden3.shape[-1])
        )
        pos = c + torch.arange(a, device=self.device).expand(b, a)
        causal = torch.ones((a, a), dtype=torch.bool, device=self.device).tril().expand(b, a, a)
        out = self.drafter.draft_extend(tokens, h3, pos, self.dcache, c, causal)
        last = torch.gather(out, 1, self.num_acc[:, None, None].expand(b, 1, out.shape[-1]))
        self.root_hidden.copy_(last[:, 0])

    # ---- timing ----------------------------------------------------------------------------------
    def run(self, steps: int, warmup: int = 3) -> PhaseResult:
        """Time `steps` steps after `warmup` (pruned trees: at least PRUNED_WARMUP, then the
        verify graphs of the token buckets seen are captured before timing)."""
        fns = self.graphs.phases()
        if self.ragged is not None:
            warmup = max(warmup, PRUNED_WARMUP)
        for _ in range(warmup):
            for fn in fns:
                fn()
        if self.ragged is not None:
            self._precapture()
        hist = torch.zeros((steps, self.batch), dtype=torch.int64, device=self.device)
        kept = torch.zeros((steps, self.batch), dtype=torch.int64, device=self.device)
        timer = PhaseTimer(SPEC_PHASES, steps, self.device)

        def record(step: int) -> None:
            hist[step].copy_(self.num_acc)
            if self.ragged is not None:
                kept[step].copy_(self.counts)

        timer.run(fns, after_step=record)
        accepted = hist.float().mean(dim=1).tolist()
        verified = kept.float().mean(dim=1).tolist() if self.ragged is not None else []
        return PhaseResult(timer.medians_s(), accepted, self.batch, self.nodes, verified)


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
        self.layout = KernelLayout(batch, 1, context, cache.capacity, dev) if use_kernels else None
        if self.layout is not None:
            self.layout.set_mask(self.mask)
        self.graphs = _Graphs([self.verify], dev, use_graphs)

    def verify(self) -> None:
        hidden, _ = self.target.forward(
            self.token, self.pos, self.cache, self.context, self.mask, kernel=self.layout
        )
        self.token.copy_(self.target.lm_head(hidden).argmax(dim=-1))

    def run(self, steps: int, warmup: int = 3) -> PhaseResult:
        fns = self.graphs.phases()
        for _ in range(warmup):
            fns[0]()
        timer = PhaseTimer(AR_PHASES, steps, self.device)
        timer.run(fns)
        return PhaseResult(timer.medians_s(), [0.0] * steps, self.batch, 1)


def greedy_accept(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    depth: torch.Tensor,
    mask: torch.Tensor,
    target: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch greedy verification (the fallback of kernels.walk_tree).

    parents, tokens, depth, target: int64[B, N]; mask: bool[B, N, N] ancestor matrix.
    Returns (accepted draft tokens int64[B], path int64[B, max_depth+1] root first, padded with
    the last accepted node, bonus token int64[B])."""
    b, n = parents.shape
    match = tokens == torch.gather(target, 1, parents.clamp(min=0))
    match[:, 0] = True
    ok = ~(mask & ~match[:, None, :]).any(
        dim=-1
    )  # every node on the path matches its parent's target
    best = torch.where(ok, depth, -1).argmax(dim=1)  # deepest accepted node (lowest index on ties)
    num = torch.gather(depth, 1, best[:, None])[:, 0]
    on_path = torch.gather(mask, 1, best[:, None, None].expand(b, 1, n))[:, 0]  # [B, N]
    path = best[:, None].expand(b, max_depth + 2).clone()
    dest = torch.where(on_path, depth, max_depth + 1)
    path.scatter_(1, dest, torch.arange(n, device=parents.device).expand(b, n))
    bonus = torch.gather(target, 1, best[:, None])[:, 0]
    return num, path[:, : max_depth + 1], bonus


def compact_kv(cache: KVCache, batch: int, context: int, path: torch.Tensor) -> None:
    """Move the K/V of the accepted path (tree nodes path[b, j] at context + path[b, j]) to
    context + j, in every layer at once. Bytes: 2 * layers * 2 * B * (d+1) * KVH * D * elem."""
    kv = cache.kv[:, :, :batch]  # [L, 2, B, cap, KVH, D]
    lyr, two, b, _, kvh, d = kv.shape
    a = path.shape[1]
    idx = (context + path)[None, None, :, :, None, None].expand(lyr, two, b, a, kvh, d)
    moved = torch.gather(kv, 3, idx)
    kv[:, :, :, context : context + a].copy_(moved)
