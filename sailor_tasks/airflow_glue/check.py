"""The prerequisites ``sailor check`` reads from Airflow: the Google connection and the DAGs.

The rest of the checks are Airflow-free (``sailor_tasks.backends.checks``); ``backend_checks``
puts them together in the order a person fixes them, after installing the connection as the
credentials provider (``gcp.install``), so the connection's project is the project checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sailor_tasks.backends.checks import (
    FAILED,
    OK,
    Check,
    GcpApis,
    RegionQuota,
    gke_checks,
    local_checks,
    project_check,
    run_probe,
)
from sailor_tasks.settings import Settings

SAILOR_DAGS = ("sailor_train", "sailor_rebalance", "sailor_assignment_review", "sailor_reconcile")


def connection_check(conn_id: str) -> Check:
    """The Airflow connection exists, is a Google Cloud one and yields credentials."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    name = f"Airflow connection {conn_id!r}"
    add = (
        f"airflow connections add {conn_id} --conn-type google_cloud_platform "
        f"--conn-extra '{json.dumps({'project': 'PROJECT', 'key_path': '/path/to/key.json'})}' "
        "(leave out key_path on GKE with workload identity); SAILOR_GCP_CONN_ID names another connection"
    )
    try:
        hook = GoogleBaseHook(gcp_conn_id=conn_id)  # reads the connection
        conn = hook.get_connection(conn_id)
    except AirflowNotFoundException:
        return Check(name, FAILED, "does not exist", add)
    if conn.conn_type != "google_cloud_platform":
        return Check(
            name,
            FAILED,
            f"conn_type={conn.conn_type!r}; valid: google_cloud_platform",
            f"airflow connections delete {conn_id}, then {add}",
        )
    try:
        _, project = hook.get_credentials_and_project_id()
    except Exception as exc:  # google-auth: no ADC, unreadable key file, bad key JSON, ...
        return Check(
            name,
            FAILED,
            f"no credentials: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
            "give the connection a key (extra key_path or keyfile_dict), or run where application "
            "default credentials exist (workload identity on GKE, gcloud auth application-default login)",
        )
    return Check(name, OK, f"credentials of project {project or '(none)'}")


def dags_check(dags_folder: str | None = None) -> Check:
    """SAILOR's DAGs import cleanly from Airflow's DAGs folder."""
    from airflow.configuration import conf
    from airflow.dag_processing.dagbag import DagBag

    name = "Airflow DAGs importable"
    folder = dags_folder or conf.get("core", "dags_folder")
    bag = DagBag(dag_folder=folder)
    items = tuple({"dag_id": d, "found": d in bag.dags} for d in SAILOR_DAGS)
    if bag.import_errors:
        first = next(iter(bag.import_errors.items()))
        return Check(
            name,
            FAILED,
            f"{len(bag.import_errors)} import errors; {first[0]}: {str(first[1]).strip().splitlines()[-1][:300]}",
            "fix the error (airflow dags list-import-errors shows them all)",
            items,
        )
    missing = [d for d in SAILOR_DAGS if d not in bag.dags]
    if missing:
        return Check(
            name,
            FAILED,
            f"{', '.join(missing)} not in {folder}",
            "point AIRFLOW__CORE__DAGS_FOLDER at SAILOR's dags/ folder (make airflow does)",
            items,
        )
    return Check(name, OK, f"{', '.join(SAILOR_DAGS)} from {folder}", items=items)


def backend_checks(
    backend: str,
    settings: Settings | None = None,
    *,
    regions: Sequence[str] | None = None,
    apis: GcpApis | None = None,
    catalog: Any = None,
    quotas_read: list[RegionQuota] | None = None,
) -> list[Check]:
    """Every prerequisite of ``backend``, the connection's project counting for GCP
    (``quotas_read`` receives the GPU quotas read on gke)."""
    from sailor_tasks.airflow_glue import gcp

    if backend == "local":
        settings = settings or Settings.from_env()
        return [*local_checks(settings), run_probe("Airflow DAGs importable", dags_check)]
    if backend != "gke":
        raise ValueError(f"backend={backend!r}; valid: local, gke")
    from sailor_tasks.backends.gke import GkeConfig
    from sailor_tasks.catalog import load_catalog

    conn_id = gcp.conn_id_from_env()
    gcp.install_for_command(conn_id)
    settings = settings or Settings.from_env()
    catalog = catalog or load_catalog()
    checks = [connection_check(conn_id)]
    try:
        config: GkeConfig | None = GkeConfig.from_env(settings)
    except Exception as exc:  # a bad SAILOR_GKE_* value, or no project (the project check says so)
        config = None
        if project_check(settings, conn_id).ok:
            checks.append(
                Check(
                    "GKE settings", FAILED, str(exc), "fix the SAILOR_GKE_* variable it names (docs/gke.md)"
                )
            )
    checks += gke_checks(
        settings,
        conn_id=conn_id,
        image_for=config.image_for if config else None,
        catalog=catalog,
        regions=list(regions or catalog.regions),
        apis=apis,
        quotas_read=quotas_read,
        workload_identity=(config.gcp_service_account_email(), config.workload_identity_member())
        if config
        else None,
    )
    return checks
