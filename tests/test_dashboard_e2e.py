"""End to end: `spectune dashboard` serves the app, headless Chromium opens it, the What-if page
renders (its metrics and figures are in the page), and a screenshot of it is not blank.

Chromium is Debian's `chromium` package (scripts/setup.d/chromium.sh installs it). Under CI a
missing browser fails the test; elsewhere it skips. The browser is driven over the DevTools
protocol (websockets, a Streamlit dependency) rather than with --screenshot alone: Streamlit
draws the page from messages on a websocket after the load event, and --screenshot with
--virtual-time-budget captures before they arrive (a blank page).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("PIL")

CHROMIUM = os.environ.get("SPECTUNE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--hide-scrollbars",
)
# The What-if page has rendered when its four metrics and its three figures are in the page,
# every image has loaded, and no exception box is shown.
RENDERED_JS = """(() => {
  const metrics = document.querySelectorAll('[data-testid="stMetricValue"]').length;
  const imgs = Array.from(document.querySelectorAll('[data-testid="stImage"] img, [data-testid="stImageContainer"] img'));
  const errors = document.querySelectorAll('[data-testid="stException"]').length;
  const title = Array.from(document.querySelectorAll('h1')).some(h => h.textContent.includes('What-if'));
  return JSON.stringify({metrics, imgs: imgs.length, loaded: imgs.every(i => i.complete && i.naturalWidth > 0), errors, title});
})()"""


def _chromium() -> str:
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    reason = f"{CHROMIUM} is missing; run scripts/setup.d/chromium.sh (as root) to install it"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return str(r.read().decode())
        except OSError as e:
            last = str(e)
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout_s} s ({last})")


class DevTools:
    """A minimal Chrome DevTools protocol client on one page target (a websocket)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:  # skip events until the answer to this call
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == i:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))


def _page_ws(profile: Path, browser: subprocess.Popen[bytes]) -> str:
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not port_file.is_file() or not port_file.read_text().strip():
        if browser.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("chromium did not open its DevTools port")
        time.sleep(0.2)
    port = int(port_file.read_text().split()[0])
    targets = json.loads(_wait_http(f"http://127.0.0.1:{port}/json/list", 20, browser))
    page = next(t for t in targets if t.get("type") == "page")
    return str(page["webSocketDebuggerUrl"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _render_and_capture(devtools: DevTools, port: int, tmp_path: Path) -> Path:
    """Open the app, wait until the What-if page has rendered, save a screenshot."""
    devtools.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
    devtools.call("Page.enable")
    devtools.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
    state: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        res = devtools.call("Runtime.evaluate", expression=RENDERED_JS, returnByValue=True)
        state = json.loads(res["result"]["value"])
        if state["title"] and state["metrics"] >= 4 and state["imgs"] >= 3 and state["loaded"]:
            break
        time.sleep(0.5)
    assert state.get("errors") == 0, state
    assert state.get("metrics", 0) >= 4 and state.get("imgs", 0) >= 3 and state.get("loaded"), (
        f"the What-if page did not render: {state}; server log: "
        f"{(tmp_path / 'dashboard.log').read_text(errors='replace')[-2000:]}"
    )
    time.sleep(1.0)  # let the last paint settle
    shot = devtools.call("Page.captureScreenshot", format="png")
    png = tmp_path / "whatif.png"
    png.write_bytes(base64.b64decode(shot["data"]))
    keep = os.environ.get("SPECTUNE_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / "whatif.png")
    return png


def test_dashboard_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser_bin = _chromium()
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(
        [sys.executable, "-m", "spectune", "dashboard", "--port", str(port),
         "--measurements", str(tmp_path / "measurements"), "--benchmarks", str(tmp_path / "bench")],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    profile = tmp_path / "chromium-profile"
    browser: subprocess.Popen[bytes] | None = None
    try:
        assert _wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90, server).strip() == "ok"
        browser = subprocess.Popen(
            [browser_bin, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        from websockets.sync.client import connect

        with connect(_page_ws(profile, browser), max_size=None, open_timeout=20) as ws:
            png = _render_and_capture(DevTools(ws), port, tmp_path)
    finally:
        if browser is not None:
            _stop(browser)
        _stop(server)
        log.close()

    from PIL import Image

    with Image.open(png) as im:
        assert im.size == (1400, 1000)
        pixels = np.asarray(im.convert("L"), dtype=np.float64)
    non_white = float((pixels < 240).mean())
    assert pixels.std() > 10.0, f"screenshot looks blank (pixel std {pixels.std():.1f})"
    assert non_white > 0.03, f"screenshot looks blank ({100 * non_white:.1f}% non-white pixels)"
