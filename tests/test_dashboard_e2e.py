"""End to end: `spectune dashboard` serves the app, headless Chromium opens it, the What-if page
renders (its metrics and figures are in the page), and a screenshot of it is not blank; and a
policy file from `spectune plan`, loaded on the Planner page and opened in What-if, shows the
same served tok/s in all three places.

Chromium is Debian's `chromium` package (scripts/setup.d/chromium.sh installs it). Under CI a
missing browser fails the test; elsewhere it skips. The browser is driven over the DevTools
protocol (websockets, a Streamlit dependency) rather than with --screenshot alone: Streamlit
draws the page from messages on a websocket after the load event, and --screenshot with
--virtual-time-budget captures before they arrive (a blank page).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
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


@contextlib.contextmanager
def _browser_on_app(tmp_path: Path) -> Iterator[tuple[DevTools, int]]:
    """`spectune dashboard` on a free port and headless Chromium attached over DevTools."""
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
            yield DevTools(ws), port
    finally:
        if browser is not None:
            _stop(browser)
        _stop(server)
        log.close()


def test_dashboard_renders_in_headless_chromium(tmp_path: Path) -> None:
    with _browser_on_app(tmp_path) as (devtools, port):
        png = _render_and_capture(devtools, port, tmp_path)

    from PIL import Image

    with Image.open(png) as im:
        assert im.size == (1400, 1000)
        pixels = np.asarray(im.convert("L"), dtype=np.float64)
    non_white = float((pixels < 240).mean())
    assert pixels.std() > 10.0, f"screenshot looks blank (pixel std {pixels.std():.1f})"
    assert non_white > 0.03, f"screenshot looks blank ({100 * non_white:.1f}% non-white pixels)"


# Every metric of the page as {label: value} (labels and values as the browser shows them).
METRICS_JS = """(() => {
  const out = {};
  document.querySelectorAll('[data-testid="stMetric"]').forEach(m => {
    const label = m.querySelector('[data-testid="stMetricLabel"]');
    const value = m.querySelector('[data-testid="stMetricValue"]');
    if (label && value) out[label.innerText.trim()] = value.innerText.trim();
  });
  const errors = document.querySelectorAll('[data-testid="stException"]').length;
  const title = Array.from(document.querySelectorAll('h1')).map(h => h.innerText.trim());
  return JSON.stringify({metrics: out, errors, title});
})()"""


def _page_state(devtools: DevTools) -> dict[str, Any]:
    res = devtools.call("Runtime.evaluate", expression=METRICS_JS, returnByValue=True)
    return dict(json.loads(res["result"]["value"]))


def _wait_for_metrics(devtools: DevTools, title: str, labels: list[str]) -> dict[str, str]:
    """The page's metrics once the page titled `title` shows every label (and no exception)."""
    state: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = _page_state(devtools)
        assert state["errors"] == 0, state
        if title in state["title"] and all(k in state["metrics"] for k in labels):
            return dict(state["metrics"])
        time.sleep(0.5)
    raise AssertionError(f"{title}: metrics {labels} did not appear: {state}")


def _click(devtools: DevTools, selector: str, text: str) -> None:
    """Click the element matching `selector` whose text is `text` (waits for it)."""
    js = f"""(() => {{
      const el = Array.from(document.querySelectorAll({json.dumps(selector)}))
        .find(e => e.innerText.trim() === {json.dumps(text)});
      if (!el) return false;
      el.click();
      return true;
    }})()"""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if devtools.call("Runtime.evaluate", expression=js, returnByValue=True)["result"]["value"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"no {selector} reading {text!r}")


def _upload(devtools: DevTools, uploader_label: str, path: Path) -> None:
    """Give the file input of the uploader labelled `uploader_label` a file (as a user picking
    it in the file dialog would)."""
    js = f"""(() => Array.from(document.querySelectorAll('[data-testid="stFileUploader"]'))
      .find(u => u.innerText.includes({json.dumps(uploader_label)}))
      ?.querySelector('input[type=file]') ?? null)()"""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = devtools.call("Runtime.evaluate", expression=js)["result"]
        if found.get("objectId"):
            devtools.call("DOM.setFileInputFiles", files=[str(path)], objectId=found["objectId"])
            return
        time.sleep(0.5)
    raise AssertionError(f"no file uploader labelled {uploader_label!r}")


def test_planner_what_if_and_cli_show_the_same_tokens_per_s(tmp_path: Path) -> None:
    """One scenario (Llama-3.1-8B + EAGLE-3 on H100, MT-Bench; one bucket: batch 1-8, context
    0-4096): the served tok/s `spectune plan` writes to the policy file is what the Planner
    page shows for that bucket, in the file and predicted there, and what What-if shows for it,
    opened from the Planner; What-if's served tok/s at batch 8 is the planner's objective."""
    from spectune.dashboards import data
    from spectune.specs import PolicyTable

    policy = tmp_path / "policy.json"
    cli = subprocess.run(
        [sys.executable, "-m", "spectune", "plan", "--batch-edges", "8", "--context-edges", "4096",
         "--trials", "4", "--out", str(policy), "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    table = PolicyTable.load(policy)
    (bucket,) = table.buckets
    want = f"{bucket.predicted.tokens_per_s:,.0f}"
    served = data.SERVED_TOK_S
    at_8 = data.bucket_score(table.scenario, bucket.policy, bucket.batch, bucket.context)
    assert at_8.points[-1] == (8, 2048)

    with _browser_on_app(tmp_path) as (devtools, port):
        devtools.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                      deviceScaleFactor=1, mobile=False)  # fmt: skip
        devtools.call("Page.enable")
        devtools.call("Page.navigate", url=f"http://127.0.0.1:{port}/planner")
        _click(devtools, '[data-testid="stRadio"] label', "Load a policy file")
        _upload(devtools, "Policy file", policy)
        labels = [data.BUCKET_SCORE_FILE, data.BUCKET_SCORE_HERE]
        planner = _wait_for_metrics(devtools, "Planner", labels)
        _click(devtools, "button", "Open this bucket in What-if")
        whatif = _wait_for_metrics(devtools, "What-if", [*labels, served])

    assert planner[labels[0]] == want and planner[labels[1]] == want
    assert whatif[labels[0]] == want and whatif[labels[1]] == want
    assert whatif[served] == f"{at_8.served_tokens_per_s[-1]:,.0f}"
    assert "tokens/s" not in whatif and "tokens/s" not in planner  # every figure names its kind
