"""The GEMM plan's written form: which kernel variant a process ran per weight shape and token
bucket, as documents record it ("gemm_plan") and `spectune execute --gemm-plan` reads it.

A plan maps "NxK@M" (a weight [N, K] at the M-token bucket) or "NxK@M+silu" (the SwiGLU-fused
down projection) to a variant: "cublas", or "splitk{S}" with an optional
"/{BLOCK_N}x{BLOCK_K}/{warps}w{stages}s" tile (spectune.kernels.gemm runs them). Torch-free:
the validators (spectune.validate.measure) and the kernels share it.
"""

from __future__ import annotations

import re

from spectune.specs.errors import SpecError

#: a plan holds at most this many entries (weight shapes x M buckets x plain / gated)
MAX_PLAN_ENTRIES = 4096
PLAN_KEY = re.compile(r"(\d{1,7})x(\d{1,7})@(\d{1,7})(\+silu)?")
PLAN_VARIANT = re.compile(r"cublas|splitk\d{1,3}(/\d{1,4}x\d{1,4}/\d{1,2}w\d{1,2}s)?")

#: (N, K, M bucket, gated): one entry's shape
PlanShape = tuple[int, int, int, bool]


def plan_key(n: int, k: int, m: int, gated: bool) -> str:
    """The written key of weight [n, k] at bucket m (gated: the SwiGLU-fused form)."""
    return f"{n}x{k}@{m}{'+silu' if gated else ''}"


def parse_plan(plan: object, where: str) -> dict[PlanShape, str]:
    """{(N, K, M bucket, gated): variant} of a written plan, or a SpecError naming `where` and
    the entry that is not "NxK@M[+silu]" -> variant (at most MAX_PLAN_ENTRIES entries)."""
    if not isinstance(plan, dict):
        raise SpecError(f"{where}: field 'gemm_plan' must be an object (shape@bucket -> variant)")
    if len(plan) > MAX_PLAN_ENTRIES:
        raise SpecError(
            f"{where}: field 'gemm_plan' has {len(plan)} entries, more than {MAX_PLAN_ENTRIES}"
        )
    out: dict[PlanShape, str] = {}
    for key, v in plan.items():
        m = PLAN_KEY.fullmatch(key) if isinstance(key, str) else None
        if m is None:
            raise SpecError(f"{where}: gemm_plan key {str(key)[:40]!r} is not NxK@M or NxK@M+silu")
        if not (isinstance(v, str) and PLAN_VARIANT.fullmatch(v)):
            raise SpecError(
                f"{where}: gemm_plan[{key!r}] = {str(v)[:40]!r} is not a GEMM variant "
                "(cublas, or splitk<S> with an optional /<N>x<K>/<W>w<S>s tile)"
            )
        dims = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if min(dims) < 1:
            raise SpecError(f"{where}: gemm_plan key {key!r} has a zero dimension")
        out[(*dims, m.group(4) is not None)] = v
    return out
