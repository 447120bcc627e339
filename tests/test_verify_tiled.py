"""The rule kernels tile the vocabulary (kernels.verify.RULE_TILE), so real vocabularies
(128k-152k) run: under the interpreter, a vocabulary past the old one-tile limit (16384) must
give exactly what the same trees give over their support alone (one tile), and a tiny tile must
give exactly what one tile gives. Rows are dyadic (multiples of 1/64) so that sums do not
depend on the tiling's summation order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectune.kernels.verify import RULE_TILE, verify_rule

RULES = ("token", "traversal", "spectr")
SUPPORT = 48


def _dyadic(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """float32[rows, width] rows of multiples of 1/64 summing to 1."""
    counts = np.stack(
        [rng.multinomial(64, rng.dirichlet(np.full(width, 0.5))) for _ in range(rows)]
    )
    return (counts / 64.0).astype(np.float32)


def _world(seed: int, trees: int, iid: bool) -> tuple[np.ndarray, ...]:
    """Random trees of 3-7 nodes over a SUPPORT-token vocabulary: (parents int32, tokens int64,
    qo int32, p, q float32[total, SUPPORT]); i.i.d. drafts draw each child from its parent's
    draft row (siblings share it), top-k drafts take distinct tokens with one-hot rows."""
    rng = np.random.default_rng(seed)
    par, tok, p, q, qo = [], [], [], [], [0]
    for _ in range(trees):
        n = int(rng.integers(3, 8))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        draft = _dyadic(rng, n, SUPPORT)  # the draft row after each node
        tokens, qrows = [0], [np.zeros(SUPPORT, np.float32)]
        for i in range(1, n):
            row = draft[parents[i]]
            if iid:
                t = int(rng.choice(SUPPORT, p=row / row.sum()))
                qrows.append(row)
            else:
                t = int(rng.choice(np.flatnonzero(row))) if i % 2 else int(rng.integers(SUPPORT))
                qrows.append(np.eye(SUPPORT, dtype=np.float32)[t])
            tokens.append(t)
        par += parents
        tok += tokens
        p.append(_dyadic(rng, n, SUPPORT))
        q.append(np.stack(qrows))
        qo.append(qo[-1] + n)
    return (
        np.array(par, np.int32),
        np.array(tok, np.int64),
        np.array(qo, np.int32),
        np.concatenate(p),
        np.concatenate(q),
    )


def _run(rule: str, w: tuple[np.ndarray, ...], support: np.ndarray, vocab: int, **kw: int):
    par, tok, qo, p, q = w
    total = par.size
    pf = torch.zeros((total, vocab), dtype=torch.float32)
    qf = torch.zeros((total, vocab), dtype=torch.float32)
    pf[:, torch.from_numpy(support)] = torch.from_numpy(p)
    qf[:, torch.from_numpy(support)] = torch.from_numpy(q)
    acc, bonus = verify_rule(
        rule,
        torch.from_numpy(support[tok]),
        torch.from_numpy(par),
        torch.from_numpy(qo),
        pf,
        qf,
        seed=5,
        **kw,
    )
    return acc.numpy(), bonus.numpy()


@pytest.mark.parametrize("rule", RULES)
def test_vocabulary_past_one_tile_equals_its_support(rule: str) -> None:
    vocab = 20_000  # > 16384 (the one-tile limit this replaces), several RULE_TILE tiles
    assert vocab > 4 * RULE_TILE
    rng = np.random.default_rng(2)
    support = np.sort(rng.choice(vocab, SUPPORT, replace=False))
    support[-3:] = [16_384, 18_001, vocab - 1]  # tokens in the last tiles, at the edge
    support = np.sort(np.unique(support))
    assert support.size == SUPPORT
    w = _world(1, trees=6, iid=rule == "spectr" or rule == "traversal")
    acc_full, bonus_full = _run(rule, w, support, vocab)
    acc_small, bonus_small = _run(rule, w, np.arange(SUPPORT), SUPPORT)
    assert np.array_equal(acc_full, acc_small)
    assert np.array_equal(bonus_full, support[bonus_small])  # the same token, by its own id
    assert (bonus_full > 16_383).any() or (acc_full > 0).any()


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("iid", [True, False])
def test_small_tiles_equal_one_tile(rule: str, iid: bool) -> None:
    if rule == "spectr" and not iid:
        pytest.skip("SpecTr verifies i.i.d. drafts")
    w = _world(3, trees=24, iid=iid)
    support = np.arange(SUPPORT)
    one = _run(rule, w, support, SUPPORT)
    for tile in (4, 16):
        tiled = _run(rule, w, support, SUPPORT, block_v=tile)
        assert np.array_equal(one[0], tiled[0]) and np.array_equal(one[1], tiled[1]), tile
    assert len(set(one[0].tolist())) > 1  # the trees accept at different depths


def test_block_v_must_be_a_power_of_two() -> None:
    w = _world(0, trees=1, iid=True)
    with pytest.raises(ValueError, match="power of two"):
        _run("token", w, np.arange(SUPPORT), SUPPORT, block_v=12)
