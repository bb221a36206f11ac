"""The suite's one polling helper, :func:`tests.conftest.wait_until`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import wait_until


def calls_until(n: int, value: object, fail_with: type[BaseException] | None = None):
    """A predicate falsy (or raising ``fail_with``) on its first ``n - 1`` calls, then ``value``."""
    seen = []

    def predicate() -> object:
        seen.append(None)
        if len(seen) < n:
            if fail_with is not None:
                raise fail_with("not yet")
            return None
        return value

    return predicate, seen


def test_returns_the_first_truthy_value():
    predicate, seen = calls_until(3, {"port": 8080})
    assert wait_until(predicate, 10, 0.001) == {"port": 8080}
    assert len(seen) == 3


def test_at_the_deadline_returns_the_falsy_value_or_raises_naming_what():
    assert wait_until(lambda: [], 0.05, 0.01) == []
    with pytest.raises(AssertionError, match="the server: not ready after 0.05 s"):
        wait_until(lambda: 0, 0.05, 0.01, what="the server")


def test_ignored_exceptions_mean_not_yet_others_propagate():
    predicate, seen = calls_until(3, True, fail_with=ConnectionRefusedError)
    assert wait_until(predicate, 10, 0.001, ignore=(OSError,)) is True
    assert len(seen) == 3
    predicate, _ = calls_until(3, True, fail_with=ConnectionRefusedError)
    with pytest.raises(ConnectionRefusedError):
        wait_until(predicate, 10, 0.001)


def test_a_process_that_exits_ends_the_wait():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(timeout=60)
    with pytest.raises(AssertionError, match="upstream: process exited with 3"):
        wait_until(lambda: False, 60, 0.01, what="upstream", proc=proc)
