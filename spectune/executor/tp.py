"""Tensor parallelism for the executor: the target and the drafter split over the GPUs of one
host, Megatron-style, each rank running model.py's layer code on its shard.

Per layer on `tp` ranks (rank r), as SGLang/vLLM shard a Llama layer:
- q|k|v column-parallel: rank r holds query heads [r*H/tp, (r+1)*H/tp) and KV heads
  [r*KVH/tp, (r+1)*KVH/tp) (their rows of wqkv); its KV cache holds only those KV heads, and the
  tree-attention kernel runs on that shard unchanged (a layer of H/tp query and KVH/tp KV heads);
- o row-parallel (the columns of wo for its heads), then an all-reduce of [T, hidden];
- gate|up column-parallel (ffn/tp rows of each), down row-parallel, then an all-reduce;
- norms, the embedding table and EAGLE-3's fc (3h -> h) replicated (the cost model prices
  them unsplit: spectune.planner.forward);
- the LM head vocab-parallel: rank r computes logits of vocabulary rows [r*V/tp, (r+1)*V/tp)
  and an all-gather assembles [L, V] on every rank (the cost model's logits all-gather).
Bytes per rank per forward: the layer weights / tp + the replicated pieces + this rank's KV
heads of the prefix (B * C * kv_bytes_per_token / tp); per layer 2 all-reduces of T * hidden * 2
bytes (collectives.py).

Everything after the logits (tree building, verification, acceptance, KV compaction) runs
replicated: every rank holds the same all-gathered logits and draws from the same seeded random
stream, so the ranks agree without broadcasting (collectives.py says why that is the cheaper
choice). rank 0 times the phases; the others run the same graphs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from spectune.executor.collectives import TPGroup
from spectune.executor.drafter import Drafter, Eagle3Head, ModelDrafter
from spectune.executor.loop import PhaseResult
from spectune.executor.model import Decoder, LayerWeights, _fill
from spectune.executor.session import Session, SessionConfig, weight_shapes
from spectune.kernels.gemm import GemmPlan, autotune, linear, planned_seconds, set_plan
from spectune.specs import ModelSpec, SpecError, TreePolicy


def shard_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """The shape one rank runs: heads, KV heads and ffn divided by tp (name, hidden and vocab
    kept: the embedding is replicated, the LM head's vocabulary split is the decoder's)."""
    if spec.is_moe or spec.is_mla:
        raise SpecError(f"{spec.name}: the TP executor runs dense GQA models (no MoE/MLA)")
    for name in ("heads", "kv_heads", "ffn", "lm_vocab"):
        width = getattr(spec, name)
        if width % tp:
            raise SpecError(
                f"tp {tp} must divide {name} = {width} of {spec.name} (the executor splits "
                "KV heads and does not replicate them: use a tp that divides kv_heads)"
            )
    if tp == 1:
        return spec
    return dataclasses.replace(
        spec, heads=spec.heads // tp, kv_heads=spec.kv_heads // tp, ffn=spec.ffn // tp
    )


def _rows(x: torch.Tensor, r: int, n: int) -> torch.Tensor:
    return x[r * n : (r + 1) * n]


def shard_layer(full: LayerWeights, spec: ModelSpec, rank: int, tp: int) -> LayerWeights:
    """Rank `rank`'s slices of a whole layer (spec: the whole model's shape); copies."""
    d, hq, hk, f = spec.head_dim, spec.heads // tp, spec.kv_heads // tp, spec.ffn // tp
    q = full.wqkv[: spec.heads * d]
    k = full.wqkv[spec.heads * d : (spec.heads + spec.kv_heads) * d]
    v = full.wqkv[(spec.heads + spec.kv_heads) * d :]
    gate, up = full.w_gate_up[: spec.ffn], full.w_gate_up[spec.ffn :]
    return LayerWeights(
        wqkv=torch.cat((_rows(q, rank, hq * d), _rows(k, rank, hk * d), _rows(v, rank, hk * d))),
        wo=full.wo[:, rank * hq * d : (rank + 1) * hq * d].contiguous(),
        w_gate_up=torch.cat((_rows(gate, rank, f), _rows(up, rank, f))),
        w_down=full.w_down[:, rank * f : (rank + 1) * f].contiguous(),
        norm_attn=full.norm_attn.clone(),
        norm_mlp=full.norm_mlp.clone(),
    )


class TPDecoder(Decoder):
    """Rank `group.rank`'s part of a dense decoder at the shape of `spec` (random weights, the
    same on every rank: latency does not depend on them). `spec` stays the whole model's shape
    (token ids, vocabulary, capture layers); `shard` is what the layers and the KV cache run.

    lm_head(hidden [B, N, hidden]) -> logits [B, N, vocab], all-gathered over the ranks.
    """

    def __init__(
        self,
        spec: ModelSpec,
        group: TPGroup,
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        max_pos: int = 1 << 17,
    ):
        shard = shard_spec(spec, group.world)
        tied = spec.tie_embeddings
        # the base class fills the shard's layers and a whole embedding table (replicated); an
        # untied LM head is filled below at its vocabulary share
        super().__init__(
            dataclasses.replace(shard, tie_embeddings=True), group.device, dtype, seed, max_pos
        )
        self.spec, self.shard, self.group = spec, shard, group
        v = spec.vocab // group.world
        gen = torch.Generator(device=self.device).manual_seed(seed + 7)
        self.lm = (
            _rows(self.embed, group.rank, v)
            if tied
            else _fill((v, spec.hidden), self.device, dtype, gen)
        )
        self.comm = True
        self.set_comm(True)

    def set_comm(self, on: bool) -> None:
        """Collectives on (the TP forward) or off (the same shard compute without them: what
        they cost in place is the difference; the outputs are then partial sums)."""
        self.comm = on
        for w in self.layers:
            w.reduce = self.group.all_reduce_ if on and self.group.world > 1 else None

    def load_from(self, full: Decoder) -> None:
        """Copy this rank's slices of a whole decoder's weights (tests: the TP forward must then
        equal `full`'s)."""
        r, tp, s = self.group.rank, self.group.world, self.spec
        self.embed.copy_(full.embed)
        self.norm_final.copy_(full.norm_final)
        for i, w in enumerate(full.layers):
            sh = shard_layer(w, s, r, tp)
            sh.reduce = self.layers[i].reduce
            self.layers[i] = sh
        self.lm = _rows(full.lm, r, s.vocab // tp).clone()

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, N, hidden] -> [B, N, vocab]: this rank's vocabulary rows (h * V/tp weight bytes),
        then the all-gather of the shards (B*N*V*2 bytes gathered)."""
        local = linear(hidden, self.lm)
        return self.group.all_gather_last(local) if self.comm else local


class TPEagle3Head(Eagle3Head):
    """An EAGLE-3 head split like the target: its decoder layer sharded (all-reduces after o and
    down), its reduced-vocabulary LM head vocab-parallel, its fc replicated."""

    def __init__(self, spec: ModelSpec, target: TPDecoder, seed: int = 1):
        super().__init__(shard_spec(spec, target.group.world), target, seed)
        g = self.group = target.group
        self.full_spec = spec
        v = spec.lm_vocab // g.world
        self.lm = _rows(self.lm, g.rank, v).clone()  # the base filled the whole head; keep ours
        self.comm = True
        self.set_comm(True)

    def set_comm(self, on: bool) -> None:
        """Collectives on (the TP step: all-reduces after o and down, the logits all-gather) or
        off (the same shard compute without them; outputs are then partial)."""
        self.comm = on
        self.layer.reduce = self.group.all_reduce_ if on and self.group.world > 1 else None

    def load_from(self, full: Eagle3Head) -> None:
        g, s = self.group, self.full_spec
        self.fc.copy_(full.fc)
        self.norm_hidden.copy_(full.norm_hidden)
        self.norm_final.copy_(full.norm_final)
        reduce = self.layer.reduce
        self.layer = shard_layer(full.layer, s, g.rank, g.world)
        self.layer.reduce = reduce
        self.lm = _rows(full.lm, g.rank, s.lm_vocab // g.world).clone()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = super().logits(hidden)
        return self.group.all_gather_last(local) if self.comm else local


class TPModelDrafter(ModelDrafter):
    """A separate draft model split over the ranks like the target (a TPDecoder)."""

    def __init__(self, spec: ModelSpec, target: TPDecoder, seed: int = 2):
        if spec.vocab != target.spec.vocab:
            raise SpecError(
                f"draft model {spec.name} has vocab {spec.vocab}, target {target.spec.vocab}"
            )
        self.spec = spec
        self.vocab = spec.vocab
        self.model: TPDecoder = TPDecoder(
            spec, target.group, target.dtype, seed=seed, max_pos=target.rope[0].shape[0]
        )

    def set_comm(self, on: bool) -> None:
        self.model.set_comm(on)


def make_tp_drafter(spec: ModelSpec, target: TPDecoder) -> TPEagle3Head | TPModelDrafter:
    if spec.is_draft_head:
        return TPEagle3Head(spec, target)
    return TPModelDrafter(spec, target)


def tp_weight_shapes(spec: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(N, K) of every weight GEMM one rank runs: weight_shapes of the shard, its LM head at
    lm_vocab / tp rows."""
    shard = shard_spec(spec, tp)
    shapes = [s for s in weight_shapes(shard) if s != (shard.lm_vocab, shard.hidden)]
    return [*shapes, (spec.lm_vocab // tp, spec.hidden)]


class TPSession(Session):
    """Session (target + drafter + caches) for one rank of a TP group: the same runs, on the
    rank's shards; every rank of the group must make the same calls in the same order."""

    target: TPDecoder

    def __init__(
        self,
        target: ModelSpec,
        drafter: ModelSpec,
        cfg: SessionConfig,
        group: TPGroup,
        seed: int = 0,
        gemm_plan: dict[str, str] | None = None,
        plan_source: str = "gemm_plan",
    ):
        """`gemm_plan`, `plan_source`: GEMM variants to run for the shard shapes the plan
        covers (Session's)."""
        from spectune.kernels.span_attention import self_check

        self.cfg = cfg
        self.group = group
        self.seed = seed
        self.device = group.device
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        cap = cfg.max_context + cfg.max_tree + 8
        self.target = TPDecoder(target, group, dtype, max_pos=cap + 64)
        self.tp_drafter = make_tp_drafter(drafter, self.target)
        self.draft_vocab = drafter.lm_vocab  # the drafter's logits width with its collectives
        self.drafter: Drafter = self.tp_drafter
        self.tcache = self.target.new_cache(cfg.max_batch, cap)
        self.dcache = self.drafter.new_cache(cfg.max_batch, cap)
        self.use_kernels = cfg.use_kernels and self.device.type == "cuda"
        self.attention_check = self_check(self.device) if self.device.type == "cuda" else 0.0
        self.gemm_rows: list[dict[str, object]] = []
        self.attention_rows: list[dict[str, object]] = []
        self.attention_plan: dict[str, str] = {}
        self.gemm_plan: dict[str, str] = {}
        self.gemm_plan_seconds: dict[str, float] = {}  # this rank's timings of the plan it runs
        if self.device.type == "cuda" and cfg.autotune_gemm:
            tp = group.world
            shapes = sorted(set(tp_weight_shapes(target, tp)) | set(tp_weight_shapes(drafter, tp)))
            gated = sorted({(s.hidden, s.ffn // tp) for s in (target, drafter)})
            fixed = None if gemm_plan is None else GemmPlan.from_dict(gemm_plan, plan_source)
            plan, self.gemm_rows = autotune(shapes, self.device, gated=gated, fixed=fixed)
            # every rank runs rank 0's choices: the same kernels keep the ranks in step (a
            # slower choice on one rank would show up as waiting in every collective)
            plan = GemmPlan(group.broadcast_object(plan.choice))
            set_plan(plan)
            self.gemm_plan = plan.to_dict()
            self.gemm_plan_seconds = planned_seconds(plan, self.gemm_rows)

    @property
    def tp(self) -> int:
        return self.group.world

    def tune(self, batch: int, tokens: int, context: int) -> None:
        """The fastest tree-attention config for this shard's heads (once per shape), rank 0's
        on every rank."""
        if self.use_kernels:
            from spectune.kernels import tree_attention_plan as tap

            rows = tap.tune_tree_attention(
                batch, tokens, context, self.tcache.layers(batch), self.target.shard.heads
            )
            key = (batch, tokens, context)  # rank 0's choice everywhere (ranks in step)
            best = self.group.broadcast_object(tap._TUNED.get(key))
            if best is not None:
                tap._TUNED[key] = best
            self._tuned(batch, tokens, context, rows)

    def run_spec(
        self,
        batch: int,
        context: int,
        policy: TreePolicy,
        acceptance: object,
        steps: int,
        warmup: int = 3,
        repeats: int = 1,
    ) -> list[PhaseResult]:
        """Session.run_spec after seeding: every rank draws the same root tokens and acceptances."""
        torch.manual_seed(self.seed)
        return super().run_spec(batch, context, policy, acceptance, steps, warmup, repeats)

    def run_ar(self, batch: int, context: int, steps: int, warmup: int = 3) -> PhaseResult:
        torch.manual_seed(self.seed)
        return super().run_ar(batch, context, steps, warmup)

    def draft_step_time_comm(
        self, batch: int, width: int, context: int, reps: int = 10
    ) -> tuple[float, float]:
        """(seconds of one drafter step over `batch` x `width` frontier tokens at `context`: its
        forward, logits and top-`width` per token, as a draft level runs them; the same shard
        compute without its collectives). Their difference is what the drafter's collectives
        (two all-reduces per layer, the logits all-gather) cost in place per draft step."""
        return self._with_and_without_comm(
            self.tp_drafter, lambda: self.draft_step_timing(batch, width, context, reps)[0]
        )

    def _with_and_without_comm(self, model: Any, time: Callable[[], float]) -> tuple[float, float]:
        """(time() with `model`'s collectives, time() with them switched off), each after
        seeding, so both see the same inputs; the collectives are back on afterwards."""
        torch.manual_seed(self.seed)
        with_comm = time()
        model.set_comm(False)
        try:
            torch.manual_seed(self.seed)
            without = time()
        finally:
            model.set_comm(True)
        return with_comm, without

    def verify_time_comm(
        self, batch: int, tokens: int, context: int, reps: int = 10
    ) -> tuple[float, float]:
        """(seconds of a TP verify forward, seconds of the same shard compute without its
        collectives): their difference is what the collectives cost in place."""
        return self._with_and_without_comm(
            self.target, lambda: self.verify_time(batch, tokens, context, reps)
        )
