"""Renders runtime cluster state: an ipywidgets panel, an HTML table or text lines.

Owns no thread and never imports pyspark: the magics layer feeds it snapshots
(``tfos_nb.runtime.driver.control.state.ClusterView``) and Spark job progress as plain numbers.
ipywidgets is imported only when the widget back-end is made.
"""

from __future__ import annotations

from ._renderer import RENDERERS, Renderer, choose_renderer, make_renderer
from ._view import JobProgress, metric_order, panel_html, panel_model, text_line

__all__ = ["RENDERERS", "JobProgress", "Renderer", "choose_renderer", "make_renderer", "metric_order", "panel_html",
           "panel_model", "text_line"]
