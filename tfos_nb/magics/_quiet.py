"""The cell's filter of TensorFlow's native log noise: the runtime's :mod:`tfos_nb.runtime.noise`.

The runtime owns it because the driver's stderr stream of node output (programs run
outside a notebook, e.g. by ``spark-submit``) leaves out the same lines as the cell.
"""

from __future__ import annotations

from ..runtime.noise import is_native_noise, quiet_lines

__all__ = ["is_native_noise", "quiet_lines"]
