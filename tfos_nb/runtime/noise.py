"""Which node output lines are TensorFlow's native (C++/XLA) log noise, kept out of what the user reads live.

Pure functions (unit-tested with a table and with lines captured from real
nodes), used by the cell's stream and by the driver's stderr stream of node
output outside notebooks (:mod:`.driver.node_output`).  Only those live streams are filtered:
``%tfos_logs``, ``handle.logs()``, ``handle.output``, ``cluster.logs()`` and the
nodes' log files keep every line, and a failing node's message carries its
unfiltered last lines.

What counts as noise is decided by the *format* of TensorFlow's native logging,
never by words a user's own print could contain:

* the absl/glog prefix ``[IWE]mmdd hh:mm:ss.micros thread file:line] …``
  (``I0000 00:00:1732271234.567890   1234 cudart_stub.cc:31] Could not find cuda
  drivers…``, ``E0000 … cuda_executor.cc:1228] failed call to cuInit: …``);
* TensorFlow's own C++ log format ``YYYY-mm-dd hh:mm:ss.micros: [IWE]
  path:line] …`` (oneDNN, ``cpu_feature_guard``);
* the few fixed lines those loggers print without a prefix (absl's
  ``WARNING: All log messages before absl::InitializeLog() …``, the
  continuation of ``cpu_feature_guard``'s message, and gloo's ``[Gloo] Rank 0 is
  connected to 1 peer ranks…`` as JAX's processes join);
* the unprefixed lines that end a gRPC error record: TensorFlow's ``Additional
  GRPC error information from remote target …`` and gRPC core's status string
  ``:UNAVAILABLE:Error received from peer  {…}`` (a worker's last heartbeat to a
  chief that already exited, at the end of a successful
  MultiWorkerMirroredStrategy run).

Fatal lines (``F…``: a failed CHECK, the process aborts) are always shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["is_native_noise", "quiet_lines"]

_LABEL = re.compile(r"^\[[\w.-]+:\d+\] ")  # "[worker:1] " as the handle tags node lines
_ABSL = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d+(?:\.\d+)?\s+\d+ [\w./+-]+:\d+\] ")
_TF_CPP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?: [IWE] [\w./+-]+:\d+\] ")
_GRPC = re.compile(r"^(?:Additional GRPC error information from remote target \S+ while calling \S+:$"
                   r"|:[A-Z_]+:Error received from peer  \{)")
_FIXED = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions: ",  # cpu_feature_guard's second line
    "[Gloo] Rank ",  # JAX's CPU collectives (gloo) as each process joins: "[Gloo] Rank 0 is connected to 1 peer ranks…"
)


def is_native_noise(line: str) -> bool:
    """True for a line of TensorFlow/XLA/absl native logging (tagged ``[role:index] `` or not)."""
    text = _LABEL.sub("", line, count=1)
    return bool(_ABSL.match(text) or _TF_CPP.match(text) or _GRPC.match(text) or text.startswith(_FIXED))


def quiet_lines(lines: Iterable[str]) -> list[str]:
    """``lines`` without TensorFlow's native log noise."""
    return [line for line in lines if not is_native_noise(line)]
