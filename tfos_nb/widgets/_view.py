"""Cluster state → what the panel shows: pure functions, no kernel, no Spark, no widgets.

``panel_model(view, progress)`` turns a runtime ``ClusterView`` snapshot (and the
Spark job progress the magics layer measured) into a plain, JSON-able dict;
``panel_html`` and ``text_line`` render that dict.  Every back-end (widget,
HTML display, text) goes through the same model, so the unit tests of this
module cover what every user sees.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ._groups import GROUP_ABOVE, group_text, grouped, groups_html, outliers
from ._html import STATE_COLORS as _COLORS
from ._html import badge as _badge
from ._html import esc as _e
from ._html import num as _num
from ._html import percent as _percent
from ._html import progress_bar, sparkline, time_bar

__all__ = ["HEARTBEAT_MISSING_S", "JobProgress", "panel_html", "panel_model", "proxy_route", "state_key", "tensorboard_link", "text_line"]

HEARTBEAT_MISSING_S = 5.0  # a live node silent for longer is flagged
_LIVE = frozenset({"registered", "starting", "running"})
_TERMINAL_CLUSTER = frozenset({"finished", "failed", "stopped"})
COLUMNS = ("node", "host", "executor", "device", "resources", "state", "step", "steps/s", "metrics", "curve", "heartbeat",
           "time")
RUN_COLUMNS = ("state", "step", "steps/s", "metrics", "host", "executor", "device", "heartbeat")  # parallel runs


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """Spark tasks of the cluster's job group, measured by the magics layer (plain numbers)."""

    done: int
    total: int
    failed: int = 0


def metric_order(key: str) -> tuple[bool, str, bool]:
    """How metrics are listed: loss first (what a user looks for), each metric's validation value (Keras' val_*)
    beside it, then by name."""
    base = key[4:] if key.startswith("val_") else key
    return base != "loss", base, key != base


def _metrics(metrics: Mapping[str, Any], limit: int = 4, total_epochs: int | None = None) -> str:
    # epoch is shown in the step column's context
    keys = sorted((k for k in metrics if k != "epoch"), key=metric_order)[:limit]
    parts = [f"{k} {_num(metrics[k])}" for k in keys]
    if "epoch" in metrics:
        parts.insert(0, f"epoch {_num(metrics['epoch'])}" + (f"/{total_epochs}" if total_epochs else ""))
    return " ".join(parts)


def _step(node: Any) -> str:
    if node.step is None:
        return ""
    return f"{node.step}/{node.total_steps}" if node.total_steps else str(node.step)


def _progress(node: Any) -> float | None:
    """The fraction of the run done, when the node knows its total steps (Keras: steps per epoch × epochs)."""
    epochs, epoch = getattr(node, "total_epochs", None), node.metrics.get("epoch")
    if node.step is not None and node.total_steps and node.total_steps > 0:
        done = node.step / node.total_steps
    elif epochs and epochs > 0 and isinstance(epoch, (int, float)) and not isinstance(epoch, bool):
        done = epoch / epochs  # completed epochs (Keras' callback reports epoch + 1 at each epoch's end)
    else:
        return None
    return 1.0 if node.state == "finished" else max(0.0, min(1.0, done))


def _grant(node: Any) -> str:
    grant = getattr(node, "grant", None)
    return grant.text() if grant is not None and grant.profile_id is not None else ""


def missing_heartbeat(node: Any, cluster_live: bool = True) -> bool:
    """A live node of a live cluster silent for longer than :data:`HEARTBEAT_MISSING_S`."""
    age = node.last_heartbeat_age
    return bool(cluster_live and node.state in _LIVE and age is not None and age > HEARTBEAT_MISSING_S)


def node_row(node: Any, cluster_live: bool = True) -> dict[str, Any]:
    """One node's row: display strings plus the flags the renderers colour by."""
    age = node.last_heartbeat_age
    missing = missing_heartbeat(node, cluster_live)
    heartbeat = "" if age is None or node.state not in _LIVE else f"{age:.1f} s ago"
    if missing:
        heartbeat += " (missing heartbeat)"
    error = ""
    if node.state == "failed" and node.error:
        error = str(node.error).strip().splitlines()[0] if str(node.error).strip() else ""
    return {
        "node": node.label,
        "host": node.host or "",
        "executor": node.executor_id or "",
        "device": node.device or "CPU",
        # what Spark gave the node's task under a per-role ResourceProfile (cpus, addresses, profile id)
        "resources": _grant(node),
        "state": node.state,
        # where a live node is in its lifecycle (registering … training, waiting for data, exporting, finishing)
        "phase": getattr(node, "phase", None) or "",
        "stall": getattr(node, "stall", None) or "",  # it has not moved for the stall time: where, and who it waits for
        "step": _step(node),
        "steps/s": "" if node.steps_per_sec is None else f"{node.steps_per_sec:.1f}",
        "metrics": _metrics(node.metrics, total_epochs=getattr(node, "total_epochs", None)),
        "progress": _progress(node),
        "curve": [round(v, 6) for v in getattr(node, "curve", ())],
        "curve_metric": getattr(node, "curve_metric", None) or "",
        "heartbeat": heartbeat,
        "missing_heartbeat": missing,
        # where its time went: the largest share in words, and every share (fractions) for the bar and its title
        "time": getattr(node, "time_sentence", "") if node.state in _LIVE or node.state == "finished" else "",
        "time_shares": dict(getattr(node, "time_shares", None) or {}),
        "error": error,
        "tail": list(node.tail[-20:]) if node.state == "failed" else [],
    }


def panel_model(view: Any, progress: JobProgress | None = None) -> dict[str, Any]:
    """The whole panel as a JSON-able dict: a header, and a row per node -- or, for more than
    :data:`~._groups.GROUP_ABOVE` nodes, a row per role and state (``groups``) and the nodes worth a look
    (``rows``, each with ``why``; ``outliers_hidden`` more)."""
    live = view.state not in _TERMINAL_CLUSTER
    model = {
        "name": view.name,
        "state": view.state,
        "elapsed": f"{view.elapsed:.1f} s",
        "tasks": None  # no Spark task yet (none asked for, or the launch not submitted): nothing to count
        if progress is None or not progress.total
        else f"{progress.done}/{progress.total} tasks" + (f", {progress.failed} failed" if progress.failed else ""),
        "rows_fed": view.rows_fed,
        "cluster_id": view.cluster_id,
        # the proxy route (relative to the Jupyter base URL) while the chief's TensorBoard runs;
        # the magics layer registers it (tensorboard.ClusterRoute) and withdraws it at the end
        "tensorboard": proxy_route(view.cluster_id) if live and view.tensorboard else None,
        "tensorboard_url": view.tensorboard or None,  # the node's own http://host:port
        # the chief's TensorBoard failed: say so (the node's log has its last lines), not an empty tab
        "tensorboard_error": _tensorboard_error(view),
        "error": (str(view.error).strip().splitlines() or [""])[0] if view.error else "",
        "final": not live,
        "nodes_total": len(view.nodes),
        # the job's MLflow run in the tracking UI (experiment tracking), when it is tracked
        "tracking_url": _web_url(getattr(view, "tracking_url", None)),
    }
    if hasattr(view, "params"):  # parallel runs (runtime.parallel.ParallelView): a row each, as a results table
        model["rows"] = [node_row(n, live) for n in view.nodes]
        _add_runs(model, view)
    elif len(view.nodes) > GROUP_ABOVE:
        missing = [missing_heartbeat(n, live) for n in view.nodes]
        shown, hidden = outliers(view.nodes, missing)
        model["groups"] = grouped(view.nodes, missing, metric_order, _num)
        model["rows"] = [{**node_row(n, live), "why": why} for n, why in shown]
        model["outliers_hidden"] = hidden
    else:
        model["rows"] = [node_row(n, live) for n in view.nodes]
    return model


def _web_url(url: Any) -> str | None:
    """A web page's URL without the ``user:password@`` a tracking URI may carry (the model is shown, and saved in
    the notebook); None for anything else.  ``runtime.net.without_credentials``'s rule: widgets import no runtime."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


def mlflow_link(model: Mapping[str, Any]) -> str:
    """The header's link to the job's MLflow run (a plain link: it needs no script), or ""."""
    url = model.get("tracking_url")
    if not url:
        return ""
    return (f'<a id="tfos-mlflow-{_e(model["cluster_id"])}" href="{_e(url)}" target="_blank" rel="noopener" '
            f'title="this job\'s run in the MLflow tracking UI">MLflow run &#8599;</a>')


def _tensorboard_error(view: Any) -> str:
    error = str(getattr(view, "tensorboard_error", None) or "").strip()
    return f"no TensorBoard: {error.splitlines()[0]} (its output is in the chief's log)" if error else ""


def _add_runs(model: dict[str, Any], view: Any) -> None:
    """Parallel runs: each run's parameters as columns, and the best finished run by the view's metric."""
    params = list(view.params or ())
    keys: list[str] = []
    for p in params:
        keys += [str(k) for k in p if str(k) not in keys]
    model["param_keys"] = keys
    model["metric"] = view.metric
    model["mode"] = view.mode
    best = view.best
    model["best"] = None
    for i, row in enumerate(model["rows"]):
        given = params[i] if i < len(params) else {}
        row["params"] = {str(k): _num(v) for k, v in given.items()}
        row["best"] = i == best
        value = view.nodes[i].metrics.get(view.metric) if view.metric else None
        row["result"] = "" if value is None else _num(value)
        if i == best:
            model["best"] = f"{row['node']} {view.metric} {row['result']}"


def state_key(model: Mapping[str, Any]) -> tuple[Any, ...]:
    """What counts as a state change for the text back-end (not steps, not elapsed time)."""
    groups = tuple((g["role"], g["state"], g["nodes"], g["missing"]) for g in model.get("groups", ()))
    return (model["state"], groups, tuple((r["node"], r["state"], r.get("phase"), bool(r.get("stall")),
                                           r["missing_heartbeat"], r.get("why")) for r in model["rows"]))


def text_line(model: Mapping[str, Any]) -> str:
    """``digits: running 3.2 s, 4/4 tasks | chief:0 running step 40/300 loss 0.31 | worker:0 failed: …``"""
    head = f"{model['name']}: {model['state']} {model['elapsed']}"
    if model["tasks"]:
        head += f", {model['tasks']}"
    parts = [head]
    parts += [group_text(g) for g in model.get("groups", ())]
    for r in model["rows"]:
        text = f"{r['node']} {r['state']}"
        if r.get("params"):
            text = f"{r['node']} " + " ".join(f"{k}={v}" for k, v in r["params"].items()) + f" {r['state']}"
        if r.get("phase"):
            text += f" ({r['phase']})"
        if r["step"]:
            text += f" step {r['step']}"
            if r.get("progress") is not None:
                text += f" ({_percent(r['progress'])})"
        if r["metrics"]:
            text += f" {r['metrics']}"
        if r.get("time"):
            text += f", {r['time']}"
        if r["missing_heartbeat"]:
            text += " (missing heartbeat)"
        if r["error"]:
            text += f": {r['error']}"
        if r.get("stall"):
            text += f" — STALLED: {r['stall']}"
        if r.get("why") and r["why"] not in ("failed", "stalled", "missing heartbeat", r["node"].split(":")[0]):
            text += f" [{r['why']}]"
        parts.append(text)
    if model.get("outliers_hidden"):
        parts.append(f"and {model['outliers_hidden']} more nodes worth a look (NAME.nodes has every node)")
    if model["error"] and not any(r["error"] for r in model["rows"]):
        parts.append(model["error"])
    if model.get("tensorboard_error"):
        parts.append(model["tensorboard_error"])
    if model.get("best"):
        parts.append(f"best {model['best']}")
    if model.get("tracking_url") and model["final"]:
        parts.append(f"MLflow run {model['tracking_url']}")
    return " | ".join(parts)


def proxy_route(cluster_id: str) -> str | None:
    """``tfos_nb/tensorboard/<cluster_id>/``: a cluster's TensorBoard route, relative to the Jupyter base URL.

    ``None`` for an id the proxy would refuse (not 8 to 32 lowercase hex digits).
    """
    from ..tensorboard import proxy_path

    try:
        return proxy_path(cluster_id)
    except ValueError:
        return None


def tensorboard_link(model: Mapping[str, Any]) -> str:
    """The header's TensorBoard link (href resolved in the browser from the page's base URL), or ""."""
    if not model.get("tensorboard"):
        return ""
    from ..tensorboard import link_html

    return link_html(model["tensorboard"], "TensorBoard ↗", element_id=f"tfos-tbl-{model['cluster_id']}")


def panel_html(model: Mapping[str, Any], *, tensorboard: bool = True) -> str:
    """A self-contained HTML table (inline styles only: survives nbconvert and sanitising front-ends).

    ``tensorboard=False`` leaves the TensorBoard link out of the header (the widget panel
    shows its own link and tab: an HTML widget runs no script to resolve the link).
    """
    head = [f"<b>{_e(model['name'])}</b>", _badge(model["state"]), _e(model["elapsed"])]
    if model["tasks"]:
        head.append(_e(model["tasks"]))
    if model["rows_fed"]:
        head.append(f"{_e(model['rows_fed'])} rows fed")
    if tensorboard and model["tensorboard"]:
        head.append(tensorboard_link(model))
    if model.get("tracking_url"):
        head.append(mlflow_link(model))
    if model.get("best"):
        head.append(f"<b>best: {_e(model['best'])}</b>")
    runs = "param_keys" in model  # parallel runs: node, parameters, the ranking metric, then the rest
    n_params = len(model["param_keys"]) if runs else 0
    result_col = [model["metric"]] if runs and model["metric"] else []
    columns = (*COLUMNS[:1], *model["param_keys"], *result_col, *RUN_COLUMNS) if runs else COLUMNS
    if "groups" in model:
        columns = (COLUMNS[0], "why", *COLUMNS[1:])  # the nodes below the groups, and why each is listed
    curves = {r.get("curve_metric") for r in model["rows"] if len(r.get("curve") or ()) >= 2}
    if not curves:
        columns = tuple(c for c in columns if c != "curve")  # nothing reported yet: no empty column
    if not any(r.get("resources") for r in model["rows"]):
        columns = tuple(c for c in columns if c != "resources")  # no per-role profile: no empty column
    if not any(r.get("time") for r in model["rows"]):
        columns = tuple(c for c in columns if c != "time")  # no node in training yet
    headers = {"curve": curves.pop() if len(curves) == 1 else "curve"}
    out = ['<div class="tfos-panel" style="font-family:monospace;font-size:12px">', "<div>" + " &middot; ".join(head) + "</div>"]
    if model["error"]:
        out.append(f'<div style="color:#dc322f">{_e(model["error"])}</div>')
    if model.get("tensorboard_error"):
        out.append(f'<div style="color:#b58900">{_e(model["tensorboard_error"])}</div>')
    if "groups" in model:
        out.append(groups_html(model))
    out.append('<table style="border-collapse:collapse"><thead><tr>')
    out += [f'<th style="text-align:left;padding:1px 6px">{_e(headers.get(c, c))}</th>' for c in columns]
    out.append("</tr></thead><tbody>")
    for r in model["rows"]:
        cells = []
        for j, c in enumerate(columns):
            if j == 0 and r.get("best"):
                cells.append(f"&#9733; {_e(r[c])}")  # the best run: a star and a green row
            elif 1 <= j <= n_params:
                cells.append(_e(r["params"].get(c, "")))
            elif result_col and j == n_params + 1:
                cells.append(_e(r["result"]))
            elif c == "state":
                phase = f' <span style="color:#657b83">{_e(r["phase"])}</span>' if r.get("phase") else ""
                cells.append(_badge(r["state"]) + phase)
            elif c == "step":
                color = _COLORS.get(r["state"], "#268bd2") if r["state"] in ("finished", "failed", "stopped") else "#268bd2"
                cells.append(progress_bar(r.get("progress"), color) + _e(r[c]))
            elif c == "curve":
                cells.append(sparkline(r.get("curve") or [], r.get("curve_metric", "")))
            elif c == "time":
                cells.append(time_bar(r.get("time_shares") or {}) + _e(r.get("time", "")))
            elif c == "heartbeat" and r["missing_heartbeat"]:
                cells.append(f'<span style="color:#dc322f">{_e(r[c])}</span>')
            else:
                cells.append(_e(r[c]))
        row_style = ' style="background:#e6f4ea;font-weight:bold"' if r.get("best") else ""
        out.append(f"<tr{row_style}>" + "".join(f'<td style="padding:1px 6px">{c}</td>' for c in cells) + "</tr>")
        if r.get("stall"):
            out.append(f'<tr><td colspan="{len(columns)}" style="color:#b58900;padding:1px 6px">'
                       f'&#9888; {_e(r["stall"])}</td></tr>')
        if r["error"]:
            tail = ""
            if r["tail"]:
                tail = "<details><summary>log tail</summary><pre>" + _e("\n".join(r["tail"])) + "</pre></details>"
            out.append(f'<tr><td colspan="{len(columns)}" style="color:#dc322f;padding:1px 6px">{_e(r["error"])}{tail}</td></tr>')
    out.append("</tbody></table>")
    if model.get("outliers_hidden"):
        out.append(f'<div style="color:#657b83">and {model["outliers_hidden"]} more nodes worth a look '
                   "(<code>NAME.nodes</code> has every node)</div>")
    out.append("</div>")
    return "".join(out)
