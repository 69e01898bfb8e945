"""Google credentials from an Airflow connection reach gcsfs and the GKE client, and never their logs."""

from __future__ import annotations

import json

import pytest

from sailor_tasks import gcp_auth, storage
from sailor_tasks.airflow_glue.gcp import connection_credentials, install


@pytest.fixture(autouse=True)
def _reset():
    yield
    from sailor_tasks.backends import gke

    gcp_auth.set_provider(None)
    gke.set_pod_runner(None)


def _key_connection(monkeypatch, conn_id: str, project: str) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        .decode()
    )
    info = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": f"sa@{project}.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    extra = {"keyfile_dict": json.dumps(info), "project": project}
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    return pem


def test_connection_key_becomes_service_account_credentials(monkeypatch, caplog):
    pem = _key_connection(monkeypatch, "sailor_gcp", "acme-ml")
    creds = connection_credentials("sailor_gcp")
    assert creds.project == "acme-ml"
    assert creds.credentials.service_account_email == "sa@acme-ml.iam.gserviceaccount.com"
    assert "<hidden>" in repr(creds) and "PRIVATE" not in repr(creds)
    body = pem.splitlines()[5]
    assert body not in caplog.text


def test_installed_provider_feeds_gcsfs_options_unless_an_emulator_is_set(monkeypatch):
    _key_connection(monkeypatch, "sailor_gcp", "acme-ml")
    monkeypatch.setenv("SAILOR_GCP_CONN_ID", "sailor_gcp")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    install()
    options = storage.fs_options("gs")
    assert options["project"] == "acme-ml"
    assert options["token"].service_account_email == "sa@acme-ml.iam.gserviceaccount.com"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    assert storage.fs_options("gs")["token"] == "anon"  # a local server never receives the key
    assert storage.fs_options("file") == {"auto_mkdir": True}


def test_missing_connection_falls_back_to_application_default_credentials(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_NOPE", raising=False)
    creds = connection_credentials("nope")
    assert creds.credentials is None and creds.project is None
