from __future__ import annotations

import pytest

from sailor_tasks.catalog.offers import Catalog
from sailor_tasks.errors import NoFeasibleOfferError
from sailor_tasks.model import Assignment, ClusterState, JobRequest, Offer
from sailor_tasks.placement import plan, price_cap_error


def offer(zone, gpu="T4", per_node=1, od=1.0, spot=0.3, dirty=False):
    return Offer("gcp", zone.rsplit("-", 1)[0], zone, gpu, per_node, f"vm-{per_node}", od, spot, dirty)


CATALOG = Catalog(
    (
        offer("us-east1-b", od=1.0, spot=0.30),
        offer("us-east1-c", od=1.0, spot=0.35),
        offer("europe-west4-a", od=0.9, spot=0.25),
        offer("europe-west4-a", gpu="V100", od=2.5, spot=0.7),
        offer("asia-east1-a", gpu="T4", per_node=4, od=3.6, spot=1.0),
    )
)


def req(**kw):
    base = dict(job_name="j", team="t", dataset_uri="sailor://source/d", model="tiny_gpt", num_workers=1)
    return JobRequest(**{**base, **kw})


def test_cheapest_feasible_offer_wins_with_explanation():
    p = plan(req(), CATALOG, ClusterState(), "r1")
    assert (p.zone, p.market, p.usd_per_hour) == ("europe-west4-a", "spot", 0.25)
    assert p.explanation[0].startswith("chose europe-west4-a")


def test_region_gpu_and_market_validators():
    p = plan(req(regions=("us-east1",), market="on_demand"), CATALOG, ClusterState(), "r1")
    assert (p.region, p.market, p.usd_per_hour) == ("us-east1", "on_demand", 1.0)
    p = plan(req(gpu_type="V100"), CATALOG, ClusterState(), "r1")
    assert p.gpu_type == "V100"


def test_blocked_zone_is_never_chosen():
    p = plan(req(), CATALOG, ClusterState(blocked_zones=frozenset({"europe-west4-a"})), "r1")
    assert p.zone == "us-east1-b"


def test_four_gpus_pack_onto_one_vm_when_cheaper():
    p = plan(req(num_workers=4), CATALOG, ClusterState(), "r1")
    assert (p.num_nodes, p.gpus_per_node, p.usd_per_hour) == (1, 4, 1.0)


def test_dirty_spot_price_goes_on_demand_under_auto():
    cat = Catalog((offer("us-east1-b", od=1.0, spot=2.0, dirty=True),))
    assert plan(req(), cat, ClusterState(), "r1").market == "on_demand"


def test_price_cap_error_names_the_cheapest_offer():
    r = req(max_usd_per_hour=0.1)
    message = price_cap_error(r, CATALOG)
    assert "europe-west4-a" in message and "0.25" in message
    with pytest.raises(NoFeasibleOfferError, match="price_cap: .*cheapest offer: europe-west4-a"):
        plan(r, CATALOG, ClusterState(), "r1")


def test_assignment_share_breaks_price_ties_and_is_recorded():
    cat = Catalog((offer("us-east1-b", spot=0.3), offer("europe-west4-a", spot=0.3)))
    a = Assignment(version=3, shares={"t": {"us-east1": 0.8, "europe-west4": 0.2}})
    p = plan(req(), cat, ClusterState(assignment=a), "r1")
    assert p.region == "us-east1" and p.assignment_version == 3
