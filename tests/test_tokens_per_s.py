"""planner.tokens_per_s: the two named kinds of tokens/s and how they relate."""

from __future__ import annotations

import numpy as np
import pytest

from spectune.planner import tokens_per_s as tps
from spectune.planner.space import SGLANG_DEFAULT
from spectune.specs import Scenario, SpecError


@pytest.fixture(scope="module")
def served():
    return tps.served_objective(Scenario().resolve(), samples=128)


def test_labels_name_the_kind():
    assert tps.SERVED.label == "served tok/s incl. prefill"
    assert tps.DECODE.label == "decode tok/s"
    assert tps.kind_named("decode") is tps.DECODE
    with pytest.raises(SpecError, match="served, decode"):
        tps.kind_named("tok/s")
    assert all(k.label in tps.legend() for k in tps.KINDS)


def test_served_is_the_plan_objective_and_decode_drops_turnover_and_cap(served):
    decode = tps.decode_objective(served)
    assert tps.is_served(served) and not tps.is_served(decode)
    assert decode.output_tokens is None and decode.kv is None
    assert served.output_tokens is not None  # the view does not change the served objective
    assert decode._expected is served._expected  # caches shared, not recomputed
    # at a batch the KV cache holds, decode = served without turnover: never smaller
    batches = np.array([1, 8, 32])
    for policy in (None, SGLANG_DEFAULT):
        s = tps.tokens_per_s(served, tps.SERVED, policy, batches, 4096)
        d = tps.tokens_per_s(served, tps.DECODE, policy, batches, 4096)
        assert np.all(d > s)
        assert np.allclose(s, served.many(policy, batches, 4096))
        # decode = batch * E / iteration total, from the cost model's one breakdown
        e = served.expected_tokens(policy)
        it = np.asarray(decode.iteration(policy, batches, 4096).total_s)
        assert np.allclose(d, batches * e / it)


def test_both_and_decode_only_objective(served):
    got = tps.both(served, SGLANG_DEFAULT, 8, 2048)
    assert got.of(tps.SERVED) == got.served_tokens_per_s < got.of(tps.DECODE)
    with pytest.raises(SpecError, match="decode-only"):
        tps.tokens_per_s(tps.decode_objective(served), tps.SERVED, None, 8, 2048)
