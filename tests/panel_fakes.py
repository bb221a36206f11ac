"""Stand-ins the panel tests share: frozen views to render, a clock, the kernel's comm (ipywidgets' way)."""

from __future__ import annotations

import json

from tfos_nb.runtime.driver.control.state import ClusterView, NodeView


def node(state="running", **kw) -> NodeView:
    base = dict(
        index=0, job_name="chief", task_index=0, state=state, host="10.0.0.5", executor_id="1", device="CPU", last_heartbeat_age=0.4
    )
    base.update(kw)
    return NodeView(**base)


def cluster(*nodes: NodeView, state="running", **kw) -> ClusterView:
    base = dict(cluster_id="c1", name="digits", state=state, started_at=0.0, elapsed=12.34, nodes=nodes or (node(),), job_group="tfos-c1")
    base.update(kw)
    return ClusterView(**base)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class CountingComm:
    """Stands in for the kernel's comm, as ipywidgets' own tests do (``tests/utils.py: DummyComm``)."""

    kernel = "Truthy"
    sent: list[tuple[float, int]] = []
    clock: FakeClock | None = None
    _ids = iter(range(10**9))

    def __init__(self, **kwargs) -> None:
        self.opened = kwargs
        # One id per widget, as a kernel gives: widgets are looked up by it.
        self.comm_id = kwargs.get("comm_id") or f"test-comm-{next(CountingComm._ids)}"

    def open(self, *args, **kwargs) -> None:
        pass

    def on_msg(self, *args, **kwargs) -> None:
        pass

    def close(self, *args, **kwargs) -> None:
        pass

    def send(self, data=None, buffers=None, **kwargs) -> None:
        CountingComm.sent.append((self.clock() if self.clock else 0.0, len(json.dumps(data))))


class FakeDisplay:
    """IPython's ``display``/``DisplayHandle.update``, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, obj, **kw):
        self.calls.append(("display", obj, kw))
        return self

    def update(self, obj, **kw):
        self.calls.append(("update", obj, kw))
