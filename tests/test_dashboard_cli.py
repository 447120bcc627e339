"""`spectune dashboard`: the streamlit command it runs, and a clear error without the
`dashboard` extra (this file needs no streamlit)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from spectune.cli import build_parser, main
from spectune.cli import dashboard as cli_dashboard


def test_command_runs_the_app_headless() -> None:
    cmd = cli_dashboard.streamlit_command(8600, "127.0.0.1")
    assert cmd[1:5] == ["-m", "streamlit", "run", str(cli_dashboard.APP)]
    assert cli_dashboard.APP.is_file()
    for flag in ("--server.headless=true", "--server.port=8600", "--server.address=127.0.0.1",
                 "--browser.gatherUsageStats=false"):  # fmt: skip
        assert flag in cmd


def test_dashboard_is_a_subcommand() -> None:
    args = build_parser().parse_args(["dashboard", "--port", "9000"])
    assert args.port == 9000 and args.address == "127.0.0.1"


def test_missing_streamlit_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "streamlit" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(cli_dashboard.os, "execve", lambda *a: pytest.fail("must not start"))
    assert main(["dashboard"]) == 2
    err = capsys.readouterr().err
    assert "streamlit" in err and "pip install 'spectune[dashboard]'" in err


def test_bad_port_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


def test_folders_default_to_the_repository_not_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Without --measurements/--benchmarks the command sets no folder, so the dashboard
    resolves the repository's (dashboards.data.repo_path); given, they are made absolute."""
    if importlib.util.find_spec("streamlit") is None:
        pytest.skip("needs the dashboard extra")
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli_dashboard.os, "execve", lambda exe, cmd, env: seen.update(env=env))
    monkeypatch.delenv("SPECTUNE_MEASUREMENTS_DIR", raising=False)
    monkeypatch.delenv("SPECTUNE_BENCHMARKS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["dashboard"]) == 0
    assert "SPECTUNE_MEASUREMENTS_DIR" not in seen["env"]
    assert "SPECTUNE_BENCHMARKS_DIR" not in seen["env"]
    assert main(["dashboard", "--measurements", "m", "--benchmarks", "b"]) == 0
    assert seen["env"]["SPECTUNE_MEASUREMENTS_DIR"] == str(tmp_path / "m")
    assert seen["env"]["SPECTUNE_BENCHMARKS_DIR"] == str(tmp_path / "b")
