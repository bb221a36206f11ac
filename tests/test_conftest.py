"""The suite's own helpers: environment skips that CI turns into failures, ports for the servers tests start."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import REQUIRE_ALL_TIERS, free_port, import_or_skip, skip_environment


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
