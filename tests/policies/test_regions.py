from __future__ import annotations

import datetime as dt

import pytest

from sailor_tasks import stages
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, load_packaged
from sailor_tasks.policies.regions import region_supply


def add_run(
    ledger, run_id, status, region, model="small_gpt", gpus=2, gpu_type="any", steps=0, backend="gke"
):
    ledger.upsert_run(
        run_id,
        job_name=run_id,
        team="research",
        status=status,
        backend=backend,
        model=model,
        dataset_uri="sailor://source/d",
        request={"gpu_type": gpu_type, "num_workers": gpus, "total_steps": 1000},
        region=region,
        num_gpus=gpus,
        total_steps=1000,
        steps=steps,
    )


def test_allocate_gpu_types_publishes_shares_for_active_runs_per_region(ctx):
    ledger = ctx.ledger
    add_run(ledger, "a", "planned", "us-central1", gpus=2)
    add_run(ledger, "b", "running", "us-central1", model="gpt_25m", gpus=8, steps=500)
    add_run(ledger, "c", "provisioned", "us-central1", gpus=1, gpu_type="T4")
    add_run(ledger, "d", "running", "europe-west4", gpus=4)
    add_run(ledger, "done", "success", "us-central1", gpus=2)
    out = stages.allocate_gpu_types({"demand": []}, source="test", ctx=ctx)
    assert out["policy"] == "las" and set(out["regions"]) == {"us-central1", "europe-west4"}
    central = ledger.latest_gpu_allocation("us-central1")
    assert set(central) == {"a", "b", "c"}
    assert set(central["c"]["shares"]) == {"T4"}  # the run pinned its GPU type
    for row in central.values():
        assert 0 < sum(row["shares"].values()) <= 1 + 1e-6 and row["steps_per_s"] > 0
    supply = region_supply(ctx.catalog, "us-central1")
    gpus = {"a": 2, "b": 8, "c": 1}
    for g, cap in supply.items():
        assert sum(row["shares"].get(g, 0) * gpus[r] for r, row in central.items()) <= cap + 1e-6
    # A second publish is a new version; the newest one is what readers see.
    add_run(ledger, "a", "success", "us-central1")
    stages.allocate_gpu_types({"demand": []}, source="test2", ctx=ctx)
    newer = ledger.latest_gpu_allocation("us-central1")
    assert set(newer) == {"b", "c"} and newer["b"]["version"] > central["b"]["version"]


def test_unknown_policy_fails_the_stage_with_valid_names(ctx):
    add_run(ctx.ledger, "a", "planned", "us-central1")
    with pytest.raises(ValueError, match="valid policies"):
        stages.allocate_gpu_types({"demand": []}, source="t", policy="nope", ctx=ctx)


def test_measured_throughput_from_the_ledger_feeds_back_into_the_table(ctx):
    ledger = ctx.ledger
    add_run(ledger, "m", "success", "us-central1", model="tiny_gpt", steps=1200, backend="gke")
    add_run(ledger, "cpu", "success", "us-central1", model="tiny_gpt", steps=99_999, backend="local")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ledger.record_utilization(
        "m", "research", "us-central1", "A100", 1, start, start + dt.timedelta(seconds=60)
    )
    ledger.record_utilization(
        "cpu", "research", "us-central1", "A100", 1, start, start + dt.timedelta(seconds=60)
    )
    measured = ledger.measured_throughputs()
    assert measured == [("tiny_gpt", "A100", 20.0)]  # the local (CPU) run is left out
    table = load_packaged()
    key = MODEL_JOB_TYPES["tiny_gpt"]
    before = table.throughput(key, "A100")
    after = table.with_measured(measured).throughput(key, "A100")
    assert after == pytest.approx(0.5 * before + 0.5 * 20.0)


def test_plan_stage_places_with_the_policies_throughput_matrix(ctx, demo_dataset):
    """Placement and the GPU-type policies read one matrix: measured speeds reach both."""
    from sailor_tasks.catalog.throughput import packaged_with_measured
    from sailor_tasks.placement.index import index_for

    params = {"dataset_uri": demo_dataset, "num_workers": 1, "gpu_type": "A100"}
    request = stages.validate(params, "before", ctx)
    key = MODEL_JOB_TYPES["tiny_gpt"]
    packaged = load_packaged().throughput(key, "A100")
    assert f"at {packaged:.3g} steps/s" in stages.plan(request, "before", ctx)["explanation"][2]
    add_run(ctx.ledger, "m", "success", "us-central1", model="tiny_gpt", steps=1200, backend="gke")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ctx.ledger.record_utilization(
        "m", "research", "us-central1", "A100", 1, start, start + dt.timedelta(seconds=60)
    )
    measured = tuple(ctx.ledger.measured_throughputs())
    blended = packaged_with_measured(measured).throughput(key, "A100")
    assert blended == pytest.approx(0.5 * packaged + 0.5 * 20.0)
    request = stages.validate(params, "after", ctx)
    assert f"at {blended:.3g} steps/s" in stages.plan(request, "after", ctx)["explanation"][2]
    assert index_for(ctx.catalog, packaged_with_measured(measured)).throughput is packaged_with_measured(
        measured
    )
