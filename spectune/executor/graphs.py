"""Phase functions replayed as CUDA graphs, so a measured step costs no Python per kernel.

Each phase of a runner (draft, tree, verify, ...) is a method that touches only persistent
tensors; captured once per run into one memory pool, a step replays one graph per phase. A phase
that must sync with the host (the ragged verify reads its token count) stays eager and replays
graphs of its own, captured into the same pool. Off CUDA (tests) the phases run as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch


class PhaseGraphs:
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
