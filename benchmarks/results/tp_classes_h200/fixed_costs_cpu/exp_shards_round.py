"""exp2: MODE folders...  MODE: S (shards, round 1), SR (shards, round 0.955), SF (shards, round fitted)"""

import dataclasses
import sys

import benchmarks.bench_refit as br
import spectune.validate.fit as fit

mode = sys.argv[1]
fit.FIT_ATTENTION_ROUND = 0.955 if mode == "SR" else 1.0
if mode == "SF":
    fit.PARAMS = (*fit.PARAMS, ("attention_round", 0.8, 1.0, 0.95))
    built = fit._calibration

    def calibration(x, hardware, base, params=fit.PARAMS, gemm_wall_s=None):
        names = [n for n, *_ in params]
        cal = built(x, hardware, base, params, gemm_wall_s)
        if "attention_round" in names:
            cal = dataclasses.replace(
                cal, attention_round_efficiency=float(x[names.index("attention_round")])
            )
        return cal

    fit._calibration = calibration
sys.exit(br.main(["--shards", *sys.argv[2:]]))
