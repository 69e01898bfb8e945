from __future__ import annotations

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.supply import apply_supply, parse_supply, region_supply
from sailor_tasks.model import Offer

DOC = {
    "version": 1,
    "defaults": {"capacity_gpus": {"T4": 8}, "preemption_rate_per_hour": {"T4": 0.1}},
    "regions": {"us-east1": {"capacity_multiplier": 2.0}},
    "zones": {"us-east1-c": {"T4": {"capacity_gpus": 1, "preemption_rate_per_hour": 0.5}}},
}


def offer(zone, per_node=1):
    return Offer("gcp", zone.rsplit("-", 1)[0], zone, "T4", per_node, "vm", 1.0, 0.3)


def test_zone_override_beats_region_multiplier_beats_default():
    supply = parse_supply(DOC)
    offers = apply_supply((offer("us-east1-b"), offer("us-east1-c"), offer("asia-east1-a")), supply)
    assert [(o.capacity_gpus, o.preemption_rate_per_hour) for o in offers] == [(16, 0.1), (1, 0.5), (8, 0.1)]


def test_region_supply_counts_each_zone_once_across_vm_shapes():
    offers = apply_supply(
        (offer("us-east1-b", 1), offer("us-east1-b", 4), offer("us-east1-c")), parse_supply(DOC)
    )
    assert region_supply(offers) == {("us-east1", "T4"): 17}


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"version": 2}, "version=2"),
        ({"defaults": {"capacity_gpus": {"T4": -1}}}, "capacity_gpus.T4=-1"),
        ({"regions": {"x": {"capacity_multiplier": "big"}}}, "regions.x.capacity_multiplier"),
        ({"regions": {"x": {"capacity_multiplier": float("inf")}}}, "regions.x.capacity_multiplier=inf"),
        ({"regions": {"x": {"capacity_multplier": 2}}}, "regions.x: unknown key 'capacity_multplier'"),
        (
            {"defaults": {"capacity_gpus": {"T4": 8}, "preemption_rate_per_hour": {"T4": float("nan")}}},
            "preemption_rate_per_hour.T4=nan: need a finite number",
        ),
        ({"defaults": {"capacity_gpus": {"T4": True}}}, "capacity_gpus.T4=True: need an integer"),
        ({"zones": {"us-east1-c": {"T4": {"capacity": 0}}}}, "zones.us-east1-c.T4: unknown key 'capacity'"),
        ({"zones": {"us-east1-c": {"t4": {"capacity_gpus": 0}}}}, "zones.us-east1-c: 't4' is no GPU type"),
        (
            {"defaults": {"capacity_gpus": {"T4": 8, "L4": 64}, "preemption_rate_per_hour": {"T4": 0.1}}},
            "no rate for L4, which capacity_gpus gives GPUs",
        ),
        (
            {"zones": {"us-east1-c": {"L4": {"capacity_gpus": 2}}}, "defaults": {"capacity_gpus": {"L4": 0}}},
            "zones.us-east1-c.L4: capacity_gpus=2 but no preemption_rate_per_hour",
        ),
    ],
)
def test_bad_supply_file_names_the_entry(patch, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        parse_supply({**DOC, **patch})


def test_packaged_catalog_has_supply_for_every_offer():
    for o in load_catalog().offers:
        assert o.capacity_gpus and o.capacity_gpus > 0, o
        assert 0 < o.preemption_rate_per_hour < 1, o


def test_a_region_or_zone_no_offer_has_is_logged_by_name(caplog):
    doc = {**DOC, "regions": {"us-centrall1": {"capacity_multiplier": 2.0}}, "zones": {"us-east1-z": {}}}
    with caplog.at_level("WARNING", logger="sailor_tasks.catalog.supply"):
        apply_supply((offer("us-east1-b"),), parse_supply(doc))
    assert "regions us-centrall1" in caplog.text and "zones us-east1-z" in caplog.text


def test_a_gpu_type_no_offer_has_is_logged_with_the_catalogs_types(caplog):
    """A misspelt type (``T-4``) gives the real one no capacity: the log names it and the valid ones."""
    doc = {
        **DOC,
        "defaults": {"capacity_gpus": {"T-4": 8}, "preemption_rate_per_hour": {"T-4": 0.1}},
        "zones": {},
    }
    with caplog.at_level("WARNING", logger="sailor_tasks.catalog.supply"):
        offers = apply_supply((offer("us-east1-b"),), parse_supply(doc))
    assert "GPU types T-4: no offer of the catalog is there" in caplog.text
    assert "(the catalog's: T4)" in caplog.text and offers[0].capacity_gpus == 0
