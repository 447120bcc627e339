"""The collective law per tensor-parallel degree, fitted from a sweep of collective timings.

One latency + bandwidth line does not fit NCCL's collectives across message sizes: NCCL picks
its protocol by size (LL for small messages: lowest latency, about half the link; LL128; Simple
for large ones: highest bandwidth, a larger fixed cost; NCCL src/graph/tuning.cc prices each
as latency + bytes / bandwidth and takes the cheapest it predicts), so measured time is a few
lines joined where the protocol changes. The measured switch need not sit where the lines
cross: on 2 H100s (benchmarks/results/tp_h100/sweep.json) an all-reduce takes 19 us at 1 MiB
and 32 us at 2 MiB, then 37 us at 4 MiB.

`fit_link_law` fits, for one (op, tp), K = 1..3 regimes, each a contiguous run of sweep sizes
with its own (latency, bus bandwidth), and keeps the K with the lowest BIC. Each regime is a
non-negative least-squares fit of the relative error; its bus bandwidth is bounded by the
link's published per-direction bandwidth (HardwareSpec.interconnect_bytes_per_s), so the law
can never claim a faster link than the GPU has. A regime starts at the geometric midpoint
between the last size of the regime before and its own first size, and its latency is raised
where needed so time never falls at a switch (the law is non-decreasing in message size).

The sweep's per-call seconds include the kernel's launch inside the graph; the cost model
counts that launch separately (Calibration.launch_s per kernel), so the law is fitted to
(measured - launch) and prices the collective without it.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import nnls

from spectune.specs.calibration import link_factor

MAX_REGIMES = 3  # NCCL's protocols: LL, LL128, Simple
MIN_POINTS = 3  # sizes per regime where there are several (a third keeps one from fitting noise)


def _segment(
    b: np.ndarray, t: np.ndarray, factor: float, link: float, launch: float
) -> tuple[float, float, float]:
    """(latency_s, bus_bytes_per_s, sum of squared relative errors) of one regime over sizes
    b [n] with measured seconds t [n]: minimise sum ((launch + lat + factor*b/bw) / t - 1)^2
    with lat >= 0 and bw <= link (1/bw = 1/link + u, u >= 0: a non-negative least squares)."""
    a = np.column_stack((1.0 / t, factor * b / t))
    y = 1.0 - (launch + factor * b / link) / t
    (lat, u), _ = nnls(a, y)
    bw = 1.0 / (1.0 / link + u)
    pred = launch + lat + factor * b / bw
    return float(lat), float(bw), float(np.sum((pred / t - 1.0) ** 2))


def fit_link_law(
    sizes: ArrayLike,
    seconds: ArrayLike,
    op: str,
    tp: int,
    link_bytes_per_s: float,
    launch_s: float,
) -> list[tuple[float, float, float, float]]:
    """Rows (tp, from_bytes, latency_s, bus_bytes_per_s) of the law of collective `op` on `tp`
    ranks (specs.calibration.link_law_time reads them) fitted to measured `seconds` per call
    at message `sizes` (bytes; all-gather: the gathered size), each including one launch of
    `launch_s`. Needs at least 2 sizes (one regime); a switch needs MIN_POINTS on each side."""
    order = np.argsort(np.asarray(sizes, dtype=np.float64))
    b = np.asarray(sizes, dtype=np.float64)[order]
    t = np.asarray(seconds, dtype=np.float64)[order]
    n = b.size
    factor = link_factor(op, tp)
    best: tuple[float, list[tuple[int, int, float, float]]] | None = None
    for k in range(1, MAX_REGIMES + 1):
        for cuts in itertools.combinations(range(MIN_POINTS, n - MIN_POINTS + 1), k - 1):
            edges = (0, *cuts, n)
            if k > 1 and any(e1 - e0 < MIN_POINTS for e0, e1 in itertools.pairwise(edges)):
                continue
            segs, sse = [], 0.0
            for e0, e1 in itertools.pairwise(edges):
                lat, bw, err = _segment(b[e0:e1], t[e0:e1], factor, link_bytes_per_s, launch_s)
                segs.append((e0, e1, lat, bw))
                sse += err
            # BIC of a Gaussian relative error: n log(SSE/n) + params log n, 3 per regime
            # (latency, bandwidth, where it starts) less the first regime's start
            bic = n * np.log(max(sse, 1e-30) / n) + (3 * k - 1) * np.log(n)
            if best is None or bic < best[0]:
                best = (float(bic), segs)
    if best is None:
        raise ValueError(f"fit_link_law needs at least 2 sizes, got {n}")
    rows: list[tuple[float, float, float, float]] = []
    for e0, _, lat, bw in best[1]:
        start = 0.0 if not rows else float(np.sqrt(b[e0 - 1] * b[e0]))
        if rows:  # no drop at the switch: raise this regime's latency to the last one's time
            _, _, lat0, bw0 = rows[-1]
            lat = max(lat, lat0 + factor * start * (1.0 / bw0 - 1.0 / bw))
        rows.append((float(tp), start, lat, bw))
    return rows
