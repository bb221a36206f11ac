"""A large cluster in the panel: its nodes grouped by role and state, and the nodes worth a look listed.

Up to :data:`GROUP_ABOVE` nodes the panel has a row a node.  Beyond, a row a node is a page nobody reads
and a message to the front-end that grows with the cluster, so the panel shows one row per (role, state)
-- how many nodes, their steps (lowest, median, highest), the median steps a second and metrics, where
their time goes on average, the oldest heartbeat -- and below it the nodes a user would look for in the
long table: the chief, then the failed, the stalled, those with a missing heartbeat and the slow ones (under
:data:`SLOW_RATE` of their role's median steps a second), most severe first, :data:`OUTLIERS_SHOWN` at most
and the rest counted.  Every node's own numbers stay in ``NAME.nodes`` and ``NAME.history``.

Pure functions of the runtime's node views, as :mod:`._view` is: no kernel, no Spark, no widgets.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ._html import badge, esc, time_bar

__all__ = ["GROUP_ABOVE", "OUTLIERS_SHOWN", "SLOW_RATE", "group_text", "grouped", "groups_html", "outliers",
           "worth_a_look"]

GROUP_ABOVE = 16  # more nodes than this: grouped
OUTLIERS_SHOWN = 12  # nodes listed below the groups (the chief included), the rest counted
SLOW_RATE = 0.5  # a running node under half its role's median steps a second is listed as slow
_COORDINATORS = ("chief", "master")
_SEVERITY = ("failed", "stalled", "missing heartbeat", "slow")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rates(views: Sequence[Any]) -> dict[str, float]:
    """Each role's median steps a second over its running nodes that report one."""
    by_role: dict[str, list[float]] = {}
    for n in views:
        if n.state == "running" and n.steps_per_sec is not None:
            by_role.setdefault(n.job_name, []).append(n.steps_per_sec)
    return {role: statistics.median(rates) for role, rates in by_role.items()}


def _why(node: Any, missing: bool, median_rate: float | None) -> str | None:
    if node.state == "failed":
        return "failed"
    if getattr(node, "stall", None):
        return "stalled"
    if missing:
        return "missing heartbeat"
    if (node.state == "running" and median_rate and node.steps_per_sec is not None
            and node.steps_per_sec < SLOW_RATE * median_rate):
        return f"slow: {node.steps_per_sec:.1f} steps/s, {node.job_name} median {median_rate:.1f}"
    return None


def outliers(views: Sequence[Any], missing: Sequence[bool]) -> tuple[list[tuple[Any, str]], int]:
    """The nodes listed below the groups, each with why (the chief's: ``chief``), and how many more there are.

    ``missing``: each view's missing-heartbeat flag (as the node rows compute it).
    """
    rates = _rates(views)
    coordinators, found = [], []
    for n, gone in zip(views, missing):
        why = _why(n, gone, rates.get(n.job_name))
        if n.job_name in _COORDINATORS:
            coordinators.append((n, why or n.job_name))
        elif why is not None:
            found.append((n, why))
    found.sort(key=lambda item: _SEVERITY.index(item[1].split(":")[0]))
    room = max(0, OUTLIERS_SHOWN - len(coordinators))
    return coordinators + found[:room], max(0, len(found) - room)


def _steps(steps: list[int]) -> str:
    if not steps:
        return ""
    lo, hi = min(steps), max(steps)
    return str(lo) if lo == hi else f"{lo}–{hi} (median {statistics.median(steps):g})"


def _shares(views: Sequence[Any]) -> dict[str, float]:
    """The group's mean time shares over its nodes that report them."""
    reported = [n.time_shares for n in views if getattr(n, "time_shares", None)]
    if not reported:
        return {}
    keys = {k for s in reported for k in s}
    return {k: sum(s.get(k, 0.0) for s in reported) / len(reported) for k in keys}


def grouped(views: Sequence[Any], missing: Sequence[bool], metric_order: Any, number: Any) -> list[dict[str, Any]]:
    """One row per (role, state), in the cluster's order of roles then the states' order of first appearance."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, n in enumerate(views):
        groups.setdefault((n.job_name, n.state), []).append(i)
    rows = []
    for (role, state), members in groups.items():
        nodes = [views[i] for i in members]
        rates = [n.steps_per_sec for n in nodes if n.steps_per_sec is not None]
        metrics: dict[str, list[float]] = {}
        for n in nodes:
            for k, v in n.metrics.items():
                if k != "epoch" and _number(v):
                    metrics.setdefault(k, []).append(float(v))
        keys = sorted(metrics, key=metric_order)[:2]
        ages = [n.last_heartbeat_age for n in nodes if n.last_heartbeat_age is not None]
        live = state in ("registered", "starting", "running")
        shares = _shares(nodes) if live or state == "finished" else {}
        top = max(shares, key=shares.__getitem__) if shares else ""
        rows.append({
            "role": role,
            "state": state,
            "nodes": len(nodes),
            "step": _steps([n.step for n in nodes if n.step is not None]),
            "steps/s": "" if not rates else f"{statistics.median(rates):.1f}",
            "metrics": " ".join(f"{k} {number(statistics.median(metrics[k]))}" for k in keys),
            "heartbeat": f"oldest {max(ages):.1f} s ago" if ages and live else "",
            "missing": sum(1 for i in members if missing[i]),
            "time": f"{top} {round(shares[top] * 100)}% (mean)" if top else "",
            "time_shares": shares,
        })
    return rows


def group_text(g: Mapping[str, Any]) -> str:
    text = f"{g['role']} {g['state']} ×{g['nodes']}"
    if g["step"]:
        text += f" step {g['step']}"
    if g["steps/s"]:
        text += f" {g['steps/s']} steps/s"
    if g["metrics"]:
        text += f" {g['metrics']}"
    if g["missing"]:
        text += f" ({g['missing']} missing heartbeat)"
    return text


GROUP_COLUMNS = ("role", "state", "nodes", "step", "steps/s", "metrics", "time", "heartbeat")


def groups_html(model: Mapping[str, Any]) -> str:
    """The table of a large cluster's groups (a row per role and state), and the line that leads to its nodes."""
    groups = model["groups"]
    columns = [c for c in GROUP_COLUMNS if c in ("role", "state", "nodes") or any(g[c] for g in groups)]
    out = ['<table style="border-collapse:collapse;margin-bottom:4px"><thead><tr>']
    out += [f'<th style="text-align:left;padding:1px 6px">{esc(c)}</th>' for c in columns]
    out.append("</tr></thead><tbody>")
    for g in groups:
        cells = []
        for c in columns:
            if c == "state":
                cells.append(badge(g["state"]))
            elif c == "time":
                cells.append(time_bar(g["time_shares"]) + esc(g["time"]))
            elif c == "heartbeat" and g["missing"]:
                cells.append(esc(g["heartbeat"]) + f' <span style="color:#dc322f">({g["missing"]} missing)</span>')
            else:
                cells.append(esc(g[c]))
        out.append("<tr>" + "".join(f'<td style="padding:1px 6px">{c}</td>' for c in cells) + "</tr>")
    out.append("</tbody></table>")
    out.append(f'<div style="color:#657b83">{esc(worth_a_look(model))}</div>')
    return "".join(out)


def worth_a_look(model: Mapping[str, Any]) -> str:
    """The line between a large cluster's groups and its listed nodes."""
    coordinators = [r["node"] for r in model["rows"] if r["why"] in ("chief", "master")]
    others = len(model["rows"]) - len(coordinators) + model.get("outliers_hidden", 0)
    head = f"{model['nodes_total']} nodes, grouped by role and state. "
    if not others:
        found = "no node is failed, stalled, silent or slow"
        return head + (f"Below: {', '.join(coordinators)}; {found}." if coordinators else f"{found[0].upper()}{found[1:]}.")
    found = f"{others} node{'s' if others != 1 else ''} worth a look (failed, stalled, silent or slow)"
    return head + (f"Below: {', '.join(coordinators)}, and {found}." if coordinators else f"Below: {found}.")
