"""--csv FILE and --plot FILE.png for the commands that print a table (plan, simulate, cost).

Both paths are checked before the work (common.check_out_path; --plot also needs matplotlib,
from the `dashboard` extra), and both files are written atomically: a CSV through
specs.io.write_text_atomic, a figure rendered by matplotlib's Agg backend into memory and then
written with specs.io.write_bytes_atomic, so a failure leaves neither half-written. Column names
carry their units (`_s`, `_ms`) and tokens/s columns their kind (planner.tokens_per_s).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spectune.cli.common import check_out_path
from spectune.specs.errors import SpecError
from spectune.specs.io import write_bytes_atomic, write_text_atomic

Draw = Callable[[Any], None]
"""Draws on one matplotlib Axes."""


def add_csv_plot(p: argparse.ArgumentParser, what: str) -> None:
    """The --csv and --plot options of a command; `what` names the rows / the figure."""
    p.add_argument(
        "--csv",
        metavar="FILE",
        default=None,
        help=f"also write {what} as CSV, one row per table row (default: none)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help=f"also draw {what} into a PNG (matplotlib, from the dashboard extra; default: none)",
    )


def check_csv_plot(args: argparse.Namespace) -> None:
    """Refuse a bad --csv / --plot path, or --plot without matplotlib, before the work."""
    if getattr(args, "csv", None) is not None:
        check_out_path(args.csv, "--csv")
    if getattr(args, "plot", None) is not None:
        check_out_path(args.plot, "--plot")
        if not str(args.plot).lower().endswith(".png"):
            raise SpecError(f"--plot {args.plot}: name a .png file")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SpecError("--plot needs matplotlib: pip install 'spectune[dashboard]'") from None


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return str(v)


def write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows (same keys, in order) as a CSV file with a header line, written atomically."""
    if not rows:
        raise SpecError(f"--csv {path}: nothing to write")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = list(rows[0])
    w.writerow(keys)
    for r in rows:
        w.writerow([_cell(r.get(k)) for k in keys])
    write_text_atomic(path, buf.getvalue())


def write_plot(path: str, draw: Draw, *, title: str, xlabel: str, ylabel: str) -> None:
    """One figure drawn by `draw(ax)` saved as PNG at `path`, atomically (Agg backend; the
    pyplot state machine is not used, so nothing global changes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    draw(ax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    write_bytes_atomic(path, buf.getvalue())


def write_outputs(
    args: argparse.Namespace,
    rows: Sequence[Mapping[str, Any]],
    draw: Draw,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    out: Any = None,
) -> None:
    """Write --csv and --plot if asked, and say so (on `out`, default stdout)."""
    import sys

    out = out or sys.stdout
    if getattr(args, "csv", None):
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}", file=out)
    if getattr(args, "plot", None):
        write_plot(args.plot, draw, title=title, xlabel=xlabel, ylabel=ylabel)
        print(f"wrote {args.plot}", file=out)
