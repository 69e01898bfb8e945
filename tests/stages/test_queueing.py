"""SAILOR's queue through the stages: a run that does not fit waits (not a failure), is admitted by
the policy when capacity frees (reserved in the admission's transaction), times out naming what it
waited for, meets or fails its latest start; leases are renewed or reclaimed."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest

from sailor_tasks import stages
from sailor_tasks.catalog import load_catalog
from sailor_tasks.errors import (
    DeadlineUnmeetableError,
    LeaseReclaimedError,
    NoFeasibleOfferError,
    QueueRejectedError,
    QueueTimeoutError,
    RunQueuedError,
)
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.settings import Settings

ZONE = "us-central1-a"


@pytest.fixture
def tight(ctx, tmp_path, demo_dataset):
    """A catalog whose only capacity is 2 T4 GPUs in one zone."""
    supply = tmp_path / "supply.yaml"
    supply.write_text(
        f"version: 1\ndefaults:\n  capacity_gpus: {{}}\n  preemption_rate_per_hour: {{T4: 0.0}}\nzones:\n  {ZONE}:\n    T4: {{capacity_gpus: 2}}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    return ctx


def submit(ctx, run_id, dataset, team="a", **params):
    request = stages.validate(
        {"dataset_uri": dataset, "num_workers": 2, "gpu_type": "T4", "team": team, **params}, run_id, ctx
    )
    return request


def test_an_admitted_plan_renews_its_lease_and_fails_when_its_reservation_is_gone(tight, demo_dataset):
    """The lease begins at the admission; the run's plan resumes after it (its trigger, a worker
    slot) and renews it. A lease the reconciler claimed meanwhile fails the plan there."""
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    for run_id in ("run-2", "run-3"):
        with pytest.raises(RunQueuedError):
            stages.plan(submit(ctx, run_id, demo_dataset, team="b"), run_id, ctx)
    stages.teardown("run-1", ctx)  # admits run-2
    admitted_at = ctx.ledger.reservation_leases()["run-2"]["expires_at"]
    time.sleep(0.05)
    assert stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)["zone"] == ZONE
    lease = ctx.ledger.reservation_leases()["run-2"]
    assert lease["expires_at"] > admitted_at and lease["holder"] == "plan (admitted)"

    stages.teardown("run-2", ctx)  # admits run-3
    assert ctx.ledger.queue_entry("run-3")["state"] == "admitted"
    # its plan resumes only after the lease ran out and the reconciler claimed it
    assert ctx.ledger.claim_expired("run-3", utcnow() + dt.timedelta(days=1))
    with pytest.raises(LeaseReclaimedError):
        stages.plan(submit(ctx, "run-3", demo_dataset, team="b"), "run-3", ctx)


def test_a_run_that_does_not_fit_waits_and_is_admitted_when_capacity_frees(tight, demo_dataset):
    ctx = tight
    first = stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    assert first["zone"] == ZONE
    assert ctx.ledger.queue_entry("run-1") is None  # it fitted: no queue involved

    request = submit(ctx, "run-2", demo_dataset, team="b")
    with pytest.raises(RunQueuedError) as queued:
        stages.plan(request, "run-2", ctx)
    assert queued.value.position == 1 and queued.value.recheck_at is not None
    entry = ctx.ledger.queue_entry("run-2")
    assert entry["state"] == "queued" and entry["position"] == 1
    assert "las" in entry["reason"] and entry["estimated_start_at"] is not None
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-1"]  # nothing held for run-2
    assert [(t["stage"], t["ok"]) for t in ctx.ledger.stage_timings("run-2")] == [
        ("validate", True),
        ("plan", True),
    ]

    out = stages.teardown("run-1", ctx)
    assert out["admitted"] == ["run-2"]
    entry = ctx.ledger.queue_entry("run-2")
    assert entry["state"] == "admitted" and entry["position"] is None
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-2"]
    assert ctx.ledger.get_run("run-2")["status"] == "planned"
    again = stages.plan(request, "run-2", ctx)  # the deferred plan resumes: the admitted placement
    assert json.loads(json.dumps(again)) == entry["placement"] and again["zone"] == ZONE
    assert any(line.startswith("market:") for line in again["explanation"])
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-2"]  # still one reservation


def test_new_runs_join_a_nonempty_queue_and_las_admits_the_team_below_its_share(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "a-1", demo_dataset, team="a"), "a-1", ctx)
    for run_id, team in (("a-2", "a"), ("b-1", "b")):
        with pytest.raises(RunQueuedError):
            stages.plan(submit(ctx, run_id, demo_dataset, team=team), run_id, ctx)
    positions = {e["run_id"]: e["position"] for e in ctx.ledger.queue_entries()}
    assert positions == {"b-1": 1, "a-2": 2}  # team a holds the capacity; b is below its share
    assert stages.teardown("a-1", ctx)["admitted"] == ["b-1"]
    assert ctx.ledger.queue_entry("a-2")["position"] == 1


def test_fifo_policy_admits_by_arrival(tight, demo_dataset, monkeypatch):
    monkeypatch.setenv("SAILOR_QUEUE_POLICY", "fifo")
    ctx = stages.StageContext(Settings.from_env())
    ctx.__dict__["catalog"] = tight.catalog
    stages.plan(submit(ctx, "a-1", demo_dataset, team="a"), "a-1", ctx)
    for run_id, team in (("a-2", "a"), ("b-1", "b")):
        with pytest.raises(RunQueuedError):
            stages.plan(submit(ctx, run_id, demo_dataset, team=team), run_id, ctx)
    assert stages.teardown("a-1", ctx)["admitted"] == ["a-2"]


def test_high_priority_is_admitted_first(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "a-1", demo_dataset), "a-1", ctx)
    for run_id, priority in (("b-low", "normal"), ("c-high", "high")):
        with pytest.raises(RunQueuedError):
            stages.plan(submit(ctx, run_id, demo_dataset, team="b", priority=priority), run_id, ctx)
    assert stages.teardown("a-1", ctx)["admitted"] == ["c-high"]


def test_a_run_times_out_after_max_queue_hours_naming_what_it_waited_for(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    request = submit(ctx, "run-2", demo_dataset, max_queue_hours=0.5)
    with pytest.raises(RunQueuedError):
        stages.plan(request, "run-2", ctx)
    out = stages.admit_queued(ctx, now=utcnow() + dt.timedelta(minutes=31))
    assert out["timed_out"] == ["run-2"]
    with pytest.raises(QueueTimeoutError, match=r"waited 0.5 h .*2x T4 GPUs in any region and") as err:
        stages.plan(request, "run-2", ctx)
    assert "None" not in str(err.value)  # no position left to name once it is out of the queue
    assert "in any region (queue position 1)" in ctx.ledger.queue_entry("run-2")["reason"]
    limited = submit(ctx, "run-3", demo_dataset, regions=["us-central1", "us-east1"], max_queue_hours=0.5)
    with pytest.raises(RunQueuedError):
        stages.plan(limited, "run-3", ctx)
    stages.admit_queued(ctx, now=utcnow() + dt.timedelta(minutes=31))
    with pytest.raises(QueueTimeoutError, match=r"2x T4 GPUs in us-central1,us-east1 and"):
        stages.plan(limited, "run-3", ctx)
    stages.teardown("run-1", ctx)  # capacity frees: a timed-out run is not admitted
    assert ctx.ledger.queue_entry("run-2")["state"] == "timed_out"
    assert ctx.ledger.live_reservations() == []


def test_max_queue_hours_zero_fails_at_once(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(QueueTimeoutError, match="2x T4"):
        stages.plan(submit(ctx, "run-2", demo_dataset, max_queue_hours=0), "run-2", ctx)
    assert ctx.ledger.queue_entry("run-2") is None


def test_a_run_larger_than_any_zone_fails_at_once_and_holds_back_nobody(tight, demo_dataset):
    """Waiting cannot help a run that needs more GPUs than the zone has at all: validate refuses
    it, and so does plan (the supply may have shrunk since validate) without queueing it, so it
    holds back no later T4 run."""
    from sailor_tasks.errors import InvalidRequestErrors
    from sailor_tasks.model import to_dict
    from sailor_tasks.request import from_params

    ctx = tight
    too_big = rf"4 GPUs are more than any zone has.*: the largest, {ZONE}, has 2 T4"
    with pytest.raises(InvalidRequestErrors, match=rf"num_workers=4: .*{too_big}"):
        submit(ctx, "big", demo_dataset, num_workers=4)
    assert ctx.ledger.get_run("big")["status"] == "rejected"
    params = {"dataset_uri": demo_dataset, "num_workers": 4, "gpu_type": "T4", "team": "a"}
    with pytest.raises(NoFeasibleOfferError, match=too_big):
        stages.plan(to_dict(from_params(params, ctx.catalog)), "big-2", ctx)
    assert ctx.ledger.queue_entry("big-2") is None
    placed = stages.plan(submit(ctx, "run-1", demo_dataset, team="b"), "run-1", ctx)
    assert placed["zone"] == ZONE and ctx.ledger.queue_entry("run-1") is None
    with pytest.raises(RunQueuedError):  # full for now: this one does wait
        stages.plan(submit(ctx, "run-2", demo_dataset), "run-2", ctx)


def test_max_queue_hours_zero_is_placed_when_it_fits_although_others_wait(ctx, tmp_path, demo_dataset):
    """Runs waiting for T4 do not make a V100 run that fits fail: it gets its arrival pass."""
    supply = tmp_path / "supply.yaml"
    supply.write_text(
        "version: 1\ndefaults:\n  capacity_gpus: {}\n  preemption_rate_per_hour: {T4: 0.0, V100: 0.0}\nzones:\n"
        f"  {ZONE}:\n    T4: {{capacity_gpus: 2}}\n    V100: {{capacity_gpus: 2}}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)
    v100 = submit(ctx, "v100", demo_dataset, gpu_type="V100", max_queue_hours=0)
    assert stages.plan(v100, "v100", ctx)["gpu_type"] == "V100"
    assert ctx.ledger.queue_entry("v100")["state"] == "admitted"
    # One that does not fit times out in that same pass, and stays out of the queue.
    with pytest.raises(QueueTimeoutError, match="2x T4"):
        stages.plan(submit(ctx, "t4-now", demo_dataset, max_queue_hours=0), "t4-now", ctx)
    assert ctx.ledger.queue_entry("t4-now")["state"] == "timed_out"
    assert [e["run_id"] for e in ctx.ledger.queue_entries(("queued",))] == ["run-2"]


def test_a_deadline_that_cannot_be_met_fails_early(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    request = submit(ctx, "run-2", demo_dataset, deadline_hours=2.0)
    with pytest.raises(RunQueuedError):
        stages.plan(request, "run-2", ctx)
    entry = ctx.ledger.queue_entry("run-2")
    latest = entry["latest_start_at"]
    assert latest < entry["deadline_at"]
    hours = (entry["deadline_at"] - latest).total_seconds() / 3600.0
    assert hours == pytest.approx(entry["expected_hours"], rel=1e-6)
    # Past its latest start with the capacity still held: it fails now, before the deadline.
    out = stages.admit_queued(ctx, now=latest + dt.timedelta(seconds=1))
    assert out["failed"] == ["run-2"]
    with pytest.raises(QueueRejectedError, match="cannot meet its deadline"):
        stages.plan(request, "run-2", ctx)
    assert ctx.ledger.queue_entry("run-2")["deadline_at"] > latest


def test_a_deadline_shorter_than_the_run_fails_on_arrival(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    # validate refuses a deadline shorter than any run can take; planning's own deadline rule
    # still refuses every offer to a request that reaches it: no queueing for a hopeless run.
    with pytest.raises(NoFeasibleOfferError, match="deadline: 102"):
        stages.plan({**submit(ctx, "run-2", demo_dataset), "deadline_hours": 0.001}, "run-2", ctx)
    assert ctx.ledger.queue_entry("run-2") is None
    # Runs are waiting: the run is checked against its latest start when it would join them.
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-3", demo_dataset), "run-3", ctx)
    with pytest.raises(DeadlineUnmeetableError, match="had to start by"):
        stages.plan({**submit(ctx, "run-4", demo_dataset), "deadline_hours": 0.001}, "run-4", ctx)
    assert ctx.ledger.queue_entry("run-4") is None


def test_an_expired_lease_is_reclaimed_and_the_queue_moves_on(tight, demo_dataset):
    ctx = tight
    request = submit(ctx, "run-1", demo_dataset)
    placement = stages.plan(request, "run-1", ctx)
    stages.provision(request, placement, "run-1", ctx)  # the local backend's cluster record
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)

    lease = ctx.ledger.reservation_leases()["run-1"]
    assert lease["holder"] == "provision"
    # Before expiry nothing is touched.
    assert stages.reconcile(ctx, now=lease["expires_at"] - dt.timedelta(seconds=1))["reclaimed"] == []
    # A renewal moves the expiry forward: the old expiry no longer reclaims it.
    assert ctx.ledger.renew_reservation_lease("run-1", ctx.settings.lease_s, "heartbeat")
    renewed = ctx.ledger.reservation_leases()["run-1"]["expires_at"]
    assert renewed >= lease["expires_at"]
    out = stages.reconcile(ctx, now=renewed + dt.timedelta(seconds=1))
    assert out["reclaimed"] == ["run-1"] and out["admission"]["admitted"] == ["run-2"]
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-2"]
    assert ctx.ledger.get_run("run-1")["status"] == "failed"
    assert "lease expired" in ctx.ledger.get_run("run-1")["error"]
    assert not os.path.exists(os.path.join(ctx.settings.clusters_dir, "run-1.json"))
    assert not ctx.ledger.renew_reservation_lease("run-1")  # reclaimed: nothing to renew
    # The killed run's retried stages may not use capacity that is no longer its own.
    with pytest.raises(LeaseReclaimedError, match="reclaimed at .* after its lease expired"):
        stages.place_data(request, placement, "run-1", ctx)
    with pytest.raises(LeaseReclaimedError):
        stages.train(request, placement, {"data_uri": "x"}, "run-1", ctx)


def test_the_deferred_trains_launch_renews_the_lease_while_it_works(tight, demo_dataset, monkeypatch):
    """Beginning a deferred attempt can take long (a recovery copies the checkpoint to its new
    region): the lease is renewed meanwhile, as every stage that holds a task while it works."""
    import dataclasses
    import importlib
    import time

    train_stage = importlib.import_module("sailor_tasks.stages.train")  # the module, not the stage

    ctx = tight
    ctx.__dict__["settings"] = dataclasses.replace(ctx.settings, lease_s=3)  # a beat every second
    request = submit(ctx, "run-1", demo_dataset)
    placement = stages.plan(request, "run-1", ctx)
    stages.provision(request, placement, "run-1", ctx)
    seen = []

    def slow_begin(*args, **kwargs):
        seen.append(ctx.ledger.reservation_leases()["run-1"]["renewed_at"])
        time.sleep(2.5)
        seen.append(ctx.ledger.reservation_leases()["run-1"]["renewed_at"])
        return "attempt"

    monkeypatch.setattr(train_stage, "begin_attempt", slow_begin)
    assert train_stage.launch_train(request, placement, {"data_uri": "x"}, "run-1", ctx) == "attempt"
    assert seen[1] > seen[0]


@pytest.mark.parametrize("ending", ["admitted", "timed_out"])
def test_a_run_whose_tasks_are_cleared_goes_through_the_queue_afresh(tight, demo_dataset, ending):
    """Clearing a task of an ended run re-runs its setups (validate, plan): the queue's verdict
    on the earlier pass (an admission whose capacity teardown released, a time-out) is spent,
    and plan reserves anew instead of returning a placement nothing holds or failing again."""
    ctx = tight
    params = {"dataset_uri": demo_dataset, "num_workers": 2, "gpu_type": "T4", "team": "b"}
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    request = stages.validate(params, "run-2", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(request, "run-2", ctx)
    if ending == "admitted":
        assert stages.teardown("run-1", ctx)["admitted"] == ["run-2"]
        stages.plan(request, "run-2", ctx)  # the deferred plan resumes with the admission
    else:
        later = utcnow() + dt.timedelta(hours=request["max_queue_hours"] + 1)
        assert stages.admit_queued(ctx, now=later)["timed_out"] == ["run-2"]
        with pytest.raises(QueueTimeoutError):
            stages.plan(request, "run-2", ctx)
        stages.teardown("run-1", ctx)
    stages.teardown("run-2", ctx)
    assert ctx.ledger.live_reservations() == []

    request = stages.validate(params, "run-2", ctx)  # the user clears the run's failed task
    placement = stages.plan(request, "run-2", ctx)
    assert [(r.run_id, r.zone) for r in ctx.ledger.live_reservations()] == [("run-2", placement["zone"])]
    assert ctx.ledger.get_run("run-2")["status"] == "planned"


def test_a_cleared_run_planned_into_another_region_trains_there(ctx, tmp_path, demo_dataset, monkeypatch):
    """Its first attempt failed and the run ended; other runs took that zone; the user clears
    the failed task: plan reserves the other region, and the next attempt trains there (with
    the last attempt's checkpoint copied over), not where the last attempt ran."""
    from sailor_tasks import storage
    from sailor_tasks.backends.local import LocalBackend
    from sailor_tasks.errors import TrainingFailedError
    from sailor_tasks.train.checkpoint.store import CheckpointStore
    from sailor_tasks.train.config import TrainConfig

    supply = tmp_path / "supply.yaml"
    supply.write_text(
        "version: 1\ndefaults:\n  capacity_gpus: {}\n  preemption_rate_per_hour: {T4: 0.0, V100: 0.0}\nzones:\n"
        "  us-central1-a:\n    T4: {capacity_gpus: 2}\n  us-east1-b:\n    T4: {capacity_gpus: 2}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    params = {"dataset_uri": demo_dataset, "num_workers": 2, "gpu_type": "T4", "total_steps": 4}
    params["checkpoint_every_steps"] = 2
    launched, resumed = [], []

    def fake_train(self, launch):
        launched.append(launch.placement.zone)
        config = TrainConfig.from_json(storage.read_bytes(launch.config_uri).decode())
        store = CheckpointStore(config.checkpoint_uri)
        if len(launched) == 1:  # it saved step 2, then the user's code crashed
            storage.write_bytes(storage.join(store.step_uri(2), ".metadata"), b"step 2")
            store.commit(2)
            return 1
        resumed.append(store.latest_valid_step())
        storage.write_json(
            config.result_uri,
            {"run_id": launch.run_id, "status": "completed", "step": 4, "total_steps": 4,
             "resumed_from_step": None, "initial_loss": 2.0, "final_loss": 1.0, "checkpoint_uri": None,
             "samples_per_s": 1.0, "wall_s": 1.0, "world_size": 2},
        )  # fmt: skip
        return 0

    monkeypatch.setattr(LocalBackend, "train", fake_train)

    def through_train(run_id, params):
        request = stages.validate(params, run_id, ctx)
        placement = stages.plan(request, run_id, ctx)
        data = stages.place_data(request, placement, run_id, ctx)
        stages.provision(request, placement, run_id, ctx)
        return placement, stages.train(request, placement, data, run_id, ctx)

    with pytest.raises(TrainingFailedError):
        through_train("run-1", params)
    first = launched[0]
    stages.teardown("run-1", ctx)
    region = "us-central1" if first == "us-central1-a" else "us-east1"
    stages.plan(stages.validate({**params, "regions": [region]}, "other", ctx), "other", ctx)  # takes it

    placement, result = through_train("run-1", params)  # the user clears run-1's failed task
    assert placement["zone"] != first and launched[1] == placement["zone"]
    assert resumed == [2]  # the checkpoint moved with it
    assert result["status"] == "completed"
    assert [a["placement"]["zone"] for a in ctx.ledger.attempts("run-1")] == [first, placement["zone"]]


def test_a_plan_retried_after_the_run_was_reclaimed_reserves_nothing(tight, demo_dataset):
    """plan's first try reserved, then its task died; the reconciler reclaimed the lease and
    ended the run before Airflow's retry of plan came: the retry may not bring the run back."""
    from sailor_tasks.errors import ReservationReleasedError

    ctx = tight
    request = submit(ctx, "run-1", demo_dataset)
    stages.plan(request, "run-1", ctx)
    expired = ctx.ledger.reservation_leases()["run-1"]["expires_at"] + dt.timedelta(seconds=1)
    assert stages.reconcile(ctx, now=expired)["reclaimed"] == ["run-1"]
    with pytest.raises(ReservationReleasedError, match=r"the run ended \(failed\) before this plan ran"):
        stages.plan(request, "run-1", ctx)
    run = ctx.ledger.get_run("run-1")
    assert run["status"] == "failed" and "lease expired" in run["error"]
    assert ctx.ledger.live_reservations() == []


def test_a_reclaim_whose_backend_cleanup_fails_keeps_the_capacity_and_fails_the_pass(
    tight, demo_dataset, monkeypatch
):
    """The reconciler cannot remove what the run left (its backend refuses): the capacity stays
    held, and the pass fails naming the run (the task shows red; the next pass retries)."""
    from sailor_tasks.backends.local import LocalBackend
    from sailor_tasks.errors import ReconcileIncompleteError

    ctx = tight
    request = submit(ctx, "run-1", demo_dataset)
    stages.provision(request, stages.plan(request, "run-1", ctx), "run-1", ctx)

    real, refusing = LocalBackend.teardown, [True]

    def refused(self, run_key):
        if refusing:
            raise PermissionError("cluster API refused the delete")
        return real(self, run_key)

    monkeypatch.setattr(LocalBackend, "teardown", refused)
    expired = ctx.ledger.reservation_leases()["run-1"]["expires_at"] + dt.timedelta(seconds=1)
    with pytest.raises(ReconcileIncompleteError, match="run-1: PermissionError: cluster API refused") as info:
        stages.reconcile(ctx, now=expired)
    assert info.value.result["reclaimed"] == [] and info.value.result["errors"]
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-1"]
    refusing.clear()
    assert stages.reconcile(ctx, now=expired)["reclaimed"] == ["run-1"]  # the next pass


def test_a_training_stopped_by_the_reconciler_stays_failed_not_cancelled(tight, demo_dataset, monkeypatch):
    """The reconciler stops a run whose lease expired (the local backend's cancel) while its train
    task still runs: the task ends the attempt as failed and raises LeaseReclaimedError; the
    run keeps the reconciler's end, not ``cancelled``."""
    from sailor_tasks import paths, storage
    from sailor_tasks.backends.local import LocalBackend

    ctx = tight
    request = submit(ctx, "run-1", demo_dataset, num_workers=1, total_steps=4, checkpoint_every_steps=2)
    placement = stages.plan(request, "run-1", ctx)
    data = stages.place_data(request, placement, "run-1", ctx)
    stages.provision(request, placement, "run-1", ctx)

    def reclaimed_while_training(self, launch):
        expires = ctx.ledger.reservation_leases()["run-1"]["expires_at"]
        assert stages.reconcile(ctx, now=expires + dt.timedelta(seconds=1))["reclaimed"] == ["run-1"]
        # What train reports for workers its cancel stopped.
        storage.write_json(paths.launch_report_uri(launch.run_folder), {"cancelled": True, "step": 2})
        return -9

    monkeypatch.setattr(LocalBackend, "train", reclaimed_while_training)
    with pytest.raises(LeaseReclaimedError):
        stages.train(request, placement, data, "run-1", ctx)
    run = ctx.ledger.get_run("run-1")
    assert run["status"] == "failed" and "lease expired" in run["error"]
    assert ctx.ledger.attempts("run-1")[-1]["outcome"] == "failed"


def test_a_data_copy_longer_than_the_lease_keeps_the_run_leased(tight, demo_dataset, monkeypatch):
    """place_data holds its task while it copies: it renews the lease every third of ``lease_s``
    (as train does), so a copy longer than the lease is not reclaimed under it."""
    import time

    from sailor_tasks.stages import StageContext, prepare

    monkeypatch.setenv("SAILOR_LEASE_S", "3")  # the shortest lease: a beat every second
    ctx = StageContext(Settings.from_env())
    ctx.__dict__["catalog"] = tight.catalog
    assert ctx.settings.lease_s == 3
    request = submit(ctx, "run-1", demo_dataset)
    placement = stages.plan(request, "run-1", ctx)
    planned = ctx.ledger.reservation_leases()["run-1"]
    real_copy = prepare.copy_dataset
    seen = {}

    def slow_copy(*args, **kwargs):
        time.sleep(6.5)  # more than twice the lease
        seen["lease"] = ctx.ledger.reservation_leases()["run-1"]
        seen["reconcile"] = stages.reconcile(ctx)  # the real clock: nothing expired
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(prepare, "copy_dataset", slow_copy)
    stages.place_data(request, placement, "run-1", ctx)
    assert seen["reconcile"]["reclaimed"] == []
    assert seen["lease"]["renewed_at"] > planned["renewed_at"] + dt.timedelta(seconds=2)
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-1"]


def test_teardown_of_a_queued_run_takes_it_out_of_the_queue(tight, demo_dataset):
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset), "run-2", ctx)
    out = stages.teardown("run-2", ctx)
    assert out["left_queue"] and not out["reservation_released"]
    assert ctx.ledger.queue_entry("run-2")["state"] == "left"
    assert stages.teardown("run-1", ctx)["admitted"] == []


@pytest.mark.parametrize("failures", [1, 3])
def test_a_queued_run_whose_teardown_could_not_leave_the_queue_is_never_admitted(
    tight, demo_dataset, monkeypatch, failures
):
    """Teardown retries taking the run out of the queue; if the ledger refuses every try, the
    next admission pass finds the run ended and takes its entry out instead of reserving for it."""
    import importlib

    monkeypatch.setattr(importlib.import_module("sailor_tasks.stages.train"), "TEARDOWN_BACKOFF_S", 0.0)
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)
    real, tries = ctx.ledger.end_queue_entry, []

    def flaky(*args, **kwargs):
        tries.append(args)
        if len(tries) <= failures:
            raise OSError("ledger unreachable")
        return real(*args, **kwargs)

    monkeypatch.setattr(ctx.ledger, "end_queue_entry", flaky)
    out = stages.teardown("run-2", ctx)
    assert out["left_queue"] is (failures < 3)  # 3 tries
    assert ctx.ledger.get_run("run-2")["status"] == "failed"
    assert stages.teardown("run-1", ctx)["admitted"] == []  # the capacity frees
    entry = ctx.ledger.queue_entry("run-2")
    assert entry["state"] == "left" and (failures < 3 or "had ended (failed)" in entry["reason"])
    assert ctx.ledger.get_run("run-2")["status"] == "failed"
    assert [r.run_id for r in ctx.ledger.live_reservations()] == []


def test_a_queued_run_torn_down_while_another_frees_capacity_is_not_left_holding_it(
    tight, demo_dataset, monkeypatch
):
    """Another run's teardown (another worker) runs its admission pass while this run's teardown
    runs: the cancelled run must not end up admitted and holding GPUs for a dag run that is over."""
    from sailor_tasks.stages import queueing

    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)
    leave = queueing.leave_queue
    concurrent = {}

    def leave_while_run_1_ends(ctx_, run_id, reason):
        if run_id == "run-2" and not concurrent:
            concurrent.update(stages.teardown("run-1", ctx_))
        return leave(ctx_, run_id, reason)

    monkeypatch.setattr(queueing, "leave_queue", leave_while_run_1_ends)
    stages.teardown("run-2", ctx)
    assert concurrent["admitted"] == ["run-2"]  # the race did happen
    assert ctx.ledger.live_reservations() == []
    assert ctx.ledger.get_run("run-2")["status"] == "failed"


def test_the_run_summary_shows_the_wait(tight, demo_dataset):
    from sailor_tasks.stages.summary import queue_wait, render_summary

    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset), "run-2", ctx)
    stages.teardown("run-1", ctx)
    assert queue_wait(ctx, "run-1") is None
    wait = queue_wait(ctx, "run-2")
    entry = ctx.ledger.queue_entry("run-2")
    assert wait["state"] == "admitted" and wait["policy"] == "las"
    assert wait["wait_s"] == round((entry["admitted_at"] - entry["enqueued_at"]).total_seconds(), 1)
    base = {
        "run_id": "run-2",
        "job_name": "j",
        "team": "a",
        "status": "success",
        "region": "us-central1",
        "zone": ZONE,
        "num_gpus": 2,
        "gpu_type": "T4",
        "market": "spot",
        "usd_per_hour": 1.0,
        "why": [],
        "data_bytes": 1e6,
        "data_uri": "x",
        "steps": 10,
        "train_wall_s": 1.0,
        "samples_per_s": 1.0,
        "initial_loss": 2.0,
        "final_loss": 1.0,
        "checkpoint_uri": "c",
        "usd_estimate": 0.1,
    }
    assert f"- **Queue**: waited {wait['wait_s']:.1f} s (las; admitted)" in render_summary(
        {**base, "queue": wait}
    )
    assert "- **Queue**: none (it fitted at once)" in render_summary({**base, "queue": None})
    # The loss's change in words (none for a diverged run), and a recovered run's training line.
    for initial, final, said in (
        (2.0, 1.0, "(50% lower)"),
        (2.0, 3.0, "(50% higher)"),
        (2.0, 0.0, "(100% lower)"),
        (2.0, float("nan"), "(change n/a)"),
        (0.0, 1.0, "(change n/a)"),
    ):
        assert said in render_summary({**base, "initial_loss": initial, "final_loss": final})
    recovered = render_summary({**base, "attempts": ["attempt 1 ...", "attempt 2 ..."]})
    assert "- **Training**: 10 steps over 2 attempts, the last 1.0 s (1 samples/s)" in recovered
    assert "(each attempt's price × its training wall time)" in recovered


def test_the_nightly_utilization_counts_in_flight_and_queued_demand(tight, demo_dataset):
    ctx = tight
    request = submit(ctx, "run-1", demo_dataset, team="a")
    placement = stages.plan(request, "run-1", ctx)
    ctx.ledger.start_attempt("run-1", 1, 1, placement, {})  # training now, no utilization row yet
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)
    until = (utcnow() + dt.timedelta(hours=1)).isoformat()
    out = stages.collect_utilization(1.0, as_of=until, ctx=ctx)
    assert out["in_flight_gpu_hours"] == pytest.approx(2.0, rel=0.01)  # 2 GPUs for about an hour
    assert out["queued_gpu_hours"] == pytest.approx(2.0, rel=0.01)
    teams = {t["name"]: t["current"] for t in out["problem"]["teams"]}
    # Mean concurrent GPUs over the 24 h window, in the zone's region where the run waits.
    assert teams["a"]["us-central1"]["T4"] == pytest.approx(2.0 / 24, rel=0.01)
    assert teams["b"]["us-central1"]["T4"] == pytest.approx(2.0 / 24, rel=0.01)
    # A run whose lease is reclaimed ends its attempt: it is no longer in flight.
    lease = ctx.ledger.reservation_leases()["run-1"]["expires_at"]
    stages.reconcile(ctx, now=lease + dt.timedelta(seconds=1))
    assert [a["outcome"] for a in ctx.ledger.attempts("run-1")] == ["failed"]
    assert stages.collect_utilization(1.0, as_of=until, ctx=ctx)["in_flight_gpu_hours"] == 0


def test_duration_estimates_learn_from_past_attempts_on_the_same_backend(tight, demo_dataset):
    from sqlalchemy import update

    from sailor_tasks.ledger import schema as t
    from sailor_tasks.model import JobRequest, from_dict
    from sailor_tasks.stages.queueing import expected_hours, learned_hours

    ctx = tight
    req = from_dict(JobRequest, submit(ctx, "new", demo_dataset, total_steps=600))
    engine_only = expected_hours(ctx, req)
    assert learned_hours(ctx, req) is None  # nothing learned yet: the placement engine's estimate
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, (steps, seconds) in enumerate(((100, 50.0), (90, 30.0), (100, 25.0))):  # 2, 3 and 4 steps/s
        run_id = f"past-{i}"
        request = submit(ctx, run_id, demo_dataset)
        placement = {"gpu_type": "T4", "num_gpus": 2, "market": "spot", "region": "us-central1", "zone": ZONE}
        ctx.ledger.start_attempt(run_id, 1, 1, placement, {})
        ctx.ledger.end_attempt(run_id, 1, "completed", step=steps + 10, resumed_from_step=10)
        with ctx.ledger.engine.begin() as c:
            c.execute(
                update(t.run_attempts)
                .where(t.run_attempts.c.run_id == run_id)
                .values(started_at=start, ended_at=start + dt.timedelta(seconds=seconds))
            )
        assert request["backend"] == "local"
    assert learned_hours(ctx, req) == pytest.approx(600 / 3.0 / 3600.0)  # the median speed
    assert expected_hours(ctx, req) == pytest.approx(600 / 3.0 / 3600.0, abs=0.01)
    assert engine_only != pytest.approx(expected_hours(ctx, req), abs=0.001)
    other = from_dict(JobRequest, submit(ctx, "other", demo_dataset, model="small_gpt"))
    assert learned_hours(ctx, other) is None  # another workload learns nothing from these
    # A deadline run's latest start must allow for its fastest offer: a learned speed slower than
    # the engine's estimate of it does not move the latest start earlier.
    import dataclasses

    slow = dataclasses.replace(req, total_steps=60_000)  # 5.6 h at the learned 3 steps/s
    deadline = dataclasses.replace(slow, deadline_hours=48.0)
    assert learned_hours(ctx, deadline) == learned_hours(ctx, slow) == pytest.approx(60_000 / 3.0 / 3600.0)
    assert expected_hours(ctx, slow) == pytest.approx(60_000 / 3.0 / 3600.0, abs=0.01)
    assert expected_hours(ctx, deadline) < expected_hours(ctx, slow)  # the engine's, faster


def test_a_relaunch_is_planned_for_the_work_and_the_time_left(ctx, demo_dataset):
    import dataclasses

    from sailor_tasks.model import ClusterState, JobRequest, to_dict
    from sailor_tasks.placement import explain
    from sailor_tasks.placement.validators import RESTART_HOURS
    from sailor_tasks.stages.queueing import reserve_placement

    base = JobRequest(
        job_name="x",
        team="t",
        dataset_uri=demo_dataset,
        model="tiny_gpt",
        num_workers=8,
        gpu_type="H100",
        total_steps=2_000_000,
        checkpoint_every_steps=1000,
        strategy="on_demand",
        market="on_demand",
        max_usd_per_hour=1000.0,
    )
    hours = explain(base, ctx.catalog, ClusterState())["winner"]["expected_hours"]
    req = dataclasses.replace(base, deadline_hours=round(hours + RESTART_HOURS + 0.03, 3))  # 0.03 h spare
    ctx.ledger.upsert_run(
        "run-1", job_name="x", team="t", status="validated", backend="local", model="tiny_gpt",
        dataset_uri=demo_dataset, request=to_dict(req), total_steps=req.total_steps,
    )  # fmt: skip
    first = reserve_placement(ctx, req, "run-1")
    # Preempted at 90 %, its region blocked: the tenth left fits the time left in another region
    # (the whole run would not fit the whole deadline there).
    zones = frozenset(o.zone for o in ctx.catalog.offers if o.region == first.region)
    moved = reserve_placement(
        ctx, req, "run-1", attempt=2, blocked_zones=zones, elapsed_h=0.7, steps_done=1_800_000,
        checkpoint=(first.region, 10**11),
    )  # fmt: skip
    assert moved.region != first.region
    # With the deadline all but gone, the rest runs as soon as it can, and the plan says so.
    late = reserve_placement(ctx, req, "run-1", attempt=3, elapsed_h=req.deadline_hours - 0.01, steps_done=1)
    assert "before the deadline: relaunched without it (best effort)" in late.explanation[-1]


def test_a_run_torn_down_right_after_its_admission_keeps_its_final_status(tight, demo_dataset, monkeypatch):
    """The run's teardown runs after an admission pass reserved its capacity but before the pass
    recorded the placement: the pass must not turn the ended run back into ``planned``."""
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)
    record = ctx.ledger.record_placement
    concurrent = {}

    def record_after_teardown(placement, attempt=1):
        if placement.run_id == "run-2" and not concurrent:
            concurrent.update(stages.teardown("run-2", ctx))
        return record(placement, attempt)

    monkeypatch.setattr(ctx.ledger, "record_placement", record_after_teardown)
    out = stages.teardown("run-1", ctx)
    assert concurrent["reservation_released"] and not concurrent["left_queue"]  # the race did happen
    assert ctx.ledger.get_run("run-2")["status"] == "failed"
    assert ctx.ledger.live_reservations() == []
    assert out["admitted"] == []  # it ended before its admission was recorded


def test_a_retried_plan_of_a_placed_run_keeps_its_capacity_instead_of_queueing(tight, demo_dataset):
    """run-1 was placed without waiting; its plan task is retried (its worker died after the
    reservation) while run-2 waits: run-1 re-plans in its own capacity, and does not queue behind
    run-2 holding GPUs that neither could then use."""
    ctx = tight
    request = submit(ctx, "run-1", demo_dataset)
    first = stages.plan(request, "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)

    again = stages.plan(request, "run-1", ctx)
    assert again["zone"] == first["zone"] == ZONE
    assert ctx.ledger.queue_entry("run-1") is None
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-1"]  # replaced, not doubled
    assert ctx.ledger.get_run("run-1")["status"] == "planned"
    assert ctx.ledger.queue_entry("run-2")["state"] == "queued"
    assert stages.teardown("run-1", ctx)["admitted"] == ["run-2"]


def test_a_lease_expiring_after_training_completed_does_not_fail_the_run(tight, demo_dataset):
    """Training completed; the lease then expired before finalize ran (a slow scheduler): the
    reconciler reclaims the capacity, which nothing uses any more, but does not fail the run, and
    finalize records a success with no error."""
    ctx = tight
    request = submit(ctx, "run-1", demo_dataset, num_workers=1, total_steps=4, checkpoint_every_steps=2)
    placement = stages.plan(request, "run-1", ctx)
    data = stages.place_data(request, placement, "run-1", ctx)
    stages.provision(request, placement, "run-1", ctx)
    result = stages.train(request, placement, data, "run-1", ctx)

    expires = ctx.ledger.reservation_leases()["run-1"]["expires_at"]
    assert stages.reconcile(ctx, now=expires + dt.timedelta(seconds=1))["reclaimed"] == ["run-1"]
    run = ctx.ledger.get_run("run-1")
    assert run["status"] == "running" and run["error"] is None
    # the train try's worker died before it reported: its retry returns the result all the same
    assert stages.train(request, placement, data, "run-1", ctx, try_number=2)["step"] == result["step"]
    summary = stages.finalize(request, placement, data, result, "run-1", ctx)
    run = ctx.ledger.get_run("run-1")
    assert summary["status"] == run["status"] == "success" and run["error"] is None
    assert stages.teardown("run-1", ctx)["reservation_released"] is False
    assert ctx.ledger.get_run("run-1")["status"] == "success"


def test_finalize_clears_an_error_an_earlier_try_left(ctx, demo_dataset):
    request = stages.validate(
        {"dataset_uri": demo_dataset, "num_workers": 1, "total_steps": 2, "checkpoint_every_steps": 2},
        "run-e",
        ctx,
    )
    placement = stages.plan(request, "run-e", ctx)
    data = stages.place_data(request, placement, "run-e", ctx)
    stages.provision(request, placement, "run-e", ctx)
    result = stages.train(request, placement, data, "run-e", ctx)
    ctx.ledger.upsert_run("run-e", error="place_data: ConnectionError (try 1 of 3)")
    stages.finalize(request, placement, data, result, "run-e", ctx)
    run = ctx.ledger.get_run("run-e")
    assert run["status"] == "success" and run["error"] is None


def test_a_retried_teardown_runs_the_admission_pass_its_first_try_did_not(tight, demo_dataset):
    """teardown's first try released run-1 and died before its admission pass: the retry, which
    finds nothing left to release, still admits run-2 rather than leave it to its next re-check."""
    ctx = tight
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", demo_dataset, team="b"), "run-2", ctx)
    assert ctx.ledger.release("run-1")  # the first try's release, then its worker was lost
    out = stages.teardown("run-1", ctx)
    assert out["reservation_released"] is False and out["admitted"] == ["run-2"]
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-2"]


def test_a_queued_deadline_run_is_rechecked_when_it_turns_urgent_then_at_its_latest_start():
    """Not every 5 s through the urgent window: each re-check is a worker slot and a full pass."""
    import datetime as dt

    from sailor_tasks.ledger.store import utcnow
    from sailor_tasks.stages.queueing import RECHECK_S, _queued_error

    def next_check(minutes_to_latest: float) -> float:
        now = utcnow()
        entry = {
            "run_id": "r",
            "latest_start_at": now + dt.timedelta(minutes=minutes_to_latest),
            "max_wait_until": now + dt.timedelta(hours=5),
            "position": 1,
            "reason": "fifo: by arrival",
        }
        return (dt.datetime.fromisoformat(_queued_error(entry).recheck_at) - now).total_seconds()

    assert next_check(60) == pytest.approx(RECHECK_S, abs=2)  # far from it: the usual re-check
    assert next_check(7) == pytest.approx(120, abs=2)  # when it turns urgent (5 min before)
    assert next_check(4) == pytest.approx(241, abs=2)  # urgent: at its latest start
    assert next_check(0.02) == pytest.approx(5, abs=1)  # never sooner than 5 s


def test_the_reconcilers_admission_pass_reads_the_clock_when_it_runs(ctx, monkeypatch):
    """Stopping and removing what expired runs left takes minutes on GKE: the pass after it must
    not judge time-outs, latest starts and deadlines on the clock read before that."""
    import datetime as dt

    from sailor_tasks.stages import queueing

    passes = []
    monkeypatch.setattr(queueing, "admit_queued", lambda c, now=None, **kw: passes.append(now) or {})
    monkeypatch.setattr(ctx.ledger, "queue_entries", lambda states=None: [{"run_id": "waiting"}])
    queueing.reconcile(ctx)
    given = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)
    queueing.reconcile(ctx, now=given)
    assert passes == [None, given]  # None: admit_queued reads the clock itself


def test_a_queued_run_that_cannot_be_tried_waits_and_the_pass_goes_on(tight, demo_dataset, settings):
    """run-2's dataset manifest turns unreadable while it waits: trying it raises. The pass tries
    the others all the same (run-3 waits behind run-1, its own plan is not failed; the teardown
    of run-1 admits run-3), and run-2 stays queued for a later pass."""
    from sailor_tasks import storage
    from sailor_tasks.data.demo import write_demo_dataset
    from sailor_tasks.data.manifest import manifest_uri

    ctx = tight
    other = "sailor://source/other-corpus"
    write_demo_dataset(storage.resolve(other, settings), num_shards=2, shard_bytes=64_000)
    stages.plan(submit(ctx, "run-1", demo_dataset), "run-1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "run-2", other, team="b"), "run-2", ctx)
    fs, path = storage.filesystem(manifest_uri(storage.resolve(other, settings)))
    with fs.open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(RunQueuedError):  # not the other run's DataIntegrityError
        stages.plan(submit(ctx, "run-3", demo_dataset, team="c"), "run-3", ctx)
    stages.reconcile(ctx)  # its admission pass goes on too
    stages.teardown("run-1", ctx)
    assert ctx.ledger.queue_entry("run-3")["state"] == "admitted"
    assert ctx.ledger.queue_entry("run-2")["state"] == "queued"


def test_a_deadline_runs_latest_start_is_the_engines_even_with_faster_learned_speeds(tight, demo_dataset):
    """Past attempts ran the workload at 100 steps/s, far faster than the engine estimates. The
    engine's deadline rule is what admission applies, so a deadline run's latest start allows for
    the engine's hours: it waits until then (urgent near it), and fails at it, not before."""
    import dataclasses

    from sqlalchemy import update

    from sailor_tasks.ledger import schema as t
    from sailor_tasks.model import JobRequest, from_dict
    from sailor_tasks.placement.index import index_for
    from sailor_tasks.placement.reservations import ledger_state
    from sailor_tasks.queue import estimate_hours
    from sailor_tasks.stages.queueing import admit_queued, learned_hours

    ctx = tight
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    placement = {
        "gpu_type": "T4",
        "num_gpus": 2,
        "market": "on_demand",
        "region": "us-central1",
        "zone": ZONE,
    }
    for i in range(3):
        run_id = f"past-{i}"
        submit(ctx, run_id, demo_dataset)
        ctx.ledger.start_attempt(run_id, 1, 1, placement, {})
        ctx.ledger.end_attempt(run_id, 1, "completed", step=1010, resumed_from_step=10)
        with ctx.ledger.engine.begin() as c:  # 1,000 steps in 10 s
            c.execute(
                update(t.run_attempts)
                .where(t.run_attempts.c.run_id == run_id)
                .values(started_at=start, ended_at=start + dt.timedelta(seconds=10))
            )
    steps = 200_000
    probe = from_dict(JobRequest, submit(ctx, "probe", demo_dataset, total_steps=steps))
    catalog = ctx.planning_catalog()
    est = estimate_hours(
        dataclasses.replace(probe, deadline_hours=1.0),
        catalog,
        ledger_state(ctx.ledger, probe, ""),
        index_for(catalog, ctx.planning_table()),
    )
    from sailor_tasks.placement.context import RESTART_HOURS

    engine_h = est.hours + RESTART_HOURS + est.data_hours
    assert learned_hours(ctx, probe) < engine_h / 2
    stages.plan(submit(ctx, "holder", demo_dataset), "holder", ctx)
    req = submit(
        ctx,
        "dl",
        demo_dataset,
        team="b",
        total_steps=steps,
        deadline_hours=engine_h + 0.5,
        market="on_demand",
    )
    with pytest.raises(RunQueuedError):
        stages.plan(req, "dl", ctx)
    entry = ctx.ledger.queue_entry("dl")
    latest_h = (entry["latest_start_at"] - entry["enqueued_at"]).total_seconds() / 3600
    assert latest_h == pytest.approx(0.5, abs=0.02)
    admit_queued(ctx, entry["enqueued_at"] + dt.timedelta(hours=0.3))
    assert ctx.ledger.queue_entry("dl")["state"] == "queued"  # not failed before its latest start
    admit_queued(ctx, entry["latest_start_at"] + dt.timedelta(minutes=1))
    after = ctx.ledger.queue_entry("dl")
    assert after["state"] == "failed" and "latest start" in after["reason"]


def test_a_queued_runs_estimate_keeps_to_its_datasets_residency(ctx, tmp_path, demo_dataset):
    """Another run of the dataset declared it stays in the EU: a run that declares nothing is
    estimated (its latest start) on the EU offers admission will use, not on faster ones elsewhere."""
    import dataclasses

    from sailor_tasks.model import JobRequest, from_dict
    from sailor_tasks.stages.queueing import expected_hours

    supply = tmp_path / "supply.yaml"
    supply.write_text(
        "version: 1\ndefaults:\n  capacity_gpus: {}\n  preemption_rate_per_hour: {T4: 0.0, A100: 0.0}\nzones:\n"
        "  us-central1-a:\n    A100: {capacity_gpus: 8}\n  europe-west1-b:\n    T4: {capacity_gpus: 2}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    params = {"dataset_uri": demo_dataset, "num_workers": 2, "total_steps": 200_000, "deadline_hours": 50.0}
    req = from_dict(JobRequest, stages.validate({**params, "team": "b"}, "b", ctx))
    anywhere = expected_hours(ctx, req)
    in_eu = expected_hours(ctx, dataclasses.replace(req, data_residency=("EU",)))
    assert in_eu > anywhere  # the EU has only the slower T4s
    from sailor_tasks.stages.queueing import _allowed_regions

    assert _allowed_regions(ctx, {"dataset_uri": demo_dataset}) == frozenset()  # any region
    stages.validate({**params, "team": "a", "data_residency": ["EU"]}, "r1", ctx)
    assert expected_hours(ctx, req) == pytest.approx(in_eu)
    # Its estimated start and the types it holds back count the EU's regions alone.
    allowed = _allowed_regions(ctx, {"dataset_uri": demo_dataset})
    assert allowed and all(r.startswith("europe-") for r in allowed)
    # Its own regions outside the residency: no region at all (not "any"): it takes no GPUs.
    nowhere = _allowed_regions(ctx, {"dataset_uri": demo_dataset, "regions": ["us-central1"]})
    assert nowhere == frozenset({""})


def test_a_run_that_ended_while_still_queued_leaves_before_it_holds_anyone_back(
    ctx, tmp_path, demo_dataset, monkeypatch
):
    """Its teardown could not take it out of the queue (the ledger refused every try): the next
    admission pass takes it out, and the run behind it on the same GPU type is admitted."""
    supply = tmp_path / "supply.yaml"
    supply.write_text(
        "version: 1\ndefaults:\n  capacity_gpus: {}\n  preemption_rate_per_hour: {T4: 0.0}\nzones:\n"
        f"  {ZONE}:\n    T4: {{capacity_gpus: 4}}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    stages.plan(submit(ctx, "r1", demo_dataset), "r1", ctx)  # 2 of the 4 T4s
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "e", demo_dataset, num_workers=4), "e", ctx)  # needs 4: waits
    ctx.ledger.upsert_run("e", status="cancelled")  # ended; its entry stayed queued
    assert ctx.ledger.queue_entry("e")["state"] == "queued"
    placed = stages.plan(submit(ctx, "f", demo_dataset), "f", ctx)  # 2 T4s are free
    assert placed["zone"] == ZONE
    entry = ctx.ledger.queue_entry("e")
    assert entry["state"] == "left" and "ended (cancelled) while still queued" in entry["reason"]


def test_a_plan_retried_right_after_a_reclaim_reserves_nothing(tight, demo_dataset, monkeypatch):
    """The reconciler releases an expired lease's capacity and marks the run failed in one
    transaction: an Airflow retry of the run's plan that lands right after the release finds the
    run ended and reserves nothing: a failed run never holds GPUs with a fresh lease."""
    from sailor_tasks.errors import ReservationReleasedError

    ctx = tight
    req = submit(ctx, "run-1", demo_dataset)
    stages.plan(req, "run-1", ctx)
    expired = ctx.ledger.reservation_leases()["run-1"]["expires_at"] + dt.timedelta(seconds=1)
    real, retried = ctx.ledger.reclaim, []

    def reclaim_then_retry(run_id, now=None, **kw):
        released = real(run_id, now, **kw)
        with pytest.raises(ReservationReleasedError):
            stages.plan(req, run_id, ctx)  # the dead plan task's retry
        retried.append(run_id)
        return released

    monkeypatch.setattr(ctx.ledger, "reclaim", reclaim_then_retry)
    assert stages.reconcile(ctx, now=expired)["reclaimed"] == ["run-1"]
    assert retried == ["run-1"]
    assert ctx.ledger.get_run("run-1")["status"] == "failed"
    assert ctx.ledger.live_reservations() == [] and ctx.ledger.held_gpus() == {}


def test_a_run_waiting_for_its_regions_gpus_does_not_hold_back_a_run_for_other_gpus(ctx, tmp_path, demo_dataset):
    """x may use any GPU type but only in europe-west1, whose T4s r1 holds; y, behind it, needs
    A100s, free in us-central1: the admission pass admits y now, x holding back only the T4s
    of its region."""
    supply = tmp_path / "supply.yaml"
    supply.write_text(
        "version: 1\ndefaults:\n  capacity_gpus: {}\n  preemption_rate_per_hour: {T4: 0.0, A100: 0.0}\nzones:\n"
        "  us-central1-a:\n    A100: {capacity_gpus: 8}\n  europe-west1-b:\n    T4: {capacity_gpus: 2}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    stages.plan(submit(ctx, "r1", demo_dataset, team="a", regions=["europe-west1"]), "r1", ctx)
    with pytest.raises(RunQueuedError):
        stages.plan(submit(ctx, "x", demo_dataset, team="b", gpu_type="any", regions=["europe-west1"]), "x", ctx)
    placed = stages.plan(submit(ctx, "y", demo_dataset, team="b", gpu_type="A100"), "y", ctx)
    assert (placed["zone"], placed["gpu_type"]) == ("us-central1-a", "A100")
    assert ctx.ledger.queue_entry("x")["state"] == "queued"
