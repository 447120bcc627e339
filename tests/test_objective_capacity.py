"""The closed form runs no larger batch than the KV cache holds at a bucket's context, the same
cap the simulator's objective applies, and refuses a model that does not fit at all."""

from __future__ import annotations

import math

import pytest

from spectune.planner.capacity import kv_budget
from spectune.planner.objective import closed_form_objective
from spectune.specs import SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.workload import load_workload


def test_batch_is_capped_by_kv_capacity_at_long_context() -> None:
    obj = closed_form_objective(
        "llama-3.1-8b", "eagle3-llama-3.1-8b", "h100-sxm", "mt-bench", kv_capacity=True
    )
    kv = kv_budget(
        load_hardware("h100-sxm"), load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
    )
    out = load_workload("mt-bench").output_len_mean_tokens
    context = 16384
    fits = kv.blocks // math.ceil((context + out) / kv.block_size)  # requests whose KV fits
    assert 1 < fits < 256
    assert obj.fitting_batch([1, fits, 256], context).tolist() == [1, fits, fits]
    policy = TreePolicy("dynamic-topk", 5, 4, 8)
    # past the cap, a bigger client batch gains nothing: the server runs `fits` requests
    assert obj(policy, 256, context) == pytest.approx(obj(policy, fits, context))
    # at a short context nothing is capped
    assert obj.fitting_batch([256], 512).tolist() == [256]


def test_model_that_does_not_fit_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="does not fit on 1 x h100-sxm"):
        closed_form_objective(
            "deepseek-v3", "deepseek-v3-mtp", "h100-sxm", "mt-bench", kv_capacity=True
        )
