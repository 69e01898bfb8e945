"""Prerequisites of a backend, each checked for real and reported with how to fix it (``sailor check``).

``local_checks``: the state folder is writable, the ledger answers, ``torch.distributed.run``
starts under SAILOR's interpreter, the command roots exist. ``gke_checks``: the GCP project (the
Google credentials' project, i.e. the Airflow connection's, unless ``SAILOR_GCP_PROJECT``
overrides it), gs:// bucket template, every bucket exists and takes a write, the training image is
in each region's Artifact Registry, the GPUs SAILOR plans with fit the project's quota per region
and GPU type the catalog offers there (Compute Engine regions; ``supply_from_quotas`` turns the
quotas into a supply file), the APIs SAILOR calls are enabled (Service Usage), and the Google
service account the training pods act as lets their Kubernetes service account do so (IAM).
``config_problems`` is the network-free part ``validate`` runs for gke runs before anything is
reserved. The orchestrator's glue adds what needs Airflow (the connection, the DAGs).

Google is reached through its client libraries: ``google.cloud.compute_v1`` for region quotas, the
discovery clients of google-api-python-client (their documents ship with the library) for
Artifact Registry, Service Usage and IAM, and fsspec/gcsfs (``storage``) for the buckets.
``GcpApis(endpoint=...)`` points all three API clients at another host (tests run a local
stand-in for Google there).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sailor_tasks import gcp_auth, storage
from sailor_tasks.settings import SOURCE_BUCKET, Settings

OK, FAILED, UNREACHABLE = "ok", "failed", "unreachable"

GKE_SERVICES: Mapping[str, str] = {
    "container.googleapis.com": "GKE clusters and node pools",
    "compute.googleapis.com": "GPU VMs and their quotas",
    "artifactregistry.googleapis.com": "the training image",
    "storage.googleapis.com": "region buckets",
}
"""APIs a gke run calls, and what for."""

WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
"""Role on a Google service account that lets a Kubernetes service account's pods act as it."""

QUOTA_METRICS: Mapping[str, str] = {
    "P4": "NVIDIA_P4_GPUS",
    "T4": "NVIDIA_T4_GPUS",
    "P100": "NVIDIA_P100_GPUS",
    "V100": "NVIDIA_V100_GPUS",
    "L4": "NVIDIA_L4_GPUS",
    "A100": "NVIDIA_A100_GPUS",
    "A100-80GB": "NVIDIA_A100_80GB_GPUS",
    "H100": "NVIDIA_H100_GPUS",
    "H100-MEGA": "NVIDIA_H100_MEGA_GPUS",
    "H200": "NVIDIA_H200_GPUS",
    "B200": "NVIDIA_B200_GPUS",
}
"""Catalog GPU type → Compute Engine regional quota metric of on-demand GPUs; spot VMs draw on
``PREEMPTIBLE_<metric>`` (and on the on-demand quota where the region grants no preemptible one)."""

_AR_IMAGE = re.compile(
    r"^(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/(?P<repo>[^/]+)/"
    r"(?P<image>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


@dataclass(frozen=True)
class Check:
    """One prerequisite: what was checked, what was found and, unless it holds, how to fix it."""

    name: str
    status: str
    """``ok``, ``failed`` (found wanting) or ``unreachable`` (could not be asked)."""
    detail: str
    fix: str = ""
    items: tuple[Mapping[str, Any], ...] = ()
    """Per-bucket / per-region findings behind ``detail``."""

    def __post_init__(self) -> None:
        if self.status not in (OK, FAILED, UNREACHABLE):
            raise ValueError(f"status={self.status!r}; valid: {OK}, {FAILED}, {UNREACHABLE}")
        if self.status != OK and not self.fix:
            raise ValueError(f"check {self.name!r} is {self.status} without a fix")

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "fix": self.fix,
            "items": [dict(i) for i in self.items],
        }


def run_probe(name: str, probe: Callable[[], Check]) -> Check:
    """``probe()``, or a failed check naming the error it raised."""
    try:
        return probe()
    except Exception as exc:  # a check reports; it never stops the others
        return Check(name, FAILED, f"{type(exc).__name__}: {exc}", fix="see the error above")


# --- local -----------------------------------------------------------------------------------------


def local_checks(settings: Settings, *, torchrun_timeout_s: float = 180.0) -> list[Check]:
    """What the local backend needs on this machine."""
    return [
        run_probe("state folder writable", lambda: _state_dir(settings)),
        run_probe("ledger reachable", lambda: _ledger(settings)),
        run_probe("torchrun starts", lambda: _torchrun(torchrun_timeout_s)),
        run_probe("command roots exist", lambda: _command_roots(settings)),
    ]


def _state_dir(settings: Settings) -> Check:
    name = "state folder writable"
    fix = (
        f"create it and make it writable (mkdir -p {settings.state_dir}) or point SAILOR_STATE_DIR elsewhere"
    )
    try:
        os.makedirs(settings.state_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=settings.state_dir, prefix=".sailor-check-") as f:
            f.write(b"ok")
            f.flush()
    except OSError as exc:
        return Check(name, FAILED, f"{settings.state_dir}: {exc}", fix)
    return Check(name, OK, settings.state_dir)


def _ledger(settings: Settings) -> Check:
    from sailor_tasks.ledger import Ledger

    name = "ledger reachable"
    try:
        Ledger(settings.ledger_url).list_runs(limit=1)
    except Exception as exc:
        return Check(
            name,
            UNREACHABLE,
            f"{settings.ledger_url_redacted}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
            "start the database or fix SAILOR_LEDGER_URL (unset: SQLite in the state folder)",
        )
    return Check(name, OK, settings.ledger_url_redacted)


def _torchrun(timeout_s: float) -> Check:
    name = "torchrun starts"
    fix = f"{sys.executable} -m pip install torch (requirements.txt pins it)"
    if importlib.util.find_spec("torch") is None:  # top-level lookup only: torch is not imported
        return Check(name, FAILED, f"torch is not installed for {sys.executable}", fix)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--help"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check(name, FAILED, f"{' '.join(cmd)} did not answer in {timeout_s:.0f} s", fix)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return Check(name, FAILED, f"{' '.join(cmd)} exited {proc.returncode}: {tail}", fix)
    return Check(name, OK, f"{sys.executable} -m torch.distributed.run")


def _command_roots(settings: Settings) -> Check:
    name = "command roots exist"
    if not settings.command_roots:
        return Check(name, OK, "SAILOR_COMMAND_ROOTS is empty: runs use the built-in trainer only")
    missing = [r for r in settings.command_roots if not os.path.isdir(r)]
    items = tuple({"root": r, "exists": r not in missing} for r in settings.command_roots)
    if missing:
        return Check(
            name,
            FAILED,
            f"not a folder: {', '.join(missing)}",
            "create the folder or remove it from SAILOR_COMMAND_ROOTS (os.pathsep-separated)",
            items,
        )
    return Check(name, OK, ", ".join(settings.command_roots), items=items)


# --- GCP: configuration (no network) -------------------------------------------------------------


def project_check(settings: Settings, conn_id: str) -> Check:
    """The project of buckets and clusters: ``SAILOR_GCP_PROJECT``, else the credentials' project."""
    name = "GCP project"
    try:
        project = settings.gcp_project
    except Exception as exc:  # the credentials provider failed (no key, no ADC, a bad key)
        return Check(
            name,
            FAILED,
            f"SAILOR_GCP_PROJECT is unset and the credentials cannot be read: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}",
            f"give the Airflow connection {conn_id!r} credentials (see its check), or set SAILOR_GCP_PROJECT",
        )
    if not project:
        return Check(
            name,
            FAILED,
            f"no project: none from {settings.gcp_project_source}, and SAILOR_GCP_PROJECT is unset",
            f"set the project in the Airflow connection {conn_id!r} (extra 'project'); "
            "SAILOR_GCP_PROJECT overrides it",
        )
    return Check(name, OK, f"{project} (from {settings.gcp_project_source})")


def template_check(settings: Settings) -> Check:
    """Pods read data and write checkpoints in buckets they can reach: the template must give gs://."""
    from sailor_tasks.backends.gke import GCS_BUCKET_TEMPLATE

    name = "bucket template"
    template = settings.bucket_template
    fix = f"set SAILOR_BUCKET_TEMPLATE={GCS_BUCKET_TEMPLATE} (docs/gke.md)"
    if not template.startswith("gs://"):
        return Check(name, FAILED, f"SAILOR_BUCKET_TEMPLATE={template!r} is not gs://", fix)
    if "{bucket}" not in template and "{region}" not in template:
        return Check(name, FAILED, f"SAILOR_BUCKET_TEMPLATE={template!r} names no {{bucket}}", fix)
    return Check(name, OK, template)


def config_problems(settings: Settings, conn_id: str | None = None) -> list[Check]:
    """The network-free prerequisites of a gke run that fail (``validate`` reports them);
    ``conn_id`` defaults to ``SAILOR_GCP_CONN_ID``, else ``google_cloud_default``."""
    conn_id = conn_id or os.environ.get("SAILOR_GCP_CONN_ID") or "google_cloud_default"
    return [c for c in (project_check(settings, conn_id), template_check(settings)) if not c.ok]


# --- GCP: the APIs -------------------------------------------------------------------------------


class ApiError(Exception):
    """A Google API answered with an error (``status``: the HTTP status) or could not be reached (0)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


class GcpApis:
    """The Google API calls the checks make, through Google's client libraries.

    ``endpoint`` (``http://host:port``) sends every call to another host, as a regional or private
    endpoint would; without it the libraries' public endpoints are used.
    """

    def __init__(self, credentials: Any = None, endpoint: str | None = None):
        self.credentials = credentials
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self._discovery: dict[tuple[str, str], Any] = {}
        self._regions: Any = None

    def _credentials(self) -> Any:
        if self.endpoint is not None and self.credentials is None:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        return self.credentials

    def _service(self, api: str, version: str) -> Any:
        """A discovery client built from the document shipped with google-api-python-client."""
        if (api, version) not in self._discovery:
            from googleapiclient.discovery import build

            options = {"api_endpoint": self.endpoint} if self.endpoint else None
            self._discovery[api, version] = build(
                api,
                version,
                credentials=self._credentials(),
                static_discovery=True,
                cache_discovery=False,
                client_options=options,
            )
        return self._discovery[api, version]

    def _execute(self, request: Any) -> Any:
        from googleapiclient.errors import HttpError

        try:
            return request.execute(num_retries=2)
        except HttpError as exc:
            raise ApiError(int(exc.resp.status), _http_error_message(exc)) from exc
        except OSError as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        """metric → (limit, usage) of the region's Compute Engine quotas (``regions.get``)."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        if self._regions is None:
            if self.endpoint:
                from google.cloud.compute_v1.services.regions.transports.rest import RegionsRestTransport

                scheme, _, host = self.endpoint.partition("://")
                transport = RegionsRestTransport(
                    host=host, credentials=self._credentials(), url_scheme=scheme
                )
                self._regions = compute_v1.RegionsClient(transport=transport)
            else:
                self._regions = compute_v1.RegionsClient(credentials=self.credentials)
        try:
            region_info = self._regions.get(
                request=compute_v1.GetRegionRequest(project=project, region=region)
            )
        except gexc.GoogleAPICallError as exc:
            raise ApiError(int(exc.code or 0), exc.message or str(exc)) from exc
        except OSError as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
        return {q.metric: (float(q.limit), float(q.usage)) for q in region_info.quotas}

    def image_exists(self, image: str) -> bool:
        """Whether an Artifact Registry docker image (``LOCATION-docker.pkg.dev/...``) has the tag or
        digest; False on 404. ValueError when the reference is not an Artifact Registry image."""
        m = _AR_IMAGE.match(image)
        if not m:
            raise ValueError(
                f"{image!r} is not an Artifact Registry image (LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE)"
            )
        repo = f"projects/{m['project']}/locations/{m['location']}/repositories/{m['repo']}"
        locations = self._service("artifactregistry", "v1").projects().locations().repositories()
        if m["digest"]:
            request = locations.dockerImages().get(
                name=f"{repo}/dockerImages/{quote(m['image'], safe='')}@{m['digest']}"
            )
        else:
            package = quote(m["image"], safe="")
            request = (
                locations.packages().tags().get(name=f"{repo}/packages/{package}/tags/{m['tag'] or 'latest'}")
            )
        try:
            self._execute(request)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def service_account_policy(self, email: str) -> dict[str, Any]:
        """The IAM policy of a Google service account (IAM ``projects.serviceAccounts.getIamPolicy``;
        version 3, which conditional bindings need)."""
        request = (
            self._service("iam", "v1")
            .projects()
            .serviceAccounts()
            .getIamPolicy(resource=f"projects/-/serviceAccounts/{email}", options_requestedPolicyVersion=3)
        )
        return dict(self._execute(request))

    def service_state(self, project: str, service: str) -> str:
        """``ENABLED`` or ``DISABLED`` (Service Usage ``services.get``)."""
        request = (
            self._service("serviceusage", "v1").services().get(name=f"projects/{project}/services/{service}")
        )
        return str(self._execute(request).get("state", "STATE_UNSPECIFIED"))


def _http_error_message(exc: Any) -> str:
    try:
        return str(exc.error_details or exc.reason or exc)
    except Exception:
        return str(exc)


def default_apis() -> GcpApis:
    """The API clients ``gke_checks`` uses: Google's public endpoints with ``gcp_auth``'s credentials."""
    return GcpApis(gcp_auth.current().credentials)


# --- GCP: the checks ------------------------------------------------------------------------------


def gke_checks(
    settings: Settings,
    *,
    conn_id: str,
    image_for: Callable[[str], str] | None,
    catalog: Any,
    regions: Sequence[str],
    apis: GcpApis | None = None,
    quotas_read: list[RegionQuota] | None = None,
    workload_identity: tuple[str, str] | None = None,
) -> list[Check]:
    """Every prerequisite of a gke run in ``regions`` (the connection itself is the glue's check).

    ``image_for(region)``: the training image of the region (``GkeConfig.image_for``); None when
    no config could be built (no project). ``quotas_read`` receives the GPU quotas read.
    ``workload_identity``: the Google service account the pods act as and the IAM member of their
    Kubernetes service account (``GkeConfig.gcp_service_account_email()``,
    ``GkeConfig.workload_identity_member()``); None when no config could be built.
    """
    project = project_check(settings, conn_id)
    template = template_check(settings)
    checks = [project, template]
    if not project.ok:
        blocked = "not checked: no GCP project"
        fix = "set the GCP project first (see 'GCP project'), then run sailor check again"
        for name in (
            "buckets exist and are writable",
            "training image in each region",
            "GPU quota",
            "APIs enabled",
            "Workload Identity",
        ):
            checks.append(Check(name, FAILED, blocked, fix))
        return checks
    apis = apis or default_apis()
    if template.ok:
        checks.append(run_probe("buckets exist and are writable", lambda: buckets_check(settings, regions)))
    else:
        checks.append(
            Check(
                "buckets exist and are writable",
                FAILED,
                "not checked: the bucket template is not gs://",
                "fix the bucket template first (see 'bucket template'), then sailor buckets --create",
            )
        )
    if image_for is not None:
        checks.append(
            run_probe("training image in each region", lambda: image_check(apis, image_for, regions))
        )

    def gpu_quota() -> Check:
        check, quotas = quota_check(apis, settings.gcp_project, catalog, regions)
        if quotas_read is not None:
            quotas_read.extend(quotas)
        return check

    checks.append(run_probe("GPU quota", gpu_quota))
    checks.append(run_probe("APIs enabled", lambda: services_check(apis, settings.gcp_project)))
    if workload_identity is not None:
        email, member = workload_identity
        checks.append(run_probe("Workload Identity", lambda: workload_identity_check(apis, email, member)))
    return checks


def buckets_check(settings: Settings, regions: Iterable[str]) -> Check:
    """The source bucket and each region's: exists, and an object can be written and removed."""
    items = []
    for bucket in (SOURCE_BUCKET, *regions):
        uri = settings.bucket_uri(bucket)
        item: dict[str, Any] = {"bucket": bucket, "uri": uri, "exists": False, "writable": False}
        try:
            fs, path = storage.filesystem(uri)
            root = path.split("/", 1)[0]
            item["exists"] = bool(fs.exists(root))
            if item["exists"]:
                probe = storage.join(uri, ".sailor-check", f"{uuid.uuid4().hex}.txt")
                storage.write_bytes(probe, b"sailor check")
                storage.remove(probe)
                item["writable"] = True
        except Exception as exc:
            item["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        items.append(item)
    missing = [i["uri"] for i in items if not i["exists"]]
    readonly = [i["uri"] for i in items if i["exists"] and not i["writable"]]
    name = "buckets exist and are writable"
    if missing or readonly:
        parts = []
        if missing:
            parts.append(f"missing: {', '.join(missing)}")
        if readonly:
            parts.append(f"not writable: {', '.join(readonly)}")
        fixes = []
        if missing:
            # `sailor buckets` always includes the source bucket; name the missing regions' buckets
            missing_regions = [i["bucket"] for i in items if not i["exists"] and i["bucket"] != SOURCE_BUCKET]
            flags = missing_regions or [i["bucket"] for i in items if i["bucket"] != SOURCE_BUCKET][:1]
            fixes.append(f"sailor buckets --create{''.join(f' --region {r}' for r in flags)}")
        if readonly:
            fixes.append("grant the connection's service account roles/storage.objectAdmin on those buckets")
        return Check(name, FAILED, "; ".join(parts), "; ".join(fixes), tuple(items))
    return Check(
        name, OK, f"{len(items)} buckets ({SOURCE_BUCKET} and {len(items) - 1} regions)", items=tuple(items)
    )


def image_check(apis: GcpApis, image_for: Callable[[str], str], regions: Iterable[str]) -> Check:
    """The training image each region's pods pull exists in Artifact Registry."""
    name = "training image in each region"
    items, seen = [], {}
    for region in regions:
        image = image_for(region)
        if image not in seen:
            try:
                seen[image] = ("present" if apis.image_exists(image) else "missing", "")
            except ValueError as exc:
                seen[image] = ("not Artifact Registry", str(exc))
            except ApiError as exc:
                seen[image] = ("error", f"{exc.status}: {exc}")
        state, error = seen[image]
        items.append(
            {"region": region, "image": image, "state": state, **({"error": error} if error else {})}
        )
    missing = sorted({i["image"] for i in items if i["state"] == "missing"})
    errors = sorted({f"{i['image']}: {i['error']}" for i in items if i["state"] == "error"})
    other = sorted({i["image"] for i in items if i["state"] == "not Artifact Registry"})
    if missing or errors:
        parts = [f"missing: {', '.join(missing)}"] if missing else []
        parts += [f"cannot read: {'; '.join(errors)}"] if errors else []
        fix = (
            "build docker/train.Dockerfile and push it to each region's registry "
            "(docker push REGION-docker.pkg.dev/PROJECT/sailor/sailor-train:TAG), or set SAILOR_GKE_IMAGE"
        )
        if errors and not missing:
            fix = "grant the connection's service account roles/artifactregistry.reader (and enable the API)"
        return Check(name, FAILED, "; ".join(parts), fix, tuple(items))
    detail = f"{len(items)} regions"
    if other:
        detail += f"; not in Artifact Registry, not checked: {', '.join(other)}"
    return Check(name, OK, detail, items=tuple(items))


@dataclass(frozen=True)
class RegionQuota:
    region: str
    gpus: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)
    """GPU type → (on-demand limit, preemptible limit); None where the region reports no such metric."""
    error: str = ""


def read_quotas(apis: GcpApis, project: str, catalog: Any, regions: Iterable[str]) -> list[RegionQuota]:
    """GPU quotas of each region for the GPU types the catalog offers there."""
    offered: dict[str, set[str]] = {}
    for o in catalog.offers:
        offered.setdefault(o.region, set()).add(o.gpu_type)
    out = []
    for region in regions:
        try:
            quotas = apis.region_quotas(project, region)
        except ApiError as exc:
            out.append(RegionQuota(region, error=f"{exc.status}: {exc}"))
            continue
        gpus = {}
        for gpu in sorted(offered.get(region, ())):
            metric = QUOTA_METRICS.get(gpu)
            if metric is None:
                continue
            on_demand = quotas.get(metric, (None, None))[0]
            preemptible = quotas.get(f"PREEMPTIBLE_{metric}", (None, None))[0]
            gpus[gpu] = (on_demand, preemptible)
        out.append(RegionQuota(region, gpus))
    return out


def quota_check(
    apis: GcpApis, project: str, catalog: Any, regions: Iterable[str]
) -> tuple[Check, list[RegionQuota]]:
    """The GPUs SAILOR plans with (the catalog's supply, per region and GPU type) fit the project's
    quota there; and the quotas read. A (region, GPU type) whose quota the region does not report
    is listed, not failed."""
    from sailor_tasks.catalog.supply import region_supply

    name = "GPU quota"
    quotas = read_quotas(apis, project, catalog, regions)
    planned = region_supply(catalog.offers)
    items: list[dict[str, Any]] = []
    over, unreported = [], []
    for q in quotas:
        if q.error:
            items.append({"region": q.region, "error": q.error})
            continue
        for gpu, (on_demand, preemptible) in q.gpus.items():
            supply = planned.get((q.region, gpu), 0)
            item = {
                "region": q.region,
                "gpu_type": gpu,
                "on_demand": on_demand,
                "preemptible": preemptible,
                "supply": supply,
            }
            items.append(item)
            if on_demand is None and preemptible is None:
                unreported.append(f"{q.region} {gpu}")
            elif supply > max(on_demand or 0, preemptible or 0):
                over.append(item)
    failed = [q.region for q in quotas if q.error]
    if failed:
        errors = [i["error"] for i in items if "error" in i]
        return (
            Check(
                name,
                UNREACHABLE if all(e.startswith("0:") for e in errors) else FAILED,
                f"cannot read the quotas of {', '.join(failed)}: {errors[0]}",
                "grant the connection's service account roles/compute.viewer and enable compute.googleapis.com",
                tuple(items),
            ),
            quotas,
        )
    note = f"; quota not reported, not checked: {', '.join(unreported)}" if unreported else ""
    if over:
        worst = ", ".join(
            f"{i['region']} {i['gpu_type']} (plans {i['supply']}, quota "
            f"{max(i['on_demand'] or 0, i['preemptible'] or 0):g})"
            for i in over[:5]
        )
        more = f" and {len(over) - 5} more" if len(over) > 5 else ""
        return (
            Check(
                name,
                FAILED,
                f"the supply SAILOR plans with exceeds the quota in {len(over)} (region, GPU type): {worst}{more}{note}",
                "plan with the quotas: sailor check --backend gke --write-supply supply.yaml, then "
                "SAILOR_SUPPLY_FILE=supply.yaml; or request quota at "
                f"https://console.cloud.google.com/iam-admin/quotas?project={project}",
                tuple(items),
            ),
            quotas,
        )
    checked = sum(
        1 for i in items if i.get("gpu_type") and f"{i['region']} {i['gpu_type']}" not in unreported
    )
    return Check(
        name, OK, f"the supply fits the quota in {checked} (region, GPU type){note}", items=tuple(items)
    ), quotas


def services_check(apis: GcpApis, project: str) -> Check:
    """The APIs a gke run calls are enabled in the project."""
    name = "APIs enabled"
    items, disabled, errors = [], [], []
    for service, what in GKE_SERVICES.items():
        try:
            state = apis.service_state(project, service)
        except ApiError as exc:
            state = "unknown"
            errors.append(f"{service}: {exc.status}: {exc}")
        items.append({"service": service, "for": what, "state": state})
        if state == "DISABLED":
            disabled.append(service)
    if disabled:
        return Check(
            name,
            FAILED,
            f"disabled: {', '.join(disabled)}",
            f"gcloud services enable {' '.join(disabled)} --project {project}",
            tuple(items),
        )
    if errors:
        status = UNREACHABLE if all(": 0:" in e for e in errors) else FAILED
        return Check(
            name,
            status,
            f"cannot read: {'; '.join(errors)}",
            "grant the connection's service account roles/serviceusage.serviceUsageConsumer "
            "and enable serviceusage.googleapis.com",
            tuple(items),
        )
    return Check(name, OK, ", ".join(GKE_SERVICES), items=tuple(items))


def workload_identity_check(apis: GcpApis, email: str, member: str) -> Check:
    """The Google service account the training pods act as exists and grants their Kubernetes
    service account (``member``: ``serviceAccount:PROJECT.svc.id.goog[NAMESPACE/NAME]``)
    ``roles/iam.workloadIdentityUser``. SAILOR creates the Kubernetes service account, annotated
    with ``email``; the Google side is the operator's."""
    name = "Workload Identity"
    bind = (
        f"gcloud iam service-accounts add-iam-policy-binding {email} "
        f'--role {WORKLOAD_IDENTITY_ROLE} --member "{member}"'
    )
    try:
        policy = apis.service_account_policy(email)
    except ApiError as exc:
        if exc.status == 404:
            account, _, domain = email.partition("@")
            project = domain.removesuffix(".iam.gserviceaccount.com")
            create = (
                f"gcloud iam service-accounts create {account} --project {project}, "
                if domain.endswith(".iam.gserviceaccount.com")
                else ""
            )
            return Check(
                name,
                FAILED,
                f"Google service account {email} does not exist",
                f"{create}grant it roles/storage.objectAdmin on the buckets, then {bind}; or set "
                "SAILOR_GKE_GCP_SERVICE_ACCOUNT to the one the pods should act as",
            )
        return Check(
            name,
            UNREACHABLE if exc.status == 0 else FAILED,
            f"cannot read the IAM policy of {email}: {exc.status}: {exc}",
            "grant the connection's service account roles/iam.securityReviewer and enable "
            f"iam.googleapis.com; or check it yourself: gcloud iam service-accounts get-iam-policy {email}",
        )
    granted = any(
        b.get("role") == WORKLOAD_IDENTITY_ROLE and member in b.get("members", ())
        for b in policy.get("bindings", ())
    )
    if not granted:
        return Check(
            name,
            FAILED,
            f"{member} may not act as {email} (no {WORKLOAD_IDENTITY_ROLE} binding): the training "
            "pods would get no Google credentials",
            bind,
        )
    return Check(name, OK, f"the training pods act as {email} ({member} has {WORKLOAD_IDENTITY_ROLE})")


# --- the supply file from quotas ------------------------------------------------------------------


def supply_from_quotas(
    quotas: Sequence[RegionQuota], catalog: Any, current: Any, *, project: str, today: str
) -> dict[str, Any]:
    """A supply document (docs/configuration.md#supply-file) whose capacities are the quotas read.

    Capacity is per (zone, GPU type) and shared by both markets; a region's quota is per region.
    Each (region, GPU type) gets the larger of its on-demand and preemptible quotas (the most
    either market can hold there), split over the catalog's zones offering it so the zones add up
    to the quota. GPU types whose quota the region does not report, and regions not read, keep the
    ``current`` supply's capacity. Preemption rates are the ``current`` supply's.
    """
    read = {q.region: q for q in quotas if not q.error}
    zones: dict[tuple[str, str], list[str]] = {}
    for o in catalog.offers:
        bucket = zones.setdefault((o.region, o.gpu_type), [])
        if o.zone not in bucket:
            bucket.append(o.zone)
    out_zones: dict[str, dict[str, dict[str, Any]]] = {}
    sources: dict[str, dict[str, Any]] = {}
    for (region, gpu), zone_list in sorted(zones.items()):
        zone_list = sorted(zone_list)
        q = read.get(region)
        limits = q.gpus.get(gpu) if q else None
        if limits is not None and any(v is not None for v in limits):
            total = int(max(v or 0 for v in limits))
            share, extra = divmod(total, len(zone_list))
            capacities = [share + (1 if i < extra else 0) for i in range(len(zone_list))]
            sources.setdefault(region, {})[gpu] = {"on_demand": limits[0], "preemptible": limits[1]}
        else:
            capacities = [current.capacity(region, z, gpu) for z in zone_list]
        for zone, cap in zip(zone_list, capacities, strict=True):
            entry = {"capacity_gpus": int(cap)}
            rate = current.zone_overrides.get(zone, {}).get(gpu, {}).get("preemption_rate_per_hour")
            if rate is not None:
                entry["preemption_rate_per_hour"] = float(rate)
            out_zones.setdefault(zone, {})[gpu] = entry
    return {
        "version": 1,
        "source": {
            "written_by": "sailor check --write-supply",
            "project": project,
            "date": today,
            "quotas_per_region": sources,
        },
        # Every GPU type written gets a default (capacity 0: the zones say where it is; the current
        # rate, 0 where the current file has none): a type the defaults lack would be refused.
        "defaults": {
            "capacity_gpus": {gpu: 0 for gpu in sorted({*current.default_capacity, *(g for _, g in zones)})},
            "preemption_rate_per_hour": {
                gpu: float(current.default_preemption_rate.get(gpu, 0.0))
                for gpu in sorted(
                    {*current.default_preemption_rate, *current.default_capacity, *(g for _, g in zones)}
                )
            },
        },
        "zones": out_zones,
    }
