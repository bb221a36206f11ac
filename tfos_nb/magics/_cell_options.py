"""The checks both cell magics make on their options: one parser for ``--args``, ``--grid``, ``--name``.

Each raises IPython's ``UsageError`` with a one-line message (no traceback in
the cell).  ``--args`` is read the same way by ``%%tfos_cluster`` and
``%%tfos_parallel``: a Python expression evaluated in the notebook, a mapping
or a namespace (``types.SimpleNamespace``, ``argparse.Namespace``, the
runtime's ``Namespace``), quoted if it has spaces, whose keys are names usable
as ``args.NAME``.
"""

from __future__ import annotations

import argparse
import contextlib
import keyword
import types
from collections.abc import Iterator, Mapping
from typing import Any

from IPython.core.error import UsageError

from ..runtime.args import Namespace
from ..runtime.option_error import OptionError
from ._run_handle import RunHandle

__all__ = ["Namespace", "cell_args", "check_name", "check_timeout", "data_var", "grid", "node_env", "tracking", "usage",
           "usage_errors", "validation_var"]

#: how ``%%tfos_cluster`` names the options the job's groups check (ClusterShape, RetryPolicy, JobOptions and
#: deterministic mode), so that their errors name the flag or setting the user gave
FLAGS = {"trainers": "--workers", "ps": "--ps", "retries": "--retries", "min_workers": "--min-workers",
         "seed": "--seed", "deterministic": "--deterministic", "shrink_after": "TFOSMagics.shrink_after",
         "stall_after": "TFOSMagics.stall_after"}


def usage(msg: str) -> UsageError:
    return UsageError(msg)


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """The job's groups as a cell builds them: their ``ValueError`` is the cell's ``UsageError``, each option they
    name said as the cell gives it (``--retries``, see :data:`FLAGS`)."""
    try:
        yield
    except OptionError as exc:
        raise usage(exc.said(FLAGS)) from None
    except ValueError as exc:
        raise usage(str(exc)) from None


def _attribute_keys(values: Mapping[Any, Any], what: str) -> None:
    # keywords (``class``) pass: ``args["class"]`` reads them, as %%tfos_cluster always allowed
    bad = [k for k in values if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise usage(f"{what} keys must be names usable as attributes (args.NAME), got {bad[0]!r}")


def unquoted(text: str | None) -> str | None:
    """A cell option's value without the quotes around it (IPython's argument splitter keeps them)."""
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def cell_args(expr: str | None, ns: Mapping[str, Any]) -> dict[str, Any]:
    """``--args EXPR``: a dict of what every node or run gets as ``args`` ({} without --args)."""
    expr = unquoted(expr)
    if not expr:
        return {}
    try:
        given = eval(expr, dict(ns))  # noqa: S307 - the user's own notebook expression
    except Exception as exc:  # noqa: BLE001
        raise usage(f"--args {expr}: {type(exc).__name__}: {exc}") from None
    if isinstance(given, Mapping):
        values = dict(given)
    elif isinstance(given, (types.SimpleNamespace, argparse.Namespace, Namespace)):
        values = dict(vars(given))
    else:
        raise usage(f"--args must be a dict or a namespace, got {type(given).__name__}")
    _attribute_keys(values, "--args")
    return values


def grid(var: str, ns: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``--grid VAR``: the notebook's list of dicts, one per run."""
    if var not in ns:
        raise usage(f"--grid {var}: no such variable in the notebook")
    value = ns[var]
    if isinstance(value, Mapping):
        raise usage(
            f"--grid {var}: expected a list of dicts (one per run), got a dict; for every combination of a dict "
            "of lists: [dict(zip(d, v)) for v in itertools.product(*d.values())]"
        )
    if not isinstance(value, (list, tuple)):
        raise usage(f"--grid {var}: expected a list of dicts (one per run), got {type(value).__name__}")
    if not value:
        raise usage(f"--grid {var}: the list is empty")
    for i, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise usage(f"--grid {var}: entry {i} is a {type(entry).__name__}, not a dict")
        _attribute_keys(entry, f"--grid {var}: entry {i}:")
    return [dict(entry) for entry in value]


def check_name(name: str, ns: Mapping[str, Any], current: Any) -> None:
    """``--name``: a variable name that is free, or holds a handle (``current``: the magics' own under it)."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise usage(f"--name {name}: not a valid Python variable name")
    if name in ns and not (isinstance(ns[name], RunHandle) or ns[name] is current):
        raise usage(
            f"--name {name}: `{name}` is already defined in the notebook (type {type(ns[name]).__name__}); "
            "choose another --name"
        )


def check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout <= 0:
        raise usage(f"--timeout must be more than 0 seconds, got {timeout:g}")


def data_var(ns: Mapping[str, Any], var: str, flag: str = "--data") -> Any:
    """``--data VAR``: the notebook's Spark DataFrame (batch or streaming) or RDD."""
    if var not in ns:
        raise usage(f"{flag} {var}: no such variable in the notebook")
    value = ns[var]
    try:
        from pyspark import RDD
        from pyspark.sql import DataFrame
    except ImportError:  # pragma: no cover - pyspark is a dependency
        raise usage(f"{flag} needs pyspark installed") from None
    if not isinstance(value, (DataFrame, RDD)):
        raise usage(f"{flag} {var}: expected a Spark DataFrame or RDD, got {type(value).__name__}")
    return value


def validation_var(ns: Mapping[str, Any], var: str | None, data: Any, data_name: str | None) -> Any:
    """``--validation-data VAR``: a DataFrame or RDD fed once as the named set ``validation``, checked as the
    runtime checks it (batch data, the training data's columns) so that bad input is a UsageError before any job."""
    if var is None:
        return None
    if data is None:
        raise usage("--validation-data needs --data (the training data it validates)")
    value = data_var(ns, var, "--validation-data")
    from ..runtime.driver.feeding.named_sets import named_sets

    try:
        named_sets(data, "input", value, None)
    except (TypeError, ValueError) as exc:
        raise usage(f"--validation-data {var}: {exc}") from None
    return value


def node_env(tf_threads: int) -> dict[str, str]:
    """Environment of every node or run: quiet TensorFlow, ``tf_threads`` threads (TFOSMagics.tf_threads;
    0: the executor derives them from ``spark.task.cpus``, -1: TensorFlow's own default)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if tf_threads < 0:
        env["TFOS_TF_THREADS"] = "0"
    if tf_threads > 0:
        env.update(
            TF_NUM_INTRAOP_THREADS=str(tf_threads),
            TF_NUM_INTEROP_THREADS=str(tf_threads + 1),
            OMP_NUM_THREADS=str(tf_threads),
        )
    return env


def tracking(setting: Any, kind: str, **arguments: Any) -> Any:
    """``--mlflow [EXPERIMENT]`` (or ``TFOSMagics.mlflow``): the job's MLflow run, started now, on the cell's
    thread (where ``with mlflow.start_run():`` is active); None when the job is not tracked.

    The handle ends it with the job (:mod:`tfos_nb.runtime.driver.tracking`).  Without MLflow
    installed, asking for it raises ImportError naming the ``tfos_nb[mlflow]`` extra.
    """
    from ..runtime.driver import tracking as experiment_tracking

    return experiment_tracking.resolve(setting, kind, arguments)[0]
