"""One logger tree (``tfos_nb.*``) and one level setting: ``TFOS_NB_LOG_LEVEL`` at import, ``%config
TFOSMagics.log_level`` in a kernel, passed to the node processes (issue 45, item 6).

The import cases run in fresh interpreters (the level is read once, at import); the node case on a real cluster.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import cloudpickle
import pytest

from tests.conftest import ipython_with_tfos_nb, spark_fixture, start_cluster
from tfos_nb import TFCluster
from tfos_nb.runtime import logs

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HELLO = "import logging, tfos_nb; logging.getLogger('tfos_nb.runtime.x').debug('hello'); " \
        "logging.getLogger('tfos_nb.runtime.x').warning('careful')"


def run_python(code: str, level: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != logs.LEVEL_ENV}
    if level is not None:
        env[logs.LEVEL_ENV] = level
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)


def test_the_level_from_the_environment_at_import():
    assert run_python(HELLO, "debug").stderr.splitlines() == [
        "tfos_nb DEBUG tfos_nb.runtime.x: hello", "tfos_nb WARNING tfos_nb.runtime.x: careful"]
    assert run_python(HELLO, "WARNING").stderr.splitlines() == ["tfos_nb WARNING tfos_nb.runtime.x: careful"]
    assert run_python(HELLO, None).stderr.splitlines() == ["careful"]  # untouched: Python's own last resort
    bad = run_python(HELLO, "LOUD")  # never a failed import: said once, ignored
    assert bad.stderr.splitlines() == [
        "tfos_nb: the tfos_nb log level must be one of DEBUG, INFO, WARNING, ERROR (any case), got 'LOUD' "
        "(from TFOS_NB_LOG_LEVEL); ignored", "careful"]


def test_an_application_s_own_logging_gets_each_record_once():
    code = "import logging, sys; logging.basicConfig(stream=sys.stderr, format='app %(name)s: %(message)s'); " + HELLO
    assert run_python(code, "INFO").stderr.splitlines() == ["tfos_nb WARNING tfos_nb.runtime.x: careful"]
    assert run_python(code, None).stderr.splitlines() == ["app tfos_nb.runtime.x: careful"]


def test_the_magics_setting_sets_the_tree_and_what_nodes_inherit(monkeypatch, caplog):
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    ip = ipython_with_tfos_nb()
    try:
        ip.run_line_magic("config", 'TFOSMagics.log_level = "info"')
        assert logging.getLogger("tfos_nb").level == logging.INFO
        assert logs.node_env() == {logs.LEVEL_ENV: "INFO"}
        ip.run_line_magic("config", 'TFOSMagics.log_level = "LOUD"')  # %config says why, and the kernel lives
        assert "expected any of ['', 'DEBUG', 'INFO', 'WARNING', 'ERROR'] (case-insensitive), not the str 'LOUD'" \
            in caplog.text
        assert logging.getLogger("tfos_nb").level == logging.INFO  # a bad value changes nothing
    finally:
        ip.run_line_magic("config", 'TFOSMagics.log_level = ""')
    assert logging.getLogger("tfos_nb").level == logging.NOTSET and logs.node_env() == {}
    assert not [h for h in logging.getLogger("tfos_nb").handlers if isinstance(h, logs._Handler)]


spark = spark_fixture(2)


def fed_reader(args, ctx):
    feed = ctx.get_data_feed()
    while not feed.should_stop():
        feed.next_batch(100)


@pytest.mark.slow
def test_a_node_logs_at_the_notebook_s_level(sc, monkeypatch, caplog, no_leaks):
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    logs.set_level("DEBUG")
    try:
        with caplog.at_level(logging.DEBUG, logger="tfos_nb"):
            logging.getLogger("tfos_nb").addHandler(caplog.handler)
            try:
                cluster = start_cluster(sc, fed_reader, {}, 1, master_node="chief", input_mode=TFCluster.InputMode.SPARK)
                cluster.train(sc.parallelize(range(500), 2), 1)
                cluster.shutdown(timeout=120)
            finally:
                logging.getLogger("tfos_nb").removeHandler(caplog.handler)
    finally:
        logs.set_level(None)
    driver = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("chief:0 registered: host ") for m in driver), driver
    assert any(m.startswith("train partition 1 of epoch 1 (executor ") and m.endswith("goes to chief:0") for m in driver), driver
    node = list(cluster.logs("chief:0")["chief:0"])
    assert any(line.startswith("tfos_nb DEBUG tfos_nb.runtime.executor.feed.server: data connection: train of partition ")
               for line in node), node
