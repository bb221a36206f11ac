"""The feed's watch over a feeding job (``BatchFeed._await``), fast tier: a Ctrl-C / ■ tears the cluster down and
reaches the caller as a KeyboardInterrupt, also when py4j, interrupted in the middle of a call, raised its own
error in the interrupt's place (seen in CI: ``Py4JError: Gateway must be connected to send cancel cmd.`` out of
``train()``, and the cluster's nodes left running)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from tfos_nb.runtime.driver.control import state
from tfos_nb.runtime.driver.feeding.batch import BatchFeed


class Py4JError(Exception):
    """Stands for ``py4j.protocol.Py4JError`` (its handler of a KeyboardInterrupt raises one when the socket it
    tears down is not connected)."""


class FeedingJob:
    def __init__(self) -> None:
        self.cancelled = 0
        self.error = None
        self._done = threading.Event()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def cancel(self, join_timeout: float = 10.0) -> None:
        self.cancelled += 1


class Job:
    """The driver's job as the feed uses it: its state, its controller, close()."""

    def __init__(self) -> None:
        self.state = state.ClusterState("c1", "feedtest", [("chief", 0), ("worker", 0)])
        self.controller = SimpleNamespace(feed_errors=[], lost_feeds=0, heartbeat_timeout=10.0)
        self.name = "feedtest"
        self.closed = 0
        self.forgotten: list[object] = []

    def close(self, wait: float | None = None) -> None:
        self.closed += 1

    def forget(self, job: object) -> None:
        self.forgotten.append(job)


def py4j_in_place_of_the_interrupt() -> None:
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise Py4JError("Gateway must be connected to send cancel cmd.")  # noqa: B904 - py4j's own way


def plain_interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("tick", [plain_interrupt, py4j_in_place_of_the_interrupt])
def test_an_interrupt_tears_the_cluster_down_and_is_raised_as_one(tick):
    job, feeding = Job(), FeedingJob()
    with pytest.raises(KeyboardInterrupt):
        BatchFeed(job, {})._await(feeding, "feeding", tick=tick)
    assert (job.closed, feeding.cancelled, job.forgotten) == (1, 1, [feeding])


def test_another_error_of_a_tick_is_not_taken_for_an_interrupt():
    def broken() -> None:
        raise Py4JError("the JVM is gone")

    job, feeding = Job(), FeedingJob()
    with pytest.raises(Py4JError, match="the JVM is gone"):
        BatchFeed(job, {})._await(feeding, "feeding", tick=broken)
    assert job.forgotten == [feeding]
