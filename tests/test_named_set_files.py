"""A named set's partitions stay in the node's private folder: a set's name is never a path (``.``, ``..``, ``/``),
the driver and the node refuse the same names with the same sentence, and a partition's file is new, ``0600``,
in folders of ``0700``, never written through a link (the real node-side writer and the driver's check; the sets
fed through a real cluster: ``tests/test_validation_feed.py``)."""

from __future__ import annotations

import os
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tests.server_abuse import as_nobody, as_nobody_wait, writable_by_all
from tfos_nb.runtime.driver.feeding.named_sets import named_sets
from tfos_nb.runtime.executor.feed.conn import Conn
from tfos_nb.runtime.executor.feed.named_sets import NamedFeeds, NamedReader, check_name

SENTENCE = re.escape("a feed's name is letters, digits, '_', '.' or '-' (up to 64), other than '.' and '..', got ")


def _conn(name: str, partition: int = 0) -> Conn:
    a, b = socket.socketpair()
    b.close()
    return Conn(a, {"partition": partition, "gen": 1, "feed": name})


def _batch(*ids: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(ids), pa.int64())], names=["id"])


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    """The node's private folder (``tempfile.mkdtemp``'s ``0700``), with room beside it to see what leaks out."""
    root = tmp_path / "node"
    root.mkdir(mode=0o700)
    yield root


@pytest.mark.parametrize("name", [".", "..", "", "a/b", "../x", "a\x00b"])
def test_a_name_that_is_not_a_folder_of_its_own_is_refused_by_the_driver_and_the_node(name: str, node: Path) -> None:
    with pytest.raises(ValueError, match=SENTENCE + re.escape(repr(name))):
        check_name(name)
    with pytest.raises(ValueError, match=SENTENCE):
        named_sets(None, name, None, None)  # train(rdd, qname=name)
    with pytest.raises(ValueError, match=SENTENCE):
        named_sets(None, "input", None, {name: None})  # train(df, feeds={name: ...})
    feeds = NamedFeeds("worker:0", lambda: False, root=str(node))
    with pytest.raises(ValueError, match=SENTENCE):
        feeds.put(_conn(name), 1, _batch(1, 2))  # what a feeding task that skipped the driver's check would send
    assert os.listdir(node.parent) == ["node"]  # nothing landed beside the node's folder


def test_a_sets_files_are_0600_in_folders_of_0700_whatever_the_umask(node: Path) -> None:
    feeds = NamedFeeds("worker:0", lambda: False, root=str(node))
    old = os.umask(0)
    try:
        conn = _conn("val.v2")  # a name with dots still names a set
        feeds.put(conn, 1, _batch(1, 2))
        feeds.put(conn, 1, _batch(3))
        feeds.end_conn(conn)
    finally:
        os.umask(old)
    modes = {str(p.relative_to(node)): stat.S_IMODE(p.stat().st_mode) for p in node.rglob("*")}
    assert modes == {"val.v2": 0o700, "val.v2/1": 0o700, "val.v2/1/p0.arrow": 0o600}, modes
    feeds.update({"val.v2": {"version": 1, "parts": [0], "passes": 1, "sample": {}}})
    assert [v for _, b in NamedReader(feeds, "val.v2").take(5, True, [0]) for v in b.column(0).to_pylist()] == [1, 2, 3]
    feeds.close()


def test_a_link_planted_at_a_partitions_file_is_not_written_through(tmp_path: Path) -> None:
    as_nobody()
    precious = tmp_path / "precious"
    precious.write_text("precious\n")
    with writable_by_all(0o1777) as shared:
        node = shared / "node"
        folder = node / "validation" / "1"
        folder.mkdir(parents=True)
        loosened = [node, node / "validation", folder]
        for f in loosened:  # what a folder another user can write allows (the test loosens the node's for a moment)
            f.chmod(0o777)
        conn = _conn("validation")
        temporary = folder / f"p0.arrow.{id(conn)}.part"
        as_nobody_wait(lambda: os.symlink(precious, temporary))
        for f in loosened:
            f.chmod(0o700)
        feeds = NamedFeeds("worker:0", lambda: False, root=str(node))
        with pytest.raises(OSError, match=re.escape(str(temporary))):
            feeds.put(conn, 1, _batch(1, 2))
        assert precious.read_text() == "precious\n"
