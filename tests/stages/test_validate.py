"""``validate`` reads nothing a run should not: dataset and trace URIs stay inside the data folders
and allowed buckets, traces are small regular files, and a rejection names the field."""

from __future__ import annotations

import json
import os
import signal

import pytest

from sailor_tasks import stages, storage
from sailor_tasks.errors import InvalidRequestErrors

TRACE = {"metadata": {"gap_seconds": 60}, "data": [0, 0, 1, 0]}


class Hung(Exception):  # noqa: N818 - not an OSError, so validate cannot take it for a bad file
    pass


@pytest.fixture
def deadline():
    """Turn a hang (a FIFO opened for reading blocks until a writer comes) into a test failure."""

    def _expired(signum, frame):
        raise Hung("validate did not return within 10 s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A configured data folder (``SAILOR_DATA_ROOTS``) holding a valid trace."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "trace.json").write_text(json.dumps(TRACE))
    monkeypatch.setenv("SAILOR_DATA_ROOTS", str(root))
    return root


def _context():
    """A stage context read from the environment now (after the fixtures set it)."""
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages import StageContext

    return StageContext(Settings.from_env())


def _rejection(params, run_id="bad"):
    ctx = _context()
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate(params, run_id, ctx)
    assert ctx.ledger.get_run(run_id)["status"] == "rejected"
    assert ctx.ledger.placements(run_id) == []
    return info.value


def test_a_trace_inside_a_data_folder_is_accepted(demo_dataset, data_root):
    ctx = _context()
    request = stages.validate(
        {"dataset_uri": demo_dataset, "preemption_trace_uri": f"file://{data_root}/trace.json"}, "ok", ctx
    )
    assert request["preemption_trace_uri"].endswith("trace.json")


def test_a_fifo_trace_is_rejected_without_waiting_for_a_writer(demo_dataset, data_root, deadline):
    os.mkfifo(data_root / "pipe.json")
    err = _rejection({"dataset_uri": demo_dataset, "preemption_trace_uri": f"file://{data_root}/pipe.json"})
    assert err.field == "preemption_trace_uri" and "not a regular file" in str(err)


def test_a_device_trace_is_rejected_without_reading_it(demo_dataset, data_root, deadline):
    (data_root / "zero.json").symlink_to("/dev/zero")
    for uri in ("file:///dev/zero", f"file://{data_root}/zero.json"):
        err = _rejection({"dataset_uri": demo_dataset, "preemption_trace_uri": uri})
        assert err.field == "preemption_trace_uri" and "data folder" in str(err), str(err)


def test_a_trace_over_the_size_cap_is_rejected_before_it_is_parsed(
    demo_dataset, data_root, deadline, monkeypatch
):
    from sailor_tasks.traces import availability

    monkeypatch.setattr(availability, "MAX_TRACE_BYTES", 1024)
    (data_root / "big.json").write_text(json.dumps({**TRACE, "data": [0] * 2000}))
    err = _rejection({"dataset_uri": demo_dataset, "preemption_trace_uri": f"file://{data_root}/big.json"})
    assert err.field == "preemption_trace_uri" and "1024" in str(err), str(err)


def test_a_trace_outside_the_data_folders_is_rejected(demo_dataset, data_root, tmp_path):
    (tmp_path / "elsewhere.json").write_text(json.dumps(TRACE))
    err = _rejection(
        {"dataset_uri": demo_dataset, "preemption_trace_uri": f"file://{tmp_path}/elsewhere.json"}
    )
    assert err.field == "preemption_trace_uri" and str(data_root) in str(err), str(err)


@pytest.mark.parametrize(
    "uri",
    [
        "file://{state}",  # the whole state folder, ledger included
        "file://{state}/clusters",
        "file://{state}/buckets",  # every bucket, every run folder
        "file://{state}/buckets/us-central1",  # a whole region bucket, run folders included
        "file://{state}/buckets/us-central1/runs/other-run",
        "file://{state}/buckets/us-central1/runs",
        "sailor://us-central1/runs/other-run/checkpoints",
        "sailor://us-central1/runs",
        "sailor://source/runs/x",
    ],
)
def test_a_dataset_cannot_read_the_state_folder_or_run_folders(settings, uri):
    uri = uri.format(state=settings.state_dir)
    path = storage.resolve(uri, settings).removeprefix("file://")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "shard-0.bin"), "wb") as f:
        f.write(b"secret")
    err = _rejection({"dataset_uri": uri})
    assert err.field == "dataset_uri", str(err)


def test_gs_datasets_come_only_from_allowed_buckets(settings, monkeypatch):
    err = _rejection({"dataset_uri": "gs://someone-elses-bucket/data"})
    assert err.field == "dataset_uri" and "someone-elses-bucket" in str(err)
    assert "sailor-demo-sailor-source" not in str(err)  # the local template names no gs:// bucket

    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", "gs://{project}-sailor-{bucket}")
    monkeypatch.setenv("SAILOR_GCP_PROJECT", "sailor-demo")
    err = _rejection({"dataset_uri": "gs://someone-elses-bucket/data"}, run_id="bad-2")
    assert "sailor-demo-sailor-source" in str(err) and "sailor-demo-sailor-us-central1" in str(err)
    err = _rejection({"dataset_uri": "gs://sailor-demo-sailor-us-central1/runs/x"}, run_id="bad-3")
    assert err.field == "dataset_uri" and "runs/" in str(err)


def test_configured_gs_buckets_are_allowed(monkeypatch):
    from sailor_tasks.request import check_data_access
    from sailor_tasks.settings import Settings

    monkeypatch.setenv("SAILOR_DATA_BUCKETS", "corp-datasets,gs://corp-more")
    settings = Settings.from_env()
    regions = ("us-central1",)
    assert check_data_access("dataset_uri", "gs://corp-datasets/text", settings, regions) is None
    assert check_data_access("dataset_uri", "gs://corp-more/text", settings, regions) is None
    err = check_data_access("dataset_uri", "gs://corp-other/text", settings, regions)
    assert err is not None and "corp-datasets" in str(err) and "corp-more" in str(err)


def test_a_gke_run_without_a_gcp_project_is_rejected_before_anything_is_reserved(settings, monkeypatch):
    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", "gs://{project}-sailor-{bucket}")
    monkeypatch.delenv("SAILOR_GCP_PROJECT", raising=False)
    err = _rejection({"backend": "gke"}, run_id="no-project")
    assert [e.field for e in err.errors] == ["backend"]
    assert "GCP project: no project" in str(err) and "SAILOR_GCP_PROJECT" in str(err)
    assert "extra 'project'" in str(err)  # the fix: the connection's project

    monkeypatch.setenv("SAILOR_GCP_PROJECT", "acme-ml")  # with a project, the bucket names resolve
    err = _rejection({"backend": "gke", "dataset_uri": "gs://elsewhere/data"}, run_id="with-project")
    assert [e.field for e in err.errors] == ["dataset_uri"] and "acme-ml-sailor-source" in str(err)


def test_a_dataset_spelled_by_its_bucket_path_or_a_link_is_keyed_as_its_sailor_uri(demo_dataset, data_root):
    """The concrete path of a folder in SAILOR's source bucket, or a link to it from a data folder,
    is the same dataset: validated as its sailor:// URI, so it shares the replicas and the
    data_residency another run of it declared (spelled another way, it escaped the residency)."""
    from sailor_tasks.model import JobRequest, from_dict
    from sailor_tasks.stages.queueing import with_dataset_residency

    ctx = _context()
    concrete = storage.resolve(demo_dataset, ctx.settings)
    link = data_root / "demo-link"
    os.symlink(concrete.removeprefix("file://"), link)
    stages.validate({"dataset_uri": demo_dataset, "data_residency": ["EU"]}, "eu-only", ctx)
    for spelling in (concrete, concrete + "/", f"file://{link}"):
        request = stages.validate({"dataset_uri": spelling}, "other", ctx)
        assert request["dataset_uri"] == demo_dataset
        assert with_dataset_residency(ctx, from_dict(JobRequest, request)).data_residency == ("EU",)
    missing = concrete.rsplit("/", 1)[0] + "/missing"
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate({"dataset_uri": missing}, "missing", ctx)
    assert f"dataset_uri={missing!r}: dataset not found" in str(info.value)  # named as given
    outside = data_root / "own"
    outside.mkdir()
    (outside / "part-0.bin").write_bytes(b"x" * 100)
    request = stages.validate({"dataset_uri": f"file://{data_root}//own/"}, "own", ctx)
    assert request["dataset_uri"] == f"file://{os.path.realpath(outside)}"
