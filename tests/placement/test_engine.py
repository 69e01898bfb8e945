"""Each validator and preference decides a hand-built case; explanations name the deciding rule."""

from __future__ import annotations

import dataclasses

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.errors import CapacityUnavailableError, InvalidRequestError, NoFeasibleOfferError
from sailor_tasks.model import Assignment, ClusterState, JobRequest, Offer, Reservation
from sailor_tasks.placement import QueuedRequest, explain, plan, plan_many
from sailor_tasks.placement.context import RESTART_HOURS
from sailor_tasks.placement.validators import VALIDATOR_NAMES

GB = 10**9


def offer(zone, gpu="V100", per_node=1, od=2.0, spot=0.6, cap=None, rate=0.0, dirty=False):
    return Offer(
        "gcp", zone.rsplit("-", 1)[0], zone, gpu, per_node, f"vm-{gpu}-{per_node}", od, spot, dirty, cap, rate
    )


def req(**kw):
    base = dict(
        job_name="j",
        team="t",
        dataset_uri="sailor://source/d",
        model="gpt_25m",
        num_workers=1,
        total_steps=20_000,
        checkpoint_every_steps=500,
    )
    return JobRequest(**{**base, **kw})


def rejected_by(result: dict, zone: str, market: str = "spot") -> set[str]:
    return {r["validator"] for r in result["rejected"] if r["zone"] == zone and r["market"] == market}


# --- validators --------------------------------------------------------------------------------


def test_gpu_type_validator_rejects_other_types():
    cat = Catalog((offer("us-east1-b", gpu="T4", spot=0.1), offer("us-east1-c", gpu="V100")))
    assert plan(req(gpu_type="V100"), cat, ClusterState(), "r").zone == "us-east1-c"
    assert rejected_by(explain(req(gpu_type="V100"), cat, ClusterState()), "us-east1-b") == {"gpu_type"}


def test_capacity_validator_counts_live_reservations():
    cat = Catalog((offer("us-east1-b", spot=0.5, cap=8), offer("us-east1-c", spot=0.6, cap=8)))
    state = ClusterState(reservations=(Reservation("other", "us-east1", "us-east1-b", "V100", 6, "spot"),))
    p = plan(req(num_workers=4), cat, state, "r")
    assert p.zone == "us-east1-c"
    assert rejected_by(explain(req(num_workers=4), cat, state), "us-east1-b") == {"capacity"}


def test_capacity_taken_everywhere_is_a_transient_capacity_error():
    cat = Catalog((offer("us-east1-b", cap=4),))
    state = ClusterState(reservations=(Reservation("other", "us-east1", "us-east1-b", "V100", 4, "spot"),))
    with pytest.raises(CapacityUnavailableError, match="0 GPUs free in us-east1-b") as err:
        plan(req(), cat, state, "r")
    assert err.value.retryable


def test_a_price_cap_hint_names_an_offer_whose_zone_can_hold_the_run():
    """The cheapest spot zone has only 2 GPUs: a 4-GPU run can never go there, so the hint names
    the zone that can hold it, and plan and validate name the same price."""
    from sailor_tasks.placement import catalog_errors

    cat = Catalog((offer("us-east1-b", spot=0.3, cap=2), offer("us-east1-c", spot=0.5)))
    r = req(num_workers=4, market="spot", max_usd_per_hour=1.0)
    with pytest.raises(NoFeasibleOfferError, match=r"cheapest offer: us-east1-c .* at least 2\.00$"):
        plan(r, cat, ClusterState(), "r")
    assert [str(e).rsplit(" ", 1)[-1] for e in catalog_errors(r, cat)] == ["2.00"]
    assert plan(dataclasses.replace(r, max_usd_per_hour=2.0), cat, ClusterState(), "r").zone == "us-east1-c"


def test_a_gpu_count_no_vm_shape_divides_names_the_shapes_and_an_empty_catalog_says_so():
    cat = Catalog((offer("us-east1-b", gpu="H100", per_node=8, od=80, spot=30),))
    with pytest.raises(NoFeasibleOfferError, match="whole number of VMs; GPUs per VM: H100 8$"):
        plan(req(num_workers=4), cat, ClusterState(), "r")
    with pytest.raises(NoFeasibleOfferError, match="the catalog has no offers"):
        plan(req(), Catalog(()), ClusterState(), "r")


def test_price_cap_validator():
    cat = Catalog((offer("us-east1-b", spot=0.6), offer("us-east1-c", gpu="T4", spot=0.2, od=0.4)))
    r = req(max_usd_per_hour=0.3, market="spot")
    assert plan(r, cat, ClusterState(), "r").zone == "us-east1-c"
    with pytest.raises(NoFeasibleOfferError, match=r"price_cap: 2\); cheapest offer: us-east1-c"):
        plan(req(max_usd_per_hour=0.1, market="spot"), cat, ClusterState(), "r")


def test_region_allow_and_deny_lists():
    cat = Catalog(
        (offer("us-east1-b", spot=0.5), offer("europe-west4-a", spot=0.6), offer("asia-east1-a", spot=0.7))
    )
    assert (
        plan(req(regions=("europe-west4", "asia-east1")), cat, ClusterState(), "r").region == "europe-west4"
    )
    assert plan(req(exclude_regions=("us-east1",)), cat, ClusterState(), "r").region == "europe-west4"
    result = explain(req(exclude_regions=("us-east1",)), cat, ClusterState())
    assert rejected_by(result, "us-east1-b") == {"region_denied"}


def test_data_residency_keeps_the_run_on_the_allowed_continent():
    cat = Catalog((offer("us-east1-b", spot=0.4), offer("europe-west4-a", spot=0.6)))
    p = plan(req(data_residency=("EU",)), cat, ClusterState(), "r")
    assert p.region == "europe-west4"
    assert rejected_by(explain(req(data_residency=("EU",)), cat, ClusterState()), "us-east1-b") == {
        "data_residency"
    }


def test_market_validator_and_blocked_zone():
    cat = Catalog((offer("us-east1-b", spot=0.5), offer("us-east1-c", spot=0.6)))
    assert plan(req(market="on_demand"), cat, ClusterState(), "r").market == "on_demand"
    blocked = ClusterState(blocked_zones=frozenset({"us-east1-b"}))
    assert plan(req(), cat, blocked, "r").zone == "us-east1-c"
    assert rejected_by(explain(req(), cat, blocked), "us-east1-b") == {"blocked_zone"}


def test_every_validator_has_a_name_in_the_rejection_counts():
    cat = Catalog((offer("us-east1-b", gpu="T4"), offer("us-east1-c"), offer("us-west1-a", gpu="T4")))
    with pytest.raises(NoFeasibleOfferError) as err:
        plan(req(gpu_type="V100", regions=("us-west1",), market="spot"), cat, ClusterState(), "r")
    assert set(err.value.rejections) <= set(VALIDATOR_NAMES)
    assert err.value.rejections == {"gpu_type": 4, "region_allowed": 2}


# --- market=auto (Can't-Be-Late) ------------------------------------------------------------------


def test_auto_market_long_job_with_little_slack_goes_on_demand():
    cat = Catalog((offer("us-east1-b", od=2.0, spot=0.6, rate=0.3),))
    long_job = req(total_steps=2_000_000)  # tens of hours on one V100
    hours = plan(req(total_steps=2_000_000, market="on_demand"), cat, ClusterState(), "r")
    assert hours.market == "on_demand"
    expected = explain(req(total_steps=2_000_000, market="on_demand"), cat, ClusterState())["winner"][
        "expected_hours"
    ]
    tight = plan(dataclasses.replace(long_job, deadline_hours=expected * 1.05), cat, ClusterState(), "r")
    assert tight.market == "on_demand"
    assert any("market auto → on_demand" in line for line in tight.explanation)
    relaxed = plan(dataclasses.replace(long_job, deadline_hours=expected * 3), cat, ClusterState(), "r")
    assert relaxed.market == "spot"


def test_auto_market_short_job_goes_spot_even_with_a_tight_deadline():
    cat = Catalog((offer("us-east1-b", od=2.0, spot=0.6, rate=0.3),))
    short = req(total_steps=2_000)
    expected = explain(dataclasses.replace(short, market="on_demand"), cat, ClusterState())["winner"][
        "expected_hours"
    ]
    assert expected < 1.0
    # Tight: one launch, the training and half of it again.
    p = plan(
        dataclasses.replace(short, deadline_hours=RESTART_HOURS + expected * 1.5 + 0.01),
        cat,
        ClusterState(),
        "r",
    )
    assert p.market == "spot"


def test_auto_never_picks_spot_where_only_on_demand_meets_the_deadline():
    # A short job whose slack covers its spot overhead but not overhead + the launch the deadline
    # counts: spot misses the deadline, on-demand meets it, so auto picks on-demand (not nothing).
    cat = Catalog((offer("us-east1-b", od=2.0, spot=0.6, rate=0.3),))
    short = req(total_steps=2_000)
    hours = explain(dataclasses.replace(short, market="on_demand"), cat, ClusterState())["winner"][
        "expected_hours"
    ]
    p = plan(
        dataclasses.replace(short, deadline_hours=RESTART_HOURS + hours + 1e-6), cat, ClusterState(), "r"
    )
    assert p.market == "on_demand"


def test_dirty_spot_price_goes_on_demand_under_auto():
    cat = Catalog((offer("us-east1-b", od=1.0, spot=2.0, dirty=True),))
    assert plan(req(), cat, ClusterState(), "r").market == "on_demand"


def test_the_deadline_rule_counts_one_launch_before_training():
    cat = Catalog((offer("us-east1-b"),))
    job = req(market="on_demand")
    hours = explain(job, cat, ClusterState())["winner"]["expected_hours"]
    # Enough for training, not for the launch before it: rejected.
    with pytest.raises(NoFeasibleOfferError, match="deadline: 1"):
        plan(dataclasses.replace(job, deadline_hours=hours + 0.5 * RESTART_HOURS), cat, ClusterState(), "r")
    fits = plan(
        dataclasses.replace(job, deadline_hours=hours + RESTART_HOURS + 1e-6), cat, ClusterState(), "r"
    )
    assert fits.zone == "us-east1-b"


def test_deadline_that_no_offer_meets_is_rejected_by_the_deadline_rule():
    cat = Catalog((offer("us-east1-b"),))
    with pytest.raises(NoFeasibleOfferError, match="deadline: 1"):
        plan(req(total_steps=2_000_000, deadline_hours=0.5), cat, ClusterState(), "r")


def test_a_missed_deadline_names_the_fastest_offer_and_the_deadline_that_fits():
    import re

    cat = Catalog((offer("us-east1-b", gpu="V100", od=2.0), offer("us-east1-c", gpu="H100", od=6.0)))
    job = req(market="on_demand", total_steps=2_000_000, deadline_hours=0.5)
    with pytest.raises(NoFeasibleOfferError, match="deadline: 2") as err:
        plan(job, cat, ClusterState(), "r")
    found = re.search(r"fastest offer: (\S+) .*raise deadline_hours to at least ([0-9.]+)", str(err.value))
    assert found and found.group(1) == "us-east1-c", str(err.value)  # the H100 is the faster one
    assert plan(
        dataclasses.replace(job, deadline_hours=float(found.group(2))), cat, ClusterState(), "r"
    ).zone == ("us-east1-c")
    # Under a price cap the H100 cannot take, the hint is the fastest offer within the cap.
    capped = dataclasses.replace(job, max_usd_per_hour=3.0)
    with pytest.raises(NoFeasibleOfferError) as err:
        plan(capped, cat, ClusterState(), "r")
    found = re.search(r"fastest offer: (\S+) .*raise deadline_hours to at least ([0-9.]+)", str(err.value))
    assert found and found.group(1) == "us-east1-b", str(err.value)
    deadline = float(found.group(2))
    assert (
        plan(dataclasses.replace(capped, deadline_hours=deadline), cat, ClusterState(), "r").zone
        == "us-east1-b"
    )


# --- preferences ---------------------------------------------------------------------------------


def test_compute_cost_uses_throughput_not_just_price():
    # H100 costs 3x the V100 per hour but runs the model 4.5x faster: cheaper for the whole run.
    cat = Catalog((offer("us-east1-b", gpu="V100", spot=1.0), offer("us-east1-c", gpu="H100", spot=3.0)))
    p = plan(req(market="spot"), cat, ClusterState(), "r")
    assert p.gpu_type == "H100"
    assert "decided by compute_cost" in next(line for line in p.explanation if line.startswith("runner-up"))


def test_data_egress_flips_the_choice_to_the_region_holding_the_data():
    cat = Catalog((offer("us-east1-b", spot=0.60), offer("europe-west4-a", spot=0.62)))
    r = req(dataset_uri="sailor://source/big")
    assert plan(r, cat, ClusterState(), "r").region == "us-east1"  # data location unknown: cheaper wins
    state = ClusterState(replicas={r.dataset_uri: ("europe-west4",)}, dataset_bytes={r.dataset_uri: 200 * GB})
    p = plan(r, cat, state, "r")
    assert p.region == "europe-west4"
    runner_up = next(line for line in p.explanation if line.startswith("runner-up #2"))
    assert "us-east1-b" in runner_up and "decided by data_transfer" in runner_up
    result = explain(r, cat, state)
    # 200 GB across the Atlantic at 0.05 USD/GB, plus the copy time at the placement's price.
    assert result["runners_up"][0]["contributions"]["data_transfer"] == pytest.approx(10.0, rel=0.2)
    assert result["winner"]["contributions"]["data_transfer"] < 0.1  # no egress; copy time only


def test_a_relaunch_counts_copying_its_checkpoint_from_where_it_was_saved():
    """Two regions equal but for price; the run resumes from 200 GB of checkpoint in the dearer
    one: the copy's egress and time keep it there, and a deadline the copy does not fit rules the
    cheaper region out."""
    cat = Catalog((offer("us-east1-b", spot=0.60), offer("europe-west4-a", spot=0.62)))
    r = req(market="spot")
    assert plan(r, cat, ClusterState(), "r").region == "us-east1"
    state = ClusterState(checkpoint=("europe-west4", 200 * GB))
    p = plan(r, cat, state, "r")
    assert p.region == "europe-west4"
    assert any("checkpoint 200 GB from europe-west4" in line for line in p.explanation)
    result = explain(r, cat, state)
    away = result["runners_up"][0]
    assert away["region"] == "us-east1" and away["contributions"]["data_transfer"] > 9.0
    assert result["winner"]["contributions"]["data_transfer"] == 0.0  # the checkpoint is there
    # the copy's hours count toward the deadline: give just the time of training where it is
    hours = result["winner"]["expected_hours"]
    copy_h = away["data_hours"]
    assert copy_h > 0.01
    tight = dataclasses.replace(r, deadline_hours=hours + RESTART_HOURS + copy_h / 2)
    assert "deadline" in rejected_by(explain(tight, cat, state), "us-east1-b")
    assert "deadline" not in rejected_by(explain(tight, cat, state), "europe-west4-a")


def test_overload_penalty_moves_a_run_away_from_an_overloaded_region():
    cat = Catalog((offer("us-east1-b", spot=0.60), offer("europe-west4-a", spot=0.63)))
    assert plan(req(), cat, ClusterState(), "r").region == "us-east1"
    a = Assignment(version=7, shares={}, region_load={"us-east1": 2.6, "europe-west4": 0.9})
    p = plan(req(), cat, ClusterState(assignment=a), "r")
    assert p.region == "europe-west4" and p.assignment_version == 7
    assert "decided by overload" in next(line for line in p.explanation if line.startswith("runner-up #2"))


def test_overload_costs_more_than_underload_credits():
    cat = Catalog((offer("us-east1-b", spot=0.60), offer("europe-west4-a", spot=0.60)))
    a = Assignment(version=1, shares={}, region_load={"us-east1": 1.2, "europe-west4": 0.8})
    result = explain(req(), cat, ClusterState(assignment=a))
    by_region = {
        c["region"]: c["contributions"]["overload"] for c in [result["winner"], *result["runners_up"]]
    }
    assert by_region["us-east1"] > 0 > by_region["europe-west4"]
    assert abs(by_region["us-east1"]) > abs(by_region["europe-west4"])


def test_preemption_loss_prefers_the_calmer_spot_zone():
    cat = Catalog((offer("us-east1-b", spot=0.60, rate=1.0), offer("us-east1-c", spot=0.61, rate=0.01)))
    p = plan(req(market="spot"), cat, ClusterState(), "r")
    assert p.zone == "us-east1-c"
    assert "decided by preemption_loss" in next(
        line for line in p.explanation if line.startswith("runner-up")
    )


def test_packing_prefers_fewer_vms_at_equal_price():
    cat = Catalog((offer("us-east1-b", per_node=1, spot=0.6), offer("us-east1-b", per_node=4, spot=2.4)))
    p = plan(req(num_workers=4), cat, ClusterState(), "r")
    assert (p.num_nodes, p.gpus_per_node) == (1, 4)


def test_assignment_share_prefers_the_teams_regions():
    cat = Catalog((offer("us-east1-b", spot=0.6), offer("europe-west4-a", spot=0.6)))
    a = Assignment(version=3, shares={"t": {"us-east1": 0.2, "europe-west4": 0.8}})
    p = plan(req(), cat, ClusterState(assignment=a), "r")
    assert p.region == "europe-west4"


def test_assignment_shares_of_the_runs_gpu_type_steer_it():
    # Over both types the team sits mostly in us-east1 (its A100s); its T4 demand moved west.
    cat = Catalog(tuple(offer(z, gpu=g) for z in ("us-east1-b", "europe-west4-a") for g in ("T4", "A100")))
    a = Assignment(
        version=4,
        shares={"t": {"us-east1": 0.64, "europe-west4": 0.36}},
        gpu_shares={"t": {"T4": {"europe-west4": 0.91, "us-east1": 0.09}, "A100": {"us-east1": 1.0}}},
    )
    state = ClusterState(assignment=a)
    assert plan(req(gpu_type="T4"), cat, state, "r").region == "europe-west4"
    assert plan(req(gpu_type="A100"), cat, state, "r").region == "us-east1"
    assert plan(
        req(gpu_type="V100"), Catalog((offer("us-east1-b"), offer("europe-west4-a"))), state, "r"
    ).region == (
        "us-east1"  # a type it has no shares of follows its shares over every type
    )


def test_explanation_json_lists_winner_runners_up_and_rejections():
    cat = load_catalog()
    result = explain(
        req(gpu_type="A100", num_workers=8, regions=("us-central1", "europe-west4")), cat, ClusterState()
    )
    assert result["winner"]["gpu_type"] == "A100"
    assert set(result["winner"]["contributions"]) == {
        "compute_cost",
        "data_transfer",
        "preemption_loss",
        "overload",
        "assignment",
        "packing",
    }
    assert result["runners_up"] and all("decided_by" in r for r in result["runners_up"])
    assert len(result["rejected"]) + result["feasible"] == result["candidates"]
    assert {r["validator"] for r in result["rejected"]} <= set(VALIDATOR_NAMES)


# --- bad input -----------------------------------------------------------------------------------


def test_unknown_gpu_and_region_errors_list_valid_values():
    cat = Catalog((offer("us-east1-b"), offer("europe-west4-a", gpu="T4")))
    with pytest.raises(InvalidRequestError, match=r"gpu_type='Z80'.*valid choices: any, T4, V100"):
        plan(req(gpu_type="Z80"), cat, ClusterState(), "r")
    with pytest.raises(
        InvalidRequestError, match=r"regions=\['mars-1'\].*valid choices: europe-west4, us-east1"
    ):
        plan(req(regions=("mars-1",)), cat, ClusterState(), "r")
    with pytest.raises(InvalidRequestError, match=r"data_residency=\['MARS'\].*valid choices: .*EU"):
        plan(req(data_residency=("MARS",)), cat, ClusterState(), "r")


# --- batch planning ------------------------------------------------------------------------------


def test_plan_many_goes_by_priority_then_arrival_and_never_overcommits():
    cat = Catalog((offer("us-east1-b", spot=0.5, cap=4), offer("us-east1-c", spot=0.9, cap=4)))
    queue = [
        QueuedRequest("low", req(num_workers=4), priority=0, arrival=0.0),
        QueuedRequest("high", req(num_workers=4), priority=5, arrival=1.0),
        QueuedRequest("late", req(num_workers=4), priority=0, arrival=2.0),
    ]
    outcomes = plan_many(queue, cat, ClusterState())
    assert [o.run_id for o in outcomes] == ["high", "low", "late"]
    assert outcomes[0].placement.zone == "us-east1-b"
    assert outcomes[1].placement.zone == "us-east1-c"
    assert outcomes[2].placement is None and "CapacityUnavailableError" in outcomes[2].error


def test_plan_many_without_explanations_makes_the_same_choices():
    cat = Catalog((offer("us-east1-b", spot=0.5, cap=4), offer("us-east1-c", spot=0.9, cap=8)))
    queue = [QueuedRequest(f"r{i}", req(num_workers=4)) for i in range(3)]
    explained = plan_many(queue, cat, ClusterState())
    bare = plan_many(queue, cat, ClusterState(), explain=False)
    assert [o.error for o in bare] == [o.error for o in explained]
    for e, b in zip(explained, bare, strict=True):
        assert e.placement is not None and e.placement.explanation
        assert b.placement == dataclasses.replace(e.placement, explanation=())


def test_a_run_on_several_vms_runs_at_gavels_spread_throughput():
    """Eight 1-GPU VMs cost a little less per hour than one 8-GPU VM, but Gavel measured the same
    8-worker job about 3x slower with its workers on separate servers: the planner charges that
    and takes the one VM. A 1-GPU entry cannot show the spread, so the 8-GPU entry's ratio is used."""
    from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, load_packaged

    catalog = Catalog((offer("us-east1-b", per_node=1, od=1.0), offer("us-east1-c", per_node=8, od=8.4)))
    request = req(num_workers=8, market="on_demand")
    p = plan(request, catalog, ClusterState(), "r")
    assert (p.zone, p.num_nodes) == ("us-east1-c", 1)
    hours = {c["num_nodes"]: c["expected_hours"] for c in (explain(request, catalog, ClusterState())["winner"],
             *explain(request, catalog, ClusterState())["runners_up"])}  # fmt: skip
    table = load_packaged()
    name = MODEL_JOB_TYPES["gpt_25m"][0]
    spread = table.throughput((name, 8), "V100", False) / table.throughput((name, 8), "V100", True)
    assert spread < 0.5
    assert hours[8] == pytest.approx(hours[1] / spread)


def test_a_gpu_type_without_capacity_anywhere_points_at_the_gpu_type_not_the_gpu_count():
    """No zone holds even one VM of the type: asking for fewer GPUs cannot help."""
    from sailor_tasks.placement import catalog_errors

    catalog = Catalog((offer("us-east1-b", cap=0), offer("us-east1-c", gpu="T4", cap=8)))
    (err,) = catalog_errors(req(gpu_type="V100"), catalog)
    assert (
        err.field == "gpu_type"
        and "no zone within the request's other limits has capacity for V100" in str(err)
    )
    assert "ask for fewer GPUs" not in str(err)
    (err,) = catalog_errors(req(gpu_type="T4", num_workers=16), catalog)  # fewer GPUs would fit
    assert err.field == "num_workers" and "the largest, us-east1-c, has 8 T4 in all" in str(err)


def test_plan_and_explain_refuse_an_index_built_for_another_catalog():
    from sailor_tasks.placement.index import index_for

    catalog = Catalog((offer("us-east1-b"),))
    other = index_for(Catalog((offer("europe-west4-a"),)))
    for decide in (plan, explain):
        with pytest.raises(ValueError, match="index was built for another catalog"):
            decide(req(), catalog, ClusterState(), "r", index=other)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_workers", 0),
        ("num_workers", -2),
        ("gpus_per_worker", 0),
        ("total_steps", -5),
        ("checkpoint_every_steps", 0),
        ("max_usd_per_hour", float("nan")),
        ("max_usd_per_hour", -1.0),
        ("deadline_hours", float("inf")),
        ("deadline_hours", 0.0),
    ],
)
def test_a_request_built_without_from_params_with_a_number_no_run_can_have_is_refused_naming_it(field, value):
    """``plan``, ``plan_many`` and ``explain`` take requests built directly too: a worker count of
    0 placed 0 GPUs, negative steps gave negative hours and the dearest offer the best score."""
    from sailor_tasks.placement import catalog_errors

    catalog = Catalog((offer("us-east1-b"),))
    bad = req(**{field: value})
    with pytest.raises(InvalidRequestError) as info:
        plan(bad, catalog, ClusterState(), "r")
    assert info.value.field == field
    with pytest.raises(InvalidRequestError):
        explain(bad, catalog, ClusterState())
    assert [e.field for e in catalog_errors(bad, catalog)] == [field]


def test_catalog_errors_report_a_continent_the_transfer_file_does_not_have(monkeypatch):
    """``validate`` calls ``catalog_errors`` after ``from_params``, which knows the packaged
    continents only: with a transfer file without one, the run must be refused at validate, not
    fail at plan."""
    from sailor_tasks.catalog import transfer as transfer_module
    from sailor_tasks.placement import catalog_errors

    catalog = load_catalog()
    transfer = catalog.transfer
    prefixes = {p: c for p, c in transfer.continent_of_prefix.items() if c != "AF"}
    without_af = dataclasses.replace(transfer, continent_of_prefix=prefixes)
    monkeypatch.setattr(transfer_module, "load_transfer", lambda *a, **k: without_af)
    catalog = Catalog(catalog.offers)  # reads the transfer file anew
    assert catalog.transfer is without_af
    errors = catalog_errors(req(data_residency=("AF",)), catalog)
    assert [e.field for e in errors] == ["data_residency"] and "unknown continent" in str(errors[0])


def test_the_dataset_copy_is_priced_from_its_origin_which_place_data_reads_not_from_a_replica():
    """``place_data`` copies from the dataset's own URI: a region without a copy pays the link from
    the origin region, though a replica is nearer; a region holding one pays its own bucket's."""
    from sailor_tasks.placement.context import build_context
    from sailor_tasks.placement.engine import view_for
    from sailor_tasks.placement.index import index_for

    catalog = load_catalog()
    transfer = catalog.transfer
    uri = "sailor://us-central1/datasets/x"
    state = ClusterState(replicas={uri: ("asia-east1",)}, dataset_bytes={uri: 2000 * GB})
    index = index_for(catalog)
    ctx = build_context(index, req(dataset_uri=uri), state, view_for(index, state))
    for region, source in (
        ("asia-east2", "us-central1"),
        ("asia-east1", "asia-east1"),
        ("us-central1", "us-central1"),
    ):
        r = index.region_idx[region]
        link = transfer.bucket_link(source, region)
        assert index.regions[ctx.r_data_source[r]] == source
        assert ctx.r_data_usd_per_gb[r] == pytest.approx(link.usd_per_gb)
        assert ctx.r_data_hours[r] == pytest.approx(2000 * 8 / link.gbps / 3600)
    assert (
        transfer.bucket_link("asia-east1", "asia-east2").usd_per_gb
        < transfer.bucket_link("us-central1", "asia-east2").usd_per_gb
    )  # the replica is the nearer one
    # Origin unknown: a region without a copy is charged at the dearest, slowest link into it.
    unknown = "sailor://source/datasets/y"
    state = ClusterState(replicas={unknown: ("asia-east1",)}, dataset_bytes={unknown: 2000 * GB})
    ctx = build_context(index, req(dataset_uri=unknown), state, view_for(index, state))
    r = index.region_idx["asia-east2"]
    links = [transfer.bucket_link(s, "asia-east2") for s in index.regions]
    assert ctx.r_data_source[r] == -1
    assert ctx.r_data_usd_per_gb[r] == pytest.approx(max(k.usd_per_gb for k in links))
    assert ctx.r_data_usd_per_gb[index.region_idx["asia-east1"]] == 0.0


def test_a_dataset_in_a_region_the_catalog_sells_no_vm_in_is_priced_from_there():
    """``place_data`` reads ``sailor://<region>/...`` from that region's bucket, whether or not the
    catalog has offers there: the copy is priced with the transfer file's link from it."""
    from sailor_tasks.placement.context import build_context
    from sailor_tasks.placement.engine import view_for
    from sailor_tasks.placement.index import index_for

    catalog = load_catalog()
    index = index_for(catalog)
    origin = "us-west9"
    assert origin not in index.region_idx
    uri = f"sailor://{origin}/datasets/x"
    state = ClusterState(dataset_bytes={uri: 500 * GB})
    ctx = build_context(index, req(dataset_uri=uri), state, view_for(index, state))
    for region in ("us-central1", "europe-west4"):
        link = catalog.transfer.bucket_link(origin, region)
        r = index.region_idx[region]
        assert ctx.r_data_usd_per_gb[r] == pytest.approx(link.usd_per_gb) and link.usd_per_gb > 0
        assert ctx.r_data_hours[r] == pytest.approx(500 * 8 / link.gbps / 3600)
    winner = plan(req(dataset_uri=uri), catalog, state, "r")
    assert f"GB from {origin}" in winner.explanation[2]


def test_the_price_cap_a_refusal_advises_is_accepted_for_every_offer():
    """The cap a refusal names ("raise it to at least X") is rounded up to the cent: following it
    gets the run planned, never the same refusal again."""
    import re

    from sailor_tasks.placement import catalog_errors
    from sailor_tasks.request import from_params

    cat = load_catalog()
    advised = 0
    for gpu in cat.gpu_types:
        for workers in (1, 2, 4, 8):
            for market in ("spot", "on_demand"):
                params = {"gpu_type": gpu, "num_workers": workers, "market": market}
                try:
                    errors = catalog_errors(from_params({**params, "max_usd_per_hour": 0.01}, cat), cat)
                except ValueError:
                    continue  # no such shape in the catalog
                found = re.search(r"raise it to at least ([0-9.]+)", " ".join(map(str, errors)))
                if found is None:
                    continue
                advised += 1
                cap = float(found.group(1))
                assert catalog_errors(from_params({**params, "max_usd_per_hour": cap}, cat), cat) == []
    assert advised > 20


def test_a_residency_no_allowed_offer_is_on_names_the_continents_that_have_one():
    """Regions in North America with data kept in the EU: no offer can run it, and the refusal
    names the continents that do hold an offer within the request's other limits."""
    from sailor_tasks.placement import catalog_errors
    from sailor_tasks.request import from_params

    cat = load_catalog()
    request = from_params({"regions": ["us-central1", "us-east1"], "data_residency": ["EU"]}, cat)
    (error,) = [e for e in catalog_errors(request, cat) if e.field == "data_residency"]
    assert error.valid == ["NA"] and "valid choices: NA" in str(error)
