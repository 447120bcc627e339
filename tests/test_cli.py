"""The command dispatcher: every subcommand is listed, bad input exits 2, and a command whose
optional dependency is missing explains itself without breaking the others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spectune.cli import COMMAND_MODULES, build_parser, main


def test_every_command_module_is_registered() -> None:
    help_text = build_parser().format_help()
    for name in COMMAND_MODULES:
        assert name.replace("_", "-") in help_text


def test_bad_preset_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'h100'" in err and "h100-sxm" in err


def test_missing_optional_dependency_breaks_only_its_command() -> None:
    # Block optuna (the plan/worker search needs it) in a fresh interpreter.
    code = (
        "import sys; sys.modules['optuna'] = None\n"
        "from spectune.cli import main\n"
        "assert main(['presets', '--json']) == 0\n"
        "sys.exit(main(['plan']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs 'optuna'" in proc.stderr
    assert '"hardware"' in proc.stdout


def test_execute_bad_acceptance_trace_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trace is read and checked before any GPU work: a malformed one is a clear exit 2."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": "nope"}\n')
    assert main(["execute", "--policy", "dynamic-topk:5,4,8", "--acceptance-trace", str(bad)]) == 2
    assert "bad.jsonl" in capsys.readouterr().err


def test_trace_replay_drives_synthetic_acceptance() -> None:
    """A recorded trace's candidate banks load as the executor's synthetic acceptance tables."""
    torch = pytest.importorskip("torch")
    from spectune.executor.synthetic import SyntheticAcceptance
    from spectune.planner.acceptance import TraceReplay
    from spectune.specs.trace import read_trace

    path = Path(__file__).resolve().parent.parent / "data" / "traces" / "smollm2-mtbench.jsonl.gz"
    _, steps = read_trace(path)
    syn = SyntheticAcceptance(TraceReplay(steps), depth=4, topk=4, device="cpu")
    logc, acc, lo = syn.children(1, syn.draw_rows(1, (64,), "cpu"), 4)
    assert logc.shape == acc.shape == lo.shape == (64, 4)
    assert set(torch.unique(acc).tolist()) <= {0.0, 1.0}  # recorded 0/1 outcomes
    assert float(acc.sum(-1).max()) <= 1.0  # siblings are exclusive: at most one matches
    assert 0.0 < float(acc[:, 0].mean()) < 1.0


@pytest.mark.parametrize(
    "policy", ["dynamic-topk:5,4,8,echo", "dynamic-topk:6,8,32,0.05,8", "static:4,3,12,0.1,3,echo"]
)
def test_execute_takes_echo_and_graft_policies(
    policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ECHO and grafting policies are accepted: without a GPU the command stops only at the GPU
    check, not at the policy."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the command would run")
    out = str(tmp_path / "m.json")
    assert main(["execute", "--policy", policy, "--repeat", "2", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "ECHO" not in err and "graft" not in err


def test_calibrate_from_run_reports_bounds_and_what_the_data_determined(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    root = Path(__file__).resolve().parent.parent / "measurements" / "h200"
    out, report = tmp_path / "cal.json", tmp_path / "report.json"
    argv = ["calibrate", "--from-run", str(root / "calibrate-run.json"), "--out", str(out)]
    assert main([*argv, "--report", str(report)]) == 0
    text = capsys.readouterr().out
    assert "measured ceilings: copy 4.26 TB/s" in text and "determined" in text
    rep = json.loads(report.read_text())
    assert rep["bounds"]["gemm_emax"]["of_ceiling"] <= 1.0 + 1e-9
    assert set(rep["identified"]) >= {"determined", "at_bound", "weak", "rel_se"}


def test_calibrate_reports_the_kernel_classes_of_a_profiled_run(tmp_path: Path) -> None:
    """measurements/h100-newuser5's run carries each verify forward's kernel time by class
    (`spectune calibrate --kernel-classes`): the report prices them, the fit does not use them."""
    import json

    root = Path(__file__).resolve().parent.parent / "measurements" / "h100-newuser5"
    run = json.loads((root / "calibrate-run.json").read_text())
    assert all("linear_s" in r and "attention_s" in r for r in run["verify"])
    out, report = tmp_path / "cal.json", tmp_path / "report.json"
    argv = ["calibrate", "--from-run", str(root / "calibrate-run.json"), "--out", str(out)]
    assert main([*argv, "--report", str(report)]) == 0
    rep = json.loads(report.read_text())
    for kind in ("linear", "attention", "other"):
        assert rep[f"mape_verify_{kind}_after"] > 0
    # the same run without the class fields fits the same calibration
    bare = tmp_path / "bare-run.json"
    for r in run["verify"]:
        del r["linear_s"], r["attention_s"]
    bare.write_text(json.dumps(run))
    out_bare = tmp_path / "cal-bare.json"
    assert main(["calibrate", "--from-run", str(bare), "--out", str(out_bare)]) == 0
    fitted, plain = json.loads(out.read_text()), json.loads(out_bare.read_text())
    for key in ("weight_bw_efficiency", "attention_bw_efficiency", "elementwise_bw_efficiency"):
        assert fitted[key] == pytest.approx(plain[key])
