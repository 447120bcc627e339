"""What the ranks of a tensor-parallel command run (`spectune execute --tp N`, `spectune
calibrate [--tp N]`): one job description, pickled to every spawned rank
(spectune.executor.collectives.launch), and the function each rank runs on it. Every rank makes
the same calls in the same order (their collectives must pair up); rank 0 writes the document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spectune.executor.collectives import SWEEP_BYTES, TPGroup, collective_sweep
from spectune.executor.session import SessionConfig, measure_runs
from spectune.executor.tp import TPSession
from spectune.specs import ModelSpec, TreePolicy, write_json_atomic


def _gpu(group: TPGroup) -> str:
    if group.device.type == "cuda":
        return torch.cuda.get_device_name(group.device)
    return "cpu"


def sweep_tps(world: int) -> tuple[int, ...]:
    """The group sizes the collectives sweep times on `world` GPUs: 2, 4, 8, ... <= world."""
    out, t = [], 2
    while t <= world:
        out.append(t)
        t *= 2
    return tuple(out)


def sweep_all(
    group: TPGroup, tps: tuple[int, ...], sizes: tuple[int, ...] = SWEEP_BYTES, reps: int = 10
) -> list[dict[str, Any]]:
    """collective_sweep on the first t ranks for each t in tps (every rank calls; ranks
    outside a subgroup wait at its end)."""
    rows: list[dict[str, Any]] = []
    for t in tps:
        sub = group.subgroup(t)
        if sub is not None:
            rows += collective_sweep(sub, sizes, reps=reps, inner=max(1, min(20, reps * 2)))
        group.barrier()
    return rows


@dataclass(frozen=True)
class ExecuteJob:
    """`spectune execute --tp N`: measure `runs` (batch, policy or None, label) against the
    baseline, as measure_runs does on one GPU; `doc` holds the measurement document's
    remaining fields (hardware, workload, command, ...; target and drafter to name them other
    than by the specs' names, e.g. by their spec files)."""

    target: ModelSpec
    drafter: ModelSpec
    runs: tuple[tuple[int, TreePolicy | None, str], ...]
    context: int
    acceptance: object
    steps: int
    warmup: int
    out: str
    doc: dict[str, Any] = field(default_factory=dict)
    use_kernels: bool = True
    use_graphs: bool = True
    grid: CalibrateJob | None = None  # a verify grid (and sweep) to time first, same session
    gemm_plan: dict[str, str] | None = None  # GEMM variants to run (TPSession's gemm_plan)
    plan_source: str = "gemm_plan"  # where gemm_plan came from, for errors


def execute_rank(group: TPGroup, job: ExecuteJob) -> None:
    from spectune.executor.sources import cache_slots
    from spectune.validate.measure import format_table, measurement_doc

    budgets = [cache_slots(p, job.acceptance, b) for b, p, _ in job.runs if p is not None]
    g = job.grid or CalibrateJob("", "", ())
    cfg = SessionConfig(
        max([b for b, _, _ in job.runs] + list(g.batches)),
        max([job.context, *g.contexts]),
        max([1, *budgets, *g.tokens, *g.draft_widths]),
        use_graphs=job.use_graphs,
        use_kernels=job.use_kernels,
    )
    session = TPSession(
        job.target, job.drafter, cfg, group, gemm_plan=job.gemm_plan, plan_source=job.plan_source
    )
    if job.grid is not None:
        _grid(group, session, job.grid, sweep_all(group, g.tps, g.sizes, g.reps))
    recs = measure_runs(session, list(job.runs), job.context, job.acceptance, job.steps, job.warmup)
    # the replicated loop must accept the same on every rank (same logits, same random stream)
    accepted = [r["accepted_mean"] for r in recs]
    every: list[Any] = [None] * group.world
    if group.world > 1:
        import torch.distributed as dist

        dist.all_gather_object(every, accepted, group=group.group)
    else:
        every = [accepted]
    if group.rank != 0:
        return
    meta = dict(job.doc)
    doc = measurement_doc(
        gpu=_gpu(group),
        hardware=str(meta.pop("hardware")),
        target=str(meta.pop("target", job.target.name)),
        drafter=str(meta.pop("drafter", job.drafter.name)),
        workload=str(meta.pop("workload", "")),
        context=job.context,
        steps=job.steps,
        attention=session.attention_backend,
        runs=recs,
        extra={
            "tp": group.world,
            "ranks_agree": all(a == accepted for a in every),
            **session.kernel_plans(),
            **meta,
        },
    )
    write_json_atomic(job.out, doc)
    print(format_table(doc), flush=True)


@dataclass(frozen=True)
class CalibrateJob:
    """`spectune calibrate --tp N` (target given): the verify grid of the split target, each
    point also without its collectives, plus the collectives sweep over `tps`; without a target
    (a one-GPU calibrate on a host of several GPUs): the sweep only. rank 0 writes `out`
    (a calibration-run document; the sweep alone: a JSON list of rows)."""

    out: str
    hardware: str
    tps: tuple[int, ...]
    target: ModelSpec | None = None
    drafter: ModelSpec | None = None
    batches: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    contexts: tuple[int, ...] = ()
    use_graphs: bool = True
    sizes: tuple[int, ...] = SWEEP_BYTES  # message bytes of the sweep
    reps: int = 10  # timed replays per point (sweep and verify grid)
    refs: tuple[str, str] = ("", "")  # target, drafter as the document names them ('': .name)
    draft_widths: tuple[int, ...] = ()  # drafter steps over batches x these frontier widths


def calibrate_rank(group: TPGroup, job: CalibrateJob) -> None:
    rows = sweep_all(group, job.tps, job.sizes, job.reps)
    if job.target is None or job.drafter is None:
        if group.rank == 0:
            write_json_atomic(job.out, rows)
        return
    cfg = SessionConfig(
        max(job.batches),
        max(job.contexts),
        max([*job.tokens, *job.draft_widths]),
        use_graphs=job.use_graphs,
    )
    _grid(group, TPSession(job.target, job.drafter, cfg, group), job, rows)


def _grid(
    group: TPGroup, session: TPSession, job: CalibrateJob, rows: list[dict[str, Any]]
) -> None:
    """The verify grid of `job` on `session`, and the drafter steps over its batches x
    draft_widths, each point with and without its collectives; rank 0 writes them with the
    sweep's rows as a calibration-run document ('verify', 'draft', 'collectives')."""
    from spectune.executor.calibrate import RUN_SCHEMA

    assert job.target is not None and job.drafter is not None

    def timed_grid(label: str, key: str, widths: Sequence[int], time: Any) -> list[dict[str, Any]]:
        """time(batch, width, context, reps) -> (with, without collectives) over the job's
        contexts x batches x `widths`, as rows {batch, tokens, context, seconds,
        seconds_nocomm}."""
        rows = []
        for c in job.contexts:
            for b in job.batches:
                for n in widths:
                    t, t0 = time(b, n, c, job.reps)
                    rows.append(
                        {"batch": b, "tokens": n, "context": c, "seconds": t, "seconds_nocomm": t0}
                    )
                    print(
                        f"  {label} tp{group.world} B={b:<3} {key}={n:<4} C={c:<5} {t * 1e3:8.3f} ms "
                        f"(no collectives {t0 * 1e3:8.3f} ms)",
                        flush=True,
                    )
        return rows

    grid = timed_grid("verify", "N", job.tokens, session.verify_time_comm)
    draft = timed_grid("draft step", "W", job.draft_widths, session.draft_step_time_comm)
    if group.rank == 0:
        doc = {
            "schema": RUN_SCHEMA,
            "gpu": _gpu(group),
            "hardware": job.hardware,
            "target": job.refs[0] or job.target.name,
            "drafter": job.refs[1] or job.drafter.name,
            "attention": session.attention_backend,
            "tp": group.world,
            "verify": grid,
            "collectives": rows,
        }
        if draft:
            doc["draft"] = draft
        write_json_atomic(job.out, doc)


def read_sweep(path: str | Path) -> list[dict[str, Any]]:
    """The rows calibrate_rank wrote for a sweep-only job."""
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of sweep rows")
    return rows
