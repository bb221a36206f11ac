"""``tfos_nb.tbproxy``: the name users enable TensorBoard's proxy by (``jupyter server extension enable
tfos_nb.tbproxy``, ``jupyter-config/jupyter_server_config.d/tfos_nb.json``).  The extension itself is
:mod:`tfos_nb.tensorboard.proxy`; this module re-exports what Jupyter looks up under that name.
"""

from __future__ import annotations

from ..tensorboard.proxy import (
    __version__,
    _jupyter_server_extension_points,
    _load_jupyter_server_extension,
    load_jupyter_server_extension,
)

__all__ = ["__version__", "_jupyter_server_extension_points", "_load_jupyter_server_extension",
           "load_jupyter_server_extension"]
