"""The GPU's SM clock and power while a run is timed, sampled through NVML (nvidia-ml-py).

A GPU at its power limit lowers its clock: sustained speculative runs at large batches spend
15-24% of their time at the 700 W limit of an H100 or H200, where the SM clock falls from
1980 MHz to 1410-1600 MHz, while calibrate's short timings mostly run at full clock
(measurements/h100-newuser17, h200-newuser9: gpu-clocks.csv). A run record that carries the
clock its steps ran at says which timings to compare. Optional: without nvidia-ml-py, without a
driver, or with an NVML call failing, the sampler records nothing and the run is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
from types import TracebackType
from typing import Any

#: sampling period; an NVML clock or power query costs tens of microseconds of host time
PERIOD_S = 0.05
#: a sample at or above this share of the enforced power limit counts as at the limit
AT_LIMIT = 0.97
#: at most this many samples are kept per run (10 minutes at PERIOD_S); later ones are dropped
MAX_SAMPLES = 12_000


def _nvml_handle(device_index: int) -> tuple[Any, Any] | None:
    """(pynvml, handle) of the CUDA device `device_index`, or None where NVML is unavailable.
    NVML numbers every GPU of the host; CUDA numbers the visible ones, so the device is found
    by its UUID (by index only when CUDA_VISIBLE_DEVICES does not renumber)."""
    try:
        import pynvml  # nvidia-ml-py
        import torch

        pynvml.nvmlInit()
        uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)
        if uuid is not None:
            text = str(uuid)
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(
                text if text.startswith("GPU-") else f"GPU-{text}"
            )
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:  # no NVML here: record nothing
        return None
    return None


def summarize(
    clocks_mhz: list[float], powers_w: list[float], limit_w: float | None
) -> dict[str, float] | None:
    """A run record's "gpu_state" from its samples: the median and lowest SM clock (MHz), the
    median power (W), the enforced power limit (W) and the share of samples at it (power >=
    AT_LIMIT x limit); None without samples."""
    if not clocks_mhz:
        return None
    out = {
        "sm_clock_mhz": float(statistics.median(clocks_mhz)),
        "sm_clock_min_mhz": float(min(clocks_mhz)),
        "samples": len(clocks_mhz),
    }
    if powers_w:
        out["power_w"] = float(statistics.median(powers_w))
        if limit_w:
            out["power_limit_w"] = float(limit_w)
            out["at_power_limit"] = sum(p >= AT_LIMIT * limit_w for p in powers_w) / len(powers_w)
    return out


class GpuSampler:
    """Samples the SM clock and the power of one CUDA device every PERIOD_S in a thread while
    the `with` block runs; `state()` then summarizes them (None where NVML is unavailable, or
    for device_index None: a CPU session).

        with GpuSampler(0) as s:
            session.run_spec(...)
        record["gpu_state"] = s.state()
    """

    def __init__(self, device_index: int | None, period_s: float = PERIOD_S):
        self.period_s = period_s
        self.device_index = device_index
        self._clocks: list[float] = []
        self._powers: list[float] = []
        self._limit_w: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: tuple[Any, Any] | None = None

    def __enter__(self) -> GpuSampler:
        self._nvml = None if self.device_index is None else _nvml_handle(self.device_index)
        if self._nvml is not None:
            nvml, h = self._nvml
            try:
                self._limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
            except Exception:  # the share at the limit is then left out
                self._limit_w = None
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        assert self._nvml is not None
        nvml, h = self._nvml
        while not self._stop.is_set() and len(self._clocks) < MAX_SAMPLES:
            try:
                self._clocks.append(float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)))
                self._powers.append(nvml.nvmlDeviceGetPowerUsage(h) / 1e3)
            except Exception:  # a failing query ends the sampling
                return
            self._stop.wait(self.period_s)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._nvml is not None:  # balance __enter__'s nvmlInit (reference counted)
            with contextlib.suppress(Exception):
                self._nvml[0].nvmlShutdown()

    def state(self) -> dict[str, float] | None:
        n = min(len(self._clocks), len(self._powers))
        return summarize(self._clocks[:n], self._powers[:n], self._limit_w)
