"""docker-compose.yaml checked offline: npm dclint (compose-spec schema + rules), then rendered as
Compose renders it (YAML anchors and merge keys, ``${VAR:-default}`` interpolation, ``$$``) and
validated against the compose-spec JSON schema dclint ships, and checked for what makes it work:
one JWT secret across the services, the admin/admin login, a shared logs volume, healthchecks,
CeleryExecutor with Redis and workers; airflow-init's script run with stand-ins for its commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yaml"
DCLINT_VERSION = "3.1.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sailor" / f"dclint-{DCLINT_VERSION}"


@pytest.fixture(scope="module")
def dclint() -> str:
    """dclint from PATH, or installed once with npm into a user cache folder (not the repository)."""
    found = shutil.which("dclint")
    if found:
        return found
    exe = CACHE / "node_modules" / ".bin" / "dclint"
    if not exe.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("neither dclint nor npm is installed, so docker-compose.yaml cannot be checked")
        CACHE.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", f"dclint@{DCLINT_VERSION}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0 or not exe.exists():
            pytest.skip(f"npm could not install dclint@{DCLINT_VERSION}: {proc.stderr[-500:]}")
    return str(exe)


def _lint(dclint: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [dclint, "--quiet", "--color=false", str(path)], capture_output=True, text=True, timeout=120
    )


def test_compose_file_passes_dclint(dclint):
    proc = _lint(dclint, COMPOSE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dclint_rejects_a_compose_file_that_breaks_the_schema(dclint, tmp_path):
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text(
        COMPOSE.read_text().replace("    restart: always\n", "    restart: always\n    restarts: 3\n", 1)
    )
    proc = _lint(dclint, broken)
    assert proc.returncode != 0 and "invalid-schema" in proc.stdout


# --- rendering as Compose does ---------------------------------------------------------------------
_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class Unset(Exception):
    pass


def interpolate(value: str, env: dict[str, str], unset: set[str]) -> str:
    """Compose's interpolation: ``$$`` is a literal ``$``; ``${V:-d}`` (unset or empty → d),
    ``${V-d}`` (unset → d), ``${V:?e}``/``${V?e}`` (error), ``${V}``/``$V`` (unset → "" with a
    warning: recorded in ``unset``)."""

    def sub(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        val = env.get(name)
        if op in (":-", "-"):
            return arg if (val is None or (op == ":-" and val == "")) else val
        if op in (":?", "?"):
            if val is None or (op == ":?" and val == ""):
                raise Unset(f"{name}: {arg}")
            return val
        if val is None:
            unset.add(name)
            return ""
        return val

    return _VAR.sub(sub, value)


def render(text: str, env: dict[str, str] | None = None) -> tuple[dict, set[str]]:
    """The compose model: YAML (anchors, ``<<`` merges) with every string value interpolated; the
    ``x-`` extension fields dropped; and the variables used with no value and no default."""
    unset: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items() if not (isinstance(k, str) and k.startswith("x-"))}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str):
            return interpolate(node, env or {}, unset)
        return node

    return walk(yaml.safe_load(text)), unset


def _compose_schema(dclint: str) -> dict:
    for parent in Path(dclint).resolve().parents:
        schema = parent / "schemas" / "compose.schema.json"
        if schema.is_file():
            return json.loads(schema.read_text())
    pytest.fail(f"dclint at {dclint} ships no schemas/compose.schema.json")


@pytest.fixture(scope="module")
def compose() -> dict:
    spec, unset = render(COMPOSE.read_text())
    assert unset == set(), f"variables with no default (Compose substitutes an empty string): {unset}"
    return spec


def test_interpolation_follows_the_compose_spec():
    unset: set[str] = set()
    env = {"A": "a", "E": ""}
    assert interpolate("${A:-x} ${E:-x} ${E-x} ${N-x} $$HOME $${A} $A", env, unset) == "a x  x $HOME ${A} a"
    assert interpolate("${N}", env, unset) == "" and unset == {"N"}
    with pytest.raises(Unset):
        interpolate("${N:?needed}", env, unset)


def test_rendered_file_validates_against_the_compose_spec_schema(dclint, compose):
    jsonschema.Draft7Validator(_compose_schema(dclint)).validate(compose)


def test_the_schema_check_rejects_a_rendered_file_that_breaks_it(dclint, compose):
    validator = jsonschema.Draft7Validator(_compose_schema(dclint))
    unknown_key = json.loads(json.dumps(compose))
    unknown_key["services"]["airflow-worker"]["restarts"] = 3
    bad_condition = json.loads(json.dumps(compose))
    bad_condition["services"]["airflow-worker"]["depends_on"]["redis"]["condition"] = "service_up"
    for broken in (unknown_key, bad_condition):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(broken)


AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)


def _airflow(compose: dict) -> dict[str, dict]:
    return {
        n: s
        for n, s in compose["services"].items()
        if s.get("build", {}).get("dockerfile") == "docker/airflow.Dockerfile"
    }


def test_every_airflow_service_shares_one_jwt_secret_and_configuration(compose):
    services = _airflow(compose)
    assert set(AIRFLOW_SERVICES) <= set(services)
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                "AIRFLOW__CELERY__BROKER_URL", "SAILOR_LEDGER_URL", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):  # fmt: skip
        values = {services[n]["environment"].get(key) for n in services}
        assert len(values) == 1 and None not in values and "" not in values, f"{key}: {values}"
    # the overrides come from .env: one value for every service
    spec, _ = render(COMPOSE.read_text(), {"AIRFLOW_JWT_SECRET": "from-dotenv"})
    assert {s["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] for s in _airflow(spec).values()} == {
        "from-dotenv"
    }


def test_celery_executor_with_redis_and_workers(compose):
    services = compose["services"]
    for name, svc in _airflow(compose).items():
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://:@redis:6379/0"
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://")
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    worker = services["airflow-worker"]
    assert worker["command"] == "celery worker" and worker["environment"]["DUMB_INIT_SETSID"] == "0"
    assert "profiles" not in worker  # started by a plain `docker compose up`, scaled with --scale
    # a worker on another host reaches the first host's services through the same variables
    hosts = {"SAILOR_POSTGRES_HOST": "10.0.0.5", "SAILOR_REDIS_HOST": "10.0.0.5", "SAILOR_API_HOST": "10.0.0.5",
             "SAILOR_GCS_HOST": "10.0.0.5"}  # fmt: skip
    remote = render(COMPOSE.read_text(), hosts)[0]["services"]["airflow-worker"]["environment"]
    assert remote["AIRFLOW__CELERY__BROKER_URL"] == "redis://:@10.0.0.5:6379/0"
    assert (
        "@10.0.0.5/" in remote["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        and "@10.0.0.5/" in remote["SAILOR_LEDGER_URL"]
    )
    assert remote["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://10.0.0.5:8080/execution/"
    assert remote["STORAGE_EMULATOR_HOST"] == "http://10.0.0.5:9023"


def test_services_share_a_logs_volume_and_the_state_volume(compose):
    for name, svc in _airflow(compose).items():
        assert "airflow-logs:/opt/airflow/logs" in svc["volumes"], name
        assert "sailor-state:/opt/airflow/sailor-state" in svc["volumes"], name
        assert {"./dags:/opt/airflow/dags", "./plugins:/opt/airflow/plugins"} <= set(svc["volumes"])
        assert svc["environment"]["AIRFLOW_HOME"] == "/opt/airflow"
    assert {"airflow-logs", "airflow-config", "sailor-state"} <= set(compose["volumes"])


def test_long_running_services_have_healthchecks_like_airflows_own_file(compose):
    services = compose["services"]
    checks = {n: " ".join(s["healthcheck"]["test"]) for n, s in services.items() if "healthcheck" in s}
    assert "http://localhost:8080/api/v2/version" in checks["airflow-apiserver"]
    assert "http://localhost:8974/health" in checks["airflow-scheduler"]
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"
    assert (
        'airflow jobs check --job-type DagProcessorJob --hostname "${HOSTNAME}"'
        in checks["airflow-dag-processor"]
    )
    assert (
        'airflow jobs check --job-type TriggererJob --hostname "${HOSTNAME}"' in checks["airflow-triggerer"]
    )
    assert 'inspect ping -d "celery@${HOSTNAME}"' in checks["airflow-worker"]
    for name, svc in services.items():
        if svc.get("restart") == "always":
            assert name in checks, f"{name} runs for good but has no healthcheck"
        for dep, cond in svc.get("depends_on", {}).items():
            if cond["condition"] == "service_healthy":
                assert dep in checks, f"{name} waits for {dep} to be healthy, which has no healthcheck"


def test_the_admin_login_is_configured(compose):
    for svc in _airflow(compose).values():
        env = svc["environment"]
        assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("simple_auth_manager.SimpleAuthManager")
        assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"  # user admin, role admin
        assert (
            env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == "/opt/airflow/config/passwords.json"
        )
        assert "airflow-config:/opt/airflow/config" in svc["volumes"]


def _run_init(
    compose: dict, root: Path, fail: str = ""
) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    """airflow-init's script under bash with its rendered environment, /opt/airflow moved under
    ``root`` and stand-ins for airflow, sailor and chown that record their arguments (the call
    starting with ``fail`` exits 1)."""
    init = compose["services"]["airflow-init"]
    assert init["entrypoint"] == "/bin/bash" and init["command"][0] == "-c" and init["user"] == "0:0"
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = root / "calls.txt"
    calls.write_text("")
    for tool in ("airflow", "sailor", "chown"):
        stub = f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n'
        if fail.startswith(tool):
            stub += f'[ "{tool} $*" = "{fail}" ] && exit 1\n'
        (bin_dir / tool).write_text(stub + "exit 0\n")
        (bin_dir / tool).chmod(0o755)
    env = {k: str(v).replace("/opt/airflow", str(root / "opt")) for k, v in init["environment"].items()}
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    proc = subprocess.run(["bash", *init["command"]], env=env, capture_output=True, text=True, timeout=60)
    passwords = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    return proc, passwords, calls.read_text().splitlines()


def test_airflow_init_writes_the_login_migrates_and_hands_over_the_folders(compose, tmp_path):
    proc, passwords, calls = _run_init(compose, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(passwords.read_text()) == {"admin": "admin"}
    assert calls[:4] == [
        "airflow db migrate",
        "sailor db upgrade",
        "sailor buckets --create",
        "sailor demo-data",
    ]
    assert (
        calls[4] == f"chown -R 50000:0 {tmp_path}/opt/logs {tmp_path}/opt/config {tmp_path}/opt/sailor-state"
    )
    # a passwords file that exists is kept (a password changed there stays changed)
    passwords.write_text('{"admin": "mine"}\n')
    assert _run_init(compose, tmp_path)[0].returncode == 0
    assert json.loads(passwords.read_text()) == {"admin": "mine"}
    # the password from .env
    spec, _ = render(COMPOSE.read_text(), {"SAILOR_ADMIN_PASSWORD": "s3cret"})
    proc, passwords, _ = _run_init(spec, tmp_path / "env")
    assert proc.returncode == 0 and json.loads(passwords.read_text()) == {"admin": "s3cret"}
    # any password gives a JSON file (the API server's auth manager reads it with json.loads)
    for n, password in enumerate(['pa"ss', r"C:\secret", "tab\there"]):
        spec, _ = render(COMPOSE.read_text(), {"SAILOR_ADMIN_PASSWORD": password})
        proc, passwords, _ = _run_init(spec, tmp_path / f"odd-{n}")
        assert proc.returncode == 0 and json.loads(passwords.read_text()) == {"admin": password}, password


def test_airflow_init_stops_at_the_first_failing_step(compose, tmp_path):
    proc, _, calls = _run_init(compose, tmp_path, fail="sailor db upgrade")
    assert proc.returncode != 0  # the services that wait for it to complete successfully do not start
    assert calls == ["airflow db migrate", "sailor db upgrade"]


def test_compose_builds_images_that_exist_and_runs_a_gcs_emulator(compose):
    services = compose["services"]
    for name, svc in _airflow(compose).items():
        env = svc["environment"]
        assert env["SAILOR_BUCKET_TEMPLATE"].startswith("gs://"), name
        assert env["STORAGE_EMULATOR_HOST"] == "http://gcs-emulator:9023"
        assert env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
        assert svc["depends_on"]["gcs-emulator"]["condition"] == "service_healthy"
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    emulator = services["gcs-emulator"]
    assert emulator["command"][:2] == ["gcp-storage-emulator", "start"] and "9023" in emulator["command"]
    for svc in services.values():
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).is_file()
    for port in (p for s in services.values() for p in s.get("ports", [])):
        assert port.startswith("127.0.0.1:"), f"{port} listens on every interface"
    assert (ROOT / "docker" / "train.Dockerfile").is_file()


def test_the_airflow_image_ships_the_examples_every_service_allows(compose):
    """An installed SAILOR allows no command folder by default: the image copies the project's
    examples and every Airflow service names them."""
    dockerfile = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert "COPY --chown=airflow:root examples /opt/sailor/examples" in dockerfile
    for name, svc in _airflow(compose).items():
        assert svc["environment"]["SAILOR_COMMAND_ROOTS"] == "/opt/sailor/examples", name


def test_the_database_and_broker_host_ports_can_be_moved_from_dotenv():
    """A host that runs its own PostgreSQL or Redis moves the published ports in .env."""
    spec, _ = render(COMPOSE.read_text(), {"SAILOR_POSTGRES_PORT": "15432", "SAILOR_REDIS_PORT": "16379"})
    assert spec["services"]["postgres"]["ports"] == ["127.0.0.1:15432:5432"]
    assert spec["services"]["redis"]["ports"] == ["127.0.0.1:16379:6379"]
