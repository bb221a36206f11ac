"""The suite's own helpers: environment skips that CI turns into failures, ports for the servers tests start."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import REQUIRE_ALL_TIERS, free_port, group_modules, import_or_skip, skip_environment, xdist_groups


@pytest.mark.parametrize("value", [None, "", "0"])
def test_an_environment_skip_is_a_skip_outside_ci(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(REQUIRE_ALL_TIERS, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_ALL_TIERS, value)
    with pytest.raises(pytest.skip.Exception, match="no network namespaces"):
        skip_environment("no network namespaces")
    with pytest.raises(pytest.skip.Exception, match="cannot import tfos_nb_no_such_module"):
        import_or_skip("tfos_nb_no_such_module")


def test_an_environment_skip_fails_where_every_tier_must_run(monkeypatch):
    monkeypatch.setenv(REQUIRE_ALL_TIERS, "1")
    with pytest.raises(pytest.fail.Exception, match=f"no network namespaces; {REQUIRE_ALL_TIERS} is set"):
        skip_environment("no network namespaces")
    with pytest.raises(pytest.fail.Exception, match="cannot import tfos_nb_no_such_module"):
        import_or_skip("tfos_nb_no_such_module")
    assert import_or_skip("json").__name__ == "json"


def test_ci_requires_every_tier():
    from pathlib import Path

    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert f"export {REQUIRE_ALL_TIERS}=1" in ci


def test_free_port_is_below_the_ephemeral_range_and_free():
    # a port bind(0) handed out is in the ephemeral range, where an outgoing connection may take it first
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low, (port, low)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_modules_that_share_a_spark_session_run_one_after_another():
    names = ["a", "b2", "c", "d3", "e2", "f", "g3", "h2"]
    keys = {"b2": (2,), "e2": (2,), "h2": (2,), "d3": (3,), "g3": (3,)}
    assert group_modules(names, keys) == ["a", "b2", "e2", "h2", "c", "d3", "g3", "f"]
    assert group_modules(names, {}) == names


def test_modules_sharing_a_resource_are_one_test_worker_s_group():
    names = ["tests.a", "tests.b2", "tests.e2", "tests.test_connect", "tests.test_connect_jobs", "tests.d3"]
    keys = {"tests.b2": ("spark", 2), "tests.e2": ("spark", 2), "tests.d3": ("spark", 3)}
    assert xdist_groups(names, keys) == {"tests.a": "a", "tests.b2": "shared-0", "tests.e2": "shared-0",
                                         "tests.test_connect": "connect", "tests.test_connect_jobs": "connect",
                                         "tests.d3": "shared-1"}


def test_the_suite_runs_each_shared_session_s_modules_together(request):
    from tests import conftest

    order = list(dict.fromkeys(item.module.__name__ for item in request.session.items))
    runs = [conftest._SHARED_MODULES[n] for n in order if n in conftest._SHARED_MODULES]
    assert all(key not in runs[:i] or runs[i - 1] == key for i, key in enumerate(runs)), order
