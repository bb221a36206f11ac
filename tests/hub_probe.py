"""What another user of a shared JupyterHub machine tries: run as that user by tests/test_jupyterhub.py.

``python -m tests.hub_probe corpus URL... < NEEDLES``: where another user's secrets (a JSON list on stdin) appear in
everything this user can read —
every ``/proc/*/cmdline`` and each ``/proc/*/environ`` it may open, the files it can read in the shared temporary
folders and under the hub's folder, the Spark master's and workers' pages with every executor log they link,
each application's environment page the master links to, and every experiment and run on the MLflow tracking
server (its REST API asks no login).  ``planes HOST CLUSTER_ID CONTROL_PORT PORT...``:
register with the control server, and feed and read each data port, as a node or feeder would, without the
cluster's secret.  ``folders PATH...``: list each folder and open each file.  Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import urllib.request
from typing import Any


def _read(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _get(url: str, body: Any = None) -> str:
    """``url``'s text (a POST of ``body`` as JSON, when given), or a line saying why there is none."""
    data = None if body is None else json.dumps(body).encode()
    try:
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=20) as r:
            return r.read(4 << 20).decode("utf-8", "replace")
    except OSError as exc:
        return f"<{url}: {exc}>"


def corpus(roots: list[str], master_ui: str, worker_uis: list[str], tracking: str,
           needles: list[str]) -> dict[str, Any]:
    """Where each of ``needles`` (given on stdin, never on a command line) appears in what this user can read.

    Files and ``/proc`` are searched as they are read and not kept (a shared ``/tmp`` may hold gigabytes of other
    programs' files); the web pages, few and small, come back whole with the places searched, so that the test can
    see the search covered its subject.  ``found``: ``[needle index, place]`` pairs."""
    found: list[tuple[int, str]] = []
    searched = 0

    def search(where: str, text: str) -> None:
        nonlocal searched
        searched += 1
        found.extend((i, where) for i, needle in enumerate(needles) if needle in text)

    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for what in ("cmdline", "environ"):
                text = _read(f"/proc/{pid}/{what}")
                if text:
                    search(f"/proc/{pid}/{what}", text.replace("\0", " "))
    for root in roots:
        for folder, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                if not os.path.islink(path) and os.path.isfile(path) and (text := _read(path)) is not None:
                    search(path, text)
    pages: dict[str, str] = {}
    linked = []
    for page in [master_ui, f"{master_ui}json/", *worker_uis]:
        html = pages[page] = _get(page)
        for link in re.findall(r'href="([^"]+)"', html):
            link = link.replace("&amp;", "&")
            if "logPage" in link:  # an executor's stdout / stderr, linked from its worker's page
                linked.append(link if link.startswith("http") else page.rstrip("/") + "/" + link.lstrip("/"))
            elif re.fullmatch(r"http://[\d.]+:\d+/?", link) and page == master_ui:  # an application's own UI
                linked.append(link.rstrip("/") + "/environment/")
    for page in linked:
        pages[page] = _get(page)
    api = f"{tracking}/api/2.0/mlflow"
    experiments = pages[f"{tracking}/experiments"] = _get(f"{api}/experiments/search", {"max_results": 1000})
    try:
        ids = [e["experiment_id"] for e in json.loads(experiments).get("experiments", [])]
    except ValueError:
        ids = []
    pages[f"{tracking}/runs"] = _get(f"{api}/runs/search", {"experiment_ids": ids, "max_results": 1000})
    for where, text in pages.items():
        search(where, text)
    return {"found": found, "searched": searched, "pages": pages}


def planes(host: str, cluster_id: str, control: int, ports: list[int]) -> dict[str, Any]:
    from tfos_nb.runtime.protocol import channel, dataplane, messages

    out: dict[str, Any] = {"control": None, "data": {}}
    codec = messages.Codec(os.urandom(32), cluster_id, "node0")  # the right cluster id, not its secret
    client = channel.ControlClient(codec, (host, control), timeout=15)
    try:
        reply = client.request(messages.Register(node=0, host=host, port=1, executor_id="0", pid=os.getpid()))
        out["control"] = f"answered: {reply!r}"
    except Exception as exc:
        out["control"] = f"refused: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    for port in ports:
        with socket.create_connection((host, port), timeout=10) as s:
            s.settimeout(5)
            try:
                hello = s.recv(len(dataplane.MAGIC) + dataplane.NONCE)
            except OSError:
                hello = b""
            if not hello.startswith(dataplane.MAGIC):
                continue  # not a data port (TensorFlow's own, TensorBoard's)
            s.sendall(os.urandom(2 * dataplane.NONCE))  # a wrong answer to the challenge, then read what comes
            try:
                after = s.recv(65536)
            except OSError:
                after = b""
        result = {"bytes_after_wrong_answer": len(after)}
        try:
            sock = dataplane.client_connect(host, port, os.urandom(32), {"partition": 0, "gen": 1}, timeout=10)
            try:
                dataplane.send_frame(sock, dataplane.Kind.HEADER, b"{}")
                result["feed"] = "accepted"
            finally:
                sock.close()
        except Exception as exc:
            result["feed"] = f"refused: {type(exc).__name__}: {exc}"
        out["data"][str(port)] = result
    return out


def folders(paths: list[str]) -> dict[str, str]:
    out = {}
    for path in paths:
        try:
            if os.path.isdir(path):
                out[path] = f"listed: {os.listdir(path)}"
            else:
                with open(path, "rb") as f:
                    out[path] = f"read {len(f.read(1 << 16))} bytes"
        except OSError as exc:
            out[path] = f"refused: {exc.strerror}"
    return out


def main(argv: list[str]) -> None:
    if argv[0] == "corpus":
        result: Any = corpus(json.loads(argv[1]), argv[2], json.loads(argv[3]), argv[4], json.load(sys.stdin))
    elif argv[0] == "planes":
        result = planes(argv[1], argv[2], int(argv[3]), [int(p) for p in argv[4:]])
    else:
        result = folders(argv[1:])
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
