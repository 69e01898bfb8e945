"""sailor_train end to end with every bucket on gs:// (a real GCS API server) and Google
credentials from an Airflow connection; the connection's secret never reaches logs or XCom."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sailor_tasks import gcp_auth, storage
from sailor_tasks.data.manifest import read_manifest, verify
from sailor_tasks.ledger import Ledger
from sailor_tasks.paths import replica_path
from sailor_tasks.train.checkpoint.dcp import CheckpointManager

pytestmark = [pytest.mark.gcs, pytest.mark.slow]

REGION = "us-central1"
PROJECT = "sailor-gcs-test"


def _fake_service_account() -> tuple[dict, list[str]]:
    """A service-account key file as Google issues them, with a freshly generated RSA key; returns
    it and the secret strings that must never be printed."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key_id = f"sailorfakekeyid{uuid.uuid4().hex}"
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": key_id,
        "private_key": pem,
        "client_email": f"sailor-test@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    body_lines = [line for line in pem.splitlines() if line and not line.startswith("-----")]
    # The key id, and long fragments of the key body (any one of them would leak the key).
    return info, [key_id, *(line for line in body_lines[1:-1] if len(line) >= 40)]


@pytest.fixture
def gcs_run_env(gcs, settings, monkeypatch):
    monkeypatch.setenv("SAILOR_GCP_PROJECT", PROJECT)
    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", "gs://{project}-sailor-{bucket}")
    info, secrets = _fake_service_account()
    conn = {
        "conn_type": "google_cloud_platform",
        "extra": {"keyfile_dict": json.dumps(info), "project": PROJECT},
    }
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(conn))
    for bucket in ("source", REGION):
        gcs(f"{PROJECT}-sailor-{bucket}")
    from sailor_tasks.backends import gke
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.settings import Settings

    s = Settings.from_env()
    write_demo_dataset(storage.resolve(DEMO_DATASET, s), num_shards=2, shard_bytes=64_000)
    yield s, secrets
    gcp_auth.set_provider(None)
    gke.set_pod_runner(None)


def _xcom_values(dag_id: str, run_id: str) -> list[str]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter(XComModel.dag_id == dag_id, XComModel.run_id == run_id).all()
        return [json.dumps(r.value, default=str) for r in rows]


def _task_logs(run_id: str) -> str:
    root = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    return "\n".join(
        p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and run_id in str(p)
    )


def test_train_run_on_gcs_with_connection_credentials_leaks_no_secret(gcs_run_env):
    settings, secrets = gcs_run_env
    conf = {
        "job_name": "gcs-run",
        "team": "qa",
        "model": "tiny_gpt",
        "num_workers": 2,
        "total_steps": 20,
        "checkpoint_every_steps": 10,
        "batch_size": 8,
        "regions": [REGION],
    }
    # `airflow dags test` in its own process, as `make demo` runs it: every task's log goes to its
    # output, which is then searched whole.
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    proc = subprocess.run(
        [airflow, "dags", "test", "sailor_train", "-c", json.dumps(conf)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]

    (run,) = Ledger(settings.ledger_url).list_runs()
    assert run["status"] == "success" and run["region"] == REGION and run["steps"] == 20, run
    # The stages took their Google credentials from the connection (its project reached gcsfs).
    assert f"credentials from Airflow connection 'google_cloud_default' (project {PROJECT})" in output
    bucket = f"gs://{PROJECT}-sailor-{REGION}"
    placed = f"{bucket}/{replica_path(run['dataset_uri'])}"
    verify(placed, read_manifest(placed))
    ckpt = run["checkpoint_uri"]
    assert ckpt.startswith(f"{bucket}/runs/")
    assert CheckpointManager(ckpt.rsplit("/", 1)[0]).latest_valid_step() == 20
    assert storage.exists(f"{ckpt.rsplit('/checkpoints', 1)[0]}/summary.md")

    # The logs were captured (training progress from the workers is in them) before grepping them.
    assert "data placed:" in output and "checkpoint step 20 saved" in output
    haystacks = {
        "task logs": output,
        "task log files": _task_logs(run["run_id"]),  # when file task handlers are configured
        "xcom": "\n".join(_xcom_values("sailor_train", run["run_id"])),
        "ledger": json.dumps(Ledger(settings.ledger_url).list_runs(), default=str),
    }
    assert haystacks["xcom"], "the run pushed no XCom to check"
    for where, text in haystacks.items():
        for secret in secrets:
            assert secret not in text, f"a credential fragment appears in {where}"
