"""The driver's half of recovery: what each attempt of a job with retries restores and feeds.

The job's retry loop (:mod:`tfos_nb.runtime.driver.retry`) asks :class:`Recovery` for each attempt's shape (fewer
training nodes when slots did not come back and the job may shrink), its nodes' environment (the backup they
restore) and what it feeds (the epochs from the resumed one on, without the rows its backup had trained on).
The node's half is :mod:`.keras_backup`; both read :mod:`.ledger`'s files in :mod:`.folder`'s job folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .folder import JobBackups

if TYPE_CHECKING:
    from ..driver.options import ClusterShape, RetryPolicy


class Recovery:
    """What each attempt of one job with retries restores and feeds; the owner of the job's backup folder.

    ``env(attempt)`` plans the attempt from the backups so far (the newest one training can resume from
    exactly) and gives its nodes' environment; ``feed(num_epochs)`` is then what it feeds: the epochs from the
    resumed one on, and the rows of that epoch its backup had not trained on.
    """

    def __init__(self, sc: Any, policy: RetryPolicy) -> None:
        from ..driver.launch.slots import session_master

        self.backups = JobBackups.open(session_master(sc), policy.backup_dir) if policy.retries else None
        self.sc, self.min_workers, self.shrink_after = sc, policy.min_workers, float(policy.shrink_after)
        self.shrunk = ""  # "on 1 of 2 training nodes", while the running attempt runs on fewer

    def shape(self, attempt: int, shape: ClusterShape) -> ClusterShape:
        """The cluster attempt ``attempt`` starts: ``shape``, unless the job may shrink (``min_workers``) and the
        slots lost with the failed attempt did not come back within ``shrink_after`` s — then as many fewer
        chief/worker nodes as slots are missing, down to ``min_workers``."""
        self.shrunk = ""
        if attempt == 1 or self.min_workers is None or not hasattr(self.sc, "_jsc"):
            return shape
        from ..driver.launch.slots import settled_slots

        slots, _ = settled_slots(self.sc, shape.num_nodes, self.shrink_after)
        missing, trainers = shape.num_nodes - slots, shape.trainers
        if missing <= 0 or trainers - missing < self.min_workers:
            return shape  # all came back, or too few would: the start waits for them, and fails naming them
        self.shrunk = (f"on {trainers - missing} of {trainers} training nodes ({missing} task slot(s) did not "
                       f"come back within {self.shrink_after:g} s)")
        return shape.with_trainers(trainers - missing)

    def env(self, attempt: int) -> dict[str, str]:
        return dict(self.backups.attempt(attempt)) if self.backups is not None else {}

    def epochs(self, num_epochs: int) -> int:
        """Epochs the running attempt feeds of a job's ``num_epochs`` (0: TensorFlowOnSpark's 10, as ``train``)."""
        if self.backups is None:
            return num_epochs
        from ..driver.cluster import DEFAULT_EPOCHS

        return self.backups.resume.epochs_to_feed(num_epochs or DEFAULT_EPOCHS)

    @property
    def skip_rows(self) -> Any:
        return self.backups.resume.skip if self.backups is not None else None

    def describe(self) -> str:
        """Where the running attempt resumed from: ``"from the backup at epoch 2, step 14 (global step 74); …"``,
        and on how many nodes when fewer."""
        said = self.backups.describe() if self.backups is not None else "from the first step (no backup folder)"
        return f"{said}, {self.shrunk}" if self.shrunk else said

    def close(self) -> None:
        if self.backups is not None:
            self.backups.close()
