"""exp5: LAUNCH GFIX AFIX SHARDS folders : launch_s, gemm_fixed_s, attention_fixed_s held (us)."""

import dataclasses
import sys

import benchmarks.bench_refit as br
import spectune.validate.fit as fit

L, G, A = (float(v) for v in sys.argv[1:4])
fit.PARAMS = tuple(
    (n, L, L + 1e-3, L) if n == "launch_us" else (n, lo, hi, s) for n, lo, hi, s in fit.PARAMS
)
built = fit._calibration


def calibration(x, hardware, base, params=fit.PARAMS, gemm_wall_s=None):
    cal = built(x, hardware, base, params, gemm_wall_s)
    return dataclasses.replace(cal, gemm_fixed_s=G * 1e-6, attention_fixed_s=A * 1e-6)


fit._calibration = calibration
sys.exit(br.main((["--shards"] if sys.argv[4] == "1" else []) + sys.argv[5:]))
