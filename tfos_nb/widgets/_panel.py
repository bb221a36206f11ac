"""The live panel: an ipywidgets 8 ``VBox`` of a Stop button and one ``HTML`` widget.

Why ipywidgets and not anywidget: the panel needs no custom front-end code —
the table is HTML rendered by :mod:`._view`, the only control is a button — so
ipywidgets' built-in ``HTML`` and ``Button`` models do it with no ES module,
no extra package (anywidget depends on ipywidgets anyway) and a widget manager
that every front-end with widget support already ships (JupyterLab, Notebook 7,
VS Code, Colab).  Their state is also what nbconvert/nbclient save in
``metadata.widgets``.  anywidget would pay off once the panel needs client-side
behaviour (sorting, sparklines); the model dict of ``_view.panel_model`` is
then the one JSON trait to hand it.

One push = one trait: the whole table is the ``value`` of a single ``HTML``
widget, set under ``hold_sync()``, so a push is one comm message whatever the
number of nodes.  The button is touched only at the end (disabled) or when
clicked.

The Stop button: a click is a comm message on the kernel's shell channel, and
the kernel does not handle it while a cell is running.  So for a blocking cell
the button is shown disabled, its tooltip pointing at the ■ interrupt (which
the magic turns into a cluster stop); for a ``--background`` cell — the cell
has returned — it is live and calls the ``on_stop`` callback the magics layer
gave (the handle's ``stop``).  The panel holds no other logic and owns no thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import ipywidgets
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    msg = 'the tfos_nb widget panel needs ipywidgets 8: pip install "ipywidgets>=8.1,<9" (or use %config TFOSMagics.renderer = "html")'
    raise ImportError(msg) from exc

from ._view import panel_html, tensorboard_link

__all__ = ["ClusterPanel"]

TENSORBOARD_HEIGHT = 640
TENSORBOARD_ENDED = (
    "TensorBoard stopped with the cluster. <code>%tfos_tensorboard --logdir DIR</code> "
    "starts one on the driver for the same logs."
)


def _html_output(html: str, text: str) -> dict[str, Any]:
    return {"output_type": "display_data", "data": {"text/html": html, "text/plain": text}, "metadata": {}}


class ClusterPanel(ipywidgets.VBox):  # type: ignore[misc]  # ipywidgets: no type information
    """A cluster's live panel; ``show(model)`` is its only input.

    Children: the Stop button and the node table; once the cluster's TensorBoard runs
    (``--tensorboard``), a header of the Stop button and a TensorBoard link, and a
    ``Tab`` of the node table and TensorBoard in an iframe, both through the Jupyter
    server's proxy route.  The link and the iframe live in ``Output`` widgets: their URL
    is resolved from the page's base URL by a script, which an output area runs (for a
    trusted notebook) and an ``HTML`` widget does not.  They are set once, not on every
    push, so TensorBoard is not reloaded.
    """

    def __init__(self, on_stop: Callable[[], None] | None = None, stop_hint: str = "", **kwargs: Any) -> None:
        self._on_stop = on_stop
        self.tensorboard_path: str | None = None
        self.tensorboard_link: Any = None
        self.tensorboard_frame: Any = None
        self.tabs: Any = None
        self.table = ipywidgets.HTML(value="")
        self.stop_button = ipywidgets.Button(
            description="Stop",
            icon="stop",
            button_style="danger",
            disabled=on_stop is None,
            tooltip=stop_hint or ("Stop the cluster" if on_stop is not None else "Interrupt the kernel (■) to stop"),
            layout=ipywidgets.Layout(width="auto"),
        )
        self.stop_button.on_click(self._clicked)
        super().__init__(children=[self.stop_button, self.table], **kwargs)

    def show(self, model: dict[str, Any]) -> None:
        value = panel_html(model, tensorboard=False)
        if value != self.table.value:
            with self.table.hold_sync():
                self.table.value = value
        if model["tensorboard"] and model["tensorboard"] != self.tensorboard_path and not model["final"]:
            self._show_tensorboard(model)
        if model["final"] and self.tensorboard_path is not None:
            self.tensorboard_path = None  # its route is withdrawn: no dead link or frame in the saved notebook
            self.tensorboard_link.outputs = ()
            self.tensorboard_frame.outputs = (_html_output(TENSORBOARD_ENDED, "TensorBoard stopped with the cluster"),)
        if model["final"] and not self.stop_button.disabled:
            with self.stop_button.hold_sync():
                self.stop_button.disabled = True
                self.stop_button.description = model["state"].capitalize()

    def _show_tensorboard(self, model: dict[str, Any]) -> None:
        import html

        from ..tensorboard import ANSWER_DEADLINE_S, hosted_message, iframe_html

        path = model["tensorboard"]
        first = self.tensorboard_path is None and self.tabs is None
        self.tensorboard_path = path
        if first:
            self.tensorboard_link = ipywidgets.Output(layout=ipywidgets.Layout(margin="0 0 0 12px"))
            self.tensorboard_frame = ipywidgets.Output()
        text = f"TensorBoard: <Jupyter base URL>/{path}"
        hosted = hosted_message()
        if hosted:  # no Jupyter server behind the page: no link or frame that could never load, but what to do
            self.tensorboard_link.outputs = ()
            self.tensorboard_frame.outputs = (_html_output(f"<p>{html.escape(hosted)}</p>", hosted),)
        else:  # the frame says why, after a while, when its route does not answer (no tfos_nb extension…)
            frame = iframe_html(path, height=TENSORBOARD_HEIGHT, deadline=ANSWER_DEADLINE_S)
            self.tensorboard_link.outputs = (_html_output(tensorboard_link(model), text),)
            self.tensorboard_frame.outputs = (_html_output(frame, text),)
        if first:
            self.tabs = ipywidgets.Tab(children=[self.table, self.tensorboard_frame], titles=("Nodes", "TensorBoard"))
            top = ipywidgets.HBox([self.stop_button, self.tensorboard_link], layout=ipywidgets.Layout(align_items="center"))
            self.children = [top, self.tabs]

    def _clicked(self, _button: Any) -> None:
        if self._on_stop is None or self.stop_button.disabled:
            return
        with self.stop_button.hold_sync():
            self.stop_button.disabled = True
            self.stop_button.description = "Stopping…"
        self._on_stop()
