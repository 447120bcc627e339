"""One GPU session: the target, its drafter and their KV caches, built once and shared by every
measured configuration (`spectune execute`, `spectune calibrate`, benchmarks/bench_executor.py).

Caches are allocated once for the largest batch and the largest context + tree, and each run
takes a batch slice, so a whole sweep of batch sizes and policies fits next to the 16 GB of
Llama-3.1-8B weights. Graphs are captured per run and freed after it.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from spectune.executor.drafter import Drafter, make_drafter
from spectune.executor.gpu_state import GpuSampler
from spectune.executor.graphs import PhaseGraphs
from spectune.executor.loop import ARRunner, PhaseResult, SpecRunner
from spectune.executor.model import Decoder
from spectune.executor.sources import cache_slots, tree_slots
from spectune.kernels.gemm import GemmPlan, autotune, planned_seconds, set_plan
from spectune.kernels.span_attention import self_check
from spectune.kernels.timing import PhaseTimer
from spectune.kernels.tree_attention_plan import TreeAttentionPlan, tune_tree_attention
from spectune.specs import ModelSpec, SpecError, TreePolicy
from spectune.specs.kernel_plan import attention_key, attention_launch


def weight_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(N, K) of every dense weight GEMM of one model (an EAGLE-3 head adds its fc; an MoE
    model's experts run in the fused MoE kernels, its router is a GEMM)."""
    if spec.is_moe:
        from spectune.executor.moe import moe_weight_shapes

        return moe_weight_shapes(spec)
    d, h = spec.head_dim, spec.hidden
    shapes = [
        ((spec.heads + 2 * spec.kv_heads) * d, spec.attn_in_width),
        (h, spec.heads * d),
        (2 * spec.ffn, h),
        (h, spec.ffn),
        (spec.lm_vocab, h),
    ]
    if spec.is_draft_head:
        shapes.append((h, 3 * h))
    return shapes


def make_target(spec: ModelSpec, device: torch.device, dtype: torch.dtype, max_pos: int) -> Decoder:
    """The target runner for a spec: the dense decoder, or for MoE specs the MoE decoder with
    independent routing (each token picks its experts uniformly: the expert union the cost model
    prices; random weights would otherwise route a step's tokens alike, measurements/h200-moe)."""
    if spec.is_moe:
        from spectune.executor.moe import MoEDecoder

        return MoEDecoder(spec, device, dtype, max_pos=max_pos, routing="independent")
    return Decoder(spec, device, dtype, max_pos=max_pos)


def require_cuda() -> torch.device:
    """The CUDA device, or a SpecError that says why this command needs one."""
    if not torch.cuda.is_available():
        raise SpecError(
            "no CUDA GPU is visible: the executor times real kernels and needs one "
            "(run it on a GPU host; `spectune check` re-predicts committed measurements on CPU)"
        )
    return torch.device("cuda")


@dataclass(frozen=True)
class SessionConfig:
    max_batch: int
    max_context: int
    max_tree: int = 128  # largest tree (verify tokens per sequence) any run will use
    use_graphs: bool = True
    use_kernels: bool = True  # spectune.kernels' tree attention / walk / compaction on CUDA
    autotune_gemm: bool = True  # time split-K vs cuBLAS per weight shape and M at start


class Session:
    """Target + drafter + caches on one device."""

    def __init__(
        self,
        target: ModelSpec,
        drafter: ModelSpec,
        cfg: SessionConfig,
        device: torch.device | str,
        gemm_plan: dict[str, str] | None = None,
        plan_source: str = "gemm_plan",
    ):
        """`gemm_plan`: GEMM variants to run instead of timing them, as documents record them
        (kernels.gemm.GemmPlan.from_dict; autotune's `fixed`): e.g. the plan of the calibrate
        run whose fit predicts this session. `plan_source` names it in errors."""
        self.cfg = cfg
        self.device = torch.device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        cap = cfg.max_context + cfg.max_tree + 8
        self.target = make_target(target, self.device, dtype, max_pos=cap + 64)
        self.drafter: Drafter = make_drafter(drafter, self.target)
        self.draft_vocab = drafter.lm_vocab  # the width of the drafter's logits
        self.tcache = self.target.new_cache(cfg.max_batch, cap)
        self.dcache = self.drafter.new_cache(cfg.max_batch, cap)
        self.use_kernels = cfg.use_kernels and self.device.type == "cuda"
        self.attention_check = self_check(self.device) if self.device.type == "cuda" else 0.0
        self.gemm_rows: list[dict[str, object]] = []
        self.attention_rows: list[dict[str, object]] = []
        self.attention_plan: dict[str, str] = {}  # verify shape -> tuned launch (written form)
        self.gemm_plan: dict[str, str] = {}
        self.gemm_plan_seconds: dict[str, float] = {}  # the planned variants' timed seconds
        if self.device.type == "cuda" and cfg.autotune_gemm:
            shapes = sorted(set(weight_shapes(target)) | set(weight_shapes(drafter)))
            gated = sorted(
                {(s.hidden, s.ffn) for s in (target, drafter) if s.moe_layers < s.layers}
            )
            fixed = None if gemm_plan is None else GemmPlan.from_dict(gemm_plan, plan_source)
            plan, self.gemm_rows = autotune(shapes, self.device, gated=gated, fixed=fixed)
            set_plan(plan)
            self.gemm_plan = plan.to_dict()
            self.gemm_plan_seconds = planned_seconds(plan, self.gemm_rows)

    @property
    def attention_backend(self) -> str:
        return (
            "spectune.kernels tree_attention"
            if self.use_kernels
            else "flash prefix + masked tree (torch)"
        )

    def _check(self, batch: int, context: int, tokens: int) -> None:
        if (
            batch > self.cfg.max_batch
            or context > self.cfg.max_context
            or tokens > self.cfg.max_tree
        ):
            raise SpecError(
                f"run (batch {batch}, context {context}, {tokens} tree tokens) exceeds the session "
                f"(max batch {self.cfg.max_batch}, context {self.cfg.max_context}, tree {self.cfg.max_tree})"
            )

    def tune(self, batch: int, tokens: int, context: int) -> None:
        """Pick the fastest tree-attention config for this verify shape (once per shape)."""
        if self.use_kernels:
            rows = tune_tree_attention(
                batch, tokens, context, self.tcache.layers(batch), self.target.spec.heads
            )
            self._tuned(batch, tokens, context, rows)

    def kernel_plans(self) -> dict[str, dict[str, Any]]:
        """The kernels this process chose, as documents record them (specs.kernel_plan):
        "gemm_plan", "gemm_plan_seconds" and "attention_plan", each where non-empty."""
        plans: dict[str, dict[str, Any]] = {
            "gemm_plan": self.gemm_plan,
            "gemm_plan_seconds": self.gemm_plan_seconds,
            "attention_plan": self.attention_plan,
        }
        return {k: dict(v) for k, v in plans.items() if v}

    def _tuned(self, batch: int, tokens: int, context: int, rows: list[dict[str, object]]) -> None:
        """Keep a shape's tuner rows and its pick in attention_plan (the documents' written
        form: specs.kernel_plan; rows is empty when the shape was tuned before)."""
        timed = [r for r in rows if "seconds" in r]
        if timed:
            best = min(timed, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
            label = best["config"]
            assert isinstance(label, list)
            self.attention_plan[attention_key(batch, tokens, context)] = attention_launch(label)
        if rows:
            self.attention_rows.append(
                {"batch": batch, "tokens": tokens, "context": context, "rows": rows}
            )

    def run_ar(self, batch: int, context: int, steps: int, warmup: int = 3) -> PhaseResult:
        self._check(batch, context, 1)
        self.tune(batch, 1, context)
        r = ARRunner(
            self.target,
            batch,
            context,
            self.tcache,
            use_graphs=self.cfg.use_graphs,
            use_kernels=self.use_kernels,
        )
        res = r.run(steps, warmup)
        del r
        _free()
        return res

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
        """`repeats` timed runs of one policy (one runner and graph capture; repeat r on common
        random draw stream r, so repeat r of every policy at this batch sees the same draws)."""
        self._check(batch, context, cache_slots(policy, acceptance, batch))
        self.tune(batch, tree_slots(policy, acceptance, batch), context)
        r = SpecRunner(
            self.target,
            self.drafter,
            acceptance,
            policy,
            batch,
            context,
            self.tcache,
            self.dcache,
            use_graphs=self.cfg.use_graphs,
            use_kernels=self.use_kernels,
        )
        res = [r.run(steps, warmup if i == 0 else 0, seed=i) for i in range(repeats)]
        del r
        _free()
        return res

    def verify_time(
        self, batch: int, tokens: int, context: int, reps: int = 10, use_kernels: bool | None = None
    ) -> float:
        """Median seconds of one target forward (+ LM head and argmax on every token) over
        `batch` sequences x `tokens` chain tokens at `context`, replayed from a CUDA graph."""
        return self.verify_timing(batch, tokens, context, reps, use_kernels)[0]

    def verify_timing(
        self,
        batch: int,
        tokens: int,
        context: int,
        reps: int = 10,
        use_kernels: bool | None = None,
        profile: Callable[[Callable[[], None]], dict[str, float]] | None = None,
    ) -> tuple[float, dict[str, float]]:
        """verify_time's median seconds, and what `profile` (given the replay; e.g.
        executor.calibrate.kernel_classes) reports of the same graph ({} without one)."""
        self._check(batch, context, tokens)
        dev = self.device
        kern = self.use_kernels if use_kernels is None else use_kernels
        if kern:
            self.tune(batch, tokens, context)
        tok = torch.randint(0, self.target.spec.vocab, (batch, tokens), device=dev)
        pos, mask = _causal_rows(batch, tokens, context, dev)
        plan = (
            TreeAttentionPlan(batch, tokens, context, self.tcache.capacity, self.target.heads, dev)
            if kern
            else None
        )
        if plan is not None:
            plan.set_mask(mask)
        out = torch.zeros((batch, tokens), dtype=torch.int64, device=dev)

        def fwd() -> None:
            h, _ = self.target.forward(tok, pos, self.tcache, context, mask, plan=plan)
            out.copy_(self.target.lm_head(h).argmax(dim=-1))

        return self._replay_timing(fwd, "verify", reps, profile)

    def draft_step_timing(
        self,
        batch: int,
        width: int,
        context: int,
        reps: int = 10,
        profile: Callable[[Callable[[], None]], dict[str, float]] | None = None,
    ) -> tuple[float, dict[str, float]]:
        """Median seconds of one drafter step (forward + logits + top-k), replayed from a CUDA
        graph: tokens [B, W] at positions context.., each seeing the prefix and the earlier
        frontier slots (a causal [B, W, W] mask); and what `profile` (given the replay, as
        verify_timing's) reports of the same graph ({} without one). A drafter whose logits
        come narrower than its vocabulary (a TP drafter with its collectives off,
        executor.tp) has them tiled to the whole width first."""
        self._check(batch, context, width)
        dev, d = self.device, self.drafter
        tok = torch.randint(0, self.target.spec.vocab, (batch, width), device=dev)
        hidden = torch.randn(
            (batch, width, self.target.spec.hidden), device=dev, dtype=self.target.dtype
        )
        pos, mask = _causal_rows(batch, width, context, dev)
        out = torch.zeros((batch, width, width), dtype=torch.int64, device=dev)

        vocab = self.draft_vocab

        def step() -> None:
            h = d.draft_step(tok, hidden, pos, self.dcache, context, 0, mask)
            logits = d.logits(h)
            if logits.shape[-1] < vocab:
                # a rank's share: tiled to the whole width (one copy, as the gather's layout
                # copy) so that the top-k runs as it does after the gather:
                # torch.topk picks its kernels by width (at batch 1 over 16K columns 17 fewer
                # than over 32K, results/tp_classes_h200/host_c)
                logits = logits.repeat(1, 1, vocab // logits.shape[-1])
            out.copy_(torch.topk(logits, width, dim=-1).indices)

        return self._replay_timing(step, "draft", reps, profile)

    def _replay_timing(
        self,
        body: Callable[[], None],
        phase: str,
        reps: int,
        profile: Callable[[Callable[[], None]], dict[str, float]] | None,
    ) -> tuple[float, dict[str, float]]:
        """`body` captured in a CUDA graph (eager where the session runs without graphs),
        replayed twice to warm up, then the median seconds of `reps` timed replays and what
        `profile` reports of the replay ({} without one); the graph is freed after."""
        dev = self.device
        g = PhaseGraphs([body], dev, self.cfg.use_graphs)
        fn = g.phases()[0]
        for _ in range(2):
            fn()
        timer = PhaseTimer((phase,), reps, dev)
        timer.run([fn])
        t = timer.medians_s()[phase]
        classes = profile(fn) if profile is not None else {}
        del g
        _free()
        return t, classes


def _causal_rows(
    batch: int, n: int, context: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [B, n] of n new tokens after `context` cached ones, and their causal mask
    [B, n, n] (each sees the earlier ones): the shape a chain of n tokens verifies or drafts."""
    pos = context + torch.arange(n, device=device).expand(batch, n)
    mask = (
        torch.ones((n, n), dtype=torch.bool, device=device).tril().expand(batch, n, n).contiguous()
    )
    return pos, mask


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_runs(
    session: Session,
    runs: list[tuple[int, TreePolicy | None, str]],
    context: int,
    acceptance: object,
    steps: int,
    warmup: int = 3,
    keep_going: bool = False,
    repeats: int = 1,
) -> list[dict[str, object]]:
    """Measure each (batch, policy, label) against the baseline at the same batch (measured once
    per batch); returns the measurement document's "runs" entries. Every policy at one batch sees
    the same acceptance draws (common random numbers), repeat r of each on stream r; with
    `repeats` > 1 each entry also holds the repeats' figures and their spread
    (validate.measure.run_record). With `keep_going`, a run that fails is reported on stderr
    and skipped."""
    from spectune.validate.measure import RunSpec, run_record

    baselines: dict[int, tuple[PhaseResult, dict[str, float] | None]] = {}
    out = []
    gpu = (session.device.index or 0) if session.device.type == "cuda" else None
    for batch, policy, label in runs:
        if batch not in baselines:
            with GpuSampler(gpu) as s:
                baselines[batch] = (session.run_ar(batch, context, steps, warmup), s.state())
        ar, ar_state = baselines[batch]
        try:
            with GpuSampler(gpu) as s:
                res = (
                    None
                    if policy is None
                    else session.run_spec(
                        batch, context, policy, acceptance, steps, warmup, repeats
                    )
                )
        except Exception:
            if not keep_going:
                raise
            traceback.print_exc()
            _free()
            continue
        rec = run_record(RunSpec(batch, policy, label), res, ar)
        # the SM clock and power while each was timed (executor.gpu_state; NVML where present)
        state = s.state()
        if policy is not None and state is not None:
            rec["gpu_state"] = state
        if ar_state is not None:
            rec["ar_gpu_state"] = ar_state
        out.append(rec)
        spread = rec.get("spread", {}).get("tokens_per_s_rel", 0.0) if repeats > 1 else 0.0
        note = f"  +-{spread:.1%} ({repeats} runs)" if repeats > 1 and policy else ""
        print(
            f"  B={batch:<3} {label:<10} {policy and (policy.depth, policy.topk, policy.budget)!s:<14} "
            f"step {rec['phases_ms']['step']:8.3f} ms  verify {rec['phases_ms']['verify']:7.3f}  "
            f"acc {rec['accepted_mean']:.2f}  {rec['tokens_per_s']:9.0f} decode tok/s  "
            f"x{rec['speedup']:.2f}{note}",
            flush=True,
        )
    return out
