"""What the control server spends on peers that have not yet proved they hold the cluster's secret.

Anyone who can reach the control port can connect, so what a connection costs
before its first verified frame is bounded (:mod:`.channel` enforces it):

* it must complete that frame within :data:`FIRST_FRAME_DEADLINE_S` of being
  accepted, however slowly its bytes come;
* at most a pool of such connections is kept (:func:`pool_size`): a new one
  beyond it closes the oldest at once;
* together they buffer at most :data:`UNVERIFIED_BYTES`, each at most one
  ``MAX_FRAME`` frame: beyond it the oldest ones holding bytes are closed.

The server never stops accepting because the pool is full: a flood must not be
able to keep everybody else waiting in the listen backlog.  (It did while a
connection younger than a second was waited for instead of closed: a flood of
100 idle connections a second delayed a node's registration by 12 s.)  Closing
the oldest at once is safe because a legitimate peer sends its first frame the
moment it connects, and it is usually read as the connection is accepted: it is
closed unread only if a whole pool of newer connections arrives before its frame
-- 2.5 s at 200 connections a second for the default pool, against the
milliseconds a frame lags its connection even on a loaded machine, and a launch
of 512 nodes connecting at once fits in the pool whole.  The pool is at most a
quarter of the descriptors the process may open, so a flood leaves the rest to
the verified peers (a connection per node and feeding task) and to everything
else the driver opens.  Bytes are bounded by a total rather than by a cap per
connection below ``MAX_FRAME`` because a first frame may be large: a supervisor
whose connection broke reconnects with a heartbeat carrying its logs.

Rejected frames are counted by the server and logged by :class:`Rejections`: one
warning, then at most one summary line every :data:`REJECT_LOG_INTERVAL_S` (how
many, from how many addresses, the last reason), so that thousands of junk
frames do not flood the notebook's output.
"""

from __future__ import annotations

import logging
import resource

from . import messages

# A peer sends its first frame as soon as it connects; this bounds how long a connection that never
# sends a complete, verified one (idle, or a byte at a time) holds a descriptor and its buffer.
FIRST_FRAME_DEADLINE_S = 10.0
# Unverified connections kept at once (at most a quarter of RLIMIT_NOFILE): a flood of R connections a second closes
# a legitimate one unread only if its frame lags its connection by MAX_UNVERIFIED / R seconds.
MAX_UNVERIFIED = 512
# What they buffer together: 16 frames of the largest size.
UNVERIFIED_BYTES = 16 * messages.MAX_FRAME
REJECT_LOG_INTERVAL_S = 10.0
_HOSTS_COUNTED = 1024  # distinct addresses a summary line counts, at most


def pool_size() -> int:
    """:data:`MAX_UNVERIFIED`, or a quarter of the descriptors this process may open when that is fewer."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_UNVERIFIED
    return max(8, min(MAX_UNVERIFIED, soft // 4))


class Rejections:
    """Frames rejected by the server: the first logged at once, the next ones counted into a summary line
    logged once the interval since the last line is over (:meth:`flush`, called at every turn of the loop)."""

    def __init__(self, log: logging.Logger, interval: float = REJECT_LOG_INTERVAL_S) -> None:
        self._log = log
        self._interval = interval
        self._quiet_until = float("-inf")  # a rejection before then is counted for the next summary line
        self._since = 0.0  # when the last line was logged
        self._count = 0
        self._hosts: set[str] = set()
        self._last = ""

    def add(self, peer: str, why: str, now: float) -> None:
        """A frame from ``peer`` (``host:port``) rejected for ``why`` at ``now`` (``time.monotonic()``)."""
        if now >= self._quiet_until and not self._count:
            self._log.warning("tfos_nb control server: rejected a message from %s: %s", peer, why)
            self._quiet_until, self._since = now + self._interval, now
            return
        self._count += 1
        if len(self._hosts) < _HOSTS_COUNTED:
            self._hosts.add(peer.rpartition(":")[0])
        self._last = f"{peer}: {why}"

    def flush(self, now: float, *, force: bool = False) -> None:
        """Log the summary line if the interval is over, or at once with ``force`` (the server stops)."""
        if not self._count or (now < self._quiet_until and not force):
            return
        hosts = len(self._hosts)
        self._log.warning(
            "tfos_nb control server: rejected %d more message%s in %.0f s from %d%s address%s (the last from %s)",
            self._count, "" if self._count == 1 else "s", now - self._since, hosts,
            "+" if hosts >= _HOSTS_COUNTED else "", "" if hosts == 1 else "es", self._last)
        self._count, self._hosts, self._last = 0, set(), ""
        self._quiet_until, self._since = now + self._interval, now
