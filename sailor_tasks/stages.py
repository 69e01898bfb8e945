"""One function per DAG stage. Each takes and returns small JSON-able dicts (what XCom carries),
does its work through the library, records itself in the ledger, and is safe to retry.

``sailor_train``:    validate → plan → place_data → provision → train → finalize; teardown (always)
``sailor_rebalance``: collect_utilization → solve_assignment → publish_assignment → report

The DAG files call these and nothing else; Airflow is not imported here, so the same stages run
from the CLI, tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sailor_tasks import storage
from sailor_tasks.backends import TrainLaunch, get_backend
from sailor_tasks.catalog import Catalog, load_catalog
from sailor_tasks.data.copier import copy_dataset
from sailor_tasks.errors import InvalidRequestError, InvalidRequestErrors, TrainingFailedError
from sailor_tasks.ledger import Ledger
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.model import (
    ClusterState,
    JobRequest,
    Placement,
    Reservation,
    from_dict,
    run_key,
    to_dict,
)
from sailor_tasks.settings import Settings

logger = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass(frozen=True)
class StageContext:
    """Settings plus lazily opened ledger and catalog, shared by the stages of one process."""

    settings: Settings

    @classmethod
    def from_env(cls) -> StageContext:
        return cls(Settings.from_env())

    @functools.cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.settings.ledger_url)

    @functools.cached_property
    def catalog(self) -> Catalog:
        return load_catalog()

    def run_uri(self, region: str, run_id: str) -> str:
        """Concrete URI of the run's folder in its region bucket."""
        return storage.resolve(f"sailor://{region}/runs/{run_key(run_id)}", self.settings)


def _ctx(ctx: StageContext | None) -> StageContext:
    return ctx or StageContext.from_env()


@contextlib.contextmanager
def _timed(ctx: StageContext, run_id: str, stage: str, try_number: int = 1) -> Iterator[None]:
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


def replica_path(dataset_uri: str) -> str:
    """Path of a dataset's replica inside a region bucket: stable, collision-free, readable."""
    digest = hashlib.sha256(dataset_uri.encode()).hexdigest()[:12]
    name = dataset_uri.rstrip("/").rsplit("/", 1)[-1]
    return f"datasets/{name}-{digest}"


# --- sailor_train --------------------------------------------------------------------------------


def validate(params: Mapping[str, Any], run_id: str, ctx: StageContext | None = None) -> JSON:
    """Check the params against the schema, the catalog and the source data; record the run.

    Raises:
        InvalidRequestErrors: with every problem; the run is recorded as ``rejected`` and nothing
            is reserved, copied or provisioned.
    """
    ctx = _ctx(ctx)
    from sailor_tasks.placement.planner import price_cap_error
    from sailor_tasks.request import check_file_roots, from_params

    with _timed(ctx, run_id, "validate"):
        try:
            request = from_params(params, ctx.catalog)
            errors = []
            root_err = check_file_roots(request.dataset_uri, ctx.settings.dataset_roots)
            if root_err:
                raise InvalidRequestErrors([root_err])  # never look at a path outside the data folders
            cap = price_cap_error(request, ctx.catalog)
            if cap:
                errors.append(InvalidRequestError("max_usd_per_hour", request.max_usd_per_hour, cap))
            try:
                get_backend(request.backend, ctx.settings)
            except ValueError as exc:
                errors.append(InvalidRequestError("backend", request.backend, str(exc)))
            src = storage.resolve(request.dataset_uri, ctx.settings)
            if not storage.exists(src):
                errors.append(
                    InvalidRequestError("dataset_uri", request.dataset_uri, f"dataset not found at {src}")
                )
            if errors:
                raise InvalidRequestErrors(errors)
        except InvalidRequestError as exc:
            ctx.ledger.upsert_run(
                run_id,
                job_name=str(params.get("job_name", "?"))[:200],
                team=str(params.get("team", "?"))[:100],
                status="rejected",
                backend=str(params.get("backend", "?"))[:20],
                model=str(params.get("model", "?"))[:50],
                dataset_uri=str(params.get("dataset_uri", "?"))[:1024],
                request={},
                error=str(exc)[:4000],
            )
            raise
        ctx.ledger.upsert_run(
            run_id,
            job_name=request.job_name,
            team=request.team,
            status="validated",
            backend=request.backend,
            model=request.model,
            dataset_uri=request.dataset_uri,
            request=to_dict(request),
            total_steps=request.total_steps,
            error=None,
        )
    logger.info("validated run %s: %s", run_id, request.summary())
    return to_dict(request)


def plan(request: JSON, run_id: str, ctx: StageContext | None = None) -> JSON:
    """Place the run and reserve its capacity (keyed by run_id, so a retry replaces, never doubles)."""
    ctx = _ctx(ctx)
    from sailor_tasks.placement import plan as place

    req = from_dict(JobRequest, request)
    with _timed(ctx, run_id, "plan"):
        state = ClusterState(
            reservations=tuple(r for r in ctx.ledger.live_reservations() if r.run_id != run_id),
            assignment=ctx.ledger.latest_assignment(),
            replicas=ctx.ledger.replicas([req.dataset_uri]),
        )
        placement = place(req, ctx.catalog, state, run_id)
        ctx.ledger.reserve(
            Reservation(
                run_id,
                placement.region,
                placement.zone,
                placement.gpu_type,
                placement.num_gpus,
                placement.market,
            )
        )
        ctx.ledger.record_placement(placement)
        ctx.ledger.upsert_run(
            run_id,
            status="planned",
            region=placement.region,
            zone=placement.zone,
            gpu_type=placement.gpu_type,
            market=placement.market,
            num_gpus=placement.num_gpus,
            usd_per_hour=placement.usd_per_hour,
        )
    for line in placement.explanation:
        logger.info("plan: %s", line)
    return to_dict(placement)


def place_data(request: JSON, placement: JSON, run_id: str, ctx: StageContext | None = None) -> JSON:
    """Copy the dataset into the placement's region bucket (skipped when a verified replica exists)."""
    ctx = _ctx(ctx)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    with _timed(ctx, run_id, "place_data"):
        src = storage.resolve(req.dataset_uri, ctx.settings)
        dst = storage.resolve(f"sailor://{pl.region}/{replica_path(req.dataset_uri)}", ctx.settings)
        logger.info("placing %s into %s", src, dst)
        result = copy_dataset(src, dst)
        ctx.ledger.record_replica(
            req.dataset_uri, pl.region, dst, result.manifest.total_bytes, len(result.manifest.files)
        )
    logger.info(
        "data placed: %d files, %.1f MB (%.1f MB copied, %.1f MB already there) in %.2f s",
        len(result.manifest.files),
        result.manifest.total_bytes / 1e6,
        result.bytes_copied / 1e6,
        result.bytes_skipped / 1e6,
        result.seconds,
    )
    return {
        "data_uri": dst,
        "bytes": result.manifest.total_bytes,
        "files": len(result.manifest.files),
        "bytes_copied": result.bytes_copied,
        "seconds": round(result.seconds, 3),
    }


def provision(request: JSON, placement: JSON, run_id: str, ctx: StageContext | None = None) -> JSON:
    """Create (or reuse) the capacity of the placement on the request's backend."""
    ctx = _ctx(ctx)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    with _timed(ctx, run_id, "provision"):
        record = get_backend(req.backend, ctx.settings).provision(run_key(run_id), pl)
        ctx.ledger.upsert_run(run_id, status="provisioned")
    return {"backend": req.backend, "run_key": run_key(run_id), "status": record.get("status", "ready")}


def train(request: JSON, placement: JSON, data: JSON, run_id: str, ctx: StageContext | None = None) -> JSON:
    """Run training to completion on the provisioned capacity; resume from the newest checkpoint.

    Raises:
        TrainingFailedError: the process group exited with an error.
    """
    ctx = _ctx(ctx)
    from sailor_tasks.train.config import TrainConfig

    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    run_uri = ctx.run_uri(pl.region, run_id)
    config = TrainConfig(
        run_id=run_id,
        model=req.model,
        data_uri=data["data_uri"],
        output_uri=run_uri,
        total_steps=req.total_steps,
        checkpoint_every_steps=req.checkpoint_every_steps,
        seed=req.seed,
        batch_size=req.batch_size,
        learning_rate=req.learning_rate,
    )
    config_uri = storage.join(run_uri, "train_config.json")
    storage.write_bytes(config_uri, config.to_json().encode())
    backend = get_backend(req.backend, ctx.settings)
    with _timed(ctx, run_id, "train"):
        ctx.ledger.upsert_run(run_id, status="running")
        started = utcnow()
        rc = backend.train(TrainLaunch(run_id, run_key(run_id), config_uri, req.num_workers, pl))
        ended = utcnow()
        ctx.ledger.record_utilization(run_id, req.team, pl.region, pl.gpu_type, pl.num_gpus, started, ended)
        if rc != 0 or not storage.exists(config.result_uri):
            raise TrainingFailedError(run_id, rc)
        result = storage.read_json(config.result_uri)
        if result["checkpoint_uri"]:
            ctx.ledger.record_checkpoint(run_id, result["step"], result["checkpoint_uri"])
        ctx.ledger.upsert_run(
            run_id,
            steps=result["step"],
            initial_loss=result["initial_loss"],
            final_loss=result["final_loss"],
            checkpoint_uri=result["checkpoint_uri"],
        )
    return {**result, "train_wall_s": (ended - started).total_seconds()}


def finalize(
    request: JSON, placement: JSON, data: JSON, result: JSON, run_id: str, ctx: StageContext | None = None
) -> JSON:
    """Mark the run successful, estimate its cost, and write a markdown summary next to its checkpoints."""
    ctx = _ctx(ctx)
    req, pl = from_dict(JobRequest, request), from_dict(Placement, placement)
    with _timed(ctx, run_id, "finalize"):
        hours = result["train_wall_s"] / 3600.0
        usd = round(pl.usd_per_hour * hours, 6)
        summary = {
            "run_id": run_id,
            "job_name": req.job_name,
            "team": req.team,
            "status": "success",
            "region": pl.region,
            "zone": pl.zone,
            "gpu_type": pl.gpu_type,
            "num_gpus": pl.num_gpus,
            "market": pl.market,
            "usd_per_hour": pl.usd_per_hour,
            "usd_estimate": usd,
            "why": list(pl.explanation),
            "data_uri": data["data_uri"],
            "data_bytes": data["bytes"],
            "steps": result["step"],
            "initial_loss": result["initial_loss"],
            "final_loss": result["final_loss"],
            "checkpoint_uri": result["checkpoint_uri"],
            "train_wall_s": round(result["train_wall_s"], 2),
            "samples_per_s": round(result["samples_per_s"], 1),
        }
        summary_uri = storage.join(ctx.run_uri(pl.region, run_id), "summary.md")
        storage.write_bytes(summary_uri, render_summary(summary).encode())
        ctx.ledger.upsert_run(run_id, status="success", usd_estimate=usd)
    markdown = render_summary(summary)
    logger.info("run summary (%s):\n%s", summary_uri, markdown)
    return {**summary, "summary_uri": summary_uri, "summary_md": markdown}


def teardown(run_id: str, ctx: StageContext | None = None) -> JSON:
    """Release the reservation and the capacity (always runs; idempotent). A run that did not
    reach ``success`` is marked ``failed`` here."""
    ctx = _ctx(ctx)
    run = ctx.ledger.get_run(run_id)
    backend_name = run["backend"] if run and run["backend"] in ("local", "gke") else "local"
    with _timed(ctx, run_id, "teardown"):
        released = ctx.ledger.release(run_id)
        removed = get_backend(backend_name, ctx.settings).teardown(run_key(run_id))
        if run and run["status"] not in ("success", "rejected", "failed"):
            ctx.ledger.upsert_run(run_id, status="failed")
    return {"reservation_released": released, "cluster_removed": removed}


def render_summary(s: Mapping[str, Any]) -> str:
    drop = (1 - s["final_loss"] / s["initial_loss"]) * 100 if s.get("final_loss") else 0.0
    lines = [
        f"# SAILOR run `{s['run_id']}`",
        "",
        f"- **Job**: {s['job_name']} (team {s['team']}), status **{s['status']}**",
        f"- **Placed in** {s['region']} / {s['zone']}: {s['num_gpus']}x {s['gpu_type']} on {s['market']} "
        f"at ${s['usd_per_hour']:.2f}/h",
        f"- **Why**: {s['why'][0] if s['why'] else '-'}",
        f"- **Data**: {s['data_bytes'] / 1e6:.1f} MB at {s['data_uri']}",
        f"- **Training**: {s['steps']} steps in {s['train_wall_s']:.1f} s ({s['samples_per_s']:.0f} samples/s); "
        f"eval loss {s['initial_loss']:.3f} → {s['final_loss']:.3f} ({drop:.0f}% lower)",
        f"- **Checkpoint**: {s['checkpoint_uri']}",
        f"- **Estimated cost**: ${s['usd_estimate']:.4f} (price × training wall time)",
    ]
    return "\n".join(lines) + "\n"


# --- sailor_rebalance ----------------------------------------------------------------------------


def collect_utilization(
    window_days: float, as_of: str | None = None, ctx: StageContext | None = None
) -> JSON:
    """GPU-hours per (team, region) ended in the window, and supply per region from the catalog."""
    ctx = _ctx(ctx)
    end = dt.datetime.fromisoformat(as_of) if as_of else utcnow()
    since = end - dt.timedelta(days=window_days)
    rows = ctx.ledger.utilization_by_team_region(since)
    supply: dict[str, float] = {}
    for offer in ctx.catalog.offers:
        supply.setdefault(offer.region, 0.0)
    for region in supply:
        supply[region] = float(len({o.zone for o in ctx.catalog.offers if o.region == region}))
    demand = [[team, region, gpu, round(hours, 6)] for (team, region, gpu), hours in sorted(rows.items())]
    logger.info(
        "collected %d utilization rows over %.1f days (%.3f GPU-hours)",
        len(demand),
        window_days,
        sum(r[3] for r in demand),
    )
    return {"window_days": window_days, "since": since.isoformat(), "demand": demand, "supply": supply}


def solve_assignment(utilization: JSON) -> JSON:
    """Compute team → region shares from the collected utilization."""
    from sailor_tasks.rebalance.proportional import region_load, solve

    demand: dict[tuple[str, str], float] = {}
    for team, region, _gpu, hours in utilization["demand"]:
        demand[(team, region)] = demand.get((team, region), 0.0) + hours
    shares = solve(demand, utilization["supply"])
    load = region_load(demand, utilization["supply"])
    return {"shares": shares, "load_before": load, "teams": len(shares)}


def publish_assignment(solution: JSON, source: str, ctx: StageContext | None = None) -> JSON:
    """Write the shares as a new assignment version that ``plan`` reads from now on."""
    ctx = _ctx(ctx)
    assignment = ctx.ledger.publish_assignment(solution["shares"], source=source)
    logger.info("published assignment v%d for %d teams", assignment.version, len(assignment.shares))
    return {"version": assignment.version, "teams": len(assignment.shares)}


def report_rebalance(utilization: JSON, solution: JSON, published: JSON) -> JSON:
    """A markdown summary of the rebalance, shown in the task log and returned."""
    busiest = sorted(solution["load_before"].items(), key=lambda kv: -kv[1])[:5]
    lines = [
        f"# SAILOR rebalance → assignment v{published['version']}",
        "",
        f"- window: {utilization['window_days']} days since {utilization['since']}",
        f"- teams: {solution['teams']}, utilization rows: {len(utilization['demand'])}",
        "- busiest regions before (demand share / supply share): "
        + (", ".join(f"{r} {v:.2f}" for r, v in busiest if v > 0) or "no recorded demand"),
    ]
    for team, shares in sorted(solution["shares"].items()):
        top = sorted(shares.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"- {team}: " + ", ".join(f"{r} {s:.0%}" for r, s in top))
    text = "\n".join(lines) + "\n"
    logger.info("%s", text)
    return {"markdown": text, "version": published["version"]}
