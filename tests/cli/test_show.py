"""``sailor show`` and ``sailor runs`` on a real run: placement and why, attempts, data,
checkpoints, cost and summary."""

from __future__ import annotations

import json

import pytest

from sailor_tasks.cli.main import main as sailor
from sailor_tasks.testing.run_inline import run_inline

PARAMS = {
    "job_name": "show-me",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 1,
    "total_steps": 10,
    "checkpoint_every_steps": 5,
    "batch_size": 8,
    "inject_preemptions": [6],
    "recovery_strategy": "eager_next_region",
}


@pytest.mark.slow
def test_show_tells_where_a_preempted_run_went_why_and_what_it_cost(ctx, demo_dataset, capsys):
    run_inline({**PARAMS, "dataset_uri": demo_dataset}, "manual__show", ctx)
    capsys.readouterr()

    assert sailor(["show", "manual__show", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    run = report["run"]
    assert run["status"] == "success" and run["job_name"] == "show-me" and run["steps"] == 10
    first, second = report["attempts"]
    assert first["outcome"] == "preempted" and first["preemption"]["noticed"] is True
    assert second["outcome"] == "completed" and second["region"] != first["region"]
    assert all(a["market"] == "spot" and a["why"] and a["usd"] > 0 and a["zone"] for a in report["attempts"])
    assert report["usd_attempts"] == pytest.approx(first["usd"] + second["usd"])
    assert [p["attempt"] for p in report["placements"]] == [1, 2]
    assert all(p["explanation"][0].startswith("chose ") for p in report["placements"])
    assert {d["data_uri"].split("/buckets/")[1].split("/")[0] for d in report["data"]} == {
        first["region"],
        second["region"],
    }
    assert set(report["replicas"]) == {first["region"], second["region"]}
    final = next(c for c in report["checkpoints"] if c["region"] == second["region"])
    assert final["steps"][-1] == 10
    assert report["summary_md"].startswith("# SAILOR run `manual__show`")

    assert sailor(["show", "manual__show"]) == 0
    text = capsys.readouterr().out
    for expected in (
        "Status       success",
        "why  chose ",
        f"{first['zone']}",
        "preempted with notice at step",
        "Data placed",
        "committed steps",
        "Cost",
        "sailor logs manual__show --follow",
        "sailor cancel manual__show",
    ):
        assert expected in text, expected

    from sailor_tasks.cli.demo import demo_summary

    demo = demo_summary(ctx.ledger, "manual__show", ctx.settings)
    assert "sailor show manual__show" in demo and "sailor logs RUN_ID --follow" in demo

    assert sailor(["runs"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert header.split() == [
        "run_id",
        "job_name",
        "team",
        "created",
        "status",
        "region",
        "gpu_type",
        "market",
        "steps",
        "usd",
    ]
    assert row.split()[:3] == ["manual__show", "show-me", "qa"] and "success" in row.split()
    assert sailor(["runs", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["job_name"] == "show-me" and listed["team"] == "qa" and listed["created_at"]


def test_show_of_an_unknown_run_exits_3_and_names_the_recent_runs(ctx, capsys):
    ctx.ledger.upsert_run(
        "manual__known",
        job_name="j",
        team="t",
        status="running",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/datasets/demo-text",
        request={},
    )
    assert sailor(["show", "manual__typo"]) == 3
    err = capsys.readouterr().err
    assert "no run 'manual__typo'" in err and "manual__known" in err


def test_an_unknown_run_names_the_ledger_without_its_password(ctx):
    import dataclasses
    import types

    from sailor_tasks.cli.show import not_found_message

    settings = dataclasses.replace(
        ctx.settings, ledger_url="postgresql+psycopg2://sailor:s3cret@db:5432/ledger"
    )
    message = not_found_message(types.SimpleNamespace(ledger=ctx.ledger, settings=settings), "manual__typo")
    assert "s3cret" not in message and "postgresql+psycopg2://sailor:***@db:5432/ledger" in message


def test_show_of_a_run_that_has_not_been_placed_yet(ctx, capsys):
    ctx.ledger.upsert_run(
        "manual__new",
        job_name="j",
        team="t",
        status="validated",
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/datasets/demo-text",
        request={"total_steps": 5},
    )
    assert sailor(["show", "manual__new"]) == 0
    out = capsys.readouterr().out
    assert "Status       validated" in out and "Checkpoints  none committed" in out
