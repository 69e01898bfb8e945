"""The ``sailor_rebalance`` stages (MAST's slow path), in pipeline order: collect_utilization →
solve_assignment → publish_assignment → replicate_dataset[] → report_rebalance."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from sailor_tasks import paths, storage
from sailor_tasks.data.copier import copy_dataset, list_files
from sailor_tasks.errors import (
    DataIntegrityError,
    InvalidRequestError,
    ReplicationFailedError,
    ReplicationIncompleteError,
    StageSkipped,
)
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.request import canonical_dataset_uri
from sailor_tasks.stages.context import JSON, StageContext, resolve_ctx

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_GB = 500.0
COPY_BATCHES = 256
"""At most this many batches of a night's copies (one mapped ``replicate_data`` task each): well
under Airflow's ``core.max_map_length`` (1,024 by default), however many copies are planned."""


def in_flight_rows(ctx: StageContext, until: dt.datetime) -> list[dict[str, Any]]:
    """Utilization-shaped rows for attempts still running: from their start until ``until``."""
    rows = []
    for a in ctx.ledger.running_attempts():
        pl = a["placement"] or {}
        if a["started_at"] >= until or not pl.get("gpu_type"):
            continue
        rows.append(
            {
                "run_id": a["run_id"],
                "team": a["team"],
                "region": a["region"],
                "gpu_type": pl["gpu_type"],
                "gpus": int(pl.get("num_gpus") or 0),
                "started_at": a["started_at"],
                "ended_at": until,
                "dataset_uri": a["dataset_uri"],
            }
        )
    return rows


def queued_rows(ctx: StageContext, until: dt.datetime) -> list[dict[str, Any]]:
    """Utilization-shaped rows for runs waiting in the queue (unmet demand), from their arrival
    until ``until``, each in the allowed region (its ``regions``, ``exclude_regions`` and
    ``data_residency``) with the most capacity of a GPU type it may use (where it would most likely
    run), so a region that turns runs away shows as overloaded."""
    from sailor_tasks.catalog.supply import region_supply

    supply = region_supply(ctx.catalog.offers)
    continent = ctx.catalog.transfer.continent
    rows = []
    for e in ctx.ledger.queue_entries(("queued",)):
        req = e["request"] or {}
        allowed = set(req.get("regions") or ()) or {r for r, _ in supply}
        allowed -= set(req.get("exclude_regions") or ())
        if residency := set(req.get("data_residency") or ()):
            allowed = {r for r in allowed if continent(r) in residency}
        options = [
            (n, region, gpu)
            for (region, gpu), n in supply.items()
            if region in allowed and n > 0 and e["gpu_type"] in ("any", gpu)
        ]
        if not options or e["enqueued_at"] >= until:
            continue
        _, region, gpu = max(options)
        rows.append(
            {
                "run_id": e["run_id"],
                "team": e["team"],
                "region": region,
                "gpu_type": gpu,
                "gpus": int(e["gpus"]),
                "started_at": e["enqueued_at"],
                "ended_at": until,
                "dataset_uri": req.get("dataset_uri"),
            }
        )
    return rows


def collect_utilization(
    window_days: float,
    as_of: str | None = None,
    budget_gb: float = DEFAULT_BUDGET_GB,
    quotas: Mapping[str, Any] | None = None,
    ctx: StageContext | None = None,
    storage_cap_gb: Mapping[str, float] | None = None,
    team_priority: Mapping[str, float] | None = None,
) -> JSON:
    """The rebalance problem from the ledger (demand per team, region and GPU type over the window:
    finished attempts, attempts still running and runs waiting in the queue; datasets each team
    reads, their sizes, replicas and the regions their runs' ``data_residency`` allows them in)
    and the catalog's supply. ``storage_cap_gb``: region → GB its replicas may hold in all;
    ``team_priority``: team → weight of its GPUs moved (default 1).

    Raises:
        InvalidRequestError: ``window_days`` or ``budget_gb`` is not a finite number > 0 (≥ 0 for
            the budget): an empty window would publish an assignment with no demand at all; a
            storage cap of a region the supply lacks, or that is no number ≥ 0; a team priority
            that is no number > 0.
    """
    import math

    if not (isinstance(window_days, int | float) and math.isfinite(window_days) and window_days > 0):
        raise InvalidRequestError("window_days", window_days, "need a finite number of days > 0")
    if not (isinstance(budget_gb, int | float) and math.isfinite(budget_gb) and budget_gb >= 0):
        raise InvalidRequestError("budget_gb", budget_gb, "need a finite number of GB ≥ 0")
    ctx = resolve_ctx(ctx)
    from sailor_tasks.catalog.supply import region_supply
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.rebalance.collect import build_problem

    until = dt.datetime.fromisoformat(as_of) if as_of else utcnow()
    # In UTC, as the ledger stores times (SQLite compares them as written).
    until = until.astimezone(dt.UTC) if until.tzinfo else until.replace(tzinfo=dt.UTC)
    since = until - dt.timedelta(days=window_days)

    def size_of(uri: str) -> int | None:
        """The dataset's bytes: its manifest's, else its files' (None: it cannot be read, or its
        manifest is damaged)."""
        try:
            root = storage.resolve(uri, ctx.settings)
            manifest = read_manifest(root)
            if manifest:
                return manifest.total_bytes
            return sum(size for _, size in list_files(root))
        except (InvalidRequestError, DataIntegrityError, OSError) as exc:
            logger.warning("dataset %s: size unknown (%s); no replica of it is planned", uri, exc)
            return None

    supply = region_supply(ctx.catalog.offers)
    transfer = ctx.catalog.transfer
    regions = sorted({r for r, _g in supply})
    for region, gb in (storage_cap_gb or {}).items():
        if region not in regions:
            raise InvalidRequestError(f"storage_cap_gb[{region!r}]", gb, "not a region of the supply", regions)
        if not (isinstance(gb, int | float) and math.isfinite(gb) and gb >= 0):
            raise InvalidRequestError(f"storage_cap_gb[{region!r}]", gb, "need a finite number of GB ≥ 0")
    for team, weight in (team_priority or {}).items():
        if not (isinstance(weight, int | float) and math.isfinite(weight) and weight > 0):
            raise InvalidRequestError(f"team_priority[{team!r}]", weight, "need a finite weight > 0")

    def residency(uri: str) -> list[str] | None:
        """The supplied regions in the continents the dataset's runs allowed it (None: any)."""
        continents = ctx.ledger.dataset_residency(uri)
        if continents is None:
            return None
        return sorted({r for r, _g in supply if transfer.continent(r) in continents})

    # attempts a dead task left without a utilization row held their GPUs all the same
    finished = [*ctx.ledger.utilization_rows(since, until), *ctx.ledger.unrecorded_attempt_rows(since, until)]
    in_flight, queued = in_flight_rows(ctx, until), queued_rows(ctx, until)
    problem, stats = build_problem(
        [*finished, *in_flight, *queued],
        ctx.ledger.replica_rows(),
        supply,
        since,
        until,
        budget_bytes=int(budget_gb * 1e9),
        size_of=size_of,
        quotas=quotas,
        priorities=dict(team_priority or {}),
        storage_cap_bytes={r: float(gb) * 1e9 for r, gb in (storage_cap_gb or {}).items()},
        residency=residency,
    )
    logger.info(
        "collected %.3f GPU-hours of %d teams over %.1f days; %d datasets; supply in %d regions",
        stats["gpu_hours"],
        len(problem.teams),
        window_days,
        len(problem.datasets),
        len(problem.supply),
    )
    def gpu_h(rows: list[dict[str, Any]]) -> float:
        seconds = sum(r["gpus"] * max(0.0, (r["ended_at"] - max(r["started_at"], since)).total_seconds()) for r in rows)
        return round(seconds / 3600.0, 6)

    return {
        "window_days": window_days,
        "in_flight_gpu_hours": gpu_h(in_flight),
        "queued_gpu_hours": gpu_h(queued),
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


def gpu_type_shares(placement: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, Any]:
    """team → GPU type → region → share of the team's demand of that GPU type, from the solver's
    placement (team → region → GPU type → GPUs); types a team has no demand of are left out."""
    totals: dict[str, dict[str, float]] = {}
    for team, regions in placement.items():
        for per_gpu in regions.values():
            for gpu, n in per_gpu.items():
                totals.setdefault(team, {}).setdefault(gpu, 0.0)
                totals[team][gpu] += n
    out: dict[str, dict[str, dict[str, float]]] = {}
    for team, regions in placement.items():
        for region, per_gpu in regions.items():
            for gpu, n in per_gpu.items():
                if n > 0 and totals[team][gpu] > 0:
                    share = round(n / totals[team][gpu], 6)
                    out.setdefault(team, {}).setdefault(gpu, {})[region] = share
    return out


def publish_assignment(
    solution: JSON, source: str, dry_run: bool = False, ctx: StageContext | None = None
) -> JSON:
    """Write the shares (and projected region load) as a new assignment version ``plan`` reads.

    Raises:
        StageSkipped: ``dry_run``: nothing is published and no data is replicated.
    """
    if dry_run:
        raise StageSkipped("dry run: no assignment published, no data replicated")
    ctx = resolve_ctx(ctx)
    if not solution["shares"]:
        kept = ctx.ledger.latest_assignment()
        raise StageSkipped(
            "no demand in the window: nothing published, "
            + (f"assignment v{kept.version} stays" if kept else "no assignment yet")
        )
    assignment = ctx.ledger.publish_assignment(
        solution["shares"],
        source=source,
        region_load=solution["region_load_after"],
        gpu_shares=gpu_type_shares(solution["placement"]),
    )
    logger.info("published assignment v%d for %d teams", assignment.version, len(assignment.shares))
    copies = solution["replicate"]
    n = min(len(copies), COPY_BATCHES)
    return {
        "version": assignment.version,
        "teams": len(assignment.shares),
        "copies": copies,
        "batches": [copies[k::n] for k in range(n)],
    }


def replicate_datasets(
    copies: list[JSON], final: bool = True, run_id: str | None = None, ctx: StageContext | None = None
) -> JSON:
    """A batch of planned replicas (``publish_assignment``'s ``batches``), one after the other,
    each as ``replicate_dataset``: a copy that fails does not stop the others.

    ``run_id``: the rebalance run's: each copy's ``bytes_copied`` then counts what every try of
    the run copied for it (kept in the run's report folder, ``copied/``), not only this try's, so
    that a night whose copies needed a retry reports every byte it moved. Without it, this try's.

    Returns:
        ``done`` (each replica), ``withheld`` (copies ``data_residency`` keeps out) and ``failed``
        (each copy with its error and the bytes copied before it failed; only when ``final``).

    Raises:
        ReplicationIncompleteError: some copies failed and this is not the ``final`` try: a retry
            makes what is missing (what was copied is kept).
    """
    ctx = resolve_ctx(ctx)
    done, withheld, failed = [], [], []
    for copy in copies:
        moved: list[int] = []  # sizes of the files this try copied (appended by the copier's threads)
        try:
            entry = replicate_dataset(copy, ctx, on_copied=moved.append)
            done.append(entry)
        except StageSkipped as exc:
            withheld.append({**copy, "reason": str(exc)})
            continue
        except Exception as exc:
            logger.error("replica of %s in %s failed: %s", copy["dataset_uri"], copy["region"], exc)
            entry = {**copy, "error": f"{type(exc).__name__}: {exc}"[:500]}
            failed.append(entry)
        entry["bytes_copied"] = _tallied(run_id, copy, sum(moved), ctx) if run_id else sum(moved)
    if failed and not final:
        raise ReplicationIncompleteError(failed, len(copies))
    return {"done": done, "withheld": withheld, "failed": failed}


def _tallied(run_id: str, copy: JSON, nbytes: int, ctx: StageContext) -> int:
    """Bytes every try of rebalance run ``run_id`` copied for ``copy``: ``nbytes`` (this try's)
    added to the run's count for it, which is kept. A count that cannot be read or kept is
    logged, and this try's bytes stand alone."""
    uri, region = canonical_dataset_uri(copy["dataset_uri"]), copy["region"]
    key = hashlib.sha256(f"{uri}\n{region}".encode()).hexdigest()[:24]
    tally = storage.join(paths.rebalance_report_uri(run_id, ctx.settings), "copied", f"{key}.json")
    try:
        before = int(storage.read_json(tally)["bytes"]) if storage.exists(tally) else 0
        if nbytes:
            storage.write_json(tally, {"dataset_uri": uri, "region": region, "bytes": before + nbytes})
    except Exception as exc:  # a store's error (gcsfs raises its own): the copy's outcome stands
        logger.warning(
            "bytes copied for %s in %s by earlier tries unknown (%s): this try's only", uri, region, exc
        )
        return nbytes
    return before + nbytes


def replicate_dataset(
    copy: JSON, ctx: StageContext | None = None, on_copied: Callable[[int], None] | None = None
) -> JSON:
    """One planned replica: the same checksummed, resumable copier as ``place_data``.
    ``on_copied``: called with the size of each file copied (``copy_dataset``).

    Raises:
        StageSkipped: ``region`` is outside the continents a run reading the dataset restricted it
            to (``data_residency``): the replica is withheld, nothing is copied.
    """
    ctx = resolve_ctx(ctx)
    uri, region = canonical_dataset_uri(copy["dataset_uri"]), copy["region"]
    allowed = ctx.ledger.dataset_residency(uri)
    continent = ctx.catalog.transfer.continent(region)
    if allowed is not None and continent not in allowed:
        logger.warning(
            "replica of %s in %s withheld: its runs keep it in %s (data_residency), %s is in %s",
            uri,
            region,
            ", ".join(sorted(allowed)),
            region,
            continent,
        )
        raise StageSkipped(
            f"data_residency keeps {uri} in {', '.join(sorted(allowed))}; {region} is in {continent}"
        )
    src = storage.resolve(uri, ctx.settings)
    dst = paths.replica_uri(region, uri, ctx.settings)
    logger.info("replicating %s into %s", src, dst)
    result = copy_dataset(
        src,
        dst,
        lease=ctx.ledger.lease,
        on_invalidate=lambda: ctx.ledger.forget_replica(uri, region),
        on_complete=lambda m: ctx.ledger.record_replica(uri, region, dst, m.total_bytes, len(m.files)),
        on_copied=on_copied,
    )
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
    realised and projected ratios, allocation rate, bytes, report URIs), shown in the log.
    ``replicated``: what ``replicate_datasets`` returned for each batch of copies.

    Raises:
        ReplicationFailedError: planned copies still failed after every try (raised once the
            night is recorded and reported, so that the run ends failed).
    """
    ctx = resolve_ctx(ctx)
    from sailor_tasks.rebalance.report import render_chart, render_markdown, top_moves

    published = ctx.ledger.latest_assignment()
    version = None
    if not dry_run and published is not None and published.source == f"sailor_rebalance/{run_id}":
        version = published.version
    batches = [b for b in replicated if b]
    copies = [c for b in batches for c in b["done"]]
    failed = [f for b in batches for f in b["failed"]]
    withheld = sum(len(b["withheld"]) for b in batches)
    # A failed copy's files copied before it failed were moved too.
    copied_bytes = sum(c["bytes_copied"] for c in copies) + sum(f.get("bytes_copied", 0) for f in failed)
    if dry_run:
        unpublished = "dry run"
    elif not solution["shares"]:
        unpublished = "no demand in the window: the last assignment stays"
    else:
        unpublished = "not published by this run"
    root = paths.rebalance_report_uri(run_id, ctx.settings)
    chart_uri, summary_uri = storage.join(root, "ratio.png"), storage.join(root, "summary.md")
    title = f"SAILOR rebalance {run_id}" + (" (dry run)" if dry_run else "")
    storage.write_bytes(chart_uri, render_chart(solution, title))
    markdown = render_markdown(
        title,
        solution,
        top_moves(utilization["problem"], solution["placement"]),
        window=f"{utilization['window_days']} days ({utilization['since']} → {utilization['until']})",
        bytes_replicated=None if version is None else copied_bytes,
        copies_done=None if version is None else len(copies),
        version=version,
        chart_uri=chart_uri,
        unpublished=unpublished,
        copies_failed=len(failed),
        copies_withheld=withheld,
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
        bytes_replicated=copied_bytes,
        report_uri=chart_uri,
        summary_uri=summary_uri,
    )
    logger.info("rebalance report (%s):\n%s", summary_uri, markdown)
    if failed:
        raise ReplicationFailedError(failed, len(solution["replicate"]))
    return {"report_uri": chart_uri, "summary_uri": summary_uri, "markdown": markdown, "dry_run": dry_run}



def review_assignment(version: int | None = None, ctx: StageContext | None = None) -> JSON:
    """What a newly published assignment means for the capacity held now: the runs with a live
    reservation in a region their team's new shares leave out (they keep running; ``plan`` steers
    their next placement, e.g. a recovery, by the new shares), and the regions it projects over
    capacity. ``version``: the version the triggering asset event names; the newest is reviewed.

    Raises:
        StageSkipped: no assignment has been published.
    """
    ctx = resolve_ctx(ctx)
    assignment = ctx.ledger.latest_assignment()
    if assignment is None:
        raise StageSkipped("no assignment published yet")
    if version is not None and version != assignment.version:
        logger.info("assignment v%d was published; reviewing the newest, v%d", version, assignment.version)
    reservations = ctx.ledger.live_reservations()
    outside = []
    for r in reservations:
        run = ctx.ledger.get_run(r.run_id) or {}
        team = run.get("team", "")
        # The shares ``plan`` steers the run's GPU type by: its type's, else the team's overall.
        shares = assignment.gpu_shares.get(team, {}).get(r.gpu_type) or assignment.shares.get(team, {})
        if shares and shares.get(r.region, 0.0) <= 0.0:
            outside.append(
                {
                    "run_id": r.run_id,
                    "team": run["team"],
                    "region": r.region,
                    "gpus": r.gpus,
                    "assigned_regions": sorted(k for k, v in shares.items() if v > 0),
                }
            )
    overloaded = {k: round(v, 3) for k, v in sorted(assignment.region_load.items()) if v > 1.0}
    lines = [
        f"assignment v{assignment.version} ({len(assignment.shares)} teams, {assignment.source or 'no source'}): "
        f"{len(reservations)} live reservations, {len(outside)} outside their team's new regions"
    ]
    lines += [
        f"  {o['run_id']} ({o['team']}, {o['gpus']} GPUs) in {o['region']}; "
        f"assigned: {', '.join(o['assigned_regions'])}"
        for o in outside
    ]
    if overloaded:
        lines.append("projected over capacity: " + ", ".join(f"{k} {v:.2f}" for k, v in overloaded.items()))
    logger.info("%s", "\n".join(lines))
    return {
        "version": assignment.version,
        "live_reservations": len(reservations),
        "outside": outside,
        "overloaded": overloaded,
        "report": "\n".join(lines),
    }
