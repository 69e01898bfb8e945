"""What JSON-schema checks alone let through: trailing newlines, NaN and ±Infinity, and run ids that
collide once made path- or label-safe. Each is refused or kept apart, naming the field."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess

import jsonschema
import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.errors import InvalidRequestErrors
from sailor_tasks.request import from_params, train_param_schemas

SCHEMAS = train_param_schemas()
NUMERIC = sorted(
    name
    for name, spec in SCHEMAS.items()
    if {"number", "integer"} & set(spec["type"] if isinstance(spec["type"], list) else [spec["type"]])
)
PATTERNED = sorted(name for name, spec in SCHEMAS.items() if "pattern" in spec)
VALID = {
    "job_name": "lm-eu",
    "team": "research",
    "dataset_uri": "sailor://source/d",
    "preemption_trace_uri": "",
    "image": "us-docker.pkg.dev/my-project/train/lm:1.2",
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _schema(name):
    return {k: v for k, v in SCHEMAS[name].items() if k not in ("default", "description", "title", "section")}


def test_every_string_param_with_a_pattern_is_covered():
    assert set(PATTERNED) == set(VALID)


@pytest.mark.parametrize("name", PATTERNED)
def test_a_trailing_newline_fails_the_pattern(catalog, name):
    with pytest.raises(InvalidRequestErrors) as info:
        from_params({name: VALID[name] + "\n"}, catalog)
    assert info.value.field == name and repr(VALID[name] + "\n") in str(info.value)
    with pytest.raises(jsonschema.ValidationError):  # the Param schema Airflow checks says so too
        jsonschema.validate(VALID[name] + "\n", _schema(name))


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_trigger_forms_javascript_regex_accepts_valid_names_and_rejects_newlines():
    cases = [(name, value) for name in PATTERNED for value in (VALID[name], VALID[name] + "\n")]
    script = (
        "const cases = JSON.parse(process.argv[1]);"
        "console.log(JSON.stringify(cases.map(([p, v]) => new RegExp(p, 'u').test(v))));"
    )
    arg = json.dumps([[SCHEMAS[name]["pattern"], value] for name, value in cases])
    out = subprocess.run(["node", "-e", script, arg], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [not value.endswith("\n") for _name, value in cases]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", NUMERIC)
def test_nan_and_infinity_are_refused_for_every_numeric_param(catalog, name, value):
    with pytest.raises(InvalidRequestErrors) as info:
        from_params({name: value}, catalog)
    assert [e.field for e in info.value.errors] == [name], str(info.value)
    assert "finite" in str(info.value) or "integer" in str(info.value)
    with pytest.raises(jsonschema.ValidationError):  # Airflow's Param refuses it too (HTTP 400)
        jsonschema.validate(value, _schema(name))


@pytest.mark.parametrize("name", NUMERIC)
def test_finite_bounds_still_accept_the_default(name):
    jsonschema.validate(SCHEMAS[name]["default"], _schema(name))


def test_run_ids_differing_in_case_or_in_replaced_characters_get_distinct_keys_and_labels():
    from sailor_tasks.backends.gke import run_labels
    from sailor_tasks.model import Placement, run_key

    ids = ["Manual__run", "manual__run", "a:b", "a+b", "a_b", "x" * 300, "x" * 300 + "y"]
    keys = [run_key(i) for i in ids]
    assert len(set(keys)) == len(ids)
    assert len({k.lower() for k in keys}) == len(ids)  # also on case-insensitive file systems
    pl = Placement(
        run_id="r", cloud="gcp", region="us-central1", zone="us-central1-a", gpu_type="A100",
        gpus_per_node=1, num_nodes=1, num_gpus=1, market="spot", instance_type="a2-highgpu-1g",
        usd_per_hour=1.0,
    )  # fmt: skip
    labels = [run_labels(k, pl)["sailor.dev/run"] for k in keys]
    assert len(set(labels)) == len(ids)
    assert all(re.fullmatch(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?", v) for v in labels), labels


@pytest.mark.parametrize("run_id", ["..", ".", "", "/", "../..", "runs/.."])
def test_no_run_id_maps_the_run_folder_outside_runs(settings, run_id):
    import posixpath

    from sailor_tasks import paths
    from sailor_tasks.model import run_key

    key = run_key(run_id)
    assert key not in ("", ".", "..") and "/" not in key
    uri = paths.run_uri("us-central1", run_id, settings)
    root = settings.bucket_uri("us-central1") + "/runs"
    assert posixpath.normpath(uri.removeprefix("file://")).startswith(root.removeprefix("file://") + "/")
