"""The command line under hostile input: every numeric option has a range (non-finite, out of
range and non-numbers are one-line errors naming the option, exit 2; the ends of the range
parse), every subcommand checks its output paths before any work and leaves nothing behind,
writes keep an existing file's mode, secrets never reach output or a command line, and the CI
gate fails on bad documents."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from spectune.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENT = ROOT / "measurements" / "h200" / "execute-static.json"
TRACE = ROOT / "data" / "traces" / "smollm2-mtbench.jsonl.gz"
ENGINE_LOG = ROOT / "tests" / "data" / "engines" / "vllm-0.33.0.log"
FIT_ENGINE = ("fit-engine", str(ENGINE_LOG), "--engine", "vllm", "--target", "llama-3.1-8b",
              "--drafter", "eagle3-llama-3.1-8b", "--gpu", "h100-sxm")  # fmt: skip


def _suite() -> Any:
    """benchmarks/hostile_suite.py, whose NUMERIC table is the one statement of every numeric
    option's range (the suite fuzzes it, these tests check each option against it)."""
    spec = importlib.util.spec_from_file_location(
        "hostile_suite", ROOT / "benchmarks" / "hostile_suite.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hostile_suite", module)
    spec.loader.exec_module(module)
    return module


# The suite's placeholders as names that need not exist: argparse refuses the value first.
_NAMES = {"POLICY": "p.json", "TRACE": "t.jsonl", "OUT": "o.json"}
# (command, option, kind, lo, hi, arguments that make the rest of the command line valid)
OPTIONS: list[tuple[str, str, str, float, float, tuple[str, ...]]] = [
    (c, o, k, lo, hi, tuple(_NAMES.get(a, a) for a in pre))
    for c, o, k, lo, hi, pre in _suite().NUMERIC
]


def _bad(kind: str, lo: float, hi: float) -> list[str]:
    integer = kind.startswith("int")
    vals = ["nan", "inf", "-inf", "abc", "", "9" * 400 if integer else "1e400"]
    if integer:
        vals += [str(int(lo) - 1), str(int(hi) + 1), "2.5"]
    else:
        vals += [repr(lo) if kind.endswith("+") else repr(lo - 1e-3), repr(hi * 2 + 1)]
    if kind in ("ints", "floats", "floats+"):
        vals += ["1,nan", ",".join(["1"] * 65)]
    return vals


def _ids() -> list[str]:
    return [f"{c} {o}" for c, o, *_ in OPTIONS]


def test_every_numeric_option_has_a_range() -> None:
    """No option of any subcommand takes a bare int or float: each has a range type."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    covered = {(c, o) for c, o, *_ in OPTIONS}
    for name, p in sub.choices.items():  # type: ignore[union-attr]
        for a in p._actions:
            if a.type in (int, float):
                raise AssertionError(f"{name} {a.option_strings}: a numeric option without a range")
            if getattr(a.type, "__name__", "") in (
                "integer",
                "number",
                "integer list",
                "number list",
            ):
                assert (name, a.option_strings[-1]) in covered, (name, a.option_strings)


@pytest.mark.parametrize("command,option,kind,lo,hi,prefix", OPTIONS, ids=_ids())
def test_option_range(
    command: str,
    option: str,
    kind: str,
    lo: float,
    hi: float,
    prefix: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    for value in _bad(kind, lo, hi):
        assert main([command, *prefix, f"{option}={value}"]) == 2, value
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and option in err and "Traceback" not in err, err
    parser = build_parser()
    for value in (lo if not kind.endswith("+") else hi / 2, hi):
        text = str(int(value)) if kind.startswith("int") else repr(float(value))
        args = parser.parse_args([command, *prefix, f"{option}={text}"])
        got = getattr(args, option.lstrip("-").replace("-", "_"))
        assert (got[0] if isinstance(got, list) else got) == pytest.approx(value)


# ---- output paths -----------------------------------------------------------------------------
def _forbid_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heavy steps of each command raise: a bad output path must stop a command first."""

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("work started before the output path was checked")

    import spectune.cli.plan as plan
    import spectune.simulator as simulator
    import spectune.traces.fit as traces_fit
    import spectune.validate.engine_points as engine_points
    import spectune.validate.fit as validate_fit

    monkeypatch.setattr(engine_points, "points_from_files", boom)
    monkeypatch.setattr(plan, "build_scorer", boom)
    monkeypatch.setattr(simulator, "simulate", boom)
    monkeypatch.setattr(traces_fit, "load_traces", boom)
    monkeypatch.setattr(validate_fit, "fit_calibration", boom)
    monkeypatch.setattr("spectune.specs.policy.PolicyTable.load", boom)


def _commands(tmp_path: Path, out: str) -> dict[str, list[str]]:
    run = tmp_path / "run.json"
    shutil.copy(ROOT / "measurements" / "h200" / "calibrate-run.json", run)
    ok = str(tmp_path / "fine.json")
    return {
        "plan": ["plan", "--trials", "2", "--quiet", "--out", out],
        "execute": ["execute", "--policy", "dynamic-topk:5,4,8", "--out", out],
        "calibrate": ["calibrate", "--from-run", str(run), "--out", out],
        "calibrate --raw-out": ["calibrate", "--raw-out", out, "--out", ok],
        "fit-workload": ["fit-workload", str(TRACE), "--out", out],
        "fit-engine": [*FIT_ENGINE, "--out", out],
        "simulate": ["simulate", "--requests", "5", "--quiet", "--chrome-trace", out],
        "record-traces": ["record-traces", "mt-bench", "--out", out],
        "record-traces --samples": ["record-traces", "mt-bench", "--out", ok, "--samples", out],
    }


BAD_OUTS = ["a-folder", "under-a-file", "long-name", "empty", "sysfs"]


def _bad_out(tmp_path: Path, what: str) -> str:
    (tmp_path / "a-folder").mkdir(exist_ok=True)
    (tmp_path / "a-file").write_text("x")
    return {
        "a-folder": str(tmp_path / "a-folder"),
        "under-a-file": str(tmp_path / "a-file" / "out.json"),
        "long-name": str(tmp_path / ("n" * 300 + ".json")),
        "empty": "",
        "sysfs": "/sys/spectune-test.json" if os.path.isdir("/sys") else "",
    }[what]


@pytest.mark.parametrize("what", BAD_OUTS)
@pytest.mark.parametrize(
    "name",
    [
        "plan",
        "execute",
        "calibrate",
        "calibrate --raw-out",
        "fit-workload",
        "fit-engine",
        "simulate",
        "record-traces",
        "record-traces --samples",
    ],
)
def test_bad_output_path_fails_before_the_work(
    name: str,
    what: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if what == "sysfs" and not os.path.isdir("/sys"):
        pytest.skip("no /sys here")
    _forbid_work(monkeypatch)
    out = _bad_out(tmp_path, what)
    argv = _commands(tmp_path, out)[name]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert any(o in err for o in ("--out", "--raw-out", "--samples", "--chrome-trace", "torch"))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("what", ["a-file", "under-a-file", "long-name", "empty"])
def test_export_bad_output_folder(
    what: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _forbid_work(monkeypatch)
    out = {"a-file": "a-file"}.get(what) or _bad_out(tmp_path, what)
    if what == "a-file":
        (tmp_path / "a-file").write_text("x")
        out = str(tmp_path / "a-file")
    policy = ROOT / "measurements" / "h200" / "policy-planned.json"
    assert main(["export", str(policy), "--engine", "sglang", "--out", out]) == 2
    assert "--out" in capsys.readouterr().err


def test_failed_fit_leaves_no_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fit-workload writes its file last: a failure in the check leaves none behind."""
    import spectune.traces.fit as traces_fit

    def fail(*_a: Any, **_k: Any) -> float:
        raise traces_fit.SpecError("check failed")

    monkeypatch.setattr(traces_fit, "predicted_tokens", fail)
    out = tmp_path / "w.json"
    assert main(["fit-workload", str(TRACE), "--out", str(out), "--budgets", "8"]) == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_writes_keep_the_mode_and_leave_nothing_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spectune.specs import SpecError
    from spectune.specs.io import write_json_atomic, write_text_atomic

    path = tmp_path / "secret.json"
    path.write_text("{}")
    path.chmod(0o600)
    write_json_atomic(path, {"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(SpecError, match=r"secret\.json"):
        write_json_atomic(path, {"a": float("nan")})

    def fail(*_a: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write_text_atomic(path, "new")
    assert path.read_text() == '{\n  "a": 1\n}\n' and [p.name for p in tmp_path.iterdir()] == [
        "secret.json"
    ]


# ---- secrets ----------------------------------------------------------------------------------
SECRET = "hunter2-s3cret"


def test_mask_secrets() -> None:
    from spectune.specs.errors import mask_secrets

    for text in (
        f"postgresql://user:{SECRET}@db:5432/x",
        f"postgresql+psycopg2://u:{SECRET}@h/x and more",
        f"mysql://u:p@{SECRET}@h/x",
        f"sqlite:////x.db?password={SECRET}&a=1",
    ):
        assert SECRET not in mask_secrets(text) and "***" in mask_secrets(text)
    assert mask_secrets("http://host:8501/page") == "http://host:8501/page"


def test_storage_password_is_masked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://user:{SECRET}@127.0.0.1:1/db"
    out = str(tmp_path / "p.json")
    assert main(["plan", "--trials", "2", "--quiet", "--out", out, "--storage", url]) == 2
    assert main(["worker", "--study", "x", "--storage", url]) == 2
    captured = capsys.readouterr()
    assert SECRET not in captured.err + captured.out and "***" in captured.err


def test_workers_get_the_storage_url_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spectune.cli.plan as plan

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def popen(cmd: list[str], env: dict[str, str] | None = None, **_k: Any) -> Any:
        seen["cmd"], seen["env"] = cmd, env
        raise Stop

    monkeypatch.setattr(plan.subprocess, "Popen", popen)
    url = f"sqlite:///{tmp_path / 'study.db'}?password={SECRET}"
    with pytest.raises(Stop):
        main(["plan", "--trials", "2", "--quiet", "--workers", "2", "--storage", url,
              "--out", str(tmp_path / "p.json"), "--batch-edges", "1", "--context-edges", "4096"])  # fmt: skip
    assert not any(SECRET in a or "sqlite" in a for a in seen["cmd"])
    assert seen["env"]["SPECTUNE_STORAGE"] == url


# ---- the gate and the simulator's bounds ------------------------------------------------------
def _measurement_folder(tmp_path: Path, change: Any) -> Path:
    doc = json.loads(MEASUREMENT.read_text())
    text = change(doc)
    (tmp_path / "m.json").write_text(text if isinstance(text, str) else json.dumps(text))
    return tmp_path


@pytest.mark.parametrize(
    "what,change",
    [
        ("nan speedups", lambda d: json.dumps(d).replace('"speedup": 2.', '"speedup": NaN, "x": 2.', 11)),
        ("no runs", lambda d: {**d, "runs": []}),
        ("missing hardware", lambda d: {k: v for k, v in d.items() if k != "hardware"}),
        ("zero speedup", lambda d: {**d, "runs": [{**r, "speedup": 0} for r in d["runs"]]}),
        ("zero step", lambda d: {**d, "runs": [{**r, "phases_ms": {**r["phases_ms"], "step": 0.0}} for r in d["runs"]]}),
        ("bad policy", lambda d: {**d, "runs": [{**r, "policy": {"builder": "static", "depth": 2, "x": 1}} for r in d["runs"]]}),
    ],
)  # fmt: skip
def test_gate_refuses_bad_documents(
    what: str, change: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _measurement_folder(tmp_path, change)
    assert main(["check", str(folder)]) == 2, what
    err = capsys.readouterr().err.strip()
    assert "m.json" in err and "\n" not in err


def test_gate_fails_a_non_finite_prediction() -> None:
    from spectune.validate.check import CheckResult, Row

    res = CheckResult(speedup=[Row("f", "w", float("nan"), 1.0), Row("f", "w", 1.0, 1.0)], files=1)
    assert not res.passed(0.1, 0.1)


def test_simulation_size_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    from spectune.simulator.config import MAX_REQUESTS

    assert main(["simulate", "--requests", str(MAX_REQUESTS + 1)]) == 2
    assert main(["simulate", "--requests", "1000000000"]) == 2
    assert main(["simulate", "--qps", "inf"]) == 2
    assert "--requests" in capsys.readouterr().err
