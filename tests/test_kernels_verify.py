"""Tree verification: exact match with the reference walk, structural invariants on random trees,
Philox/Gumbel sampling equal to its numpy replica, and losslessness of stochastic verification."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels import (  # noqa: E402
    VerifyResult,
    make_verify_inputs,
    pack_trees,
    reference_sample_target,
    reference_walk_tree,
    sample_target,
    verify_greedy,
    verify_stochastic,
    walk_tree,
)
from spectune.specs import DraftTree  # noqa: E402
from tests.strategies import draft_trees  # noqa: E402


def assert_same(a: VerifyResult, b: VerifyResult) -> None:
    for name in ("accepted_nodes", "num_accepted", "next_token", "emitted_tokens"):
        assert torch.equal(getattr(a, name).cpu(), getattr(b, name).cpu()), name


def check_invariants(res: VerifyResult, tokens, parents, indptr, target) -> None:
    tok, par, tgt = tokens.cpu().numpy(), parents.cpu().numpy(), target.cpu().numpy()
    ptr = indptr.cpu().numpy()
    for b in range(ptr.size - 1):
        s, n = int(ptr[b]), int(ptr[b + 1] - ptr[b])
        k = int(res.num_accepted[b])
        path = res.accepted_nodes[b].cpu().numpy()
        emit = res.emitted_tokens[b].cpu().numpy()
        assert path[0] == 0 and (path[k + 1 :] == -1).all()
        for i in range(1, k + 1):  # a root path whose tokens equal the parent's target token
            assert par[s + path[i]] == path[i - 1]
            assert tok[s + path[i]] == tgt[s + path[i - 1]]
            assert emit[i - 1] == tok[s + path[i]]
        last = path[k]
        assert (emit != -1).sum() == k + 1  # emitted = accepted + 1
        assert emit[k] == tgt[s + last] == int(res.next_token[b])
        kids = [i for i in range(n) if par[s + i] == last]
        assert all(tok[s + c] != tgt[s + last] for c in kids)  # maximal: no child matches


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_greedy_matches_reference(dtype) -> None:
    inp = make_verify_inputs([1, 5, 40, 130, 17, 64], vocab=24, dtype=dtype, seed=3)
    res = verify_greedy(inp.tokens, inp.parents, inp.qo_indptr, logits=inp.logits)
    ref = reference_walk_tree(inp.tokens, inp.parents, inp.qo_indptr, inp.target_tokens)
    assert_same(res, ref)
    assert int(ref.num_accepted.max()) >= 2  # the inputs do exercise long paths
    res2 = verify_greedy(inp.tokens, inp.parents, inp.qo_indptr, target_tokens=inp.target_tokens)
    assert_same(res2, ref)
    check_invariants(res, inp.tokens, inp.parents, inp.qo_indptr, inp.target_tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("seed", [0, 987654321, 2**40 + 3])
def test_sampling_equals_numpy_replica(temperature, seed) -> None:
    logits = torch.randn(37, 300, generator=torch.Generator().manual_seed(seed % 1000)) * 3
    out = sample_target(logits, temperature, seed)
    assert torch.equal(out, reference_sample_target(logits, temperature, seed))


def test_sampling_block_shape_does_not_change_samples() -> None:
    logits = torch.randn(20, 50)
    a = sample_target(logits, 1.0, 5, block_r=1)
    assert torch.equal(a, sample_target(logits, 1.0, 5, block_r=16))
    assert not torch.equal(a, sample_target(logits, 1.0, 6))


@st.composite
def batches(draw):
    trees = draw(st.lists(draft_trees(1, 130, 16, vocab=6), min_size=1, max_size=4))
    seed = draw(st.integers(0, 2**31))
    return trees, seed


@settings(max_examples=25, deadline=None)
@given(batches())
def test_random_trees_exact_and_invariants(batch) -> None:
    trees, seed = batch
    rng = np.random.default_rng(seed)
    packed = pack_trees(trees)
    # target: usually the token of some child, so that paths get long
    target = []
    for t in trees:
        for i in range(t.num_nodes):
            kids = np.flatnonzero(t.parents == i)
            hit = kids.size and rng.random() < 0.85
            target.append(int(t.tokens[rng.choice(kids)]) if hit else int(rng.integers(0, 6)))
    tgt = torch.tensor(target, dtype=torch.int64)
    res = walk_tree(
        packed.tokens, packed.parents, packed.qo_indptr, tgt, max_nodes=packed.max_nodes
    )
    assert_same(res, reference_walk_tree(packed.tokens, packed.parents, packed.qo_indptr, tgt))
    check_invariants(res, packed.tokens, packed.parents, packed.qo_indptr, tgt)


def test_empty_and_single_node_sequences() -> None:
    tok = torch.tensor([7, 3, 9], dtype=torch.int64)
    par = torch.tensor([-1, -1, 0], dtype=torch.int32)
    ptr = torch.tensor([0, 1, 1, 3], dtype=torch.int32)  # sequence 1 is empty
    tgt = torch.tensor([4, 9, 1], dtype=torch.int64)
    res = walk_tree(tok, par, ptr, tgt)
    assert res.num_accepted.tolist() == [0, 0, 1]
    assert res.next_token.tolist() == [4, -1, 1]
    assert res.accepted_nodes.tolist() == [[0, -1], [-1, -1], [0, 1]]
    assert res.emitted_tokens.tolist() == [[4, -1], [-1, -1], [9, 1]]


def test_rejects_malformed_inputs() -> None:
    inp = make_verify_inputs([3], vocab=8)
    with pytest.raises(ValueError, match="exactly one"):
        verify_greedy(inp.tokens, inp.parents, inp.qo_indptr)
    with pytest.raises(ValueError, match="int64"):
        walk_tree(inp.tokens.int(), inp.parents, inp.qo_indptr, inp.target_tokens)
    with pytest.raises(ValueError, match="temperature"):
        sample_target(inp.logits, -1.0)


def test_stochastic_verification_is_lossless() -> None:
    """1e5 copies of one tree (run through the kernels, batch 1e5): the first emitted token follows
    the target at the root, and the next one, given the first hit child c, follows the target at c."""
    vocab, temp, draws = 6, 0.8, 100_000
    # root children with tokens 0, 1, 2 (top-3 draft); node 1 has children with tokens 3, 0
    tree = DraftTree.from_parents([-1, 0, 0, 0, 1, 1], tokens=[5, 0, 1, 2, 3, 0])
    gen = torch.Generator().manual_seed(1)
    node_logits = torch.randn(tree.num_nodes, vocab, generator=gen) * 1.5
    node_logits[0, 0] = node_logits[0].max()  # make the deep branch likely enough to test
    packed = pack_trees([tree] * draws)
    logits = node_logits.repeat(draws, 1)
    res = verify_stochastic(
        packed.tokens, packed.parents, packed.qo_indptr, logits, temp, seed=2024, max_nodes=6
    )
    emit = res.emitted_tokens.numpy()
    check_invariants(
        VerifyResult(res.accepted_nodes[:50], res.num_accepted[:50], res.next_token[:50], res.emitted_tokens[:50]),
        packed.tokens[:300], packed.parents[:300], packed.qo_indptr[:51],
        sample_target(logits[:300], temp, seed=2024),
    )  # fmt: skip
    probs = torch.softmax(node_logits.double() / temp, -1).numpy()

    def chi2_p(samples: np.ndarray, p: np.ndarray) -> float:
        counts = np.bincount(samples, minlength=vocab)
        return float(stats.chisquare(counts, p * counts.sum()).pvalue)

    assert chi2_p(emit[:, 0], probs[0]) > 1e-3
    second = emit[emit[:, 0] == 0, 1]  # first token 0 -> node 1 accepted; next ~ target at node 1
    assert second.size > 5000 and chi2_p(second, probs[1]) > 1e-3
    # acceptance rate of the first draft level equals the target mass on the drafted tokens
    hit = (res.num_accepted.numpy() >= 1).mean()
    assert abs(hit - probs[0, :3].sum()) < 4 * np.sqrt(hit * (1 - hit) / draws) + 1e-3


@pytest.mark.gpu
def test_gpu_matches_reference() -> None:
    inp = make_verify_inputs([64] * 64 + [130, 1, 7], vocab=1000, device="cuda", seed=5)
    res = verify_greedy(inp.tokens, inp.parents, inp.qo_indptr, logits=inp.logits)
    assert_same(res, reference_walk_tree(inp.tokens, inp.parents, inp.qo_indptr, inp.target_tokens))
    lg = inp.logits.bfloat16()
    s = sample_target(lg, 0.7, 99)
    r = reference_sample_target(lg, 0.7, 99)
    assert (s.cpu() == r).float().mean() > 0.99  # GPU log vs numpy log may flip near-ties
