"""GPU description the cost model prices against, and presets for common accelerators.

All rates are dense (no structured sparsity). Efficiencies are the achievable fractions of peak
that the cost model assumes until a calibration fitted from measurements replaces them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from spectune.specs.errors import SpecError
from spectune.specs.io import help_field, load_spec, preset

TFLOPS = 1e12  # FLOP/s in one TFLOP/s (decimal, as datasheets use)
TB_S = 1e12  # bytes/s in one TB/s
GB_S = 1e9
GB = 1e9
MB = 1e6
US = 1e-6


# Plausible range of every figure (from a small accelerator to far past any announced one): a
# value outside is a typo or a unit slip, and priced it would give 0 s or infinite times.
_RANGES: dict[str, tuple[float, float]] = {
    "peak_bf16_flops": (1e9, 1e18),
    "peak_fp8_flops": (1e9, 1e18),  # or 0: no fp8 units
    "peak_int8_ops": (1e9, 1e18),  # or 0: no int8 tensor cores
    "peak_fp4_flops": (1e9, 1e19),  # or 0: no fp4 units
    "hbm_bytes_per_s": (1e8, 1e15),
    "hbm_bytes": (1e6, 1e15),
    "sm_count": (1, 100_000),
    "l2_bytes": (1.0, 1e12),
    "interconnect_bytes_per_s": (1e6, 1e15),
    "launch_s": (1e-9, 1.0),
    "interconnect_latency_s": (1e-9, 1.0),
    "gemm_efficiency": (1e-3, 1.0),
    "hbm_efficiency": (1e-3, 1.0),
}


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (one device; tensor parallelism is a CostModel argument)."""

    name: str = help_field(help="short identifier, e.g. h100-sxm")
    peak_bf16_flops: float = help_field(help="dense bf16 tensor-core peak, FLOP/s")
    peak_fp8_flops: float = help_field(help="dense fp8 tensor-core peak, FLOP/s (0: no fp8 units)")
    hbm_bytes_per_s: float = help_field(help="peak device-memory bandwidth, bytes/s")
    hbm_bytes: float = help_field(help="device-memory capacity, bytes")
    sm_count: int = help_field(help="streaming multiprocessors (compute units on AMD)")
    l2_bytes: float = help_field(help="last-level on-chip cache, bytes")
    interconnect_bytes_per_s: float = help_field(
        help="per-device unidirectional GPU-to-GPU bandwidth (NVLink/xGMI/PCIe), bytes/s"
    )
    peak_int8_ops: float = help_field(
        0.0, help="dense int8 tensor-core peak, OP/s (0: no int8 units; W8A8-int8 runs weight-only)"
    )
    peak_fp4_flops: float = help_field(
        0.0,
        help="dense fp4 (NVFP4/MXFP4) tensor-core peak, FLOP/s (0: no fp4 units; fp4 "
        "checkpoints run weight-only, dequantized to bf16)",
    )
    launch_s: float = help_field(4.0 * US, help="fixed cost of one kernel launch inside a graph, s")
    interconnect_latency_s: float = help_field(8.0 * US, help="latency of one small all-reduce, s")
    gemm_efficiency: float = help_field(
        0.80,
        help="achievable fraction of peak FLOP/s for large GEMMs (default: public MAMF tables)",
    )
    hbm_efficiency: float = help_field(
        0.90, help="achievable fraction of peak HBM bandwidth for streaming reads"
    )
    source: str = help_field("user-provided", help="where these figures come from")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("name", "source"):
                if not isinstance(v, str) or (f.name == "name" and not v):
                    raise SpecError(f"field {f.name!r} must be a non-empty string")
                continue
            if f.name in ("peak_fp8_flops", "peak_int8_ops", "peak_fp4_flops") and v == 0:
                continue  # no such units
            lo, hi = _RANGES[f.name]
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
                raise SpecError(
                    f"field {f.name!r} must be in [{lo:g}, {hi:g}], got {v!r} ({f.metadata['help']})"
                )

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where bf16 compute and HBM times are equal (achievable rates)."""
        return (self.peak_bf16_flops * self.gemm_efficiency) / (
            self.hbm_bytes_per_s * self.hbm_efficiency
        )


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    hw.name: hw
    for hw in (
        HardwareSpec(
            name="a100-80g",
            peak_bf16_flops=312 * TFLOPS,
            peak_fp8_flops=0.0,
            peak_int8_ops=624 * TFLOPS,
            hbm_bytes_per_s=2.039 * TB_S,
            hbm_bytes=80 * GB,
            sm_count=108,
            l2_bytes=40 * MB,
            interconnect_bytes_per_s=300 * GB_S,  # NVLink 3: 600 GB/s bidirectional
            gemm_efficiency=267.9 / 312,  # MAMF A100 bf16 (Bekman, ml-engineering)
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); MAMF efficiency from "
            "Stas Bekman's ml-engineering compute/accelerator table",
        ),
        HardwareSpec(
            name="h100-sxm",
            peak_bf16_flops=989 * TFLOPS,
            peak_fp8_flops=1979 * TFLOPS,
            peak_int8_ops=1979 * TFLOPS,
            hbm_bytes_per_s=3.35 * TB_S,
            hbm_bytes=80 * GB,
            sm_count=132,
            l2_bytes=50 * MB,
            interconnect_bytes_per_s=450 * GB_S,  # NVLink 4: 900 GB/s bidirectional
            gemm_efficiency=792.1 / 989,  # MAMF H100 bf16 (Bekman, ml-engineering)
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5); MAMF efficiency from "
            "Stas Bekman's ml-engineering compute/accelerator table",
        ),
        HardwareSpec(
            name="h200",
            peak_bf16_flops=989 * TFLOPS,
            peak_fp8_flops=1979 * TFLOPS,
            peak_int8_ops=1979 * TFLOPS,
            hbm_bytes_per_s=4.8 * TB_S,
            hbm_bytes=141 * GB,
            sm_count=132,
            l2_bytes=50 * MB,
            interconnect_bytes_per_s=450 * GB_S,
            gemm_efficiency=792.1 / 989,  # same Hopper die as H100 SXM
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM); efficiency as H100 (same GH100 die)",
        ),
        # NVIDIA publishes B200 rates per 8-GPU HGX B200 board, "with sparsity": FP16/BF16 36
        # PFLOPS, FP8 72 PFLOPS, INT8 72 POPS, FP4 144 PFLOPS; one GPU's dense rate is that / 8
        # / 2. Memory: 1.4 TB HBM3e per board (180 GB per GPU), 8 TB/s per GPU; NVLink 5: 1.8 TB/s
        # per GPU (both directions) through NVLink Switch.
        HardwareSpec(
            name="b200",
            peak_bf16_flops=2250 * TFLOPS,  # 36 PFLOPS sparse / 8 GPUs / 2
            peak_fp8_flops=4500 * TFLOPS,  # 72 PFLOPS sparse / 8 / 2
            peak_int8_ops=4500 * TFLOPS,  # 72 POPS sparse / 8 / 2
            peak_fp4_flops=9000 * TFLOPS,  # 144 PFLOPS sparse / 8 / 2
            hbm_bytes_per_s=8.0 * TB_S,
            hbm_bytes=180 * GB,
            sm_count=148,  # 2 dies x 74 enabled SMs (Chips and Cheese, "Nvidia's B200")
            l2_bytes=126 * MB,  # both dies' L2 partitions (Chips and Cheese, "Nvidia's B200")
            interconnect_bytes_per_s=900 * GB_S,  # NVLink 5: 1.8 TB/s bidirectional
            gemm_efficiency=792.1 / 989,  # not measured on Blackwell here: Hopper's MAMF fraction
            source="NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx: per-board "
            "sparse Tensor Core rates, 1.4 TB HBM3e, 8 TB/s per GPU, NVLink 5 1.8 TB/s per GPU); "
            "SM count and L2 from Chips and Cheese, 'Nvidia's B200: Keeping the CUDA Juggernaut "
            "Rolling'; efficiency assumed equal to H100's MAMF fraction (no public B200 MAMF)",
        ),
        HardwareSpec(
            name="l40s",
            peak_bf16_flops=362.05 * TFLOPS,
            peak_fp8_flops=733 * TFLOPS,
            peak_int8_ops=733 * TFLOPS,
            hbm_bytes_per_s=0.864 * TB_S,
            hbm_bytes=48 * GB,
            sm_count=142,
            l2_bytes=96 * MB,
            interconnect_bytes_per_s=32 * GB_S,  # PCIe Gen4 x16, one direction
            interconnect_latency_s=15 * US,
            source="NVIDIA L40S datasheet (dense figures); PCIe Gen4 x16 link",
        ),
        HardwareSpec(
            name="mi300x",
            peak_bf16_flops=1307.4 * TFLOPS,
            peak_fp8_flops=2614.9 * TFLOPS,
            peak_int8_ops=2614.9 * TFLOPS,
            hbm_bytes_per_s=5.3 * TB_S,
            hbm_bytes=192 * GB,
            sm_count=304,  # compute units
            l2_bytes=256 * MB,  # AMD Infinity Cache (last level)
            interconnect_bytes_per_s=448 * GB_S,  # 7 xGMI links x 64 GB/s, one direction
            launch_s=6.0 * US,
            gemm_efficiency=0.60,  # public MI300X bf16 GEMM runs reach ~55-65% of peak
            source="AMD Instinct MI300X datasheet; CDNA3 white paper (Infinity Cache, xGMI)",
        ),
    )
}


def hardware_preset(name: str) -> HardwareSpec:
    """The preset called `name` (case-insensitive); unknown names list the closest presets."""
    return preset(HARDWARE_PRESETS, name, "GPU")


def load_hardware(name_or_path: str | os.PathLike[str]) -> HardwareSpec:
    """A preset name, or the path of a JSON/TOML file with HardwareSpec's fields."""
    return load_spec(HardwareSpec, name_or_path, HARDWARE_PRESETS, "GPU")
