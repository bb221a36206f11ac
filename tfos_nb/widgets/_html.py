"""The panel's HTML building blocks: escaping, numbers, the state badge, the small bars and the loss sparkline.

Inline styles only (they survive nbconvert and sanitising front-ends); pure functions, as :mod:`._view` is.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

__all__ = ["STATE_COLORS", "TIME_COLORS", "badge", "esc", "num", "percent", "progress_bar", "sparkline", "time_bar"]

STATE_COLORS = {  # a state's colour in the badge and the progress bar
    "pending": "#888",
    "registered": "#888",
    "starting": "#b58900",
    "running": "#268bd2",
    "finished": "#2aa198",
    "failed": "#dc322f",
    "stopped": "#6c71c4",
    "reserving": "#b58900",
}
# where a node's time went, the last few seconds (runtime.step_time's categories, in its order), and the bar's colours
TIME_COLORS = {"input": "#b58900", "compute": "#268bd2", "peers": "#d33682", "other": "#93a1a1"}


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def badge(state: str) -> str:
    color = STATE_COLORS.get(state, "#888")
    return f'<span style="color:{color};font-weight:bold">{esc(state)}</span>'


def progress_bar(fraction: float | None, color: str = "#268bd2") -> str:
    """A small inline progress bar (plain HTML, inline styles), or "" when the total is unknown."""
    if fraction is None:
        return ""
    pct = f"{fraction * 100:.1f}".rstrip("0").rstrip(".")
    return (f'<span title="{percent(fraction)}" style="display:inline-block;width:60px;height:8px;background:#e4e4e4;'
            f'border-radius:2px;vertical-align:middle;margin-right:4px;overflow:hidden">'
            f'<span style="display:block;width:{pct}%;height:100%;background:{color}"></span></span>')


def time_bar(shares: Mapping[str, float], width: int = 60) -> str:
    """A small stacked bar of a node's time shares (input, compute, peers, other), its title every share in
    words; "" without shares."""
    if not shares:
        return ""
    title = ", ".join(f"{c} {round(shares.get(c, 0.0) * 100)}%" for c in TIME_COLORS)
    parts = "".join(f'<span style="display:inline-block;width:{shares.get(c, 0.0) * width:.1f}px;height:100%;'
                    f'background:{color}"></span>' for c, color in TIME_COLORS.items() if shares.get(c, 0.0) > 0)
    return (f'<span title="{esc(title)}" style="display:inline-block;width:{width}px;height:8px;background:#e4e4e4;'
            f'border-radius:2px;vertical-align:middle;margin-right:4px;overflow:hidden;white-space:nowrap;'
            f'line-height:0">{parts}</span>')


def sparkline(values: list[float], label: str = "", width: int = 90, height: int = 20) -> str:
    """An inline SVG line of ``values`` (drawn by the browser; no image), or "" with fewer than two points."""
    if len(values) < 2:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = (width - 2) / (len(values) - 1)
    points = " ".join(f"{1 + i * step:.1f},{1 + (height - 2) * (hi - v) / span:.1f}" for i, v in enumerate(values))
    title = f"{label} {num(values[0])} → {num(values[-1])} ({len(values)} points)".strip()
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" style="vertical-align:middle">'
            f"<title>{esc(title)}</title>"
            f'<polyline fill="none" stroke="#268bd2" stroke-width="1.5" points="{points}"/></svg>')


def num(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{int(fraction * 100)}%"
