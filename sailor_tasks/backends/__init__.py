"""Backends: one interface (``base.ClusterBackend``), one module per implementation."""

from __future__ import annotations

from sailor_tasks.backends.base import ClusterBackend, TrainLaunch
from sailor_tasks.settings import BACKENDS, Settings


def get_backend(name: str, settings: Settings) -> ClusterBackend:
    """The backend called ``name``; the ValueError lists the valid names."""
    if name == "local":
        from sailor_tasks.backends.local import LocalBackend

        return LocalBackend(settings)
    if name == "gke":
        try:
            from sailor_tasks.backends.gke import GkeBackend
        except ModuleNotFoundError:
            raise ValueError("backend='gke' is not available in this installation; valid: local") from None
        return GkeBackend(settings)
    raise ValueError(f"backend={name!r} is not a backend; valid: {', '.join(BACKENDS)}")


__all__ = ["ClusterBackend", "TrainLaunch", "get_backend"]
