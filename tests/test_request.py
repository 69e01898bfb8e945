"""Bad params fail with a message naming the value and the valid choices."""

from __future__ import annotations

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.errors import InvalidRequestErrors
from sailor_tasks.request import from_params


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_defaults_make_a_valid_request(catalog):
    req = from_params({}, catalog)
    assert req.model == "tiny_gpt" and req.num_workers >= 1
    assert set(req.regions) == set(catalog.regions)


def test_integral_floats_that_json_schema_counts_as_integers_become_ints(catalog):
    params = {
        "num_workers": 2.0,
        "total_steps": 1e2,
        "seed": 7.0,
        "batch_size": 8.0,
        "inject_preemptions": [50.0],
    }
    req = from_params(params, catalog)
    got = (req.num_workers, req.total_steps, req.seed, req.batch_size, req.inject_preemptions)
    assert got == (2, 100, 7, 8, (50,))
    assert all(type(v) is int for v in (*got[:4], *got[4]))


@pytest.mark.parametrize(
    ("params", "field", "fragment"),
    [
        ({"regions": ["mars-north1"]}, "regions", "us-central1"),
        ({"max_usd_per_hour": -1}, "max_usd_per_hour", "minimum"),
        ({"num_workers": 0}, "num_workers", "minimum"),
        ({"model": "gpt5"}, "model", "tiny_gpt"),
        ({"gpu_type": "TPU9"}, "gpu_type", "H100"),
        ({"market": "cheap"}, "market", "on_demand"),
        ({"num_workers": "two"}, "num_workers", "integer"),
        ({"dataset_uri": "s3://bucket/x"}, "dataset_uri", "must be a sailor://, gs:// or file:// URI"),
        ({"dataset_uri": "sailor://source/../etc"}, "dataset_uri", "'..'"),
        ({"dataset_uri": "sailor://nowhere/data"}, "dataset_uri", "source"),
        ({"job_name": "Bad Name!"}, "job_name", "must be 1-63 lowercase letters, digits and '-'"),
        ({"team": "-qa"}, "team", "starting and ending with a letter or digit"),
        (
            {"preemption_trace_uri": "s3://b/t.json"},
            "preemption_trace_uri",
            "must be empty, or a gs:// or file://",
        ),
        ({"checkpoint_every_steps": 500, "total_steps": 100}, "checkpoint_every_steps", "total_steps=100"),
        ({"colour": "blue"}, "colour", "unknown parameter"),
        ({"strategy": "on_demand", "market": "spot"}, "market", "strategy=on_demand never uses spot"),
    ],
)
def test_bad_param_names_field_value_and_choices(catalog, params, field, fragment):
    with pytest.raises(InvalidRequestErrors) as info:
        from_params(params, catalog)
    assert any(e.field == field for e in info.value.errors), str(info.value)
    assert field in str(info.value) and fragment in str(info.value)


def test_the_on_demand_strategy_takes_the_markets_it_can_keep(catalog):
    for market in ("on_demand", "auto"):
        assert from_params({"strategy": "on_demand", "market": market}, catalog).market == market
    assert from_params({"strategy": "spot_restart", "market": "spot"}, catalog).market == "spot"


def test_all_errors_are_reported_together(catalog):
    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"num_workers": 0, "model": "nope", "market": "x"}, catalog)
    assert {e.field for e in info.value.errors} == {"num_workers", "model", "market"}


def test_deadline_residency_and_excluded_regions_reach_the_request(catalog):
    req = from_params(
        {"deadline_hours": 12, "data_residency": ["EU"], "exclude_regions": ["us-east1"]}, catalog
    )
    assert (req.deadline_hours, req.data_residency, req.exclude_regions) == (12.0, ("EU",), ("us-east1",))
    assert from_params({}, catalog).deadline_hours is None


@pytest.mark.parametrize(
    ("params", "field", "fragment"),
    [
        ({"deadline_hours": 0}, "deadline_hours", "minimum"),
        ({"data_residency": ["MARS"]}, "data_residency", "EU"),
        ({"exclude_regions": ["mars-north1"]}, "exclude_regions", "us-central1"),
    ],
)
def test_bad_placement_params_name_value_and_choices(catalog, params, field, fragment):
    with pytest.raises(InvalidRequestErrors, match=fragment) as err:
        from_params(params, catalog)
    assert err.value.field == field


def test_huge_unknown_params_are_cut_in_the_message(catalog):
    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"x" * 10_000: "y" * 1_000_000}, catalog)
    assert len(str(info.value)) < 2_000 and "unknown parameter" in str(info.value)


def test_file_datasets_must_lie_inside_the_data_folders(tmp_path):
    from sailor_tasks.request import check_data_access
    from sailor_tasks.settings import Settings

    data = tmp_path / "data"
    settings = Settings.from_env(
        {"SAILOR_STATE_DIR": str(tmp_path / "state"), "SAILOR_DATA_ROOTS": str(data)}
    )
    regions = ("us-central1",)
    assert check_data_access("dataset_uri", f"file://{data}/a", settings, regions) is None
    assert check_data_access("dataset_uri", "sailor://source/datasets/a", settings, regions) is None
    assert (
        check_data_access("dataset_uri", f"file://{tmp_path}/state/buckets/source/a", settings, regions)
        is None
    )
    for uri in (
        "file:///etc",
        f"file://{tmp_path}/data-other/a",
        f"file://{data}/../x",
        f"file://{tmp_path}/state",
    ):
        err = check_data_access("dataset_uri", uri, settings, regions)
        assert err is not None and err.field == "dataset_uri" and str(data) in str(err)


def test_queue_params_have_defaults_and_refuse_bad_values():
    from sailor_tasks.errors import InvalidRequestErrors
    from sailor_tasks.request import from_params

    req = from_params({})
    assert req.priority == "normal" and req.max_queue_hours == 24.0
    assert from_params({"priority": "high", "max_queue_hours": 0}).max_queue_hours == 0.0
    with pytest.raises(InvalidRequestErrors, match=r"priority='urgent'.*low.*normal.*high"):
        from_params({"priority": "urgent"})
    for bad in (-1, float("nan"), 9000):
        with pytest.raises(InvalidRequestErrors, match="max_queue_hours"):
            from_params({"max_queue_hours": bad})


def test_the_params_offer_the_regions_and_gpus_of_the_configured_catalog(tmp_path, monkeypatch):
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.request import train_param_schemas
    from tests.conftest import write_packaged_offers

    def europe_west4_and_a_copy_in_a_new_region(rows):
        kept = [r for r in rows if r["region"] == "europe-west4"]
        return kept + [dict(r, region="europe-north2", zone="europe-north2-a") for r in kept]

    path = write_packaged_offers(tmp_path / "offers.csv", europe_west4_and_a_copy_in_a_new_region)
    monkeypatch.setenv("SAILOR_CATALOG_FILE", str(path))
    load_catalog.cache_clear()
    try:
        assert train_param_schemas()["regions"]["items"]["enum"] == ["europe-north2", "europe-west4"]
        assert from_params({}, load_catalog()).regions == ("europe-north2", "europe-west4")  # the defaults
        assert from_params({"regions": ["europe-north2"]}, load_catalog()).regions == ("europe-north2",)
    finally:
        load_catalog.cache_clear()
