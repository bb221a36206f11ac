"""``%tfos_doctor``: the pre-flight doctor's report as a table in the cell (text outside a notebook front-end)."""

from __future__ import annotations

import html
from typing import Any

from ..runtime.doctor import FAIL, OK, WARN, Report
from ._magic_args import argument, magic_arguments, parse_argstring

__all__ = ["ReportView", "report_html", "tfos_doctor"]

_COLOURS = {OK: "#1a7f37", WARN: "#9a6700", FAIL: "#cf222e"}


def report_html(report: Report) -> str:
    """The report as one HTML table: status, check, where, what was found and the fix (pure; unit-tested)."""
    esc = html.escape
    rows = []
    for c in report.checks:
        colour = _COLOURS.get(c.status, "inherit")
        fix = f"<br><b>fix:</b> {esc(c.fix)}" if c.fix else ""
        rows.append(f'<tr class="tfos-doctor-{c.status.lower()}"><td style="color:{colour};font-weight:bold">'
                    f"{esc(c.status)}</td><td>{esc(c.area)}</td><td>{esc(c.where)}</td>"
                    f'<td style="text-align:left">{esc(c.detail)}{fix}</td></tr>')
    return (f'<div class="tfos-doctor"><p>{esc(report.summary())}</p><table>'
            "<thead><tr><th>status</th><th>check</th><th>where</th><th>found / fix</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


class ReportView:
    """What the cell displays: HTML in a notebook, the text report in a terminal."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def _repr_html_(self) -> str:
        return report_html(self.report)

    def __repr__(self) -> str:
        return self.report.text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.report.text())


@magic_arguments()
@argument("--nodes", type=int, default=None, metavar="N",
          help="nodes the cluster will have (default: TFOSMagics.default_workers)")
@argument("--feeders", type=int, default=0, metavar="K", help="feeding tasks per epoch (partitions of --data)")
@argument("--export-dir", metavar="DIR",
          help="a directory the nodes will write (export, checkpoints, logs): writable and shared by every executor?")
@argument("--gpus", type=int, default=None, metavar="G", help="GPUs per node the cluster will ask for")
@argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="give up on the doctor's Spark stage after this")
def tfos_doctor(self: Any, line: str = "") -> None:
    """Check the notebook's Spark application before starting a cluster, in seconds.

    One barrier stage of one task per node (no TensorFlow cluster) checks the task
    slots, the Spark settings, each executor's Python, tfos_nb, TensorFlow, Keras and
    pyspark against the driver's, the GPUs Spark assigns, that every node's host reaches
    every other's (and the driver), and with --export-dir that the directory is
    writable from every executor and shared by all.  Shows OK / WARN / FAIL with the
    executor or host and the fix; the report is kept as ``_tfos_doctor``.
    """
    from IPython.core.error import UsageError
    from IPython.display import display

    from ..runtime.doctor.job import doctor
    from ._spark import find_spark_context

    args = parse_argstring(tfos_doctor, line)
    nodes = self.default_workers if args.nodes is None else args.nodes
    if nodes < 1 or args.feeders < 0 or (args.gpus is not None and args.gpus < 0) or not args.timeout > 0:
        raise UsageError("--nodes must be at least 1; --feeders, --gpus at least 0; --timeout positive")
    ns = self.shell.user_ns
    spark = find_spark_context(ns)
    if spark is None:
        raise UsageError("no Spark session in this notebook: create `spark` first (the doctor checks an existing "
                         "Spark application; the magics' embedded Spark needs no check)")
    report = doctor(spark, nodes, feeders=args.feeders, export_dir=args.export_dir, num_gpus=args.gpus,
                    timeout=args.timeout)
    ns["_tfos_doctor"] = report
    display(ReportView(report))
