"""Acceptance under each verification rule at temperature > 0, by simulation from the draft and
target distributions an acceptance model implies.

The other acceptance models give P(child accepted | parent accepted) for the target-only walk
(the 'token' rule with deterministic top-k drafts, where a child with token x is accepted with
the target's probability p(x)): that closed form stays exact and is what trees.build uses for
'token' and 'traversal' trees of the top-k builders (with one-hot draft rows Traversal
Verification accepts each root path with the walk's probability). Greedy at T > 0 and i.i.d.
sampled drafts (the delayed builder) under every rule depend on the whole distributions, so
they are estimated here by simulation.

Distributions (`draw_distributions`), per node of a tree, over V = W + TAIL_TOKENS local tokens
(W rank slots for the drafter's top-W tokens, then a tail that holds the rest of the mass):
  q  the drafter's distribution after the node: the model's draft probabilities of the ranked
     tokens (a candidate bank row, or the tree's own child log-probs), the rest spread evenly
     over the tail;
  p  the target's distribution after the node: Dirichlet(TARGET_CONCENTRATION * a), where a
     holds the model's acceptances of the ranked tokens and the rest evenly over the tail. So
     E[p(x)] equals the model's acceptance of x, and the walk's expected tokens under these
     distributions are the closed form's; the concentration sets how far one context's target
     strays from that mean (Var p(x) = a(1-a)/(kappa+1)). It is an assumption, not a fit:
     benchmarks/bench_verify_rules.py shows the rules at two values.
Top-k trees take the ranked tokens as drafted (a child's draft row is one-hot at its token);
i.i.d. trees draw each child's token from its parent's q.

Rules (`simulate_rule`), each vectorised over S independent worlds of one tree shape:
  token      top-down recursive rejection: at the current node with residual r (the target
             row at first), try the children in index order: accept child x with
             min(1, r(x) / q_c(x)), else r <- norm(max(r - q_c, 0)); no child accepted: the
             bonus is drawn from r (SpecInfer multi-draft; EAGLE's rule when q_c is one-hot).
  traversal  bottom-up in depth-first order (Weng et al. 2025): entering child c of b sets its
             sequence weight w_c = min(1, T_b(x_c) / q_c(x_c)) and T_c = w_c * p_c; leaving c
             (its subtree rejected, or a leaf) accepts the path to c with probability mass(T_c),
             the bonus drawn from T_c; else T_b <- max(T_b - q_c, 0) / (1 - mass(T_b) + mass of
             that residual). On a chain this is block verification (Sun et al. 2024).
  spectr     SpecTr's k-sequential rule (Sun et al. 2023) at each node with its k i.i.d.
             children: rho >= 1 the least with rho * beta >= 1 - (1 - beta)^k,
             beta = sum min(q, p / rho); accept child x with min(1, p(x) / (rho q(x))) in order;
             else the bonus from max(p - min(q, p / rho) (1 - (1-beta)^k) / beta, 0), normalised.
  greedy     the target's argmax walk (lossy above temperature 0).
Every rule but greedy preserves the target distribution (tests/test_verify_rules.py checks the
output frequencies); the Triton kernels in spectune.kernels.verify implement the same steps.

Cost: S * N * V float64 per array (bounded by SIM_CELLS), O(N) vectorised steps per rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectune.planner.acceptance.base import AcceptanceModel, children_table
from spectune.specs.errors import SpecError
from spectune.specs.tree import VERIFY_RULES, DraftTree

TARGET_CONCENTRATION = 4.0
"""kappa of the target's Dirichlet around the model's acceptances (see the module docstring)."""
TAIL_TOKENS = 8
"""Local tokens holding the mass outside the drafter's ranked tokens."""
IID_RANKS = 8
"""Ranked tokens per node for i.i.d. drafts (draws from the model's candidate bank)."""
SIM_CELLS = 4_000_000
"""Most S * N * V cells one simulation holds (32 MB per float64 array)."""
_SPECTR_BISECT = 40


@dataclass(frozen=True)
class NodeDistributions:
    """S sampled worlds of one tree shape.

    tokens: int64[S, N]      local token of each node (root: 0, unused)
    p:      float64[S, N, V] the target's distribution after each node (rows sum to 1)
    q:      float64[S, N, V] the distribution node i's token was drawn from (root row unused)
    """

    tokens: np.ndarray
    p: np.ndarray
    q: np.ndarray


def worlds(nodes: int, vocab: int, samples: int) -> int:
    """Worlds simulated for a tree of `nodes` over `vocab` tokens: `samples`, cut to SIM_CELLS."""
    return max(16, min(samples, SIM_CELLS // max(nodes * vocab, 1)))


def _dirichlet(rng: np.random.Generator, mean: np.ndarray, kappa: float) -> np.ndarray:
    g = rng.gamma(np.maximum(kappa * mean, 1e-6))
    return g / g.sum(axis=-1, keepdims=True)


def _with_tail(ranked: np.ndarray, tail: int) -> np.ndarray:
    """float64[..., W + tail]: ranked masses (clipped so they sum to <= 1), the rest spread."""
    ranked = np.clip(ranked, 0.0, 1.0)
    total = ranked.sum(axis=-1, keepdims=True)
    ranked = ranked / np.maximum(total, 1.0)
    rest = np.maximum(1.0 - ranked.sum(axis=-1, keepdims=True), 0.0)
    return np.concatenate([ranked, np.repeat(rest / tail, tail, axis=-1)], axis=-1)


def draw_distributions(
    tree: DraftTree,
    model: AcceptanceModel,
    rng: np.random.Generator,
    samples: int,
    iid: bool,
    concentration: float = TARGET_CONCENTRATION,
) -> NodeDistributions:
    """S worlds of `tree` (see the module docstring). iid: every node's draft row is a bank row
    at its children's depth and children's tokens are drawn from it; else the tree's children
    are the drafter's ranked tokens (their log-probs and the model's acceptances)."""
    n, s = tree.num_nodes, samples
    if iid:
        w = IID_RANKS
        conf = np.zeros((s, n, w))
        acc = np.zeros((s, n, w))
        for level in np.unique(tree.depth + 1):
            at = np.flatnonzero(tree.depth + 1 == level)
            bank = model.candidate_bank(int(level), w)
            rows = rng.integers(bank.rows, size=(s, at.size))
            conf[:, at] = bank.conf[rows]
            acc[:, at] = bank.accept[rows]
        q_node = _with_tail(conf, TAIL_TOKENS)  # [S, N, V]: the drafter after each node
        p = _dirichlet(rng, _with_tail(acc, TAIL_TOKENS), concentration)
        v = q_node.shape[-1]
        tokens = np.zeros((s, n), dtype=np.int64)
        q = np.zeros((s, n, v))
        for d in range(1, int(tree.depth.max(initial=0)) + 1):
            at = np.flatnonzero(tree.depth == d)
            rows = q_node[:, tree.parents[at]]  # [S, n_d, V]
            u = rng.random((s, at.size, 1))
            tokens[:, at] = np.minimum((u > rows.cumsum(axis=-1)).sum(axis=-1), v - 1)
            q[:, at] = rows
        return NodeDistributions(tokens, p, q)
    kids = children_table(tree)
    w = kids.shape[1]
    has = kids >= 0
    cond = model.conditional(tree)
    conf_rank = np.where(has, np.exp(tree.logprobs[np.maximum(kids, 0)]), 0.0)  # [N, W]
    acc_rank = np.where(has, cond[np.maximum(kids, 0)], 0.0)
    p = _dirichlet(
        rng,
        np.broadcast_to(_with_tail(acc_rank, TAIL_TOKENS), (s, n, w + TAIL_TOKENS)),
        concentration,
    )
    del conf_rank  # a top-k child's own draft row is one-hot (its token was taken, not drawn)
    v = w + TAIL_TOKENS
    tok = tree.sibling_rank.astype(np.int64).copy()
    tok[0] = 0
    q1 = np.zeros((n, v))
    q1[np.arange(1, n), tok[1:]] = 1.0
    return NodeDistributions(
        np.broadcast_to(tok, (s, n)).copy(), p, np.broadcast_to(q1, (s, n, v)).copy()
    )


# ---- the rules ---------------------------------------------------------------------------------
def _sample_rows(rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """int64[S]: one token per (unnormalised, non-negative) row [S, V] by inverse CDF."""
    c = rows.cumsum(axis=-1)
    return np.minimum((u[:, None] * c[:, -1:] >= c).sum(axis=-1), rows.shape[-1] - 1)


def _norm(rows: np.ndarray) -> np.ndarray:
    s = rows.sum(axis=-1, keepdims=True)
    return np.where(s > 0, rows / np.where(s > 0, s, 1.0), 0.0)


def simulate_rule(
    rule: str, tree: DraftTree, dists: NodeDistributions, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(accepted node int64[S], bonus token int64[S]): one verification per world. The emitted
    tokens are the tokens on the root path of the accepted node, then the bonus."""
    if rule not in VERIFY_RULES:
        raise SpecError(f"verification rule must be one of {VERIFY_RULES}, got {rule!r}")
    if rule == "traversal":
        return _traversal(tree, dists, rng)
    return _top_down(rule, tree, dists, rng)


def _top_down(
    rule: str, tree: DraftTree, dists: NodeDistributions, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """token / spectr / greedy: one node per level, children tried in index order."""
    tok, p, q = dists.tokens, dists.p, dists.q
    s = tok.shape[0]
    rows = np.arange(s)
    kids = children_table(tree)
    nkids = tree.num_children
    cur = np.zeros(s, dtype=np.int64)
    resid = p[:, 0].copy()
    live = np.ones(s, dtype=bool)
    bonus = np.zeros(s, dtype=np.int64)
    for _ in range(tree.max_depth + 1):
        moved = np.zeros(s, dtype=bool)
        k = nkids[cur]
        if rule == "spectr":
            first = kids[cur, 0]
            qrow = q[rows, np.maximum(first, 0)]
            rho, beta = _spectr_rho(resid, qrow, np.maximum(k, 1))
        elif rule == "greedy":
            want = resid.argmax(axis=-1)
        for r in range(kids.shape[1]):
            c = kids[cur, r]
            try_ = live & ~moved & (c >= 0)
            if not try_.any():
                continue
            cc = np.maximum(c, 0)
            x = tok[rows, cc]
            if rule == "greedy":
                ok = try_ & (x == want)
            else:
                qc = q[rows, cc]
                qx = np.maximum(qc[rows, x], 1e-300)
                if rule == "spectr":
                    qx = qx * rho
                ok = try_ & (rng.random(s) < np.minimum(1.0, resid[rows, x] / qx))
                if rule == "token":
                    rej = try_ & ~ok
                    resid = np.where(rej[:, None], _norm(np.maximum(resid - qc, 0.0)), resid)
            moved |= ok
            cur = np.where(ok, cc, cur)
        stop = live & ~moved
        if stop.any():
            if rule == "greedy":
                bonus = np.where(stop, want, bonus)
            else:
                row = resid
                if rule == "spectr":
                    row = _spectr_residual(resid, qrow, rho, beta, np.maximum(k, 1))
                bonus = np.where(stop, _sample_rows(row, rng.random((s,))), bonus)
        live &= moved
        resid = np.where(moved[:, None], p[rows, cur], resid)
        if not live.any():
            break
    return cur, bonus


def _spectr_rho(p: np.ndarray, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rho, beta) float64[S]: the least rho in [1, k] with rho * beta >= 1 - (1 - beta)^k,
    beta = sum min(q, p / rho) (SpecTr's K-SEQ; the left side minus the right rises with rho)."""
    lo = np.ones(p.shape[0])
    hi = k.astype(np.float64)

    def gap(rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        beta = np.minimum(q, p / rho[:, None]).sum(axis=-1)
        return rho * beta - (1.0 - (1.0 - beta) ** k), beta

    ok_lo = gap(lo)[0] >= 0
    for _ in range(_SPECTR_BISECT):
        mid = 0.5 * (lo + hi)
        up = gap(mid)[0] >= 0
        hi = np.where(up, mid, hi)
        lo = np.where(up, lo, mid)
    rho = np.where(ok_lo, 1.0, hi)
    return rho, gap(rho)[1]


def _spectr_residual(
    p: np.ndarray, q: np.ndarray, rho: np.ndarray, beta: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """float64[S, V]: SpecTr's distribution after all k drafts were rejected (unnormalised)."""
    b = np.maximum(beta, 1e-300)[:, None]
    scale = (1.0 - (1.0 - b) ** k[:, None]) / b
    return np.maximum(p - np.minimum(q, p / rho[:, None]) * scale, 0.0)


def _traversal(
    tree: DraftTree, dists: NodeDistributions, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Traversal Verification, one depth-first pass of enter/leave events over the tree."""
    tok, p, q = dists.tokens, dists.p, dists.q
    s, n = tok.shape
    rows = np.arange(s)
    t = np.zeros_like(p)  # T_b: the unnormalised target row of each node
    mass = np.zeros((s, n))
    t[:, 0], mass[:, 0] = p[:, 0], 1.0
    done = np.zeros(s, dtype=bool)
    acc = np.zeros(s, dtype=np.int64)
    bonus = np.zeros(s, dtype=np.int64)
    par = tree.parents
    for kind, c in depth_first_events(tree):
        if kind == "enter":
            x = tok[:, c]
            ratio = t[rows, par[c], x] / np.maximum(q[rows, c, x], 1e-300)
            w = np.minimum(1.0, ratio)
            t[:, c] = w[:, None] * p[:, c]
            mass[:, c] = w
            continue
        live = ~done
        take = live & (rng.random(s) < mass[:, c])
        if take.any():
            acc = np.where(take, c, acc)
            bonus = np.where(take, _sample_rows(t[:, c], rng.random((s,))), bonus)
            done |= take
        if c == 0:
            break
        b = par[c]
        rej = live & ~take
        res = np.maximum(t[:, b] - q[:, c], 0.0)
        r = res.sum(axis=-1)
        denom = 1.0 - mass[:, b] + r
        ok = rej & (denom > 0)
        safe = np.where(ok, denom, 1.0)
        t[:, b] = np.where(ok[:, None], res / safe[:, None], t[:, b])
        mass[:, b] = np.where(ok, r / safe, mass[:, b])
    return acc, bonus


def depth_first_events(tree: DraftTree) -> list[tuple[str, int]]:
    """('enter', c) / ('leave', c) in depth-first order, children by index (the root is
    entered implicitly and left last)."""
    fc, ns = tree.first_child, tree.next_sibling
    out: list[tuple[str, int]] = []
    stack = [(0, int(fc[0]))]
    while stack:
        node, child = stack[-1]
        if child >= 0:
            stack[-1] = (node, int(ns[child]))
            out.append(("enter", child))
            stack.append((child, int(fc[child])))
        else:
            stack.pop()
            out.append(("leave", node))
    return out


def expected_tokens_by_rule(
    rule: str,
    tree: DraftTree,
    model: AcceptanceModel,
    rng: np.random.Generator,
    samples: int,
    iid: bool,
    concentration: float = TARGET_CONCENTRATION,
) -> float:
    """Mean tokens per step (accepted + bonus) of `rule` on `tree` over simulated worlds."""
    v = (IID_RANKS if iid else int(children_table(tree).shape[1])) + TAIL_TOKENS
    s = worlds(tree.num_nodes, v, samples)
    dists = draw_distributions(tree, model, rng, s, iid, concentration)
    acc, _ = simulate_rule(rule, tree, dists, rng)
    return float(tree.depth[acc].mean() + 1.0)


def simulated_tokens(
    rule: str,
    tree: DraftTree,
    model: AcceptanceModel,
    rng: np.random.Generator,
    worlds: int,
    iid: bool,
    concentration: float = TARGET_CONCENTRATION,
) -> np.ndarray:
    """int64[worlds]: tokens per step (accepted + bonus) of `rule` on `tree`, one per world."""
    dists = draw_distributions(tree, model, rng, worlds, iid, concentration)
    acc, _ = simulate_rule(rule, tree, dists, rng)
    return tree.depth[acc].astype(np.int64) + 1
