"""The command dispatcher: every subcommand is listed, bad input exits 2, and a command whose
optional dependency is missing explains itself without breaking the others."""

from __future__ import annotations

import subprocess
import sys

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
