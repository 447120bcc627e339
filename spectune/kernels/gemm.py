"""Weight GEMMs y[M, N] = x[M, K] @ W[N, K]^T that stay near the HBM floor at small M.

At decode-sized M a weight GEMM is a stream of N*K*2 bytes, but a library GEMM tiles only the
N axis: Llama-3.1-8B's q|k|v (N = 6144) and o (N = 4096) projections become 48 and 32 tiles on
a 132-SM GPU and stream at a third to a half of the bandwidth (measured on an H200: q|k|v at
M = 64 moved 2.1 TB/s of a 4.3 TB/s copy rate). Splitting K as well fills the GPU:
- `splitk`: a Triton kernel over (N blocks x S splits) writing float32 partials [S, M, N], then a
  reduce kernel to bf16 (bytes: N*K*2 of weights + 2*S*M*N*4 of partials);
- `cublas`: torch's linear (best once M is large enough for N tiles to fill the waves);
- `cublaslt`: torch's linear with cuBLASLt as the preferred BLAS library. At 16-48 rows the
  default library's heuristic splits K for some shapes and launches a reduce kernel after the
  GEMM; cuBLASLt's picks an unsplit kernel for some of them: on an H200 the tp 2 down
  projection shard (4096 x 7168) at M = 32 takes 17.9 us against 20.2 us
  (benchmarks/results/gemm_bucket_h200/isolated).
`GemmPlan` holds, per weight shape and M bucket, the fastest variant measured on this GPU
(`autotune`, a few seconds at session start); `linear` / `linear_gated` run the planned variant
(one plan per process: one GPU); without a plan (CPU, tests) torch's linear is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from spectune.kernels.elementwise import silu_mul
from spectune.kernels.timing import graph_time
from spectune.specs import SpecError
from spectune.specs.kernel_plan import parse_plan, plan_key


@triton.jit
def _splitk_kernel(
    x_ptr, w_ptr, p_ptr, M, N, K, k_per_split,
    stride_xm, stride_wn, stride_ps, stride_pm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DIRECT: tl.constexpr,
    GATED: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k0 = pid_s * k_per_split
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per_split, BLOCK_K):
        k = k0 + kk + offs_k
        xmask = (offs_m[:, None] < M) & (k[None, :] < K)
        w = tl.load(
            w_ptr + offs_n[:, None] * stride_wn + k[None, :],
            mask=(offs_n[:, None] < N) & (k[None, :] < K),
            other=0.0,
        )
        if GATED:  # x = silu(gate) * up, read from [gate | up] rows of width 2K (SwiGLU fused)
            g = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=xmask, other=0.0).to(
                tl.float32
            )
            u = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + K + k[None, :], mask=xmask, other=0.0
            ).to(tl.float32)
            x = (g / (1.0 + tl.exp(-g)) * u).to(w.dtype)
        else:
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=xmask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if DIRECT:
        tl.store(
            p_ptr + offs_m[:, None] * stride_pm + offs_n[None, :],
            acc.to(p_ptr.dtype.element_ty),
            mask=ok,
        )
    else:
        tl.store(
            p_ptr + pid_s * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :], acc, mask=ok
        )


def splitk_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    splits: int,
    block_n: int = 64,
    block_k: int = 128,
    warps: int = 4,
    stages: int = 4,
    gated: bool = False,
) -> torch.Tensor:
    """x: [M, K] (row-contiguous), w: [N, K] contiguous -> [M, N] in x's dtype. With `gated`,
    x is [M, 2K] = [gate | up] and the GEMM input is silu(gate) * up (never written out)."""
    m = x.shape[0]
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != (2 * k if gated else k) or x.stride(1) != 1:
        raise ValueError(
            f"x must be [M, {2 * k if gated else k}] with a contiguous last dim for w {tuple(w.shape)}"
        )
    if not w.is_contiguous():
        raise ValueError("w must be contiguous")
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    k_per = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_per)
    grid = (triton.cdiv(n, block_n), splits, triton.cdiv(m, block_m))
    if splits == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        _splitk_kernel[grid](
            x,
            w,
            out,
            m,
            n,
            k,
            k_per,
            x.stride(0),
            w.stride(0),
            0,
            out.stride(0),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            DIRECT=True,
            GATED=gated,
            num_warps=warps,
            num_stages=stages,
        )
        return out
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    _splitk_kernel[grid](
        x,
        w,
        part,
        m,
        n,
        k,
        k_per,
        x.stride(0),
        w.stride(0),
        part.stride(0),
        part.stride(1),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DIRECT=False,
        GATED=gated,
        num_warps=warps,
        num_stages=stages,
    )
    return part.sum(dim=0).to(x.dtype)


def parse_variant(v: str) -> dict[str, Any]:
    """'splitk4/128x128/8w3s' -> splitk_linear keyword arguments."""
    head, *rest = v.split("/")
    kw = {"splits": int(head[len("splitk") :])}
    if rest:
        bn, bk = rest[0].split("x")
        warps, stages = rest[1].rstrip("s").split("w")
        kw.update(block_n=int(bn), block_k=int(bk), warps=int(warps), stages=int(stages))
    return kw


def run_variant(v: str, x: torch.Tensor, w: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """Variant `v` of x [M, K] @ w[N, K]^T; with `gated`, x is [M, 2K] = [gate | up] and the
    input is silu(gate) * up (cuBLAS: silu_mul first; split-K: fused into the kernel)."""
    if v == "cublas":
        return torch.nn.functional.linear(silu_mul(x) if gated else x, w)
    if v == "cublaslt":
        return lt_linear(silu_mul(x) if gated else x, w)
    return splitk_linear(x, w, gated=gated, **parse_variant(v))


def lt_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """torch's linear with cuBLASLt as the preferred BLAS library for this one call (the
    preference is read when the call is issued, so a CUDA graph captures cuBLASLt's kernel);
    torch's linear off CUDA."""
    if not x.is_cuda:
        return torch.nn.functional.linear(x, w)
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return torch.nn.functional.linear(x, w)
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


def reference_linear(x: torch.Tensor, w: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """x @ w.T in float32 (gated: silu(gate) * up of x = [gate | up] first), in x's dtype."""
    if gated:
        g, u = x.float().chunk(2, dim=-1)
        x32 = torch.nn.functional.silu(g) * u
    else:
        x32 = x.float()
    return torch.nn.functional.linear(x32, w.float()).to(x.dtype)


def make_gemm_inputs(
    m: int,
    n: int,
    k: int,
    gated: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded (x [M, K] or [M, 2K] when gated, w [N, K]) at the scale of the executor's weights."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((m, 2 * k if gated else k), generator=gen, device=device).to(dtype)
    w = (torch.rand((n, k), generator=gen, device=device) * 0.04 - 0.02).to(dtype)
    return x, w


#: bytes of weight copies a timing loop cycles through, so that L2 (50-60 MB) never holds them
ROTATE_BYTES = 256 << 20


def rotating_weights(
    n: int, k: int, device: torch.device | str, total_bytes: int = ROTATE_BYTES
) -> list[torch.Tensor]:
    """Enough bf16 copies of a [N, K] weight (the executor's scale) to cycle `total_bytes`: a
    timing loop over them reads every weight from HBM, as a forward does."""
    copies = max(1, -(-total_bytes // (n * k * 2)))
    return [
        torch.empty((n, k), device=device, dtype=torch.bfloat16).uniform_(-0.02, 0.02)
        for _ in range(copies)
    ]


# split-K variants "splitk{S}" or "splitk{S}/{BLOCK_N}x{BLOCK_K}/{warps}w{stages}s"
_TILES = ("", "/128x128/8w3s", "/64x256/4w3s", "/32x128/4w5s")
VARIANTS = ("cublas", "cublaslt", *(f"splitk{s}{t}" for s in (1, 2, 4, 8) for t in _TILES))
M_BUCKETS = (1, 16, 32, 64, 128, 256)  # above the last bucket: cuBLAS
#: a bucket keeps the previous (smaller) bucket's variant unless another is faster by more
#: than this share: the autotune's times vary ~1-2% between runs, and a flip between two
#: near-tied variants changes the kernel a forward runs from one token count to the next. On
#: two H200s at tp 2 the gate|up shard ran Triton split-K at M = 1 (29.3 us a layer) and cuBLAS
#: at M = 2-16 (31.8 us), tied within 3% when timed alone (benchmarks/probe_gemm_buckets.py):
#: the forward stepped up by 113 us from one token to two (benchmarks/probe_tp_forward.py)
PLAN_TIE = 0.03
#: the least M bucket the autotune times "cublaslt" at. Timed alone it wins some shapes at every
#: bucket, but inside the tp 2 forward of Llama-3.1-8B it pays only from 32 rows: with it, the
#: forward at B32 x 1 took 0.9% less on an H200 pair and 1.1% less on an H100 pair, at B64 x 1
#: 0.2% / 1.0% and at B8 x 8 0.4% / 1.8% less, while the H100 pair's B1 and B8 x 1 forwards,
#: whose SwiGLU-fused down projection it took at buckets 1 and 16, took 1.4% and 1.0% more
#: (benchmarks/results/gemm_bucket_h200: host_c, h100_host)
LT_MIN_BUCKET = 32


def pick_variant(timed: dict[str, float], prev: str | None = None) -> str:
    """The variant a plan runs at one bucket from its timed variants (seconds): the fastest, or
    `prev` (the previous bucket's choice) where it is within PLAN_TIE of the fastest; cuBLAS
    when nothing was timed."""
    if not timed:
        return "cublas"
    best = min(timed, key=lambda v: timed[v])
    if prev is not None and prev in timed and timed[prev] <= (1 + PLAN_TIE) * timed[best]:
        return prev
    return best


class GemmPlan:
    """Chosen variant per (N, K, M bucket, gated); M above the largest bucket uses cuBLAS.
    Gated entries time the SwiGLU-fused down projection (silu(gate) * up as the input).
    Written form (to_dict / from_dict): spectune.specs.kernel_plan."""

    def __init__(self, choice: dict[tuple[int, int, int, bool], str] | None = None):
        self.choice = dict(choice or {})

    @classmethod
    def from_dict(cls, plan: object, where: str) -> GemmPlan:
        """The plan a document recorded ({"NxK@M[+silu]": variant}); a SpecError naming `where`
        and the entry that is malformed, or that names a bucket or variant this build lacks."""
        choice = parse_plan(plan, where)
        for (n, k, m, g), v in choice.items():
            if m not in M_BUCKETS:
                raise SpecError(
                    f"{where}: gemm_plan key {plan_key(n, k, m, g)!r}: bucket {m} is not one of "
                    f"this build's M buckets {M_BUCKETS}"
                )
            if v not in VARIANTS:
                raise SpecError(
                    f"{where}: gemm_plan[{plan_key(n, k, m, g)!r}] = {v!r} is not a variant of "
                    f"this build ({', '.join(VARIANTS)})"
                )
        return cls(choice)

    def variant(self, n: int, k: int, m: int, gated: bool = False) -> str:
        for bucket in M_BUCKETS:
            if m <= bucket:
                return self.choice.get((n, k, bucket, gated), "cublas")
        return "cublas"

    def to_dict(self) -> dict[str, str]:
        return {plan_key(n, k, m, g): v for (n, k, m, g), v in sorted(self.choice.items())}


_PLAN = GemmPlan()


def set_plan(plan: GemmPlan) -> None:
    """Install the plan every `linear` call consults (one per process: one GPU)."""
    global _PLAN
    _PLAN = plan


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [..., K] @ w[N, K]^T with the planned variant for this shape and M."""
    if not x.is_cuda:
        return torch.nn.functional.linear(x, w)
    k = x.shape[-1]
    m = x.numel() // k
    v = _PLAN.variant(w.shape[0], k, m)
    if v == "cublas":
        return torch.nn.functional.linear(x, w)
    xm = x.reshape(m, k)
    if xm.stride(1) != 1:
        xm = xm.contiguous()
    y = run_variant(v, xm, w)
    return y.view(*x.shape[:-1], w.shape[0])


def linear_gated(gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up @ w[N, K]^T for gate_up: [..., 2K] (SwiGLU's down projection); fused into
    the split-K kernel where the plan picks one, else silu_mul then `linear`."""
    k = w.shape[1]
    m = gate_up.numel() // (2 * k)
    v = _PLAN.variant(w.shape[0], k, m, gated=True)
    if not gate_up.is_cuda or v == "cublas":
        return linear(silu_mul(gate_up.reshape(m, 2 * k)), w).view(*gate_up.shape[:-1], w.shape[0])
    y = run_variant(v, gate_up.reshape(m, 2 * k), w, gated=True)
    return y.view(*gate_up.shape[:-1], w.shape[0])


def planned_seconds(plan: GemmPlan, rows: Iterable[dict[str, object]]) -> dict[str, float]:
    """{written key: seconds} of the variant `plan` runs at each entry, from the autotune's
    timing `rows`, for the entries whose planned variant was timed (a fixed plan's are not)."""
    timed = {
        (r["n"], r["k"], r["m"], r["gated"], r["variant"]): r["seconds"]
        for r in rows
        if "seconds" in r
    }
    out: dict[str, float] = {}
    for (n, k, m, g), v in plan.choice.items():
        t = timed.get((n, k, m, g, v))
        if isinstance(t, float):
            out[plan_key(n, k, m, g)] = t
    return out


def autotune(
    shapes: Iterable[tuple[int, int]],
    device: torch.device,
    buckets: Sequence[int] = M_BUCKETS,
    copies_bytes: int = ROTATE_BYTES,
    gated: Iterable[tuple[int, int]] = (),
    fixed: GemmPlan | None = None,
) -> tuple[GemmPlan, list[dict[str, object]]]:
    """Time every variant per weight shape (N, K) and M bucket ("cublaslt" from LT_MIN_BUCKET
    rows on), and for the `gated` shapes also the SwiGLU-fused form; weights rotate over enough
    copies that L2 never holds them. Each bucket runs pick_variant's choice (the fastest, or
    the previous bucket's within PLAN_TIE). Shapes that `fixed` covers at every bucket (a plan
    another process chose, e.g. the calibration's) keep its choices untimed. Returns the plan
    and the timing rows."""
    choice: dict[tuple[int, int, int, bool], str] = {}
    rows: list[dict[str, object]] = []
    jobs = [(n, k, False) for n, k in shapes] + [(n, k, True) for n, k in gated]
    if fixed is not None:  # a shape is kept when `fixed` has every bucket of it
        kept = {(n, k, g) for n, k, g in jobs if all((n, k, m, g) in fixed.choice for m in buckets)}
        choice.update(
            {(n, k, m, g): fixed.choice[(n, k, m, g)] for n, k, g in kept for m in buckets}
        )
        jobs = [j for j in jobs if j not in kept]
    for n, k, fused in jobs:
        ws = rotating_weights(n, k, device, copies_bytes)
        prev_m = 0
        for m in buckets:
            x = torch.empty(
                (m, 2 * k if fused else k), device=device, dtype=torch.bfloat16
            ).uniform_(-1, 1)
            timed: dict[str, float] = {}
            for v in VARIANTS:
                if v == "cublaslt" and m < LT_MIN_BUCKET:
                    continue

                def call(
                    x: torch.Tensor = x,
                    v: str = v,
                    ws: list[torch.Tensor] = ws,
                    fused: bool = fused,
                ) -> None:
                    for w in ws:
                        run_variant(v, x, w, fused)

                try:
                    t = graph_time(call, device) / len(ws)
                except Exception as e:  # a variant that fails to compile is skipped
                    rows.append(
                        {
                            "n": n,
                            "k": k,
                            "m": m,
                            "variant": v,
                            "gated": fused,
                            "error": repr(e)[:200],
                        }
                    )
                    continue
                rows.append(
                    {
                        "n": n,
                        "k": k,
                        "m": m,
                        "variant": v,
                        "gated": fused,
                        "seconds": t,
                        "gb_s": n * k * 2 / t / 1e9,
                    }
                )
                timed[v] = t
            prev = choice.get((n, k, prev_m, fused)) if prev_m else None
            choice[(n, k, m, fused)] = pick_variant(timed, prev)
            prev_m = m
    return GemmPlan(choice), rows
