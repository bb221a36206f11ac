"""Each training epoch's shares: which node each of its partitions went to, and when all of them went out.

Under ``MultiWorkerMirroredStrategy`` the nodes step together, so a node whose share of an epoch
ends first must end its read of that epoch then (Keras gives it empty batches while its peers read
on); waiting for the epoch's end would wait for rows its peers can only read by stepping with it.
A node's share is known once every partition of the epoch went to a node: the driver learns the
feeding stage's number of tasks from Spark's status tracker, counts the partitions handed out, and
the heartbeat's answer tells each node how many of them it got.  When the ``train()`` call counted its
partitions' rows (:mod:`.counts`), the answer also says how many rows the node got and the most any node got: the
node's dataset then ends the epoch after as many batches as its peers' (``executor/feed/data_feed.py``).  The
controller calls these methods with the cluster state's lock held.
"""

from __future__ import annotations

_KEPT = 3  # ended epochs whose shares nodes still hear of


class EpochShares:
    def __init__(self) -> None:
        self._parts: dict[int, set[int]] = {}  # epoch -> partitions handed out (to a node, or skipped)
        self._sent: dict[int, dict[int, int]] = {}  # epoch -> node -> partitions sent to it
        self._tasks: dict[int, int] = {}  # epoch -> tasks of its feeding stage, once known
        self._assigned: dict[int, dict[int, int]] = {}  # epochs whose partitions all went out -> shares
        self._fed_to: dict[int, dict[int, int]] = {}  # epoch -> partition -> the node it went to
        self._counts: dict[int, dict[int, int]] = {}  # epoch -> partition -> its rows, when the call counted them
        self._rows: dict[int, dict[int, int]] = {}  # epoch -> node -> rows sent to it (counted epochs)
        self._feeding: set[int] = set()  # nodes that read the training stream (a node given nothing has 0 rows)

    def count(self, epoch: int, rows: dict[int, int], nodes: list[int]) -> None:
        """``epoch``'s partitions hold ``rows`` (partition -> rows), to be dealt among ``nodes``."""
        self._counts[epoch] = dict(rows)
        self._feeding = set(nodes)

    def expected(self, epoch: int, partition: int) -> int:
        """The rows ``partition`` of ``epoch`` holds as counted, -1 when the epoch was not counted."""
        counts = self._counts.get(epoch)
        return -1 if counts is None else counts.get(partition, 0)

    def fed_to(self, epoch: int, partition: int) -> int | None:
        """The node ``partition`` of ``epoch`` went to, if it went to one (a feeding task asking again for it is
        Spark's retry of a task that died mid-partition)."""
        return self._fed_to.get(epoch, {}).get(partition)

    def handed_out(self, epoch: int, partition: int, node: int | None) -> None:
        """``partition`` of ``epoch`` went to ``node`` (None: skipped, no node reads any more)."""
        self._parts.setdefault(epoch, set()).add(partition)
        if node is not None:
            self._fed_to.setdefault(epoch, {})[partition] = node
            sent = self._sent.setdefault(epoch, {})
            sent[node] = sent.get(node, 0) + 1
            if epoch in self._counts:
                rows = self._rows.setdefault(epoch, {})
                rows[node] = rows.get(node, 0) + self._counts[epoch].get(partition, 0)
        self._check(epoch)

    def set_tasks(self, epoch: int, tasks: int) -> None:
        if epoch not in self._tasks:
            self._tasks[epoch] = tasks
            self._check(epoch)

    def pending(self, after: int) -> list[int]:
        """The partitions of epochs after ``after`` whose feeding task has not asked for a node yet (their Spark task
        waits for a slot, or its upstream computation has not made its first batch), where the stage's size is known."""
        return sorted({p for e, tasks in self._tasks.items() if e > after
                       for p in range(tasks) if p not in self._parts.get(e, ())})

    def for_node(self, node: int) -> list[list[int]]:
        """``[epoch, partitions sent to node]`` for each epoch whose partitions all went out (heartbeat answer), and
        for a counted epoch also the rows sent to it and the most rows any node got: ``[epoch, partitions, rows,
        most]``."""
        out = []
        for e, shares in sorted(self._assigned.items()):
            if e in self._counts:
                rows = self._rows.get(e, {})
                most = max([rows.get(n, 0) for n in self._feeding] + [0])
                out.append([e, shares.get(node, 0), rows.get(node, 0), most])
            else:
                out.append([e, shares.get(node, 0)])
        return out

    def forget_through(self, epoch: int) -> None:
        """Epochs up to ``epoch`` ended: nodes need no share of them but the last's rows (it went out whole)."""
        for e in set(self._sent) | set(self._counts):
            if e <= epoch and e not in self._assigned:
                self._assigned[e] = dict(self._sent.get(e, {}))
        for table in (self._parts, self._sent, self._tasks, self._fed_to):
            for e in [e for e in table if e <= epoch]:
                del table[e]
        # a node may hear of an epoch's shares only after it ended (an epoch fed within a heartbeat, two epochs in
        # flight): the last ended epochs' are kept a while
        for table in (self._assigned, self._counts, self._rows):
            for e in [e for e in table if e <= epoch - _KEPT]:
                del table[e]

    def _check(self, epoch: int) -> None:
        tasks = self._tasks.get(epoch)
        if tasks is not None and epoch not in self._assigned and len(self._parts.get(epoch, ())) >= tasks:
            self._assigned[epoch] = dict(self._sent.get(epoch, {}))
