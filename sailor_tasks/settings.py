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
| SAILOR_GCP_PROJECT       | ``sailor-demo``                           | ``{project}`` in the bucket template |
| SAILOR_DATA_ROOTS        | (none)                                    | extra folders file:// datasets may   |
|                          |                                           | come from (``os.pathsep``-separated) |
| SAILOR_COMMAND_ROOTS     | the project's ``examples/``               | folders a local ``command`` may run  |
|                          |                                           | from (``os.pathsep``-separated)      |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

BACKENDS = ("local", "gke")
SOURCE_BUCKET = "source"
"""Name of the bucket that holds datasets before SAILOR places them (``sailor://source/...``)."""
DEFAULT_COMMAND_ROOT = str(Path(__file__).resolve().parent.parent / "examples")
"""The project's ``examples/`` folder: where a local backend ``command`` may come from by default."""


@dataclass(frozen=True, slots=True)
class Settings:
    state_dir: str
    """Absolute path of the local state folder."""
    ledger_url: str
    """SQLAlchemy URL of the ledger."""
    bucket_template: str
    """Template of a bucket's root URI; ``{bucket}``, ``{region}``, ``{project}`` and ``{state_dir}`` are filled."""
    backend: str = "local"
    """Default backend."""
    gcp_project: str = "sailor-demo"
    """GCP project used in bucket names on the gke backend."""
    data_roots: tuple[str, ...] = ()
    """Folders besides the state folder that ``file://`` datasets may be read from."""
    command_roots: tuple[str, ...] = (DEFAULT_COMMAND_ROOT,)
    """Folders whose scripts and executables a run's ``command`` may start on the local backend
    (whoever may trigger a run must not get arbitrary code execution on the worker)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        state_dir = str(Path(env.get("SAILOR_STATE_DIR") or ".sailor").expanduser().resolve())
        backend = env.get("SAILOR_BACKEND", "local")
        if backend not in BACKENDS:
            raise ValueError(f"SAILOR_BACKEND={backend!r} is not a backend; valid: {', '.join(BACKENDS)}")
        return cls(
            state_dir=state_dir,
            ledger_url=env.get("SAILOR_LEDGER_URL") or f"sqlite:///{state_dir}/ledger.db",
            bucket_template=env.get("SAILOR_BUCKET_TEMPLATE") or "file://{state_dir}/buckets/{bucket}",
            backend=backend,
            gcp_project=env.get("SAILOR_GCP_PROJECT", "sailor-demo"),
            data_roots=tuple(p for p in env.get("SAILOR_DATA_ROOTS", "").split(os.pathsep) if p),
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

    def bucket_uri(self, bucket: str) -> str:
        """Root URI of a SAILOR bucket: a region name, or ``source`` for unplaced datasets."""
        return self.bucket_template.format(
            bucket=bucket, region=bucket, project=self.gcp_project, state_dir=self.state_dir
        ).rstrip("/")

    @property
    def dataset_roots(self) -> tuple[str, ...]:
        """Folders ``file://`` datasets may come from: the state folder and ``data_roots``."""
        return (self.state_dir, *self.data_roots)

    @property
    def clusters_dir(self) -> str:
        """Folder of the local backend's cluster records."""
        return os.path.join(self.state_dir, "clusters")
