"""One function per DAG stage. Each takes and returns small JSON-able dicts (what XCom carries),
does its work through the library, records itself in the ledger, and is safe to retry.

``sailor_train``:    validate → plan → place_data → provision → train → finalize; teardown (always)
``sailor_rebalance``: collect_utilization → solve_assignment → publish_assignment → replicate_data[] → report;
                      collect_utilization → allocate_gpu_types

The DAG files call these and nothing else; Airflow is not imported here, so the same stages run
from the CLI, tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sailor_tasks import storage
from sailor_tasks.backends import get_backend
from sailor_tasks.catalog import Catalog, load_catalog
from sailor_tasks.data.copier import copy_dataset
from sailor_tasks.errors import InvalidRequestError, InvalidRequestErrors
from sailor_tasks.ledger import Ledger
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.model import (
    JobRequest,
    Placement,
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
            if request.preemption_trace_uri:
                from sailor_tasks.traces.availability import load_availability_trace

                try:
                    load_availability_trace(request.preemption_trace_uri)
                except (OSError, ValueError) as exc:
                    errors.append(
                        InvalidRequestError("preemption_trace_uri", request.preemption_trace_uri, str(exc))
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


def plan(
    request: JSON,
    run_id: str,
    ctx: StageContext | None = None,
    *,
    blocked_zones: frozenset[str] = frozenset(),
    attempt: int = 1,
    elapsed_h: float = 0.0,
    steps_done: int = 0,
) -> JSON:
    """Place the run and reserve its capacity (keyed by run_id, so a retry replaces, never doubles).

    The run's market strategy first picks the market (``sailor_tasks.market_choice``); the decision,
    its reason and the slack left go to the ledger (``attempt_markets``) and to the placement's
    explanation. ``blocked_zones``, ``attempt``, ``elapsed_h`` and ``steps_done`` are set by
    preemption recovery (``sailor_tasks.recovery``), which re-plans through this same function. The engine plans on a fresh ledger snapshot (live
    reservations, assignment, the dataset's replicas and size); the reservation is checked in one
    transaction, and a conflict with another planner re-plans (bounded) before
    ``CapacityUnavailableError`` (retryable).
    """
    ctx = _ctx(ctx)
    from sailor_tasks.catalog.throughput import packaged_with_measured
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.market_choice import decide_market
    from sailor_tasks.placement.index import index_for
    from sailor_tasks.placement.reservations import ledger_state, plan_and_reserve

    req = from_dict(JobRequest, request)
    with _timed(ctx, run_id, "plan"):
        manifest = read_manifest(storage.resolve(req.dataset_uri, ctx.settings))
        nbytes = manifest.total_bytes if manifest is not None else None
        # The throughput matrix of the GPU-type policies (allocate_gpu_types), measured speeds included.
        table = packaged_with_measured(tuple(ctx.ledger.measured_throughputs()))
        index = index_for(ctx.catalog, table)
        blocked = frozenset(blocked_zones)
        decision = decide_market(
            req,
            ctx.catalog,
            ledger_state(ctx.ledger, req, run_id, nbytes, blocked),
            elapsed_h=elapsed_h,
            steps_done=steps_done,
            index=index,
        )
        req = dataclasses.replace(req, market=decision.market)
        reserved = plan_and_reserve(
            req,
            ctx.catalog,
            ctx.ledger,
            run_id,
            snapshot=lambda: ledger_state(ctx.ledger, req, run_id, nbytes, blocked),
            index=index,
        )
        placement = dataclasses.replace(
            reserved.placement, explanation=(*reserved.placement.explanation, f"market: {decision.reason}")
        )
        ctx.ledger.record_placement(placement, attempt=attempt)
        ctx.ledger.record_attempt_market(
            run_id,
            attempt,
            req.strategy,
            placement.market,
            decision.reason,
            decision.slack_h,
            placement.usd_per_hour,
        )
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


def train(
    request: JSON,
    placement: JSON,
    data: JSON,
    run_id: str,
    ctx: StageContext | None = None,
    *,
    try_number: int = 1,
    max_tries: int = 0,
) -> JSON:
    """Run training on the provisioned capacity, resuming from the newest checkpoint; one attempt
    per call. After a preempted attempt, the next call recovers first (``sailor_tasks.recovery``).

    Raises:
        PreemptedError: this attempt was preempted; retry the stage to recover.
        RecoveryExhaustedError: preempted on the last try (``try_number > max_tries``).
        TrainingFailedError: the process group exited with an error.
    """
    ctx = _ctx(ctx)
    from sailor_tasks.recovery import train_attempt

    with _timed(ctx, run_id, "train", try_number):
        return train_attempt(ctx, request, placement, data, run_id, try_number, max_tries)


def launch_train(
    request: JSON,
    placement: JSON,
    data: JSON,
    run_id: str,
    ctx: StageContext | None = None,
    *,
    try_number: int = 1,
) -> Any:
    """Deferrable ``train``, first half: begin the run's next attempt (recovering first after a
    preemption, through the same code as ``train``) or take over the attempt a dead try left
    running. Returns the ``recovery.Attempt``; its ``launch`` is what the backend starts.
    """
    ctx = _ctx(ctx)
    from sailor_tasks.recovery import begin_attempt

    with _timed(ctx, run_id, "train_launch", try_number):
        return begin_attempt(ctx, request, placement, data, run_id, try_number, reattach=True)


def finish_train(
    request: JSON,
    run_id: str,
    attempt: int,
    exit_status: int,
    ctx: StageContext | None = None,
    *,
    try_number: int = 1,
    max_tries: int = 0,
) -> JSON:
    """Deferrable ``train``, second half: end launched ``attempt`` from its exit status (0 done,
    75 preempted after saving) and what the trainer wrote, as ``train`` does.

    A deferrable task recovers inside one try, so the run's attempts are bounded by number: a
    preemption of attempt ``max_tries + 1`` (or on the last try) is final, the same budget as
    ``train``'s one attempt per try.

    Raises:
        PreemptedError: preempted with attempts left; launch the next one (``launch_train``).
        RecoveryExhaustedError: preempted on the last allowed attempt (lists every attempt).
        TrainingFailedError: the process group failed for another reason.
    """
    ctx = _ctx(ctx)
    from sailor_tasks.recovery import finish_attempt, resume_attempt

    with _timed(ctx, run_id, "train", try_number):
        att = resume_attempt(ctx, request, run_id, attempt)
        final = try_number > max_tries or attempt > max_tries
        return finish_attempt(ctx, att, exit_status, try_number, max_tries, final=final)


def finalize(
    request: JSON, placement: JSON, data: JSON, result: JSON, run_id: str, ctx: StageContext | None = None
) -> JSON:
    """Mark the run successful, estimate its cost, and write a markdown summary next to its checkpoints."""
    ctx = _ctx(ctx)
    # After a preemption recovery the run may have moved: the train result carries where it ended.
    placement, data = result.get("placement", placement), result.get("data", data)
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
            "attempts": result.get("attempts", []),
            "strategy": req.strategy,
            "deadline_hours": req.deadline_hours,
            "markets": result.get("markets", []),
            "usd_attempts": sum(m["usd"] or 0.0 for m in result.get("markets", [])),
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
    if s.get("markets"):
        lines.append(
            f"- **Market per attempt** (strategy {s.get('strategy', '?')}, all attempts ${s['usd_attempts']:.4f}):"
        )
        for m in s["markets"]:
            slack = "no deadline" if m["slack_h"] is None else f"{m['slack_h']:.3g} h slack"
            cost = "?" if m["usd"] is None else f"${m['usd']:.4f}"
            lines.append(f"  - attempt {m['attempt']}: {m['market']}, {cost}, {slack}: {m['why']}")
    if len(s.get("attempts") or ()) > 1:
        lines.append(f"- **Recovered from preemption**: {len(s['attempts'])} attempts")
        lines += [f"  - {a}" for a in s["attempts"]]
    return "\n".join(lines) + "\n"


# --- sailor_rebalance ----------------------------------------------------------------------------


REPORTS_ROOT = "sailor://source/reports/rebalance"
"""Where each rebalance run stores its chart, summary and solution (``<root>/<run_key>/``)."""
DEFAULT_BUDGET_GB = 500.0


def collect_utilization(
    window_days: float,
    as_of: str | None = None,
    budget_gb: float = DEFAULT_BUDGET_GB,
    quotas: Mapping[str, Any] | None = None,
    ctx: StageContext | None = None,
) -> JSON:
    """The rebalance problem from the ledger (demand per team, region and GPU type over the window;
    datasets each team reads, their sizes and replicas) and the catalog's supply."""
    ctx = _ctx(ctx)
    from sailor_tasks.catalog.supply import region_supply
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.rebalance.collect import build_problem

    until = dt.datetime.fromisoformat(as_of) if as_of else utcnow()
    since = until - dt.timedelta(days=window_days)

    def size_of(uri: str) -> int | None:
        manifest = read_manifest(storage.resolve(uri, ctx.settings))
        return manifest.total_bytes if manifest else None

    problem, stats = build_problem(
        ctx.ledger.utilization_rows(since, until),
        ctx.ledger.replica_rows(),
        region_supply(ctx.catalog.offers),
        since,
        until,
        budget_bytes=int(budget_gb * 1e9),
        size_of=size_of,
        quotas=quotas,
    )
    logger.info(
        "collected %.3f GPU-hours of %d teams over %.1f days; %d datasets; supply in %d regions",
        stats["gpu_hours"],
        len(problem.teams),
        window_days,
        len(problem.datasets),
        len(problem.supply),
    )
    return {
        "window_days": window_days,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "problem": problem.to_json(),
        **stats,
    }


def solve_assignment(utilization: JSON, time_limit_s: float = 50.0, comfort_ratio: float = 0.9) -> JSON:
    """Team shares per region and GPU type, and new replicas (HiGHS; see rebalance.solver).

    Raises:
        RebalanceInfeasibleError: naming the binding constraint (quotas, budget, storage caps).
    """
    from sailor_tasks.rebalance.problem import Problem
    from sailor_tasks.rebalance.solver import solve

    solution = solve(
        Problem.from_json(utilization["problem"]), time_limit_s=time_limit_s, comfort_ratio=comfort_ratio
    )
    logger.info("rebalance solution: %s", solution.summary())
    return solution.to_json()


def publish_assignment(solution: JSON, source: str, ctx: StageContext | None = None) -> JSON:
    """Write the shares (and projected region load) as a new assignment version ``plan`` reads."""
    ctx = _ctx(ctx)
    assignment = ctx.ledger.publish_assignment(
        solution["shares"], source=source, region_load=solution["region_load_after"]
    )
    logger.info("published assignment v%d for %d teams", assignment.version, len(assignment.shares))
    return {"version": assignment.version, "teams": len(assignment.shares), "copies": solution["replicate"]}


def replicate_dataset(copy: JSON, ctx: StageContext | None = None) -> JSON:
    """One planned replica: the same checksummed, resumable copier as ``place_data``."""
    ctx = _ctx(ctx)
    uri, region = copy["dataset_uri"], copy["region"]
    src = storage.resolve(uri, ctx.settings)
    dst = storage.resolve(f"sailor://{region}/{replica_path(uri)}", ctx.settings)
    logger.info("replicating %s into %s", src, dst)
    result = copy_dataset(src, dst)
    ctx.ledger.record_replica(uri, region, dst, result.manifest.total_bytes, len(result.manifest.files))
    return {
        "dataset_uri": uri,
        "region": region,
        "uri": dst,
        "bytes": result.manifest.total_bytes,
        "bytes_copied": result.bytes_copied,
        "seconds": round(result.seconds, 3),
    }


def report_rebalance(
    utilization: JSON,
    solution: JSON,
    replicated: list[JSON],
    run_id: str,
    dry_run: bool = False,
    ctx: StageContext | None = None,
) -> JSON:
    """Chart + markdown summary stored with the run, recorded in the ledger (``rebalance_nights``:
    realised and projected ratios, allocation rate, bytes, report URIs), shown in the log."""
    ctx = _ctx(ctx)
    from sailor_tasks.rebalance.report import render_chart, render_markdown, top_moves

    published = ctx.ledger.latest_assignment()
    version = None
    if not dry_run and published is not None and published.source == f"sailor_rebalance/{run_id}":
        version = published.version
    copies = [c for c in replicated if c]
    root = storage.resolve(f"{REPORTS_ROOT}/{run_key(run_id)}", ctx.settings)
    chart_uri, summary_uri = storage.join(root, "ratio.png"), storage.join(root, "summary.md")
    title = f"SAILOR rebalance {run_id}" + (" (dry run)" if dry_run else "")
    storage.write_bytes(chart_uri, render_chart(solution, title))
    markdown = render_markdown(
        title,
        solution,
        top_moves(utilization["problem"], solution["placement"]),
        window=f"{utilization['window_days']} days ({utilization['since']} → {utilization['until']})",
        bytes_replicated=None if dry_run else sum(c["bytes_copied"] for c in copies),
        copies_done=None if dry_run else len(copies),
        version=version,
        chart_uri=chart_uri,
    )
    storage.write_bytes(summary_uri, markdown.encode())
    storage.write_json(storage.join(root, "solution.json"), solution)
    ctx.ledger.record_rebalance(
        run_id,
        dry_run=dry_run,
        assignment_version=version,
        window_days=float(utilization["window_days"]),
        solver_status=solution["status"],
        max_ratio_before=solution["max_ratio_before"],
        max_ratio_after=solution["max_ratio_after"],
        lower_bound=solution["region_lower_bound"],
        allocation_rate_before=solution["allocation_rate_before"],
        allocation_rate_after=solution["allocation_rate_after"],
        region_ratio_before=solution["region_load_before"],
        region_ratio_after=solution["region_load_after"],
        bytes_planned=solution["bytes_moved"],
        bytes_replicated=sum(c["bytes_copied"] for c in copies),
        report_uri=chart_uri,
        summary_uri=summary_uri,
    )
    logger.info("rebalance report (%s):\n%s", summary_uri, markdown)
    return {"report_uri": chart_uri, "summary_uri": summary_uri, "markdown": markdown, "dry_run": dry_run}


def allocate_gpu_types(
    utilization: JSON, source: str, policy: str = "las", ctx: StageContext | None = None
) -> JSON:
    """Per region, run a heterogeneity-aware policy (Gavel-style LP over the throughput matrix)
    over the runs that hold or wait for capacity there, and publish each run's GPU-type time shares.

    The throughput matrix is the one placement uses, with measured speeds from the ledger blended
    in (feedback). ``utilization`` only orders this after ``collect_utilization``.
    """
    ctx = _ctx(ctx)
    from sailor_tasks.catalog.throughput import packaged_with_measured
    from sailor_tasks.policies import get_policy
    from sailor_tasks.policies.regions import ACTIVE_RUN_STATUSES, allocate_region

    get_policy(policy)  # an unknown name fails before anything is read or written
    table = packaged_with_measured(tuple(ctx.ledger.measured_throughputs()))
    by_region: dict[str, list[dict]] = {}
    for run in ctx.ledger.runs_with_status(ACTIVE_RUN_STATUSES):
        if run["region"]:
            by_region.setdefault(run["region"], []).append(run)
    regions: JSON = {}
    for region, runs in sorted(by_region.items()):
        alloc = allocate_region(runs, ctx.catalog, table, region, policy)
        shares, speed = alloc.shares(), alloc.effective_throughput()
        rows = [
            (run_id, {g: round(f, 6) for g, f in s.items() if f > 1e-9}, speed[run_id])
            for run_id, s in shares.items()
        ]
        version = ctx.ledger.publish_gpu_allocation(region, policy, source, rows)
        regions[region] = {"version": version, "runs": len(rows), "shares": {r: s for r, s, _ in rows}}
    logger.info(
        "allocated GPU types with %s for %d runs in %d regions (window since %s)",
        policy,
        sum(r["runs"] for r in regions.values()),
        len(regions),
        utilization.get("since"),
    )
    return {"policy": policy, "regions": regions}
