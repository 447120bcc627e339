"""exp3: ROUND SHARDS(0/1) folders... : gemm_fixed_s and attention_fixed_s free (launch_s free already)."""

import dataclasses
import sys

import benchmarks.bench_refit as br
import spectune.validate.fit as fit

fit.FIT_ATTENTION_ROUND = float(sys.argv[1])
extra = (("gemm_fixed_us", 0.0, 10.0, 3.0), ("attn_fixed_us", 0.0, 20.0, 4.0))
fit.PARAMS = (*fit.PARAMS, *extra)
built = fit._calibration


def calibration(x, hardware, base, params=fit.PARAMS, gemm_wall_s=None):
    names = [n for n, *_ in params]
    cal = built(x, hardware, base, params, gemm_wall_s)
    if "gemm_fixed_us" in names:
        cal = dataclasses.replace(
            cal,
            gemm_fixed_s=float(x[names.index("gemm_fixed_us")]) * 1e-6,
            attention_fixed_s=float(x[names.index("attn_fixed_us")]) * 1e-6,
        )
    return cal


fit._calibration = calibration
sys.exit(br.main((["--shards"] if sys.argv[2] == "1" else []) + sys.argv[3:]))
