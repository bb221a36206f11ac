"""The driver's record of named sets: sets fed once under a name (a validation or test set).

``TFCluster.train(df, validation=val_df)`` (or ``feeds=``, or TensorFlowOnSpark's ``qname``) feeds each set in a
Spark job of its own before the training epochs; the nodes keep their shares as files
(``executor/feed/named_sets.py``) and read them as often as the function asks.  Here, for each name: its version
(a new feed of a name replaces the last), which node each partition went to (Spark's retry of a partition goes
to the same node, which replaces the partition whole: nothing is kept twice), which nodes acknowledged which
partitions, and whether the set is in.  Each heartbeat's answer tells a node its share
(``BeatCommand.feed_sets``).  The controller calls these methods with the cluster state's lock held.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..control import state


@dataclasses.dataclass
class _Set:
    version: int
    passes: int
    sent: dict[int, int] = dataclasses.field(default_factory=dict)  # partition -> the node it went to
    held: dict[int, int] = dataclasses.field(default_factory=dict)  # partition -> the node that acknowledged it
    rows: dict[int, int] = dataclasses.field(default_factory=dict)  # node -> rows it holds
    sample: dict[str, Any] = dataclasses.field(default_factory=dict)  # a row's shape (a node given none needs it)
    ready: bool = False


class FeedSets:
    def __init__(self) -> None:
        self._sets: dict[str, _Set] = {}
        self._version = 0
        self._read: set[str] = set()  # names some node's function read

    def open(self, name: str, passes: int) -> int:
        """A new feed of ``name`` (``passes``: how often a sequential read goes through it); returns its version."""
        self._version += 1
        self._sets[name] = _Set(self._version, max(1, int(passes)))
        return self._version

    def end(self, name: str, version: int) -> None:
        """Every partition of the set was acknowledged: nodes may read it."""
        got = self._sets.get(name)
        if got is not None and got.version == version:
            got.ready = True

    def assign(self, name: str, version: int, partition: int, sample: dict[str, Any], live: list[state.NodeRecord],
               executor_id: str) -> state.NodeRecord | str:
        """The node that takes ``partition`` of the set (the one it went to before, if Spark retries it), or why
        none can; ``live``: the fed nodes running now."""
        got = self._sets.get(name)
        if got is None or got.version != version:
            return f"no feed {name!r} (version {version}) is open: a newer train() replaced it"
        if sample and not got.sample:
            got.sample = dict(sample)
        earlier = got.sent.get(partition)
        if earlier is not None:
            again = [n for n in live if n.index == earlier]
            if again:
                return again[0]
            return f"partition {partition} of feed {name!r} went to node {earlier}, which no longer runs"
        counts: dict[int, int] = {}
        for index in got.sent.values():
            counts[index] = counts.get(index, 0) + 1

        def key(n: state.NodeRecord) -> tuple[int, bool, int]:
            return counts.get(n.index, 0), not (executor_id and n.executor_id == executor_id), n.index

        node = min(live, key=key)
        got.sent[partition] = node.index
        return node

    def held(self, name: str, version: int, partition: int, node: int, rows: int) -> None:
        """``node`` acknowledged every row of ``partition`` (its file is in place)."""
        got = self._sets.get(name)
        if got is not None and got.version == version and got.sent.get(partition) == node:
            if partition not in got.held:
                got.rows[node] = got.rows.get(node, 0) + rows
            got.held[partition] = node

    def for_node(self, node: int) -> dict[str, Any]:
        """Each set as ``node`` needs to know it (a heartbeat's answer)."""
        return {name: {"version": s.version, "passes": s.passes, "sample": s.sample,
                       "parts": sorted(p for p, n in s.held.items() if n == node) if s.ready else None}
                for name, s in self._sets.items()}

    def read_by(self, node: int, names: list[str]) -> None:
        """``node``'s function read these sets (a heartbeat's news)."""
        self._read.update(names)

    def unread(self) -> dict[str, int]:
        """Sets whose rows no node's function read: name -> rows fed."""
        fed = {name: sum(list(s.rows.values())) for name, s in self._sets.items() if name not in self._read}
        return {name: rows for name, rows in fed.items() if rows}

    def rows(self, name: str) -> dict[int, int]:
        """Rows of ``name`` each node holds."""
        got = self._sets.get(name)
        return dict(got.rows) if got is not None else {}
