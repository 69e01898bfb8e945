"""Google Cloud credentials for the core, without knowing where they come from.

The orchestrator's glue installs a provider (``sailor_tasks.airflow_glue.gcp`` reads an Airflow connection,
``google_cloud_default`` unless ``SAILOR_GCP_CONN_ID`` names another); storage (gcsfs) and the GKE
backend ask ``current()``. Without a provider, the Google libraries' own default applies
(application default credentials: workload identity on GKE, ``gcloud auth`` on a laptop).
Credentials are never logged: ``GcpCredentials.__repr__`` hides them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GcpCredentials:
    credentials: Any = None
    """A ``google.auth.credentials.Credentials`` object, or None for the library default."""
    project: str | None = None
    """Project of the connection (billing project of GCS requests, GKE project)."""
    source: str = "application default credentials"
    """Where they came from, for logs (e.g. "Airflow connection 'google_cloud_default'")."""

    def __repr__(self) -> str:
        return f"GcpCredentials(project={self.project!r}, source={self.source!r}, credentials=<hidden>)"


Provider = Callable[[], GcpCredentials]

_lock = threading.Lock()
_provider: Provider | None = None
_cached: GcpCredentials | None = None


def set_provider(provider: Provider | None) -> None:
    """Install (None: remove) the provider; the next ``current()`` calls it once and caches the result."""
    global _provider, _cached
    with _lock:
        _provider, _cached = provider, None


def has_provider() -> bool:
    return _provider is not None


def current() -> GcpCredentials:
    """The credentials to use now (resolved once per provider; google-auth refreshes tokens itself)."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = _provider() if _provider is not None else GcpCredentials()
        return _cached
