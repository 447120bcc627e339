"""What a tensor-parallel iteration pays, as the TP executor (executor/tp.py) runs it: every
drafter forward (each draft step, the draft extend) does two all-reduces of its EAGLE-3 layer and
one all-gather of its vocabulary-parallel logits, as the target's verify does per layer and once;
after the gather every rank lays the logits out as [L, V] and runs the logits pass over the
whole vocabulary."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spectune.planner.costmodel import CostModel
from spectune.planner.operators import (
    ACT_BYTES,
    LOGIT_BYTES,
    Rates,
    allgather_time,
    allreduce_time,
    elementwise_time,
    gemm_time,
)
from spectune.specs import Calibration, TreePolicy, hardware_preset, model_preset

H100 = hardware_preset("h100-sxm")
TARGET = model_preset("llama-3.1-8b")
HEAD = model_preset("eagle3-llama-3.1-8b")
DELTA_S = 5e-6  # latency added to every regime of the slower law


def _law(extra: float) -> Calibration:
    """A calibration with all-reduce and all-gather laws at tp 2 and 4 (two regimes each; the
    H100 fit's shape), every latency raised by `extra` seconds."""
    ar = tuple(
        (tp, start, lat + extra, bw)
        for tp in (2.0, 4.0)
        for start, lat, bw in ((0.0, 9.9e-6, 158e9), (1.48e6, 21.6e-6, 293e9))
    )
    ag = tuple(
        (tp, start, lat + extra, bw)
        for tp in (2.0, 4.0)
        for start, lat, bw in ((0.0, 9.1e-6, 107e9), (2.97e6, 20.7e-6, 198e9))
    )
    return Calibration(hardware="h100-sxm", allreduce_law=ar, allgather_law=ag)


def _models(tp: int) -> tuple[CostModel, CostModel]:
    return (
        CostModel(H100, TARGET, HEAD, tp=tp, calibration=_law(0.0)),
        CostModel(H100, TARGET, HEAD, tp=tp, calibration=_law(DELTA_S)),
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_every_drafter_forward_pays_two_all_reduces_and_a_logits_gather(tp: int) -> None:
    fast, slow = _models(tp)
    b, k, c = np.array([1, 8, 64]), 4, 4096
    # one draft step: the head's layer all-reduces after o and after down, then the gather
    step = slow.draft_step_time(b, k, c) - fast.draft_step_time(b, k, c)
    np.testing.assert_allclose(step, 3 * DELTA_S, rtol=1e-9)
    # the drafting phase of depth d: d drafter forwards (the first fed by the target)
    pol = TreePolicy(builder="dynamic-topk", depth=5, topk=4, budget=8)
    d_fast = fast.iteration(pol, b, c).draft_s
    d_slow = slow.iteration(pol, b, c).draft_s
    np.testing.assert_allclose(d_slow - d_fast, 5 * 3 * DELTA_S, rtol=1e-9)
    ext = slow.iteration(pol, b, c).extend_s - fast.iteration(pol, b, c).extend_s
    np.testing.assert_allclose(ext, 3 * DELTA_S, rtol=1e-9)
    # the target's verify: 2 per layer + its own gather
    ver = slow.iteration(pol, b, c).verify_s - fast.iteration(pol, b, c).verify_s
    np.testing.assert_allclose(ver, (2 * TARGET.layers + 1) * DELTA_S, rtol=1e-9)


def test_one_gpu_pays_no_collectives() -> None:
    fast, slow = _models(1)
    pol = TreePolicy(builder="dynamic-topk", depth=5, topk=4, budget=8)
    a, z = fast.iteration(pol, 8, 4096), slow.iteration(pol, 8, 4096)
    assert float(a.total_s) == float(z.total_s)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_logits_path_by_hand(tp: int) -> None:
    # verify over L = 8 x 16 tokens: the vocab-parallel LM head GEMM over V/tp rows, then the
    # logits pass over all V on every rank (write + read L*V fp32); under tp > 1 the copy that
    # lays the rank-major gather out as [L, V] (read + write L*V bf16) is the gather's, in comm
    cm = CostModel(H100, TARGET, HEAD, tp=tp, calibration=_law(0.0))
    r = cm.rates
    lines = 8 * 16
    v, h = TARGET.lm_vocab, TARGET.hidden
    want = float(gemm_time(r, lines, v / tp, h, r.dense_format(TARGET.dtype_bytes)))
    want += float(elementwise_time(r, 2 * lines * v * LOGIT_BYTES))
    assert float(cm.verify_breakdown(8, 16, 4096)["lm_head"]) == pytest.approx(want, rel=1e-12)
    if tp > 1:
        gather = float(allgather_time(r, lines * v * ACT_BYTES, tp))
        copy = float(elementwise_time(r, 2 * lines * v * ACT_BYTES))
        layers = float(allreduce_time(r, lines * h * ACT_BYTES, tp)) * 2 * TARGET.layers
        launches = (2 * TARGET.layers + 2) * r.launch_s  # all-reduces, gather, copy
        got = float(cm.verify_breakdown(8, 16, 4096)["comm"])
        assert got == pytest.approx(layers + gather + copy + launches, rel=1e-12)


@pytest.mark.parametrize("target", ["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3"])
def test_collectives_launch_in_comm(target: str) -> None:
    # a split forward runs the same kernels as one GPU's plus its collectives: the launch class
    # stays tp 1's and every collective's launch is in comm, which is what a split grid's
    # seconds - seconds_nocomm measures (validate.fit.fit_inforward_offset reads it so)
    cal = dataclasses.replace(_law(0.0), launch_s=3e-6)
    one = CostModel(H100, model_preset(target), None, tp=1, calibration=cal)
    for tp in (2, 4, 8):
        split = CostModel(H100, model_preset(target), None, tp=tp, calibration=cal)
        for b, n in ((1, 1), (8, 16), (64, 4)):
            assert float(split.verify_breakdown(b, n, 4096)["launch"]) == pytest.approx(
                float(one.verify_breakdown(b, n, 4096)["launch"]), rel=1e-12
            )


def test_ring_law_where_no_regime_was_fitted() -> None:
    # a tp the sweep lacked (8) is priced by the ring law, at its fitted efficiency
    cal = dataclasses.replace(_law(0.0), interconnect_efficiency=0.6, allreduce_latency_s=1e-5)
    r = Rates.resolve(H100, cal)
    cm = CostModel(H100, model_preset("llama-3.1-70b"), None, tp=8, calibration=cal)
    per_layer = 2 * (14 / 8 * 8192 * 2 / (450e9 * 0.6) + 1e-5)
    gather = 7 / 8 * 128256 * 2 / (450e9 * 0.6) + 1e-5
    assert r.link_latency_s == 1e-5
    copy = float(elementwise_time(r, 2 * 128256 * ACT_BYTES))  # the gather's layout copy
    launches = (2 * 80 + 2) * r.launch_s
    got = float(cm.verify_breakdown(1, 1, 0)["comm"])
    assert got == pytest.approx(80 * per_layer + gather + copy + launches)
