"""Prices one server iteration with the planner's CostModel, fast enough to call every step.

An iteration is a ragged batch: decoding sequences verify their draft trees (tree tokens each,
root included) and prefilling sequences feed a chunk of their prompt. Every term comes from the
cost model's StepBreakdown (CostModel.iteration); this module tabulates its fields and looks
them up, and adds no term of its own:

    draft_s(B_dec) (+ intermediate_s of a hierarchical policy, whose verify tokens are the
    target's chain and whose rounds are priced at their means)
    + verify_s or the ragged target forward (all new tokens)
    + extend_s or the drafter's ragged pass (accepted and prefilled tokens)
    + overhead_s(B, tree tokens) + retrieval_s + prune_s (B_dec) + engine_s(B)

One CostModel call costs about a millisecond however many points it prices (it is vectorised),
so the pricer evaluates each breakdown on whole grids at once and looks iterations up in them:

- Pure-decode iterations (the steady state): per (batch size, policy), one breakdown over
  tokens per sequence x accepted tokens x context (context in steps of `context_quantum`
  tokens; attention is linear in context, so the batch's mean context prices the sum of its
  sequences' KV reads) gives the draft, verify and extend tables. A batch whose trees differ in
  size is priced at its mean tokens per sequence, linear between grid points. The fixed terms
  (overhead, options, engine) come from one breakdown per policy over every batch size (up to a
  power of two) at 1, 2 and 3 tree tokens: overhead is a constant without a tree and affine in
  the tree tokens with one, so those points price every tree size exactly. Speculation off: the
  breakdown's total per batch size over context.
- Iterations with prefill chunks: the CostModel's ragged forward runs eagerly and costs ~2 ms
  a call, too slow for every mixed step. It is matched by a uniform batch of B_s sequences, B_s
  a CUDA-graph size, with the same new tokens T, the same KV tokens and the same logits, plus the
  constant cost of eager launches (ragged minus graph-replayed ragged of one token). Weight
  GEMMs, LM head and KV reads are then exact; attention FLOPs are spread evenly over the
  sequences, which under-prices the quadratic attention of long prompt chunks (about 5-10% of
  a 4k-token chunk's forward). These are tabulated on log-spaced grids per B_s and interpolated.
  `exact_mixed=True` calls ragged_forward_time instead (slow; used to check the tables). The
  drafter's pass over accepted tokens and chunks is priced the same way (draft_extend_time on
  the log grids); drafting, overhead, options and engine time are the breakdown's, as above.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from spectune.planner.step import StepBreakdown
from spectune.specs import SpecError, TreePolicy


class CostModelLike(Protocol):
    """The part of planner.costmodel.CostModel the simulator calls (docs/interfaces.md)."""

    def iteration(
        self,
        policy: TreePolicy | None,
        batch: Any,
        context: Any,
        *,
        tokens: Any = ...,
        accepted: Any = ...,
        rounds: Any = ...,
        tree_tokens: Any = ...,
        draft_widths: Any = ...,
    ) -> StepBreakdown: ...
    def verify_time(self, batch: Any, tokens: Any, context: Any) -> Any: ...
    def ragged_forward_time(
        self, new_tokens: Any, context: Any, *, cuda_graph: bool = ...
    ) -> Any: ...
    def draft_extend_time(self, batch: Any, accepted: Any, context: Any) -> Any: ...


@dataclass
class StepCost:
    """Seconds of one iteration, split the way the time breakdown reports them."""

    draft_s: float = 0.0
    forward_s: float = 0.0  # target forward: verify trees and/or prefill chunks
    extend_s: float = 0.0  # drafter pass over accepted (and prefilled) tokens
    overhead_s: float = 0.0  # sampling, tree build, scheduling, options, engine host time

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
    """Iteration times from one CostModel's breakdowns, tabulated on first use (shared by the
    speculative and the speculation-off runs of a load level)."""

    def __init__(
        self,
        cost: CostModelLike,
        *,
        context_quantum: int = 16,
        exact_mixed: bool = False,
        hierarchy: Any = None,
        acceptance: Any = None,
    ):
        self.cost = cost
        self.hierarchy = hierarchy  # planner.hierarchical.HierAcceptance, for chain > 0
        # the workload's acceptance model: a static policy drafts its shape's nodes per level
        # (planner.trees.draft_widths); None prices every policy's later draft steps at top-k
        self.acceptance = acceptance
        self.q = max(1, int(context_quantum))
        self.exact_mixed = exact_mixed
        self.max_tokens = 4  # token-axis length of the decode tables, grown on demand
        self._tables: dict[tuple[Any, ...], np.ndarray] = {}
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

    def _grow(self, per_seq: float) -> None:
        if per_seq + 2 > self.max_tokens:
            self.max_tokens = int(per_seq) + 3
            for k in [k for k in self._tables if k[0] == "spec"]:
                del self._tables[k]

    def _bin(self, context: float) -> int:
        return int(context / self.q + 0.5)

    def _spec_table(self, batch: int, policy: TreePolicy, ci: int) -> np.ndarray:
        """float64[3, T, C]: the draft_s, verify_s and extend_s fields of the policy's breakdown
        at `batch` over tokens per sequence (axis T: index i verifies max(i, 1) tree tokens and
        extends i accepted tokens) x context bins (axis C, covering bin `ci`)."""

        def price(c: np.ndarray) -> np.ndarray:
            t = np.arange(self.max_tokens, dtype=np.float64)
            n = t.copy()
            n[0] = 1.0  # a sequence verifies at least its root
            if policy.chain:  # T indexes the chain the target verifies; rounds at their means
                step = self.cost.iteration(
                    policy, batch, c[None, :], tokens=n[:, None], **self._hier_means(policy)
                )
                draft = step.draft_s + step.intermediate_s
                return np.stack(np.broadcast_arrays(draft, step.verify_s, step.extend_s))
            shape: dict[str, Any] = {}  # a static shape's drafted nodes per level
            if self.acceptance is not None and policy.builder == "static":
                from spectune.planner.trees import draft_widths

                shape["draft_widths"] = draft_widths(policy, self.acceptance, batch)
            step = self.cost.iteration(
                policy, batch, c[None, :], tokens=n[:, None], accepted=t[:, None], **shape
            )
            return np.stack([step.draft_s, step.verify_s, step.extend_s])

        return self._ctx_full(("spec", batch, policy), ci, price)

    def _hier_means(self, policy: TreePolicy) -> dict[str, float]:
        """The intermediate stage's mean rounds, accepted tokens per round and tree size of a
        hierarchical policy (planner.hierarchical.hierarchical_outcome), as iteration args."""
        from spectune.planner.hierarchical import hierarchical_outcome

        if self.hierarchy is None:
            raise SpecError(
                f"pricing the hierarchical policy {policy.label} needs the acceptance models "
                "of the intermediate stage (SimConfig.hierarchy)"
            )
        h = hierarchical_outcome(policy, self.hierarchy)
        return {"accepted": h.round_accepted, "rounds": h.rounds, "tree_tokens": h.tree_tokens}

    def _fixed(self, batch: int, policy: TreePolicy | None) -> np.ndarray:
        """float64[5] of the breakdown's context-independent terms at `batch`: overhead_s at 1,
        2 and 3 tree tokens per sequence, retrieval_s + prune_s, engine_s (tabulated for every
        batch size up to a power of two at once; speculation off: overhead at 1 token only)."""
        key = ("fixed", policy)
        t = self._tables.get(key)
        if t is None or batch >= t.shape[1]:
            b = np.arange(max(64, 1 << int(batch).bit_length()), dtype=np.float64)
            t = np.full((5, b.size), np.nan)
            if policy is None:
                step = self.cost.iteration(None, b, 0.0)
                t[0], t[4] = step.overhead_s, step.engine_s
            else:
                n = np.array([1.0, 2.0, 3.0])
                if policy.chain:  # its overhead does not depend on the chain: one column
                    means = self._hier_means(policy)
                    step = self.cost.iteration(policy, b[:, None], 0.0, tokens=n, **means)
                else:
                    step = self.cost.iteration(policy, b[:, None], 0.0, tokens=n, accepted=0.0)
                t[:3] = step.overhead_s.T
                t[3] = step.retrieval_s[:, 0] + step.prune_s[:, 0]
                t[4] = step.engine_s[:, 0]
            self._tables[key] = t
        return t[:, batch]

    @staticmethod
    def _overhead(fixed: np.ndarray, per_seq: float) -> float:
        """overhead_s of sequences verifying `per_seq` tokens each (mean): a constant without a
        tree, affine in the tree tokens with one (the builder's fixed tree-building cost plus a
        cost per node), so the breakdown at 2 and 3 tokens prices every tree size."""
        if per_seq <= 1.0:
            return float(fixed[0])
        two, three = float(fixed[1]), float(fixed[2])
        return two + (three - two) * (per_seq - 2.0)

    # ---- pure decode ------------------------------------------------------------------------------
    def _off_table(self, batch: int, ci: int) -> np.ndarray:
        """float64[C]: total_s of the speculation-off breakdown at `batch` over context bins."""
        return self._ctx_full(
            ("off", batch), ci, lambda c: self.cost.iteration(None, batch, c).total_s
        )

    def decode_off(self, batch: int, context: float) -> StepCost:
        """A plain decode iteration (speculation off), overhead included."""
        ci = self._bin(context)
        return StepCost(forward_s=float(self._off_table(batch, ci)[ci]))

    def decode_spec(
        self, batch: int, policy: TreePolicy, tree_tokens: int, accepted_tokens: int, context: float
    ) -> StepCost:
        """A speculative iteration where every sequence decodes: `tree_tokens` summed over the
        batch (roots included), `accepted_tokens` the accepted draft tokens summed over it."""
        per_tree = tree_tokens / batch
        per_ext = accepted_tokens / batch + 1.0  # draft extend: accepted tokens + the bonus token
        self._grow(max(per_tree, per_ext))
        ci = self._bin(context)
        tab = self._spec_table(batch, policy, ci)
        fixed = self._fixed(batch, policy)
        overhead = self._overhead(fixed, per_tree) + float(fixed[3])
        return StepCost(
            draft_s=float(tab[0, 0, ci]),
            forward_s=_lerp(tab[1, :, ci], per_tree),
            extend_s=_lerp(tab[2, :, ci], per_ext),
            overhead_s=overhead + float(fixed[4]),
        )

    # ---- runs of decode iterations (vectorised; see Replica._fast_forward) ----------------------
    def decode_off_many(self, batch: int, context: np.ndarray) -> np.ndarray:
        """float64[K]: plain decode iterations of `batch` sequences at mean contexts [K]."""
        ci = (context / self.q + 0.5).astype(np.int64)
        return self._off_table(batch, int(ci.max()))[ci]

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
        tab = self._spec_table(batch, policy, int(ci.max()))
        fixed = self._fixed(batch, policy)
        if float(per_tree.min()) > 1.0:
            two, three = float(fixed[1]), float(fixed[2])
            overhead = two + (three - two) * (per_tree - 2.0)
        else:
            overhead = np.array([self._overhead(fixed, float(x)) for x in per_tree])
        overhead = overhead + float(fixed[3]) + float(fixed[4])
        draft = tab[0, 0][ci]
        forward = _lerp_rows(tab[1], per_tree, ci)
        extend = _lerp_rows(tab[2], per_ext, ci)
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
        decoders, and one drafter pass over their accepted tokens and the chunks. The fixed
        terms are the breakdown's: overhead of all B sequences (a chunk counts one token),
        the policy's options for the Bd decoders, the engine's host time for B requests."""
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
        speculating = policy if bd else None
        fixed = self._fixed(b, speculating)
        cost = StepCost(forward_s=fwd, overhead_s=self._overhead(fixed, (t_dec + bp) / b))
        if speculating is not None:
            ci = self._bin(float(dec_context.mean()))
            cost.draft_s = float(self._spec_table(bd, speculating, ci)[0, 0, ci])
            cost.overhead_s += float(self._fixed(bd, speculating)[3])
        if policy is not None:
            # the drafter keeps its own KV: one pass over accepted tokens and prompt chunks
            new = dec_accepted + bd + t_pre  # accepted + bonus per decoder, and chunks
            kv = dec_accepted + bd + int(dec_context.sum()) + kv_pre
            if new and b:
                cost.extend_s = self._surrogate("drafter", b, new, kv)
        cost.overhead_s += float(fixed[4])
        return cost
