"""Fitting workload presets from recorded traces (spectune.trace/v1), and checking the fit.

Why this exists: the built-in presets rest on published summary numbers; a trace records what a
real drafter proposed and what the real target chose, node by node. From the steps of a trace
this module fits the three acceptance profiles a Workload carries:

- positional: accept_by_rank[d][r] = P(rank-r model child at depth d+1 is the target's token |
  its parent is on the accepted path), counted over parents on the replayed accepted path of
  each step's whole pool that the drafter expanded (conditioning on the accepted path matters:
  off-path nodes behave differently);
- confidence (EAGLE-2): mean top-1 draft probability per depth, its Beta concentration (method
  of moments), the geometric tail of the lower ranks, and a calibration curve (hit rate per
  draft-probability bin, kept monotone and at or below the diagonal as the Workload requires);
  then one scale on the calibration, fitted by bisection so that the training steps' replayed
  mean accepted length of the reference policy is reproduced;
- retrieval: rho[m-1][j-1] = P(the j-th token of a retrieved chain is the target's token | the
  previous was), for suffix matches of length m, and P(the root gets a chain of match length m).

The fitted Workload records the pair it came from (`target` = the trace header's model,
`drafter` = its drafter, `dataset` = its prompt set): applying it to another pair raises a
PairWarning (specs.workload.workload_for_pair).

`replayed_tokens` measures the exact mean tokens per step of a policy on recorded steps (trees
built from each step's pool by planner.trees, replayed against the recorded targets);
`predicted_tokens` is what the fitted acceptance model predicts for the same policy.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from spectune.specs.errors import SpecError
from spectune.specs.policy import TreePolicy
from spectune.specs.trace import TraceHeader, TraceStep, read_trace
from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL
from spectune.specs.workload import Workload

#: the policies whose mean replayed tokens/step the calibration scale is fitted to: EAGLE-2
#: style dynamic top-k at the deepest/widest recorded bounds, at these verify budgets
REFERENCE_BUDGETS = (8, 16, 32, 64)
REFERENCE_BUDGET = 32


@dataclass(frozen=True)
class LoadedTraces:
    headers: list[TraceHeader]
    steps: list[TraceStep]
    paths: tuple[str, ...] = ()

    @property
    def max_depth(self) -> int:
        return min(h.max_depth for h in self.headers)

    @property
    def max_topk(self) -> int:
        return min(h.max_topk for h in self.headers)

    def requests(self) -> list[str]:
        return sorted({s.request for s in self.steps})


def load_traces(paths: Iterable[str | os.PathLike[str]]) -> LoadedTraces:
    """Every step of every trace file (request ids prefixed by nothing: they must be unique)."""
    headers, steps, names = [], [], []
    for p in paths:
        names.append(os.fspath(p))
        h, s = read_trace(p)
        headers.append(h)
        steps.extend(s)
    if not steps:
        raise SpecError(f"{', '.join(names)}: the traces hold no steps (only a header)")
    temps = {h.temperature for h in headers}
    if len(temps) > 1:
        raise SpecError(f"traces mix temperatures {sorted(temps)}; fit one temperature at a time")
    return LoadedTraces(headers, steps, tuple(names))


def split_requests(
    steps: Sequence[TraceStep], holdout_every: int, offset: int = 1
) -> tuple[list[TraceStep], list[TraceStep]]:
    """(train, held_out): requests sorted by id; every `holdout_every`-th (from `offset`) is
    held out. holdout_every <= 1 holds out nothing."""
    reqs = sorted({s.request for s in steps})
    if holdout_every <= 1:
        return list(steps), []
    held = {r for i, r in enumerate(reqs) if i % holdout_every == offset % holdout_every}
    return [s for s in steps if s.request not in held], [s for s in steps if s.request in held]


# ---- per-step views ------------------------------------------------------------------------------
def _on_path_children(step: TraceStep) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """For each node on the pool's accepted path that has model children: (level of the
    children, draft probabilities float64[K] sorted decreasing, hits float64[K])."""
    pool = step.pool
    out = []
    path = step.accepted_path()
    model = pool.source == SOURCE_MODEL
    par = pool.parents
    conf_all = np.exp(pool.logprobs)
    for node in path.tolist():
        kids = np.flatnonzero((par == node) & model)
        if kids.size == 0:
            continue
        order = kids[np.argsort(-conf_all[kids], kind="stable")]
        hit = (pool.tokens[order] == step.target[node]).astype(np.float64)
        out.append((int(pool.depth[node]) + 1, conf_all[order], hit))
    return out


def _chain_position(step: TraceStep) -> np.ndarray:
    """int32[P]: for a retrieval node, its position j >= 1 in its chain (consecutive retrieval
    ancestors + 1); 0 for other nodes."""
    pool = step.pool
    pos = np.zeros(pool.num_nodes, dtype=np.int32)
    for i in range(1, pool.num_nodes):
        if pool.source[i] == SOURCE_RETRIEVAL:
            p = int(pool.parents[i])
            pos[i] = pos[p] + 1 if pool.source[p] == SOURCE_RETRIEVAL else 1
    return pos


# ---- profiles --------------------------------------------------------------------------------
def fit_positional(steps: Sequence[TraceStep], depth: int, width: int) -> np.ndarray:
    """float64[depth, width]: P(rank-r model child at depth d+1 accepted | parent accepted)."""
    hits = np.zeros((depth, width))
    count = np.zeros(depth)
    for st in steps:
        for level, _conf, hit in _on_path_children(st):
            if level > depth:
                continue
            n = min(width, hit.size)
            hits[level - 1, :n] += hit[:n]
            count[level - 1] += 1
    table = hits / np.maximum(count, 1)[:, None]
    # levels never reached on an accepted path: repeat the last observed row
    seen = np.flatnonzero(count > 0)
    if seen.size == 0:
        raise SpecError("no accepted-path node with model children: cannot fit positional rates")
    for d in range(depth):
        if count[d] == 0:
            table[d] = table[seen[seen < d].max() if (seen < d).any() else seen.min()]
    return table


@dataclass(frozen=True)
class ConfidenceFit:
    mean_top1: tuple[float, ...]
    concentration: float
    tail: float
    calibration_x: tuple[float, ...]
    calibration_y: tuple[float, ...]


def fit_confidence(
    steps: Sequence[TraceStep], depth: int, width: int, bins: int = 10
) -> ConfidenceFit:
    """Draft-confidence statistics of the children of accepted-path nodes, and calibration."""
    top1: list[list[float]] = [[] for _ in range(depth)]
    tails_num = tails_den = 0.0
    confs, hits = [], []
    for st in steps:
        for level, conf, hit in _on_path_children(st):
            if level > depth:
                continue
            top1[level - 1].append(float(conf[0]))
            c = conf[:width]
            if c.size > 2:
                tails_num += float(c[2:].sum())
                tails_den += float(c[1:-1].sum())
            confs.append(c)
            hits.append(hit[:width])
    if not confs:
        raise SpecError("no accepted-path node with model children: cannot fit confidence")
    last = 0.5
    means = []
    for vals in top1:
        last = float(np.mean(vals)) if vals else last
        means.append(float(np.clip(last, 1e-3, 0.999)))
    flat_top1 = np.concatenate([np.asarray(v) for v in top1 if v])
    m, var = float(flat_top1.mean()), float(flat_top1.var())
    conc = float(np.clip(m * (1 - m) / max(var, 1e-9) - 1.0, 0.5, 100.0))
    tail = float(np.clip(tails_num / max(tails_den, 1e-12), 0.0, 0.95))
    x_all, y_all = np.concatenate(confs), np.concatenate(hits)
    xs, ys = calibration_curve(x_all, y_all, bins)
    return ConfidenceFit(tuple(means), conc, tail, xs, ys)


def calibration_curve(
    conf: np.ndarray, hit: np.ndarray, bins: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Knots (x from 0 to 1, y <= x, y non-decreasing): the hit rate per equal-count bin of
    draft probability; past the last bin the curve keeps the last bin's ratio y/x."""
    order = np.argsort(conf, kind="stable")
    conf, hit = conf[order], hit[order]
    edges = np.linspace(0, conf.size, bins + 1).astype(int)
    xs, ys = [0.0], [0.0]
    for lo, hi in itertools.pairwise(edges):
        if hi - lo < 5:
            continue
        x = float(conf[lo:hi].mean())
        if x <= xs[-1] + 1e-6 or x >= 1.0 - 1e-6:
            continue
        xs.append(x)
        ys.append(float(min(hit[lo:hi].mean(), x)))
    ratio = ys[-1] / xs[-1] if len(xs) > 1 else 1.0
    xs.append(1.0)
    ys.append(float(min(1.0, ratio)))
    y = np.minimum(np.maximum.accumulate(np.asarray(ys)), np.asarray(xs))
    return tuple(xs), tuple(float(v) for v in y)


def fit_retrieval(
    steps: Sequence[TraceStep], max_match: int, chain_len: int
) -> tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]:
    """(rho rows by match length, match-length probabilities at the root)."""
    hits = np.zeros((max_match, chain_len))
    trials = np.zeros((max_match, chain_len))
    root_match = np.zeros(max_match + 1)
    for st in steps:
        pool = st.pool
        retr = np.flatnonzero(pool.source == SOURCE_RETRIEVAL)
        at_root = retr[pool.parents[retr] == 0]
        m_root = int(st.match_len[at_root].max()) if at_root.size else 0
        root_match[min(m_root, max_match)] += 1
        if retr.size == 0:
            continue
        on_path = np.zeros(pool.num_nodes, dtype=bool)
        on_path[st.accepted_path()] = True
        pos = _chain_position(st)
        for i in retr.tolist():
            p = int(pool.parents[i])
            if not on_path[p]:
                continue
            m = min(int(st.match_len[i]), max_match)
            j = min(int(pos[i]), chain_len)
            if m < 1:
                continue
            trials[m - 1, j - 1] += 1
            hits[m - 1, j - 1] += float(pool.tokens[i] == st.target[p])
    rho = np.where(trials > 0, hits / np.maximum(trials, 1), np.nan)
    for m in range(max_match):  # unseen cells: the previous position, else the shorter match
        for j in range(chain_len):
            if np.isnan(rho[m, j]):
                prev = rho[m, j - 1] if j > 0 else np.nan
                rho[m, j] = prev if not np.isnan(prev) else (rho[m - 1, j] if m > 0 else 0.0)
    probs = root_match[1:] / max(root_match.sum(), 1)
    rows = tuple(tuple(float(np.clip(v, 0, 1)) for v in r) for r in np.nan_to_num(rho))
    return rows, tuple(float(v) for v in probs)


# ---- measuring and predicting ------------------------------------------------------------------
def reference_policy(depth: int, topk: int, budget: int = REFERENCE_BUDGET) -> TreePolicy:
    return TreePolicy("dynamic-topk", depth=depth, topk=topk, budget=budget)


def replayed_tokens(
    policy: TreePolicy,
    steps: Sequence[TraceStep],
    build: Callable[[TreePolicy, TraceStep], np.ndarray] | None = None,
) -> float:
    """Exact mean tokens per step (accepted + 1) of `policy` on recorded steps: the tree the
    builder takes from each step's pool, replayed against the step's targets. `build` may
    replace the builder with any pool -> keep-mask function."""
    from spectune.planner.acceptance import ReplayStep, TraceReplay
    from spectune.planner.trees import build_tree
    from spectune.specs.trace import replay_path

    if not steps:
        raise SpecError("no steps to replay")
    parent = TraceReplay(steps)
    rng = np.random.default_rng(0)
    total = 0
    for st in steps:
        if build is None:
            tree = build_tree(policy, ReplayStep(st, parent), rng)
            total += round(ReplayStep(st, parent).expected_tokens(tree))
        else:
            keep = build(policy, st)
            total += len(replay_path(st.pool.subtree(keep), st.target[keep]))
    return total / len(steps)


def predicted_tokens(policy: TreePolicy, workload: Workload, samples: int = 4000) -> float:
    """The fitted acceptance model's expected tokens per step for `policy`."""
    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import expected_tokens_for_policy

    return expected_tokens_for_policy(policy, acceptance_model(workload), samples=samples, seed=0)


def _scale_calibration(xs: tuple[float, ...], ys: tuple[float, ...], s: float) -> tuple[float, ...]:
    y = np.minimum(np.asarray(ys) * s, np.asarray(xs))
    y = np.minimum(np.maximum.accumulate(y), np.asarray(xs))
    return tuple(float(v) for v in y)


def fit_workload(
    traces: LoadedTraces,
    name: str,
    *,
    acceptance: str = "confidence",
    width: int | None = None,
    source: str = "",
    calibrate_to_replay: bool = True,
) -> Workload:
    """A Workload fitted from the traces' steps (see the module docstring)."""
    depth, topk = traces.max_depth, traces.max_topk
    width = width or topk
    steps = traces.steps
    table = fit_positional(steps, depth, width)
    rows = []
    for r in table:
        s = float(r.sum())
        rows.append(tuple(float(v) for v in (r / s if s > 1 else r)))
    conf = fit_confidence(steps, depth, width)
    match_max = max(1, max((int(s.match_len.max()) for s in steps), default=1))
    retr_rows, retr_probs = fit_retrieval(steps, match_max, 6)
    h = traces.headers[0]
    pairs = {(x.model, x.drafter) for x in traces.headers}
    if len(pairs) > 1:
        raise SpecError(
            f"traces mix (model, drafter) pairs {sorted(pairs)}; fit one pair at a time (the "
            "workload records the pair its acceptance belongs to)"
        )
    sets = {x.prompt_set for x in traces.headers}
    first: dict[str, TraceStep] = {}
    for st in steps:
        if st.request not in first or st.step < first[st.request].step:
            first[st.request] = st
    prompt_mean = float(np.mean([st.context_len + 1 for st in first.values()]))
    files = f" ({', '.join(traces.paths)})" if traces.paths else ""
    wl = Workload(
        name=name,
        acceptance=acceptance,
        temperature=h.temperature,
        accept_by_rank=tuple(rows),
        depth_decay=1.0,
        confidence_mean=conf.mean_top1,
        confidence_concentration=conf.concentration,
        confidence_tail=conf.tail,
        calibration_x=conf.calibration_x,
        calibration_y=conf.calibration_y,
        retrieval_accept=retr_rows,
        retrieval_match_probs=retr_probs,
        source=source
        or (
            f"traces: model {h.model}, drafter {h.drafter}, prompts "
            f"{', '.join(sorted({x.prompt_set for x in traces.headers}))}; "
            f"{len(traces.requests())} requests, {len(steps)} steps{files}; prompt length = "
            "mean recorded prompt (chat template included); output length left at the default "
            "(recordings stop after a fixed number of tokens)"
        ),
        prompt_len_mean_tokens=prompt_mean,
        dataset=sets.pop() if len(sets) == 1 else "",
        drafter=h.drafter,
        target=h.model,
        fitted="",
    )
    scale_note = ""
    if calibrate_to_replay and acceptance == "confidence":
        pols = [reference_policy(depth, topk, b) for b in REFERENCE_BUDGETS]
        target = float(np.mean([replayed_tokens(p, steps) for p in pols]))

        def f(s: float) -> float:
            cand = dataclasses.replace(
                wl, calibration_y=_scale_calibration(wl.calibration_x, conf.calibration_y, s)
            )
            return float(np.mean([predicted_tokens(p, cand, samples=2000) for p in pols]))

        lo, hi = 0.05, 4.0
        flo, fhi = f(lo), f(hi)
        if flo <= target <= fhi:
            for _ in range(12):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
                if hi - lo < 5e-3:
                    break
            s = 0.5 * (lo + hi)
        else:
            s = lo if target < flo else hi
        wl = dataclasses.replace(
            wl, calibration_y=_scale_calibration(wl.calibration_x, conf.calibration_y, s)
        )
        scale_note = (
            f"; calibration y scaled by {s:.3f} (bisection) so that dynamic-topk depth {depth} "
            f"top-k {topk} at budgets {list(REFERENCE_BUDGETS)} predicts the fitting steps' "
            f"replayed mean {target:.3f} tokens/step"
        )
    return dataclasses.replace(
        wl,
        fitted=(
            "spectune.traces.fit.fit_workload: positional = rank hit rates of the model "
            f"children of accepted-path nodes (depth <= {depth}, ranks < {width}); confidence = "
            "mean top-1 draft probability per depth, Beta concentration by moments, tail = "
            "ratio of successive lower-rank probabilities, calibration = hit rate per "
            f"equal-count draft-probability bin (<= diagonal){scale_note}; retrieval = chain "
            "hit rates by (match length, position) under accepted-path parents, match-length "
            "probabilities of the root's retrieval children"
        ),
    )


def workload_to_dict(wl: Workload) -> dict[str, object]:
    """The Workload as the JSON object specs.workload reads (tuples as lists)."""

    def conv(v: object) -> object:
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v

    return {f.name: conv(getattr(wl, f.name)) for f in dataclasses.fields(wl)}


@dataclass(frozen=True)
class HeldOutCheck:
    """Cross-validated prediction: each request's steps are predicted by a fit without them."""

    budget: int
    predicted: float  # step-weighted mean over folds of the fold model's prediction
    replayed: float  # exact replayed mean over all steps
    folds: int

    @property
    def error(self) -> float:
        return self.predicted / self.replayed - 1.0


def cross_validate(
    traces: LoadedTraces,
    folds: int,
    budgets: Sequence[int] = REFERENCE_BUDGETS,
    acceptance: str = "confidence",
    progress: Callable[[int, int], None] | None = None,
) -> list[HeldOutCheck]:
    """k-fold cross-validation over requests (fold f holds out requests i with i % k == f):
    every prediction is made by a workload fitted on the other folds' requests only.
    `progress(done, folds)` after each fold."""
    depth, topk = traces.max_depth, traces.max_topk
    pols = [reference_policy(depth, topk, b) for b in budgets]
    pred = np.zeros(len(pols))
    rep = np.zeros(len(pols))
    total = 0
    for f in range(folds):
        train, held = split_requests(traces.steps, folds, offset=f)
        if not held or not train:
            continue
        wl = fit_workload(LoadedTraces(traces.headers, train), "cv", acceptance=acceptance)
        for i, p in enumerate(pols):
            pred[i] += predicted_tokens(p, wl) * len(held)
            rep[i] += replayed_tokens(p, held) * len(held)
        total += len(held)
        if progress is not None:
            progress(f + 1, folds)
    if total == 0:
        raise SpecError("cross-validation needs at least two requests")
    return [
        HeldOutCheck(b, float(pred[i] / total), float(rep[i] / total), folds)
        for i, b in enumerate(budgets)
    ]
