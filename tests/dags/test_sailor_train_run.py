"""sailor_train end to end with dag.test(): real copy, real torchrun training, real checkpoints."""

from __future__ import annotations

import os

import pytest

from sailor_tasks import storage
from sailor_tasks.data.manifest import read_manifest
from sailor_tasks.ledger import Ledger
from sailor_tasks.paths import replica_path
from sailor_tasks.train.checkpoint.dcp import CheckpointManager

pytestmark = pytest.mark.slow

TINY = {
    "job_name": "tiny",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 40,
    "checkpoint_every_steps": 20,
    "batch_size": 8,
}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]))


def _states(dagrun):
    return {ti.task_id: ti.state for ti in dagrun.get_task_instances()}


def test_sailor_train_runs_end_to_end(dagbag, settings, demo_dataset):
    dag = dagbag.dags["sailor_train"]
    dagrun = dag.test(run_conf={**TINY, "dataset_uri": demo_dataset})
    assert dagrun.state == "success", _states(dagrun)
    assert _states(dagrun)["teardown"] == "success"

    ledger = Ledger(settings.ledger_url)
    (run,) = ledger.list_runs()
    assert run["status"] == "success" and run["steps"] == 40
    assert run["final_loss"] < run["initial_loss"]

    # The placed copy matches the source manifest, file for file.
    src = storage.resolve(demo_dataset, settings)
    dst = storage.resolve(f"sailor://{run['region']}/{replica_path(demo_dataset)}", settings)
    assert read_manifest(dst).files == read_manifest(src).files

    # The committed checkpoint resumes: a restarted trainer picks up at the final step.
    ckpt_root = run["checkpoint_uri"].rsplit("/", 1)[0]
    assert CheckpointManager(ckpt_root).latest_valid_step() == 40
    assert ledger.live_reservations() == []  # teardown released the capacity
    stages = {t["stage"] for t in ledger.stage_timings(run["run_id"])}
    assert {"validate", "plan", "place_data", "provision", "train", "finalize", "teardown"} <= stages


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"regions": ["mars-north1"]}, "regions"),
        ({"max_usd_per_hour": 0.01}, "max_usd_per_hour"),
        ({"num_workers": 0}, "num_workers"),
        ({"model": "unknown"}, "model"),
    ],
)
def test_bad_params_fail_at_validate_and_change_nothing(dagbag, settings, demo_dataset, conf, field):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["sailor_train"]
    try:
        dagrun = dag.test(run_conf={**TINY, "dataset_uri": demo_dataset, **conf})
    except ParamValidationError as exc:  # rejected by the Param schema before any task ran
        assert field in str(exc)
    else:
        states = _states(dagrun)
        assert dagrun.state == "failed" and states["validate"] == "failed", states
        assert all(
            states[t] in ("upstream_failed", None, "skipped")
            for t in ("plan", "place_data", "provision", "train", "teardown")
        ), states
        (run,) = Ledger(settings.ledger_url).list_runs()
        assert run["status"] == "rejected" and field in run["error"]
    ledger = Ledger(settings.ledger_url)
    assert ledger.live_reservations() == [] and ledger.replicas() == {}
    assert sorted(os.listdir(os.path.join(settings.state_dir, "buckets"))) == ["source"]  # nothing copied
    assert not os.path.exists(settings.clusters_dir)


def test_a_noticed_preemption_is_recovered_as_a_retry_of_train(settings, demo_dataset):
    from airflow.dag_processing.dagbag import DagBag

    # A fresh DAG object: dag.test() leaves an earlier run's conf in the tasks' params (seen after
    # the bad-params runs above), which would leak e.g. max_usd_per_hour=0.01 into this run.
    dag = DagBag(dag_folder=str(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])).dags["sailor_train"]
    conf = {
        **TINY,
        "dataset_uri": demo_dataset,
        "inject_preemptions": [15],
        "recovery_strategy": "eager_next_region",
        "preemption_notice_s": 20,
    }
    dagrun = dag.test(run_conf=conf)
    assert dagrun.state == "success", _states(dagrun)
    train_ti = next(ti for ti in dagrun.get_task_instances() if ti.task_id == "train")
    assert train_ti.try_number == 2  # the preempted attempt is a failed try in the UI, the retry won

    ledger = Ledger(settings.ledger_url)
    (run,) = ledger.list_runs()
    assert run["status"] == "success" and run["steps"] == 40
    (pre,) = ledger.preemptions(run["run_id"])
    assert pre["noticed"] and pre["steps_lost"] == 0 and pre["recovery_s"] is not None
    first, second = ledger.attempts(run["run_id"])
    assert (first["outcome"], second["outcome"]) == ("preempted", "completed")
    assert second["region"] != first["region"] and second["resumed_from_step"] == pre["step"]
    assert run["region"] == second["region"]  # finalize reports where the run finished
    train_tries = [t["try_number"] for t in ledger.stage_timings(run["run_id"]) if t["stage"] == "train"]
    assert train_tries == [1, 2]
    assert ledger.live_reservations() == []
