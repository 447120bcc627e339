"""Ragged verify of pruned trees: only the kept nodes go through the target, as the cost model
prices them (mean kept tokens per sequence).

Tree phase: the kept nodes of all sequences are packed into T = sum(counts) rows of a
RaggedTreePlan (spectune.kernels.ragged_plan; fixed shapes, inside the tree phase's graph).
Verify phase: read T (the step's one host sync, timed in this phase, as engines do one per
step), then replay the verify graph of the token bucket >= T (multiples of TOKEN_BUCKET up to
B x N, captured lazily per bucket; padding rows form a scratch sequence that reads and writes
no real K/V). After warm-up a bucket may run at one up to ROUTE_REACH buckets larger whose
weight GEMMs measured cheaper (route_buckets). The argmax and EAGLE-3 features are scattered
back to the [B, N] layout, where pruned slots hold a token that never matches
(tree_build.PRUNED).
"""

from __future__ import annotations

from typing import Any

import torch

from spectune.executor.model import Decoder, KVCache
from spectune.executor.tree_build import PRUNED, TreeBatch
from spectune.executor.verifiers.base import Verifier
from spectune.kernels.gemm import linear
from spectune.kernels.ragged_plan import TOKEN_BUCKET, RaggedTreePlan
from spectune.kernels.timing import graph_time

ROUTE_REACH = 4  # a pruned step may run up to 4 token buckets above its own (route_buckets)
PRUNED_WARMUP = 6  # warm-up steps of a pruned run: enough totals T to pre-capture their buckets


def route_buckets(cost_s: dict[int, float], reach: int = 4, margin: float = 0.02) -> dict[int, int]:
    """Bucket -> the bucket its steps run at: the cheapest of it and the next `reach` larger
    buckets in `cost_s` (measured seconds per bucket), when that one is at least `margin`
    cheaper; otherwise itself. A larger bucket only adds padding rows, so any bucket >= the
    step's kept tokens is a valid verify; library GEMM heuristics make cost jump non-smoothly
    with M (H200, Llama-3.1-8B: M = 704 took 1.3 ms more per verify than M = 696)."""
    sizes = sorted(cost_s)
    route = {}
    for i, b in enumerate(sizes):
        best = min(sizes[i : i + reach + 1], key=lambda c: (cost_s[c], c))
        route[b] = best if cost_s[best] < (1.0 - margin) * cost_s[b] else b
    return route


class RaggedVerifier(Verifier):
    """Verify of the first counts[b] nodes of each row of `tree` through `plan`."""

    min_warmup = PRUNED_WARMUP
    eager = True

    def __init__(
        self,
        target: Decoder,
        cache: KVCache,
        tree: TreeBatch,
        counts: torch.Tensor,
        context: int,
        capture_layers: tuple[int, ...],
        other: int,
        plan: RaggedTreePlan,
    ):
        super().__init__(target, cache, tree, context, capture_layers, other)
        self.counts, self.plan = counts, plan
        plan.set_trees(tree.tokens, tree.depth, tree.mask, counts)
        self.pool: Any = None  # the phase graphs' memory pool, once they are captured
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> its verify graph
        self.totals: list[int] = []  # T of every verify so far (host ints: already synced)
        self.route: dict[int, int] = {}  # bucket -> the bucket it runs at (before_timing)

    def load(self) -> None:
        t = self.tree
        self.plan.set_trees(t.tokens, t.depth, t.mask, self.counts)

    def verify(self) -> None:
        """Read T (one host sync), then run the verify of its token bucket (a CUDA graph)."""
        lay = self.plan
        total = int(lay.total.item())
        self.totals.append(total)
        tokens = self.route.get(lay.bucket(total), lay.bucket(total))
        if self.pool is None:  # not captured (CPU, warm-up): run it eagerly
            self.verify_packed(tokens)
            return
        g = self.graphs.get(tokens)
        if g is None:
            g = self._capture_bucket(tokens)
        g.replay()

    def verify_packed(self, tokens: int) -> None:
        """Target forward over the first `tokens` packed rows (kept nodes, then padding), LM
        head + argmax on each, results scattered to the [B, N] layout; target tokens drawn."""
        lay = self.plan
        bucket = lay.bucket_plan(tokens)
        bucket.prepare()
        hidden, captured = self.target.forward_ragged(
            lay.tokens[:tokens], lay.pos[:tokens], self.cache, bucket, capture=self.capture_layers
        )
        dest = lay.dest[:tokens]
        self.argmax_flat.fill_(PRUNED)
        self.argmax_flat.scatter_(0, dest, self.target.lm_head(hidden).argmax(dim=-1))
        self.draw_targets()
        if captured:
            self.hidden3_flat.index_copy_(0, dest, torch.cat(captured, dim=-1))

    def graphs_captured(self, pool: Any) -> None:
        self.pool = pool

    def _capture_bucket(self, tokens: int, warm: bool = True) -> torch.cuda.CUDAGraph:
        """The verify graph of one token bucket, in the phases' memory pool (one warm-up run
        first: Triton compiles and allocator growth stay outside the capture). `warm=False`
        for a bucket smaller than the step in the plan: running it would read rows past the
        bucket (the plan's indptr covers all of this step's T rows); capture records without
        running, and every bucket shares the kernels' one compile."""
        self.plan.bucket_plan(tokens)
        cur = torch.cuda.current_stream()
        if warm:
            side = torch.cuda.Stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                self.verify_packed(tokens)
            cur.wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.verify_packed(tokens)
        self.graphs[tokens] = g
        return g

    def before_timing(self) -> None:
        """Capture the verify graphs of the token buckets around the totals seen in warm-up,
        so that few captures fall inside the timed steps (those that do are rare outliers the
        per-phase medians ignore), and route each bucket to its cheapest neighbour."""
        if not self.totals or self.pool is None:
            return
        lay = self.plan
        lo, hi = min(self.totals), max(self.totals)
        spread = max(2 * TOKEN_BUCKET, hi - lo)
        first = lay.bucket(max(lo - spread, 1))
        last = lay.bucket(hi + spread)
        now = lay.bucket(int(lay.total.item()))  # the step in the plan
        reach = last + ROUTE_REACH * TOKEN_BUCKET
        sizes = sorted({lay.bucket(t) for t in range(first, reach + 1)})
        cost = self.gemm_cost_s(sizes)
        group = getattr(self.target, "group", None)  # a TPDecoder's (spectune.executor.tp)
        if group is not None:  # rank 0's costs route every rank: their graphs' collectives pair up
            cost = group.broadcast_object(cost)
        self.route = route_buckets(cost, ROUTE_REACH)
        for tokens in (now, *sorted({self.route.get(b, b) for b in sizes if b <= last})):
            if tokens not in self.graphs:  # warm `now` first
                self._capture_bucket(tokens, warm=tokens >= now)
        torch.cuda.synchronize()

    def gemm_cost_s(self, sizes: list[int]) -> dict[int, float]:
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
