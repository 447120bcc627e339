"""Tensor-parallel executor on CPU: 2 ranks over gloo (spawned processes) on a tiny model.

The TP forward of every rank must equal the single-process forward of the same weights (each rank
loads its slices of the whole model), the vocab-parallel logits included; the TP speculative
loop, replicated on both ranks, must accept exactly what the single-process loop accepts with the
same seed, and both ranks must agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from test_executor import HEAD, TARGET  # noqa: E402  (the executor tests' tiny models)

from spectune.executor.collectives import TPGroup, collective_sweep, launch  # noqa: E402
from spectune.executor.drafter import Eagle3Head  # noqa: E402
from spectune.executor.model import Decoder  # noqa: E402
from spectune.executor.session import Session, SessionConfig  # noqa: E402
from spectune.executor.tp import (  # noqa: E402
    TPDecoder,
    TPEagle3Head,
    TPSession,
    shard_spec,
    tp_weight_shapes,
)
from spectune.specs import ModelSpec, SpecError, TreePolicy  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch's gloo backend")

B, N, C = 2, 5, 12


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    tok = torch.randint(0, TARGET.vocab, (B, N), generator=g)
    pos = C + torch.arange(N).expand(B, N)
    causal = torch.ones(N, N, dtype=torch.bool).tril().expand(B, N, N)
    hidden3 = torch.randn((B, N, 3 * TARGET.hidden), generator=g)
    return tok, pos, causal, hidden3


def _forward_rank(group: TPGroup, out: str) -> None:
    """Every rank: the whole model, its TP shard loaded from it, both forwards compared."""
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same cache contents on every rank
    full = Decoder(TARGET, "cpu", torch.float32, seed=0, max_pos=256)
    tp = TPDecoder(TARGET, group, torch.float32, max_pos=256)
    tp.load_from(full)
    fcache, tcache = full.new_cache(B, 32), tp.new_cache(B, 32)
    kvh = TARGET.kv_heads // group.world
    tcache.kv.copy_(fcache.kv[..., group.rank * kvh : (group.rank + 1) * kvh, :])
    tok, pos, causal, hidden3 = _inputs()
    want, wcap = full.forward(tok, pos, fcache, C, causal, capture=(0, 1))
    got, gcap = tp.forward(tok, pos, tcache, C, causal, capture=(0, 1))
    errs = {
        "hidden": (got - want).abs().max().item(),
        "captured": max((a - b).abs().max().item() for a, b in zip(gcap, wcap, strict=True)),
        "logits": (tp.lm_head(got) - full.lm_head(want)).abs().max().item(),
        "kv": (tcache.kv - fcache.kv[..., group.rank * kvh : (group.rank + 1) * kvh, :])
        .abs()
        .max()
        .item(),
        "logits_shape": list(tp.lm_head(got).shape),
    }
    head = Eagle3Head(HEAD, full)
    tp_head = TPEagle3Head(HEAD, tp)
    tp_head.load_from(head)
    hc, tc = head.new_cache(B, 32), tp_head.new_cache(B, 32)
    tc.kv.copy_(hc.kv[..., group.rank * kvh : (group.rank + 1) * kvh, :])
    a = head.draft_extend(tok, hidden3, pos, hc, C, causal)
    b = tp_head.draft_extend(tok, hidden3, pos, tc, C, causal)
    errs["draft_extend"] = (a - b).abs().max().item()
    errs["draft_logits"] = (head.logits(a) - tp_head.logits(b)).abs().max().item()
    Path(f"{out}.{group.rank}").write_text(json.dumps(errs))


def _all_rank(group: TPGroup, out: str) -> None:
    """One spawn for the whole module (a spawn costs seconds): every part below."""
    _forward_rank(group, f"{out}/errs")
    _loop_rank(group, f"{out}/acc")
    _sweep_rank(group, f"{out}/sweep.json")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp")
    launch(_all_rank, 2, (str(out),), backend="gloo")
    return out


def test_tp_forward_equals_single_process(ranks: Path) -> None:
    out = str(ranks / "errs")
    for rank in (0, 1):
        errs = json.loads(Path(f"{out}.{rank}").read_text())
        assert errs.pop("logits_shape") == [B, N, TARGET.vocab]
        for name, err in errs.items():
            assert err < 1e-5, (rank, name, err)


POLICY = TreePolicy(builder="dynamic-topk", depth=3, topk=2, budget=6)


def _accepted(session: Session) -> list[float]:
    from spectune.planner.acceptance import acceptance_model
    from spectune.specs import load_workload

    acc = acceptance_model(load_workload("mt-bench"))
    torch.manual_seed(5)  # TPSession seeds here too (its own seed, 5 below)
    (res,) = session.run_spec(B, C, POLICY, acc, steps=4, warmup=1)
    return res.accepted


def _loop_rank(group: TPGroup, out: str) -> None:
    torch.set_num_threads(1)
    cfg = SessionConfig(max_batch=B, max_context=C, max_tree=8, use_graphs=False)
    session = TPSession(TARGET, HEAD, cfg, group, seed=5)
    Path(f"{out}.{group.rank}").write_text(json.dumps(_accepted(session)))
    # a drafter step timed with and without its collectives leaves them on; without them the
    # head's logits are this rank's vocabulary share
    t, t0 = session.draft_step_time_comm(B, 2, C, reps=1)
    head = session.tp_drafter
    assert isinstance(head, TPEagle3Head)
    back = head.comm and head.layer.reduce is not None
    h = torch.zeros((1, 1, TARGET.hidden))
    head.set_comm(False)
    partial = head.logits(h).shape[-1]
    head.set_comm(True)
    # the profile hook gets the replayed step and its report comes back beside the time
    t1, report = session.draft_step_timing(
        B, 2, C, reps=1, profile=lambda fn: (fn(), {"calls": 1.0})[1]
    )
    info = {
        "seconds": [t, t0, t1],
        "back": back,
        "widths": [partial, head.logits(h).shape[-1]],
        "report": report,
    }
    Path(f"{out}.draft.{group.rank}").write_text(json.dumps(info))


def test_tp_loop_accepts_as_single_process(ranks: Path) -> None:
    out = str(ranks / "acc")
    per_rank = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    assert per_rank[0] == per_rank[1]
    cfg = SessionConfig(max_batch=B, max_context=C, max_tree=8, use_graphs=False)
    single = _accepted(Session(TARGET, HEAD, cfg, "cpu"))
    assert per_rank[0] == single
    assert sum(single) > 0  # something was accepted: the comparison can tell runs apart


def test_drafter_step_timed_with_and_without_collectives(ranks: Path) -> None:
    for r in (0, 1):
        info = json.loads((ranks / f"acc.draft.{r}").read_text())
        assert all(t > 0 for t in info["seconds"]) and info["back"]
        assert info["widths"] == [HEAD.lm_vocab // 2, HEAD.lm_vocab]
        assert info["report"] == {"calls": 1.0}


def _sweep_rank(group: TPGroup, out: str) -> None:
    rows = collective_sweep(group, sizes=(4096, 65536), reps=2, inner=2)
    x = torch.full((4, 8), float(group.rank + 1))
    group.reduce_scatter_all_gather_(x)
    y = group.all_gather_last(torch.full((3, 2), float(group.rank)))
    if group.rank == 0:
        Path(out).write_text(json.dumps({"rows": rows, "x": x.tolist(), "y": y.tolist()}))


def test_collectives_and_sweep_rows(ranks: Path) -> None:
    out = ranks / "sweep.json"
    doc = json.loads(out.read_text())
    assert {(r["op"], r["bytes"]) for r in doc["rows"]} == {
        (op, b) for op in ("all_reduce", "rs_ag", "all_gather", "broadcast") for b in (4096, 65536)
    }
    assert all(r["tp"] == 2 and r["seconds"] > 0 for r in doc["rows"])
    assert all(r["seconds_back_to_back"] > 0 for r in doc["rows"])
    # only all-reduces are timed after their GEMM (a negative difference falls back)
    assert {r["pattern"] for r in doc["rows"] if r["op"] != "all_reduce"} == {"back_to_back"}
    assert {r["pattern"] for r in doc["rows"]} <= {"in_place", "back_to_back"}
    for r in doc["rows"]:
        if r["pattern"] == "back_to_back":
            assert r["seconds"] == r["seconds_back_to_back"]
    assert doc["x"] == [[3.0] * 8] * 4  # 1 + 2 on every element
    assert doc["y"] == [[0.0, 0.0, 1.0, 1.0]] * 3  # rank 0's columns, then rank 1's


def test_shard_spec_and_weight_shapes() -> None:
    s = shard_spec(TARGET, 2)
    assert (s.heads, s.kv_heads, s.ffn, s.hidden, s.vocab) == (2, 1, 48, 64, 300)
    with pytest.raises(SpecError, match="kv_heads"):
        shard_spec(TARGET, 4)  # 2 KV heads cannot be split 4 ways
    # Llama-3.1-70B at tp 4: q|k|v (16 + 2*2 heads) x 128, o, gate|up, down, LM head
    from spectune.specs import model_preset

    shapes = tp_weight_shapes(model_preset("llama-3.1-70b"), 4)
    assert shapes == [(2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168), (32064, 8192)]


def test_execute_tp_cli_on_cpu_writes_a_checked_document(tmp_path: Path) -> None:
    """`spectune execute --tp 2 --dry-run`: the launcher spawns the ranks (gloo), rank 0 writes
    the measurement with "tp": 2 and whether the ranks accepted alike; it validates."""
    from spectune.cli import main
    from spectune.validate.measure import validate_measurement

    t, h = tmp_path / "t.json", tmp_path / "h.json"
    t.write_text(json.dumps({f.name: getattr(TARGET, f.name) for f in _fields(TARGET)}))
    h.write_text(json.dumps({f.name: getattr(HEAD, f.name) for f in _fields(HEAD)}))
    out = tmp_path / "m.json"
    argv = ["execute", "--policy", "dynamic-topk:3,2,6", "--target", str(t), "--drafter", str(h)]
    argv += ["--batch", "2", "--context", str(C), "--steps", "2", "--warmup", "1", "--tp", "2"]
    assert main([*argv, "--dry-run", "--hardware", "h100-sxm", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_measurement(doc, str(out))
    assert doc["tp"] == 2 and doc["ranks_agree"] is True
    assert [r["label"] for r in doc["runs"]] == ["policy"]
    assert main(["execute", "--policy", "off", "--dry-run", "--out", str(out)]) == 2  # no --tp


def _fields(spec: ModelSpec) -> tuple[Any, ...]:
    import dataclasses

    return dataclasses.fields(spec)
