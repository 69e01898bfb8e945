"""Where SAILOR keeps its state: the state folder, the ledger URL, bucket naming and the backend.

Every value comes from an environment variable with a documented default, read when
``Settings.from_env()`` is called (never at import time), so tests and Airflow workers can point a
run at another state folder without touching code.

| variable                 | default                                   | meaning                              |
|--------------------------|-------------------------------------------|--------------------------------------|
| SAILOR_STATE_DIR         | ``./.sailor``                             | local buckets, ledger, cluster files |
| SAILOR_LEDGER_URL        | ``sqlite:///{state_dir}/ledger.db``       | SQLAlchemy URL of the ledger         |
| SAILOR_BUCKET_TEMPLATE   | ``file://{state_dir}/buckets/{bucket}``   | URI of bucket ``{bucket}``           |
| SAILOR_BACKEND           | ``local``                                 | default backend (``local``/``gke``)  |
| SAILOR_GCP_PROJECT       | the Google credentials' project           | overrides the project of buckets     |
|                          | (the Airflow connection's)                | (``{project}``) and clusters         |
| SAILOR_DATA_ROOTS        | (none)                                    | folders file:// datasets and traces  |
|                          |                                           | may come from (``os.pathsep``-sep.)  |
| SAILOR_DATA_BUCKETS      | (none)                                    | gs:// buckets datasets and traces    |
|                          |                                           | may come from (comma-separated)      |
| SAILOR_COMMAND_ROOTS     | the checkout's ``examples/`` (installed   | folders a local ``command`` may run  |
|                          | into site-packages: none)                 | from (``os.pathsep``-separated)      |
| SAILOR_QUEUE_POLICY      | ``las``                                   | policy admitting queued runs         |
|                          |                                           | (las, fifo, ftf, edf)                |
| SAILOR_TEAM_WEIGHTS      | (none: every team 1)                      | ``team=weight,...`` for ``las``      |
| SAILOR_LEASE_S           | ``900``                                   | seconds a reservation's lease lasts  |
|                          |                                           | without a renewal (>= 3 on local,    |
|                          |                                           | >= 45 on gke)                        |

SAILOR's own buckets (``source`` and the regions, through the bucket template) are always readable
by a run, except their ``runs/`` folders; nothing else of the state folder is.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from sailor_tasks.errors import SettingsError

BACKENDS = ("local", "gke")
QUEUE_POLICIES = ("las", "fifo", "ftf", "edf")
"""Policies the live queue admits by (``sailor_tasks.queue``); ``las`` is the default."""
DEFAULT_LEASE_S = 900.0
LEASE_RENEWAL_S = {"local": 1.0, "gke": 15.0}
"""Per backend, the longest interval between two renewals of a running run's lease: a stage's
heartbeat beats every third of the lease but at most once a second; on ``gke`` the triggers that
follow a deferred attempt renew it at each poll (``airflow_glue.gcp.POD_POLL_INTERVAL_S``)."""
LEASE_RENEWALS = 3
"""A lease must last this many renewal intervals: two renewals may fail (the ledger briefly
unreachable, a slow poll) before it expires under a run that is alive."""
STAGE_RETRIES = 2
"""Airflow retries of a SAILOR task (the DAGs' ``default_args``): a stage's transient error (the
ledger or storage unreachable a moment) is tried again; a bad request fails at once."""
SOURCE_BUCKET = "source"
"""Name of the bucket that holds datasets before SAILOR places them (``sailor://source/...``)."""


def _default_command_root(package_dir: Path) -> str:
    """The project's ``examples/`` folder when SAILOR runs from its source checkout (the folder
    above the package holds SAILOR's own ``pyproject.toml``); "" (no folder) when it is installed
    into site-packages, where an ``examples/`` beside it belongs to another distribution."""
    checkout = package_dir.parent
    try:
        with open(checkout / "pyproject.toml", "rb") as f:
            name = tomllib.load(f).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    return str(checkout / "examples") if name == "sailor-tasks" else ""


DEFAULT_COMMAND_ROOT = _default_command_root(Path(__file__).resolve().parent)
"""The project's ``examples/`` folder in a source checkout (``make``'s editable install): where a
local backend ``command`` may come from by default. Installed (the Airflow image): none, unless
``SAILOR_COMMAND_ROOTS`` names some."""


@dataclass(frozen=True, slots=True)
class Settings:
    state_dir: str
    """Absolute path of the local state folder."""
    ledger_url: str = field(repr=False)
    """SQLAlchemy URL of the ledger; may hold a password, so it is left out of ``repr`` (show
    ``ledger_url_redacted``)."""
    bucket_template: str
    """Template of a bucket's root URI; ``{bucket}``, ``{region}``, ``{project}`` and ``{state_dir}`` are filled."""
    backend: str = "local"
    """Default backend."""
    gcp_project_override: str | None = None
    """``SAILOR_GCP_PROJECT``: the GCP project of buckets and clusters when set; else ``gcp_project``
    is the project of the Google credentials (the Airflow connection's)."""
    data_roots: tuple[str, ...] = ()
    """Folders that ``file://`` datasets and traces may be read from, besides SAILOR's own buckets."""
    data_buckets: tuple[str, ...] = ()
    """``gs://`` buckets (names) that datasets and traces may be read from, besides SAILOR's own."""
    command_roots: tuple[str, ...] = (DEFAULT_COMMAND_ROOT,) if DEFAULT_COMMAND_ROOT else ()
    """Folders whose scripts and executables a run's ``command`` may start on the local backend
    (whoever may trigger a run must not get arbitrary code execution on the worker)."""
    queue_policy: str = "las"
    """Policy that admits queued runs when capacity frees (one of ``QUEUE_POLICIES``)."""
    team_weights: tuple[tuple[str, float], ...] = ()
    """(team, weight) pairs for ``las``'s weighted max-min fairness; unlisted teams weigh 1."""
    lease_s: float = DEFAULT_LEASE_S
    """Seconds a reservation's lease lasts unless its run renews it (stages, training heartbeat)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        state_dir = str(Path(env.get("SAILOR_STATE_DIR") or ".sailor").expanduser().resolve())
        backend = env.get("SAILOR_BACKEND", "local")
        if backend not in BACKENDS:
            raise SettingsError(f"SAILOR_BACKEND={backend!r} is not a backend; valid: {', '.join(BACKENDS)}")
        policy = env.get("SAILOR_QUEUE_POLICY") or "las"
        if policy not in QUEUE_POLICIES:
            raise SettingsError(
                f"SAILOR_QUEUE_POLICY={policy!r} is not a queue policy; valid: {', '.join(QUEUE_POLICIES)}"
            )
        lease_s = _positive("SAILOR_LEASE_S", env.get("SAILOR_LEASE_S") or str(DEFAULT_LEASE_S))
        shortest = LEASE_RENEWALS * LEASE_RENEWAL_S[backend]
        if lease_s < shortest:
            raise SettingsError(
                f"SAILOR_LEASE_S={env.get('SAILOR_LEASE_S')!r}: need at least {shortest:g} seconds with "
                f"SAILOR_BACKEND={backend} ({LEASE_RENEWALS} renewals of a running run, one every "
                f"{LEASE_RENEWAL_S[backend]:g} s at most); default {DEFAULT_LEASE_S:g}"
            )
        return cls(
            queue_policy=policy,
            team_weights=parse_team_weights(env.get("SAILOR_TEAM_WEIGHTS", "")),
            lease_s=lease_s,
            state_dir=state_dir,
            ledger_url=env.get("SAILOR_LEDGER_URL") or f"sqlite:///{state_dir}/ledger.db",
            bucket_template=env.get("SAILOR_BUCKET_TEMPLATE") or "file://{state_dir}/buckets/{bucket}",
            backend=backend,
            gcp_project_override=env.get("SAILOR_GCP_PROJECT") or None,
            data_roots=tuple(p for p in env.get("SAILOR_DATA_ROOTS", "").split(os.pathsep) if p),
            data_buckets=tuple(
                b.strip().removeprefix("gs://").strip("/")
                for b in env.get("SAILOR_DATA_BUCKETS", "").split(",")
                if b.strip().removeprefix("gs://").strip("/")
            ),
            command_roots=tuple(
                str(Path(p).expanduser().resolve())
                for p in env.get("SAILOR_COMMAND_ROOTS", DEFAULT_COMMAND_ROOT).split(os.pathsep)
                if p
            ),
        )

    def with_state_dir(self, state_dir: str) -> Settings:
        """Return settings rooted at another state folder (tests, benchmarks)."""
        state_dir = str(Path(state_dir).resolve())
        return replace(
            self,
            state_dir=state_dir,
            ledger_url=f"sqlite:///{state_dir}/ledger.db",
        )

    @property
    def ledger_url_redacted(self) -> str:
        """The ledger URL with its password replaced by ``***``, for messages and logs. Parsed as
        SQLAlchemy parses it (a password may hold ``/``, ``?`` or ``#``); a URL it cannot parse
        keeps nothing of what stands before its last ``@``."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(self.ledger_url)
        except (ArgumentError, ValueError):
            head, sep, rest = self.ledger_url.partition("://")
            return f"{head}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else self.ledger_url
        if url.password is None:
            return self.ledger_url
        return url.render_as_string(hide_password=True)

    @property
    def gcp_project(self) -> str:
        """GCP project of the buckets (``{project}``) and GKE clusters: ``SAILOR_GCP_PROJECT`` when
        set, else the project of the Google credentials (``gcp_auth.current()``: the Airflow
        connection's when the glue installed it); "" when neither names one."""
        if self.gcp_project_override:
            return self.gcp_project_override
        from sailor_tasks import gcp_auth

        return gcp_auth.current().project or ""

    @property
    def gcp_project_source(self) -> str:
        """Where ``gcp_project`` comes from, for messages."""
        if self.gcp_project_override:
            return "SAILOR_GCP_PROJECT"
        from sailor_tasks import gcp_auth

        return gcp_auth.current().source

    def bucket_uri(self, bucket: str) -> str:
        """Root URI of a SAILOR bucket: a region name, or ``source`` for unplaced datasets.

        Raises:
            SettingsError: the bucket template names ``{project}`` and no project is known.
        """
        project = self.gcp_project if "{project}" in self.bucket_template else ""
        if "{project}" in self.bucket_template and not project:
            raise SettingsError(
                f"SAILOR_BUCKET_TEMPLATE={self.bucket_template!r} names {{project}} but no GCP project is "
                f"known: none from {self.gcp_project_source}, and SAILOR_GCP_PROJECT is unset; set the "
                "project of the Airflow connection (extra 'project') or SAILOR_GCP_PROJECT"
            )
        return self.bucket_template.format(
            bucket=bucket, region=bucket, project=project, state_dir=self.state_dir
        ).rstrip("/")

    @property
    def dataset_roots(self) -> tuple[str, ...]:
        """Folders ``file://`` datasets and traces may come from, besides SAILOR's own buckets."""
        return tuple(str(Path(p).expanduser().resolve()) for p in self.data_roots)

    @property
    def clusters_dir(self) -> str:
        """Folder of the local backend's cluster records."""
        return os.path.join(self.state_dir, "clusters")


TEAM_WEIGHT_RANGE = (1e-3, 1e3)
"""Team weights a queue or simulation accepts: the weights scale the policies' LP coefficients,
so a ratio past 1e6 between two teams would leave HiGHS numerically unsure (a weight of 1e-320
found no allocation)."""


def team_weight(value: str) -> float | None:
    """``value`` as a team weight within ``TEAM_WEIGHT_RANGE``; None when it is not one."""
    try:
        weight = float(value)
    except ValueError:
        return None
    low, high = TEAM_WEIGHT_RANGE
    return weight if low <= weight <= high else None


def parse_team_weights(text: str) -> tuple[tuple[str, float], ...]:
    """``"ml=2,search=1"`` → (("ml", 2.0), ("search", 1.0)), sorted by team.

    Raises:
        SettingsError: an item is not ``team=weight`` with a positive finite weight (names the item).
    """
    out: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        team, sep, value = item.partition("=")
        weight = team_weight(value)
        if not sep or not team.strip() or weight is None:
            raise SettingsError(
                f"SAILOR_TEAM_WEIGHTS item {item!r}: need team=weight with a weight from "
                f"{TEAM_WEIGHT_RANGE[0]:g} to {TEAM_WEIGHT_RANGE[1]:g}, e.g. ml=2,search=1"
            )
        out[team.strip()] = weight
    return tuple(sorted(out.items()))


def _positive(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not (0 < number < float("inf")):
        raise SettingsError(f"{name}={value!r}: need a number of seconds > 0")
    return number
