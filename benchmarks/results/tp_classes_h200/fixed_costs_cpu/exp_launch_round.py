"""exp: ROUND LAUNCH SHARDS folders..."""

import sys

import benchmarks.bench_refit as br
import spectune.validate.fit as fit

rnd, launch, shards = float(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
fit.FIT_ATTENTION_ROUND = rnd
if launch != "fit":
    L = float(launch)
    fit.PARAMS = tuple(
        (n, L, L + 1e-3, L) if n == "launch_us" else (n, lo, hi, s) for n, lo, hi, s in fit.PARAMS
    )
args = (["--shards"] if shards else []) + sys.argv[4:]
sys.exit(br.main(args))
