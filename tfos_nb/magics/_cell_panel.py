"""What a cell shows while its job runs: the panel, the nodes' output, the ■ button.

Functions of the magics' display settings (:class:`PanelSettings`: ``TFOSMagics``'
``renderer``, ``log_lines``, ``show_native_logs``, ``api_panels`` and its shell) and
a :class:`~._run_handle.RunHandle`; the same for clusters and parallel runs.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol

from IPython.core.error import UsageError

from ..runtime.driver.control import state as cluster_state
from ..widgets import JobProgress
from ._quiet import quiet_lines
from ._spark import job_groups, job_progress

__all__ = ["PanelSettings", "api_cluster_panel", "drain", "follow", "panel_in_background", "renderer_for"]

PROGRESS_INTERVAL_S = 1.0  # Spark job progress is polled (py4j calls) at most once a second
BLOCKING_STOP_HINT = "This cell is running: interrupt the kernel (■) to stop the cluster"
INTERRUPT_GRACE_S = 15.0


class PanelSettings(Protocol):
    """What the panel reads of ``TFOSMagics``: its shell and its display settings (traitlets)."""

    shell: Any
    renderer: str
    log_lines: bool
    show_native_logs: bool
    api_panels: bool


def renderer_for(magics: PanelSettings, background: bool, on_stop: Any = None) -> Any:
    from ..widgets import choose_renderer, make_renderer

    kind = choose_renderer(magics.renderer, magics.shell)
    if background and kind == "text":
        return None  # lines printed from another thread would land in whatever cell runs then
    try:
        # a blocking cell's final table is a new output at its end (its own thread), shown by every front-end
        return make_renderer(kind, on_stop=on_stop, stop_hint="" if background else BLOCKING_STOP_HINT,
                             new_final_output=not background)
    except ImportError as exc:
        if magics.renderer == "widget":
            raise UsageError(str(exc)) from None
        return make_renderer("html", new_final_output=not background)


def api_cluster_panel(magics: PanelSettings, st: cluster_state.ClusterState) -> None:
    """A panel for a cluster started by a Python call in a cell (not by %%tfos_cluster's own thread)."""
    if not magics.api_panels or threading.current_thread() is not threading.main_thread():
        return
    from ..widgets import choose_renderer, make_renderer

    kind = choose_renderer(magics.renderer, magics.shell)
    if kind not in ("widget", "html"):
        return  # text lines from listener threads would land in whatever cell runs then
    try:
        renderer = make_renderer(kind)
    except ImportError:
        renderer = make_renderer("html")
    assert renderer is not None
    renderer.start(st.name)

    def on_change(state: cluster_state.ClusterState) -> None:
        view = state.snapshot()
        if view.state in (cluster_state.C_FINISHED, cluster_state.C_FAILED, cluster_state.C_STOPPED):
            state.remove_listener(on_change)
            renderer.finish(view)
        else:
            renderer.update(view)

    st.add_listener(on_change)


def panel_in_background(magics: PanelSettings, handle: Any) -> None:
    """A --background cell's panel: fed by the handle's observer (no Spark progress: no poller thread)."""
    renderer = renderer_for(magics, True, on_stop=lambda: handle.stop("stopped from the panel"))
    if renderer is None:
        return
    renderer.start(handle.name)

    def observe(view: Any, final: bool) -> None:
        if final:
            renderer.finish(view)
        else:
            renderer.update(view)

    handle.add_observer(observe)


def follow(magics: PanelSettings, handle: Any) -> None:
    """Watch a blocking cell's run from the main thread: print output, render the panel, take ■."""
    renderer = renderer_for(magics, False)
    if renderer is not None:
        renderer.start(handle.name)
    progress = None
    next_progress = 0.0
    tensorboard = None

    def render(final: bool = False) -> None:
        nonlocal progress, next_progress
        if renderer is None or not (final or renderer.due()):
            return
        view = handle.final_status() if final else handle.status()
        if view is None:
            return
        now = time.monotonic()
        if final or now >= next_progress:
            next_progress = now + PROGRESS_INTERVAL_S
            numbers = job_progress(handle.sc, job_groups(view.job_group, view.feed_epoch))
            if numbers is not None:
                progress = JobProgress(*numbers)
        if final:
            renderer.finish(view, progress)
        else:
            renderer.update(view, progress)

    try:
        while not handle.join(0.1):
            drain(magics, handle)
            if tensorboard is None and handle.tensorboard_url:
                from .. import tensorboard as notebook_tensorboard

                tensorboard = handle.tensorboard_url  # the node's own address: seldom reachable from a browser
                where = notebook_tensorboard.proxy_url_from_env(tensorboard) or \
                    f"<Jupyter base URL>/{notebook_tensorboard.proxy_path(handle.status().cluster_id)}"
                print(f"tfos_nb: TensorBoard of {handle.name}: {where} (on the chief at {tensorboard})")
            render()
    except KeyboardInterrupt:
        print(f"tfos_nb: interrupted; stopping cluster {handle.name}{handle.stalled_now()}", file=sys.stderr)
        handle.stop("interrupted")
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while not handle.done and time.monotonic() < deadline:
            try:
                handle.join(0.1)
            except KeyboardInterrupt:
                continue  # a second ■ must not cut the teardown short
        drain(magics, handle)
        render(final=True)
        raise
    drain(magics, handle)
    render(final=True)


def drain(magics: PanelSettings, handle: Any) -> None:
    """Print the output lines the handle's nodes sent since the last call (a blocking cell's main thread)."""
    if handle.lines is None:
        return
    out = []
    while True:
        try:
            out += handle.lines.get_nowait()
        except Exception:  # noqa: BLE001 - queue.Empty
            break
    if not magics.show_native_logs:
        out = quiet_lines(out)
    if out and magics.log_lines:
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
