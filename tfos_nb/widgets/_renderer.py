"""One throttled renderer: cluster snapshots in, at most two pushes a second out.

Whoever owns a run (the blocking cell's main thread, or the handle's listener
for a ``--background`` cell) calls ``update(view, progress)`` as often as it
likes — on every runtime change if need be.  The renderer keeps only the
latest snapshot (coalescing) and pushes it to its back-end when
``interval`` has passed since the last push (a snapshot that came too soon
goes out with the next update or at ``finish()``, which always pushes the final
state).  The renderer owns no thread and no timer: that is the caller's job.

Back-ends: ``WidgetBackend`` (an ipywidgets panel: one trait set per push, so
one comm message), ``HtmlBackend`` (a display handle updated in place: nbconvert,
front-ends without widget support) and ``TextBackend`` (one line per state
change: terminal IPython).  Each back-end's ``finish`` leaves one static
``text/html`` + ``text/plain`` output (or a text line), so a saved notebook and a
front-end without widgets show the outcome.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

from ._view import JobProgress, panel_html, panel_model, state_key, text_line

__all__ = ["RENDERERS", "HtmlBackend", "Renderer", "TextBackend", "WidgetBackend", "choose_renderer", "make_renderer"]

RENDERERS = ("auto", "widget", "html", "text", "none")
UPDATE_INTERVAL_S = 0.5  # ≤ 2 pushes/s: a 60 s run sends ≤ ~120 updates whatever the step rate


def _bundle(model: dict[str, Any]) -> dict[str, str]:
    return {"text/html": panel_html(model), "text/plain": text_line(model)}


EMPTY = {"text/plain": ""}  # what a live output becomes when the final table goes below it


def _starting(name: str) -> dict[str, str]:
    return {"text/html": f'<div class="tfos-panel"><b>{html.escape(name)}</b> &middot; starting</div>', "text/plain": f"{name}: starting"}


def _display(obj: Any, **kwargs: Any) -> Any:
    from IPython.display import display

    return display(obj, **kwargs)


class TextBackend:
    """One printed line whenever the cluster's or a node's state changes; a summary line at the end."""

    def __init__(self, write: Callable[[str], None] = print) -> None:
        self._write = write
        self._key: tuple[Any, ...] | None = None

    def start(self, name: str) -> None:
        pass

    def show(self, model: dict[str, Any]) -> None:
        key = state_key(model)
        if key != self._key:
            self._key = key
            self._write(text_line(model))

    def finish(self, model: dict[str, Any]) -> None:
        self._key = state_key(model)
        self._write(text_line(model))


class HtmlBackend:
    """An HTML table in one display handle, updated in place.

    The final state: with ``new_final_output`` (a blocking cell, from its own thread)
    the live output is emptied and the final table is a *new* output at the end of
    the cell, so front-ends that drop ``update_display_data`` (hosted notebooks) show
    it too; otherwise (a --background cell, from another thread) the live output is
    updated to it.
    """

    def __init__(self, display: Callable[..., Any] = _display, new_final_output: bool = False) -> None:
        self._display = display
        self._handle: Any = None
        self.new_final_output = new_final_output

    def start(self, name: str) -> None:
        if self._handle is None:
            self._handle = self._display(_starting(name), raw=True, display_id=True)

    def show(self, model: dict[str, Any]) -> None:
        if self._handle is None:
            self._handle = self._display(_bundle(model), raw=True, display_id=True)
        else:
            self._handle.update(_bundle(model), raw=True)

    def finish(self, model: dict[str, Any]) -> None:
        if self.new_final_output:
            if self._handle is not None:
                self._handle.update(EMPTY, raw=True)
            self._display(_bundle(model), raw=True)
        else:
            self.show(model)


class WidgetBackend:
    """The live ipywidgets panel in one output; at the end, one static table (text/html + text/plain).

    The panel's output is a mime bundle of the widget view plus a text/html and
    text/plain line for front-ends without widgets (instead of ``ClusterPanel(children=…)``).
    The final state replaces the widget, so a live session shows one table and a saved
    notebook shows it without widget state: with ``new_final_output`` (a blocking cell)
    the panel's output is emptied and the table is a new output at the end of the cell,
    which front-ends that drop comm and ``update_display_data`` messages show as well;
    otherwise (a --background cell, from another thread, where a new output would land
    in whatever cell runs then) the panel's output is updated to the table.
    """

    def __init__(self, panel: Any, display: Callable[..., Any] = _display, new_final_output: bool = False) -> None:
        self.panel = panel
        self._display = display
        self._handle: Any = None
        self.new_final_output = new_final_output

    def _live_bundle(self, name: str) -> dict[str, Any]:
        bundle = dict(self.panel._repr_mimebundle_())
        bundle["text/plain"] = f"{name}: running (the live panel needs Jupyter widgets; the final table follows)"
        bundle["text/html"] = _starting(name)["text/html"]
        return bundle

    def start(self, name: str) -> None:
        if self._handle is None:
            self.panel.table.value = _starting(name)["text/html"]
            self._handle = self._display(self._live_bundle(name), raw=True, display_id=True)

    def show(self, model: dict[str, Any]) -> None:
        self.panel.show(model)
        if self._handle is None:
            self._handle = self._display(self._live_bundle(model["name"]), raw=True, display_id=True)

    def finish(self, model: dict[str, Any]) -> None:
        self.show(model)  # the widget's own state ends final too (nbclient saves it with the notebook)
        if self.new_final_output:
            self._handle.update(EMPTY, raw=True)
            self._display(_bundle(model), raw=True)
        else:
            self._handle.update(_bundle(model), raw=True)


class Renderer:
    """Throttle and coalesce snapshots for one back-end; thread-safe, owns no thread."""

    def __init__(self, backend: Any, interval: float = UPDATE_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: tuple[Any, JobProgress | None] | None = None
        self._last_push: float | None = None
        self._last_look: float | None = None  # when a snapshot was last turned into a model (pushed or the same)
        self._last_model: dict[str, Any] | None = None
        self._finished = False
        self.pushes = 0

    def start(self, name: str) -> None:
        """Show the output(s) now, from the cell's own thread, before any state exists.

        Later pushes update these outputs in place, so they may come from another
        thread (a --background cell's listener) without landing in some other cell.
        """
        with self._lock:
            self.backend.start(name)

    def update(self, view: Any, progress: JobProgress | None = None) -> None:
        """Take the latest snapshot; push it now if the last push is at least ``interval`` old."""
        with self._lock:
            if self._finished:
                return
            self._pending = (view, progress)
            self._maybe_push()

    def finish(self, view: Any = None, progress: JobProgress | None = None) -> None:
        """Push the final state, whatever the throttle says; later calls do nothing."""
        with self._lock:
            if self._finished:
                return
            if view is not None:
                self._pending = (view, progress)
            if self._pending is None:
                return
            self._finished = True
            view, progress = self._pending
            self._pending = None
            self.pushes += 1
            self.backend.finish(panel_model(view, progress))

    @property
    def finished(self) -> bool:
        return self._finished

    def due(self) -> bool:
        """Whether a snapshot given now would be looked at (``interval`` passed since the last one was): a caller
        that polls skips making one otherwise (a snapshot copies every node)."""
        with self._lock:
            return not self._finished and (self._last_look is None or self._clock() - self._last_look >= self.interval)

    def _maybe_push(self) -> None:
        now = self._clock()
        if self._last_push is not None and now - self._last_push < self.interval:
            return
        assert self._pending is not None
        view, progress = self._pending
        self._pending = None
        model = panel_model(view, progress)
        self._last_look = now
        if model == self._last_model:
            return
        self._last_push = now
        self._last_model = model
        self.pushes += 1
        self.backend.show(model)


def widgets_available() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def choose_renderer(setting: str, shell: Any) -> str:
    """``auto`` → widget in a kernel with comms and ipywidgets, html in other kernels, text in a terminal."""
    if setting not in RENDERERS:
        msg = f"renderer must be one of {', '.join(RENDERERS)}, got {setting!r}"
        raise ValueError(msg)
    if setting != "auto":
        return setting
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return "text"
    # ipykernel's kernel has a comm manager; a kernel without one (or without ipywidgets) gets HTML
    if getattr(kernel, "comm_manager", None) is not None and widgets_available():
        return "widget"
    return "html"


def make_renderer(
    kind: str,
    *,
    on_stop: Callable[[], None] | None = None,
    stop_hint: str = "",
    write: Callable[[str], None] = print,
    display: Callable[..., Any] = _display,
    interval: float = UPDATE_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    new_final_output: bool = False,
) -> Renderer | None:
    """A renderer for a resolved kind (widget, html, text, none); ``None`` for none.

    ``new_final_output``: the final table is a new output at the end of the cell (call
    ``finish`` from the cell's own thread), not an update of the live one.
    """
    if kind == "none":
        return None
    if kind == "text":
        backend: Any = TextBackend(write)
    elif kind == "html":
        backend = HtmlBackend(display, new_final_output)
    elif kind == "widget":
        from ._panel import ClusterPanel

        backend = WidgetBackend(ClusterPanel(on_stop=on_stop, stop_hint=stop_hint), display, new_final_output)
    else:
        msg = f"renderer must be widget, html, text or none here, got {kind!r}"
        raise ValueError(msg)
    return Renderer(backend, interval=interval, clock=clock)
