"""docker-compose.yaml checked offline with npm dclint (compose-spec schema + rules) and for the
services SAILOR needs; the Dockerfiles it builds exist."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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


def test_compose_runs_airflow_services_with_a_gcs_emulator():
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {
        "postgres",
        "gcs-emulator",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    } <= set(services)
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        svc = services[name]
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["SAILOR_BUCKET_TEMPLATE"].startswith("gs://")
        assert env["STORAGE_EMULATOR_HOST"] == "http://gcs-emulator:9023"
        assert env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
        assert {"./dags:/opt/airflow/dags", "./plugins:/opt/airflow/plugins"} <= set(svc["volumes"])
        assert svc["depends_on"]["gcs-emulator"]["condition"] == "service_healthy"
    emulator = services["gcs-emulator"]
    assert emulator["entrypoint"][:2] == ["gcp-storage-emulator", "start"]
    assert "--port" in emulator["entrypoint"] and "9023" in emulator["entrypoint"]
    for svc in services.values():
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).is_file()
    assert (ROOT / "docker" / "train.Dockerfile").is_file()
