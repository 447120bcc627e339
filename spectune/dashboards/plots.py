"""Matplotlib figures of the dashboards (no Streamlit here): the draft tree, time breakdowns and
predicted against measured. The charts people explore (Planner, Load, the kernel roofline) are
interactive Altair charts in dashboards.charts.

Figures are built with the object API on the Agg canvas (no pyplot state shared between the
sessions of one server), so each function returns a new Figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import networkx as nx
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from spectune.specs import DraftTree

SOURCE_COLORS = {"root": "#555555", "model": "#1f77b4", "retrieval": "#ff7f0e"}
SOURCE_LABELS = {
    "root": "root (last verified token)",
    "model": "model draft",
    "retrieval": "grafted (retrieval)",
}


def tree_layout(g: nx.DiGraph, root: int = 0) -> dict[int, tuple[float, float]]:
    """Tidy layered layout: leaves spaced evenly in depth-first order (children by index), each
    parent centred over its children, depth downwards."""
    pos: dict[int, tuple[float, float]] = {}
    next_x = 0.0
    order = list(nx.dfs_postorder_nodes(g, root, sort_neighbors=sorted))
    for n in order:
        kids = sorted(g.successors(n))
        if kids:
            x = float(np.mean([pos[k][0] for k in kids]))
        else:
            x = next_x
            next_x += 1.0
        pos[n] = (x, -float(g.nodes[n]["depth"]))
    return pos


def tree_figure(tree: DraftTree, accept_prob: np.ndarray | None = None, title: str = "") -> Figure:
    """The draft tree with model-drafted and grafted (retrieval) nodes in different colours and
    shapes; node opacity follows P(node on the accepted path) when given."""
    g = tree.to_networkx()
    pos = tree_layout(g)
    width = max(6.0, min(16.0, 0.18 * len(tree.leaves) + 4.0))
    fig = Figure(figsize=(width, 4.2), layout="constrained")
    ax = fig.add_subplot()
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=False, edge_color="#999999", width=0.8)
    size = 120 if tree.num_nodes <= 64 else 50
    for source, color in SOURCE_COLORS.items():
        nodes = [n for n, d in g.nodes(data=True) if d["source"] == source]
        if not nodes:
            continue
        alpha: Any = 1.0
        if accept_prob is not None and source != "root":
            alpha = [float(0.25 + 0.75 * accept_prob[n]) for n in nodes]
        nx.draw_networkx_nodes(
            g,
            pos,
            nodelist=nodes,
            node_color=color,
            node_shape="s" if source == "retrieval" else "o",
            node_size=size * (1.6 if source == "root" else 1.0),
            alpha=alpha,
            ax=ax,
        )
    handles = [
        Line2D(
            [], [], marker="s" if s == "retrieval" else "o", ls="", color=c, label=SOURCE_LABELS[s]
        )
        for s, c in SOURCE_COLORS.items()
    ]
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False
    )
    depth = tree.max_depth
    ax.set_yticks([-d for d in range(depth + 1)], [str(d) for d in range(depth + 1)])
    ax.set_ylabel("depth")
    ax.tick_params(left=True, labelleft=True, bottom=False, labelbottom=False)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=10)
    return fig


def breakdown_figure(parts_s: Mapping[str, float], title: str) -> Figure:
    """Horizontal bars of seconds per part, in ms."""
    fig = Figure(figsize=(6, 0.35 * len(parts_s) + 1.0), layout="constrained")
    ax = fig.add_subplot()
    names = list(parts_s)
    ms = [parts_s[k] * 1e3 for k in names]
    ax.barh(names, ms, color="#1f77b4")
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title, fontsize=10)
    return fig


def scatter_figure(rows: Sequence[Mapping[str, Any]], quantity: str, label: str) -> Figure:
    """Predicted against measured with the y = x line; columns predicted_<quantity> and
    measured_<quantity> (or predicted / measured when quantity is '')."""
    fig = Figure(figsize=(5, 5), layout="constrained")
    ax = fig.add_subplot()
    suffix = f"_{quantity}" if quantity else ""
    meas = np.array([r[f"measured{suffix}"] for r in rows], dtype=float)
    pred = np.array([r[f"predicted{suffix}"] for r in rows], dtype=float)
    ax.scatter(meas, pred, s=30)
    both = np.r_[meas, pred]
    both = both[np.isfinite(both)]
    lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
    pad = 0.05 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="gray", ls="--", label="y = x")
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
