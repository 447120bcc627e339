"""The written form of the kernel choices a process made on its GPU, as documents record them.

- "gemm_plan" (read back by `spectune execute --gemm-plan`): "NxK@M" (a weight [N, K] at the
  M-token bucket) or "NxK@M+silu" (the SwiGLU-fused down projection) -> a variant: "cublas",
  "cublaslt" (cuBLAS with cuBLASLt as the preferred library), or
  "splitk{S}" with an optional "/{BLOCK_N}x{BLOCK_K}/{warps}w{stages}s" tile
  (spectune.kernels.gemm runs them).
- "gemm_plan_seconds": "NxK@M[+silu]" -> the seconds the autotune timed the planned variant at
  (alone, over rotating weight copies: kernels.gemm.autotune), for the entries it timed.
- "attention_plan": "B{batch}xN{tree tokens}xC{context}" -> the tree-attention launch the
  tuner picked for that verify shape (kernels.tree_attention_plan.tune_tree_attention):
  "default" (the shape's default config) or "{BLOCK_M}x{BLOCK_N}/{warps}w{stages}s/s{splits}"
  with "/pdl" where it launches with programmatic dependent launch ("sauto": splits chosen
  by the launch).
Torch-free: the validators (spectune.validate.measure) and the kernels share it.
"""

from __future__ import annotations

import re

from spectune.specs.errors import SpecError

#: a plan holds at most this many entries (weight shapes x M buckets x plain / gated)
MAX_PLAN_ENTRIES = 4096
PLAN_KEY = re.compile(r"(\d{1,7})x(\d{1,7})@(\d{1,7})(\+silu)?")
PLAN_VARIANT = re.compile(r"cublas(lt)?|splitk\d{1,3}(/\d{1,4}x\d{1,4}/\d{1,2}w\d{1,2}s)?")

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
                "(cublas, cublaslt, or splitk<S> with an optional /<N>x<K>/<W>w<S>s tile)"
            )
        dims = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if min(dims) < 1:
            raise SpecError(f"{where}: gemm_plan key {key!r} has a zero dimension")
        out[(*dims, m.group(4) is not None)] = v
    return out


#: a timed GEMM of the plan takes more than 0 and at most this many seconds
MAX_GEMM_SECONDS = 1.0


def check_plan_seconds(seconds: object, plan: dict[str, str], where: str) -> None:
    """A SpecError naming `where` and the entry where "gemm_plan_seconds" is not an object of at
    most MAX_PLAN_ENTRIES entries, each a key of `plan` (the document's "gemm_plan") -> a
    number of seconds in (0, MAX_GEMM_SECONDS]."""
    if not isinstance(seconds, dict):
        raise SpecError(f"{where}: field 'gemm_plan_seconds' must be an object (key -> seconds)")
    if len(seconds) > MAX_PLAN_ENTRIES:
        raise SpecError(
            f"{where}: field 'gemm_plan_seconds' has {len(seconds)} entries, more than "
            f"{MAX_PLAN_ENTRIES}"
        )
    for key, t in seconds.items():
        if key not in plan:
            raise SpecError(
                f"{where}: gemm_plan_seconds key {str(key)[:40]!r} is not an entry of gemm_plan"
            )
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= MAX_GEMM_SECONDS:
            raise SpecError(
                f"{where}: gemm_plan_seconds[{key!r}] = {str(t)[:40]!r} is not a number of "
                f"seconds in (0, {MAX_GEMM_SECONDS:g}]"
            )


ATTENTION_KEY = re.compile(r"B(\d{1,6})xN(\d{1,6})xC(\d{1,8})")
ATTENTION_LAUNCH = re.compile(r"default|\d{1,4}x\d{1,4}/\d{1,2}w\d{1,2}s/s(\d{1,4}|auto)(/pdl)?")


def attention_key(batch: int, tokens: int, context: int) -> str:
    """The written key of a verify shape: batch x tree tokens x context."""
    return f"B{batch}xN{tokens}xC{context}"


def attention_launch(label: list[object]) -> str:
    """The written form of a tuner row's config label: ["default"], or [block_m, block_n,
    warps, stages, splits or None, pdl]."""
    if label == ["default"]:
        return "default"
    bm, bn, warps, stages, splits, pdl = label
    sp = "auto" if splits is None else splits
    return f"{bm}x{bn}/{warps}w{stages}s/s{sp}{'/pdl' if pdl else ''}"


def check_attention_plan(plan: object, where: str) -> None:
    """SpecError naming `where` and the entry unless `plan` is "B{b}xN{n}xC{c}" -> a launch
    (module docstring), at most MAX_PLAN_ENTRIES entries."""
    if not isinstance(plan, dict):
        raise SpecError(f"{where}: field 'attention_plan' must be an object (shape -> launch)")
    if len(plan) > MAX_PLAN_ENTRIES:
        raise SpecError(
            f"{where}: field 'attention_plan' has {len(plan)} entries, more than {MAX_PLAN_ENTRIES}"
        )
    for key, v in plan.items():
        if not (isinstance(key, str) and ATTENTION_KEY.fullmatch(key)):
            raise SpecError(f"{where}: attention_plan key {str(key)[:40]!r} is not B<b>xN<n>xC<c>")
        if not (isinstance(v, str) and ATTENTION_LAUNCH.fullmatch(v)):
            raise SpecError(
                f"{where}: attention_plan[{key!r}] = {str(v)[:40]!r} is not a tree-attention "
                "launch (default, or <BM>x<BN>/<W>w<S>s/s<splits|auto>[/pdl])"
            )
