"""A tensor-parallel target forward along the tree-token axis, kernel by kernel, on each rank.

The TP runs price the step without speculation (N = 1) 2.5-5.8% high at tp 2 while their
4- and 8-token verifies are within 2% (benchmarks/results/tp_h200x2_c, tp_h100x2_c): measured,
the forward steps up by 145-191 us from N = 1 to N = 4 and then stays flat to N = 16, where
the cost model grows by 33-67 us. This probe replays the executor's TP verify graph
(Session.verify_timing on a TPSession: forward, vocab-parallel LM head, argmax) with and
without its collectives at each (batch, tokens) of `--shapes`, under torch.profiler on every
rank, and reports per shape the median wall time, the kernel time by class
(executor.calibrate.kernel_class, plus "comm" for NCCL kernels) and per kernel name (the
longest 40), so the step can be placed.

    PYTHONPATH=. python benchmarks/probe_tp_forward.py --tp 2 --out $OUT/tp_forward.json
    PYTHONPATH=. python benchmarks/probe_tp_forward.py --tp 1 --shapes 1x1,1x4 ...

`--draft-shapes BxW,...` also times the drafter's step (TPSession.draft_step_timing: the EAGLE-3
head's forward over B x W frontier tokens, its logits and the top-W) the same way, so the
drafter's tp 2 step can be set beside its tp 1 step on the same host (the TP runs price the
tp 2 draft phase 3-6% low at batch 1-8 while its tp 1 phase is within 3%).

Llama-3.1-8B + its EAGLE-3 head at real shape, context 4096; --tp GPUs of one host (NCCL; keep
NVLink multicast off: NCCL_NVLS_ENABLE=0). Rank 0 writes the JSON and prints a table last.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.probe_forward_kernels import _by_name, _profile, by_class
from spectune.executor.calibrate import kernel_class
from spectune.executor.collectives import TPGroup, launch
from spectune.executor.session import SessionConfig
from spectune.executor.tp import TPSession
from spectune.kernels.gemm import GemmPlan
from spectune.specs import load_model
from spectune.specs.io import load_document, write_json_atomic

SHAPES = "1x1,1x2,1x4,1x8,1x16,8x1,8x2,8x4,8x8,8x16"
#: the draft widths of the TP runs' policies (chain 1, SGLang's top-k 4, the planned 10)
DRAFT_SHAPES = ""
CONTEXT = 4096


def read_plan(path: str) -> dict[str, str]:
    """The GEMM plan in file `path`: a document's "gemm_plan" (this probe's --out, a TP run's
    execute-tpN.json) or a plan object itself, checked as TPSession reads it
    (kernels.gemm.GemmPlan.from_dict); a SpecError naming the file where it is neither."""
    doc = load_document(path)
    plan = doc.get("gemm_plan", doc)
    return GemmPlan.from_dict(plan, path).to_dict()


def _class(name: str) -> str:
    return "comm" if "nccl" in name.lower() else kernel_class(name)


def _profiler(reps: int, sink: dict[str, Any]) -> Callable[[Callable[[], None]], dict[str, float]]:
    """A verify_timing profile hook: `reps` profiled replays; per class (median us) returned,
    per kernel name left in `sink`."""

    def profile(fn: Callable[[], None]) -> dict[str, float]:
        calls = _profile(fn, reps)
        sink["by_name_us"] = _by_name(calls)
        sink["kernels"] = statistics.median(len(c) for c in calls) if calls else 0
        return by_class(calls, _class)

    return profile


Profile = Callable[[Callable[[], None]], dict[str, float]]


def _time_one(
    s: TPSession, kind: str, batch: int, tokens: int, context: int, profile: Profile
) -> tuple[float, dict[str, float]]:
    """A verify forward or a drafter step of `s` at (batch, tokens), 10 timed replays."""
    if kind == "verify":
        return s.verify_timing(batch, tokens, context, 10, profile=profile)
    return s.draft_step_timing(batch, tokens, context, 10, profile)


def _timed(model: Any, time: Callable[[Profile], tuple[float, dict[str, float]]]) -> dict[str, Any]:
    """{"comm": ..., "nocomm": ...}: `time(profile)` with `model`'s collectives on and off, each
    the median wall time and the profiled kernel time by class (and per kernel name)."""
    row: dict[str, Any] = {}
    for comm in (True, False):
        model.set_comm(comm)
        torch.manual_seed(0)
        sink: dict[str, Any] = {}
        t, classes = time(_profiler(5, sink))
        row["comm" if comm else "nocomm"] = {"wall_us": t * 1e6, "by_class_us": classes, **sink}
    model.set_comm(True)
    return row


def probe_rank(
    group: TPGroup,
    shapes: list[tuple[int, int]],
    context: int,
    out: str,
    draft_shapes: Sequence[tuple[int, int]] = (),
    gemm_plan: str = "",
) -> None:
    target, drafter = load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
    both = [*shapes, *draft_shapes]
    cfg = SessionConfig(
        max(b for b, _ in both), context, max(16, max(n for _, n in both)), use_graphs=True
    )
    plan = read_plan(gemm_plan) if gemm_plan else None
    s = TPSession(target, drafter, cfg, group, gemm_plan=plan, plan_source=gemm_plan or "gemm_plan")
    rows: list[dict[str, Any]] = []
    drafts: list[dict[str, Any]] = []
    for kind, todo, sink in (("verify", shapes, rows), ("draft", draft_shapes, drafts)):
        for b, n in todo:
            timed = _timed(
                s.target if kind == "verify" else s.tp_drafter,
                functools.partial(_time_one, s, kind, b, n, context),
            )
            sink.append({"batch": b, "tokens": n, "context": context, **timed})
            if group.rank == 0:
                c, z = timed["comm"], timed["nocomm"]
                print(
                    f"tp{group.world} {kind} B={b} N={n}: {c['wall_us']:.1f} us "
                    f"(no collectives {z['wall_us']:.1f})",
                    flush=True,
                )
    if group.rank != 0:
        return
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "tp": group.world,
        "target": "llama-3.1-8b",
        "gemm_plan": s.gemm_plan,
        "attention_rows": s.attention_rows,
        "shapes": rows,
        "draft_shapes": drafts,
    }
    if out:
        write_json_atomic(out, doc)
    classes = ("linear", "attention", "other", "comm")
    print(f"tp {group.world}, context {context}, us (wall; kernel time by class, with collectives)")
    print(f"{'B':>3} {'N':>3} {'wall':>8} {'nocomm':>8} " + " ".join(f"{c:>9}" for c in classes))
    for title, part in (("verify", rows), ("drafter step (N: frontier width)", drafts)):
        if part:
            print(title)
        for r in part:
            cl = r["comm"]["by_class_us"]
            print(
                f"{r['batch']:>3} {r['tokens']:>3} {r['comm']['wall_us']:>8.1f} "
                f"{r['nocomm']['wall_us']:>8.1f} "
                + " ".join(f"{cl.get(c, 0):>9.1f}" for c in classes)
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--shapes", default=SHAPES, help="comma-separated BxN at --context")
    p.add_argument(
        "--draft-shapes", default=DRAFT_SHAPES, help="comma-separated BxW drafter steps (none: '')"
    )
    p.add_argument("--context", type=int, default=CONTEXT)
    p.add_argument("--out", default="")
    p.add_argument(
        "--gemm-plan",
        default="",
        help="JSON file: GEMM variants to run instead of autotuning (a document with "
        "'gemm_plan', e.g. this probe's --out, or the plan object itself)",
    )
    args = p.parse_args()

    def parse(text: str) -> list[tuple[int, int]]:
        return [(int(b), int(n)) for b, n in (sh.split("x") for sh in text.split(",") if sh)]

    launch(
        probe_rank,
        args.tp,
        (parse(args.shapes), args.context, args.out, parse(args.draft_shapes), args.gemm_plan),
        backend="nccl",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
