"""A real Airflow deployment on this machine: PostgreSQL plus api-server, scheduler, dag-processor
and triggerer as separate processes, each started and stopped by its PID.

Used by the end-to-end tests (``tests/e2e``) and ``bench/e2e_overhead.py``; it is what a small
production install looks like (LocalExecutor on PostgreSQL), started from this project's ``dags/``
and ``plugins/`` with a private ``AIRFLOW_HOME`` and SAILOR state folder under ``root``.

PostgreSQL is the Debian package's server binaries (``initdb``/``pg_ctl`` on PATH or under
``/usr/lib/postgresql/*/bin``); a cluster is created in ``root/pgdata`` on a free port. As root
(CI), PostgreSQL runs as the ``postgres`` user, which refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sailor_tasks.cli.airflow_api import AirflowClient
from sailor_tasks.settings import Settings

logger = logging.getLogger(__name__)

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
STOP_ORDER = ("triggerer", "dag-processor", "scheduler", "api-server")
"""Stop what starts work first (the API server last, so the UI stays answerable until the end)."""
USERNAME = "admin"
PASSWORD = "admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin(name: str) -> str:
    """Path of a PostgreSQL server binary; installs the Debian package when missing and root."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        logger.warning("%s not found; installing the Debian postgresql package", name)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "postgresql"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if not found:
        raise FileNotFoundError(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)")
    return found


@dataclass
class Postgres:
    """A private PostgreSQL cluster in ``root`` on a free port, trust auth for user ``postgres``."""

    root: Path
    port: int = field(default_factory=free_port)

    @property
    def data_dir(self) -> Path:
        return self.root / "pgdata"

    def _run_as(self) -> dict:
        if os.geteuid() != 0:
            return {}
        pw = pwd.getpwnam("postgres")
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        as_user = self._run_as()
        sock = self.root / "pgsock"
        sock.mkdir(exist_ok=True)
        if as_user:  # the postgres user must reach and own its folders
            for p in (self.root, sock):
                os.chown(p, as_user["user"], as_user["group"])
            for parent in self.root.parents:
                if str(parent) in ("/", "/tmp"):
                    break
                os.chmod(parent, os.stat(parent).st_mode | 0o011)
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        made = subprocess.run(
            [
                pg_bin("initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            cwd=self.root,
            env=env,
            **as_user,
        )
        if made.returncode != 0:  # what initdb said, not only its exit status
            raise RuntimeError(f"initdb {self.data_dir} failed ({made.returncode}): {made.stderr[-2000:]}")
        opts = (
            f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        subprocess.run(
            [
                pg_bin("pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.root / "postgres.log"),
                "-o",
                opts,
                "-w",
                "-t",
                "120",
                "start",
            ],
            check=True,
            capture_output=True,
            cwd=self.root,
            env=env,
            **as_user,
        )

    def create_database(self, name: str) -> str:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self.url(name)

    def url(self, db: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        subprocess.run(
            [pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"],
            capture_output=True,
            cwd=self.root,
            **self._run_as(),
        )


@dataclass
class AirflowStack:
    """Airflow's four services on PostgreSQL, from ``project``'s dags/ and plugins/, state under ``root``.

    Args:
        root: a fresh folder for PostgreSQL, AIRFLOW_HOME, logs and SAILOR's state.
        project: the SAILOR checkout (its ``dags/`` and ``plugins/`` are served).
        sailor_ledger: ``sqlite`` (default, the state folder's ledger.db) or ``postgres`` (a database
            ``sailor`` in the same PostgreSQL cluster).
    """

    root: Path
    project: Path
    sailor_ledger: str = "sqlite"
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    postgres: Postgres | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def state_dir(self) -> Path:
        return self.root / "sailor"

    def settings(self) -> Settings:
        """SAILOR settings as the stack's task processes see them (state folder, ledger URL)."""
        return Settings.from_env({k: v for k, v in self.env.items() if k.startswith("SAILOR_")})

    def client(self) -> AirflowClient:
        return AirflowClient(self.url, USERNAME, PASSWORD)

    def airflow(self) -> str:
        return str(Path(sys.executable).with_name("airflow"))

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout_s: float = 600.0) -> AirflowStack:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self.postgres = Postgres(self.root / "pg")
        self.postgres.start()
        airflow_db = self.postgres.create_database("airflow")
        ledger_url = self.postgres.create_database("sailor") if self.sailor_ledger == "postgres" else ""
        home = self.root / "airflow_home"
        home.mkdir(exist_ok=True)
        passwords = self.root / "passwords.json"
        passwords.write_text(json.dumps({USERNAME: PASSWORD}))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "SAILOR_"))},
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.project / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.project / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "SAILOR_STATE_DIR": str(self.state_dir),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **({"SAILOR_LEDGER_URL": ledger_url} if ledger_url else {}),
            **self.extra_env,
        }
        self._run(["db", "migrate"], "migrate", timeout_s=timeout_s)
        for name in COMPONENTS:
            self.start_component(name)
        self.wait_ready(timeout_s)
        return self

    def _run(self, args: list[str], log_name: str, timeout_s: float) -> None:
        with open(self.logs_dir / f"{log_name}.log", "w") as log:
            rc = subprocess.run(
                [self.airflow(), *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        if rc != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed (rc={rc}):\n{self.tail(log_name)}")

    def start_component(self, name: str, env: dict[str, str] | None = None) -> None:
        args = [self.airflow(), name] + (["--port", str(self.port)] if name == "api-server" else [])
        log = open(self.logs_dir / f"{name}.log", "a")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(
            args,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,  # its own process group: a stray child can still be found by PID
        )
        log.close()

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Wait until the API answers, every component reports healthy, and the DAGs are parsed."""
        deadline = time.monotonic() + timeout_s
        health: dict = {}
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited with {proc.returncode}:\n{self.tail(name)}")
            with contextlib.suppress(requests.RequestException, ValueError):
                health = requests.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()
                parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
                if all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                    break
            time.sleep(2)
        else:
            raise TimeoutError(f"Airflow not healthy after {timeout_s:.0f} s: {health}\n{self.dump_logs()}")
        client = self.client()
        while time.monotonic() < deadline:
            try:
                client.get_dag("sailor_train")
                client.get_dag("sailor_rebalance")
                return
            except Exception:  # noqa: BLE001 - not parsed yet
                time.sleep(2)
        raise TimeoutError(f"DAGs not parsed after {timeout_s:.0f} s\n{self.dump_logs()}")

    def restart_component(
        self, name: str, env: dict[str, str] | None = None, timeout_s: float = 300.0
    ) -> None:
        """Stop one component by PID and start it again (e.g. the scheduler with another SAILOR ledger)."""
        self.stop_component(name)
        self.start_component(name, env)
        self.wait_ready(timeout_s)

    def stop_component(self, name: str, grace_s: float = 30.0) -> None:
        """SIGTERM the component's PID; its children after it exits; SIGKILL whatever outlives the grace."""
        import psutil

        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            logger.warning(
                "airflow %s (pid %d) ignored SIGTERM for %.0f s; killing it", name, proc.pid, grace_s
            )
            proc.kill()
            proc.wait(10)
        alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        for c in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.terminate()
        _, still = psutil.wait_procs(alive, timeout=10)
        for c in still:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.kill()

    def stop(self) -> None:
        for name in STOP_ORDER:
            self.stop_component(name)
        for name in list(self.procs):
            self.stop_component(name)
        if self.postgres is not None:
            self.postgres.stop()

    def __enter__(self) -> AirflowStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- diagnostics ----------------------------------------------------------------------------
    def tail(self, log_name: str, lines: int = 80) -> str:
        path = self.logs_dir / f"{log_name}.log"
        if not path.exists():
            return f"(no {path})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def dump_logs(self, lines: int = 80) -> str:
        """The tail of every service's log and of every task log (what a failing test prints)."""
        parts = [
            f"===== {p.stem} =====\n{self.tail(p.stem, lines)}" for p in sorted(self.logs_dir.glob("*.log"))
        ]
        task_logs = sorted((self.root / "airflow_home" / "logs").glob("dag_id=*/**/*.log"))
        for p in task_logs[-12:]:
            text = "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
            parts.append(f"===== {p.relative_to(self.root)} =====\n{text}")
        return "\n".join(parts)
