"""Fused mixture-of-experts FFN for a verify step: route, group by expert, two grouped GEMMs.

A step's T tokens each pick k of E experts. Running the experts one by one (the reference) needs
the host to know which tokens went where; a CUDA graph cannot wait for that. Here every shape is
static and the grouping happens on the GPU:

1. `route_topk`: softmax over router logits [T, E], top-k ids int32[T, k] and weights
   fp32[T, k] (renormalised over the k picked, as Qwen3 does). Reads T*E*2 B, writes T*k*8 B.
2. `moe_align`: one program counts the T*k (token, expert) pairs per expert, pads each expert's
   count up to a multiple of BLOCK_M, and writes `sorted_ids` (pair index t*k + j grouped by
   expert, padding slots = T*k), `block_expert` (the expert of each BLOCK_M-row block, -1 past
   the used blocks) and `num_padded`. The buffers have the worst case size
   (T*k + min(E, T*k) * (BLOCK_M - 1), rounded to blocks) so the launch grid never changes.
3. `_moe_gemm_kernel` over (block, N tile): a program whose block lies past `num_padded` exits at
   once; otherwise it gathers its BLOCK_M rows, multiplies by its expert's weight tile and
   scatters rows back by pair index. gate_up computes the gate and up tiles together and stores
   silu(gate) * up [T*k, I]; down multiplies each row by its top-k weight [T*k, h].
4. `moe_combine`: per token, the sum of its k weighted rows (optionally + residual and RMSNorm,
   so the layer's add+norm costs no extra kernel).

Roofline of the experts (bf16, D distinct experts touched, ~ E * (1 - (1 - k/E)^T)):
bytes = D * 3 * h * I * 2 (each touched expert's weights once) + T*k*(h + 2*I + I + h)*2
(activations); FLOPs = 2 * T*k * 3 * h * I (plus the padding rows each block carries).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of the grouped GEMMs (block_m also sets the per-expert row padding)."""

    block_m: int = 16
    block_n: int = 64  # gate_up: output columns of the gate and of the up half per program
    block_n_down: int = 64  # down: output (hidden) columns per program
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


def default_config(tokens: int, experts: int, topk: int) -> MoEConfig:
    """Tiles by the mean rows per touched expert: decode-sized steps want small row blocks (less
    padding) and narrow N tiles (more programs to stream the few touched experts)."""
    pairs = tokens * topk
    rows = pairs / min(experts, pairs)
    if rows <= 16:
        return MoEConfig(16, 32, 64, 128, 4, 4)
    if rows <= 48:
        return MoEConfig(32, 64, 64, 64, 4, 4)
    return MoEConfig(64, 128, 128, 64, 8, 3)


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    """Most BLOCK_M-row blocks `pairs` pairs can need: each non-empty expert wastes < block_m."""
    return triton.cdiv(pairs + min(experts, pairs) * (block_m - 1), block_m)


# ---- routing: softmax + top-k -----------------------------------------------------------------
@triton.jit
def _route_topk_kernel(
    logits_ptr, ids_ptr, w_ptr, T, E, stride_l,
    TOPK: tl.constexpr, TOPK_P2: tl.constexpr, E_P2: tl.constexpr, BLOCK_T: tl.constexpr,
    RENORM: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    r_ok = rows < T
    rows_c = tl.minimum(rows, T - 1)  # out-of-range rows recompute the last one (not stored)
    cols = tl.arange(0, E_P2)
    lg = tl.load(
        logits_ptr + rows_c[:, None] * stride_l + cols[None, :],
        mask=(cols < E)[None, :],
        other=float("-inf"),
    ).to(tl.float32)
    top = tl.max(lg, axis=1)
    denom = tl.sum(tl.exp(lg - top[:, None]), axis=1)
    slots = tl.arange(0, TOPK_P2)
    ids = tl.zeros((BLOCK_T, TOPK_P2), dtype=tl.int32)
    ws = tl.zeros((BLOCK_T, TOPK_P2), dtype=tl.float32)
    work = lg
    for j in tl.static_range(TOPK):  # pick the largest logit k times (first index on ties)
        m = tl.max(work, axis=1)
        idx = tl.min(tl.where(work == m[:, None], cols[None, :], E_P2), axis=1)
        ids = tl.where(slots[None, :] == j, idx[:, None], ids)
        ws = tl.where(slots[None, :] == j, tl.exp(m - top)[:, None], ws)
        work = tl.where(cols[None, :] == idx[:, None], float("-inf"), work)
    if RENORM:  # noqa: SIM108 (constexpr branch)
        ws = ws / tl.sum(ws, axis=1)[:, None]
    else:
        ws = ws / denom[:, None]
    ok = r_ok[:, None] & (slots < TOPK)[None, :]
    out = rows[:, None] * TOPK + slots[None, :]
    tl.store(ids_ptr + out, ids, mask=ok)
    tl.store(w_ptr + out, ws, mask=ok)


def reference_route_topk(
    logits: torch.Tensor, topk: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] -> (ids int32[T, k] by falling logit, weights float32[T, k])."""
    lg = logits.float()
    vals, ids = torch.topk(lg, topk, dim=-1)
    if renormalize:
        w = torch.softmax(vals, dim=-1)
    else:
        w = torch.exp(vals - lg.max(-1, keepdim=True).values)
        w = w / torch.exp(lg - lg.max(-1, keepdim=True).values).sum(-1, keepdim=True)
    return ids.to(torch.int32), w


def route_topk(
    logits: torch.Tensor, topk: int, renormalize: bool = True, use_triton: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] (row-contiguous) -> (ids int32[T, k], weights float32[T, k]): softmax over
    E, the k most probable experts, their probabilities (renormalised to sum 1 over the k)."""
    if not (logits.is_cuda if use_triton is None else use_triton):
        return reference_route_topk(logits, topk, renormalize)
    t, e = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty((t, topk), dtype=torch.int32, device=logits.device)
    w = torch.empty((t, topk), dtype=torch.float32, device=logits.device)
    e_p2 = triton.next_power_of_2(e)
    block_t = max(1, min(16, 4096 // e_p2))
    _route_topk_kernel[(triton.cdiv(t, block_t),)](
        logits, ids, w, t, e, logits.stride(0),
        TOPK=topk, TOPK_P2=triton.next_power_of_2(topk), E_P2=e_p2, BLOCK_T=block_t,
        RENORM=renormalize, num_warps=4,
    )  # fmt: skip
    return ids, w


# ---- grouping: pairs sorted by expert, padded per expert to whole blocks ------------------------
@dataclass
class MoEAlignment:
    """Pairs (flat index t*k + j of token t's j-th expert) grouped by expert.

    sorted_ids: int32[blocks * block_m]  pair indices, each expert's run padded to whole blocks
                with the sentinel T*k;  block_expert: int32[blocks]  expert of each block, -1 past
    the used ones;  num_padded: int32[1]  rows in use (a multiple of block_m).
    """

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_padded: torch.Tensor
    block_m: int

    @property
    def blocks(self) -> int:
        return self.block_expert.shape[0]


@triton.jit
def _moe_align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, cursor_ptr, pairs, n_blocks, E,
    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr, CHUNK_B: tl.constexpr,
):  # fmt: skip
    ex = tl.arange(0, E_P2)
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, pairs, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + offs, mask=offs < pairs, other=0)
        counts += tl.histogram(e, E_P2)
    counts -= tl.where(ex == 0, tl.cdiv(pairs, CHUNK) * CHUNK - pairs, 0)  # masked lanes read 0
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    total = tl.sum(padded, axis=0)
    tl.store(cursor_ptr + ex, ends - padded, mask=ex < E)
    tl.store(num_padded_ptr, total)
    blk_end = ends // BLOCK_M  # one past each expert's last block
    for b0 in range(0, n_blocks, CHUNK_B):  # [CHUNK_B, E_P2] compares per step
        b = b0 + tl.arange(0, CHUNK_B)
        owner = tl.sum((blk_end[None, :] <= b[:, None]).to(tl.int32), axis=1)
        owner = tl.where(b * BLOCK_M < total, owner, -1)
        tl.store(block_expert_ptr + b, owner, mask=b < n_blocks)
    for r0 in range(0, n_blocks * BLOCK_M, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        tl.store(
            sorted_ptr + r, tl.zeros((CHUNK,), dtype=tl.int32) + pairs, mask=r < n_blocks * BLOCK_M
        )
    tl.debug_barrier()  # cursors and padding are written before any pair claims a slot
    for c0 in range(0, pairs, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        ok = offs < pairs
        e = tl.load(ids_ptr + offs, mask=ok, other=0)
        slot = tl.atomic_add(cursor_ptr + e, 1, mask=ok)
        tl.store(sorted_ptr + slot, offs, mask=ok)


def reference_moe_align(ids: torch.Tensor, experts: int, block_m: int) -> MoEAlignment:
    """The same grouping in torch (pairs in ascending order within each expert)."""
    pairs = ids.numel()
    flat = ids.reshape(-1).long()
    blocks = max_blocks(pairs, experts, block_m)
    sorted_ids = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=ids.device)
    block_expert = torch.full((blocks,), -1, dtype=torch.int32, device=ids.device)
    row = 0
    for e in range(experts):
        members = (flat == e).nonzero().flatten()
        if members.numel() == 0:
            continue
        sorted_ids[row : row + members.numel()] = members.to(torch.int32)
        n_blk = triton.cdiv(members.numel(), block_m)
        block_expert[row // block_m : row // block_m + n_blk] = e
        row += n_blk * block_m
    num_padded = torch.tensor([row], dtype=torch.int32, device=ids.device)
    return MoEAlignment(sorted_ids, block_expert, num_padded, block_m)


def moe_align(
    ids: torch.Tensor, experts: int, block_m: int, use_triton: bool | None = None
) -> MoEAlignment:
    """ids: int32[T, k] contiguous -> the pairs grouped by expert (one launch, no host sync).
    Order within an expert is arbitrary on the GPU (atomics); results do not depend on it."""
    if not (ids.is_cuda if use_triton is None else use_triton):
        return reference_moe_align(ids, experts, block_m)
    pairs = ids.numel()
    blocks = max_blocks(pairs, experts, block_m)
    dev = ids.device
    sorted_ids = torch.empty((blocks * block_m,), dtype=torch.int32, device=dev)
    block_expert = torch.empty((blocks,), dtype=torch.int32, device=dev)
    num_padded = torch.empty((1,), dtype=torch.int32, device=dev)
    cursor = torch.empty((experts,), dtype=torch.int32, device=dev)
    _moe_align_kernel[(1,)](
        ids, sorted_ids, block_expert, num_padded, cursor, pairs, blocks, experts,
        BLOCK_M=block_m, E_P2=triton.next_power_of_2(experts), CHUNK=1024, CHUNK_B=64,
        num_warps=8,
    )  # fmt: skip
    return MoEAlignment(sorted_ids, block_expert, num_padded, block_m)


# ---- grouped GEMM ---------------------------------------------------------------------------------
@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, topk_w_ptr,
    pairs, N, K, stride_am, stride_we, stride_wn, stride_cm,
    A_DIV: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return  # a padding block of the worst-case grid
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < pairs
    a_rows = (rows // A_DIV).to(tl.int64)  # gate_up reads token rows (pair // k), down pair rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_base = a_ptr + a_rows[:, None] * stride_am
    w_base = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < K
        a = tl.load(a_base + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        wmask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_base + k[None, :], mask=wmask, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc)
        if GATED:  # the up rows sit N rows below the gate rows of the same expert
            wu = tl.load(w_base + N * stride_wn + k[None, :], mask=wmask, other=0.0)
            acc_up = tl.dot(a, tl.trans(wu), acc_up)
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(topk_w_ptr + rows, mask=valid, other=0.0)[:, None]
    dst = c_ptr + rows[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(dst, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def _grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    align: MoEAlignment,
    topk_w: torch.Tensor,
    a_div: int,
    gated: bool,
    block_n: int,
    cfg: MoEConfig,
) -> None:
    n = w.shape[1] // 2 if gated else w.shape[1]
    k = w.shape[2]
    grid = (align.blocks, triton.cdiv(n, block_n))
    _moe_gemm_kernel[grid](
        a, w, out, align.sorted_ids, align.block_expert, align.num_padded, topk_w,
        topk_w.numel(), n, k, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_DIV=a_div, GATED=gated, WEIGHTED=not gated,
        BLOCK_M=cfg.block_m, BLOCK_N=block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def reference_expert_rows(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
) -> torch.Tensor:
    """Loop over experts in float32: row t*k + j = weight[t, j] * expert_j(x[t]). -> [T*k, h]."""
    t, k = topk_ids.shape
    f = w_down.shape[2]
    rows = torch.zeros((t * k, x.shape[1]), dtype=torch.float32, device=x.device)
    flat = topk_ids.reshape(-1).long()
    for e in range(w_gate_up.shape[0]):
        pair = (flat == e).nonzero().flatten()
        if pair.numel() == 0:
            continue
        gu = x[pair // k].float() @ w_gate_up[e].float().T
        act = torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]
        y = act @ w_down[e].float().T
        rows[pair] = y * topk_weights.reshape(-1)[pair, None].float()
    return rows


def moe_expert_rows(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    align: MoEAlignment | None = None,
    config: MoEConfig | None = None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """x: [T, h]; w_gate_up: [E, 2I, h] (gate rows first); w_down: [E, h, I]; topk_ids int32 and
    topk_weights float32 [T, k] -> weighted expert outputs [T*k, h] in x's dtype (row t*k + j
    is token t's j-th expert). Two launches (gate_up+SiLU, down+weight) after `moe_align`."""
    if not (x.is_cuda if use_triton is None else use_triton):
        return reference_expert_rows(x, w_gate_up, w_down, topk_ids, topk_weights).to(x.dtype)
    t, k = topk_ids.shape
    e, two_f, h = w_gate_up.shape
    if x.shape[1] != h or w_down.shape != (e, h, two_f // 2) or topk_weights.shape != (t, k):
        raise ValueError(
            f"shapes do not match: x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)}, "
            f"w_down {tuple(w_down.shape)}, topk {tuple(topk_ids.shape)}"
        )
    cfg = config or default_config(t, e, k)
    if align is None:
        align = moe_align(topk_ids, e, cfg.block_m, use_triton=True)
    elif align.block_m != cfg.block_m:
        raise ValueError(f"alignment block_m {align.block_m} != config block_m {cfg.block_m}")
    x = x.contiguous()
    act = torch.empty((t * k, two_f // 2), dtype=x.dtype, device=x.device)
    rows = torch.empty((t * k, h), dtype=x.dtype, device=x.device)
    tw = topk_weights.contiguous()
    _grouped_gemm(x, w_gate_up, act, align, tw, k, True, cfg.block_n, cfg)
    _grouped_gemm(act, w_down, rows, align, tw, 1, False, cfg.block_n_down, cfg)
    return rows


# ---- combine: sum of each token's k rows (+ residual add and RMSNorm) -----------------------------
@triton.jit
def _moe_combine_kernel(
    rows_ptr, res_ptr, w_ptr, out_ptr, H, eps, TOPK: tl.constexpr, NORM: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TOPK):
        acc += tl.load(rows_ptr + (t * TOPK + j) * H + cols, mask=m, other=0.0).to(tl.float32)
    if NORM:
        acc += tl.load(res_ptr + t * H + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(res_ptr + t * H + cols, acc.to(res_ptr.dtype.element_ty), mask=m)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        acc = acc * tl.rsqrt(tl.sum(acc * acc, axis=0) / H + eps) * w
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=m)


def reference_moe_combine(
    rows: torch.Tensor,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """rows: [T, k, h] -> sum over k; with residual and norm_weight, residual += sum (in place)
    and the result is rmsnorm(residual) * norm_weight."""
    s = rows.float().sum(1)
    if residual is None or norm_weight is None:
        return s.to(rows.dtype)
    s = s + residual.reshape(s.shape).float()
    residual.copy_(s.view(residual.shape).to(residual.dtype))
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    return y.to(rows.dtype)


def moe_combine(
    rows: torch.Tensor,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """rows: [T, k, h] contiguous -> [T, h]: the k rows summed; with residual [.., h] (T rows,
    updated in place) and norm_weight [h], rmsnorm(residual + sum) * norm_weight instead.
    Bytes: T*k*h*2 read (+ T*h*2 residual read and write) + T*h*2 written."""
    if not (rows.is_cuda if use_triton is None else use_triton):
        return reference_moe_combine(rows, residual, norm_weight, eps)
    t, k, h = rows.shape
    rows = rows.contiguous()
    out = torch.empty((t, h), dtype=rows.dtype, device=rows.device)
    norm = residual is not None and norm_weight is not None
    _moe_combine_kernel[(t,)](
        rows, residual if norm else out, norm_weight if norm else out, out, h, eps,
        TOPK=k, NORM=norm, BLOCK=triton.next_power_of_2(h), num_warps=8 if h >= 4096 else 4,
    )  # fmt: skip
    return out


def reference_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
) -> torch.Tensor:
    """The MoE FFN in float32 by a loop over experts: [T, h] float32."""
    t, k = topk_ids.shape
    return reference_expert_rows(x, w_gate_up, w_down, topk_ids, topk_weights).view(t, k, -1).sum(1)


def fused_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    config: MoEConfig | None = None,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """The routed experts' SwiGLU FFN: x [T, h] -> [T, h] (x's dtype). Four launches on the GPU:
    align, gate_up+SiLU, down+weight, combine; static shapes, no host sync (graph-safe)."""
    t, k = topk_ids.shape
    rows = moe_expert_rows(
        x, w_gate_up, w_down, topk_ids, topk_weights, config=config, use_triton=use_triton
    )
    return moe_combine(rows.view(t, k, -1), use_triton=use_triton)


# ---- inputs ---------------------------------------------------------------------------------------
@dataclass
class MoEInputs:
    """x: [T, h]; w_gate_up: [E, 2I, h]; w_down: [E, h, I]; logits: [T, E] (router output);
    topk_ids: int32[T, k]; topk_weights: float32[T, k]."""

    x: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    logits: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.x, self.w_gate_up, self.w_down, self.topk_ids, self.topk_weights


def make_moe_inputs(
    tokens: int,
    experts: int = 8,
    topk: int = 2,
    hidden: int = 64,
    inter: int = 32,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    live_experts: int | None = None,
) -> MoEInputs:
    """Seeded inputs; routing by softmax top-k over random logits. With `live_experts`, only
    that many (randomly chosen, >= topk) experts can be picked, so the rest get no tokens."""
    g = torch.Generator().manual_seed(seed)
    scale_gu, scale_d = hidden**-0.5, inter**-0.5
    x = torch.randn((tokens, hidden), generator=g)
    wgu = torch.randn((experts, 2 * inter, hidden), generator=g) * scale_gu
    wd = torch.randn((experts, hidden, inter), generator=g) * scale_d
    logits = torch.randn((tokens, experts), generator=g)
    if live_experts is not None:
        dead = torch.randperm(experts, generator=g)[max(live_experts, topk) :]
        logits[:, dead] = float("-inf")
    ids, w = reference_route_topk(logits, topk)
    dev = torch.device(device)
    return MoEInputs(
        x.to(dev, dtype),
        wgu.to(dev, dtype),
        wd.to(dev, dtype),
        logits.to(dev),
        ids.to(dev),
        w.to(dev),
    )
