"""``sailor check``: ✔/✘ per prerequisite with its fix, --json, exit codes, --write-supply."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.cli.main import main as sailor
from tests.backends.google_apis import GoogleState, google_apis

PROJECT = "acme-ml"
REGIONS = ("us-central1", "europe-west4")


@pytest.fixture
def clean_glue():
    """Undo what a gke check installs in this process: the credentials provider, the pod runner
    and the server context it reads Airflow's connections in."""
    import os

    context = os.environ.get("_AIRFLOW_PROCESS_CONTEXT")
    yield
    from sailor_tasks import gcp_auth
    from sailor_tasks.backends import gke

    gcp_auth.set_provider(None)
    gke.set_pod_runner(None)
    if context is None:
        os.environ.pop("_AIRFLOW_PROCESS_CONTEXT", None)
    else:
        os.environ["_AIRFLOW_PROCESS_CONTEXT"] = context


def _json(capsys, argv):
    capsys.readouterr()
    code = sailor(argv)
    return code, json.loads(capsys.readouterr().out)


def test_local_check_holds_on_this_machine(settings, capsys, clean_glue):
    code, out = _json(capsys, ["check", "--backend", "local", "--json"])
    assert code == 0 and out["ok"] and out["backend"] == "local"
    names = [c["name"] for c in out["checks"]]
    assert names == [
        "state folder writable",
        "ledger reachable",
        "torchrun starts",
        "command roots exist",
        "Airflow DAGs importable",
    ]
    assert all(c["status"] == "ok" and c["fix"] == "" for c in out["checks"])


def test_unconfigured_gke_reports_every_prerequisite_with_a_fix(settings, capsys, monkeypatch, clean_glue):
    monkeypatch.delenv("SAILOR_GCP_PROJECT", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", raising=False)
    code, out = _json(capsys, ["check", "--backend", "gke", "--json"])
    assert code == 1 and not out["ok"]
    failed = [c for c in out["checks"] if not c["ok"]]
    assert len(failed) >= 5 and all(c["fix"] for c in failed)
    first = out["checks"][0]
    assert (
        first["name"] == "Airflow connection 'google_cloud_default'" and first["detail"] == "does not exist"
    )
    assert "airflow connections add google_cloud_default" in first["fix"]

    assert sailor(["check", "--backend", "gke"]) == 1
    text = capsys.readouterr().out
    assert "✘ GCP project" in text and "fix: set the project in the Airflow connection" in text
    assert "✔" not in text and text.rstrip().endswith(f"0 of {len(out['checks'])} prerequisites hold")


def test_a_connection_stored_in_airflows_database_names_the_project(
    settings, capsys, monkeypatch, clean_glue
):
    """`airflow connections add` stores it in the metadata database, which a command (unlike a
    task) does not read by default."""
    import uuid

    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    from tests.dags.test_sailor_train_gcs import _fake_service_account

    info, secrets = _fake_service_account()
    conn_id = f"sailor_check_{uuid.uuid4().hex[:8]}"
    extra = {"keyfile_dict": json.dumps(info), "project": "db-project"}
    with create_session() as session:
        session.add(Connection(conn_id=conn_id, conn_type="google_cloud_platform", extra=json.dumps(extra)))
    monkeypatch.setenv("SAILOR_GCP_CONN_ID", conn_id)
    monkeypatch.delenv("SAILOR_GCP_PROJECT", raising=False)
    try:
        code, out = _json(capsys, ["check", "--backend", "gke", "--json", "--region", "us-central1"])
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()
    connection, project = out["checks"][:2]
    assert connection == {**connection, "name": f"Airflow connection {conn_id!r}", "ok": True}
    assert connection["detail"] == "credentials of project db-project"
    assert project["ok"] and project["detail"] == f"db-project (from Airflow connection {conn_id!r})"
    assert code == 1  # the bucket template is still local
    assert not any(s in json.dumps(out) for s in secrets)


def test_a_connection_without_credentials_is_reported_not_raised(
    settings, capsys, monkeypatch, tmp_path, clean_glue
):
    """A connection naming only a project, where no application default credentials exist."""
    conn = {"conn_type": "google_cloud_platform", "extra": {"project": PROJECT}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(conn))
    monkeypatch.delenv("SAILOR_GCP_PROJECT", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server either
    code, out = _json(capsys, ["check", "--backend", "gke", "--json", "--region", "us-central1"])
    assert code == 1
    connection, project = out["checks"][:2]
    assert connection["status"] == "failed" and connection["detail"].startswith("no credentials: ")
    assert "key_path" in connection["fix"]
    assert project["status"] == "failed" and "credentials cannot be read" in project["detail"]
    assert all(c["fix"] for c in out["checks"] if not c["ok"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["check", "--backend", "gke", "--region", "mars-1"], "--region mars-1 not in the catalog; valid: "),
        (["check", "--backend", "local", "--write-supply", "s.yaml"], "use them with --backend gke"),
        (
            ["check", "--backend", "gke", "--write-supply", "/no/such/dir/s.yaml"],
            "/no/such/dir does not exist",
        ),
    ],
)
def test_bad_input_is_exit_2_naming_the_value(settings, capsys, argv, message):
    assert sailor(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unreadable_supply_file_is_bad_input(settings, capsys, monkeypatch, tmp_path):
    from sailor_tasks.catalog import load_catalog

    bad = tmp_path / "supply.yaml"
    bad.write_text("version: 2\n")
    monkeypatch.setenv("SAILOR_SUPPLY_FILE", str(bad))
    load_catalog.cache_clear()
    try:
        assert sailor(["check", "--backend", "gke"]) == 2
    finally:
        load_catalog.cache_clear()
    assert "the catalog cannot be loaded: supply file version=2; valid: 1" in capsys.readouterr().err


def _google(prefix: str) -> GoogleState:
    tag = "projects/acme-ml/locations/{}/repositories/sailor/packages/sailor-train/tags/0.1.0"
    return GoogleState(
        quotas={
            (PROJECT, "us-central1"): {"NVIDIA_L4_GPUS": 8, "PREEMPTIBLE_NVIDIA_L4_GPUS": 24},
            (PROJECT, "europe-west4"): {"NVIDIA_T4_GPUS": 4, "PREEMPTIBLE_NVIDIA_T4_GPUS": 16},
        },
        images={tag.format(r) for r in REGIONS},
        services={
            (PROJECT, s): "ENABLED"
            for s in (
                "container.googleapis.com",
                "compute.googleapis.com",
                "artifactregistry.googleapis.com",
                "storage.googleapis.com",
            )
        },
        service_accounts={
            "sailor-train@acme-ml.iam.gserviceaccount.com": [
                {
                    "role": "roles/iam.workloadIdentityUser",
                    "members": ["serviceAccount:acme-ml.svc.id.goog[sailor/sailor-train]"],
                }
            ]
        },
    )


def test_a_configured_project_passes_and_writes_the_supply_file(
    gcs, settings, capsys, monkeypatch, tmp_path, clean_glue
):
    """The connection (a service-account key, project acme-ml) names the project; no
    SAILOR_GCP_PROJECT. Buckets on the GCS API server, the rest on the Google API stand-in."""
    import uuid

    from sailor_tasks.backends import checks
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.catalog.supply import load_supply
    from tests.dags.test_sailor_train_gcs import _fake_service_account

    info, secrets = _fake_service_account()
    info["project_id"] = PROJECT
    conn = {
        "conn_type": "google_cloud_platform",
        "extra": {"keyfile_dict": json.dumps(info), "project": PROJECT},
    }
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(conn))
    monkeypatch.delenv("SAILOR_GCP_PROJECT", raising=False)
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", f"gs://{prefix}-{{project}}-{{bucket}}")
    for bucket in ("source", *REGIONS):
        gcs(f"{prefix}-{PROJECT}-{bucket}")
    supply_file = tmp_path / "supply.yaml"
    state = _google(prefix)
    regions = [a for r in REGIONS for a in ("--region", r)]
    with google_apis(state) as endpoint:
        monkeypatch.setattr(checks, "default_apis", lambda: checks.GcpApis(endpoint=endpoint))
        argv = ["check", "--backend", "gke", "--json", *regions]
        # the packaged supply plans with more GPUs than this project's quota: write the quotas' supply
        code, out = _json(capsys, [*argv, "--write-supply", str(supply_file)])
        assert code == 1 and [c["name"] for c in out["checks"] if not c["ok"]] == ["GPU quota"]
        assert out["supply_file"] == str(supply_file)
        monkeypatch.setenv("SAILOR_SUPPLY_FILE", str(supply_file))
        load_catalog.cache_clear()  # a command reads it at start; this process cached the packaged one
        code, out = _json(capsys, argv)  # planning with it, every prerequisite holds
    assert state.unexpected == []
    assert code == 0, [c for c in out["checks"] if not c["ok"]]
    by_name = {c["name"]: c for c in out["checks"]}
    assert by_name["Airflow connection 'google_cloud_default'"]["detail"] == "credentials of project acme-ml"
    assert by_name["GCP project"]["detail"] == "acme-ml (from Airflow connection 'google_cloud_default')"
    assert by_name["GPU quota"]["detail"].startswith("the supply fits the quota in 2 (region, GPU type)")
    assert by_name["Workload Identity"]["detail"] == (
        "the training pods act as sailor-train@acme-ml.iam.gserviceaccount.com "
        "(serviceAccount:acme-ml.svc.id.goog[sailor/sailor-train] has roles/iam.workloadIdentityUser)"
    )
    assert not any(s in json.dumps(out) for s in secrets)

    monkeypatch.delenv("SAILOR_SUPPLY_FILE")
    load_catalog.cache_clear()
    supply = load_supply(str(supply_file))
    catalog = load_catalog()
    for region, gpu, quota in (("us-central1", "L4", 24), ("europe-west4", "T4", 16)):
        zones = {o.zone for o in catalog.offers if o.region == region and o.gpu_type == gpu}
        assert sum(supply.capacity(region, z, gpu) for z in zones) == quota
    a100_zone = next(o.zone for o in catalog.offers if o.region == "us-central1" and o.gpu_type == "A100")
    assert supply.capacity("us-central1", a100_zone, "A100") == load_supply().capacity(
        "us-central1", a100_zone, "A100"
    )


def test_write_supply_changes_nothing_when_the_quotas_cannot_be_read(
    settings, capsys, monkeypatch, tmp_path, clean_glue
):
    from sailor_tasks.backends import checks

    monkeypatch.setenv("SAILOR_GCP_PROJECT", PROJECT)
    supply_file = tmp_path / "supply.yaml"
    supply_file.write_text("version: 1\n")
    state = GoogleState(forbidden_projects={PROJECT})
    with google_apis(state) as endpoint:
        monkeypatch.setattr(checks, "default_apis", lambda: checks.GcpApis(endpoint=endpoint))
        code = sailor(
            ["check", "--backend", "gke", "--region", "us-central1", "--write-supply", str(supply_file)]
        )
    assert code == 1
    assert "supply file not written: the quotas of us-central1 could not be read" in capsys.readouterr().err
    assert supply_file.read_text() == "version: 1\n"


def test_first_hour_counts_what_an_unconfigured_gke_check_reports(settings, monkeypatch):
    """bench/first_hour.py's check_gke_reports: a subprocess with every GCP setting left out."""
    import os

    from sailor_tasks.testing.first_hour import check_gke

    monkeypatch.setenv("SAILOR_GCP_PROJECT", "would-configure-it")  # left out by check_gke
    result = check_gke(dict(os.environ))
    assert result["exit"] == 1 and result["all_have_a_fix"]
    assert result["reports"] >= 5 and result["names"][:3] == [
        "Airflow connection 'google_cloud_default'",
        "GCP project",
        "bucket template",
    ]


def test_a_supply_file_that_cannot_be_written_is_reported_and_leaves_nothing_behind(settings, tmp_path):
    from sailor_tasks.backends.checks import RegionQuota
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.cli.check import write_supply

    folder = tmp_path / "supply.yaml"
    folder.mkdir()  # a folder where the file should go
    quotas = [RegionQuota("us-central1", {"L4": (24.0, 24.0)})]
    path, message = write_supply(str(folder), quotas, load_catalog(), settings)
    assert path is None and message.startswith(f"supply file not written: {folder}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["supply.yaml"]  # no temporary left
