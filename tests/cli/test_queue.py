"""``sailor queue``: waiting runs in admission order with policy, reason and estimated start."""

from __future__ import annotations

import json

import pytest

from sailor_tasks import stages
from sailor_tasks.cli.main import main as sailor
from sailor_tasks.errors import RunQueuedError
from tests.stages.test_queueing import submit, tight  # noqa: F401  (fixture)


def test_sailor_queue_lists_waiting_runs_in_order(tight, demo_dataset, capsys):  # noqa: F811
    ctx = tight
    stages.plan(submit(ctx, "a-1", demo_dataset, team="a"), "a-1", ctx)
    for run_id, team in (("a-2", "a"), ("b-1", "b")):
        with pytest.raises(RunQueuedError):
            stages.plan(submit(ctx, run_id, demo_dataset, team=team), run_id, ctx)
    assert sailor(["queue", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "las"
    assert [(e["run_id"], e["position"], e["state"]) for e in out["entries"]] == [
        ("b-1", 1, "queued"),
        ("a-2", 2, "queued"),
    ]
    assert all(e["estimated_start_at"] and e["reason"].startswith("las:") for e in out["entries"])
    assert sailor(["queue"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "queue policy: las; 2 waiting"
    assert text[1].split()[:3] == ["position", "run_id", "team"]
    assert text[2].split()[:2] == ["1", "b-1"]

    stages.teardown("a-1", ctx)
    assert sailor(["queue", "--json", "--all"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [(e["run_id"], e["state"]) for e in entries] == [("a-2", "queued"), ("b-1", "admitted")]
    assert entries[1]["waited_s"] >= 0 and entries[1]["admitted_at"]
