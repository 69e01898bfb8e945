from __future__ import annotations

import datetime as dt

import pytest

from sailor_tasks import stages
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, load_packaged
from sailor_tasks.policies.regions import job_from_run


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


def test_a_ledger_run_becomes_a_policy_job_on_the_types_it_may_use():
    table = load_packaged()
    run = {
        "run_id": "c",
        "model": "small_gpt",
        "num_gpus": 2,
        "request": {"gpu_type": "T4", "num_workers": 2, "total_steps": 1000},
        "total_steps": 1000,
        "steps": 400,
    }
    job = job_from_run(run, table, ["T4", "V100"])
    assert set(job.throughput) == {"T4"}  # the run pinned its GPU type
    assert job.throughput["T4"] > 0 and job.scale_factor == 2 and job.steps_remaining == 600
    free = job_from_run({**run, "request": {**run["request"], "gpu_type": "any"}}, table, ["T4", "V100"])
    assert set(free.throughput) == {"T4", "V100"} and free.throughput["V100"] > free.throughput["T4"]
    with pytest.raises(ValueError, match="no job type; known:"):
        job_from_run({**run, "model": "nope"}, table, ["T4"])


def test_a_measurement_reaches_every_gpu_count_and_more_gpus_are_never_slower():
    """A measured speed of the model moves its 2-, 4- and 8-GPU entries too (before, only the
    1-GPU entry moved: a 3-GPU run, scaled linearly from it, came out 8x faster than a 4-GPU run
    read from Gavel's untouched entry)."""
    table = load_packaged()
    job = MODEL_JOB_TYPES["gpt_25m"]
    measured = table.with_measurement(job, "V100", 100.0)
    factor = measured.throughput(job, "V100") / table.throughput(job, "V100")

    def speed(t, n):
        run = {"run_id": "r", "model": "gpt_25m", "num_gpus": n}
        return job_from_run(run, t, ["V100"]).throughput["V100"]

    for n in (2, 4, 8):
        assert speed(measured, n) == pytest.approx(speed(table, n) * factor)
    counts = (1, 2, 3, 4, 5, 6, 8, 12, 16)
    for t in (table, measured):
        speeds = [speed(t, n) for n in counts]
        assert speeds == sorted(speeds), speeds
    # the spread penalty of a multi-GPU entry is kept
    big = (job[0], 8)
    assert measured.throughput(big, "V100", False) / measured.throughput(big, "V100") == pytest.approx(
        table.throughput(big, "V100", False) / table.throughput(big, "V100")
    )


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
    # A run preempted once trained its 1200 steps in two attempts of 60 s: 10 steps/s, not 20 twice.
    add_run(ledger, "p", "success", "us-central1", model="tiny_gpt", steps=1200, backend="gke")
    later = start + dt.timedelta(hours=1)
    for i in range(2):
        begin = later + dt.timedelta(seconds=100 * i)
        ledger.record_utilization(
            "p", "research", "us-central1", "A100", 1, begin, begin + dt.timedelta(seconds=60)
        )
    assert ledger.measured_throughputs() == [("tiny_gpt", "A100", 20.0), ("tiny_gpt", "A100", 10.0)]
    # One on two GPU types cannot split its steps between them: left out.
    add_run(ledger, "moved", "success", "us-central1", model="tiny_gpt", steps=1200, backend="gke")
    for i, gpu in enumerate(("A100", "T4")):
        begin = later + dt.timedelta(hours=1, seconds=100 * i)
        ledger.record_utilization(
            "moved", "research", "us-central1", gpu, 1, begin, begin + dt.timedelta(seconds=60)
        )
    assert len(ledger.measured_throughputs()) == 2
    # One of another batch size took longer per step, as its steps are bigger: left out.
    ledger.upsert_run(
        "big-batch", job_name="b", team="research", status="success", backend="gke", model="tiny_gpt",
        dataset_uri="sailor://source/d", request={"gpu_type": "A100", "batch_size": 4096}, steps=12,
    )  # fmt: skip
    begin = later + dt.timedelta(hours=2)
    ledger.record_utilization(
        "big-batch", "research", "us-central1", "A100", 1, begin, begin + dt.timedelta(seconds=60)
    )
    assert len(ledger.measured_throughputs()) == 2
    table = load_packaged()
    key = MODEL_JOB_TYPES["tiny_gpt"]
    before = table.throughput(key, "A100")
    after = table.with_measured(measured).throughput(key, "A100")
    assert after == pytest.approx(0.5 * before + 0.5 * 20.0)  # one run: halfway


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


def test_measured_speeds_leave_out_runs_of_a_users_own_command_and_runs_spread_over_several_vms(ctx):
    """A run of its own command still names the default model, and a spread run is slowed by the
    spread penalty placement applies itself: neither is the built-in model's one-VM speed."""
    ledger = ctx.ledger
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for run_id in ("own", "spread", "plain"):
        add_run(ledger, run_id, "success", "us-central1", model="tiny_gpt", steps=1200, backend="gke")
        ledger.record_utilization(
            run_id, "research", "us-central1", "A100", 1, start, start + dt.timedelta(seconds=60)
        )
    ledger.upsert_run("own", request={"gpu_type": "A100", "num_workers": 1, "command": ["python", "mine.py"]})
    for run_id, nodes in (("spread", 2), ("plain", 1)):
        placement = {"region": "us-central1", "zone": "us-central1-a", "gpu_type": "A100"}
        ledger.start_attempt(run_id, 1, 1, {**placement, "num_nodes": nodes, "num_gpus": 2}, {})
    assert ledger.measured_throughputs() == [("tiny_gpt", "A100", 20.0)]


def test_validate_refuses_a_deadline_the_measured_speeds_make_unmeetable_as_plan_would(ctx, demo_dataset):
    """``plan`` reads the measured speeds; so does ``validate``'s deadline check, or it accepted a
    run that plan then refused after queueing."""
    from sailor_tasks.errors import InvalidRequestErrors

    params = {
        "dataset_uri": demo_dataset,
        "num_workers": 1,
        "gpu_type": "A100",
        "total_steps": 30_000,
        "checkpoint_every_steps": 1000,
        "deadline_hours": 2,
    }
    stages.validate(params, "before", ctx)  # the packaged speed meets it easily
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i in range(8):  # 1 step/s measured on A100, eight times
        add_run(ctx.ledger, f"slow{i}", "success", "us-central1", model="tiny_gpt", steps=100, backend="gke")
        begin = start + dt.timedelta(hours=i)
        ctx.ledger.record_utilization(
            f"slow{i}", "research", "us-central1", "A100", 1, begin, begin + dt.timedelta(seconds=100)
        )
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate(params, "after", ctx)
    assert "deadline_hours" in str(info.value)
