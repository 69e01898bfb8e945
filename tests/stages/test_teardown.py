"""teardown removes the capacity first, from what the run recorded, then releases the reservation;
each step is retried, and a ledger outage never leaves a cluster behind."""

from __future__ import annotations

import importlib
import os
import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from sailor_tasks import stages
from sailor_tasks.model import run_key

TRAIN_STAGE = importlib.import_module("sailor_tasks.stages.train")  # ``stages.train`` is the function


class _DownLedger:
    """A ledger whose database cannot be reached: every call fails as SQLAlchemy does."""

    def __init__(self):
        self.calls = 0

    def __getattr__(self, name):
        def unreachable(*args, **kwargs):
            self.calls += 1
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("ledger is down"))

        return unreachable


@pytest.fixture
def provisioned(ctx, demo_dataset, monkeypatch):
    """run-1 validated, planned (a live reservation) and provisioned on the local backend."""
    monkeypatch.setattr(TRAIN_STAGE, "TEARDOWN_BACKOFF_S", 0.0, raising=False)
    request = stages.validate({"dataset_uri": demo_dataset, "num_workers": 1}, "run-1", ctx)
    placement = stages.plan(request, "run-1", ctx)
    stages.provision(request, placement, "run-1", ctx)
    record = os.path.join(ctx.settings.clusters_dir, f"{run_key('run-1')}.json")
    assert os.path.exists(record)
    return record


def test_teardown_removes_the_cluster_even_when_the_ledger_is_down(ctx, provisioned):
    ledger = ctx.ledger
    down = _DownLedger()
    ctx.__dict__["ledger"] = down  # the cached ledger of this context now fails
    with pytest.raises(OperationalError):
        stages.teardown("run-1", ctx)
    assert not os.path.exists(provisioned)  # the capacity is gone although the ledger is not
    assert down.calls >= 2  # the release was retried before giving up

    ctx.__dict__["ledger"] = ledger  # the ledger is back: Airflow's retry of the task finishes
    assert [r.run_id for r in ledger.live_reservations()] == ["run-1"]
    out = stages.teardown("run-1", ctx)
    assert out == {
        "training_stopped": 0,
        "reservation_released": True,
        "cluster_removed": False,
        "left_queue": False,
        "admitted": [],
    }
    assert ledger.live_reservations() == [] and ledger.get_run("run-1")["status"] == "failed"


class _FlakyBackend:
    detached_attempts = True  # as gke: teardown does not wait for a train task

    def __init__(self, failures: int):
        self.failures, self.calls = failures, []

    def cancel(self, key: str) -> int:
        return 0

    def teardown(self, key: str) -> bool:
        self.calls.append(key)
        if len(self.calls) <= self.failures:
            raise ConnectionError("cloud API unavailable")
        return True


def test_a_failing_backend_is_retried_and_the_reservation_is_held_until_it_is_gone(
    ctx, provisioned, monkeypatch
):
    flaky = _FlakyBackend(failures=100)
    monkeypatch.setattr(TRAIN_STAGE, "get_backend", lambda name, settings: flaky)
    with pytest.raises(ConnectionError):
        stages.teardown("run-1", ctx)
    assert len(flaky.calls) >= 2
    # The GPUs may still run: their reservation stays, so no other run is planned onto them.
    assert [r.run_id for r in ctx.ledger.live_reservations()] == ["run-1"]

    flaky = _FlakyBackend(failures=1)
    monkeypatch.setattr(TRAIN_STAGE, "get_backend", lambda name, settings: flaky)
    out = stages.teardown("run-1", ctx)
    assert out == {
        "training_stopped": 0,
        "reservation_released": True,
        "cluster_removed": True,
        "left_queue": False,
        "admitted": [],
    }
    assert len(flaky.calls) == 2
    assert ctx.ledger.live_reservations() == []


def test_the_backend_comes_from_the_run_params_when_given(ctx, provisioned, monkeypatch):
    names = []

    def backend(name, settings):
        names.append(name)
        return _FlakyBackend(failures=0)

    monkeypatch.setattr(TRAIN_STAGE, "get_backend", backend)
    stages.teardown("run-1", ctx, backend="gke")
    assert names == ["gke"]


class _TaskKilled(BaseException):
    """What the train task's process sees when it is terminated while training."""


def _killed_while_training(ctx, demo_dataset, monkeypatch, run_id: str) -> None:
    """``run_id`` validated, planned, placed and provisioned on the local backend, then its train
    task killed mid-training: its attempt stays running in the ledger."""
    from sailor_tasks.backends.local import LocalBackend

    request = stages.validate({"dataset_uri": demo_dataset, "num_workers": 1}, run_id, ctx)
    placement = stages.plan(request, run_id, ctx)
    data = stages.place_data(request, placement, run_id, ctx)
    stages.provision(request, placement, run_id, ctx)

    def killed(self, launch):
        raise _TaskKilled("terminated while training")

    monkeypatch.setattr(LocalBackend, "train", killed)
    with pytest.raises(_TaskKilled):
        stages.train(request, placement, data, run_id, ctx)


def test_teardown_ends_an_attempt_its_killed_train_task_left_running(ctx, demo_dataset, monkeypatch):
    """On the local backend the train task itself ends its attempt; killed mid-training it cannot,
    and the attempt would stay running (and count as in-flight demand every night)."""
    import datetime as dt

    from sailor_tasks.stages.rebalance import in_flight_rows

    _killed_while_training(ctx, demo_dataset, monkeypatch, "run-k")
    (attempt,) = ctx.ledger.attempts("run-k")
    assert attempt["outcome"] == "running"  # nothing in the task could end it

    monkeypatch.setattr(TRAIN_STAGE, "ATTEMPT_END_WAIT_S", 0.5)
    started = time.monotonic()
    stages.teardown("run-k", ctx)
    assert time.monotonic() - started >= 0.5  # a task still alive had its chance to end it
    (attempt,) = ctx.ledger.attempts("run-k")
    assert attempt["outcome"] == "failed" and attempt["ended_at"] is not None
    assert "train task stopped without ending it" in attempt["detail"]
    assert ctx.ledger.get_run("run-k")["status"] == "failed"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=3)
    assert [r for r in in_flight_rows(ctx, later) if r["run_id"] == "run-k"] == []
    stages.teardown("run-k", ctx)  # idempotent: nothing left to end
    assert ctx.ledger.attempts("run-k")[0]["outcome"] == "failed"


def test_a_cancelled_run_stays_cancelled_when_teardown_ends_its_attempt_first(ctx, demo_dataset, monkeypatch):
    """``sailor cancel`` marks the train task failed: its ``on_kill`` stops the workers, and
    Airflow starts teardown at once, which may end the attempt before the stopped task reports.
    The run and its attempt end ``cancelled``, not ``failed``, whichever records first."""
    _killed_while_training(ctx, demo_dataset, monkeypatch, "run-c")
    stages.stop_training("run-c", ctx)  # on_kill of a user's stop (cancelled, for good)
    assert ctx.ledger.get_run("run-c")["status"] == "cancelled"

    monkeypatch.setattr(TRAIN_STAGE, "ATTEMPT_END_WAIT_S", 0.0)  # the task was killed before it recorded
    stages.teardown("run-c", ctx)
    (attempt,) = ctx.ledger.attempts("run-c")
    assert attempt["outcome"] == "cancelled" and attempt["ended_at"] is not None
    assert ctx.ledger.get_run("run-c")["status"] == "cancelled"
    assert ctx.ledger.live_reservations() == []


def test_teardown_lets_a_stopped_train_task_record_how_its_attempt_ended(ctx, demo_dataset, monkeypatch):
    """Teardown can start (the train task marked failed by a user) before the task's ``on_kill``
    runs: its own stop then makes the workers report ``cancelled``, and the task, still alive,
    records it. Teardown waits for that rather than ending the attempt as a task that died."""
    from sailor_tasks.model import RUN_STATUSES_LIVE

    _killed_while_training(ctx, demo_dataset, monkeypatch, "run-w")

    def task_records_its_end():  # as ``finish_attempt`` does with a ``cancelled`` report
        time.sleep(0.5)
        ctx.ledger.end_attempt("run-w", 1, "cancelled", step=7)
        ctx.ledger.advance_run("run-w", "cancelled", from_statuses=RUN_STATUSES_LIVE)

    monkeypatch.setattr(TRAIN_STAGE, "ATTEMPT_END_WAIT_S", 30.0)
    task = threading.Thread(target=task_records_its_end)
    task.start()
    started = time.monotonic()
    stages.teardown("run-w", ctx)
    task.join()
    assert time.monotonic() - started < 10  # it returned once the attempt ended, not at the limit
    (attempt,) = ctx.ledger.attempts("run-w")
    assert attempt["outcome"] == "cancelled" and attempt["step"] == 7
    assert ctx.ledger.get_run("run-w")["status"] == "cancelled"
    assert ctx.ledger.live_reservations() == []


def test_airflow_stopping_the_train_task_is_no_cancel(ctx, demo_dataset, monkeypatch):
    """A train task Airflow stops (not a user: ``for_good`` False) leaves the run to its next try:
    nothing is recorded as cancelled."""
    request = stages.validate({"dataset_uri": demo_dataset, "num_workers": 1}, "run-s", ctx)
    placement = stages.plan(request, "run-s", ctx)
    stages.provision(request, placement, "run-s", ctx)
    before = ctx.ledger.get_run("run-s")["status"]
    stages.stop_training("run-s", ctx, for_good=False)
    assert ctx.ledger.get_run("run-s")["status"] == before != "cancelled"


def test_a_stage_retried_after_teardown_does_not_use_the_released_capacity(ctx, demo_dataset):
    """teardown released the run's reservation and marked it failed; a retried train (or
    place_data, provision) must neither train on capacity that is no longer the run's nor bring
    the run back to running."""
    from sailor_tasks.errors import ReservationReleasedError

    request = stages.validate({"dataset_uri": demo_dataset, "num_workers": 1}, "run-r", ctx)
    placement = stages.plan(request, "run-r", ctx)
    data = stages.place_data(request, placement, "run-r", ctx)
    stages.provision(request, placement, "run-r", ctx)
    assert stages.teardown("run-r", ctx)["reservation_released"]
    assert ctx.ledger.get_run("run-r")["status"] == "failed"

    with pytest.raises(ReservationReleasedError, match="released .* before train could use its capacity"):
        stages.train(request, placement, data, "run-r", ctx)
    with pytest.raises(ReservationReleasedError):
        stages.place_data(request, placement, "run-r", ctx)
    with pytest.raises(ReservationReleasedError):
        stages.provision(request, placement, "run-r", ctx)
    assert ctx.ledger.attempts("run-r") == []  # nothing was launched
    assert ctx.ledger.get_run("run-r")["status"] == "failed"
    assert ctx.ledger.live_reservations() == []
    assert not os.path.exists(os.path.join(ctx.settings.clusters_dir, f"{run_key('run-r')}.json"))


def test_a_retried_train_after_its_attempt_completed_returns_that_result(ctx, demo_dataset, monkeypatch):
    """The train try's worker died after the attempt completed (ledger and result written) and
    before the task reported success: the retry returns the completed attempt's result and trains
    nothing again (a run's own command would run twice, with its side effects)."""
    from sailor_tasks.backends.local import LocalBackend

    request = stages.validate(
        {"dataset_uri": demo_dataset, "num_workers": 1, "total_steps": 4, "checkpoint_every_steps": 2},
        "run-c",
        ctx,
    )
    placement = stages.plan(request, "run-c", ctx)
    data = stages.place_data(request, placement, "run-c", ctx)
    stages.provision(request, placement, "run-c", ctx)
    first = stages.train(request, placement, data, "run-c", ctx)
    assert first["status"] == "completed" and first["step"] == 4

    def trains_again(self, launch):
        raise AssertionError("trained again")

    monkeypatch.setattr(LocalBackend, "train", trains_again)
    again = stages.train(request, placement, data, "run-c", ctx, try_number=2, max_tries=2)
    assert [a["outcome"] for a in ctx.ledger.attempts("run-c")] == ["completed"]
    assert {k: again[k] for k in ("status", "step", "checkpoint_uri", "final_loss", "placement", "data")} == {
        k: first[k] for k in ("status", "step", "checkpoint_uri", "final_loss", "placement", "data")
    }
    assert again["attempts"] == first["attempts"] and again["train_wall_s"] > 0
    summary = stages.finalize(request, placement, data, again, "run-c", ctx)
    assert summary["status"] == "success" and summary["steps"] == 4
