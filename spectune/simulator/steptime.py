"""Prices one server iteration with the planner's CostModel, fast enough to call every step.

An iteration is a ragged batch: decoding sequences verify their draft trees (tree tokens each,
root included) and prefilling sequences feed a chunk of their prompt. Its time is

    draft(B_dec, depth, topk) + target forward(all new tokens) + draft-extend(accepted tokens)
    + options (retrieval lookups of grafting policies, the pruning pass of pruning ones)
    + overhead(B, tree tokens)

One CostModel call costs about a millisecond however many points it prices (it is vectorised),
so the pricer evaluates each term on whole grids at once and looks iterations up in them:

- Pure-decode iterations (the steady state): per batch size, tables over tokens per sequence
  x context (context in steps of `context_quantum` tokens; attention is linear in context, so
  the batch's mean context prices the sum of its sequences' KV reads). A batch whose trees
  differ in size is priced at its mean tokens per sequence, linear between grid points.
- Iterations with prefill chunks: the CostModel's ragged forward runs eagerly and costs ~2 ms
  a call, too slow for every mixed step. It is matched by a uniform batch of B_s sequences, B_s
  a CUDA-graph size, with the same new tokens T, the same KV tokens and the same logits, plus the
  constant cost of eager launches (ragged minus graph-replayed ragged of one token). Weight
  GEMMs, LM head and KV reads are then exact; attention FLOPs are spread evenly over the
  sequences, which under-prices the quadratic attention of long prompt chunks (about 5-10% of
  a 4k-token chunk's forward). These are tabulated on log-spaced grids per B_s and interpolated.
  `exact_mixed=True` calls ragged_forward_time instead (slow; used to check the tables).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from spectune.specs import TreePolicy


class CostModelLike(Protocol):
    """The part of planner.costmodel.CostModel the simulator calls (docs/interfaces.md)."""

    def verify_time(self, batch: Any, tokens: Any, context: Any) -> Any: ...
    def ragged_forward_time(
        self, new_tokens: Any, context: Any, *, cuda_graph: bool = ...
    ) -> Any: ...
    def draft_time(
        self, batch: Any, depth: Any, topk: Any, context: Any, *, builder: str = ...
    ) -> Any: ...
    def draft_extend_time(self, batch: Any, accepted: Any, context: Any) -> Any: ...
    def step_overhead_time(self, batch: Any, tree_tokens: Any, *, builder: str = ...) -> Any: ...
    def ar_step_time(self, batch: Any, context: Any) -> Any: ...
    def option_time(self, batch: Any, policy: TreePolicy) -> Any: ...


@dataclass
class StepCost:
    """Seconds of one iteration, split the way the time breakdown reports them."""

    draft_s: float = 0.0
    forward_s: float = 0.0  # target forward: verify trees and/or prefill chunks
    extend_s: float = 0.0  # drafter pass over accepted (and prefilled) tokens
    overhead_s: float = 0.0  # sampling, tree build, scheduling, retrieval lookups, pruning

    @property
    def total_s(self) -> float:
        return self.draft_s + self.forward_s + self.extend_s + self.overhead_s


CTX_BLOCK = 256  # context bins computed per table extension
GRAPH_SIZES = (1, 2, 4, 8, *range(16, 257, 8))  # used when the cost model has no buckets
LOG_POINTS = 12  # log-grid points per doubling (mixed-batch tables)
LOG_MAX = 2.0**20  # largest tokens per sequence / context the mixed tables cover


def _lerp(vec: np.ndarray, x: float) -> float:
    """vec[x] for fractional x >= 0, linear between entries, clamped at the end."""
    i = int(x)
    if i >= vec.size - 1:
        return float(vec[-1])
    f = x - i
    return float(vec[i] + (vec[i + 1] - vec[i]) * f) if f else float(vec[i])


def _lerp_rows(table: np.ndarray, x: np.ndarray, col: np.ndarray) -> np.ndarray:
    """table[x[k], col[k]] for fractional x (first axis), linear between rows, clamped."""
    top = table.shape[0] - 1
    x = np.minimum(x, top)
    i = np.minimum(x.astype(np.int64), top - 1)
    f = x - i
    lo = table[i, col]
    return lo + (table[i + 1, col] - lo) * f


def _log_grid() -> np.ndarray:
    """0, then 1 .. LOG_MAX with LOG_POINTS per doubling."""
    k = int(math.log2(LOG_MAX) * LOG_POINTS) + 1
    return np.r_[0.0, 2.0 ** (np.arange(k) / LOG_POINTS)]


def _log_pos(x: float) -> float:
    """Fractional index of x in _log_grid()."""
    if x < 1.0:
        return x  # between 0 (index 0) and 1 (index 1)
    return 1.0 + math.log2(x) * LOG_POINTS


def _bilerp(t: np.ndarray, u: float, v: float) -> float:
    i, j = int(u), int(v)
    i = min(i, t.shape[0] - 2)
    j = min(j, t.shape[1] - 2)
    fu, fv = min(u - i, 1.0), min(v - j, 1.0)
    a = t[i, j] + (t[i, j + 1] - t[i, j]) * fv
    b = t[i + 1, j] + (t[i + 1, j + 1] - t[i + 1, j]) * fv
    return float(a + (b - a) * fu)


class StepPricer:
    """Iteration times from one CostModel, tabulated on first use (shared by the speculative
    and the speculation-off runs of a load level)."""

    def __init__(
        self,
        cost: CostModelLike,
        *,
        context_quantum: int = 16,
        has_drafter: bool = True,
        exact_mixed: bool = False,
    ):
        self.cost = cost
        self.q = max(1, int(context_quantum))
        self.has_drafter = has_drafter
        self.exact_mixed = exact_mixed
        self.max_tokens = 2  # token-axis length of the decode tables, grown on demand
        self._tables: dict[tuple[Any, ...], np.ndarray] = {}
        self._scalars: dict[tuple[Any, ...], float] = {}
        cal = getattr(cost, "calibration", None)
        sizes = tuple(getattr(cal, "graph_batch_sizes", ()) or GRAPH_SIZES)
        self.graph_sizes = np.asarray(sorted(sizes), dtype=np.int64)
        self._grid = _log_grid()
        one = np.ones(1)
        self.eager_s = float(cost.ragged_forward_time(one, one * 0)) - float(
            cost.ragged_forward_time(one, one * 0, cuda_graph=True)
        )

    # ---- tables ---------------------------------------------------------------------------------
    def _ctx_full(
        self, key: tuple[Any, ...], ci: int, fn: Callable[[np.ndarray], Any]
    ) -> np.ndarray:
        """The table `key` (last axis: context bins) covering bin `ci`; fn(contexts) computes it
        and is called again over a longer range when ci runs past the end."""
        t = self._tables.get(key)
        if t is None or ci >= t.shape[-1]:
            n = (ci // CTX_BLOCK + 1) * CTX_BLOCK
            c = np.arange(n, dtype=np.float64) * self.q
            t = np.asarray(fn(c), dtype=np.float64)
            self._tables[key] = t
        return t

    def _ctx_table(
        self, key: tuple[Any, ...], ci: int, fn: Callable[[np.ndarray], Any]
    ) -> np.ndarray:
        """Column `ci` (one context bin) of the table `key`."""
        return self._ctx_full(key, ci, fn)[..., ci]

    def _tokens_axis(self) -> np.ndarray:
        t = np.arange(self.max_tokens, dtype=np.float64)
        t[0] = 1.0  # index 0 unused: a sequence feeds at least one token
        return t

    def _grow(self, per_seq: float) -> None:
        if per_seq + 2 > self.max_tokens:
            self.max_tokens = int(per_seq) + 3
            for k in [k for k in self._tables if k[0] in ("fwd", "ext")]:
                del self._tables[k]

    def _bin(self, context: float) -> int:
        return int(context / self.q + 0.5)

    # ---- pure decode ------------------------------------------------------------------------------
    def decode_off(self, batch: int, context: float) -> StepCost:
        """A plain decode iteration (speculation off), overhead included."""
        col = self._ctx_table(
            ("ar", batch), self._bin(context), lambda c: self.cost.ar_step_time(batch, c)
        )
        return StepCost(forward_s=float(col))

    def decode_spec(
        self, batch: int, policy: TreePolicy, tree_tokens: int, accepted_tokens: int, context: float
    ) -> StepCost:
        """A speculative iteration where every sequence decodes: `tree_tokens` summed over the
        batch (roots included), `accepted_tokens` the accepted draft tokens summed over it."""
        per_tree = tree_tokens / batch
        per_ext = accepted_tokens / batch + 1.0  # draft extend: accepted tokens + the bonus token
        self._grow(max(per_tree, per_ext))
        ci = self._bin(context)
        t = self._tokens_axis()
        fwd = self._ctx_table(
            ("fwd", batch), ci, lambda c: self.cost.verify_time(batch, t[:, None], c[None, :])
        )
        cost = StepCost(
            forward_s=_lerp(fwd, per_tree),
            overhead_s=self._overhead(batch, per_tree, policy.builder),
        )
        if self.has_drafter:
            a = t.copy()
            a[0] = 0.0
            ext = self._ctx_table(
                ("ext", batch),
                ci,
                lambda c: self.cost.draft_extend_time(batch, a[:, None], c[None, :]),
            )
            cost.extend_s = _lerp(ext, per_ext)
            cost.draft_s = self._drafting(batch, policy, ci)
        cost.overhead_s += self._options(batch, policy)
        return cost

    def _drafting(self, batch: int, policy: TreePolicy, ci: int) -> float:
        key, price = self._draft_table(batch, policy)
        return float(self._ctx_table(key, ci, price))

    def _draft_table(
        self, batch: int, policy: TreePolicy
    ) -> tuple[tuple[Any, ...], Callable[[np.ndarray], Any]]:
        """(table key, pricer over contexts) of the drafting phase of `policy` at `batch`."""
        d, k, builder = policy.depth, policy.topk, policy.builder
        return ("draft", batch, d, k, builder), lambda c: self.cost.draft_time(
            batch, d, k, c, builder=builder
        )

    def _overhead(self, batch: int, per_seq: float, builder: str = "dynamic-topk") -> float:
        """Step overhead of `batch` sequences verifying `per_seq` tokens each (mean): a constant
        without a tree, affine in the tree tokens with one (the `builder`'s fixed tree-building
        cost plus a cost per node), so two points per batch size price every tree size."""
        if per_seq <= 1.0:
            return self._scalar(("ovh", batch, 1), lambda: self.cost.step_overhead_time(batch, 1))
        two = self._scalar(
            ("ovh", batch, 2, builder),
            lambda: self.cost.step_overhead_time(batch, 2, builder=builder),
        )
        three = self._scalar(
            ("ovh", batch, 3, builder),
            lambda: self.cost.step_overhead_time(batch, 3, builder=builder),
        )
        return two + (three - two) * (per_seq - 2.0)

    def _overhead_many(self, batch: int, per_seq: np.ndarray, builder: str) -> np.ndarray:
        """float64[K]: _overhead over K iterations (all with a tree)."""
        two = self._overhead(batch, 2.0, builder)
        return two + (self._overhead(batch, 3.0, builder) - two) * (per_seq - 2.0)

    def _options(self, batch: int, policy: TreePolicy) -> float:
        """Seconds of the policy's options per iteration of `batch` decoding sequences
        (CostModel.option_time: grafting's retrieval lookup, pruning's pass and ragged
        packing); 0 for a plain tree."""
        graft, prune = policy.graft_budget > 0, policy.prune_threshold > 0
        if not (graft or prune):
            return 0.0
        return self._scalar(
            ("opt", batch, graft, prune), lambda: self.cost.option_time(batch, policy)
        )

    def _scalar(self, key: tuple[Any, ...], fn: Callable[[], Any]) -> float:
        v = self._scalars.get(key)
        if v is None:
            v = float(np.asarray(fn()))
            self._scalars[key] = v
        return v

    # ---- runs of decode iterations (vectorised; see Replica._fast_forward) ----------------------
    def decode_off_many(self, batch: int, context: np.ndarray) -> np.ndarray:
        """float64[K]: plain decode iterations of `batch` sequences at mean contexts [K]."""
        ci = (context / self.q + 0.5).astype(np.int64)
        t = self._ctx_full(("ar", batch), int(ci.max()), lambda c: self.cost.ar_step_time(batch, c))
        return t[ci]

    def decode_spec_many(
        self,
        batch: int,
        policy: TreePolicy,
        tree_tokens: np.ndarray,
        accepted_tokens: np.ndarray,
        context: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(draft, forward, extend, overhead) float64[K] of K speculative all-decode iterations;
        per iteration the batch's summed tree tokens, accepted tokens and mean context [K]."""
        per_tree = tree_tokens / batch
        per_ext = accepted_tokens / batch + 1.0
        self._grow(max(float(per_tree.max()), float(per_ext.max())))
        ci = (context / self.q + 0.5).astype(np.int64)
        top = int(ci.max())
        t = self._tokens_axis()
        fwd = self._ctx_full(
            ("fwd", batch), top, lambda c: self.cost.verify_time(batch, t[:, None], c[None, :])
        )
        forward = _lerp_rows(fwd, per_tree, ci)
        k = ci.size
        overhead = (
            self._overhead_many(batch, per_tree, policy.builder)
            if float(per_tree.min()) > 1.0
            else np.array([self._overhead(batch, float(x), policy.builder) for x in per_tree])
        )
        overhead = overhead + self._options(batch, policy)
        draft = np.zeros(k)
        extend = np.zeros(k)
        if self.has_drafter:
            a = t.copy()
            a[0] = 0.0
            ext = self._ctx_full(
                ("ext", batch),
                top,
                lambda c: self.cost.draft_extend_time(batch, a[:, None], c[None, :]),
            )
            extend = _lerp_rows(ext, per_ext, ci)
            key, price = self._draft_table(batch, policy)
            draft = self._ctx_full(key, top, price)[ci]
        return draft, forward, extend, overhead

    # ---- iterations with prefill chunks ---------------------------------------------------------
    def _surrogate(self, kind: str, seqs: int, tokens: float, kv_tokens: float) -> float:
        """A ragged pass over `seqs` sequences, `tokens` new tokens and `kv_tokens` (cached + new)
        in total, priced as a uniform batch of a CUDA-graph size (see the module docstring)."""
        idx = int(np.searchsorted(self.graph_sizes, seqs, side="right")) - 1
        bs = int(self.graph_sizes[max(idx, 0)])
        n = tokens / bs
        c = max(kv_tokens / bs - n, 0.0)
        key = ("mix", kind, bs)
        t = self._tables.get(key)
        if t is None:
            g = self._grid
            if kind == "target":
                t = self.cost.verify_time(bs, g[:, None], g[None, :])
            else:
                t = self.cost.draft_extend_time(bs, g[:, None], g[None, :])
            t = np.asarray(t, dtype=np.float64)
            self._tables[key] = t
        return _bilerp(t, _log_pos(n), _log_pos(c))

    def mixed(
        self,
        policy: TreePolicy | None,
        dec_tokens: np.ndarray,
        dec_context: np.ndarray,
        dec_accepted: int,
        chunk_tokens: np.ndarray,
        chunk_context: np.ndarray,
    ) -> StepCost:
        """An iteration with prefill chunks: one ragged target forward over the decoders' trees
        (int[Bd], 1 each when speculation is off) and the chunks (int[Bp]), the drafting of the
        decoders, and one drafter pass over their accepted tokens and the chunks."""
        bd, bp = int(dec_tokens.size), int(chunk_tokens.size)
        b = bd + bp
        t_dec, t_pre = int(dec_tokens.sum()), int(chunk_tokens.sum())
        kv_dec = t_dec + int(dec_context.sum())
        kv_pre = t_pre + int(chunk_context.sum())
        if self.exact_mixed:
            fwd = float(
                self.cost.ragged_forward_time(
                    np.concatenate([dec_tokens, chunk_tokens]),
                    np.concatenate([dec_context, chunk_context]),
                )
            )
        else:
            fwd = self._surrogate("target", b, t_dec + t_pre, kv_dec + kv_pre) + self.eager_s
        builder = policy.builder if policy is not None else "dynamic-topk"
        cost = StepCost(forward_s=fwd, overhead_s=self._overhead(b, (t_dec + bp) / b, builder))
        if policy is not None:
            if self.has_drafter:
                if bd:
                    ci = self._bin(float(dec_context.mean()))
                    cost.draft_s = self._drafting(bd, policy, ci)
                # the drafter keeps its own KV: one pass over accepted tokens and prompt chunks
                new = dec_accepted + bd + t_pre  # accepted + bonus per decoder, and chunks
                kv = dec_accepted + bd + int(dec_context.sum()) + kv_pre
                seqs = bd + bp
                if new and seqs:
                    cost.extend_s = self._surrogate("drafter", seqs, new, kv)
            if bd:
                cost.overhead_s += self._options(bd, policy)
        return cost
