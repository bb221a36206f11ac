"""Each training epoch's shares: which node each of its partitions went to, and when all of them went out.

Under ``MultiWorkerMirroredStrategy`` the nodes step together, so a node whose share of an epoch
ends first must end its read of that epoch then (Keras gives it empty batches while its peers read
on); waiting for the epoch's end would wait for rows its peers can only read by stepping with it.
A node's share is known once every partition of the epoch went to a node: the driver learns the
feeding stage's number of tasks from Spark's status tracker, counts the partitions handed out, and
the heartbeat's answer tells each node how many of them it got.  The controller calls these
methods with the cluster state's lock held.
"""

from __future__ import annotations


class EpochShares:
    def __init__(self) -> None:
        self._parts: dict[int, set[int]] = {}  # epoch -> partitions handed out (to a node, or skipped)
        self._sent: dict[int, dict[int, int]] = {}  # epoch -> node -> partitions sent to it
        self._tasks: dict[int, int] = {}  # epoch -> tasks of its feeding stage, once known
        self._assigned: dict[int, dict[int, int]] = {}  # epochs whose partitions all went out -> shares
        self._fed_to: dict[int, dict[int, int]] = {}  # epoch -> partition -> the node it went to

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
        """``[epoch, partitions sent to node]`` for each epoch whose partitions all went out (heartbeat answer)."""
        return [[e, shares.get(node, 0)] for e, shares in sorted(self._assigned.items())]

    def forget_through(self, epoch: int) -> None:
        """Epochs up to ``epoch`` ended: nodes need no share of them."""
        for table in (self._parts, self._sent, self._tasks, self._assigned, self._fed_to):
            for e in [e for e in table if e <= epoch]:
                del table[e]

    def _check(self, epoch: int) -> None:
        tasks = self._tasks.get(epoch)
        if tasks is not None and epoch not in self._assigned and len(self._parts.get(epoch, ())) >= tasks:
            self._assigned[epoch] = dict(self._sent.get(epoch, {}))
