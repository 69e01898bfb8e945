"""A dataset whose runs asked for ``data_residency`` (the continents it may be copied to) is never
replicated outside them by the nightly rebalance: ``place_data`` respects residency through the
placement engine, and ``replicate_dataset`` withholds a planned replica outside it."""

from __future__ import annotations

import pytest

from sailor_tasks.errors import StageSkipped


def _eu_only_dataset(ctx) -> str:
    from sailor_tasks import storage
    from sailor_tasks.data.copier import seal

    uri = "sailor://source/eu-only"
    root = storage.resolve(uri, ctx.settings)
    storage.write_bytes(storage.join(root, "part-0.bin"), b"x" * 10_000)
    seal(root)
    # the copy its runs in europe-west4 made
    ctx.ledger.record_replica(uri, "europe-west4", "sailor://europe-west4/eu-only", 10_000, 1)
    for i, residency in enumerate((["EU"], None, ["EU", "NA"])):  # the runs that declared one: EU
        ctx.ledger.upsert_run(
            f"eu-{i}",
            job_name="j",
            team="eu",
            status="success",
            backend="local",
            model="tiny_gpt",
            dataset_uri=uri,
            request={"data_residency": residency, "dataset_uri": uri},
        )
    return uri


def test_a_replica_outside_the_datasets_residency_is_withheld(ctx):
    from sailor_tasks import stages

    uri = _eu_only_dataset(ctx)
    assert ctx.ledger.dataset_residency(uri) == frozenset({"EU"})
    with pytest.raises(
        StageSkipped, match=r"data_residency keeps sailor://source/eu-only in EU; us-central1 is in"
    ):
        stages.replicate_dataset({"dataset_uri": uri, "region": "us-central1", "bytes": 10_000}, ctx)
    assert "us-central1" not in ctx.ledger.replicas([uri]).get(uri, ())
    done = stages.replicate_dataset({"dataset_uri": uri, "region": "europe-west4", "bytes": 10_000}, ctx)
    assert done["bytes"] == 10_000 and "europe-west4" in ctx.ledger.replicas([uri])[uri]


def test_a_dataset_no_run_restricted_has_no_residency(ctx):
    ctx.ledger.upsert_run(
        "r",
        job_name="j",
        team="t",
        status="success",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/free",
        request={"dataset_uri": "sailor://source/free"},
    )
    assert ctx.ledger.dataset_residency("sailor://source/free") is None
    assert ctx.ledger.dataset_residency("sailor://source/never-read") is None


def test_the_rebalance_gives_a_team_no_share_outside_its_datasets_residency(ctx):
    """The team reading the EU-only dataset is crowded in one EU region with budget to copy it
    anywhere: the solver spreads it over EU regions only, and plans no replica elsewhere."""
    import datetime as dt

    from sailor_tasks import stages
    from sailor_tasks.ledger.store import utcnow

    uri = _eu_only_dataset(ctx)
    now = utcnow()
    for i in range(12):  # far more T4 demand than one region holds
        ctx.ledger.record_utilization(
            f"eu-{i % 3}", "eu", "europe-west4", "T4", 64, now - dt.timedelta(hours=20 + i), now
        )
    collected = stages.collect_utilization(1.0, budget_gb=1000.0, ctx=ctx)
    (dataset,) = [d for d in collected["problem"]["datasets"] if d["uri"] == uri]
    continent = ctx.catalog.transfer.continent
    assert dataset["regions"] and {continent(r) for r in dataset["regions"]} == {"EU"}
    solution = stages.solve_assignment(collected, time_limit_s=20.0, comfort_ratio=0.0)
    assert len(solution["shares"]["eu"]) > 1  # it did spread
    assert {continent(r) for r in solution["shares"]["eu"]} == {"EU"}
    assert {continent(c["region"]) for c in solution["replicate"]} <= {"EU"}


def test_a_run_without_residency_never_copies_a_dataset_where_another_run_forbade_it(ctx, demo_dataset):
    """data_residency is the dataset's: run B declares none, but run A kept the dataset in the EU,
    so B is placed in the EU too, or refused where it allows only other continents."""
    from sailor_tasks import stages
    from sailor_tasks.errors import NoFeasibleOfferError

    a = stages.validate({"dataset_uri": demo_dataset, "data_residency": ["EU"]}, "run-a", ctx)
    stages.place_data(a, stages.plan(a, "run-a", ctx), "run-a", ctx)
    b = stages.validate({"dataset_uri": demo_dataset}, "run-b", ctx)
    placed = stages.plan(b, "run-b", ctx)
    assert ctx.catalog.transfer.continent(placed["region"]) == "EU"
    us = stages.validate({"dataset_uri": demo_dataset, "regions": ["us-central1"]}, "run-us", ctx)
    with pytest.raises(NoFeasibleOfferError, match="data_residency"):
        stages.plan(us, "run-us", ctx)
    assert set(ctx.ledger.replicas([demo_dataset])[demo_dataset]) <= {
        r for r in ctx.catalog.regions if ctx.catalog.transfer.continent(r) == "EU"
    }


def test_a_replica_or_the_replica_folder_is_no_dataset_a_run_may_name(ctx, demo_dataset):
    """A replica read as a dataset escaped its source's residency; the datasets/ folder of a
    region bucket held its own replica, copied into itself and grown on every run."""
    from sailor_tasks import paths, stages
    from sailor_tasks.errors import InvalidRequestErrors

    a = stages.validate({"dataset_uri": demo_dataset, "data_residency": ["EU"]}, "run-a", ctx)
    placed = stages.plan(a, "run-a", ctx)
    stages.place_data(a, placed, "run-a", ctx)
    replica = f"sailor://{placed['region']}/{paths.replica_path(demo_dataset)}"
    with pytest.raises(
        InvalidRequestErrors, match=rf"is SAILOR's replica of {demo_dataset} in {placed['region']}"
    ):
        stages.validate({"dataset_uri": replica}, "run-c", ctx)
    with pytest.raises(InvalidRequestErrors, match="holds SAILOR's dataset replicas"):
        stages.validate({"dataset_uri": f"sailor://{placed['region']}/datasets"}, "run-d", ctx)
    assert ctx.ledger.get_run("run-c")["status"] == ctx.ledger.get_run("run-d")["status"] == "rejected"
