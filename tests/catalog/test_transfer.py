"""Transfer prices and bandwidths: packaged file, GCP structure, agreement with SAILOR's sample."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import yaml

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.transfer import load_transfer, parse_transfer


def test_gcp_structure_same_zone_region_continent():
    t = load_transfer()
    assert t.zone_usd_per_gb("us-east1-b", "us-east1-b") == 0.0
    assert t.zone_usd_per_gb("us-east1-b", "us-east1-c") == 0.01
    assert t.zone_usd_per_gb("us-east1-b", "us-west1-a") == 0.02
    assert t.zone_usd_per_gb("europe-west4-a", "europe-west1-b") == 0.02
    assert t.zone_usd_per_gb("us-east1-b", "europe-west4-a") > 0.02
    assert t.bucket_usd_per_gb("us-east1", "us-east1") == 0.0  # regional bucket read in its region
    assert t.bucket_gbps("us-east1", "asia-east1") < t.bucket_gbps("us-east1", "us-west1")


def test_every_catalog_region_has_a_known_continent():
    cat = load_catalog()
    assert {cat.transfer.continent(r) for r in cat.regions} <= {"NA", "SA", "EU", "ASIA", "OC", "ME", "AF"}


def test_matches_sailor_communication_cost_sample(shared_data):
    sample = json.loads((shared_data / "sailor" / "communication_cost.json").read_text())
    t = load_transfer()
    for src, row in sample.items():
        for dst, usd in row.items():
            assert t.zone_usd_per_gb(src, dst) == pytest.approx(usd), (src, dst)


def test_bad_transfer_file_names_the_entry():
    doc = yaml.safe_load(
        resources.files("sailor_tasks.catalog").joinpath("data", "transfer.yaml").read_text()
    )
    doc["within"]["EU"]["usd_per_gb"] = -1
    with pytest.raises(ValueError, match=r"within.EU.usd_per_gb=-1"):
        parse_transfer(doc)
    for field, value in (("usd_per_gb", True), ("gbps", float("nan")), ("gbps", float("inf"))):
        doc["within"]["EU"] = {"usd_per_gb": 0.02, "gbps": 10, field: value}
        with pytest.raises(ValueError, match=rf"within.EU.{field}={value!r}: need a finite number"):
            parse_transfer(doc)
    doc["within"]["EU"] = {"usd_per_gb": 0.02, "gbps": 10}
    doc["between"]["NA-MARS"] = {"usd_per_gb": 0.1, "gbps": 1}
    with pytest.raises(ValueError, match="between.NA-MARS"):
        parse_transfer(doc)
    del doc["between"]["NA-MARS"]
    doc["within"]["Eu"] = doc["within"].pop("EU")  # a misspelt continent: not silently the default
    with pytest.raises(ValueError, match=r"within.Eu: not a continent of continent_of_prefix; valid: .*EU"):
        parse_transfer(doc)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "need a mapping with version: 1"),
        ("- a\n", "need a mapping with version: 1"),
        ("version: 1\nbetween: [\n", "while parsing"),
        ("version: 1\nbetween: [a, b]\n", "between=['a', 'b']: need a mapping"),
        ("version: 1\nbetween:\n  1: {usd_per_gb: 0.1, gbps: 1}\n", "between.1: need '<A>-<B>'"),
    ],
    ids=["empty", "list", "not-yaml", "between-list", "between-number"],
)
def test_a_bad_transfer_file_is_a_catalog_error_naming_the_file(tmp_path, text, fragment):
    from sailor_tasks.errors import CatalogError

    path = tmp_path / "transfer.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_transfer(str(path))
    assert str(path) in str(info.value) and fragment in str(info.value), str(info.value)
