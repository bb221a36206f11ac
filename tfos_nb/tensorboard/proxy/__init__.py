"""Jupyter server extension: TensorBoard of a tfos_nb cluster, behind Jupyter's login.

Serves ``<base_url>tfos_nb/tensorboard/<cluster_id>/`` (HTTP and websockets), forwarding
only to the endpoint a kernel of this user registered with
:func:`tfos_nb.tensorboard.register`.  Enabled by
``jupyter-config/jupyter_server_config.d/tfos_nb.json``; settings are ``c.TensorBoardProxy.*``.

Importing this package loads neither jupyter_server nor tensorflow nor pyspark: the
kernel side shares :mod:`tfos_nb.tensorboard._records` with the server.  Users enable it by the
name ``tfos_nb.tbproxy`` (a re-export of this module), which is also the module its extension
point names, so that ``jupyter server extension list`` shows that name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import __version__

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

__all__ = ["__version__", "_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "tfos_nb.tbproxy"}]


def _load_jupyter_server_extension(serverapp: ServerApp) -> None:
    from ._handlers import setup_handlers

    setup_handlers(serverapp)


# jupyter_server < 2 / notebook-style name, kept for `jupyter server extension list` on old servers.
load_jupyter_server_extension = _load_jupyter_server_extension
