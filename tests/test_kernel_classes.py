"""Kernel names -> the cost model's operator classes (executor.calibrate.kernel_class), as the
calibration's profiled verify rows and benchmarks/probe_forward_kernels.py use them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

from spectune.executor.calibrate import KERNEL_CLASS_NAMES, kernel_class

# names as torch.profiler reported them in an H100 forward (benchmarks/results/
# forward_kernels_h100.json)
NAMES = {
    "_splitk_kernel": "linear",
    "_fused_linear_kernel": "linear",
    "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT": "linear",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)": "linear",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
    "at::native::ArgMaxOps<float>, unsigned int, long, 4, 4> >(...)": "linear",
    "_tree_attention_kernel": "attention",
    "_merge_splits_kernel": "attention",
    "_span_merge_kernel": "attention",
    "_prefix_split_kernel": "attention",
    "_add_rmsnorm_kernel": "other",
    "_rope_store_kernel": "other",
    "_silu_mul_kernel": "other",
    "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16>(...)": "other",
}


@pytest.mark.parametrize(("name", "cls"), sorted(NAMES.items()))
def test_kernel_class(name: str, cls: str) -> None:
    assert kernel_class(name) == cls


def test_classes_are_the_cost_models() -> None:
    """Each class names the operator classes of planner.forward that price it (validate.fit's
    CLASS_PARTS), and together with 'other' they cover every class but none twice."""
    from spectune.planner.forward import CLASSES
    from spectune.validate.fit import CLASS_PARTS

    assert set(KERNEL_CLASS_NAMES) == {"linear", "attention"}
    parts = [c for kind in CLASS_PARTS.values() for c in kind]
    assert sorted(parts) == sorted(CLASSES)
    assert set(CLASS_PARTS) == {f"verify_{c}" for c in (*KERNEL_CLASS_NAMES, "other")}


def test_exclusive_durations_charge_an_overlap_once() -> None:
    """A PDL kernel (b) starts while its predecessor (a) runs and waits; a kernel wholly inside
    another (c) adds nothing; a gap stays a gap."""
    from spectune.executor.calibrate import exclusive_durations

    spans = [("b", 5.0, 20.0), ("a", 0.0, 10.0), ("c", 12.0, 15.0), ("d", 30.0, 34.0)]
    assert exclusive_durations(spans) == [
        ("a", 0.0, 10.0),
        ("b", 5.0, 10.0),
        ("c", 12.0, 0.0),
        ("d", 30.0, 4.0),
    ]


@given(
    st.lists(
        st.tuples(st.floats(0, 1e4), st.floats(0, 1e3)).map(lambda t: ("k", t[0], t[0] + t[1])),
        max_size=40,
    )
)
def test_exclusive_durations_sum_to_the_union_of_the_spans(
    spans: list[tuple[str, float, float]],
) -> None:
    from spectune.executor.calibrate import exclusive_durations

    out = exclusive_durations(spans)
    assert len(out) == len(spans) and all(d >= 0 for _, _, d in out)
    merged: list[list[float]] = []  # the spans' union as disjoint intervals
    for _, s, e in sorted(spans, key=lambda k: k[1]):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    union = sum(e - s for s, e in merged)
    assert sum(d for _, _, d in out) == pytest.approx(union, rel=1e-9, abs=1e-9)
    assert sum(d for _, _, d in out) <= sum(e - s for _, s, e in spans) + 1e-9
