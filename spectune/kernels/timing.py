"""GPU timing with CUDA events: the executor's per-phase step timer and the CUDA-graph replay
timer that kernel tuning (tree attention, split-K GEMMs, fused MoE) and benchmarks use.

PhaseTimer records one event between consecutive phases of every step.

Events are recorded on the stream the phases run on, so they time the GPU timeline (graph
replays included) without a host sync per step; all readings happen after one synchronize at
the end. The step time is event-to-event from the start of one step to the start of the next,
and whatever the phases do not cover (bookkeeping, launch gaps) is the 'overhead' phase.
On CPU (tests) a host clock stands in.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


class PhaseTimer:
    """Times `steps` iterations of an ordered list of named phases."""

    def __init__(self, phases: Sequence[str], steps: int, device: torch.device):
        self.phases = list(phases)
        self.steps = steps
        self.cuda = device.type == "cuda"
        n = (len(self.phases) + 1) * steps + 1
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(n)] if self.cuda else []
        self._host: list[float] = []

    def _mark(self, i: int) -> None:
        if self.cuda:
            self._events[i].record()
        else:
            self._host.append(time.perf_counter())

    def run(
        self, fns: Sequence[Callable[[], None]], after_step: Callable[[int], None] | None = None
    ) -> None:
        """Run every phase function `steps` times in order; `after_step(i)` runs in the overhead slot."""
        k = len(self.phases) + 1
        for s in range(self.steps):
            for p, fn in enumerate(fns):
                self._mark(s * k + p)
                fn()
            self._mark(s * k + len(fns))
            if after_step is not None:
                after_step(s)
        self._mark(self.steps * k)
        if self.cuda:
            torch.cuda.synchronize()

    def _stamps(self) -> list[float]:
        """Seconds of every mark relative to the first."""
        if self.cuda:
            first = self._events[0]
            return [first.elapsed_time(e) / 1e3 for e in self._events]
        return [t - self._host[0] for t in self._host]

    def steps_s(self) -> dict[str, list[float]]:
        """Seconds of every step per phase, 'overhead' (step minus phases) and 'step'."""
        t = self._stamps()
        k = len(self.phases) + 1
        per: dict[str, list[float]] = {p: [] for p in [*self.phases, "overhead", "step"]}
        for s in range(self.steps):
            base = s * k
            covered = 0.0
            for p, name in enumerate(self.phases):
                dt = t[base + p + 1] - t[base + p]
                per[name].append(dt)
                covered += dt
            step = t[base + k] - t[base]
            per["step"].append(step)
            per["overhead"].append(max(step - covered, 0.0))
        return per

    def medians_s(self) -> dict[str, float]:
        """Median seconds per phase, 'overhead' (step minus phases) and 'step', over all steps."""
        return {name: statistics.median(v) for name, v in self.steps_s().items()}


def graph_time(fn: Callable[[], object], device: torch.device, reps: int = 20) -> float:
    """Median seconds of fn() captured in a CUDA graph and replayed `reps` times (the launch gaps
    the model sees); on CPU, fn() itself on the host clock."""
    if device.type != "cuda":
        timer = PhaseTimer(("g",), reps, device)
        timer.run([lambda: _discard(fn())])
        return timer.medians_s()["g"]
    g = capture_graph(fn)
    timer = PhaseTimer(("g",), reps, device)
    timer.run([g.replay])
    t = timer.medians_s()["g"]
    del g
    return t


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after two warm-up calls on a side stream (CUDA only)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _discard(_: object) -> None:
    return None
