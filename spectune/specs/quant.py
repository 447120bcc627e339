"""Weight formats of a quantized checkpoint: what each stores per weight and which units multiply.

Why this exists: a 4-bit weight-only checkpoint (AWQ, GPTQ) streams a quarter of bf16's bytes
but multiplies on the bf16 tensor cores after unpacking every weight in registers, so its GEMMs
leave the memory floor at a much smaller M (tokens) than a bf16 GEMM does; an fp8 or int8
checkpoint multiplies on 8-bit units at twice the bf16 rate. ModelSpec names the format of its
decoder linear layers (`weight_format`, `quant_group_size`); the cost model (planner.forward,
planner.operators) reads the facts below. Embeddings and the LM head stay at the spec's
`dtype_bytes` (AWQ, GPTQ and compressed-tensors checkpoints keep them in 16 bits).

Bytes per weight element of the linear layers, group size g (elements of K sharing one scale):

    ''          dtype_bytes (2: bf16, 1: fp8 on fp8 units where the GPU has them)
    fp8         1 + 4/g       fp8 e4m3, fp32 scale per block (g = 128: 128x128 block fp8,
                              DeepSeek-V3 / SGLang block-fp8 linear; g = 0: per channel)
    w8a8-int8   1 + 4/g       int8 weights, per-token int8 activations (SmoothQuant)
    w4a16       0.5 + 2/g     4-bit integers, one 16-bit scale per group (GPTQ symmetric; AWQ's
                              4-bit zero points add 0.5/g more, under 0.4% at g = 128, not counted)
    nvfp4       0.5 + 1/16    fp4 e2m1, one fp8 e4m3 scale per 16 (plus one fp32 per tensor)
    mxfp4       0.5 + 1/32    fp4 e2m1, one e8m0 scale per 32 (OCP microscaling)

Per-channel scales (g = 0) are N values per [K, N] matrix, 4/K or 2/K bytes per weight: below
0.1% for every preset, not counted.

Compute: fp8 runs on fp8 tensor cores (HardwareSpec.peak_fp8_flops), int8 on int8 units
(peak_int8_ops), nvfp4/mxfp4 on fp4 units (peak_fp4_flops) where the GPU has them; each first
quantizes its bf16 activations per token (one more kernel per GEMM). w4a16, and nvfp4/mxfp4 on a
GPU without fp4 units, are weight-only: bf16 MMAs fed by in-register dequantization (Marlin,
Machete; vLLM runs fp4 checkpoints on such GPUs with its Marlin FP4 kernel,
vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py "weight-only FP4
compression"), priced at Calibration.weight_only_flops_efficiency of the bf16 rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.specs.errors import SpecError

#: '' is a dense checkpoint priced at ModelSpec.dtype_bytes (bf16, or fp8 when 1 byte)
WEIGHT_FORMATS = ("", "fp8", "w8a8-int8", "w4a16", "nvfp4", "mxfp4")
#: largest group a format takes (a scale per 4096 elements is already per-channel in effect)
MAX_GROUP = 4096


@dataclass(frozen=True)
class FormatInfo:
    """What one weight format stores and which tensor cores multiply it."""

    name: str
    weight_bits: int  # bits of one stored weight element
    scale_bytes: float  # bytes of one group scale
    fixed_group: int  # group size the format fixes (0: chosen by the checkpoint)
    units: str  # 'bf16', 'fp8', 'int8' or 'fp4': the tensor cores of the native path
    help: str


FORMATS: dict[str, FormatInfo] = {
    f.name: f
    for f in (
        FormatInfo("fp8", 8, 4.0, 0, "fp8", "fp8 e4m3 weights and activations (W8A8-FP8)"),
        FormatInfo("w8a8-int8", 8, 4.0, 0, "int8", "int8 weights and per-token int8 activations"),
        FormatInfo("w4a16", 4, 2.0, 0, "bf16", "4-bit integer weights, 16-bit activations"),
        FormatInfo("nvfp4", 4, 1.0, 16, "fp4", "NVIDIA fp4 e2m1, fp8 scale per 16"),
        FormatInfo("mxfp4", 4, 1.0, 32, "fp4", "OCP MX fp4 e2m1, e8m0 scale per 32"),
    )
}


def check_format(weight_format: str, group: int, where: str = "model") -> None:
    """SpecError naming the field when `weight_format` or `quant_group_size` is not one the
    cost model prices."""
    if weight_format not in WEIGHT_FORMATS:
        raise SpecError(
            f"{where}: field 'weight_format' must be one of {WEIGHT_FORMATS}, got "
            f"{weight_format!r} ('' is a dense bf16/fp8 checkpoint priced at dtype_bytes)"
        )
    if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group <= MAX_GROUP:
        raise SpecError(
            f"{where}: field 'quant_group_size' must be an integer in 0..{MAX_GROUP} (0: one "
            f"scale per output channel), got {group!r}"
        )
    if not weight_format:
        if group:
            raise SpecError(
                f"{where}: field 'quant_group_size' ({group}) needs a quantized 'weight_format'"
            )
        return
    info = FORMATS[weight_format]
    if info.fixed_group and group not in (0, info.fixed_group):
        raise SpecError(
            f"{where}: {weight_format} fixes 'quant_group_size' at {info.fixed_group} "
            f"(0 also means {info.fixed_group}), got {group}"
        )
    if group and group & (group - 1):
        raise SpecError(
            f"{where}: field 'quant_group_size' must be a power of two (32, 64, 128, ...) or 0, "
            f"got {group}"
        )


def linear_weight_bytes(weight_format: str, group: int, dtype_bytes: float) -> float:
    """Bytes one linear-layer weight element occupies, its share of the group scale included
    (module docstring); a dense checkpoint ('') is `dtype_bytes`."""
    if not weight_format:
        return float(dtype_bytes)
    info = FORMATS[weight_format]
    g = group or info.fixed_group
    return info.weight_bits / 8 + (info.scale_bytes / g if g else 0.0)


def tensor_units(weight_format: str, *, fp8: bool, int8: bool, fp4: bool) -> str:
    """Tensor cores a format's GEMMs run on, given which the GPU has: 'fp8', 'int8', 'fp4',
    'bf16' (native 16-bit) or 'weight-only' (bf16 MMAs behind in-register dequantization).
    A format whose units the GPU lacks falls back: fp8 and int8 to weight-only 8-bit
    dequantization (Marlin's W8A16 path), fp4 to weight-only (Marlin FP4)."""
    if not weight_format:
        return "bf16"
    units = FORMATS[weight_format].units
    have = {"fp8": fp8, "int8": int8, "fp4": fp4, "bf16": False}
    return units if have[units] else "weight-only"
