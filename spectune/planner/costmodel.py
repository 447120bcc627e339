"""Roofline cost model: seconds for each phase of a speculative-decoding iteration on one GPU.

The planner, the simulator and the dashboards call this thousands of times per study, so every
method takes numpy arrays that broadcast against each other and prices all points at once.

One forward pass is the sum over its kernels of max(FLOPs / (peak * eff), bytes / (bw * eff))
plus one launch per kernel (spectune.planner.forward lists the kernels, spectune.planner.operators
prices them). Efficiencies and fixed costs come from a Calibration (spectune.specs.calibration;
fitted by spectune.validate.fit from the executor's measurements, `spectune calibrate`),
defaulting to the HardwareSpec's public figures.

`CostModel.iteration` prices one whole decoding iteration of a batch and returns a
StepBreakdown (spectune.planner.step), the one price every consumer reads:

    draft      first step over 1 token/seq, then depth-1 steps over topk tokens/seq, + a fixed
               top-k/sort/pool cost per step, per tree builder, and per frontier slot
               of the later steps                                       (draft_time)
    verify     target over the tree tokens/seq, logits at every node    (verify_time)
               + the fixed cost of a speculative verify beyond its forward
               (features captured, target tokens drawn: Calibration.spec_verify_s)
    extend     drafter over the accepted tokens                         (draft_extend_time)
    overhead   scheduler, sampling, tree building: fixed + per level    (step_overhead_time)
               + per node
    retrieval  grafting's lookup, when graft_budget > 0                 (retrieval_time)
    pruning    pruning pass, ragged packing, host read, when pruning    (prune_time)
               or when trees differ in size per request (ECHO's shared budget, batch > 1)
    engine     the serving engine's host time (specs.engine.EngineOverheads)

A hierarchical policy (TreePolicy.chain > 0, arXiv 2505.22179) runs R rounds of (drafter tree
over the intermediate model, intermediate verify of the tree, drafter extend over what it
accepted) until the intermediate holds a chain, then one target verify of that chain:

    draft         R x draft_time of the intermediate's drafter        (draft_s)
    intermediate  R x intermediate forward over the tree tokens/seq   (intermediate_s)
    extend        R x drafter extend over the accepted tokens/round   (extend_s)
    verify        target over the chain + root tokens/seq, + spec_verify_s   (verify_s)
    overhead      fixed once, tree building R times; retrieval and pruning R times

The phase methods price one phase each; nothing outside this module adds them up.

Batches up to the largest CUDA-graph capture size are padded to the next captured size and
replay a graph; larger ones launch eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from spectune.planner.forward import CLASSES, BatchShape, ForwardPricer
from spectune.planner.operators import ACT_BYTES, F64, Rates, pad_up
from spectune.planner.step import StepBreakdown
from spectune.specs.calibration import Calibration
from spectune.specs.engine import NO_OVERHEADS, EngineOverheads
from spectune.specs.errors import SpecError
from spectune.specs.hardware import HardwareSpec
from spectune.specs.model import ModelSpec
from spectune.specs.policy import MAX_DEPTH, TreePolicy

BREAKDOWN_KEYS = CLASSES

SHARED_TREE_CV = 0.2
"""Spread (std / mean) of per-request tree sizes under a shared verify budget (ECHO) when the
caller does not know it: what the planner's shared-budget draws give (planner.trees.sample_step
at batch 8-64 on the mt-bench acceptance model: CV 0.15-0.24 for dynamic-topk 5/4/8, 6/8/32
and 7/10/60). The objective and check pass the acceptance model's own spread instead."""


def later_slots(depth: ArrayLike, topk: ArrayLike, widths: Sequence[int] | None) -> F64:
    """Tokens per sequence the drafting steps after the first run over, summed: each step's
    `widths` (a static shape's drafted nodes per level, planner.trees.draft_widths), or
    without them depth - 1 steps over the top-k frontier (the dynamic builder)."""
    d = np.asarray(depth, dtype=np.float64)
    if widths is not None:
        return np.where(d > 0, float(sum(widths)), 0.0)
    return np.maximum(d - 1, 0) * np.asarray(topk, dtype=np.float64)


def drafted_rows(
    batch: ArrayLike, depth: ArrayLike, topk: ArrayLike, widths: Sequence[int] | None = None
) -> F64:
    """Rows of drafter logits a drafting phase selects over: `batch` in its first step and
    batch x each later step's tokens (later_slots); none without steps."""
    b, d = np.asarray(batch, dtype=np.float64), np.asarray(depth, dtype=np.float64)
    return np.where(d > 0, b * (1.0 + later_slots(d, topk, widths)), 0.0)


def _widths(widths: Sequence[int], policy: TreePolicy | None) -> tuple[int, ...]:
    """`widths` checked for CostModel.iteration: at most MAX_DEPTH positive integers (a tree
    drafts at most its depth's steps), for a speculative policy that is not hierarchical
    (SpecError naming what is wrong)."""
    if policy is None or policy.chain:
        raise SpecError(
            "draft_widths prices the drafting steps of a speculative, non-hierarchical policy; "
            f"got policy {None if policy is None else policy.label}"
        )
    try:
        out = tuple(int(w) for w in widths)
        ok = all(float(w) == o for w, o in zip(widths, out, strict=True))
    except (TypeError, ValueError, OverflowError):
        ok, out = False, ()
    if not ok or any(w < 1 for w in out) or len(out) > MAX_DEPTH:
        raise SpecError(
            "draft_widths must be at most "
            f"{MAX_DEPTH} positive integers (tokens per sequence of each drafting step "
            f"after the first), got {widths!r}"
        )
    return out


def _arr(name: str, value: ArrayLike) -> F64:
    """A float64 array of non-negative finite values (SpecError naming the argument otherwise)."""
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError(f"{name} must be numbers, got {value!r}") from None
    if not (a >= 0).all() or not (a < np.inf).all():  # NaN fails both comparisons
        if not np.isfinite(a).all():
            raise SpecError(f"{name} must be finite numbers, got {value!r}")
        raise SpecError(f"{name} must be >= 0, got a minimum of {a.min():g}")
    return a


class CostModel:
    """Prices decoding iterations (`iteration`) and their phases on `tp` GPUs.

    engine: the serving engine's host overheads per iteration (None: spectune's own executor,
    whose host costs are in the Calibration: specs.engine.NO_OVERHEADS).
    intermediate: the model that verifies the trees of a hierarchical policy and drafts the
    chain the target verifies (None: hierarchical policies are a SpecError);
    intermediate_drafter: the model growing those trees (the intermediate's own draft head;
    None: `drafter`)."""

    def __init__(
        self,
        hardware: HardwareSpec,
        target: ModelSpec,
        drafter: ModelSpec | None = None,
        tp: int = 1,
        calibration: Calibration | None = None,
        engine: EngineOverheads | None = None,
        intermediate: ModelSpec | None = None,
        intermediate_drafter: ModelSpec | None = None,
    ) -> None:
        if isinstance(tp, bool) or not isinstance(tp, int | np.integer) or tp < 1:
            raise SpecError(f"tp must be a positive integer, got {tp!r}")
        if target.is_draft_head:
            raise SpecError(f"target {target.name!r} is an EAGLE-3 draft head, not a model")
        cal = calibration if calibration is not None else Calibration()
        if cal.hardware and cal.hardware != hardware.name:
            raise SpecError(
                f"calibration was fitted on {cal.hardware!r} but the GPU is {hardware.name!r}"
            )
        self.hardware = hardware
        self.target = target
        self.drafter = drafter
        self.tp = int(tp)
        self.calibration = cal
        self.engine = engine if engine is not None else NO_OVERHEADS
        self._engine_free = self.engine == NO_OVERHEADS
        self.rates = Rates.resolve(hardware, cal)
        self._target = ForwardPricer(target, self.rates, self.tp)
        self._drafter = (
            ForwardPricer(drafter, self.rates, self.tp, drafting=True) if drafter else None
        )
        self.intermediate = intermediate
        self.intermediate_drafter = intermediate_drafter or drafter
        if intermediate is not None and intermediate.is_draft_head:
            raise SpecError(f"intermediate {intermediate.name!r} is a draft head, not a model")
        self._intermediate = (
            ForwardPricer(intermediate, self.rates, self.tp) if intermediate else None
        )
        self._hier_drafter = (
            ForwardPricer(self.intermediate_drafter, self.rates, self.tp, drafting=True)
            if self.intermediate_drafter
            else None
        )
        self._buckets = np.asarray(cal.graph_batch_sizes, dtype=np.float64)

    # ---- shapes --------------------------------------------------------------------------------
    def _graph_batch(self, batch: F64) -> tuple[F64, np.ndarray]:
        """(padded batch, replays a graph): the next captured size, or the batch itself (eager)
        above the largest."""
        graph = batch <= self._buckets[-1]
        idx = np.minimum(np.searchsorted(self._buckets, batch, side="left"), self._buckets.size - 1)
        padded = np.where(graph & (batch > 0), self._buckets[idx], batch)
        return padded, graph

    def _uniform(
        self,
        batch: ArrayLike,
        tokens: ArrayLike,
        context: ArrayLike,
        *,
        lm_per_seq: F64 | None = None,
    ) -> BatchShape:
        """B sequences x n new tokens over c cached tokens each, padded to a graph batch."""
        b = _arr("batch", batch)
        n = _arr("tokens", tokens)
        c = _arr("context", context)
        padded, graph = self._graph_batch(b)
        lm = n if lm_per_seq is None else lm_per_seq
        return BatchShape(
            tokens=b * n,
            gemm_tokens=padded * n,
            kv_tokens=b * (c + n),
            lm_tokens=padded * lm,
            graph=graph,
            new=n,
            cached=c,
            seqs=b,
            ragged=False,
        )

    # ---- target --------------------------------------------------------------------------------
    def verify_breakdown(
        self, batch: ArrayLike, tokens: ArrayLike, context: ArrayLike
    ) -> dict[str, F64]:
        """Seconds per operator class of one target forward over `batch` sequences x `tokens` new
        tokens over `context` cached tokens, logits at every token. Keys: BREAKDOWN_KEYS."""
        return self._target.forward(self._uniform(batch, tokens, context))

    def verify_time(self, batch: ArrayLike, tokens: ArrayLike, context: ArrayLike) -> F64:
        """Seconds of one target forward (see verify_breakdown)."""
        return _total(self.verify_breakdown(batch, tokens, context))

    def ragged_verify_time(
        self,
        batch: ArrayLike,
        tokens: ArrayLike,
        context: ArrayLike,
        *,
        tokens_cv: ArrayLike = 0.0,
        max_tokens: ArrayLike | None = None,
    ) -> F64:
        """Seconds of one target forward over `batch` trees of unequal size, verified as one
        ragged batch: `tokens` per request on average (root included), spread `tokens_cv`
        (std / mean over the requests), at most `max_tokens` each (None: no cap), over
        `context` cached tokens.
        Weight GEMMs and the LM head see the batch's total tokens, as a uniform verify of the
        mean; attention runs ceil(G x n_i / tile) query tiles per request, each over that
        request's keys, the tile being Calibration.ragged_tile_m (at most the largest
        request's rows): unequal trees of the same total cost more tiles than equal ones
        (forward.BatchShape.rows_x_keys, operators.spread_padded_rows)."""
        shape = replace(
            self._uniform(batch, tokens, context),
            new_cv=_arr("tokens_cv", tokens_cv),
            new_max=np.inf if max_tokens is None else np.maximum(_arr("max_tokens", max_tokens), 1),
            ragged_tile=float(self.rates.ragged_tile_m),
        )
        return _total(self._target.forward(shape))

    def ragged_forward_time(
        self, new_tokens: ArrayLike, context: ArrayLike, *, cuda_graph: bool = False
    ) -> float:
        """Seconds of one target forward over a ragged batch: sequence i brings new_tokens[i]
        tokens over context[i] cached ones (int[B] each), logits at every new token. Runs eagerly
        unless `cuda_graph` (mixed prefill/decode batches are not graph-captured by engines)."""
        n = np.atleast_1d(_arr("new_tokens", new_tokens))
        c = np.atleast_1d(_arr("context", context))
        if n.ndim != 1 or c.shape != n.shape:
            raise SpecError(
                f"new_tokens and context must be 1-D of equal length, got {n.shape} and {c.shape}"
            )
        t = np.asarray(n.sum())
        shape = BatchShape(
            tokens=t,
            gemm_tokens=t,
            kv_tokens=np.asarray((n + c).sum()),
            lm_tokens=t,
            graph=np.asarray(cuda_graph),
            new=n,
            cached=c,
            seqs=np.ones(()),
            ragged=True,
        )
        return float(_total(self._target.forward(shape)).item())

    # ---- drafter -------------------------------------------------------------------------------
    def draft_step_time(
        self, batch: ArrayLike, tokens: ArrayLike, context: ArrayLike, *, from_target: bool = False
    ) -> F64:
        """Seconds of one drafter forward over `batch` x `tokens` tokens over `context` cached
        (an EAGLE-3 head's single layer + reduced-vocab LM head and top-k, or a full draft
        model). `from_target`: the input is the target's hidden states, so an EAGLE-3 head runs
        its fc first (the first draft step and draft extend). Zero without a model drafter."""
        if self._drafter is None:
            return np.zeros(np.broadcast(_arr("batch", batch), tokens, context).shape)
        return _total(self.draft_step_breakdown(batch, tokens, context, from_target=from_target))

    def draft_step_breakdown(
        self, batch: ArrayLike, tokens: ArrayLike, context: ArrayLike, *, from_target: bool = False
    ) -> dict[str, F64]:
        """Seconds per operator class (BREAKDOWN_KEYS) of one drafter forward (draft_step_time's
        terms: under tp > 1 'comm' holds its two all-reduces per layer and its logits
        all-gather, with their launches). SpecError without a model drafter."""
        if self._drafter is None:
            raise SpecError("a drafter breakdown needs a model drafter (this CostModel has none)")
        shape = self._uniform(batch, tokens, context)
        return self._drafter.forward(shape, from_target=from_target)

    def draft_parts(
        self,
        batch: ArrayLike,
        depth: ArrayLike,
        topk: ArrayLike,
        context: ArrayLike,
        *,
        builder: str = "dynamic-topk",
        widths: Sequence[int] | None = None,
    ) -> dict[str, F64]:
        """Seconds of the drafting phase by part (draft_time is their sum): 'first' (one step
        over 1 token/seq, fed by the target), 'later' (the later steps: depth - 1 over topk
        tokens/seq each, or with `widths` one step per entry over that many tokens/seq, a
        static shape's drafted nodes per level, planner.trees.draft_widths) and 'bookkeeping'
        (draft_fixed_time: the `builder`'s fixed cost per step, the selection over the drafted
        rows, a cost per frontier slot), each zero where depth is 0; without a model drafter
        (retrieval drafting) one part, 'retrieval', the lookup cost."""
        d = _arr("depth", depth)
        k = _arr("topk", topk)
        if self._drafter is None:
            c = _arr("context", context)  # retrieval cost does not depend on it; shape does
            return {
                "retrieval": np.where(d > 0, self.retrieval_time(batch) + 0.0 * k + 0.0 * c, 0.0)
            }
        first = self.draft_step_time(batch, 1, context, from_target=True)
        if widths is None:
            later = np.maximum(d - 1, 0) * self.draft_step_time(batch, k, context)
        else:
            later = sum(
                (self.draft_step_time(batch, w, context) for w in widths),
                np.zeros(np.broadcast(_arr("batch", batch), d, k, context).shape),
            )
        # each of the steps also selects its top-k children, sorts the k*k candidates into
        # the next frontier and records them in the pool: a chain of small latency-bound
        # kernels, a fixed cost per step (Calibration.draft_step_s); a static shape skips the
        # frontier sort and pool rerank (Calibration.static_draft_step_s). The selection also
        # reads every drafted row's logits: B rows in the first step, B x each later step's
        # tokens (draft_select_time); each later step's frontier work adds a fixed cost per
        # slot (draft_fixed_time)
        bookkeeping = self.draft_fixed_time(_arr("batch", batch), d, k, builder, widths)
        on = d > 0
        return {
            "first": np.where(on, first, 0.0),
            "later": np.where(on, later, 0.0),
            "bookkeeping": np.where(on, bookkeeping, 0.0),
        }

    def draft_fixed_time(
        self,
        batch: F64,
        depth: ArrayLike,
        topk: ArrayLike,
        builder: str,
        widths: Sequence[int] | None = None,
    ) -> F64:
        """Seconds a drafting phase spends beyond its drafter forwards: the builder's fixed
        cost per step (Calibration.draft_step_cost_s; `depth` steps, or 1 + len(widths)), the
        selection over the drafted rows (draft_select_time) and a fixed cost per slot of the
        later steps (Calibration.draft_slot_s x later_slots)."""
        cal = self.calibration
        d, k = np.asarray(depth, dtype=np.float64), np.asarray(topk, dtype=np.float64)
        steps = d if widths is None else np.where(d > 0, 1.0 + len(widths), 0.0)
        rows = drafted_rows(batch, d, k, widths)
        later = later_slots(d, k, widths) * cal.draft_slot_s
        return _f64(steps * cal.draft_step_cost_s(builder) + self.draft_select_time(rows) + later)

    def draft_select_time(self, rows: ArrayLike) -> F64:
        """Seconds the draft steps' selection spends reading `rows` rows of drafter logits:
        top-k over each row's vocabulary and the candidate sort, rows x lm_vocab x 2 bytes (bf16
        logits) at Calibration.draft_select_bytes_per_s. Zero without a model drafter."""
        r = _arr("rows", rows)
        if self._drafter is None:
            return np.zeros_like(r)
        vocab = float(self.drafter.lm_vocab)  # type: ignore[union-attr]
        return _f64(r * vocab * ACT_BYTES / self.calibration.draft_select_bytes_per_s)

    def draft_time(
        self,
        batch: ArrayLike,
        depth: ArrayLike,
        topk: ArrayLike,
        context: ArrayLike,
        *,
        builder: str = "dynamic-topk",
        widths: Sequence[int] | None = None,
    ) -> F64:
        """Seconds of the whole drafting phase: the sum of draft_parts."""
        parts = self.draft_parts(batch, depth, topk, context, builder=builder, widths=widths)
        if "retrieval" in parts:
            return _f64(parts["retrieval"])
        return _f64(parts["first"] + parts["later"] + parts["bookkeeping"])

    def draft_extend_time(self, batch: ArrayLike, accepted: ArrayLike, context: ArrayLike) -> F64:
        """Seconds of the drafter pass over the `accepted` tokens per sequence (mean accepted
        length may be fractional): refills the drafter's KV cache and gives the next first
        draft logits (one per sequence). Zero without a model drafter or with nothing accepted."""
        a = _arr("accepted", accepted)
        if self._drafter is None:
            return np.zeros(np.broadcast(_arr("batch", batch), a, context).shape)
        shape = self._uniform(batch, a, context, lm_per_seq=np.ones(()))
        t = _total(self._drafter.forward(shape, from_target=True))
        return np.where(a > 0, t, 0.0)

    # ---- fixed costs ---------------------------------------------------------------------------
    def step_overhead_time(
        self,
        batch: ArrayLike,
        tree_tokens: ArrayLike,
        *,
        builder: str = "dynamic-topk",
        depth: int = 0,
    ) -> F64:
        """Seconds per iteration outside the forward passes: fixed scheduler/sampling cost, a
        per-request cost, and tree building where tree_tokens > 1 (speculating): a part that
        depends on the `builder` and the tree's `depth` (Calibration.tree_build_cost_s: a
        fixed cost, and for the dynamic builder one per level) plus a part per tree node of
        every sequence (batch x tree_tokens: the pool sort, node gathers and ancestor-mask rows
        grow with the tree)."""
        b = _arr("batch", batch)
        n = _arr("tree_tokens", tree_tokens)
        cal = self.calibration
        tree = cal.tree_build_cost_s(builder, depth) + cal.tree_build_per_node_s * b * n
        return _f64(
            cal.step_overhead_s + cal.per_request_overhead_s * b + np.where(n > 1, tree, 0.0)
        )

    def retrieval_time(self, batch: ArrayLike) -> F64:
        """Seconds of retrieval-drafter lookups (n-gram / suffix match) for `batch` requests:
        a fixed part per iteration (launches, the host read of the candidates) and a part per
        request."""
        cal = self.calibration
        return _f64(cal.retrieval_step_s + cal.retrieval_per_request_s * _arr("batch", batch))

    def prune_time(self, batch: ArrayLike) -> F64:
        """Seconds a pruned tree (prune_threshold > 0) adds to one iteration of `batch`
        sequences: dropping nodes under the threshold, packing the kept nodes into one ragged
        verify and reading its size back to the host (Calibration.prune_step_s, a fixed cost:
        the work is a few small kernels and one sync whatever the batch)."""
        return _f64(self.calibration.prune_step_s + 0.0 * _arr("batch", batch))

    # ---- iterations ----------------------------------------------------------------------------
    def iteration(
        self,
        policy: TreePolicy | None,
        batch: ArrayLike,
        context: ArrayLike,
        *,
        tokens: ArrayLike | None = None,
        accepted: ArrayLike | None = None,
        rounds: ArrayLike | None = None,
        tree_tokens: ArrayLike | None = None,
        tokens_cv: ArrayLike | None = None,
        draft_widths: Sequence[int] | None = None,
    ) -> StepBreakdown:
        """Seconds of each phase of one decoding iteration of `batch` sequences over `context`
        cached tokens each, under `policy` (None: speculation off, a plain decode step).

        tokens: tree tokens verified per sequence, root included (a mean may be fractional);
            default policy.budget, the full tree. Callers that know the tree as built pass its
            size (the objective its mean under the acceptance model, check the measured mean of
            a pruned tree).
        accepted: tokens the drafter extends over per sequence: accepted drafts + the bonus
            token; default policy.depth + 1, the full-depth pass that a graph-captured engine
            pads draft extend to (spectune's executor does, so check and the calibration fit
            price measured steps with it). The objective passes E[tokens per step], the mean
            of an unpadded pass.
        Hierarchical policies (policy.chain > 0; module docstring): `tokens` is what the target
            verifies per sequence, chain + root (default chain + 1), `accepted` what the
            drafter extends over per round (default depth + 1), `rounds` the intermediate's
            rounds (default ceil(chain / (depth + 1)), every round accepting the full depth)
            and `tree_tokens` the tree each round verifies (default budget); the objective
            passes their means (planner.hierarchical). `rounds` and `tree_tokens` price only
            hierarchical policies (a SpecError otherwise).
        tokens_cv: spread (std / mean) of the tree tokens over the batch's requests, for
            trees verified ragged (ragged_verify_time: a request pads its rows to the launch's
            tile): under a shared budget above batch 1 (ECHO; default SHARED_TREE_CV) and
            pruned trees (default 0: equal trees); ignored for other policies.
        draft_widths: tokens per sequence of each drafting step after the first, where they
            are not the top-k frontier: a static policy's shape drafts its nodes per level
            (planner.trees.draft_widths, which callers that know the acceptance model pass;
            default: depth - 1 steps over topk, the dynamic builder's). Positive integers;
            only for a speculative, non-hierarchical policy (a SpecError otherwise).
        With speculation off the step verifies 1 token per sequence and drafts nothing;
        passing `tokens` or `accepted` is then a SpecError. The engine's term is
        `self.engine.iteration_s_for(batch, depth (0 when off), topk > 1, tp, the drafter's
        kind)`. Every field is the broadcast of batch, context, tokens and accepted (float64,
        one shape)."""
        b = _arr("batch", batch)
        c = _arr("context", context)
        if draft_widths is not None:
            draft_widths = _widths(draft_widths, policy)
        if policy is not None and policy.chain:
            return self._hierarchical(policy, b, c, tokens, accepted, rounds, tree_tokens)
        if rounds is not None or tree_tokens is not None:
            raise SpecError("rounds and tree_tokens price a hierarchical policy (chain > 0)")
        parts: dict[str, F64 | None]  # None: the phase does not apply (zero)
        if policy is None:
            if tokens is not None or accepted is not None:
                raise SpecError("tokens and accepted price a speculative iteration; policy is None")
            parts = {
                "draft_s": None,
                "intermediate_s": None,
                "verify_s": self.verify_time(b, 1, c),
                "extend_s": None,
                "overhead_s": self.step_overhead_time(b, 1),
                "retrieval_s": None,
                "prune_s": None,
                "engine_s": self._engine_time(b, 0, False),
            }
        else:
            n = policy.budget if tokens is None else tokens
            a = policy.depth + 1 if accepted is None else accepted
            builder = policy.builder
            parts = {
                "draft_s": self.draft_time(
                    b, policy.depth, policy.topk, c, builder=builder, widths=draft_widths
                ),
                "intermediate_s": None,
                "verify_s": self._tree_verify_time(policy, b, n, c, tokens_cv)
                + self.calibration.spec_verify_s,
                "extend_s": self.draft_extend_time(b, a, c),
                "overhead_s": self.step_overhead_time(b, n, builder=builder, depth=policy.depth),
                "retrieval_s": self.retrieval_time(b) if policy.graft_budget > 0 else None,
                "prune_s": self._ragged_time(policy, b),
                "engine_s": self._engine_time(b, policy.depth, policy.topk > 1),
            }
        shape = np.broadcast(*(p for p in parts.values() if p is not None)).shape
        return StepBreakdown(**{k: _shaped(p, shape) for k, p in parts.items()})

    def intermediate_verify_time(
        self, batch: ArrayLike, tokens: ArrayLike, context: ArrayLike
    ) -> F64:
        """Seconds of one intermediate-model forward over `batch` x `tokens` tokens over
        `context` cached, logits at every token (its verification of one tree, or its prefill
        share of newcomers' prompts). SpecError without an intermediate model."""
        if self._intermediate is None:
            raise SpecError(
                "a hierarchical policy (chain > 0) needs an intermediate model; give the "
                "CostModel one (intermediate=...)"
            )
        return _total(self._intermediate.forward(self._uniform(batch, tokens, context)))

    def intermediate_extend_time(
        self, batch: ArrayLike, tokens: ArrayLike, context: ArrayLike
    ) -> F64:
        """Seconds of the intermediate's drafter (its draft head) over `tokens` tokens per
        sequence fed by the intermediate: a hierarchical round's draft extend, or its share of
        newcomers' prompts. Zero without that drafter."""
        b, c, a = _arr("batch", batch), _arr("context", context), _arr("tokens", tokens)
        pricer = self._hier_drafter
        if pricer is None:
            return np.zeros(np.broadcast(b, c, a).shape)
        shape = self._uniform(b, a, c, lm_per_seq=np.ones(()))
        return _f64(np.where(a > 0, _total(pricer.forward(shape, from_target=True)), 0.0))

    def _hier_draft(
        self, batch: F64, policy: TreePolicy, context: F64, accepted: F64
    ) -> tuple[F64, F64]:
        """(one round's drafting, one round's draft extend) of the intermediate's drafter:
        a first step fed by the intermediate, depth - 1 steps over top-k tokens, the builder's
        fixed cost per step; the extend over the `accepted` tokens. Zeros without a drafter."""
        pricer = self._hier_drafter
        if pricer is None:
            z = np.zeros(np.broadcast(batch, context, accepted).shape)
            return z, z
        first = _total(pricer.forward(self._uniform(batch, 1, context), from_target=True))
        rest = _total(pricer.forward(self._uniform(batch, policy.topk, context)))
        fixed = self.draft_fixed_time(batch, policy.depth, policy.topk, policy.builder)
        draft = first + (policy.depth - 1) * rest + fixed
        return _f64(draft), self.intermediate_extend_time(batch, accepted, context)

    def _hierarchical(
        self,
        policy: TreePolicy,
        b: F64,
        c: F64,
        tokens: ArrayLike | None,
        accepted: ArrayLike | None,
        rounds: ArrayLike | None,
        tree_tokens: ArrayLike | None,
    ) -> StepBreakdown:
        """The breakdown of one hierarchical iteration (module docstring; iteration's args)."""
        n_target = _arr("tokens", policy.chain + 1 if tokens is None else tokens)
        a = _arr("accepted", policy.depth + 1 if accepted is None else accepted)
        r = _arr("rounds", -(-policy.chain // (policy.depth + 1)) if rounds is None else rounds)
        n_tree = _arr("tree_tokens", policy.budget if tree_tokens is None else tree_tokens)
        draft, extend = self._hier_draft(b, policy, c, a)
        builder = policy.builder
        fixed = self.step_overhead_time(b, 1, builder=builder)
        tree = self.step_overhead_time(b, n_tree, builder=builder, depth=policy.depth) - fixed
        parts: dict[str, F64 | None] = {
            "draft_s": r * draft,
            "intermediate_s": r * self.intermediate_verify_time(b, n_tree, c),
            "verify_s": self.verify_time(b, n_target, c) + self.calibration.spec_verify_s,
            "extend_s": r * extend,
            "overhead_s": fixed + r * tree,
            "retrieval_s": r * self.retrieval_time(b) if policy.graft_budget > 0 else None,
            "prune_s": r * self.prune_time(b) if policy.prune_threshold > 0 else None,
            "engine_s": self._engine_time(b, policy.depth, policy.topk > 1),
        }
        shape = np.broadcast(*(p for p in parts.values() if p is not None)).shape
        return StepBreakdown(**{k: _shaped(p, shape) for k, p in parts.items()})

    def _tree_verify_time(
        self, policy: TreePolicy, b: F64, n: ArrayLike, c: F64, cv: ArrayLike | None
    ) -> F64:
        """The verify of `policy`'s trees: ragged_verify_time under a shared budget above batch
        1 (ECHO: spread `cv`, default SHARED_TREE_CV; a request holds at most the batch's whole
        budget), _pruned_verify_time for pruned trees, else verify_time at the mean tree size.
        A ragged verify (the first two) adds Calibration.ragged_sync_s."""
        sync = self.calibration.ragged_sync_s  # the host read + launch of a ragged verify
        if not policy.shared_budget:
            if policy.prune_threshold > 0:
                return sync + self._pruned_verify_time(policy, b, n, c, 0.0 if cv is None else cv)
            return self.verify_time(b, n, c)
        spread = SHARED_TREE_CV if cv is None else cv
        most = 1.0 + b * (policy.budget - 1)
        ragged = self.ragged_verify_time(b, n, c, tokens_cv=spread, max_tokens=most)
        return _f64(np.where(b > 1, sync + ragged, self.verify_time(b, n, c)))

    def _pruned_verify_time(
        self, policy: TreePolicy, b: F64, n: ArrayLike, c: F64, cv: ArrayLike
    ) -> F64:
        """The packed verify of pruned trees (kernels/ragged_plan.py): `n` kept tokens per
        request on average, spread `cv` (std / mean over the batch's requests).

        A step packs the batch's kept tokens into one verify at the next multiple of
        Calibration.ragged_token_bucket (at most B x budget; at batch 1 a 17-token tree
        verifies as 32), whose weight GEMMs see that count. Its attention is the ragged launch
        that ECHO's verify runs too (ragged_verify_time): RaggedBucket plans it for the budget's
        dense shape (tuned_launch(B, budget, C); plan_launch's max_q_len is the budget), so each
        request's G x n_i rows are padded to that launch's tile (Calibration.ragged_tile_m, at
        most the budget's rows), not to the smallest tile. Where HBM is fast (H200) those tiles'
        FLOPs bound the attention; where it is not (H100) the KV read still does. Priced on the
        smallest tile, the H200 pruned trace runs at batch 32-64 (measurements/h200-newuser2,
        h200-newuser3, benchmarks/results/new_gpu_h200_rerun: ~16 of 32 tokens kept) verified
        4-9.5% short and their speedups came out 6-9% high, while on H100 (attention memory-bound)
        the same traces verified within 3% (benchmarks/bench_prune_phases.py)."""
        q = float(self.calibration.ragged_token_bucket)
        mean = _arr("tokens", n)
        most = b * policy.budget  # the top bucket: every node kept
        packed = np.minimum(pad_up(b * mean, q), most)
        per_request = np.maximum(packed / np.maximum(b, 1.0), mean)
        return self.ragged_verify_time(
            b, per_request, c, tokens_cv=cv, max_tokens=float(policy.budget)
        )

    def _ragged_time(self, policy: TreePolicy, batch: F64) -> F64 | None:
        """prune_time where the batch's trees differ in size per request, so the verify runs
        ragged (the executor's packing and host read): a pruned policy, or a shared verify
        budget above batch 1 (ECHO); None otherwise."""
        if policy.prune_threshold > 0:
            return self.prune_time(batch)
        if policy.shared_budget:
            return np.where(batch > 1, self.prune_time(batch), 0.0)
        return None

    def _engine_time(self, batch: F64, draft_steps: int, tree: bool) -> F64 | None:
        """The engine's host seconds per iteration (None for a profile that adds nothing)."""
        if self._engine_free:
            return None
        kind = self.drafter.drafter_kind if self.drafter is not None else ""
        return self.engine.iteration_s_for(batch, draft_steps, tree, self.tp, kind)

    # ---- facts the tests and dashboards use ----------------------------------------------------
    def memory_floor_time(self) -> float:
        """Weights one token streams per rank / achievable weight bandwidth: no target forward
        can be faster."""
        return self._target.min_weight_bytes() / self.rates.weight_bytes_per_s

    def knee_tokens(self, *, experts: bool = False) -> float:
        """Tokens (summed over the batch) where the target's weight GEMMs turn compute-bound:
        achievable FLOP/s / (2 * achievable weight bytes/s / bytes per weight), in the target's
        weight format (a weight-only 4-bit format: a quarter of the bytes at a share of the
        bf16 rate, Calibration.weight_only_*; the crossover of a quantized GEMM). With `experts`,
        the knee of an MoE model's routed experts, which see only k/E of the tokens each:
        E/k times later."""
        # compute 2*M*N*K / (peak * eff * flops_scale) = memory N*K*wb / (bw * bw_scale)
        fmt = self._target.fmt
        eff = float(self.rates.gemm_efficiency[-1]) * fmt.flops_scale
        bw = self.rates.weight_bytes_per_s * fmt.bw_scale
        knee = fmt.peak_flops * eff * fmt.weight_bytes / (2 * bw)
        if experts and self.target.is_moe:
            knee *= self.target.experts / self.target.experts_topk
        return knee


def _f64(x: ArrayLike) -> F64:
    """Results are float64 arrays, also 0-d ones (numpy turns 0-d sums into scalars)."""
    return np.asarray(x, dtype=np.float64)


def _shaped(x: F64 | None, shape: tuple[int, ...]) -> F64:
    """x as a float64 array of `shape` (a read-only broadcast view where it is smaller); None:
    zeros."""
    if x is None:
        return np.zeros(shape)
    x = _f64(x)
    return x if x.shape == shape else np.broadcast_to(x, shape)


def _total(parts: dict[str, F64]) -> F64:
    values = iter(parts.values())
    total = next(values).copy()
    for v in values:
        total = total + v
    return _f64(total)
