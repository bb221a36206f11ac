"""Plain-text rendering of cluster state for the magics (pure functions, unit-tested)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..widgets import metric_order

__all__ = ["format_metrics", "node_line", "status_table"]


def format_metrics(metrics: Mapping[str, Any], limit: int = 4) -> str:
    """The first ``limit`` metrics in the panel's order (loss first, each val_* beside its metric)."""
    parts = []
    for k, v in sorted(metrics.items(), key=lambda kv: metric_order(kv[0]))[:limit]:
        if isinstance(v, float):
            parts.append(f"{k} {v:.4g}")
        else:
            parts.append(f"{k} {v}")
    return " ".join(parts)


def node_line(node: Any) -> str:
    """``chief:0 running (training) step 40/300 loss 0.31, waits for input 62%``"""
    text = f"{node.label} {node.state}"
    if getattr(node, "phase", None):
        text += f" ({node.phase})"
    grant = getattr(node, "grant", None)
    if grant is not None and grant.profile_id is not None:  # a node of a per-role resource profile: its grant
        text += f" [executor {node.executor_id or '?'}: {grant.text()}]"
    if node.step is not None:
        text += f" step {node.step}" + (f"/{node.total_steps}" if node.total_steps else "")
    metrics = format_metrics({k: v for k, v in node.metrics.items() if k != "epoch"})
    stall = f" STALLED: {node.stall}" if getattr(node, "stall", None) else ""
    took = f", {node.time_sentence}" if getattr(node, "time_sentence", "") else ""  # where its time goes (step_time)
    return f"{text} {metrics}".rstrip() + took + stall


def status_table(rows: Iterable[tuple[str, str, int, float | None, str]]) -> str:
    """``%tfos_status``: rows of (name, state, nodes, elapsed, detail)."""
    rows = list(rows)
    if not rows:
        return "no tfos_nb clusters in this kernel"
    header = ("name", "state", "nodes", "elapsed", "progress")
    cells = [header] + [
        (name, state, str(nodes), "-" if elapsed is None else f"{elapsed:.1f} s", detail)
        for name, state, nodes, elapsed, detail in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(4)]
    out = []
    for r in cells:
        out.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
    return "\n".join(line.rstrip() for line in out)
