"""What parallel runs produce and show: each run's result, the runs' view, the best run.

Plain data and pure functions (plus the state subclass whose snapshots carry
the runs' parameters), shared by :mod:`.runs` and the notebook layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..control import state

__all__ = ["ParallelView", "RunResult", "RunsState", "best_index", "default_metric", "default_mode", "describe_args",
           "runs_view", "scalars"]

PREFERRED_METRICS = ("val_accuracy", "accuracy", "val_loss", "loss")
_MIN_WORDS = ("loss", "error", "mse", "mae", "rmse", "perplexity")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run's outcome.

    ``value`` is what ``map_fun`` returned; ``metrics`` its last ``ctx.report``
    metrics, updated with the scalar entries of ``value`` when it returned a dict.
    """

    index: int
    args: Any
    value: Any
    metrics: dict[str, Any]
    host: str = ""
    executor_id: str = ""
    elapsed: float = 0.0

    @property
    def label(self) -> str:
        return f"run:{self.index}"

    @property
    def result(self) -> Any:
        """``value``, or ``metrics`` when the function returned nothing (what ``TFParallel.run`` lists)."""
        return self.metrics if self.value is None else self.value


@dataclasses.dataclass(frozen=True)
class ParallelView(state.ClusterView):
    """A :class:`~..state.ClusterView` of parallel runs, plus each run's parameters and the best run so far."""

    params: tuple[Mapping[str, Any], ...] = ()  # one dict per run (the grid), or () when every run got the same args
    best: int | None = None  # index of the best finished run by ``metric``
    metric: str | None = None
    mode: str = "max"


# ---------------------------------------------------------------------------
# Best run
# ---------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def default_metric(metrics: Sequence[Mapping[str, Any]]) -> str | None:
    """The metric to rank runs by when none is named: val_accuracy, accuracy, val_loss, loss (first reported)."""
    for name in PREFERRED_METRICS:
        if any(_number(mt.get(name)) is not None for mt in metrics):
            return name
    return None


def default_mode(metric: str | None) -> str:
    """``min`` for losses and errors, ``max`` for everything else (accuracy, AUC, F1…)."""
    name = (metric or "").lower()
    return "min" if any(word in name for word in _MIN_WORDS) else "max"


def best_index(metrics: Sequence[Mapping[str, Any] | None], metric: str | None, mode: str | None = None) -> int | None:
    """Index of the best entry by ``metric`` (``None`` entries: runs not finished); ties: the first."""
    if not metric:
        return None
    mode = mode or default_mode(metric)
    if mode not in ("max", "min"):
        msg = f"mode must be 'max' or 'min', got {mode!r}"
        raise ValueError(msg)
    best, best_value = None, None
    for i, mt in enumerate(metrics):
        value = _number(mt.get(metric)) if mt is not None else None
        if value is None:
            continue
        if best_value is None or (value > best_value if mode == "max" else value < best_value):
            best, best_value = i, value
    return best


def scalars(value: Any) -> dict[str, Any]:
    """The entries of a returned dict that are metrics (numbers, strings, booleans)."""
    if not isinstance(value, Mapping):
        return {}
    out = {}
    for k, v in value.items():
        if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
            v = v.item()  # a numpy scalar
        if isinstance(k, str) and isinstance(v, (int, float, str, bool)):
            out[k] = v
    return out


def describe_args(params: Mapping[str, Any] | None) -> str:
    if not params:
        return ""
    text = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return text if len(text) <= 120 else text[:117] + "..."



def runs_view(view: state.ClusterView, params: Sequence[Mapping[str, Any]], metric: str | None,
               mode: str | None) -> ParallelView:
    finished = [dict(n.metrics) if n.state == state.FINISHED else None for n in view.nodes]
    metric = metric or default_metric([mt for mt in finished if mt is not None])
    mode = mode or default_mode(metric)
    fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(state.ClusterView)}
    return ParallelView(**fields, params=tuple(params), best=best_index(finished, metric, mode), metric=metric,
                        mode=mode)


class RunsState(state.ClusterState):
    """The runs' state: its snapshots are :class:`ParallelView` s, so every panel shows parameters and the best run."""

    def __init__(self, cluster_id: str, name: str, num_runs: int, params: Sequence[Mapping[str, Any]] | None,
                 metric: str | None, mode: str | None) -> None:
        super().__init__(cluster_id, name, [("run", i) for i in range(num_runs)])
        self.params = tuple(dict(p) for p in params or ())
        self.metric = metric
        self.mode = mode

    def snapshot(self) -> ParallelView:
        return runs_view(super().snapshot(), self.params, self.metric, self.mode)
