"""exp4: elementwise efficiency not capped at the copy ceiling. args: folders"""

import sys

import benchmarks.bench_refit as br
import spectune.validate.fit as fit
import spectune.validate.fit_bounds as fb

fit.FIT_ATTENTION_ROUND = 1.0
fb.CEILING_OF.pop("elementwise_bw_efficiency")
sys.exit(br.main(sys.argv[1:]))
