"""Hosted notebooks for real: two users on one JupyterHub, one shared Spark standalone cluster (issue 68).

A real JupyterHub (PAM logins, the local-process spawner, ``configurable-http-proxy``) with two Unix users, each
server started as its user with tfos_nb's server extension; a Spark master and two workers shared by both users'
kernels, and an MLflow tracking server (tests/hub_fixture.py).  Both users log in in a real Chromium and run the
quickstart's cells at the same time (tests/hub_notebook.py), the training cell with ``--tensorboard``, alice's also
with ``--mlflow`` and a tracking URI carrying her password.  Its nodes wait at the end of ``model.fit`` (a Keras
callback that waits for a file the test writes), so that what the tests look at — each user's TensorBoard through
their own server's route, and what ``tfosbob`` can reach of ``tfosalice``'s job — is there for as long as they look;
then both finish, with their accuracy, and alice's job is one run on the tracking server.  Meanwhile alice runs a
short job with retries on an embedded Spark of her own (its nodes run as her, so it keeps backups), held likewise
while bob tries her backup folders.  Everything ``tfosbob`` tries runs as ``tfosbob`` (tests/hub_probe.py).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.conftest import wait_until
from tests.hub_fixture import SPARK_USER, USERS, Hub, Kernel
from tests.hub_notebook import Run, backed_cells, hold_folder, quickstart_cells

pytestmark = [pytest.mark.slow, pytest.mark.hub]

REPO = Path(__file__).resolve().parents[1]
ALICE, BOB = USERS
CHROMIUM = "/usr/bin/chromium"
TRACKING_PASSWORD = secrets.token_urlsafe(16)  # alice's credentials on the tracking server, in her tracking URI


def login(browser: Any, hub: Hub, user: str) -> Any:
    """A browser context logged in through the hub's own login form (PAM: the user's Unix password)."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{hub.url}hub/login?next=%2Fhub%2Fhome")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.passwords[user])
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/home$"), timeout=60_000)
    page.close()
    return context


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    t0 = time.monotonic()
    h = Hub().start()
    print(f"\n[hub] JupyterHub, its proxy and a Spark master with 2 workers up in {time.monotonic() - t0:.0f} s")
    try:
        yield h
    finally:
        left = h.stop()
        assert not left, f"left running after the hub and Spark stopped: {left}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (scripts/setup_env.sh does it as root)")
    from playwright.sync_api import sync_playwright

    from tests.test_browser import CHROMIUM_ARGS

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def tracking_uri(hub: Hub) -> str:
    """Alice's tracking URI: the server's, with her credentials (MLflow's client sends them as basic auth; the
    server does not check them)."""
    return hub.mlflow_url.replace("http://", f"http://{ALICE}:{TRACKING_PASSWORD}@")


@pytest.fixture(scope="module")
def runs(hub: Hub, browser: Any) -> Iterator[dict[str, Run]]:
    started: dict[str, Run] = {}
    try:
        for user in USERS:
            context = login(browser, hub, user)
            exports = hub.root / "exports" / user
            exports.mkdir(parents=True, mode=0o750)  # the nodes (Spark's account) write there, the user reads
            os.chown(exports, hub.uid(SPARK_USER), pwd.getpwnam(user).pw_gid)
            hold = hold_folder(hub, user, SPARK_USER)
            cells = quickstart_cells(str(hold), str(exports), tracking_uri(hub) if user == ALICE else None)
            started[user] = Run(Kernel(hub, user, hub.start_server(user)), hold, cells, context)
        yield started
    finally:
        for r in started.values():
            r.release()
        for r in started.values():
            r.thread.join(300)
            r.kernel.close()
            r.context.close()


def held(runs: dict[str, Run]) -> None:
    wait_until(lambda: all(r.held() for r in runs.values()), 900, 0.5, what="both users' nodes at the end of fit")


def app_of(pid: int) -> str | None:
    """The Spark application whose executor JVM ``pid`` runs under (``--app-id`` on the executor's command line)."""
    try:
        for p in [psutil.Process(pid), *psutil.Process(pid).parents()]:
            cmd = p.cmdline()
            if "--app-id" in cmd:
                return cmd[cmd.index("--app-id") + 1]
    except psutil.Error:
        return None
    return None


def runtime_of(kernel_pid: int) -> list[psutil.Process]:
    """The tfos_nb processes (supervisors, nodes) of the cluster the kernel ``kernel_pid`` drives."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "tfos_nb.runtime" in (p.info["cmdline"] or []) and p.environ().get("TFOS_DRIVER_PID") == str(kernel_pid):
                found.append(p)
        except psutil.Error:
            continue
    return found


def kernel_pid(hub: Hub, kernel: Kernel) -> int:
    kids = [p for p in psutil.Process(hub.server_pid(kernel.user)).children()
            if "ipykernel_launcher" in " ".join(p.cmdline()) and kernel.kernel_id in " ".join(p.cmdline())]
    assert len(kids) == 1, kids
    return kids[0].pid


def app_id(run: Run) -> str:
    match = re.search(r"^APP (\S+) spark://", run.text(), flags=re.M)
    assert match, run.text()[-2000:]
    return match.group(1)


OBSERVED: dict[str, Any] = {}  # what the tests saw while the nodes were held, for the last test's checks


def test_both_users_train_at_once_on_the_shared_cluster(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    apps = requests.get(f"http://127.0.0.1:{hub.master_ui}/json/", timeout=20).json()["activeapps"]
    assert sorted(a["user"] for a in apps) == sorted(USERS), apps  # one application each, on the one master
    for user, r in runs.items():
        procs = runtime_of(kernel_pid(hub, r.kernel))
        assert procs and all(p.username() == SPARK_USER for p in procs), procs  # nodes run as Spark's user
        OBSERVED[user] = {p.pid: app_of(p.pid) for p in procs}
        assert set(OBSERVED[user].values()) == {app_id(r)}, (user, OBSERVED[user], app_id(r))


def test_each_tensorboard_opens_through_its_own_route(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    for user, r in runs.items():
        path = wait_until(r.kernel.tensorboard_path, 120, 0.5, what=f"{user}'s TensorBoard link in the panel")
        page = r.context.new_page()
        try:
            page.goto(f"{hub.url}user/{user}/lab", wait_until="commit")  # the server's own login (the hub's OAuth)
            resp = page.goto(f"{hub.url}user/{user}/{path}")
            assert resp is not None and resp.status == 200, (user, resp and resp.status)
            page.wait_for_function("() => document.title.includes('TensorBoard')", timeout=120_000)
            page.screenshot(path=str(REPO / "test-output" / f"hub-tensorboard-{user}.png"))
        finally:
            page.close()
        OBSERVED[f"{user}-tb"] = path


def test_bob_is_refused_alices_tensorboard(hub: Hub, runs: dict[str, Run], browser: Any) -> None:
    held(runs)
    path = OBSERVED.get(f"{ALICE}-tb") or pytest.fail("no TensorBoard route of alice's was seen")
    alice_route = f"{hub.url}user/{ALICE}/{path}"
    page = runs[BOB].context.new_page()  # bob, logged in: the hub does not log him into alice's server
    try:
        resp = page.goto(f"{hub.url}user/{ALICE}/lab", wait_until="commit")
        assert resp is not None and resp.status == 403, (resp and resp.status, page.url)
        resp = page.goto(alice_route)
        assert resp is not None and resp.status == 403 and "TensorBoard" not in page.title(), (resp and resp.status)
        resp = page.goto(f"{hub.url}user/{BOB}/{path}")  # alice's route id on bob's own server: not registered there
        assert resp is not None and resp.status == 404, resp and resp.status
    finally:
        page.close()
    assert requests.get(alice_route, headers={"Authorization": f"token {runs[BOB].token}"}, timeout=30).status_code == 403
    anonymous = browser.new_context()  # no login at all: refused, and alice's server sends a browser to the hub's login
    try:
        page = anonymous.new_page()
        resp = page.goto(alice_route)
        assert resp is not None and resp.status == 403 and "TensorBoard" not in page.title(), (resp and resp.status)
        page.goto(f"{hub.url}user/{ALICE}/lab")
        assert "/hub/login" in page.url, page.url
    finally:
        anonymous.close()


def test_bob_cannot_register_feed_or_read_alices_cluster(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    kpid = kernel_pid(hub, runs[ALICE].kernel)
    procs = runtime_of(kpid)
    listening = {c.laddr.port for c in psutil.Process(kpid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    # the control server: the kernel's port the supervisors are connected to
    control = {c.raddr.port for p in procs for c in p.net_connections("tcp") if c.raddr and c.raddr.port in listening}
    assert len(control) == 1, (control, listening)
    ports = sorted({c.laddr.port for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN})
    cluster_id = procs[0].cmdline()[-1]  # python -m tfos_nb.runtime ROLE CLUSTER_ID: the id is no secret
    seen = hub.as_user(BOB, "planes", "127.0.0.1", cluster_id, str(control.pop()), *map(str, ports))
    assert seen["control"].startswith("refused"), seen
    assert len(seen["data"]) == 2, seen  # both nodes' data ports were found (they greet with tfos_nb's magic)
    for port, result in seen["data"].items():
        assert result["bytes_after_wrong_answer"] == 0 and result["feed"].startswith("refused"), (port, result)


def test_alices_folders_are_not_readable_by_bob(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    nodes = [p for p in runtime_of(kernel_pid(hub, runs[ALICE].kernel)) if "TMPDIR" in p.environ()]
    private = sorted({p.environ()["TMPDIR"] for p in nodes})
    files = [str(f) for d in private for f in Path(d).rglob("*") if f.is_file()]
    assert private and files, (private, files)  # the nodes' folders: their sets (the validation rows), spills
    # in the executors' folders (Spark's, readable by all): the chief's TensorBoard logs and each node's log
    executors = list(hub.home(SPARK_USER).glob(f"work*/{app_id(runs[ALICE])}/*"))
    logs = [str(p) for d in executors for p in [*d.glob("tensorboard_*"), *d.glob("tfos_nb-*.log")]]
    assert len([p for p in logs if p.endswith(".log")]) == 2 and any("tensorboard_" in p for p in logs), logs
    home = hub.home(ALICE)
    paths = [*private, *files, *logs, str(home), str(home / ".local/share/jupyter/runtime"),
             str(home / ".cluster-secrets"), str(hub.root / "exports" / ALICE)]
    seen = hub.as_user(BOB, "folders", *paths)
    assert all(v.startswith("refused") for v in seen.values()), seen
    assert hub.as_user(ALICE, "folders", str(home))[str(home)].startswith("listed"), "alice could not list her home"


def alice_secrets(hub: Hub, runs: dict[str, Run]) -> dict[str, str]:
    env = psutil.Process(hub.server_pid(ALICE)).environ()
    found = {"hub API token of alice's server": env["JUPYTERHUB_API_TOKEN"], "alice's password": hub.passwords[ALICE],
             "alice's API token": runs[ALICE].token, "alice's password on the tracking server": TRACKING_PASSWORD}
    for n, line in enumerate((hub.home(ALICE) / ".cluster-secrets").read_text().split()):
        found[f"cluster secret {n}"] = line
    for f in (hub.home(ALICE) / ".local/share/jupyter/runtime").glob("kernel-*.json"):
        found[f"kernel key {f.name}"] = json.loads(f.read_text())["key"]
    return found


def alice_run(hub: Hub) -> Any:
    """Alice's job on the tracking server: the one run of its experiment (bob's job is not tracked)."""
    import mlflow

    client = mlflow.MlflowClient(hub.mlflow_url)
    experiment = client.get_experiment_by_name("tfos-hub")
    assert experiment is not None, "no experiment tfos-hub on the tracking server"
    found = client.search_runs([experiment.experiment_id])
    assert len(found) == 1 and found[0].data.tags.get("tfos_nb.name") == "digits", found
    return found[0]


def test_no_secret_of_alice_in_anything_bob_reads(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    secrets = alice_secrets(hub, runs)
    assert any(k.startswith("cluster secret") for k in secrets) and any(k.startswith("kernel key") for k in secrets)
    # her tracking URI, with its password, is in her job: her chief's environment (which root reads), to log there
    chief = [p for p in runtime_of(kernel_pid(hub, runs[ALICE].kernel)) if p.environ().get("TFOS_MLFLOW_TRACKING_URI")]
    assert {p.environ()["TFOS_MLFLOW_TRACKING_URI"] for p in chief} == {tracking_uri(hub)}, chief
    roots = [tempfile.gettempdir(), "/var/tmp", "/dev/shm", str(hub.root)]
    workers = [f"http://127.0.0.1:{p}/" for p in hub.worker_ui]
    canary = hub.root / "canary.txt"  # a word anyone may read: the search must find it (else it finds nothing)
    canary.write_text(f"canary-{os.urandom(8).hex()}")
    canary.chmod(0o644)
    names = sorted(secrets)
    seen = hub.as_user(BOB, "corpus", json.dumps(roots), f"http://127.0.0.1:{hub.master_ui}/", json.dumps(workers),
                       hub.mlflow_url, timeout=300, stdin=json.dumps([*(secrets[n] for n in names), canary.read_text()]))
    assert [len(names), str(canary)] in seen["found"], "the search did not find the canary"
    seen["found"] = [hit for hit in seen["found"] if hit[0] != len(names)]  # (found twice: /tmp holds the hub's folder)
    # what bob read covers alice's job: her application's environment page, her executors' logs, her MLflow run
    pages, app = seen["pages"], app_id(runs[ALICE])
    assert seen["searched"] > len(pages), seen["searched"]  # /proc and the files were searched too
    assert any(k.endswith("/environment/") and app in v for k, v in pages.items()), [k for k in pages]
    assert any("logPage" in k and app in k for k in pages), [k for k in pages]
    assert alice_run(hub).info.run_id in pages[f"{hub.mlflow_url}/runs"], pages[f"{hub.mlflow_url}/runs"][:2000]
    leaks = [(names[i], where) for i, where in seen["found"]]
    assert not leaks, leaks


def test_alices_backups_are_not_readable_by_bob(hub: Hub, runs: dict[str, Run]) -> None:
    """Retries where they work on a hub: alice's own embedded local-cluster, whose nodes run as her, keeps her job's
    backups in her backup root (``TFOS_NB_BACKUP_ROOT`` from the spawner); bob can neither list nor read them."""
    hold = hold_folder(hub, f"{ALICE}-backed", ALICE)
    run = Run(Kernel(hub, ALICE, runs[ALICE].token, path="backed.ipynb"), hold, backed_cells(str(hold)))
    root = hub.root / "backups" / ALICE
    try:
        wait_until(run.held, 600, 0.5, what="the nodes of alice's job with retries at the end of fit")
        nodes = runtime_of(kernel_pid(hub, run.kernel))
        assert nodes and all(p.username() == ALICE for p in nodes), nodes
        folders = list(root.glob("tfos_nb-backup-*"))  # the job's folder, in her root
        assert len(folders) == 1, folders
        folder = folders[0]
        names = {f.name for f in folder.iterdir()}
        backups = [n for n in names if re.fullmatch(r"(weights-\d+\.npz|state-\d+\.json)", n)]
        assert "attempt-1.json" in names and len(backups) >= 2, names  # the attempt's start, the epoch's backup
        paths = [str(root), str(folder), *(str(folder / n) for n in sorted(names))]
        seen = hub.as_user(BOB, "folders", *paths)
        assert all(v.startswith("refused") for v in seen.values()), seen
        mine = hub.as_user(ALICE, "folders", *paths)
        assert all(v.startswith(("listed", "read")) for v in mine.values()), mine
    finally:
        run.stop()
    assert run.error is None, run.error
    wait_until(lambda: not folder.exists(), 30, 0.2, what="the job's folder removed as the job ended")
    assert root.is_dir()  # her root stays


def test_both_finish_with_their_own_accuracy_panel_and_history(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    for r in runs.values():
        r.release()
    for user, r in runs.items():
        r.thread.join(600)
        assert not r.thread.is_alive() and r.error is None, (user, r.error)
        text = r.text()
        assert re.search(r"^accuracy: 0\.9\d\d on \d+ test digits$", text, flags=re.M), (user, text[-2000:])
        finals = [t for o in r.outputs for t in o["text"] if t.startswith("digits: finished")]
        assert len(finals) == 1, (user, finals)  # the panel's final table: this job's two nodes, no other
        assert sorted(re.findall(r"\b((?:chief|worker):\d+) finished", finals[0])) == ["chief:0", "worker:0"], finals
        nodes = json.loads(re.search(r"^NODES (.*)$", text, flags=re.M).group(1))
        for name, pid, child in nodes:  # each node the handle shows ran under this user's own application
            assert OBSERVED[user].get(pid) == app_id(r) and OBSERVED[user].get(child) == app_id(r), (user, name, nodes)
        history = json.loads(re.search(r"^HISTORY (.*)$", text, flags=re.M).group(1))
        rows = [h for h in history if h.get("loss") is not None]
        assert {h["node"] for h in rows} == {"chief:0", "worker:0"}, user
        for node in ("chief:0", "worker:0"):  # one report per step, and the epoch's at its last: no other job's rows
            steps = [h["step"] for h in rows if h["node"] == node]
            assert len(steps) == len(set(steps)) + 5, (user, node, steps)


def test_alices_job_is_one_run_on_the_tracking_server_with_her_metrics(hub: Hub, runs: dict[str, Run]) -> None:
    held(runs)
    runs[ALICE].release()
    runs[ALICE].thread.join(600)
    assert runs[ALICE].error is None, runs[ALICE].error
    run = wait_until(lambda: (r := alice_run(hub)).info.status == "FINISHED" and r, 60, 0.5, what="her run finished")
    assert run.data.tags["tfos_nb.outcome"] == "finished" and run.data.params["epochs"] == "5", run.data
    history = json.loads(re.search(r"^HISTORY (.*)$", runs[ALICE].text(), flags=re.M).group(1))
    reported = {(h["step"], round(h["loss"], 5)) for h in history if h["node"] == "chief:0" and h.get("loss") is not None}
    import mlflow

    client = mlflow.MlflowClient(hub.mlflow_url)
    logged = client.get_metric_history(run.info.run_id, "loss")
    assert reported and {(m.step, round(m.value, 5)) for m in logged} == reported, (logged, reported)  # her chief's
    # her SavedModel, which Spark's account wrote in her export folder, uploaded from her kernel without a warning
    assert "model/MLmodel" in [a.path for a in client.list_artifacts(run.info.run_id, "model")]
    assert not re.search(r"tfos_nb: .*MLflow", runs[ALICE].text()), runs[ALICE].text()[-3000:]
