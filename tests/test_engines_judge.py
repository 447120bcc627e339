"""The engines' own configuration code judges spectune's exports.

Every export of a set of plans goes through the engine's argument parser and config resolution
(installed without GPU dependencies by scripts/setup.d/engines.sh), and what the engine resolves
must equal the plan: draft steps, top-k and draft tokens, the draft length of every batch size,
tensor parallelism and the max-running-requests cap.

  SGLang 0.5.23: sglang.srt.server_args.prepare_server_args + ServerArgs.resolve_once (the
      speculative hook), and the adaptive slot routing of
      sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams.
  vLLM 0.33.0: EngineArgs.from_cli_args(...).create_engine_config() on vLLM's CPU platform
      (VLLM_TARGET_DEVICE=cpu) and vllm.v1.spec_decode.dynamic.utils's dense schedule lookup.
  TensorRT-LLM: not installable here (its wheel needs CUDA); the YAML is validated against a
      field-for-field schema of tensorrt_llm/llmapi/llm_args.py at NVIDIA/TensorRT-LLM commit
      0004396720054fd8e205cbf616f21f0b57c6b412 (DecodingBaseConfig, EagleDecodingConfig,
      Eagle3DecodingConfig; StrictBaseModel: unknown keys rejected), below.

Plans made with `spectune plan --engine X` are judged too: their export must carry no
approximation note, and the engine must resolve exactly the policy of every batch size.

Models are stub folders holding only config.json, written from the published configs.

On CPU, SGLang's `configs` package imports vision-preprocessing modules that import torchvision,
whose PyPI wheel links CUDA torch libraries and cannot load beside the CPU torch. `_sglang()`
first lets transformers decide that torchvision is absent (its cached availability check), then
puts an empty torchvision stand-in into sys.modules for those image helpers; nothing on the
speculative path touches it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from spectune.planner.export import Export, export_policy, to_yaml
from spectune.specs.engine import load_engine
from spectune.specs.policy import Bucket, ChainChoice, PolicyTable, Prediction, TreePolicy

yaml = pytest.importorskip("yaml")

# Before any engine import (SGLang imports parts of vLLM too): vLLM resolves its platform once,
# and with no GPU it must pick its CPU platform; the hub must never be asked for a model.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ---- stub models (config.json from the models' Hugging Face cards) ----------------------------

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA_70B = {
    **LLAMA_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
EAGLE3_8B = {  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 1,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
EAGLE3_70B = {  # yuhuili/EAGLE3-LLaMA3.3-Instruct-70B
    **EAGLE3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
}


def _stub(root: Path, name: str, config: dict[str, Any]) -> str:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {
        "llama-3.1-8b": _stub(root, "llama8b", LLAMA_8B),
        "llama-3.1-70b": _stub(root, "llama70b", LLAMA_70B),
        "eagle3-llama-3.1-8b": _stub(root, "eagle8b", EAGLE3_8B),
        "eagle3-llama-3.1-70b": _stub(root, "eagle70b", EAGLE3_70B),
    }


# ---- the plans ------------------------------------------------------------------------------


def _b(lo: int, hi: int, policy: TreePolicy | None, chain: int) -> Bucket:
    tps = 100.0 * hi
    return Bucket(
        (lo, hi),
        (0, 8191),
        policy,
        Prediction(tps, 2.0 if policy else 1.0, 3.0 if policy else 1.0),
        ChainChoice(chain, tps * 0.9 if chain else tps, 2.0 if chain else 1.0),
    )


def _tree(d: int, k: int, n: int) -> TreePolicy:
    return TreePolicy("dynamic-topk", d, k, n)


def _chain(d: int) -> TreePolicy:
    return TreePolicy("dynamic-topk", d, 1, d + 1)


PLANS: dict[str, PolicyTable] = {
    # 8B on H100: trees at small batches, a chain, then off
    "8b-h100": PolicyTable(
        "llama-3.1-8b",
        "eagle3-llama-3.1-8b",
        "h100-sxm",
        (
            _b(1, 1, _tree(6, 4, 24), 5),
            _b(2, 8, _tree(5, 4, 16), 4),
            _b(9, 64, _chain(3), 3),
            _b(65, 256, None, 0),
        ),
        workload="mt-bench",
    ),
    # 70B TP4 on H200: one tree for every batch size
    "70b-tp4-h200": PolicyTable(
        "llama-3.1-70b",
        "eagle3-llama-3.1-70b",
        "h200-sxm",
        (_b(1, 16, _tree(5, 4, 8), 4), _b(17, 128, _tree(5, 4, 8), 3)),
        tp=4,
        workload="mt-bench",
    ),
    # chains with an "off" bucket (the vLLM case)
    "vllm-off": PolicyTable(
        "llama-3.1-8b",
        "eagle3-llama-3.1-8b",
        "h100-sxm",
        (_b(1, 32, _chain(4), 4), _b(33, 512, None, 0)),
        workload="mt-bench",
    ),
    # SGLang adaptive: top-k 1, a draft length per range, off at the top
    "sglang-adaptive": PolicyTable(
        "llama-3.1-8b",
        "eagle3-llama-3.1-8b",
        "h100-sxm",
        (
            _b(1, 8, _chain(5), 5),
            _b(9, 48, _chain(3), 3),
            _b(49, 160, _chain(1), 1),
            _b(161, 256, None, 0),
        ),
        workload="mt-bench",
    ),
}


def _export(name: str, engine: str, stubs: dict[str, str], out: Path) -> Export:
    t = PLANS[name]
    ex = export_policy(t, engine, model_path=stubs[t.target], draft_model_path=stubs[t.drafter])
    ex.write(out)
    return ex


def planned_lengths(table: PolicyTable, engine: str) -> list[int]:
    """Draft length per batch size 1..max (index 0 unused) that the export promises: the
    policy depth, or the bucket's chain where the engine runs chains (chain-only engines; SGLang
    when the plan varies with the batch size), 0 where the plan is off."""
    prof = load_engine(engine)
    varies = len({b.policy for b in table.buckets}) > 1
    chains = not prof.trees or (prof.schedule_topk1_only and varies)
    out = [0]
    for b in sorted(table.buckets, key=lambda b: b.batch):
        p = b.policy
        if p is None:
            k = 0
        elif p.topk > 1 and chains and b.chain:
            k = b.chain.draft_tokens
        else:
            k = p.depth
        out += [k] * (b.batch[1] - b.batch[0] + 1)
    return out


# ---- SGLang ---------------------------------------------------------------------------------


TORCHVISION_MODULES = (
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.io",
    "torchvision.ops",
)


def _installed(package: str) -> None:
    """Skip when the engines extra is not installed; once it is, a module its config code needs
    but scripts/setup.d/engines.sh did not install is a failure (importorskip would hide it)."""
    if importlib.util.find_spec(package) is None:
        pytest.skip("the engines extra is not installed (scripts/setup.d/engines.sh)")


class _StandIn(types.ModuleType):
    """An empty module whose public names are placeholder classes (image helpers only)."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def _sglang() -> types.ModuleType:
    _installed("sglang")
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available()  # cached before the stand-in exists
    if "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None:
        for n in TORCHVISION_MODULES:
            m = _StandIn(n)
            m.__spec__ = importlib.machinery.ModuleSpec(n, None)
            m.__path__ = []  # type: ignore[attr-defined]
            sys.modules[n] = m
    return importlib.import_module("sglang.srt.server_args")


def _resolve_sglang(argv: list[str]) -> dict[str, Any]:
    server_args = _sglang()
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    sa = server_args.prepare_server_args([*argv[3:], "--device", "cuda"])
    sa.resolve_once()
    resolved: dict[str, Any] = sa.resolved_dict()
    return resolved


@pytest.mark.parametrize("plan", list(PLANS))
def test_sglang_resolves_the_plan(plan: str, stubs: dict[str, str], tmp_path: Path) -> None:
    ex = _export(plan, "sglang", stubs, tmp_path)
    r = _resolve_sglang(ex.argv(tmp_path))
    table = PLANS[plan]
    m = max(b.batch[1] for b in table.buckets)
    assert r["tp_size"] == table.tp
    assert r["max_running_requests"] == m  # not SGLang's speculative default of 48
    args = ex.config["server_args"]
    assert r["speculative_algorithm"] == args["speculative_algorithm"] == "EAGLE3"
    assert r["speculative_draft_model_path"] == stubs[table.drafter]
    for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
        assert r[k] == args[k], k
    adaptive = ex.config["adaptive"]
    assert r["speculative_adaptive"] is (adaptive is not None)  # never silently disabled
    graphs = r["cuda_graph_config"]["decode"]["bs"]
    assert max(graphs) == ex.config["cuda_graph_max_bs_decode"]
    want = planned_lengths(table, "sglang")
    if adaptive is None:
        on = {k for k in want[1:] if k}
        assert on == {args["speculative_num_steps"]}  # one static setting
        return
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    assert "strategy" not in json.loads((tmp_path / "sglang_adaptive.json").read_text())
    params = AdaptiveSpeculativeParams(r["speculative_num_steps"], r["speculative_adaptive_config"])
    params.set_cuda_graph_bs(graphs)
    got = [0] + [params.get_steps_for_batch(x) for x in range(1, m + 1)]
    assert got == want


def test_sglang_falls_back_to_static_with_adaptive_tree(
    stubs: dict[str, str], tmp_path: Path
) -> None:
    """What the judge catches: adaptive with top-k > 1 resolves to static parameters, and the
    exporter's own check refuses it."""
    from spectune.planner.export import check_sglang
    from spectune.specs.errors import SpecError

    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [5]}, "64": {"candidate_steps": [0]}}))
    argv = ["python", "-m", "sglang.launch_server", "--model-path", stubs["llama-3.1-8b"]]
    argv += ["--speculative-algorithm", "EAGLE3"]
    argv += ["--speculative-draft-model-path", stubs["eagle3-llama-3.1-8b"]]
    argv += ["--speculative-num-steps", "5", "--speculative-eagle-topk", "4"]
    argv += ["--speculative-num-draft-tokens", "8", "--speculative-adaptive"]
    argv += ["--speculative-adaptive-config", str(cfg)]
    r = _resolve_sglang(argv)
    assert r["speculative_adaptive"] is False
    assert r["max_running_requests"] == 48  # unset: SGLang's speculative default
    args = {
        "speculative_num_steps": 5,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8,
    }
    with pytest.raises(SpecError, match=r"top-k 1|topk 1"):
        check_sglang(args, {"1": {"candidate_steps": [5]}})


def test_sglang_rejects_preset_names(stubs: dict[str, str]) -> None:
    """The bug the Hugging Face ids fix: a spectune preset name is no checkpoint."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", stubs["llama-3.1-8b"]]
    argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"]
    argv += ["eagle3-llama-3.1-8b-not-a-folder", "--speculative-num-steps", "3"]
    argv += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    with pytest.raises(Exception):  # noqa: B017 - any error of SGLang's config code
        _resolve_sglang(argv)


# ---- vLLM -----------------------------------------------------------------------------------


def _vllm_config(argv: list[str]) -> Any:
    _installed("vllm")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert argv[:2] == ["vllm", "serve"]
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", argv[2], *argv[3:], "--skip-tokenizer-init"])
    return EngineArgs.from_cli_args(ns).create_engine_config()


@pytest.mark.parametrize("plan", list(PLANS))
def test_vllm_resolves_the_plan(plan: str, stubs: dict[str, str], tmp_path: Path) -> None:
    ex = _export(plan, "vllm", stubs, tmp_path)
    table = PLANS[plan]
    m = max(b.batch[1] for b in table.buckets)
    cfg = _vllm_config(ex.argv(tmp_path))
    assert cfg.parallel_config.tensor_parallel_size == table.tp
    assert cfg.scheduler_config.max_num_seqs == m
    sc = cfg.speculative_config
    want = planned_lengths(table, "vllm")
    assert sc.method == "eagle3"
    assert sc.model == stubs[table.drafter]
    assert sc.num_speculative_tokens == max(want)
    if sc.num_speculative_tokens_per_batch_size is None:
        assert set(want[1:]) == {max(want)}
        return
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    dense = build_dynamic_sd_schedule_lookup(
        sc.num_speculative_tokens_per_batch_size, m, sc.num_speculative_tokens
    )
    assert dense[1:] == want[1:]  # K per batch size, 0 where the plan is off


def test_vllm_rejects_what_it_cannot_run(stubs: dict[str, str]) -> None:
    """vLLM 0.33's own config code refuses a token tree and spectune preset names."""
    base = ["vllm", "serve", stubs["llama-3.1-8b"]]
    tree = {
        "method": "eagle3",
        "model": stubs["eagle3-llama-3.1-8b"],
        "num_speculative_tokens": 2,
        "speculative_token_tree": "[(0,),(1,),(0,0)]",
    }
    with pytest.raises(Exception, match="speculative_token_tree"):
        _vllm_config([*base, "--speculative-config", json.dumps(tree)])
    name = {"method": "eagle3", "model": "eagle3-llama-3.1-8b", "num_speculative_tokens": 3}
    with pytest.raises(Exception, match=r"eagle3-llama-3\.1-8b"):
        _vllm_config([*base, "--speculative-config", json.dumps(name)])


# ---- TensorRT-LLM: a field-for-field schema of llm_args.py (commit 0004396) ---------------------

# DecodingBaseConfig, EagleDecodingConfig and Eagle3DecodingConfig fields (name -> type check).
_INT = (int,)
TRTLLM_EAGLE3_FIELDS: dict[str, Any] = {
    # DecodingBaseConfig
    "max_draft_len": _INT,
    "max_total_draft_tokens": _INT,
    "speculative_model": (str,),
    "speculative_model_dir": (str,),  # validation alias of speculative_model
    "max_concurrency": _INT,
    "draft_len_schedule": (dict,),
    "load_format": (str,),
    "acceptance_rate_window_size": _INT,
    "acceptance_rate_threshold": (float, int),
    "use_rejection_sampling": (bool,),
    "allow_advanced_sampling": (bool,),
    "advanced_sampling_mode": (str,),
    "enable_penalty": (bool,),
    # EagleDecodingConfig
    "decoding_type": (str,),
    "eagle_choices": (list,),
    "greedy_sampling": (bool,),
    "posterior_threshold": (float,),
    "use_dynamic_tree": (bool,),
    "dynamic_tree_max_topK": _INT,
    "num_eagle_layers": _INT,
    "max_non_leaves_per_layer": _INT,
    "eagle3_one_model": (bool,),
    "eagle3_layers_to_capture": (list,),
    "eagle3_model_arch": (str,),
    # Eagle3DecodingConfig
    "sa_config": (dict,),
}


def trtllm_validate(spec: dict[str, Any], profile: str) -> None:
    """llm_args.py's checks for an Eagle3 config (StrictBaseModel: no unknown keys)."""
    prof = load_engine(profile)
    for k, v in spec.items():
        assert k in TRTLLM_EAGLE3_FIELDS, f"unknown speculative_config key {k!r}"
        assert isinstance(v, TRTLLM_EAGLE3_FIELDS[k]), (k, v)
    assert spec["decoding_type"] == "Eagle3"
    assert spec.get("speculative_model") or spec.get("speculative_model_dir")
    d = spec["max_draft_len"]
    assert d > 0  # validate_eagle_config
    sched = spec.get("draft_len_schedule")
    if sched:  # validate_draft_len_schedule_and_sort
        assert all(k >= 1 and v >= 0 for k, v in sched.items())
        assert sched[min(sched)] == d and max(sched.values()) <= d
    if "eagle_choices" in spec:
        assert prof.static_tree_choices, "eagle_choices is gone in 1.4"
        assert not spec.get("use_dynamic_tree")
    if spec.get("use_dynamic_tree"):
        k = spec["dynamic_tree_max_topK"]
        assert k > 0 and d <= spec["max_total_draft_tokens"] <= k * d


def trtllm_lengths(spec: dict[str, Any] | None, profile: str, m: int) -> list[int]:
    """Draft length per batch size 1..m the way the profile's TensorRT-LLM reads the schedule."""
    if spec is None:
        return [0] * (m + 1)
    prof = load_engine(profile)
    sched = spec.get("draft_len_schedule")
    out = [0]
    for x in range(1, m + 1):
        if not sched:
            out.append(spec["max_draft_len"])
        elif prof.schedule == "upper-bound":
            out.append(next((v for k, v in sorted(sched.items()) if x <= k), 0))
        else:
            out.append(sched[max(k for k in sched if k <= x)])
    return out


@pytest.mark.parametrize("profile", ["trtllm", "trtllm-1.4"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_trtllm_yaml_matches_the_schema_and_plan(
    plan: str, profile: str, stubs: dict[str, str], tmp_path: Path
) -> None:
    ex = _export(plan, profile, stubs, tmp_path)
    doc = yaml.safe_load((tmp_path / "trtllm_extra_llm_api_options.yaml").read_text())
    assert doc == ex.config
    table = PLANS[plan]
    m = max(b.batch[1] for b in table.buckets)
    assert doc["tensor_parallel_size"] == table.tp and doc["max_batch_size"] == m
    spec = doc.get("speculative_config")
    if spec is not None:
        trtllm_validate(spec, profile)
        assert spec["speculative_model"] == stubs[table.drafter]
    got = trtllm_lengths(spec, profile, m)
    want = planned_lengths(table, profile)
    assert got == want
    assert to_yaml(doc)  # round-trips through the hand-written writer
    assert "--extra_llm_api_options" in ex.launch


# ---- plans made with `spectune plan --engine X`: exported as planned, judged exactly ----------

PLAN_ARGS = ["--trials", "12", "--batch-edges", "1,8,64,256", "--context-edges", "4096,32768"]


@pytest.fixture(scope="module")
def engine_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PolicyTable]:
    """`spectune plan --engine X` for each engine (small: 8 buckets, 12 trials each)."""
    from spectune.cli import main

    root = tmp_path_factory.mktemp("plans")
    out = {}
    for engine in ("sglang", "vllm", "trtllm"):
        path = root / f"{engine}.json"
        assert main(["plan", "--engine", engine, *PLAN_ARGS, "--quiet", "--out", str(path)]) == 0
        out[engine] = PolicyTable.load(path)
        assert out[engine].provenance["engine_plan"]["config"]  # the choice is recorded
    return out


def _per_batch(table: PolicyTable) -> list[TreePolicy | None]:
    """The policy of every batch size 1..max (index 0 unused); one per batch range at every
    context (what an engine plan holds)."""
    out: list[TreePolicy | None] = [None]
    per_range = {b.batch: b.policy for b in table.buckets}
    assert all(per_range[b.batch] == b.policy for b in table.buckets)  # no context dimension
    for (lo, hi), p in sorted(per_range.items()):
        out += [p] * (hi - lo + 1)
    return out


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_engine_plans_export_exactly(
    engine: str, engine_plans: dict[str, PolicyTable], stubs: dict[str, str], tmp_path: Path
) -> None:
    """An engine plan's export loses nothing (no approximation notes, also with the objective
    that would refit it), and the engine's own config code resolves exactly the plan: steps,
    top-k and draft tokens for every batch size (SGLang), K per batch (vLLM), draft length per
    batch and the tree limits (TensorRT-LLM), and the caps."""
    from spectune.planner.export import export_table

    table = engine_plans[engine]
    paths = {"model_path": stubs[table.target], "draft_model_path": stubs[table.drafter]}
    ex, note = export_table(table, engine, **paths)
    assert note == "" and ex.approximations == (), ex.approximations
    ex.write(tmp_path)
    want = _per_batch(table)
    m = len(want) - 1
    lengths = [0] + [0 if p is None else p.depth for p in want[1:]]
    on = [p for p in want[1:] if p is not None]
    if engine == "sglang":
        r = _resolve_sglang(ex.argv(tmp_path))
        assert r["max_running_requests"] == m and r["tp_size"] == table.tp
        if r["speculative_adaptive"]:
            from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

            assert all(p.topk == 1 for p in on)
            params = AdaptiveSpeculativeParams(
                r["speculative_num_steps"], r["speculative_adaptive_config"]
            )
            params.set_cuda_graph_bs(r["cuda_graph_config"]["decode"]["bs"])
            assert [0] + [params.get_steps_for_batch(x) for x in range(1, m + 1)] == lengths
        else:
            (p,) = set(want[1:])  # one static setting
            assert p is not None
            got = (
                r["speculative_num_steps"],
                r["speculative_eagle_topk"],
                r["speculative_num_draft_tokens"],
            )
            assert got == (p.depth, p.topk, p.budget)
    elif engine == "vllm":
        cfg = _vllm_config(ex.argv(tmp_path))
        assert cfg.scheduler_config.max_num_seqs == m
        sc = cfg.speculative_config
        assert all(p.topk == 1 for p in on) and sc.num_speculative_tokens == max(lengths)
        if sc.num_speculative_tokens_per_batch_size is None:
            assert set(lengths[1:]) == {max(lengths)}
        else:
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

            dense = build_dynamic_sd_schedule_lookup(
                sc.num_speculative_tokens_per_batch_size, m, sc.num_speculative_tokens
            )
            assert dense[1:] == lengths[1:]
    else:
        doc = yaml.safe_load((tmp_path / "trtllm_extra_llm_api_options.yaml").read_text())
        assert doc["max_batch_size"] == m
        spec = doc["speculative_config"]
        trtllm_validate(spec, engine)
        assert trtllm_lengths(spec, engine, m) == lengths
        shapes = {(p.topk, p.budget) for p in on}
        assert len(shapes) == 1
        ((topk, tokens),) = shapes
        if topk > 1:
            assert spec["dynamic_tree_max_topK"] == topk
            assert spec["max_total_draft_tokens"] == tokens - 1
