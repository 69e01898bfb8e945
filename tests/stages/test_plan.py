"""The plan stage: reserves through the engine, an Airflow retry is idempotent, teardown releases,
the dataset's size comes from its manifest, and `sailor plan --json` prints the explanation."""

from __future__ import annotations

import json

import pytest

from sailor_tasks import stages
from sailor_tasks.cli.main import main as sailor
from sailor_tasks.errors import InvalidRequestError


def test_plan_stage_retry_keeps_one_reservation_and_teardown_releases(ctx, demo_dataset):
    request = stages.validate({"dataset_uri": demo_dataset, "num_workers": 2}, "run-1", ctx)
    first = stages.plan(request, "run-1", ctx)
    again = stages.plan(request, "run-1", ctx)  # Airflow retry of the same task
    assert (again["zone"], again["gpu_type"]) == (first["zone"], first["gpu_type"])
    live = ctx.ledger.live_reservations()
    assert [(r.run_id, r.zone, r.gpus) for r in live] == [("run-1", first["zone"], 2)]
    assert any(line.startswith("winner contributions:") for line in first["explanation"])
    stages.teardown("run-1", ctx)
    assert ctx.ledger.live_reservations() == []


def test_a_run_plan_refuses_for_good_ends_failed_with_the_error(ctx, demo_dataset):
    # teardown, which ends every other unfinished run, does not run after a failed plan
    request = stages.validate({"dataset_uri": demo_dataset, "regions": ["us-central1"]}, "gone", ctx)
    request["regions"] = ["atlantis-north1"]  # the catalog lost the region since validate
    with pytest.raises(InvalidRequestError, match="atlantis-north1"):
        stages.plan(request, "gone", ctx)
    run = ctx.ledger.get_run("gone")
    assert run["status"] == "failed" and run["error"].startswith("InvalidRequestError: regions=")
    assert ctx.ledger.live_reservations() == []


def test_excluding_every_allowed_region_is_refused_at_validate(ctx, demo_dataset):
    params = {"dataset_uri": demo_dataset, "regions": ["us-central1"], "exclude_regions": ["us-central1"]}
    with pytest.raises(
        InvalidRequestError, match=r"exclude_regions=\['us-central1'\]: excludes every region"
    ):
        stages.validate(params, "nowhere", ctx)
    assert ctx.ledger.get_run("nowhere")["status"] == "rejected"


def test_replica_and_manifest_size_pull_the_next_run_to_the_data(ctx, demo_dataset):
    request = stages.validate({"dataset_uri": demo_dataset, "num_workers": 1}, "run-a", ctx)
    placement = stages.plan(request, "run-a", ctx)
    stages.place_data(request, placement, "run-a", ctx)
    request_b = stages.validate({"dataset_uri": demo_dataset, "num_workers": 1}, "run-b", ctx)
    state_line = stages.plan(request_b, "run-b", ctx)["explanation"][2]
    assert f"GB from {placement['region']}" in state_line


def test_cli_plan_json_prints_winner_runners_up_and_rejections(settings, capsys):
    assert sailor(["plan", "--json", "--set", 'gpu_type="A100"', "--set", "num_workers=8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["placement"]["gpu_type"] == "A100"
    assert out["winner"]["contributions"]["compute_cost"] > 0
    assert out["runners_up"] and out["rejected_by_rule"]["gpu_type"] > 0
    assert {r["validator"] for r in out["rejected"]} >= {"gpu_type"}


def test_cli_plan_json_of_a_request_nothing_can_hold_exits_as_the_text_does(settings, capsys):
    assert sailor(["plan", "--set", "max_usd_per_hour=0.01"]) == 2
    assert "no offer satisfies" in capsys.readouterr().err
    assert sailor(["plan", "--json", "--set", "max_usd_per_hour=0.01"]) == 2
    assert json.loads(capsys.readouterr().out)["error"].startswith("NoFeasibleOfferError")


def test_cli_plan_unknown_gpu_lists_valid_values(settings, capsys):
    assert sailor(["plan", "--set", 'gpu_type="Z100"']) == 2
    assert "valid choices: any, A100" in capsys.readouterr().err


def test_cli_catalog_shows_capacity_and_transfer(settings, capsys):
    assert sailor(["catalog", "--gpu", "H100", "--region", "us-central1"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "capacity_gpus" in header and "preemption_rate_per_hour" in header
    assert (
        sailor(["catalog", "transfer", "--region", "us-central1", "--region", "europe-west4", "--json"]) == 0
    )
    rows = json.loads(capsys.readouterr().out)
    cross = next(r for r in rows if r["src_region"] == "us-central1" and r["dst_region"] == "europe-west4")
    assert cross["usd_per_gb"] == 0.05


def test_cli_catalog_options_before_a_subcommand_count_or_are_refused(settings, capsys):
    """``catalog --json transfer`` prints JSON and ``catalog --region X transfer`` checks X (the
    subcommand's defaults dropped them); options a subcommand does not read are refused."""
    assert sailor(["catalog", "--json", "transfer", "--region", "us-central1"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["src_region"] == "us-central1"
    assert sailor(["catalog", "--region", "mars-north1", "transfer"]) == 2
    assert "--region mars-north1 not in the catalog" in capsys.readouterr().err
    assert sailor(["catalog", "--gpu", "V100", "transfer"]) == 2
    assert "--gpu: not read by `sailor catalog transfer`" in capsys.readouterr().err
    assert sailor(["catalog", "--json", "derive", "--source", "vms.csv"]) == 2
    assert "--json: not read by `sailor catalog derive`" in capsys.readouterr().err
