"""The prerequisites ``sailor check`` reads: local ones on this machine, GCP ones against the GCS API
server and a local server answering Google's Compute, Artifact Registry and Service Usage calls."""

from __future__ import annotations

import dataclasses
import os

import pytest

from sailor_tasks.backends.checks import (
    GcpApis,
    RegionQuota,
    buckets_check,
    config_problems,
    gke_checks,
    local_checks,
    read_quotas,
    supply_from_quotas,
)
from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.catalog.supply import apply_supply, load_supply, parse_supply, region_supply
from tests.backends.google_apis import GoogleState, google_apis

PROJECT = "acme-ml"
REGIONS = ("us-central1", "europe-west4")


def _by_name(checks):
    return {c.name: c for c in checks}


def test_local_checks_hold_on_a_fresh_state_folder(settings):
    checks = _by_name(local_checks(settings))
    assert all(c.ok for c in checks.values()), [c.to_dict() for c in checks.values() if not c.ok]
    assert checks["state folder writable"].detail == settings.state_dir
    assert checks["torchrun starts"].detail.endswith("-m torch.distributed.run")
    assert not [f for f in os.listdir(settings.state_dir) if f.startswith(".sailor-check")]  # probe removed


def test_local_checks_name_what_is_wrong_and_the_fix(settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    bad = dataclasses.replace(
        settings,
        state_dir=str(blocker),
        ledger_url="postgresql+psycopg://sailor:secret@127.0.0.1:9/ledger",
        command_roots=(str(tmp_path / "gone"),),
    )
    checks = _by_name(c for c in local_checks(bad) if c.name != "torchrun starts")
    state, ledger, roots = (
        checks["state folder writable"],
        checks["ledger reachable"],
        checks["command roots exist"],
    )
    assert state.status == "failed" and str(blocker) in state.detail and "SAILOR_STATE_DIR" in state.fix
    assert ledger.status == "unreachable" and "secret" not in ledger.detail and "***" in ledger.detail
    assert "SAILOR_LEDGER_URL" in ledger.fix
    assert (
        roots.status == "failed"
        and str(tmp_path / "gone") in roots.detail
        and "SAILOR_COMMAND_ROOTS" in roots.fix
    )


def test_an_unconfigured_gcp_setup_reports_each_prerequisite_with_a_fix(settings, monkeypatch):
    monkeypatch.delenv("SAILOR_GCP_PROJECT", raising=False)
    checks = gke_checks(
        settings, conn_id="google_cloud_default", image_for=None, catalog=load_catalog(), regions=REGIONS
    )
    assert len(checks) >= 5 and all(not c.ok and c.fix for c in checks)
    names = [c.name for c in checks]
    assert names[:2] == ["GCP project", "bucket template"]
    assert "google_cloud_default" in checks[0].fix and "gs://{project}-sailor-{bucket}" in checks[1].fix
    # validate's network-free part reports the same two
    assert [c.name for c in config_problems(settings)] == ["GCP project", "bucket template"]


def test_the_project_is_the_credentials_unless_sailor_gcp_project_overrides_it(settings, monkeypatch):
    from sailor_tasks import gcp_auth

    gcs_settings = dataclasses.replace(settings, bucket_template="gs://{project}-sailor-{bucket}")
    gcp_auth.set_provider(lambda: gcp_auth.GcpCredentials(None, "from-conn", source="Airflow connection 'c'"))
    try:
        assert gcs_settings.gcp_project == "from-conn"
        assert gcs_settings.bucket_uri("us-central1") == "gs://from-conn-sailor-us-central1"
        assert config_problems(gcs_settings) == []
        override = dataclasses.replace(gcs_settings, gcp_project_override="other")
        assert override.bucket_uri("source") == "gs://other-sailor-source"
        assert override.gcp_project_source == "SAILOR_GCP_PROJECT"
    finally:
        gcp_auth.set_provider(None)
    with pytest.raises(
        ValueError, match=r"names \{project\} but no GCP project is known.*SAILOR_GCP_PROJECT"
    ):
        gcs_settings.bucket_uri("source")


@pytest.fixture
def gcp_settings(gcs, settings):
    """Project acme-ml, buckets on the GCS API server: source and us-central1 exist, europe-west4 not."""
    import uuid

    prefix = f"t-{uuid.uuid4().hex[:8]}"
    gcs(f"{prefix}-{PROJECT}-source")
    gcs(f"{prefix}-{PROJECT}-us-central1")
    return dataclasses.replace(
        settings, bucket_template=f"gs://{prefix}-{{project}}-{{bucket}}", gcp_project_override=PROJECT
    )


def test_buckets_exist_and_take_a_write(gcp_settings):
    from sailor_tasks import storage

    check = buckets_check(gcp_settings, REGIONS)
    assert check.status == "failed"
    missing = gcp_settings.bucket_uri("europe-west4")
    assert check.detail == f"missing: {missing}"
    assert check.fix == "sailor buckets --create --region europe-west4"
    by_bucket = {i["bucket"]: i for i in check.items}
    assert by_bucket["source"]["writable"] and by_bucket["us-central1"]["writable"]
    assert not by_bucket["europe-west4"]["exists"]
    # the probe objects are removed
    assert not storage.exists(storage.join(gcp_settings.bucket_uri("source"), ".sailor-check"))

    storage.ensure_bucket(missing, location="europe-west4")
    assert buckets_check(gcp_settings, REGIONS).ok


def _state() -> GoogleState:
    image = "projects/acme-ml/locations/{}/repositories/sailor/packages/sailor-train/tags/0.1.0"
    return GoogleState(
        quotas={
            (PROJECT, "us-central1"): {
                "NVIDIA_L4_GPUS": 8,
                "PREEMPTIBLE_NVIDIA_L4_GPUS": 24,
                "NVIDIA_A100_GPUS": 16,
            },
            (PROJECT, "europe-west4"): {"CPUS": 24},  # no GPU quota at all
        },
        images={image.format("us-central1")},
        services={
            (PROJECT, "container.googleapis.com"): "ENABLED",
            (PROJECT, "compute.googleapis.com"): "ENABLED",
        },
    )


def test_gcp_checks_through_the_client_libraries(gcp_settings):
    from sailor_tasks.backends.gke import GkeConfig

    state = _state()
    config = GkeConfig(project=PROJECT)
    catalog = load_catalog()
    with google_apis(state) as endpoint:
        checks = _by_name(
            gke_checks(
                gcp_settings,
                conn_id="google_cloud_default",
                image_for=config.image_for,
                catalog=catalog,
                regions=REGIONS,
                apis=GcpApis(endpoint=endpoint),
            )
        )
    assert state.unexpected == []
    assert "/compute/v1/projects/acme-ml/regions/us-central1" in state.requests
    assert "/v1/projects/acme-ml/services/container.googleapis.com" in state.requests

    assert checks["GCP project"].ok and checks["GCP project"].detail == "acme-ml (from SAILOR_GCP_PROJECT)"
    image = checks["training image in each region"]
    assert image.status == "failed"
    assert image.detail == "missing: europe-west4-docker.pkg.dev/acme-ml/sailor/sailor-train:0.1.0"
    assert "docker/train.Dockerfile" in image.fix

    # the packaged supply plans with more L4s in us-central1 than the quota's 24, and with GPUs in
    # europe-west4, whose GPU quotas are 0 (not reported: not checked)
    quota = checks["GPU quota"]
    supply = region_supply(catalog.offers)
    assert quota.status == "failed" and "--write-supply" in quota.fix
    assert f"us-central1 L4 (plans {supply['us-central1', 'L4']}, quota 24)" in quota.detail
    l4 = next(i for i in quota.items if i.get("region") == "us-central1" and i.get("gpu_type") == "L4")
    assert (l4["on_demand"], l4["preemptible"], l4["supply"]) == (8.0, 24.0, supply["us-central1", "L4"])
    a100 = next(i for i in quota.items if i.get("region") == "us-central1" and i.get("gpu_type") == "A100")
    assert a100["on_demand"] == 16.0 and a100["preemptible"] is None
    assert "us-central1 A100" in quota.detail  # 16 < the packaged supply
    offered = {o.gpu_type for o in catalog.offers if o.region == "us-central1"}
    assert {i["gpu_type"] for i in quota.items if i.get("region") == "us-central1"} == offered
    assert "quota not reported, not checked: " in quota.detail and "europe-west4 " in quota.detail

    apis = checks["APIs enabled"]
    assert apis.status == "failed"
    assert apis.detail == "disabled: artifactregistry.googleapis.com, storage.googleapis.com"
    assert apis.fix == (
        "gcloud services enable artifactregistry.googleapis.com storage.googleapis.com --project acme-ml"
    )


def test_permission_denied_and_unreachable_apis_are_told_apart(gcp_settings):
    state = _state()
    state.forbidden_projects.add(PROJECT)
    catalog = load_catalog()
    with google_apis(state) as endpoint:
        quotas = read_quotas(GcpApis(endpoint=endpoint), PROJECT, catalog, ["us-central1"])
        denied = _by_name(
            gke_checks(
                gcp_settings,
                conn_id="c",
                image_for=lambda r: f"{r}-docker.pkg.dev/acme-ml/sailor/sailor-train:0.1.0",
                catalog=catalog,
                regions=["us-central1"],
                apis=GcpApis(endpoint=endpoint),
            )
        )
    assert quotas[0].error.startswith("403: ")
    assert denied["GPU quota"].status == "failed" and "roles/compute.viewer" in denied["GPU quota"].fix
    assert "roles/artifactregistry.reader" in denied["training image in each region"].fix
    assert "roles/serviceusage" in denied["APIs enabled"].fix

    from tests.backends.google_apis import google_apis as serve

    with serve(GoogleState()) as endpoint:
        pass  # the server is gone: nothing listens there any more
    gone = read_quotas(GcpApis(endpoint=endpoint), PROJECT, catalog, ["us-central1"])
    assert gone[0].error.startswith("0: ")


def test_workload_identity_holds_once_the_google_account_lets_the_pods_account_act_as_it(gcp_settings):
    from sailor_tasks.backends.checks import workload_identity_check
    from sailor_tasks.backends.gke import GkeConfig

    config = GkeConfig(project=PROJECT)
    email, member = config.gcp_service_account_email(), config.workload_identity_member()
    assert (email, member) == (
        "sailor-train@acme-ml.iam.gserviceaccount.com",
        "serviceAccount:acme-ml.svc.id.goog[sailor/sailor-train]",
    )
    bind = (
        "gcloud iam service-accounts add-iam-policy-binding sailor-train@acme-ml.iam.gserviceaccount.com "
        "--role roles/iam.workloadIdentityUser "
        '--member "serviceAccount:acme-ml.svc.id.goog[sailor/sailor-train]"'
    )
    state = _state()
    with google_apis(state) as endpoint:
        apis = GcpApis(endpoint=endpoint)
        missing = workload_identity_check(apis, email, member)
        state.service_accounts[email] = [{"role": "roles/iam.serviceAccountUser", "members": [member]}]
        unbound = workload_identity_check(apis, email, member)
        state.service_accounts[email].append({"role": "roles/iam.workloadIdentityUser", "members": [member]})
        checks = _by_name(
            gke_checks(
                gcp_settings,
                conn_id="google_cloud_default",
                image_for=config.image_for,
                catalog=load_catalog(),
                regions=REGIONS,
                apis=apis,
                workload_identity=(email, member),
            )
        )
        state.forbidden_projects.add(PROJECT)
        denied = workload_identity_check(apis, email, member)
    assert state.unexpected == []
    assert (
        "POST /v1/projects/-/serviceAccounts/sailor-train@acme-ml.iam.gserviceaccount.com:getIamPolicy"
        "?options.requestedPolicyVersion=3&alt=json"
    ) in state.requests

    assert missing.status == "failed" and missing.detail.endswith(f"{email} does not exist")
    assert missing.fix.startswith("gcloud iam service-accounts create sailor-train --project acme-ml, ")
    assert bind in missing.fix
    assert unbound.status == "failed" and "no roles/iam.workloadIdentityUser binding" in unbound.detail
    assert unbound.fix == bind
    assert checks["Workload Identity"].ok, checks["Workload Identity"].to_dict()
    assert denied.status == "failed" and denied.detail.startswith(
        f"cannot read the IAM policy of {email}: 403"
    )
    assert "roles/iam.securityReviewer" in denied.fix and f"get-iam-policy {email}" in denied.fix


def test_supply_file_from_quotas_adds_up_to_each_regions_quota(tmp_path, monkeypatch):
    catalog = load_catalog()
    current = load_supply()
    zones_l4 = sorted({o.zone for o in catalog.offers if o.region == "us-central1" and o.gpu_type == "L4"})
    assert len(zones_l4) >= 2  # the split is exercised
    quotas = [
        RegionQuota("us-central1", {"L4": (8.0, 25.0), "A100": (16.0, None), "T4": (None, None)}),
        RegionQuota("europe-west4", {"L4": (0.0, 0.0)}),
    ]
    doc = supply_from_quotas(quotas, catalog, current, project=PROJECT, today="2026-11-23")
    supply = parse_supply(doc)
    offers = Catalog(apply_supply(catalog.offers, supply))

    def region_total(region, gpu):
        return sum(
            supply.capacity(region, z, gpu)
            for z in {o.zone for o in offers.offers if o.region == region and o.gpu_type == gpu}
        )

    assert region_total("us-central1", "L4") == 25  # the larger quota, split over the zones
    caps = [supply.capacity("us-central1", z, "L4") for z in zones_l4]
    assert max(caps) - min(caps) <= 1
    assert region_total("us-central1", "A100") == 16
    assert region_total("europe-west4", "L4") == 0
    # no quota reported (T4 here), or a region not read: the current capacity stays
    t4_zone = next(o.zone for o in catalog.offers if o.region == "us-central1" and o.gpu_type == "T4")
    assert supply.capacity("us-central1", t4_zone, "T4") == current.capacity("us-central1", t4_zone, "T4")
    other = next(o for o in catalog.offers if o.region not in ("us-central1", "europe-west4"))
    assert supply.capacity(other.region, other.zone, other.gpu_type) == current.capacity(
        other.region, other.zone, other.gpu_type
    )
    assert supply.preemption_rate(zones_l4[0], "L4") == current.preemption_rate(zones_l4[0], "L4")
    assert doc["source"]["quotas_per_region"]["us-central1"]["L4"] == {"on_demand": 8.0, "preemptible": 25.0}


def test_supply_file_from_quotas_loads_when_the_current_file_names_only_some_gpu_types():
    """The current supply file of configuration.md's example (H100, A100, L4): the written file
    gives every GPU type of the catalog a default, so it loads (a zone's type the defaults lacked
    was refused, and `sailor check --write-supply` failed with a traceback)."""
    catalog = load_catalog()
    current = parse_supply(
        {
            "version": 1,
            "defaults": {
                "capacity_gpus": {"H100": 32, "A100": 32, "L4": 64},
                "preemption_rate_per_hour": {"H100": 0.15, "A100": 0.10, "L4": 0.05},
            },
        }
    )
    quotas = [RegionQuota("us-central1", {"L4": (8.0, 25.0)})]
    doc = supply_from_quotas(quotas, catalog, current, project=PROJECT, today="2026-11-30")
    supply = parse_supply(doc)
    assert set(supply.default_capacity) >= {o.gpu_type for o in catalog.offers}
    t4 = next(o for o in catalog.offers if o.gpu_type == "T4")
    assert supply.capacity(t4.region, t4.zone, "T4") == current.capacity(t4.region, t4.zone, "T4") == 0
    assert supply.preemption_rate(t4.zone, "L4") == 0.05
