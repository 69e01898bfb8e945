"""Credentials never reach a repr, a log line or the demo's summary."""

from __future__ import annotations

from types import SimpleNamespace

from sailor_tasks.cli.airflow_api import AirflowClient
from sailor_tasks.cli.demo import demo_summary
from sailor_tasks.settings import Settings

SECRET = "s3cret-pw"
TOKEN = "eyJhbGciOi.token.sig"


def test_the_airflow_client_repr_hides_password_and_token():
    client = AirflowClient("http://localhost:8080", username="admin", password=SECRET, token=TOKEN)
    for text in (repr(client), str(client)):
        assert SECRET not in text and TOKEN not in text, text
        assert "admin" in text and "localhost:8080" in text


class _Ledger:
    """The few ledger reads the demo summary makes, for one finished run."""

    run = {
        "status": "success", "region": "us-central1", "zone": "us-central1-a", "num_gpus": 2,
        "gpu_type": "L4", "market": "spot", "usd_per_hour": 1.0, "dataset_uri": "sailor://source/d",
        "steps": 10, "model": "tiny_gpt", "initial_loss": 5.0, "final_loss": 4.0,
        "checkpoint_uri": "file:///x", "usd_estimate": 0.01, "request": {},
    }  # fmt: skip

    def get_run(self, run_id):
        return self.run

    def placements(self, run_id, limit=None):
        return [{"explanation": ["because"]}]

    def latest_assignment(self):
        return SimpleNamespace(version=3, shares={"research": {}})

    def replicas(self, uris):
        return {"sailor://source/d": ("us-central1",)}

    def attempts(self, run_id):
        return []

    def preemptions(self, run_id):
        return []


def test_the_demo_summary_masks_the_ledger_password(tmp_path):
    url = f"postgresql+psycopg2://sailor:{SECRET}@db.internal:5432/sailor"
    settings = Settings.from_env({"SAILOR_STATE_DIR": str(tmp_path), "SAILOR_LEDGER_URL": url})
    text = demo_summary(_Ledger(), "run-1", settings)
    assert SECRET not in text, text
    assert "postgresql+psycopg2://sailor:***@db.internal:5432/sailor" in text
    assert SECRET not in repr(settings)


def test_a_ledger_url_without_credentials_is_shown_unchanged(tmp_path):
    settings = Settings.from_env({"SAILOR_STATE_DIR": str(tmp_path)})
    assert settings.ledger_url_redacted == settings.ledger_url == f"sqlite:///{tmp_path}/ledger.db"


def test_a_password_holding_url_delimiters_is_masked_too(tmp_path):
    """SQLAlchemy reads ``Xy7/Qm+9z`` as the password (generated passwords often hold ``/``)."""
    for password in ("Xy7/Qm+9z", "ab#cd", "ab?cd"):
        url = f"postgresql+psycopg2://sailor:{password}@db.internal:5432/sailor"
        settings = Settings.from_env({"SAILOR_STATE_DIR": str(tmp_path), "SAILOR_LEDGER_URL": url})
        shown = settings.ledger_url_redacted
        assert password not in shown and shown == "postgresql+psycopg2://sailor:***@db.internal:5432/sailor"
