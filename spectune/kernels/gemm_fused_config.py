"""Launch configs of spectune.kernels.gemm_fused's fused_linear, the per-layer plan the executor's
fused decoder layer reads (LayerGemmPlan), and the tuner that picks a config per GEMM by timing
candidates on the GPU at hand (CUDA-graph replays; tile by tile, one compile each, so a
deadline drops whole tiles)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spectune.kernels.timing import graph_time


@dataclass(frozen=True)
class FusedLinearConfig:
    """Launch of one fused_linear: K splits per output tile, tile widths, warps, pipeline
    stages. Programs = ceil(N_out / block_n) * splits * ceil(M / 64)."""

    splits: int = 1
    block_n: int = 64
    block_k: int = 128
    warps: int = 4
    stages: int = 4
    # with pdl on a GPU: K columns of each program's weight rows pulled into L2 before the
    # wait for the previous kernel (0: none; >= K / splits: the program's whole slice)
    prefetch_k: int = 0
    evict_first: bool = False  # weight loads marked evict-first (streamed once)

    @property
    def name(self) -> str:
        extra = (f"/pf{self.prefetch_k}" if self.prefetch_k else "") + (
            "/ef" if self.evict_first else ""
        )
        return f"s{self.splits}/{self.block_n}x{self.block_k}/{self.warps}w{self.stages}s{extra}"


@dataclass(frozen=True)
class LayerGemmPlan:
    """The fused_linear launches of one dense decoder layer (q|k|v with the attention norm, o
    with the residual add, gate|up with the MLP norm and SwiGLU, down with the residual add),
    and whether they (and the RoPE + K/V store between them) launch as programmatic dependent
    launches."""

    qkv: FusedLinearConfig = FusedLinearConfig()
    o: FusedLinearConfig = FusedLinearConfig()
    gate_up: FusedLinearConfig = FusedLinearConfig()
    down: FusedLinearConfig = FusedLinearConfig()
    pdl: bool = True
    rope_in_qkv: bool = False  # RoPE + K/V store as the q|k|v epilogue (RopeStore)

    def to_dict(self) -> dict[str, object]:
        return {
            "qkv": self.qkv.name,
            "o": self.o.name,
            "gate_up": self.gate_up.name,
            "down": self.down.name,
            "pdl": self.pdl,
            "rope_in_qkv": self.rope_in_qkv,
        }


#: candidate launches the tuner times per GEMM, most likely first (M <= 64: one m block of
#: 64 rows; each program re-reads its x rows from L2 per weight tile, 64 / BLOCK_N of the weight
#: bytes, so wide tiles with more K splits spare L2 bandwidth). Shared memory in the comments:
#: bf16, plain epilogue (the gated one holds two weight tiles per stage).
CANDIDATE_TILES = (
    (64, 128, 4, 4),  # 128 KB: one program per SM
    (128, 64, 4, 4),  # 96 KB: two per SM
    (64, 64, 4, 4),  # 64 KB: three per SM
    (256, 64, 8, 3),  # 120 KB
    (128, 128, 8, 3),  # 144 KB
)
CANDIDATE_SPLITS = (1, 2, 3, 4, 6, 8)


def tune_fused_linear(
    call: Callable[[FusedLinearConfig], Callable[[], object]],
    device: torch.device,
    splits: Sequence[int] = CANDIDATE_SPLITS,
    tiles: Sequence[tuple[int, int, int, int]] = CANDIDATE_TILES,
    deadline_s: float | None = None,
) -> tuple[FusedLinearConfig, list[dict[str, object]]]:
    """Time `call(config)` (a function that runs the GEMM once, e.g. over rotating weight
    copies) for every candidate as a CUDA-graph replay, tile by tile (one compile each);
    returns the fastest config and rows of {config, seconds} (or error, for a candidate that
    does not compile). deadline_s: a time.monotonic() past which no new tile is started
    (the first tile always runs)."""
    rows: list[dict[str, object]] = []
    best, best_t = FusedLinearConfig(), float("inf")
    for i, (bn, bk, warps, stages) in enumerate(tiles):
        if i and deadline_s is not None and time.monotonic() > deadline_s:
            rows.append({"config": f"{bn}x{bk}/{warps}w{stages}s", "error": "skipped: deadline"})
            continue
        for s in splits:
            cfg = FusedLinearConfig(s, bn, bk, warps, stages)
            try:
                t = graph_time(call(cfg), device)
            except Exception as e:  # a config that does not compile or fit is skipped
                rows.append({"config": cfg.name, "error": repr(e)[:200]})
                break  # the other split counts share the compile: they fail alike
            rows.append({"config": cfg.name, "seconds": t})
            if t < best_t:
                best, best_t = cfg, t
    return best, rows
