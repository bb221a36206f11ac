"""A real JupyterHub with two Unix users and one shared Spark standalone cluster, for tests/test_jupyterhub.py.

:class:`Hub` makes, under one folder of its own (``/tmp/tfos-hub-*``): three Unix users (``tfosalice`` and
``tfosbob``, who log in, and ``tfosspark``, who runs Spark's daemons, as a site's service account would), each with
a home under that folder; a Python the users can run (this interpreter's installation may lie under ``/root``,
which others cannot enter: a hard-linked copy of it, with the project's site-packages linked in — the same
packages, tfos_nb's server extension enabled by the same ``etc/jupyter`` file); a Spark standalone master and two
workers (2 cores each) as ``tfosspark``; a ``spark-defaults.conf`` naming that master, which the spawner hands to
every user's server (``SPARK_CONF_DIR``); a real MLflow tracking server on loopback, run as root, its store in a
``0700`` folder of its own; for each user a backup root of their own (``TFOS_NB_BACKUP_ROOT``, ``0700``, from the
spawner, as a site sets it); and JupyterHub (PAM logins, the local-process spawner, the real
``configurable-http-proxy`` that ``scripts/setup_env.sh`` installs into ``.venv/chp``), run as root as the
local-process spawner needs.  :meth:`Hub.stop` ends all of it and removes the users and the folder; every process
started carries ``TFOS_HUB_TAG`` in its environment, which is how :meth:`Hub.leftovers` finds what outlived it.

:class:`Kernel` runs code in a user's kernel over the Jupyter websocket, through the proxy, as a front-end does.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import requests

from tests.conftest import NODE_ENV, TEST_JVM_OPTIONS, free_port, skip_environment, wait_until
from tests.netns_cluster import kill_group, pyspark_bin

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "test-output" / "jupyterhub"
CHP = REPO / ".venv" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
USERS = ("tfosalice", "tfosbob")
SPARK_USER = "tfosspark"
TAG_ENV = "TFOS_HUB_TAG"


def run(*cmd: str, stdin: str | None = None) -> None:
    subprocess.run(cmd, input=stdin, text=True, check=True, capture_output=True, timeout=60)


def _traversable(path: Path) -> bool:
    """Whether every other user can reach ``path`` (each folder above it has o+x)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


class Hub:
    def __init__(self) -> None:
        if os.getuid() != 0:
            skip_environment("the JupyterHub test creates Unix users and runs the hub as root")
        if not CHP.exists():
            skip_environment(f"{CHP} is missing: TFOS_NB_TEST_DEPS=1 bash scripts/setup_env.sh installs it")
        self.tag = secrets.token_hex(4)
        self.root = Path(tempfile.mkdtemp(prefix="tfos-hub-", dir="/tmp"))
        self.root.chmod(0o755)
        self.passwords = {u: secrets.token_urlsafe(12) for u in USERS}
        self.users: list[str] = []
        self.daemons: list[subprocess.Popen] = []
        self.hub: subprocess.Popen | None = None
        self.port, self.master_port = free_port(), free_port()
        self.admin_token = secrets.token_hex(32)
        self.worker_ui: list[int] = []
        self.lib = ""  # LD_LIBRARY_PATH for a copied Python (its binary's RUNPATH names the original's lib/)

    # -- setup ---------------------------------------------------------------------------------------------------
    def start(self) -> Hub:
        try:
            for name in (*USERS, SPARK_USER):
                self._user(name)
            self.python = self._python()
            (self.root / "logs").mkdir(mode=0o700)
            mlflow = self._mlflow()  # starting while Spark and the hub do
            self._spark()
            self._hub()
            wait_until(lambda: requests.get(f"{self.mlflow_url}/health", timeout=5).status_code == 200, 180, 0.3,
                       what="the MLflow server", proc=mlflow, ignore=(OSError,))
        except BaseException:
            self.stop()
            raise
        return self

    def home(self, user: str) -> Path:
        return self.root / "home" / user

    def uid(self, user: str) -> int:
        return pwd.getpwnam(user).pw_uid

    def _user(self, name: str) -> None:
        try:
            pwd.getpwnam(name)
            run("userdel", name)  # a leftover of a killed run (the names are this test's own)
        except KeyError:
            pass
        home = self.home(name)
        home.parent.mkdir(exist_ok=True, mode=0o755)
        run("useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group", name)
        self.users.append(name)
        if name in self.passwords:
            run("chpasswd", stdin=f"{name}:{self.passwords[name]}\n")
        home.mkdir(mode=0o700)
        os.chown(home, self.uid(name), pwd.getpwnam(name).pw_gid)

    def _python(self) -> str:
        """A Python every user can run: this one's installation (or a hard-linked copy, when others cannot enter
        where it lies) and a venv beside it whose site-packages, etc/ and share/ are the project venv's."""
        base = Path(sys.base_prefix)
        if not _traversable(base):
            copy = self.root / "python"
            if subprocess.run(["cp", "-al", str(base), str(copy)], capture_output=True).returncode != 0:
                shutil.rmtree(copy, ignore_errors=True)
                run("cp", "-a", str(base), str(copy))
            base, self.lib = copy, str(copy / "lib")
        venv = self.root / "venv"
        purelib = Path(sysconfig.get_paths()["purelib"])
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = false\n"
                                         f"version = {sys.version.split()[0]}\n")
        (venv / "bin" / "python").symlink_to(base / "bin" / Path(os.path.realpath(sys.executable)).name)
        lib = venv / purelib.relative_to(sys.prefix).parent
        lib.mkdir(parents=True)
        (lib / "site-packages").symlink_to(purelib)
        for sub in ("etc", "share"):
            (venv / sub).symlink_to(Path(sys.prefix) / sub)
        for p in (REPO, purelib):
            assert _traversable(p), f"{p} is not readable by other users: the hub's users could not import tfos_nb"
        return str(venv / "bin" / "python")

    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "JAVA_HOME")}
        env.update({TAG_ENV: self.tag, "PYSPARK_PYTHON": self.python, "SPARK_LOCAL_IP": "127.0.0.1"}, **extra)
        if self.lib:
            env["LD_LIBRARY_PATH"] = self.lib
        return env

    def _launch(self, name: str, cmd: list[str], env: dict[str, str], user: str | None = None,
                cwd: Path | None = None) -> subprocess.Popen:
        with open(self.root / "logs" / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, user=user, group=user, extra_groups=[] if user else None,
                                    cwd=cwd or (self.home(user) if user else self.root / "hub"))
        self.daemons.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")

    def _mlflow(self) -> subprocess.Popen:
        """``mlflow server`` on loopback (SQLite, local artifacts), as ``tests/test_tracking.py`` runs it."""
        store = self.root / "mlflow"
        store.mkdir(mode=0o700)
        port = free_port()
        self.mlflow_url = f"http://127.0.0.1:{port}"
        return self._launch("mlflow", [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
                                       str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
                                       "--artifacts-destination", str(store / "artifacts")],
                            self._env(HOME=str(store)), cwd=store)

    def _spark(self) -> None:
        """Master and two workers as ``tfosspark``; the users' kernels get the master from spark-defaults.conf."""
        conf = self.root / "spark-conf"
        conf.mkdir(mode=0o755)
        settings = {
            "spark.master": f"spark://127.0.0.1:{self.master_port}", "spark.driver.host": "127.0.0.1",
            "spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "512m",
            "spark.ui.port": "0", "spark.ui.showConsoleProgress": "false", "spark.task.maxFailures": "1",
            "spark.sql.shuffle.partitions": "4", "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
            "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS, "spark.log.level": "WARN",
            **{f"spark.executorEnv.{k}": v for k, v in NODE_ENV.items()},
        }
        (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
        spark_class = pyspark_bin("spark-class")
        env = self._env(SPARK_CONF_DIR=str(conf), SPARK_DAEMON_MEMORY="256m", HOME=str(self.home(SPARK_USER)))
        ui = free_port()
        master = self._launch("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                         "--port", str(self.master_port), "--webui-port", str(ui)], env, SPARK_USER)
        self.master_ui = ui
        wait_until(lambda: "I have been elected leader" in self.log("master"), 120, 0.2, what="the Spark master",
                   proc=master)
        for i in range(2):
            work = self.home(SPARK_USER) / f"work{i}"
            work.mkdir()
            os.chown(work, self.uid(SPARK_USER), pwd.getpwnam(SPARK_USER).pw_gid)
            self.worker_ui.append(free_port())
            w = self._launch(f"worker{i}", [spark_class, "org.apache.spark.deploy.worker.Worker", "--cores", "2",
                                            "--memory", "2g", "--work-dir", str(work), "--webui-port",
                                            str(self.worker_ui[-1]), settings["spark.master"]], env, SPARK_USER)
            wait_until(lambda i=i: "Successfully registered with master" in self.log(f"worker{i}"), 120, 0.2,
                       what=f"Spark worker {i}", proc=w)
        self.home(SPARK_USER).chmod(0o755)  # the workers' folders: readable as Spark leaves them (executor logs)
        self.spark_conf = conf

    def _hub(self) -> None:
        (self.root / "hub").mkdir(mode=0o700)
        (self.root / "backups").mkdir(mode=0o755)
        for user in USERS:  # a folder of the user's own, as the guide says a site makes one
            (self.root / "backups" / user).mkdir(mode=0o700)
            os.chown(self.root / "backups" / user, self.uid(user), pwd.getpwnam(user).pw_gid)
        spawner_env = {"SPARK_CONF_DIR": str(self.spark_conf), "PYSPARK_PYTHON": self.python,
                       "PYSPARK_DRIVER_PYTHON": self.python, TAG_ENV: self.tag, "TF_CPP_MIN_LOG_LEVEL": "2",
                       "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "SPARK_LOCAL_IP": "127.0.0.1",
                       **({"LD_LIBRARY_PATH": self.lib} if self.lib else {})}
        config = f"""
c.JupyterHub.bind_url = "http://127.0.0.1:{self.port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.JupyterHub.db_url = "sqlite:///{self.root / 'hub' / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = "{self.root / 'hub' / 'cookie_secret'}"
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = {set(USERS)!r}
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{self.python!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--TensorBoardProxy.trusted_users={SPARK_USER}"]  # the chief's TensorBoard runs as Spark's account
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "JAVA_HOME"]
c.Spawner.environment = {spawner_env!r}
c.Spawner.environment["TFOS_NB_BACKUP_ROOT"] = lambda spawner: f"{self.root}/backups/{{spawner.user.name}}"
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
c.JupyterHub.services = [{{"name": "tfos-test", "api_token": {self.admin_token!r}}}]
c.JupyterHub.load_roles = [{{"name": "tfos-test", "services": ["tfos-test"],
                             "scopes": ["admin:users", "admin:servers", "tokens", "read:users"]}}]
c.JupyterHub.log_level = "WARN"
"""
        (self.root / "hub" / "jupyterhub_config.py").write_text(config)
        env = self._env(CONFIGPROXY_AUTH_TOKEN=secrets.token_hex(32), HOME=str(self.root / "hub"))
        self.hub = self._launch("hub", [sys.executable, "-m", "jupyterhub", "-f",
                                        str(self.root / "hub" / "jupyterhub_config.py")], env)
        wait_until(lambda: requests.get(f"{self.url}hub/api/", timeout=5).status_code == 200, 180, 0.3,
                   what="JupyterHub through its proxy", proc=self.hub, ignore=(OSError,))

    # -- use -------------------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def api(self, path: str, method: str = "GET", token: str | None = None, **kw: Any) -> Any:
        r = requests.request(method, f"{self.url}hub/api/{path}", timeout=60,
                             headers={"Authorization": f"token {token or self.admin_token}"}, **kw)
        r.raise_for_status()
        return r.json() if r.content else None

    def start_server(self, user: str) -> str:
        """Start ``user``'s single-user server (as a click on "Start My Server" does); a token of theirs."""
        token = self.api(f"users/{user}/tokens", "POST", json={"note": "tfos test", "expires_in": 3600})["token"]
        requests.post(f"{self.url}hub/api/users/{user}/server", timeout=60,
                      headers={"Authorization": f"token {self.admin_token}"}).raise_for_status()
        wait_until(lambda: (self.api(f"users/{user}").get("servers", {}).get("", {}) or {}).get("ready"), 300, 0.5,
                   what=f"{user}'s server", proc=self.hub)
        return token

    def server_pid(self, user: str) -> int:
        procs = [p for p in psutil.process_iter(["uids", "cmdline"])
                 if p.info["uids"] and p.info["uids"].real == self.uid(user)
                 and "jupyterhub.singleuser" in (p.info["cmdline"] or [])]
        assert len(procs) == 1, procs
        return procs[0].pid

    def as_user(self, user: str, *args: str, timeout: float = 120, stdin: str = "") -> Any:
        """Run ``python -m tests.hub_probe ARGS`` as ``user`` (``stdin``: what it reads there); its JSON answer."""
        out = subprocess.run([self.python, "-m", "tests.hub_probe", *args], user=user, group=user, extra_groups=[],
                             env=self._env(HOME=str(self.home(user)), PYTHONPATH=str(REPO)), cwd=self.home(user),
                             input=stdin, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    # -- teardown ----------------------------------------------------------------------------------------------------
    def leftovers(self) -> list[str]:
        uids = {self.uid(u) for u in self.users if _exists(u)}
        found = []
        for p in psutil.process_iter(["uids", "cmdline"]):
            try:
                if p.pid != os.getpid() and (p.info["uids"].real in uids or p.environ().get(TAG_ENV) == self.tag):
                    found.append(f"pid {p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def stop(self) -> list[str]:
        """Stop the hub (it stops the users' servers, their kernels and the proxy), then Spark; kill what is left;
        remove the users and the folder.  Returns what had to be killed."""
        if self.hub is not None and self.hub.poll() is None:
            self.hub.send_signal(signal.SIGTERM)
            try:
                self.hub.wait(60)
            except subprocess.TimeoutExpired:
                pass
        for proc in reversed(self.daemons):
            kill_group(proc)
        wait_until(lambda: not self.leftovers(), 30, 0.2)
        left = self.leftovers()
        for line in left:
            try:
                os.kill(int(line.split()[1].rstrip(":")), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in self.users:
            if _exists(name):
                wait_until(lambda n=name: subprocess.run(["userdel", n], capture_output=True).returncode == 0, 20, 0.5)
        self.users.clear()
        if (self.root / "logs").is_dir():  # for a look after a failure
            shutil.rmtree(OUTPUT, ignore_errors=True)
            shutil.copytree(self.root / "logs", OUTPUT)
        shutil.rmtree(self.root, ignore_errors=True)
        return left


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


class Kernel:
    """A notebook session of ``user`` on their server, its kernel driven over the websocket through the proxy."""

    def __init__(self, hub: Hub, user: str, token: str, path: str = "hub.ipynb") -> None:
        import websocket

        self.hub, self.user, self.token = hub, user, token
        self.base = f"{hub.url}user/{user}/"
        r = requests.post(f"{self.base}api/sessions", timeout=120, headers={"Authorization": f"token {token}"},
                          json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
        r.raise_for_status()
        self.kernel_id = r.json()["kernel"]["id"]
        self.session = uuid.uuid4().hex
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{hub.port}/user/{user}/api/kernels/{self.kernel_id}/channels?session_id={self.session}",
            header=[f"Authorization: token {token}"], timeout=600)
        self.seen = ""  # every iopub message's content, as JSON text (the panel's widget state included)
        self.lock = threading.Lock()
        self._ready()

    def _send(self, msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.user, "session": self.session, "msg_type": msg_type,
                       "version": "5.3", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "parent_header": {}, "metadata": {}, "buffers": [], "channel": "shell", "content": content}))
        return msg_id

    def _recv(self, deadline: float, waiting_for: str) -> dict[str, Any] | None:
        """The next JSON message of this kernel's channels, waiting at most until ``deadline`` (then TimeoutError,
        naming the user, the kernel and what was waited for); None for a binary frame (a widget's buffers)."""
        import websocket

        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise websocket.WebSocketTimeoutException
            self.ws.settimeout(left)
            raw = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            raise TimeoutError(f"{self.user}'s kernel {self.kernel_id}: {waiting_for}") from None
        if isinstance(raw, bytes):
            return None
        msg = json.loads(raw)
        with self.lock:
            self.seen += json.dumps(msg.get("content", {}))
        return msg

    def _ready(self, timeout: float = 180, every: float = 5) -> None:
        """Wait until the kernel answers on its shell channel, as a front-end does before it runs a cell: a request
        sent before the server has connected the kernel's channels can be lost (the cell then never runs), so a
        kernel_info request is sent again every ``every`` seconds until one is answered (the server's own nudge).
        A reply to any of them proves the channel: on a loaded machine a reply can come after the next request
        was sent."""
        deadline = time.monotonic() + timeout
        asked: set[str] = set()
        while True:
            asked.add(self._send("kernel_info_request", {}))
            again = min(deadline, time.monotonic() + every)
            while time.monotonic() < again:
                try:
                    msg = self._recv(again, "no kernel_info_reply yet")
                except TimeoutError:
                    break  # nothing within ``every`` seconds: ask again
                if msg and msg.get("msg_type") == "kernel_info_reply" and msg["parent_header"].get("msg_id") in asked:
                    return
            if time.monotonic() >= deadline:
                told = [line for line in self.hub.log("hub").splitlines() if self.kernel_id in line]
                raise AssertionError(
                    f"{self.user}'s kernel {self.kernel_id}: no kernel_info_reply in {timeout} s through the hub's "
                    f"proxy ({len(asked)} asked); the server's log on this kernel:\n" + "\n".join(told[-20:]))

    def execute(self, code: str, timeout: float = 900) -> dict[str, Any]:
        """Run ``code``; its stdout, the plain text and HTML of what it displayed; an error fails."""
        msg_id = self._send("execute_request", {"code": code, "silent": False, "store_history": True,
                                                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
        out: dict[str, Any] = {"stdout": "", "text": [], "html": [], "error": None}
        replied = idle = False
        deadline = time.monotonic() + timeout
        while not (replied and idle):
            msg = self._recv(deadline, f"no reply in {timeout} s to the cell {code[:80]!r}")
            if msg is None:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out["stdout"] += content["text"]
            elif kind in ("display_data", "execute_result", "update_display_data"):
                out["text"].append(content["data"].get("text/plain", ""))
                out["html"].append(content["data"].get("text/html", ""))
            elif kind == "error":
                out["error"] = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "execute_reply":
                replied = True
        assert out["error"] is None, (self.user, out["error"], out["stdout"][-3000:])
        return out

    def tensorboard_path(self) -> str | None:
        with self.lock:
            found = re.findall(r"tfos_nb/tensorboard/[0-9a-f]{8,32}/", self.seen)
        return found[-1] if found else None

    def close(self) -> None:
        self.ws.close()
