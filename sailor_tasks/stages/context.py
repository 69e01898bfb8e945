"""What every stage shares: settings, the ledger and the catalog (opened lazily), and stage timing."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sailor_tasks import paths
from sailor_tasks.catalog import Catalog, load_catalog
from sailor_tasks.ledger import Ledger
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.settings import Settings

JSON = dict[str, Any]


@dataclass(frozen=True)
class StageContext:
    """Settings plus lazily opened ledger and catalog, shared by the stages of one process."""

    settings: Settings

    @classmethod
    def from_env(cls) -> StageContext:
        return cls(Settings.from_env())

    @classmethod
    def for_reading(cls, settings: Settings) -> StageContext | None:
        """A context whose ledger is only read (``Ledger.for_reading``: not created, not
        upgraded); None when there is no ledger yet."""
        ledger = Ledger.for_reading(settings.ledger_url)
        if ledger is None:
            return None
        ctx = cls(settings)
        ctx.__dict__["ledger"] = ledger  # what the cached property would hold
        return ctx

    @functools.cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.settings.ledger_url)

    @functools.cached_property
    def catalog(self) -> Catalog:
        return load_catalog()

    def planning_catalog(self) -> Catalog:
        """The catalog with spot preemption rates learned from the ledger's attempts
        (``catalog.learned``): what ``plan`` and the queue's estimates use."""
        from sailor_tasks.catalog.learned import with_learned_rates

        return with_learned_rates(self.catalog, self.ledger.spot_observations())

    def planning_table(self) -> Any:
        """The packaged throughput table with the speeds past runs measured (``ledger``): what
        ``plan``, the queue's estimates and its policies use."""
        from sailor_tasks.catalog.throughput import packaged_with_measured

        return packaged_with_measured(tuple(self.ledger.measured_throughputs()))

    def run_uri(self, region: str, run_id: str) -> str:
        """Concrete URI of the run's folder in its region bucket."""
        return paths.run_uri(region, run_id, self.settings)


def resolve_ctx(ctx: StageContext | None) -> StageContext:
    return ctx or StageContext.from_env()


@contextlib.contextmanager
def timed(ctx: StageContext, run_id: str, stage: str, try_number: int = 1) -> Iterator[None]:
    started = utcnow()
    try:
        yield
    except BaseException as exc:
        ctx.ledger.record_stage(
            run_id,
            stage,
            started,
            utcnow(),
            ok=False,
            try_number=try_number,
            detail=f"{type(exc).__name__}: {exc}"[:2000],
        )
        raise
    ctx.ledger.record_stage(run_id, stage, started, utcnow(), ok=True, try_number=try_number)
