"""Sampling target tokens from logits without an N x vocab probability tensor.

`_sample_kernel`: per row of logits [rows, vocab], argmax of the logits (temperature 0) or of
logits / T + Gumbel noise (Gumbel-max: an exact sample of softmax(logits / T)). The noise comes
from Triton's counter-based Philox: one call per counter (row * quarter + i) gives four
uniforms, for columns i, quarter + i, 2 quarter + i, 3 quarter + i (quarter = ceil(vocab / 4)),
so it is reproducible for (seed, row, column) on any launch shape, and nothing of size
rows x vocab is written. Bytes: one read of the logits.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _argmax_update(best, best_idx, score, cols):
    """Fold one tile's row maxima into the running (best, best_idx); ties go to the lower index."""
    m = tl.max(score, 1)
    idx = tl.min(tl.where(score == m[:, None], cols[None, :], 2147483647), 1)
    take = (m > best) | ((m == best) & (idx < best_idx))
    return tl.where(take, m, best), tl.where(take, idx, best_idx)


@triton.jit
def _gumbel_tile(LOGITS, r64, r_ok, stride_r, cols, ok, u, inv_temp, best, best_idx):
    x = tl.load(LOGITS + r64[:, None] * stride_r + cols[None, :], mask=ok, other=0.0)
    g = -tl.log(-tl.log(u))  # Gumbel(0, 1); u == 0 gives -inf (never chosen)
    score = tl.where(ok, x.to(tl.float32) * inv_temp + g, float("-inf"))
    return _argmax_update(best, best_idx, score, cols)


@triton.jit
def _sample_kernel(
    LOGITS, OUT, rows, vocab, quarter, stride_r, inv_temp, seed,
    GREEDY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Row argmax of logits (GREEDY) or of logits / T + Gumbel noise. Noise: one Philox call per
    counter (row * quarter + i) gives four uniforms, for columns i, quarter + i, 2 quarter + i and
    3 quarter + i (quarter = ceil(vocab / 4)): a quarter of the Philox work of one call per column."""
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < rows
    r64 = r.to(tl.int64)
    best = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([BLOCK_R], 2147483647, dtype=tl.int32)
    if GREEDY:
        for v0 in range(0, vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            ok = r_ok[:, None] & (cols[None, :] < vocab)
            x = tl.load(LOGITS + r64[:, None] * stride_r + cols[None, :], mask=ok, other=0.0)
            score = tl.where(ok, x.to(tl.float32), float("-inf"))
            best, best_idx = _argmax_update(best, best_idx, score, cols)
    else:
        for i0 in range(0, quarter, BLOCK_V):
            i = i0 + tl.arange(0, BLOCK_V)
            u0, u1, u2, u3 = tl.rand4x(seed, r64[:, None] * quarter + i[None, :])
            in_q = r_ok[:, None] & (i[None, :] < quarter)
            c = i
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u0,
                inv_temp,
                best,
                best_idx,
            )
            c = i + quarter
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u1,
                inv_temp,
                best,
                best_idx,
            )
            c = i + 2 * quarter
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u2,
                inv_temp,
                best,
                best_idx,
            )
            c = i + 3 * quarter
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u3,
                inv_temp,
                best,
                best_idx,
            )
    tl.store(OUT + r64, best_idx.to(tl.int64), mask=r_ok)


def sample_target(
    logits: torch.Tensor, temperature: float = 0.0, seed: int = 0, *, block_r: int | None = None
) -> torch.Tensor:
    """int64[rows]: argmax (temperature 0) or one Gumbel-max sample of softmax(logits / T) per row.

    logits: [rows, vocab] float32 / float16 / bfloat16, last dim contiguous. Deterministic for
    (seed, row, col): the same seed and logits give the same tokens on any launch shape.
    """
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be [rows, vocab] with a contiguous last dim, got {tuple(logits.shape)}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 <= seed < 2**63:
        raise ValueError("seed must be in [0, 2**63)")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    on_gpu = logits.device.type == "cuda"
    if block_r is None:
        block_r = 1 if on_gpu else min(8192, triton.next_power_of_2(rows))
    block_v = min(triton.next_power_of_2(vocab), 4096 if on_gpu else 1024)
    cap = 8192 if on_gpu else 65536  # interpreter: few big programs (numpy per-op overhead)
    if block_r * block_v > cap:
        block_v = max(16, cap // block_r)
    greedy = temperature == 0.0
    quarter = triton.cdiv(vocab, 4)
    if not greedy:  # four column tiles per Philox call
        block_v = min(block_v, max(16, triton.next_power_of_2(quarter)))
    _sample_kernel[(triton.cdiv(rows, block_r),)](
        logits, out, rows, vocab, quarter, logits.stride(0), 0.0 if greedy else 1.0 / temperature, seed,
        GREEDY=greedy, BLOCK_R=block_r, BLOCK_V=block_v, num_warps=8 if on_gpu else 4,
    )  # fmt: skip
    return out


def _philox_uniforms(seed: int, counters: np.ndarray) -> list[np.ndarray]:
    """The four float32 uniforms of Triton's tl.rand4x(seed, counters) (Philox4x32-10)."""
    mask32 = np.uint64(0xFFFFFFFF)
    off = counters.astype(np.uint64)
    c0 = off & mask32
    c1 = off >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    round_a, round_b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    key_a, key_b = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    for _ in range(10):
        prod_b = round_b * c2  # < 2**64: exact in uint64
        prod_a = round_a * c0
        c0, c1, c2, c3 = (
            (prod_b >> np.uint64(32)) ^ c1 ^ k0,
            prod_b & mask32,
            (prod_a >> np.uint64(32)) ^ c3 ^ k1,
            prod_a & mask32,
        )
        k0 = (k0 + key_a) & mask32
        k1 = (k1 + key_b) & mask32
    out = []
    for c in (c0, c1, c2, c3):
        x = c.astype(np.uint32).view(np.int32)
        x = np.where(x < 0, ~x, x)
        out.append(x.astype(np.float32) * np.float32(4.6566127342e-10))
    return out


def reference_sample_target(
    logits: torch.Tensor, temperature: float = 0.0, seed: int = 0
) -> torch.Tensor:
    """numpy float32 replica of sample_target (same Philox stream, same Gumbel-max, same ties)."""
    x = logits.detach().float().cpu().numpy()
    if temperature == 0.0:
        return torch.from_numpy(x.argmax(1).astype(np.int64))
    rows, vocab = x.shape
    quarter = -(-vocab // 4)
    counters = (
        np.arange(rows, dtype=np.int64)[:, None] * quarter
        + np.arange(quarter, dtype=np.int64)[None, :]
    )
    u = np.concatenate(_philox_uniforms(seed, counters), axis=1)[:, :vocab]
    with np.errstate(divide="ignore"):
        g = -np.log(-np.log(u))
    score = x * np.float32(1.0 / temperature) + g
    return torch.from_numpy(score.argmax(1).astype(np.int64))
