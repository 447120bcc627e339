"""A streaming read of HBM: the read-only bandwidth ceiling for calibration.

`calibrate` bounds the weight and attention efficiencies by the larger of the measured copy
and read rates, the read rate being the faster of torch's sum and this kernel: a persistent
read with many loads in flight per SM. On an H100 SXM both read 3.01-3.02 TB/s, a copy 3.005
(benchmarks/probe_read.py; benchmarks/results/probe_read_h100.json).

Each program sums BLOCK-element tiles of x, strided over the grid (a persistent loop), and
writes one float32 partial: bytes read = x.numel() * x.element_size(), written = 4 * programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n, tiles, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    for t in range(pid, tiles, progs):
        idx = tl.full([BLOCK], t, dtype=tl.int64) * BLOCK + offs
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def stream_read(
    x: torch.Tensor, programs: int | None = None, block: int = 4096, num_warps: int = 8
) -> torch.Tensor:
    """Partial sums float32[programs] of contiguous x (their total is x.sum()). programs:
    default 4 per SM (4 off the GPU)."""
    if not x.is_contiguous():
        raise ValueError("stream_read: x must be contiguous")
    if programs is None:
        sms = (
            torch.cuda.get_device_properties(x.device).multi_processor_count
            if x.device.type == "cuda"
            else 1
        )
        programs = 4 * sms
    n = x.numel()
    tiles = triton.cdiv(n, block)
    programs = max(1, min(programs, tiles))
    out = torch.empty(programs, dtype=torch.float32, device=x.device)
    _stream_read_kernel[(programs,)](x.view(-1), out, n, tiles, BLOCK=block, num_warps=num_warps)
    return out
