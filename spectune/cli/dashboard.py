"""`spectune dashboard`: start the Streamlit what-if app (spectune/dashboards/app.py).

Runs `python -m streamlit run` on the app, headless (no browser is opened, no usage statistics
are sent), on --address:--port. The Validation page reads measurement JSONs from
--measurements and the Kernels page benchmark results from --benchmarks (by default the
repository's measurements/ and benchmarks/results/, not the working directory's). Needs the
`dashboard` extra: pip install 'spectune[dashboard]'.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from spectune.cli.common import int_range
from spectune.specs.errors import SpecError

APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
MAX_UPLOAD_MB = 32


def require_streamlit() -> None:
    """SpecError with the install line when the `dashboard` extra is missing."""
    missing = [m for m in ("streamlit", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecError(
            f"the dashboard needs {' and '.join(missing)}, which come with the `dashboard` extra: "
            "pip install 'spectune[dashboard]'"
        )


def streamlit_command(port: int, address: str) -> list[str]:
    """The `streamlit run` command line for the app with headless settings."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={address}",
        f"--server.maxUploadSize={MAX_UPLOAD_MB}",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=minimal",
        "--theme.base=light",
    ]


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        raise SpecError(f"--port must be in 1..65535, got {args.port}")
    require_streamlit()
    env = dict(os.environ)
    # unset: the dashboard finds the repository's folders (dashboards.data.repo_path)
    if args.measurements is not None:
        env["SPECTUNE_MEASUREMENTS_DIR"] = str(Path(args.measurements).resolve())
    if args.benchmarks is not None:
        env["SPECTUNE_BENCHMARKS_DIR"] = str(Path(args.benchmarks).resolve())
    cmd = streamlit_command(args.port, args.address)
    print(f"spectune dashboard: http://{args.address}:{args.port}", file=sys.stderr, flush=True)
    # Replace this process, so that stopping it (Ctrl-C, a signal to its pid) stops the server.
    os.execve(sys.executable, cmd, env)
    return 0  # pragma: no cover - execve does not return


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard",
        help="start the Streamlit what-if dashboards (needs the `dashboard` extra)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--port", type=int_range(1, 65535), default=8501, help="port to serve on (default 8501)"
    )
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; 0.0.0.0 serves other machines)",
    )
    p.add_argument(
        "--measurements",
        default=None,
        help="folder of measurement JSONs for the Validation page (default: the repository's "
        "measurements/, wherever the command runs)",
    )
    p.add_argument(
        "--benchmarks",
        default=None,
        help="folder of kernel benchmark JSONs for the Kernels page (default: the repository's "
        "benchmarks/results/)",
    )
    p.set_defaults(func=run)
