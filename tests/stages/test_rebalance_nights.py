"""The nightly rebalance's publish, copies and report when the night is large, empty or a copy
fails: the copies are mapped in batches Airflow accepts, a night without demand keeps the last
assignment, and a failed copy neither stops the others nor hides the night's report."""

from __future__ import annotations

import datetime as dt

import pytest

from sailor_tasks.errors import ReplicationFailedError, ReplicationIncompleteError, StageSkipped


def _sealed(ctx, uri: str, size: int = 1000) -> str:
    from sailor_tasks import storage
    from sailor_tasks.data.copier import seal

    root = storage.resolve(uri, ctx.settings)
    storage.write_bytes(storage.join(root, "part-0.bin"), b"x" * size)
    seal(root)
    return uri


def _demand(ctx) -> dt.datetime:
    """Team t ran 4 T4s in us-east1 for the last 5 hours; now."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ctx.ledger.upsert_run(
        "r1", job_name="j", team="t", status="success", backend="local", model="tiny_gpt",
        dataset_uri="sailor://source/d", request={},
    )  # fmt: skip
    ctx.ledger.record_utilization("r1", "t", "us-east1", "T4", 4, now - dt.timedelta(hours=5), now)
    return now


def _solution(ctx, copies: list[dict]) -> dict:
    """A real solve of a small demand over the catalog's supply, with ``copies`` planned."""
    from sailor_tasks import stages

    now = _demand(ctx)
    utilization = stages.collect_utilization(7.0, as_of=now.isoformat(), ctx=ctx)
    return utilization, {**stages.solve_assignment(utilization, time_limit_s=10.0), "replicate": copies}


def test_a_night_with_more_copies_than_airflow_maps_publishes_them_in_batches(ctx):
    from sailor_tasks import stages
    from sailor_tasks.stages.rebalance import COPY_BATCHES

    copies = [{"dataset_uri": f"sailor://source/d{i}", "region": "us-east1", "bytes": 1} for i in range(1383)]
    _, solution = _solution(ctx, copies)
    published = stages.publish_assignment(solution, source="sailor_rebalance/big", ctx=ctx)
    batches = published["batches"]
    assert len(batches) == COPY_BATCHES < 1024  # Airflow's default core.max_map_length
    assert sorted(c["dataset_uri"] for b in batches for c in b) == sorted(c["dataset_uri"] for c in copies)
    few = stages.publish_assignment(
        {**solution, "replicate": copies[:3]}, source="sailor_rebalance/few", ctx=ctx
    )
    assert few["batches"] == [[c] for c in copies[:3]]


def test_a_night_without_demand_keeps_the_last_assignment(ctx):
    from sailor_tasks import stages

    ctx.ledger.publish_assignment({"t": {"us-east1": 1.0}}, source="sailor_rebalance/earlier")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    utilization = stages.collect_utilization(7.0, as_of=now.isoformat(), ctx=ctx)  # nothing ran
    solution = stages.solve_assignment(utilization, time_limit_s=10.0)
    assert solution["shares"] == {}
    with pytest.raises(StageSkipped, match="no demand in the window: nothing published, assignment v1 stays"):
        stages.publish_assignment(solution, source="sailor_rebalance/empty", ctx=ctx)
    assert ctx.ledger.latest_assignment().version == 1
    report = stages.report_rebalance(utilization, solution, [], run_id="empty", ctx=ctx)
    assert "not published (no demand in the window: the last assignment stays)" in report["markdown"]


def test_a_failed_copy_neither_stops_its_batch_nor_hides_the_nights_report(ctx):
    from sailor_tasks import stages

    good = _sealed(ctx, "sailor://source/good")
    copies = [
        {"dataset_uri": "sailor://source/missing", "region": "us-east1", "bytes": 1000},
        {"dataset_uri": good, "region": "us-east1", "bytes": 1000},
    ]
    utilization, solution = _solution(ctx, copies)
    stages.publish_assignment(solution, source="sailor_rebalance/night", ctx=ctx)
    with pytest.raises(
        ReplicationIncompleteError, match="1 of 2 planned copies failed: sailor://source/missing"
    ):
        stages.replicate_datasets(copies, final=False, ctx=ctx)
    assert "us-east1" in ctx.ledger.replicas([good])[good]  # made although the first copy failed
    last = stages.replicate_datasets(copies, final=True, ctx=ctx)  # the last try hands failures on
    assert [c["dataset_uri"] for c in last["done"]] == [good] and last["done"][0]["bytes_copied"] == 0
    assert [f["dataset_uri"] for f in last["failed"]] == ["sailor://source/missing"]
    with pytest.raises(ReplicationFailedError, match="1 of 2 planned copies failed"):
        stages.report_rebalance(utilization, solution, [last], run_id="night", ctx=ctx)
    (night,) = ctx.ledger.rebalance_nights()  # recorded before the night fails
    assert night["assignment_version"] == ctx.ledger.latest_assignment().version
    from sailor_tasks import storage

    summary = storage.read_bytes(night["summary_uri"]).decode()
    assert "1 done" in summary and "**1 failed**" in summary


def _two_files(ctx, uri: str) -> dict:
    """A sealed dataset of two files (3000 and 5000 B); its planned copy into us-east1."""
    from sailor_tasks import storage
    from sailor_tasks.data.copier import seal

    root = storage.resolve(uri, ctx.settings)
    storage.write_bytes(storage.join(root, "part-0.bin"), b"a" * 3000)
    storage.write_bytes(storage.join(root, "part-1.bin"), b"b" * 5000)
    seal(root)
    return {"dataset_uri": uri, "region": "us-east1", "bytes": 8000}


def _second_file_fails(monkeypatch) -> None:
    """Every copy of ``part-1.bin`` fails (a reset connection); other files copy."""
    from sailor_tasks.data import copier

    copy_one = copier._copy_one

    def flaky(src: str, dst: str):
        if src.endswith("part-1.bin"):
            raise OSError(f"{src}: connection reset")
        return copy_one(src, dst)

    monkeypatch.setattr(copier, "_copy_one", flaky)


def test_a_night_whose_copy_needed_a_retry_reports_every_byte_it_copied(ctx, monkeypatch):
    """The first try copies one file of two and fails on the other; the retry copies the second.
    The night counts both files' bytes: what the first try moved is not lost from its report."""
    from sailor_tasks import stages

    copies = [_two_files(ctx, "sailor://source/two")]
    utilization, solution = _solution(ctx, copies)
    stages.publish_assignment(solution, source="sailor_rebalance/retried", ctx=ctx)
    with monkeypatch.context() as patch:
        _second_file_fails(patch)
        with pytest.raises(ReplicationIncompleteError):
            stages.replicate_datasets(copies, final=False, run_id="retried", ctx=ctx)
    last = stages.replicate_datasets(copies, final=True, run_id="retried", ctx=ctx)
    assert last["done"][0]["bytes_copied"] == 8000  # 3000 by the first try, 5000 by the retry
    stages.report_rebalance(utilization, solution, [last], run_id="retried", ctx=ctx)
    (night,) = ctx.ledger.rebalance_nights()
    assert night["bytes_replicated"] == 8000


def test_a_failed_copy_counts_the_bytes_it_copied_before_it_failed(ctx, monkeypatch):
    from sailor_tasks import stages

    copies = [_two_files(ctx, "sailor://source/half")]
    _second_file_fails(monkeypatch)
    last = stages.replicate_datasets(copies, final=True, run_id="half", ctx=ctx)
    assert [f["bytes_copied"] for f in last["failed"]] == [3000]


def test_a_store_error_on_the_copy_count_leaves_the_copy_done(ctx, monkeypatch):
    """The run's count of copied bytes cannot be read (the store's own error, as gcsfs raises
    after its retries): the copy stays done with this try's bytes, and the try does not fail."""
    from sailor_tasks import stages
    from sailor_tasks.stages import rebalance

    copies = [_two_files(ctx, "sailor://source/counted")]

    exists = rebalance.storage.exists

    def unreachable(uri):
        if "/copied/" in uri:  # the count, kept in the run's report folder
            raise Exception("503 Backend Error")  # not an OSError
        return exists(uri)

    monkeypatch.setattr(rebalance.storage, "exists", unreachable)
    last = stages.replicate_datasets(copies, final=True, run_id="counted", ctx=ctx)
    assert [c["bytes_copied"] for c in last["done"]] == [8000] and last["failed"] == []


def test_the_review_judges_a_reservation_by_its_gpu_types_shares(ctx):
    """``plan`` steers a run by its GPU type's shares: an A100 run in us-east1 is outside an
    assignment that gives the team's A100s to europe-west4 only, although the team as a whole
    keeps half its demand in us-east1 (for its T4s)."""
    from sailor_tasks import stages
    from sailor_tasks.model import Reservation

    for run_id, gpu in (("a100-run", "A100"), ("t4-run", "T4")):
        ctx.ledger.upsert_run(
            run_id, job_name="j", team="t", status="running", backend="local", model="tiny_gpt",
            dataset_uri="sailor://source/d", request={},
        )  # fmt: skip
        ctx.ledger.reserve(Reservation(run_id, "us-east1", "us-east1-b", gpu, 8, "spot"))
    ctx.ledger.publish_assignment(
        {"t": {"us-east1": 0.5, "europe-west4": 0.5}},
        source="sailor_rebalance/x",
        region_load={},
        gpu_shares={"t": {"A100": {"europe-west4": 1.0}, "T4": {"us-east1": 1.0}}},
    )
    review = stages.review_assignment(ctx=ctx)
    assert [(o["run_id"], o["assigned_regions"]) for o in review["outside"]] == [
        ("a100-run", ["europe-west4"])
    ]


def test_storage_caps_and_team_priorities_reach_the_problem_and_bad_ones_are_refused(ctx):
    from sailor_tasks import stages
    from sailor_tasks.errors import InvalidRequestError

    now = _demand(ctx)
    util = stages.collect_utilization(
        7.0, as_of=now.isoformat(), ctx=ctx, storage_cap_gb={"us-east1": 2.5}, team_priority={"t": 3}
    )
    assert util["problem"]["storage_cap_bytes"] == {"us-east1": 2.5e9}
    assert [team["priority"] for team in util["problem"]["teams"]] == [3.0]
    with pytest.raises(
        InvalidRequestError, match=r"storage_cap_gb\['us-eastl'\]=1: not a region of the supply.*us-east1"
    ):
        stages.collect_utilization(7.0, as_of=now.isoformat(), ctx=ctx, storage_cap_gb={"us-eastl": 1})
    with pytest.raises(InvalidRequestError, match=r"team_priority\['t'\]=0: need a finite weight > 0"):
        stages.collect_utilization(7.0, as_of=now.isoformat(), ctx=ctx, team_priority={"t": 0})
