"""The SAILOR page's queries: supply per region beside live reservations, placements, preemptions."""

from __future__ import annotations

import datetime as dt

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.supply import region_supply
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import Reservation
from sailor_tasks.stages.dashboard import last_report_uri, snapshot


def _placement_row(ledger, run_id, region, zone):
    from sailor_tasks.model import Placement

    ledger.upsert_run(
        run_id,
        job_name="j",
        team="t",
        status="planned",
        backend="local",
        model="tiny_gpt",
        dataset_uri="x",
        request={},
    )
    ledger.record_placement(
        Placement(
            run_id=run_id,
            cloud="gcp",
            region=region,
            zone=zone,
            gpu_type="T4",
            gpus_per_node=1,
            num_nodes=4,
            num_gpus=4,
            market="spot",
            instance_type="n1-standard-8",
            usd_per_hour=1.0,
            explanation=("chosen: cheapest feasible offer",),
        )
    )


def test_snapshot_counts_live_reservations_against_region_supply(settings):
    catalog = load_catalog()
    ledger = Ledger(settings.ledger_url)
    _placement_row(ledger, "r1", "us-central1", "us-central1-a")
    ledger.reserve(Reservation("r1", "us-central1", "us-central1-a", "T4", 4, "spot"))
    ledger.reserve(Reservation("r2", "us-central1", "us-central1-b", "T4", 2, "spot"))
    ledger.reserve(Reservation("r3", "europe-west4", "europe-west4-a", "T4", 8, "spot"))
    ledger.release("r3")
    ledger.record_preemption("r1", 1, "us-central1", "us-central1-a", True, 40, 0, 12.5)
    ledger.publish_assignment({"t": {"us-central1": 1.0}}, source="test", region_load={"us-central1": 0.5})

    snap = snapshot(settings, catalog, ledger)
    rows = {r.region: r for r in snap.regions}
    supply = sum(n for (region, _gpu), n in region_supply(catalog.offers).items() if region == "us-central1")
    assert rows["us-central1"].supply_gpus == supply
    assert rows["us-central1"].reserved_gpus == 6  # r3 was released
    assert rows["us-central1"].ratio == 6 / supply
    assert rows["europe-west4"].reserved_gpus == 0
    assert rows["us-central1"].assignment_load == 0.5
    assert snap.total_reserved == 6 and {r["run_id"] for r in snap.reservations} == {"r1", "r2"}
    assert snap.assignment["version"] == 1 and snap.assignment["shares"] == {"t": {"us-central1": 1.0}}
    assert snap.placements[0]["explanation"] == ["chosen: cheapest feasible offer"]
    assert snap.preemptions[0]["recovery_s"] == 12.5
    assert snap.report_uri is None  # no rebalance has recorded a chart


def test_empty_ledger_gives_regions_and_nothing_else(settings):
    snap = snapshot(settings)
    assert len(snap.regions) == len(load_catalog().regions)
    assert snap.assignment is None and snap.placements == () and snap.preemptions == ()
    assert snap.total_reserved == 0 and snap.total_supply > 0


def test_report_uri_is_the_newest_rebalance_chart(settings):
    ledger = Ledger(settings.ledger_url)
    ledger.publish_assignment({}, source="test")
    assert last_report_uri(ledger) is None
    common = dict(
        dry_run=False,
        window_days=7.0,
        solver_status="optimal",
        max_ratio_before=2.0,
        max_ratio_after=1.0,
        lower_bound=1.0,
        allocation_rate_before=0.5,
        allocation_rate_after=0.8,
        region_ratio_before={},
        region_ratio_after={},
        bytes_planned=0,
        bytes_replicated=0,
    )
    ledger.record_rebalance("n1", assignment_version=1, report_uri="file:///a.png", **common)
    ledger.record_rebalance("n2", assignment_version=None, report_uri=None, **{**common, "dry_run": True})
    assert last_report_uri(ledger) == "file:///a.png"
    assert isinstance(snapshot(settings, ledger=ledger).taken_at, str)
    assert dt.datetime.strptime(snapshot(settings, ledger=ledger).taken_at, "%Y-%m-%d %H:%M:%S")


def test_snapshot_shows_the_queue_in_admission_order_and_the_leases(settings):
    from sailor_tasks.ledger.store import utcnow

    ledger = Ledger(settings.ledger_url)
    ledger.reserve(Reservation("r1", "us-central1", "us-central1-a", "T4", 2, "spot"), lease_s=600)
    now = utcnow()
    for run_id, team in (("q1", "a"), ("q2", "b")):
        ledger.enqueue(
            run_id,
            team=team,
            priority="normal",
            gpu_type="T4",
            gpus=2,
            request={},
            policy="las",
            max_wait_until=now + dt.timedelta(hours=1),
        )
    ledger.set_queue_ranking([("q2", 1, "las: team b ...", now), ("q1", 2, "las: team a ...", None)])
    snap = snapshot(settings, load_catalog(), ledger)
    assert [(q["run_id"], q["position"]) for q in snap.queue] == [("q2", 1), ("q1", 2)]
    assert snap.queue[0]["reason"] == "las: team b ..." and snap.queue_policy == "las"
    lease = snap.reservations[0]["lease_expires_at"]
    assert dt.timedelta(seconds=590) < lease - now <= dt.timedelta(seconds=601)
