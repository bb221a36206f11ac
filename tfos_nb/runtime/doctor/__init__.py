"""The pre-flight doctor: ``doctor(spark, nodes=N)`` (``tfos_nb.doctor``) checks a Spark application before a
cluster starts.

One package, a module a side: ``job.py`` (the driver's, with :func:`~.job.doctor`) reads the session's
facts and runs one short barrier stage of ``probe.py`` (the executor's, shipped by value), which
collects each slot's facts; the verdicts — OK, WARN or FAIL, the executor or host they concern, and the fix — are
computed from plain dicts (:func:`~.verdicts.verdicts`), so they are testable without Spark.
:class:`Report` is the outcome; ``text()`` renders it outside a notebook, the magics layer renders
it as a table in one.  No TensorFlow cluster starts, and the doctor knows nothing of starting one:
``driver/launch/start.py`` calls :func:`~.job.doctor`, never the reverse.  What this module holds
(the report) and ``verdicts.py`` are shared by both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .verdicts import FAIL, OK, WARN, Check, verdicts

__all__ = ["FAIL", "OK", "WARN", "Check", "DoctorFailed", "Report", "verdicts"]


@dataclass(frozen=True)
class Report:
    nodes: int
    checks: tuple[Check, ...]
    backend: str = "classic"
    master: str = ""
    elapsed_s: float = 0.0
    executors: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]

    @property
    def ok(self) -> bool:
        """No FAIL (warnings allowed)."""
        return not self.failures

    def summary(self) -> str:
        counts = ", ".join(f"{sum(c.status == s for c in self.checks)} {s}" for s in (OK, WARN, FAIL))
        return (f"tfos_nb doctor: {self.nodes} node(s) on {self.master or '?'} ({self.backend}), "
                f"{len(self.checks)} checks in {self.elapsed_s:.1f} s: {counts}")

    def text(self) -> str:
        lines = [self.summary()]
        for c in self.checks:
            lines.append(f"{c.status:<4}  {c.area:<10}  {c.where}: {c.detail}")
            if c.fix:
                lines.append(f"{'':<16}fix: {c.fix}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def raise_for_failures(self) -> None:
        if self.failures:
            raise DoctorFailed(self)


class DoctorFailed(RuntimeError):
    """The doctor found a FAIL; ``report`` has every check."""

    def __init__(self, report: Report) -> None:
        self.report = report
        lines = [f"{c.where}: {c.detail} — fix: {c.fix}" if c.fix else f"{c.where}: {c.detail}" for c in report.failures]
        super().__init__(f"the pre-flight doctor found {len(lines)} problem(s); no cluster was started:\n"
                         + "\n".join(lines))
