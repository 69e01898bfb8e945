"""Spot preemption rates learned from the ledger's attempts as a Gamma-Poisson update of the
supply file's prior; shown by `sailor catalog` with the observation count; used by plan."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.learned import PRIOR_VM_HOURS, learned_rate, learned_rates, with_learned_rates
from sailor_tasks.cli.main import main as sailor

ZONE, GPU = "us-central1-a", "T4"


def test_the_prior_holds_without_observations_and_observations_dominate_with_many_hours():
    assert learned_rate(0.03, 0, 0.0) == pytest.approx(0.03)
    assert learned_rate(0.03, 5, 10.0) == pytest.approx((0.03 * PRIOR_VM_HOURS + 5) / (PRIOR_VM_HOURS + 10))
    assert learned_rate(0.03, 5000, 10_000.0) == pytest.approx(0.5, rel=0.01)
    with pytest.raises(ValueError, match="need both >= 0"):
        learned_rate(0.03, -1, 1.0)


def test_learned_rates_replace_only_the_observed_pairs_and_are_cached():
    catalog = load_catalog()
    obs = {(ZONE, GPU): (4, 30.0)}
    rates = learned_rates(catalog, obs)
    prior = next(o.preemption_rate_per_hour for o in catalog.offers if (o.zone, o.gpu_type) == (ZONE, GPU))
    assert rates[(ZONE, GPU)].rate == pytest.approx(learned_rate(prior, 4, 30.0))
    assert rates[(ZONE, GPU)].preemptions == 4 and rates[(ZONE, GPU)].vm_hours == 30.0
    learned = with_learned_rates(catalog, obs)
    for before, after in zip(catalog.offers, learned.offers, strict=True):
        if (before.zone, before.gpu_type) == (ZONE, GPU):
            assert after.preemption_rate_per_hour == pytest.approx(rates[(ZONE, GPU)].rate)
        else:
            assert after == before
    assert with_learned_rates(catalog, dict(obs)) is learned  # the same object: indexes are reused
    assert with_learned_rates(catalog, {}) is catalog


def _attempt(ledger, run_id, backend, market, hours, preempted):
    ledger.upsert_run(
        run_id, job_name="j", team="t", status="running", backend=backend, model="tiny_gpt",
        dataset_uri="x", request={},
    )
    placement = {"region": "us-central1", "zone": ZONE, "gpu_type": GPU, "market": market, "num_nodes": 2}
    ledger.start_attempt(run_id, 1, 1, placement, {})
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    from sqlalchemy import update

    from sailor_tasks.ledger import schema as t

    with ledger.engine.begin() as c:
        c.execute(
            update(t.run_attempts)
            .where(t.run_attempts.c.run_id == run_id)
            .values(started_at=start, ended_at=start + dt.timedelta(hours=hours), outcome="completed")
        )
    if preempted:
        ledger.record_preemption(run_id, 1, "us-central1", ZONE, True, 10, 0, None)


def test_the_ledger_observes_spot_attempts_on_cloud_backends_and_sailor_catalog_shows_them(ctx, capsys):
    ledger = ctx.ledger
    _attempt(ledger, "gke-1", "gke", "spot", 3.0, preempted=True)  # 2 nodes: 6 VM-hours
    _attempt(ledger, "gke-2", "gke", "on_demand", 5.0, preempted=False)  # not spot: not counted
    _attempt(ledger, "local-1", "local", "spot", 9.0, preempted=True)  # injected: not counted
    assert ledger.spot_observations() == {(ZONE, GPU): (1, 6.0)}

    assert sailor(["catalog", "--gpu", GPU, "--region", "us-central1", "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["zone"] == ZONE]
    assert rows and all(r["preemptions_observed"] == 1 and r["spot_vm_hours_observed"] == 6.0 for r in rows)
    prior = rows[0]["preemption_prior_per_hour"]
    assert rows[0]["preemption_rate_per_hour"] == pytest.approx(learned_rate(prior, 1, 6.0), abs=1e-6)
    assert sailor(["catalog", "--gpu", GPU, "--region", "us-central1", "--json", "--prior"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["zone"] == ZONE]
    assert rows[0]["preemption_rate_per_hour"] == prior and rows[0]["preemptions_observed"] == 0

    planning = ctx.planning_catalog()
    rate = next(o.preemption_rate_per_hour for o in planning.offers if (o.zone, o.gpu_type) == (ZONE, GPU))
    assert rate == pytest.approx(learned_rate(prior, 1, 6.0))


def test_sailor_plan_decides_with_the_learned_rates_the_plan_stage_uses(ctx, capsys):
    """``sailor plan`` shows the decision the ``plan`` stage makes: on the catalog with the rates
    learned from the ledger's spot attempts (a zone that preempted often is charged for it)."""
    from sailor_tasks.model import ClusterState
    from sailor_tasks.placement import explain
    from sailor_tasks.request import from_params

    for i in range(30):
        _attempt(ctx.ledger, f"gke-{i}", "gke", "spot", 0.5, preempted=True)  # 30 in 30 VM-hours
    params = {"gpu_type": GPU, "market": "spot", "regions": ["us-central1"], "num_workers": 1}
    sets = [x for k, v in params.items() for x in ("--set", f"{k}={json.dumps(v)}")]
    assert sailor(["plan", "--json", *sets]) == 0
    shown = json.loads(capsys.readouterr().out)
    request = from_params(params, ctx.catalog)
    learned = explain(request, ctx.planning_catalog(), ClusterState(), run_id="cli-plan")
    prior = explain(request, ctx.catalog, ClusterState(), run_id="cli-plan")
    assert shown["winner"] == learned["winner"] != prior["winner"]
